//! What one batch costs the receiver's host table (`receiver::hosts`), the part of the
//! controller that keeps every host's last values and charges each host for what it holds:
//! a one-value delta from a host that holds many values, each a text with an error (the
//! most a value may cost to account). Before the host's charge was kept as values change, every
//! batch counted the whole host again (each held error formatted anew): a delta cost in
//! proportion to the host, not to the delta.
//!
//! Run: `cargo bench --bench hosts` (env RESOURCES=4000 DELTAS=20000). In-process: the table
//! is a library structure, timed around its `apply` alone (no socket, no decode).

mod support {
    pub mod env;
}

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::env::env_or;
use xce_agent::link::wire::{Batch, Declared, Hello};
use xce_agent::receiver::budget::Budget;
use xce_agent::receiver::hosts::HostTable;
use xce_agent::receiver::identity::Peer;
use xce_agent::receiver::session::{Event, EventKind};
use xce_agent::value::{Failure, Resval, Status, Valtype, Value};

fn event(kind: EventKind) -> Event {
    Event {
        peer: Peer::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 1))),
        host: Some("node001".to_owned()),
        session: 1,
        kind,
        identity: None,
        reason: None,
    }
}

fn resval(i: usize) -> Resval {
    Resval {
        name: format!("resource_{i}"),
        instance: String::new(),
        value: Value::String("last good text".into()),
        status: Status::Failed,
        last_report_ms: Some(1),
        error: Some(Failure::new(std::io::Error::other(
            "the probe timed out after 10s",
        ))),
    }
}

fn batch(seq: u64, full: bool, resvals: Vec<Resval>) -> EventKind {
    EventKind::Batch {
        batch: Batch {
            seq,
            full,
            sent_at_ms: 0,
            resvals,
        },
        rejected: Vec::new(),
    }
}

fn main() {
    let resources: usize = env_or("RESOURCES", 4000);
    let deltas: usize = env_or("DELTAS", 20000);
    let budget = Budget::new(1 << 30, 1 << 28);
    let mut table = HostTable::new(Duration::from_secs(21), budget);
    let now = tokio::time::Instant::now();
    let declared = (0..resources)
        .map(|i| Declared {
            name: format!("resource_{i}"),
            instance: String::new(),
            valtype: Valtype::String,
            interval_ms: 1000,
            shared: false,
        })
        .collect();
    let hello = Hello::new("node001", "boot", "digest", declared);
    table.apply(event(EventKind::Hello(Arc::new(hello))), now);
    table.apply(
        event(batch(1, true, (0..resources).map(resval).collect())),
        now,
    );
    let frames: Vec<EventKind> = (0..deltas)
        .map(|k| batch(2 + k as u64, false, vec![resval(k % resources)]))
        .collect();
    let t0 = Instant::now();
    for kind in frames {
        table.apply(event(kind), now);
    }
    let per = t0.elapsed().as_secs_f64() * 1e6 / deltas as f64;
    println!(
        "## the host table: one-value deltas from a host holding {resources} values with errors"
    );
    println!("| deltas | µs per delta (apply) |");
    println!("|---|---|");
    println!("| {deltas} | {per:.2} |");
}
