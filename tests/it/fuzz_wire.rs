//! Property tests of the frame decoder beyond those in `src/link/wire.rs`: generated
//! messages round-trip; every truncation of a real frame is an error (never a panic, never a
//! partial message); bit flips never panic; and no frame, however hostile its segment table,
//! makes the reader allocate more than the frame limit (checked by a counting allocator).
//! The amplification frames (a 72-byte batch of a million zero-sized resvals, a welcome of a
//! million zero-sized assignments) are refused from their list headers.

use crate::support as link_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use xce_agent::link::agent_capnp;
use xce_agent::link::frame_limits::{FrameLimits, MAX_ASSIGNED, MAX_DECLARED};
use xce_agent::link::wire::{
    self, Batch, ControllerMessage, Envelope, Heartbeat, Hello, WireError, MAX_FRAME_BYTES,
};
use xce_agent::value::{Resval, Status, Value};

/// The largest single allocation made by this thread since the last reset. Thread-local so
/// the tests running in parallel do not see each other's allocations.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only records sizes in a const-initialised
// thread-local (which itself never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn largest_allocation_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(Cell::get))
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(Value::Numeric),
        "\\PC{0,30}".prop_map(Value::String),
        any::<bool>().prop_map(Value::Boolean),
        Just(Value::Unknown),
    ]
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![
        Just(Status::Ok),
        Just(Status::Failed),
        Just(Status::Stale),
        Just(Status::Pending)
    ]
}

fn resval() -> impl Strategy<Value = Resval> {
    (
        "[a-z_][a-z0-9_]{0,38}",
        "\\PC{0,20}",
        value(),
        status(),
        proptest::option::of(1u64..u64::MAX),
        proptest::option::of("\\PC{1,60}"),
    )
        .prop_map(
            |(name, instance, value, status, last_report_ms, error)| Resval {
                name,
                instance,
                value,
                status,
                last_report_ms,
                error: error.map(Into::into),
            },
        )
}

fn envelope() -> impl Strategy<Value = Envelope> {
    prop_oneof![
        (
            any::<u64>(),
            any::<bool>(),
            any::<u64>(),
            proptest::collection::vec(resval(), 0..30)
        )
            .prop_map(|(seq, full, sent_at_ms, resvals)| Envelope::Batch(Batch {
                seq,
                full,
                sent_at_ms,
                resvals
            })),
        (any::<u64>(), any::<u64>())
            .prop_map(|(seq, sent_at_ms)| Envelope::Heartbeat(Heartbeat { seq, sent_at_ms })),
        ("\\PC{1,30}", "\\PC{0,40}").prop_map(|(host, digest)| Envelope::Hello(Hello::new(
            host,
            "boot",
            digest,
            Vec::new()
        ))),
    ]
}

fn read_stream(bytes: &[u8]) -> Result<Option<Envelope>, wire::WireError> {
    futures::executor::block_on(async {
        match wire::read_frame(bytes).await? {
            Some(m) => wire::decode_envelope(&m).map(Some),
            None => Ok(None),
        }
    })
}

proptest! {
    #![proptest_config(crate::support::proptest_config(256))]

    #[test]
    fn generated_messages_round_trip(env in envelope()) {
        let frame = wire::encode_envelope(&env).expect("encode");
        prop_assert_eq!(wire::decode_envelope_bytes(&frame).expect("decode"), env.clone());
        prop_assert_eq!(read_stream(&frame).expect("stream decode"), Some(env));
    }

    #[test]
    fn every_truncation_is_an_error(env in envelope(), cut in any::<usize>()) {
        let frame = wire::encode_envelope(&env).expect("encode");
        let cut = cut % frame.len();
        prop_assert!(wire::decode_envelope_bytes(&frame[..cut]).is_err());
        // On a stream, an empty read is a clean end; any other prefix is an error.
        match read_stream(&frame[..cut]) {
            Ok(None) => prop_assert_eq!(cut, 0),
            Ok(Some(e)) => prop_assert!(false, "decoded {e:?} from {cut} of {} bytes", frame.len()),
            Err(_) => {}
        }
    }

    #[test]
    fn bit_flips_never_panic_nor_overallocate(
        env in envelope(),
        flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..12),
    ) {
        let mut frame = wire::encode_envelope(&env).expect("encode");
        let len = frame.len();
        for (at, bit) in flips {
            frame[at % len] ^= 1 << bit;
        }
        let (_, largest) = largest_allocation_during(|| {
            let _ = wire::decode_envelope_bytes(&frame);
            let _ = read_stream(&frame);
        });
        prop_assert!(largest <= MAX_FRAME_BYTES, "allocated {largest} bytes at once");
    }

    #[test]
    fn a_batch_holds_at_most_what_the_hello_declared(n in 0u32..30_000, declared in 0usize..20_000) {
        let frame = link_common::zero_sized_batch(1, n);
        let r = wire::decode_envelope_bytes_within(&frame, FrameLimits::after_hello(declared));
        let allowed = declared.min(MAX_DECLARED as usize);
        match r {
            Ok(Envelope::Batch(b)) => {
                prop_assert!(n as usize <= allowed);
                prop_assert_eq!(b.resvals.len(), n as usize);
            }
            Err(WireError::TooMany { count, max, .. }) => {
                prop_assert!(n as usize > allowed);
                prop_assert_eq!((count, max as usize), (n, allowed));
            }
            other => prop_assert!(false, "unexpected {other:?}"),
        }
    }

    #[test]
    fn hostile_segment_tables_are_refused_without_allocating(
        segments in 0u32..600,
        sizes in proptest::collection::vec(any::<u32>(), 1..8),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        // Segment count - 1, then each segment's size in words, then a little payload.
        let mut frame = segments.to_le_bytes().to_vec();
        for s in &sizes {
            frame.extend_from_slice(&s.to_le_bytes());
        }
        frame.extend_from_slice(&tail);
        let (r, largest) = largest_allocation_during(|| read_stream(&frame));
        prop_assert!(largest <= MAX_FRAME_BYTES, "allocated {largest} bytes at once");
        let announced: u64 = sizes.iter().map(|&s| u64::from(s) * 8).sum();
        if announced > MAX_FRAME_BYTES as u64 {
            prop_assert!(r.is_err(), "accepted a frame announcing {announced} bytes");
        }
    }
}

#[test]
fn a_frame_announcing_4_gib_is_refused() {
    let mut frame = 0u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    let (r, largest) = largest_allocation_during(|| read_stream(&frame));
    assert!(r.is_err());
    assert!(
        largest <= MAX_FRAME_BYTES,
        "allocated {largest} bytes at once"
    );
}

#[test]
fn the_allocation_counter_sees_large_allocations() {
    let (v, largest) = largest_allocation_during(|| Vec::<u8>::with_capacity(MAX_FRAME_BYTES + 1));
    assert!(v.capacity() > MAX_FRAME_BYTES);
    assert!(largest > MAX_FRAME_BYTES);
}

#[test]
fn a_72_byte_batch_of_a_million_zero_sized_resvals_is_refused_from_its_header() {
    let frame = link_common::zero_sized_batch(1, 1_000_000);
    assert_eq!(frame.len(), 72);
    // It really announces a million elements within the traversal limit.
    let mut bytes = &frame[..];
    let msg = capnp::serialize::read_message_from_flat_slice(&mut bytes, wire::reader_options())
        .expect("a valid frame");
    let root = msg
        .get_root::<agent_capnp::envelope::Reader>()
        .expect("root");
    let Ok(agent_capnp::envelope::Which::Batch(b)) = root.which() else {
        panic!("not a batch");
    };
    assert_eq!(b.unwrap().get_resvals().unwrap().len(), 1_000_000);

    let (r, largest) = largest_allocation_during(|| {
        wire::decode_envelope_bytes_within(&frame, FrameLimits::after_hello(1))
    });
    match r {
        Err(WireError::TooMany {
            count: 1_000_000,
            max: 1,
            ..
        }) => {}
        other => panic!("expected TooMany, got {other:?}"),
    }
    assert!(largest < 64 * 1024, "allocated {largest} bytes at once");
    // Without a hello's bound, the protocol's own bound still refuses it.
    match wire::decode_envelope_bytes(&frame) {
        Err(WireError::TooMany { max, .. }) => assert_eq!(max, MAX_DECLARED),
        other => panic!("expected TooMany, got {other:?}"),
    }
}

#[test]
fn a_welcome_of_a_million_zero_sized_assignments_is_refused_from_its_header() {
    let (r, largest) = largest_allocation_during(|| {
        wire::decode_controller_bytes(&link_common::zero_sized_welcome(1_000_000))
    });
    match r {
        Err(WireError::TooMany { count, max, .. }) => {
            assert_eq!((count, max), (1_000_000, MAX_ASSIGNED));
        }
        other => panic!("expected TooMany, got {other:?}"),
    }
    assert!(largest < 64 * 1024, "allocated {largest} bytes at once");
    // The same frame with a list the bound allows decodes: the builder is a real welcome.
    assert_eq!(
        wire::decode_controller_bytes(&link_common::zero_sized_welcome(2)).unwrap(),
        ControllerMessage::Welcome(vec![(String::new(), String::new()); 2])
    );
}
