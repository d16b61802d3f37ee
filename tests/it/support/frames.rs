//! Hand-made wire frames and resvals, for the hostile-peer tests and `benches/hostile.rs`
//! (which includes this file by path, so it uses nothing else of `support`).

use xce_agent::link::wire::Declared;
use xce_agent::value::{Resval, Status, Valtype, Value};

/// Cap'n Proto struct pointer: offset in words (or, in a list tag, the element count), data
/// words, pointer words.
fn struct_pointer(offset: u32, data: u16, ptrs: u16) -> u64 {
    u64::from(offset << 2) | (u64::from(data) << 32) | (u64::from(ptrs) << 48)
}

/// Cap'n Proto inline-composite list pointer right before its tag, holding `words` words.
fn composite_list_pointer(words: u32) -> u64 {
    1 | (7u64 << 32) | (u64::from(words) << 35)
}

fn single_segment_frame(words: &[u64]) -> Vec<u8> {
    let mut frame = 0u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&(words.len() as u32).to_le_bytes());
    for w in words {
        frame.extend_from_slice(&w.to_le_bytes());
    }
    frame
}

/// The amplification batch of issue 12: a full batch (seq `seq`) whose resvals list holds `n`
/// zero-sized structs. Eight words plus the segment table, 72 bytes, whatever `n` is; it fits
/// the traversal limit, and each element reads as a default Resval.
pub fn zero_sized_batch(seq: u64, n: u32) -> Vec<u8> {
    single_segment_frame(&[
        struct_pointer(0, 1, 1),   // root -> Envelope (1 data word, 1 pointer)
        1,                         // Envelope union discriminant: batch
        struct_pointer(0, 3, 1),   // -> Batch (seq, full, sentAtMs; resvals)
        seq,                       // seq
        1,                         // full = true
        1_700_000_000_000,         // sentAtMs
        composite_list_pointer(0), // resvals: no words of content...
        struct_pointer(n, 0, 0),   // ...but `n` elements of 0 data and 0 pointer words
    ])
}

/// The agent-side amplification frame: a welcome assigning `n` zero-sized instances (48 bytes).
pub fn zero_sized_welcome(n: u32) -> Vec<u8> {
    single_segment_frame(&[
        struct_pointer(0, 1, 1),   // root -> ControllerMessage
        0,                         // union discriminant: welcome
        struct_pointer(0, 0, 1),   // -> Welcome (assigned)
        composite_list_pointer(0), // assigned:
        struct_pointer(n, 0, 0),   // `n` zero-sized Instance structs
    ])
}

/// A good reading of this host's own instance of `name`.
pub fn resval(name: &str, value: Value) -> Resval {
    Resval {
        name: name.into(),
        instance: String::new(),
        value,
        status: Status::Ok,
        last_report_ms: Some(1_700_000_000_000),
        error: None,
    }
}

/// This host's own numeric instances of `names`, as a hello declares them.
pub fn numeric_declared(names: &[String]) -> Vec<Declared> {
    names
        .iter()
        .map(|n| Declared {
            name: n.clone(),
            instance: String::new(),
            valtype: Valtype::Numeric,
            interval_ms: 60_000,
            shared: false,
        })
        .collect()
}
