//! The real `xce-agent` binary streaming to a controller over real TCP on 127.0.0.1: the
//! in-process reference receiver (`receiver::session::serve`), raw sockets standing in for
//! broken controllers, and the real `xce-agent listen` binary. Probes are exec scripts and
//! files in a temp dir.

use crate::support as common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;

use crate::support::*;
use crate::support::{bound_not_listening, guard, read_two_frames, Controller};
use tokio::net::TcpSocket;
use xce_agent::link::wire::{self, Batch, Envelope, Hello};
use xce_agent::receiver::session::{EventKind, ListenOpts};
use xce_agent::value::{Status, Value};

/// Probes with constant values (so the daemon and `--once` must agree), a counter, and a
/// file probe on `level` (numeric).
fn resources(site_dir: &std::path::Path) -> String {
    format!(
        "resources:
  - name: const_num
    valtype: numeric
    interval: 1
    probe: {{kind: exec, command: [const_num.sh]}}
  - name: const_str
    valtype: string
    interval: 1
    probe: {{kind: exec, command: [pair.sh], format: kv, provides: [const_flag]}}
  - name: const_flag
    valtype: boolean
    interval: 1
  - name: counter
    valtype: numeric
    interval: 1
    probe: {{kind: exec, command: [counter.sh]}}
  - name: level
    valtype: numeric
    interval: 1
    probe: {{kind: file, path: {}/level}}
",
        site_dir.display()
    )
}

const NAMES: [&str; 5] = ["const_num", "const_str", "const_flag", "counter", "level"];

fn site(controllers: &[String]) -> Site {
    // The resources name the site's own dir, so write them after creating it.
    let site = Site::new(controllers, "resources: []\n");
    std::fs::write(site.file("resources.yaml"), resources(site.path())).expect("resources");
    site.script("const_num.sh", "#!/bin/sh\necho 42.5\n");
    site.script(
        "pair.sh",
        "#!/bin/sh\necho 'const_str = fw-20.31'\necho 'const_flag = true'\n",
    );
    site.counter_script("counter");
    site.write_atomic("level", "1\n");
    site
}

fn names_of(hello: &Hello) -> BTreeSet<String> {
    hello.resources.iter().map(|d| d.name.clone()).collect()
}

fn batch_names(batch: &Batch) -> BTreeSet<String> {
    batch.resvals.iter().map(|r| r.name.clone()).collect()
}

/// Hello declares every resource and the full batch after it carries each exactly once.
fn assert_complete(hello: &Hello, snap: &Batch) {
    let want: BTreeSet<String> = NAMES.iter().map(|s| s.to_string()).collect();
    assert_eq!(hello.host, "node001");
    assert_eq!(names_of(hello), want, "hello declares every resource");
    assert_eq!(batch_names(snap), want, "full batch carries every resource");
    assert_eq!(
        snap.resvals.len(),
        want.len(),
        "each exactly once: {snap:?}"
    );
}

/// Apply batches until `done` holds on the controller's view.
async fn until(ctl: &mut Controller, view: &mut View, mut done: impl FnMut(&View) -> bool) {
    while !done(view) {
        let b = ctl.next_batch().await;
        view.apply(&b);
    }
}

fn ok_value(view: &View, name: &str) -> Option<Value> {
    view.values
        .get(name)
        .filter(|r| r.status == Status::Ok)
        .map(|r| r.value.clone())
}

fn all_ok(view: &View) -> bool {
    NAMES.iter().all(|n| ok_value(view, n).is_some())
}

fn counter(view: &View) -> f64 {
    match ok_value(view, "counter") {
        Some(Value::Numeric(x)) => x,
        other => panic!("counter is not an ok number: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_snapshot_has_every_resource_and_matches_once() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let site = site(&[ctl.addr.to_string()]);
    let mut agent = site.spawn_agent();

    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_complete(&hello, &snap);
    let mut view = View::default();
    view.apply(&snap);
    until(&mut ctl, &mut view, all_ok).await;
    agent.assert_alive();

    let out = std::process::Command::new(agent_bin())
        .args(["--once", "--format", "json", "--config"])
        .arg(site.agent_yaml())
        .output()
        .expect("run --once");
    assert!(
        out.status.success(),
        "--once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let once: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--once JSON");
    assert_eq!(once["host"], "node001");
    let rows = once["resources"].as_array().expect("resources array");
    for name in ["const_num", "const_str", "const_flag", "level"] {
        let row = rows
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("--once has no {name}: {once}"));
        assert_eq!(row["status"], "ok", "{row}");
        let streamed = serde_json::to_value(ok_value(&view, name)).expect("value to JSON");
        assert_eq!(row["value"], streamed, "{name}: --once vs stream");
    }
    assert_eq!(ok_value(&view, "const_num"), Some(Value::Numeric(42.5)));
    assert_eq!(
        ok_value(&view, "const_str"),
        Some(Value::String("fw-20.31".into()))
    );
    assert_eq!(ok_value(&view, "const_flag"), Some(Value::Boolean(true)));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_down_at_start_then_up_gets_hello_and_latest_snapshot() {
    // Bound but not listening: the agent's connects are refused until `listen`.
    let (socket, addr) = bound_not_listening();
    let site = site(&[addr.to_string()]);
    let mut agent = site.spawn_agent();
    // Probing goes on while no controller is reachable.
    site.wait_runs("counter", 3).await;
    agent.wait_log("started", 1).await;
    let runs_before = site.runs("counter");

    let listener = socket.listen(1024).expect("listen");
    let mut ctl = Controller::serve(listener, ListenOpts::default());
    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_complete(&hello, &snap);
    let mut view = View::default();
    view.apply(&snap);
    // The first snapshot carries what was probed while the controller was away: the
    // counter had finished at least `runs_before - 1` runs when the controller came up.
    let first = counter(&view);
    assert!(
        first >= (runs_before - 1) as f64,
        "snapshot counter {first} older than the {runs_before} runs before connect"
    );
    until(&mut ctl, &mut view, all_ok).await;
    agent.assert_alive();
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restart_gets_full_snapshot_and_latest_values() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let addr = ctl.addr;
    let site = site(&[addr.to_string()]);
    let mut agent = site.spawn_agent();
    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_complete(&hello, &snap);
    let mut view = View::default();
    view.apply(&snap);
    until(&mut ctl, &mut view, |v| {
        all_ok(v) && ok_value(v, "level") == Some(Value::Numeric(1.0))
    })
    .await;
    let counter_before = counter(&view);

    // The controller dies: listener and connections closed.
    ctl.stop().await;
    agent.wait_log("link to controller lost", 1).await;
    // Values change while it is away; only the latest has to arrive.
    site.write_atomic("level", "2\n");
    let runs = site.runs("counter");
    site.wait_runs("counter", runs + 2).await;
    site.write_atomic("level", "3\n");

    let mut ctl = Controller::serve(listen_on(addr), ListenOpts::default());
    let (hello2, snap2) = ctl.next_hello_and_snapshot().await;
    assert_complete(&hello2, &snap2);
    assert_eq!(snap2.seq, 1, "a new connection starts again at seq 1");
    assert_eq!(hello2.boot_id, hello.boot_id);
    let mut view = View::default();
    view.apply(&snap2);
    assert!(
        counter(&view) > counter_before,
        "snapshot after restart has a newer counter than before: {} vs {counter_before}",
        counter(&view)
    );
    until(&mut ctl, &mut view, |v| {
        ok_value(v, "level") == Some(Value::Numeric(3.0))
    })
    .await;
    agent.assert_alive();
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_controller_is_used_when_the_first_refuses() {
    let (_dead, dead_addr) = bound_not_listening();
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let site = site(&[dead_addr.to_string(), ctl.addr.to_string()]);
    let mut agent = site.spawn_agent();
    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_complete(&hello, &snap);
    assert_eq!(snap.seq, 1);
    let mut view = View::default();
    view.apply(&snap);
    until(&mut ctl, &mut view, all_ok).await;
    agent.assert_alive();
    ctl.stop().await;
}

/// SIGTERM, then the controller must see the stream end cleanly (no error).
async fn terminate_and_expect_clean_close(agent: &mut AgentProc, ctl: &mut Controller) {
    let status = agent.terminate().await;
    assert!(
        status.success(),
        "exit after SIGTERM: {status}; log:\n{}",
        agent.log_text()
    );
    loop {
        match ctl.next().await.kind {
            EventKind::Closed(None) => break,
            EventKind::Closed(Some(e)) => panic!("stream ended with an error: {e}"),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_daemon_and_closes_the_stream_cleanly() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let site = site(&[ctl.addr.to_string()]);
    let mut agent = site.spawn_agent();
    let (hello, snap) = ctl.next_hello_and_snapshot().await;
    assert_complete(&hello, &snap);
    // Running for a while (see the next test for SIGTERM right at startup).
    site.wait_runs("counter", 2).await;
    terminate_and_expect_clean_close(&mut agent, &mut ctl).await;
    ctl.stop().await;
}

/// A service manager may stop the agent at any moment, including while it starts. Once the
/// agent is streaming, SIGTERM must be a clean stop, never death by the default action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_the_first_snapshot_is_a_clean_stop() {
    for _ in 0..10 {
        let mut ctl = Controller::bind(ListenOpts::default()).await;
        let site = site(&[ctl.addr.to_string()]);
        let mut agent = site.spawn_agent();
        ctl.next_hello_and_snapshot().await;
        terminate_and_expect_clean_close(&mut agent, &mut ctl).await;
        ctl.stop().await;
    }
}

/// Number of kv probes and resources per probe in the slow-reader test, and the padding of
/// each string value: ~50 KB of output per probe run (under the 64 KiB stdout cap), so an
/// agent that queued batches for a stalled controller would grow by megabytes.
const BULK_PROBES: usize = 8;
const BULK_PER_PROBE: usize = 50;
const BULK_PAD: usize = 1000;

fn bulk_site(controller: &str) -> Site {
    let site = Site::new(&[controller.to_owned()], "resources: []\n");
    let d = site.path().display().to_string();
    let mut res = String::from("resources:\n");
    for p in 0..BULK_PROBES {
        let names: Vec<String> = (0..BULK_PER_PROBE).map(|j| format!("b{p}_{j}")).collect();
        let template: String = names
            .iter()
            .map(|n| format!("{n} = {}\n", "x".repeat(BULK_PAD)))
            .collect();
        std::fs::write(site.file(&format!("template{p}")), template).expect("template");
        for (j, n) in names.iter().enumerate() {
            res.push_str(&format!(
                "  - name: {n}\n    valtype: string\n    interval: 1\n"
            ));
            if j == 0 {
                res.push_str(&format!(
                    "    probe: {{kind: exec, command: [bulk.sh, \"{p}\"], format: kv, provides: [{}]}}\n",
                    names[1..].join(", ")
                ));
            }
        }
    }
    std::fs::write(site.file("resources.yaml"), res).expect("resources");
    // Every run changes every value (the run number is appended); probe 0 also logs runs.
    site.script(
        "bulk.sh",
        &format!(
            "#!/bin/sh\nn=$(cat {d}/count$1 2>/dev/null || echo 0)\nn=$((n + 1))\n\
             echo $n > {d}/count$1\n[ \"$1\" = 0 ] && echo $n >> {d}/bulk.runs\n\
             sed \"s/\\$/$n/\" {d}/template$1\n"
        ),
    );
    site
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_that_never_reads_keeps_agent_memory_bounded_and_probes_running() {
    // A controller that accepts and holds every connection without reading, with a tiny
    // receive buffer (inherited by accepted sockets) so the agent's writes stall at once.
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(16).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });

    let site = bulk_site(&addr.to_string());
    let mut agent = site.spawn_agent();
    // The stall is established once the agent gave up on a connection whose writes made no
    // progress (its write timeout, or TCP_USER_TIMEOUT on the unacknowledged data).
    agent.wait_log("link to controller lost", 1).await;
    let rss_stalled = agent.rss_kib();
    let runs = site.runs("bulk");

    // Many more probe rounds (each changes all 400 values) against stalled connections:
    // the agent reconnects, stalls again, and keeps only the latest values.
    let more = 30;
    // Round by round: each wait is for one round (a second), bounded by the hang guard.
    // One wait for all 30 needed half the guard on an idle machine (the test took 40 s
    // alone), so a loaded full run could trip it with nothing wrong.
    for round in 1..=more {
        site.wait_runs("bulk", runs + round).await;
    }
    agent.wait_log("link to controller lost", 2).await;
    let rss_later = agent.rss_kib();
    agent.assert_alive();
    eprintln!(
        "RSS after stall {rss_stalled} KiB, after {more} more rounds {rss_later} KiB \
         ({} KiB of values per round)",
        BULK_PROBES * BULK_PER_PROBE * (BULK_PAD + 10) / 1024
    );
    // A memory bound, not a timing one: queued batches would be ~400 KiB per round, so at
    // least ~11 MiB over the rounds above; a non-queuing agent grows by well under 1 MiB.
    let bound_kib = 8 * 1024;
    assert!(
        rss_later <= rss_stalled + bound_kib,
        "agent RSS grew from {rss_stalled} KiB to {rss_later} KiB while the controller \
         did not read"
    );
    holder.abort();
}

/// Pseudo-random but reproducible bytes.
fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Send `bytes` as one fake agent, close our side, and read until `listen` closes the
/// connection (it must drop a bad one, not wait forever).
fn send_bad(addr: std::net::SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).expect("connect to listen");
    // Hang guard, not a timing assertion.
    s.set_read_timeout(Some(HANG_GUARD)).expect("timeout");
    // The receiver may drop us mid-write (oversized header): a write error is expected then.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("listen did not close a bad connection: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_survives_garbage_truncated_and_oversized_frames() {
    let mut listen = ListenProc::spawn();
    let hello = wire::encode_envelope(&Envelope::Hello(Hello::new(
        "node009",
        "boot",
        "digest",
        Vec::new(),
    )))
    .expect("encode");
    // One segment announcing 2^26 words (512 MiB): far over the frame limit.
    let mut oversized = Vec::new();
    oversized.extend_from_slice(&0u32.to_le_bytes());
    oversized.extend_from_slice(&(1u32 << 26).to_le_bytes());
    oversized.extend_from_slice(&[0u8; 64]);
    // A plausible header (one segment of 8 words) over random words: pointers to nowhere.
    let mut bad_body = Vec::new();
    bad_body.extend_from_slice(&0u32.to_le_bytes());
    bad_body.extend_from_slice(&8u32.to_le_bytes());
    bad_body.extend_from_slice(&noise(64));
    // (what, bytes, the log line, a word of the logged reason). A frame cut short is the
    // peer's end of stream (a close, as kill -9 or a cable would make it), not an error.
    let bad: [(&str, Vec<u8>, &str, &str); 4] = [
        (
            "random bytes",
            noise(4096),
            "dropping agent connection",
            "malformed",
        ),
        (
            "truncated frame",
            hello[..hello.len() / 2].to_vec(),
            "agent disconnected",
            "in the middle of a frame",
        ),
        (
            "oversized segment",
            oversized,
            "dropping agent connection",
            "too large",
        ),
        (
            "garbage body",
            bad_body,
            "dropping agent connection",
            "error=",
        ),
    ];
    for (what, bytes, line, reason) in &bad {
        send_bad(listen.addr, bytes);
        let err = listen.next_err_matching(line);
        assert!(err.contains(reason), "{what}: {err}");
        listen.assert_alive();
    }

    // It still serves: a real agent's values get printed.
    let site = site(&[listen.addr.to_string()]);
    let mut agent = site.spawn_agent();
    let hello = listen.next_json(|v| v["event"] == "hello");
    assert_eq!(hello["host"], "node001");
    let line = listen
        .next_json(|v| v["event"] == "resval" && v["name"] == "const_num" && v["status"] == "ok");
    assert_eq!(line["value"], 42.5);
    assert_eq!(line["host"], "node001");
    agent.assert_alive();
    listen.assert_alive();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the capnp tool; CI runs it with `cargo test -- --ignored`"]
async fn capture_of_the_agent_binary_decodes_with_capnp_tool() {
    common::require_tool("capnp", &["--version"], "apt-get install capnproto");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let site = site(&[addr.to_string()]);
    let mut agent = site.spawn_agent();
    let (mut s, _) = guard("the agent to connect", listener.accept())
        .await
        .expect("accept");

    // Raw bytes until they hold two complete frames (hello + full snapshot).
    let (capture, complete) = read_two_frames(&mut s).await;
    agent.assert_alive();
    drop(agent);
    let path = site.file("stream.bin");
    std::fs::write(&path, &capture[..complete]).expect("write capture");
    let schema = concat!(env!("CARGO_MANIFEST_DIR"), "/schema/agent.capnp");
    let out = std::process::Command::new("capnp")
        .args(["decode", schema, "Envelope"])
        .stdin(std::fs::File::open(&path).expect("open capture"))
        .output()
        .expect("run capnp decode");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "capnp decode failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("host = \"node001\""), "{text}");
    assert!(text.contains("name = \"const_num\""), "{text}");
    assert!(text.contains("full = true"), "{text}");
}
