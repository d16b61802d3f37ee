//! The agent's link against the reference receiver, over real TCP on 127.0.0.1.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use xce_agent::link::client::LinkState;
use xce_agent::link::wire::PROTOCOL_VERSION;
use xce_agent::receiver::session::{EventKind, ListenOpts};
use xce_agent::value::{Status, Valtype, Value};

fn three() -> Vec<(&'static str, &'static str, Valtype)> {
    vec![
        ("scratch", "", Valtype::Numeric),
        ("fw_version", "", Valtype::String),
        ("healthy", "", Valtype::Boolean),
    ]
}

#[tokio::test]
async fn first_snapshot_has_every_resval_then_deltas_carry_only_changes() {
    let store = store_with(&three());
    record(&store, "scratch", Value::Numeric(1234.5));
    record(&store, "fw_version", Value::String("20.31.1014".into()));
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let agent = Agent::start(fast_config(vec![ctl.addr.to_string()]), Arc::clone(&store));

    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
    assert_eq!(hello.host, "node001");
    assert_eq!(hello.resources.len(), 3);
    assert_eq!(snap.seq, 1);
    assert_eq!(snap.resvals, store.snapshot().1, "snapshot = the store");
    let healthy = snap.resvals.iter().find(|r| r.name == "healthy").unwrap();
    assert_eq!(
        (healthy.status, &healthy.value),
        (Status::Pending, &Value::Unknown)
    );

    // The same value again is no change; a new value is.
    record(&store, "scratch", Value::Numeric(1234.5));
    record(&store, "healthy", Value::Boolean(true));
    let delta = ctl.next_batch().await;
    assert!(!delta.full);
    assert_eq!(delta.seq, 2);
    assert_eq!(delta.resvals.len(), 1, "only the change: {delta:?}");
    assert_eq!(delta.resvals[0].name, "healthy");
    assert_eq!(delta.resvals[0].value, Value::Boolean(true));

    record(&store, "scratch", Value::Numeric(99.0));
    let delta = ctl.next_batch().await;
    assert_eq!(delta.seq, 3);
    assert_eq!(
        delta.resvals.iter().map(|r| &r.name).collect::<Vec<_>>(),
        ["scratch"]
    );
    wait_until("the snapshot counted once accepted", || {
        agent.stats.full_batches.load(Ordering::Relaxed) == 1
    })
    .await;
    agent.stop().await;
    ctl.stop().await;
}

/// `coalesce: 0` (issue 40): a change goes out at once, with no window. On the paused clock
/// (after the connection is up: loopback I/O is ready before the runtime parks, so the clock
/// moves only when every task waits on a timer), the delta arrives at the instant the value
/// was recorded; with a window it arrives that window later.
#[tokio::test]
async fn coalesce_zero_sends_a_change_at_once_and_a_window_waits_its_length() {
    for window in [Duration::ZERO, Duration::from_millis(200)] {
        let store = store_with(&three());
        let mut ctl = Controller::bind(ListenOpts::default()).await;
        let mut cfg = fast_config(vec![ctl.addr.to_string()]);
        cfg.coalesce = window;
        let agent = Agent::start(cfg, Arc::clone(&store));
        ctl.next_hello_and_snapshot().await;
        tokio::time::pause();
        let recorded = tokio::time::Instant::now();
        record(&store, "scratch", Value::Numeric(7.0));
        let delta = ctl.next_batch().await;
        let waited = recorded.elapsed();
        tokio::time::resume();
        assert_eq!(delta.resvals[0].value, Value::Numeric(7.0));
        // The timer wheel rounds a window up to its next millisecond.
        if window.is_zero() {
            assert_eq!(
                waited, window,
                "coalesce 0, yet the delta waited {waited:?}"
            );
        } else {
            assert!(
                waited >= window && waited <= window + Duration::from_millis(1),
                "the delta waited {waited:?} with coalesce {window:?}"
            );
        }
        agent.stop().await;
        ctl.stop().await;
    }
}

#[tokio::test]
async fn heartbeat_when_idle_names_the_last_batch() {
    let store = store_with(&three());
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let mut cfg = fast_config(vec![ctl.addr.to_string()]);
    cfg.heartbeat = Duration::from_millis(20);
    let agent = Agent::start(cfg, store);
    ctl.next_hello_and_snapshot().await;
    loop {
        match ctl.next().await.kind {
            EventKind::Heartbeat(hb) => {
                assert_eq!(hb.seq, 1);
                break;
            }
            EventKind::Batch { batch, .. } => panic!("no change, yet a batch: {batch:?}"),
            _ => {}
        }
    }
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn controller_down_at_start_then_up_gets_the_latest_values() {
    let store = store_with(&three());
    let (socket, addr) = bound_not_listening();
    let agent = Agent::start(fast_config(vec![addr.to_string()]), Arc::clone(&store));
    agent
        .wait_state("a failed round", |s| *s == LinkState::Backoff)
        .await;
    assert!(agent.stats.connect_failures.load(Ordering::Relaxed) >= 1);

    // Probing goes on while nobody listens.
    record(&store, "scratch", Value::Numeric(7.0));
    record(&store, "scratch", Value::Numeric(8.0));

    let listener = socket.listen(16).expect("listen");
    let mut ctl = Controller::serve(listener, ListenOpts::default());
    let (_, snap) = ctl.next_hello_and_snapshot().await;
    let scratch = snap.resvals.iter().find(|r| r.name == "scratch").unwrap();
    assert_eq!(scratch.value, Value::Numeric(8.0));
    assert_eq!(snap.resvals.len(), 3);
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn controller_restarted_mid_stream_gets_a_full_snapshot_again() {
    let store = store_with(&three());
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let addr = ctl.addr;
    let agent = Agent::start(fast_config(vec![addr.to_string()]), Arc::clone(&store));
    ctl.next_hello_and_snapshot().await;
    record(&store, "scratch", Value::Numeric(1.0));
    assert_eq!(ctl.next_batch().await.seq, 2);

    ctl.stop().await; // closes the listener and every connection
    agent
        .wait_state("the agent to notice the lost controller", |s| {
            !matches!(s, LinkState::Connected { .. })
        })
        .await;
    record(&store, "scratch", Value::Numeric(2.0));
    record(&store, "fw_version", Value::String("new".into()));

    // Same port again, as a restarted controller would.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).expect("rebind the controller port");
    let mut ctl = Controller::serve(socket.listen(16).unwrap(), ListenOpts::default());
    let (_, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(snap.seq, 1, "seq restarts per connection");
    assert_eq!(snap.resvals, store.snapshot().1, "every latest value");
    assert!(agent.stats.disconnects.load(Ordering::Relaxed) >= 1);
    // Counted once the controller's verdict (accepted) came, which may be after the
    // receiver saw the bytes.
    agent
        .wait_state("connected again", |s| {
            matches!(s, LinkState::Connected { .. })
        })
        .await;
    wait_until("the second snapshot counted", || {
        agent.stats.full_batches.load(Ordering::Relaxed) == 2
    })
    .await;
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn first_controller_refuses_second_gets_the_data() {
    let store = store_with(&three());
    record(&store, "scratch", Value::Numeric(5.0));
    let (_refusing, dead) = bound_not_listening();
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let agent = Agent::start(
        fast_config(vec![dead.to_string(), ctl.addr.to_string()]),
        Arc::clone(&store),
    );
    let (_, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(snap.resvals, store.snapshot().1);
    assert!(agent.stats.connect_failures.load(Ordering::Relaxed) >= 1);
    let second = LinkState::Connected {
        controller: ctl.addr.to_string(),
    };
    agent
        .wait_state("connected to the second", |s| *s == second)
        .await;
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn controller_that_accepts_and_closes_is_retried_with_a_snapshot_each_time() {
    let store = store_with(&three());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agent = Agent::start(fast_config(vec![addr.to_string()]), Arc::clone(&store));
    for _ in 0..2 {
        let (s, _) = guard("the agent to connect", listener.accept())
            .await
            .unwrap();
        drop(s);
    }
    record(&store, "healthy", Value::Boolean(false));
    let mut ctl = Controller::serve(listener, ListenOpts::default());
    let (_, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(snap.resvals, store.snapshot().1);
    assert!(agent.stats.connects.load(Ordering::Relaxed) >= 3);
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn controller_that_never_reads_is_noticed_and_memory_stays_bounded() {
    // Enough data per batch to fill the loopback socket buffers in a few batches.
    // (512 x 1 KiB, the protocol's cap on a string value).
    let names: Vec<String> = (0..512).map(|i| format!("big{i:03}")).collect();
    let decl: Vec<(&str, &str, Valtype)> = names
        .iter()
        .map(|n| (n.as_str(), "", Valtype::String))
        .collect();
    let store = store_with(&decl);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agent = Agent::start(fast_config(vec![addr.to_string()]), Arc::clone(&store));
    let (stalled, _) = guard("the agent to connect", listener.accept())
        .await
        .unwrap();
    agent
        .wait_state("the snapshot to go out", |s| {
            matches!(s, LinkState::Connected { .. })
        })
        .await;

    // Probes keep recording at their own pace while the link is stuck in a write.
    let mut state = agent.stats.subscribe();
    let mut rounds = 0u64;
    let bytes_before = agent.stats.bytes_sent.load(Ordering::Relaxed);
    while matches!(*state.borrow_and_update(), LinkState::Connected { .. }) {
        rounds += 1;
        // 1 KiB: the protocol's cap on a string value.
        let value = format!("{rounds:08}").repeat(128);
        for n in &names {
            record(&store, n, Value::String(value.clone()));
        }
        tokio::select! {
            _ = state.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        assert!(
            rounds < 100_000,
            "the link never noticed the stalled controller"
        );
    }
    eprintln!(
        "stalled after {rounds} probe rounds, {} batches, {} bytes sent",
        agent.stats.batches.load(Ordering::Relaxed),
        agent.stats.bytes_sent.load(Ordering::Relaxed)
    );
    assert!(agent.stats.write_timeouts.load(Ordering::Relaxed) >= 1);
    assert_eq!(
        agent.stats.max_in_flight.load(Ordering::Relaxed),
        1,
        "never more than the one frame being written"
    );
    // What reached the stalled connection is what the kernel buffers took, not one frame per
    // probe round: most rounds were folded into the latest value.
    let frames = agent.stats.batches.load(Ordering::Relaxed);
    assert!(
        frames < rounds + 1,
        "{frames} batches for {rounds} rounds: deltas were queued, not coalesced"
    );
    assert!(agent.stats.bytes_sent.load(Ordering::Relaxed) >= bytes_before);
    drop(stalled);

    // A controller that reads gets the latest values.
    let latest = format!("{rounds:08}").repeat(128);
    let mut ctl = Controller::serve(listener, ListenOpts::default());
    let (_, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(snap.resvals.len(), 512);
    assert!(snap
        .resvals
        .iter()
        .all(|r| r.value == Value::String(latest.clone())));
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn welcome_assigns_shared_instances() {
    let store = store_with(&three());
    let opts = ListenOpts {
        ack: true,
        assign: vec![("license".into(), "all".into())],
        tls: None, // plaintext
        ..ListenOpts::default()
    };
    let mut ctl = Controller::bind(opts).await;
    let mut agent = Agent::start(fast_config(vec![ctl.addr.to_string()]), Arc::clone(&store));
    ctl.next_hello_and_snapshot().await;
    let assigned = guard("the welcome", agent.assigned.wait_for(|a| !a.is_empty()))
        .await
        .unwrap()
        .clone();
    assert_eq!(
        assigned,
        BTreeSet::from([("license".to_string(), "all".to_string())])
    );
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn reload_resends_hello_and_a_full_snapshot() {
    let store = store_with(&three());
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let agent = Agent::start(fast_config(vec![ctl.addr.to_string()]), Arc::clone(&store));
    ctl.next_hello_and_snapshot().await;

    // What the daemon does on SIGHUP: new hello, then the new declared set.
    let reloaded = store_with(&[("scratch", "", Valtype::Numeric)]);
    agent.hello.send_replace(Arc::new(hello_for(&reloaded)));
    store.declare(reloaded.declared());
    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(hello.resources.len(), 1);
    assert_eq!(snap.resvals.len(), 1);
    assert!(snap.seq > 1, "same connection, seq keeps increasing");
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn stopping_the_agent_closes_the_connection_cleanly() {
    let store = store_with(&three());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agent = Agent::start(fast_config(vec![addr.to_string()]), store);
    let (mut s, _) = guard("connect", listener.accept()).await.unwrap();
    agent
        .wait_state("connected", |s| matches!(s, LinkState::Connected { .. }))
        .await;
    agent.stop().await;
    let mut rest = Vec::new();
    guard("EOF from the agent", s.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(!rest.is_empty(), "hello and snapshot were sent before");
}

#[tokio::test]
async fn a_new_hello_alone_resends_hello_and_a_full_snapshot() {
    let store = store_with(&three());
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let agent = Agent::start(fast_config(vec![ctl.addr.to_string()]), Arc::clone(&store));
    ctl.next_hello_and_snapshot().await;
    let mut h = hello_for(&store);
    h.config_digest = "digest-2".into();
    agent.hello.send_replace(Arc::new(h));
    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(hello.config_digest, "digest-2");
    assert_eq!(snap.resvals, store.snapshot().1);
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn garbage_from_the_controller_makes_the_agent_reconnect() {
    let store = store_with(&three());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agent = Agent::start(fast_config(vec![addr.to_string()]), Arc::clone(&store));
    let (mut s, _) = guard("connect", listener.accept()).await.unwrap();
    s.write_all(&[0xff; 64]).await.unwrap();
    // The agent drops that connection and comes back with a fresh hello + snapshot.
    let mut ctl = Controller::serve(listener, ListenOpts::default());
    let (_, snap) = ctl.next_hello_and_snapshot().await;
    assert_eq!(snap.seq, 1);
    assert!(agent.stats.disconnects.load(Ordering::Relaxed) >= 1);
    drop(s);
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn no_controllers_is_idle_not_a_busy_loop() {
    let store = store_with(&three());
    let agent = Agent::start(fast_config(vec![]), store);
    agent.wait_state("idle", |s| *s == LinkState::Backoff).await;
    assert_eq!(agent.stats.connect_failures.load(Ordering::Relaxed), 0);
    agent.stop().await;
}
