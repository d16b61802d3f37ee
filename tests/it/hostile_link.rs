//! Hostile peers against the real binaries: `xce-agent listen` fed the amplification batch
//! (a 72-byte frame announcing a million zero-sized resvals), floods of rejected resvals and
//! forged names; the agent fed welcomes of a million zero-sized assignments, welcomes with bad
//! names, and a controller flapping between two welcomes as fast as it can. Each test counts
//! what came out (resvals accepted, log lines, hellos, replans): bounded by the rules, not by
//! how fast this machine is.

use std::time::Instant;

use crate::support::{numeric_declared, resval, zero_sized_batch, zero_sized_welcome};
use crate::support::{AgentProc, ListenProc, Site, HANG_GUARD};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::compat::TokioAsyncReadCompatExt;
use xce_agent::link::wire::{self, Batch, ControllerMessage, Declared, Envelope, Hello};
use xce_agent::text::is_clean_line;
use xce_agent::value::{Resval, Valtype, Value};

fn hello(host: &str, names: &[String]) -> Vec<u8> {
    wire::encode_envelope(&Envelope::Hello(Hello::new(
        host,
        "boot",
        "digest",
        numeric_declared(names),
    )))
    .expect("encode hello")
}

fn batch(seq: u64, full: bool, resvals: Vec<Resval>) -> Vec<u8> {
    wire::encode_envelope(&Envelope::Batch(Batch {
        seq,
        full,
        sent_at_ms: 1,
        resvals,
    }))
    .expect("encode batch")
}

async fn send(addr: std::net::SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect to listen");
    // listen may drop the connection before reading everything: that is the point.
    let _ = s.write_all(bytes).await;
    s
}

/// Wait (bounded) for listen's JSON event `event` from `host`; returns it.
fn wait_event(listen: &mut ListenProc, event: &str, host: &str) -> serde_json::Value {
    listen.next_json(|v| v["event"] == event && v["host"] == host)
}

#[tokio::test]
async fn amplification_batches_cost_listen_one_log_line_per_connection_and_no_resval() {
    let mut listen = ListenProc::spawn();
    // Eight hosts, one connection each (a second live connection for one host would replace
    // the first: that rule has its own tests).
    let hosts: Vec<String> = (1..=8).map(|i| format!("node10{i}")).collect();
    let mut conns = Vec::new();
    for host in &hosts {
        let mut frames = hello(host, &["gpu".to_owned()]);
        for seq in 1..=12 {
            frames.extend(zero_sized_batch(seq, 1_000_000));
        }
        conns.push(send(listen.addr, &frames).await);
    }
    // The eight drops, in whatever order the connections end.
    let mut dropped_hosts = std::collections::BTreeSet::new();
    while dropped_hosts.len() < hosts.len() {
        let dropped = listen.next_json(|v| v["event"] == "dropped");
        let error = dropped["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("Batch.resvals holds 1000000 entries, more than the 1"),
            "{dropped}"
        );
        dropped_hosts.insert(dropped["host"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(dropped_hosts, hosts.iter().cloned().collect());
    // A well-behaved agent afterwards still gets through.
    let mut good = hello("node002", &["gpu".to_owned()]);
    good.extend(batch(1, true, vec![resval("gpu", Value::Numeric(3.0))]));
    conns.push(send(listen.addr, &good).await);
    let v = wait_event(&mut listen, "resval", "node002");
    assert_eq!(v["value"], 3.0);
    listen.assert_alive();

    let (stdout, stderr) = listen.terminate_and_collect();
    let accepted = stdout
        .iter()
        .filter(|l| l.contains("\"resval\"") && hosts.iter().any(|h| l.contains(h.as_str())))
        .count();
    assert_eq!(
        accepted, 0,
        "resvals accepted from the amplification frames"
    );
    let drops = stderr.iter().filter(|l| l.contains("dropping")).count();
    assert!(drops <= 8, "{drops} drop lines for 8 connections");
    assert!(
        stderr.len() <= 8 + 2,
        "{} stderr lines for 8 connections:\n{}",
        stderr.len(),
        stderr.join("\n")
    );
}

#[tokio::test]
async fn a_flood_of_rejected_resvals_makes_one_warning_and_a_summary() {
    let mut listen = ListenProc::spawn();
    let names: Vec<String> = (0..1000).map(|i| format!("r{i}")).collect();
    let wrong: Vec<Resval> = names
        .iter()
        .map(|n| resval(n, Value::String("not a number".into())))
        .collect();
    let mut frames = hello("node003", &names);
    frames.extend(batch(1, true, wrong.clone()));
    frames.extend(batch(2, false, wrong));
    let mut s = send(listen.addr, &frames).await;
    s.shutdown().await.expect("close write");
    wait_event(&mut listen, "closed", "node003");

    let (_, stderr) = listen.terminate_and_collect();
    let full: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("rejected resval (more like it"))
        .collect();
    let summaries: Vec<u64> = stderr
        .iter()
        .filter_map(|l| l.split("rejected resvals: ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    // Every rejection is accounted for, in a handful of lines (one per interval).
    assert_eq!(
        full.len() as u64 + summaries.iter().sum::<u64>(),
        2000,
        "{stderr:?}"
    );
    assert!(full.len() + summaries.len() <= 4, "{stderr:?}");
}

#[tokio::test]
async fn forged_names_cannot_forge_lines_in_listens_text_output() {
    let mut listen = ListenProc::spawn_format("text");
    let forged_host = "evil\nnode042 gpu_free ok 8 last_report=never seq=1 full\nnode042";
    let mut forged = hello(forged_host, &["gpu_free".to_owned()]);
    forged.extend(batch(
        1,
        true,
        vec![resval("gpu_free", Value::Numeric(8.0))],
    ));
    let _a = send(listen.addr, &forged).await;

    let mut h = Hello::new("node001", "boot", "digest", Vec::new());
    h.agent_version = "\u{1b}[2J".into();
    h.resources.push(Declared {
        name: "note".into(),
        instance: String::new(),
        valtype: Valtype::String,
        interval_ms: 1000,
        shared: false,
    });
    let mut hostile_values = wire::encode_envelope(&Envelope::Hello(h)).unwrap();
    let mut r = resval("note", Value::String("8\nnode043 note ok 9".into()));
    r.error = Some("x\u{1b}[Hy".into());
    hostile_values.extend(batch(1, true, vec![r]));
    let mut b = send(listen.addr, &hostile_values).await;
    b.shutdown().await.expect("close write");

    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.starts_with("node001 closed"))
    {
        match listen.stdout.recv_timeout(HANG_GUARD) {
            Ok(l) => lines.push(l),
            Err(e) => panic!("listen printed no close line: {e}; got {lines:?}"),
        }
    }
    let (rest, _) = listen.terminate_and_collect();
    lines.extend(rest);
    assert!(lines.iter().all(|l| is_clean_line(l)), "{lines:?}");
    for forged_host in ["node042", "node043", "evil"] {
        assert!(
            !lines.iter().any(|l| l.starts_with(forged_host)),
            "forged line for {forged_host}: {lines:?}"
        );
    }
    let resval_lines: Vec<&String> = lines.iter().filter(|l| l.contains(" note ")).collect();
    assert_eq!(resval_lines.len(), 1, "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("hello refused")),
        "{lines:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The agent against a hand-built controller.

const RESOURCES: &str = "resources:
  - name: own
    interval: 1s
    probe: {kind: exec, command: [seven.sh]}
  - name: pool
    interval: 1s
    resourcemap: [{location: [all]}]
    probe: {kind: exec, command: [seven.sh]}
  - name: pool2
    interval: 1s
    resourcemap: [{location: [all]}]
    probe: {kind: exec, command: [seven.sh]}
";

/// What a controller saw on one agent connection.
#[derive(Debug, Clone, Default)]
struct Seen {
    hellos: usize,
    /// The shared instances the latest hello declares, by resource name.
    shared: Vec<String>,
    closed: bool,
}

struct FakeController {
    listener: TcpListener,
}

struct AgentConn {
    write: OwnedWriteHalf,
    seen: watch::Receiver<Seen>,
}

impl FakeController {
    async fn bind() -> Self {
        Self {
            listener: TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        }
    }

    fn addr(&self) -> String {
        self.listener.local_addr().expect("addr").to_string()
    }

    /// The agent's next connection; a task reads (and counts) everything it sends.
    async fn accept(&self) -> AgentConn {
        let (stream, _) = tokio::time::timeout(HANG_GUARD, self.listener.accept())
            .await
            .expect("the agent connects")
            .expect("accept");
        let (read, write) = stream.into_split();
        let (tx, seen) = watch::channel(Seen::default());
        tokio::spawn(async move {
            let mut rd = BufReader::new(read).compat();
            while let Ok(Some(msg)) = wire::read_frame(&mut rd).await {
                if let Ok(Envelope::Hello(h)) = wire::decode_envelope(&msg) {
                    tx.send_modify(|s| {
                        s.hellos += 1;
                        s.shared = h
                            .resources
                            .iter()
                            .filter(|d| d.shared)
                            .map(|d| d.name.clone())
                            .collect();
                    });
                }
            }
            tx.send_modify(|s| s.closed = true);
        });
        AgentConn { write, seen }
    }
}

impl AgentConn {
    async fn wait(&mut self, what: &str, pred: impl FnMut(&Seen) -> bool) -> Seen {
        tokio::time::timeout(HANG_GUARD, self.seen.wait_for(pred))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("reader task")
            .clone()
    }
}

fn welcome(assigned: &[(&str, &str)]) -> Vec<u8> {
    let list = assigned
        .iter()
        .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
        .collect();
    wire::encode_controller(&ControllerMessage::Welcome(list)).expect("encode welcome")
}

fn agent_site(ctl: &FakeController) -> (Site, AgentProc) {
    let site = Site::new(&[ctl.addr()], RESOURCES);
    site.script("seven.sh", "#!/bin/sh\necho 7\n");
    let agent = site.spawn_agent();
    (site, agent)
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test]
async fn welcomes_of_a_million_zero_sized_assignments_are_refused_and_sigterm_ends_the_agent() {
    let ctl = FakeController::bind().await;
    let (_site, mut agent) = agent_site(&ctl);
    let flood: Vec<u8> = (0..20)
        .flat_map(|_| zero_sized_welcome(1_000_000))
        .collect();
    let rounds = 3;
    for _ in 0..rounds {
        let mut conn = ctl.accept().await;
        let _ = conn.write.write_all(&flood).await;
        conn.wait("the agent to drop the connection", |s| s.closed)
            .await;
    }
    // SIGTERM while a controller keeps sending them.
    let mut conn = ctl.accept().await;
    let writer = tokio::spawn(async move { while conn.write.write_all(&flood).await.is_ok() {} });
    agent.assert_alive();
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
    writer.await.expect("writer");

    let log = agent.log_text();
    let refused = count(&log, "Welcome.assigned holds 1000000 entries");
    assert!(refused >= rounds && refused <= rounds + 1, "{log}");
    assert_eq!(count(&log, "shared-instance assignment"), 0, "{log}");
    // The lines of a start, four connections and a stop: nothing per frame.
    assert!(log.lines().count() <= 20, "{log}");
}

#[tokio::test]
async fn welcomes_with_bad_names_are_refused_with_one_log_line() {
    let ctl = FakeController::bind().await;
    let (_site, mut agent) = agent_site(&ctl);
    let mut conn = ctl.accept().await;
    conn.wait("the first hello", |s| s.hellos >= 1).await;
    let bad = welcome(&[("gpu\nfake", "all")]);
    // More than a burst of the agent's read pace (100 a second), fewer than take seconds.
    let mut frames: Vec<u8> = (0..150).flat_map(|_| bad.clone()).collect();
    frames.extend(welcome(&[("pool", "all")]));
    conn.write.write_all(&frames).await.expect("write welcomes");
    conn.wait("the good welcome to be applied", |s| s.shared == ["pool"])
        .await;
    agent.assert_alive();
    agent.terminate().await;
    let log = agent.log_text();
    assert_eq!(count(&log, "welcome refused (more like it"), 1, "{log}");
    assert!(!log.lines().any(|l| l.starts_with("fake")), "{log}");
    assert_eq!(count(&log, "shared-instance assignment"), 1, "{log}");
}

#[tokio::test]
async fn a_flapping_controller_costs_a_replan_per_second_and_identical_welcomes_nothing() {
    let ctl = FakeController::bind().await;
    let (_site, mut agent) = agent_site(&ctl);
    let started = Instant::now();
    let mut conn = ctl.accept().await;
    conn.wait("the first hello", |s| s.hellos >= 1).await;
    let a = welcome(&[("pool", "all")]);
    let b = welcome(&[]);
    let both = welcome(&[("pool", "all"), ("pool2", "all")]);
    // The agent reads 100 controller messages a second after a burst of 100 (the rest wait
    // in TCP): three seconds of flapping, as fast as the agent lets us, and a last welcome
    // that tells when the agent has read them all.
    let mut flood: Vec<u8> = (0..400)
        .flat_map(|i| if i % 2 == 0 { a.clone() } else { b.clone() })
        .collect();
    flood.extend(both.clone());
    conn.write.write_all(&flood).await.expect("write flood");
    conn.wait("the last welcome to win", |s| s.shared.len() == 2)
        .await;

    // Settled: one real change, then a hundred welcomes that change nothing and one that
    // does. Exactly one hello (snapshot) each for the two changes.
    conn.write.write_all(&b).await.expect("write");
    let before = conn
        .wait("shared instances withdrawn", |s| s.shared.is_empty())
        .await
        .hellos;
    let mut same: Vec<u8> = (0..100).flat_map(|_| b.clone()).collect();
    same.extend(both);
    conn.write.write_all(&same).await.expect("write");
    let after = conn
        .wait("both assigned again", |s| s.shared.len() == 2)
        .await
        .hellos;
    assert_eq!(after, before + 1, "identical welcomes re-sent a snapshot");
    let elapsed = started.elapsed().as_secs() as usize;

    agent.assert_alive();
    agent.terminate().await;
    let log = agent.log_text();
    let replans = count(&log, "shared-instance assignment");
    // Every hello after the first comes from an applied change, and changes are applied at
    // most once per second (the first at once).
    assert!(after <= replans + 1, "{after} hellos, {replans} replans");
    assert!(replans <= elapsed + 2, "{replans} replans in {elapsed} s");
    assert!(
        log.lines().count() <= 20 + 2 * elapsed,
        "{} log lines in {elapsed} s:\n{log}",
        log.lines().count()
    );
}
