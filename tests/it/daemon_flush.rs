//! Shutdown while connected: the link sends what the controller has not seen yet, then
//! closes the connection cleanly.

use std::time::Duration;

use crate::support::{fast_config, record, store_with, Agent, Controller};
use xce_agent::link::client::LinkState;
use xce_agent::receiver::session::{EventKind, ListenOpts};
use xce_agent::value::{Valtype, Value};

#[tokio::test]
async fn shutdown_flushes_the_pending_delta_then_closes() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let mut cfg = fast_config(vec![ctl.addr.to_string()]);
    // Changes wait an hour before they are sent: only the shutdown flush can send this one.
    cfg.coalesce = Duration::from_secs(3600);
    let agent = Agent::start(cfg, store_with(&[("scratch", "", Valtype::Numeric)]));
    agent
        .wait_state("connected", |s| matches!(s, LinkState::Connected { .. }))
        .await;
    ctl.next_hello_and_snapshot().await;
    record(&agent.store, "scratch", Value::Numeric(512.0));
    let stats = agent.stats.clone();
    agent.stop().await;

    let batch = ctl.next_batch().await;
    assert!(!batch.full, "{batch:?}");
    assert_eq!(batch.resvals.len(), 1, "{batch:?}");
    assert_eq!(batch.resvals[0].value, Value::Numeric(512.0));
    loop {
        match ctl.next().await.kind {
            EventKind::Closed(None) => break,
            EventKind::Closed(Some(e)) => panic!("connection dropped uncleanly: {e}"),
            EventKind::Heartbeat(_) => {}
            other => panic!("unexpected after the last batch: {other:?}"),
        }
    }
    assert_eq!(
        stats.batches.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "snapshot + the flushed delta"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn shutdown_with_nothing_pending_sends_no_empty_batch() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let agent = Agent::start(
        fast_config(vec![ctl.addr.to_string()]),
        store_with(&[("scratch", "", Valtype::Numeric)]),
    );
    agent
        .wait_state("connected", |s| matches!(s, LinkState::Connected { .. }))
        .await;
    ctl.next_hello_and_snapshot().await;
    agent.stop().await;
    loop {
        match ctl.next().await.kind {
            EventKind::Closed(None) => break,
            EventKind::Heartbeat(_) => {}
            other => panic!("unexpected at shutdown: {other:?}"),
        }
    }
    ctl.stop().await;
}
