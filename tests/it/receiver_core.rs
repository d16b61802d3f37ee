//! The receiver under hostile peers (issue #35): a host over its share of the memory budget
//! is cut off (`over_budget`) while an honest host keeps reporting; a frame before an
//! accepted hello is small; a silent session times out; a frame cut short is a close.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use xce_agent::link::wire::{self, Batch, Declared, Envelope, Hello};
use xce_agent::receiver::budget::Budget;
use xce_agent::receiver::session::{Event, EventKind, ListenOpts, Reason, PRE_HELLO_FRAME_BYTES};
use xce_agent::value::{Resval, Status, Valtype, Value};

fn strings_hello(host: &str, n: usize) -> Envelope {
    Envelope::Hello(Hello::new(
        host,
        "boot",
        "digest",
        (0..n)
            .map(|i| Declared {
                name: format!("s{i:04}"),
                instance: String::new(),
                valtype: Valtype::String,
                interval_ms: 1000,
                shared: false,
            })
            .collect(),
    ))
}

fn strings_batch(seq: u64, n: usize, len: usize) -> Envelope {
    Envelope::Batch(Batch {
        seq,
        full: true,
        sent_at_ms: 1,
        resvals: (0..n)
            .map(|i| Resval {
                name: format!("s{i:04}"),
                instance: String::new(),
                value: Value::String("v".repeat(len)),
                status: Status::Ok,
                last_report_ms: Some(1),
                error: None,
            })
            .collect(),
    })
}

fn frame(env: &Envelope) -> Vec<u8> {
    wire::encode_envelope(env).expect("encode")
}

/// The next event that ends a connection of `host` (None: a connection before its hello).
async fn next_end(ctl: &mut Controller, host: Option<&str>) -> Event {
    loop {
        let ev = ctl.next().await;
        if matches!(ev.kind, EventKind::Closed(_)) && ev.host.as_deref() == host {
            return ev;
        }
    }
}

#[tokio::test]
async fn a_host_over_its_share_is_cut_off_and_an_honest_host_keeps_reporting() {
    // A share of 256 KiB: a full batch of 1,000 strings of 1 KiB is 1 MiB.
    let budget = Budget::new(64 << 20, 256 << 10);
    let mut ctl = Controller::bind(ListenOpts {
        budget: Some(Arc::clone(&budget)),
        ..ListenOpts::default()
    })
    .await;
    let store = store_with(&[("scratch", "", Valtype::Numeric)]);
    record(&store, "scratch", Value::Numeric(1.0));
    let honest = Agent::start(fast_config(vec![ctl.addr.to_string()]), Arc::clone(&store));
    ctl.next_hello_and_snapshot().await;

    let mut attacker = TcpStream::connect(ctl.addr).await.unwrap();
    attacker
        .write_all(&frame(&strings_hello("node666", 1000)))
        .await
        .unwrap();
    attacker
        .write_all(&frame(&strings_batch(1, 1000, 1024)))
        .await
        .unwrap();
    let ev = next_end(&mut ctl, Some("node666")).await;
    assert_eq!(ev.reason, Some(Reason::OverBudget), "{ev:?}");
    match &ev.kind {
        EventKind::Closed(Some(e)) => assert!(e.contains("share"), "{e}"),
        other => panic!("{other:?}"),
    }
    // The honest host still reports.
    record(&store, "scratch", Value::Numeric(2.0));
    let batch = ctl.next_batch().await;
    assert_eq!(batch.resvals[0].value, Value::Numeric(2.0));
    assert!(
        budget.used() < 256 << 10,
        "{} bytes still held",
        budget.used()
    );
    honest.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn two_hundred_sessions_announcing_7_mib_before_a_hello_hold_nothing() {
    let budget = Budget::new(64 << 20, 8 << 20);
    let mut ctl = Controller::bind(ListenOpts {
        budget: Some(Arc::clone(&budget)),
        ..ListenOpts::default()
    })
    .await;
    // Each announces one 7 MiB segment, sends 64 KiB of it and holds the connection.
    let words = ((7 << 20) / 8) as u32;
    let mut header = 0u32.to_le_bytes().to_vec();
    header.extend_from_slice(&words.to_le_bytes());
    header.extend_from_slice(&[0u8; 64 << 10]);
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(ctl.addr).await.unwrap();
        // The receiver may close before all of it is written: that is the point.
        let _ = s.write_all(&header).await;
        held.push(s);
    }
    for _ in 0..200 {
        let ev = next_end(&mut ctl, None).await;
        assert_eq!(ev.reason, Some(Reason::Limit), "{ev:?}");
        match &ev.kind {
            EventKind::Closed(Some(e)) => assert!(
                e.contains("too large") && e.contains(&PRE_HELLO_FRAME_BYTES.to_string()),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
    }
    assert!(budget.used() < 1 << 20, "{} bytes held", budget.used());
    drop(held);
    ctl.stop().await;
}

#[tokio::test]
async fn a_session_silent_for_its_idle_timeout_is_closed_as_a_timeout() {
    let mut ctl = Controller::bind(ListenOpts {
        idle_timeout: Some(Duration::from_millis(200)),
        ..ListenOpts::default()
    })
    .await;
    let mut s = TcpStream::connect(ctl.addr).await.unwrap();
    s.write_all(&frame(&strings_hello("node009", 1)))
        .await
        .unwrap();
    s.write_all(&frame(&strings_batch(1, 1, 3))).await.unwrap();
    // Then nothing, and the socket stays open (a half-open connection looks like this).
    let ev = next_end(&mut ctl, Some("node009")).await;
    assert_eq!(ev.reason, Some(Reason::Timeout), "{ev:?}");
    drop(s);
    ctl.stop().await;
}

#[tokio::test]
async fn a_string_value_over_the_cap_is_rejected_and_the_connection_goes_on() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let mut s = TcpStream::connect(ctl.addr).await.unwrap();
    s.write_all(&frame(&strings_hello("node010", 2)))
        .await
        .unwrap();
    let mut b = strings_batch(1, 2, 10);
    if let Envelope::Batch(batch) = &mut b {
        batch.resvals[1].value = Value::String("x".repeat(4 << 20));
    }
    s.write_all(&frame(&b)).await.unwrap();
    let (batch, rejected) = loop {
        if let EventKind::Batch { batch, rejected } = ctl.next().await.kind {
            break (batch, rejected);
        }
    };
    assert_eq!(batch.resvals.len(), 1);
    assert_eq!(rejected.len(), 1);
    assert!(rejected[0].1.contains("1024-byte cap"), "{}", rejected[0].1);
    drop(s);
    ctl.stop().await;
}
