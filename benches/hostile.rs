//! What hostile frames cost the real `xce-agent listen` (issue 12 item 11): its peak RSS
//! (VmHWM), CPU (utime + stime) and stderr lines, with stdout a pipe that nobody reads (the
//! slowest stdout there is). Each scenario runs a fresh listen:
//! 1. idle: started, one probe connection;
//! 2. amplification: CONNS (8) connections each send a hello declaring one resource, then
//!    FRAMES (12) 72-byte batches announcing 1,000,000 zero-sized resvals;
//! 3. slow stdout: CONNS connections each send a hello declaring 10,000 resources (the most a
//!    hello may declare), then FRAMES full batches of 10,000 resvals (the largest legal batch).
//!
//! And the agent (the real daemon, one exec probe, one shared instance) against a controller
//! in this process, for SECS (10) seconds each: its CPU, log lines and the hellos (each one a
//! full snapshot) the controller receives:
//! 4. a welcome of 1,000,000 zero-sized assignments, as fast as the agent reads, on every
//!    connection;
//! 5. two welcomes alternated as fast as the agent reads (controller churn).
//!
//! Run: `cargo bench --bench hostile` (env CONNS=8 FRAMES=12 SECS=10). The measured binary
//! is this build's `xce-agent`, or `XCE_AGENT_BIN` (e.g. a release build driven from
//! `cargo test --bench hostile`: only the measured processes need to be optimised).

#[path = "../tests/it/support/frames.rs"]
mod link_common;
mod support {
    pub mod env;
    pub mod proc_stats;
}

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::env::env_or;
use support::proc_stats::{proc_cpu, proc_rss_kib};
use xce_agent::link::frame_limits::MAX_DECLARED;
use xce_agent::link::wire::{self, Batch, ControllerMessage, Declared, Envelope, Hello};
use xce_agent::value::{Valtype, Value};

/// The binary under measurement.
fn agent_bin() -> String {
    std::env::var("XCE_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_xce-agent").to_owned())
}

struct Listen {
    child: Child,
    addr: SocketAddr,
    stderr_lines: Arc<AtomicU64>,
}

impl Listen {
    /// listen (plaintext: the frames are the point, not the handshake) with stdout piped and
    /// never read; stderr lines counted by a thread.
    fn start() -> Self {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut child = Command::new(agent_bin())
            .args(["listen", &addr.to_string(), "--insecure"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xce-agent listen");
        let stderr_lines = Arc::new(AtomicU64::new(0));
        let err = child.stderr.take().expect("stderr");
        let counter = stderr_lines.clone();
        std::thread::spawn(move || {
            for _ in BufReader::new(err).lines() {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("xce-agent listen exited before listening: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            addr,
            stderr_lines,
        }
    }

    /// Send `bytes` on each of `conns` connections at once; writes that listen stops reading
    /// give up after a few seconds (it is pushing back, which is the point).
    fn flood(&self, conns: usize, bytes: &[u8]) -> Vec<TcpStream> {
        let threads: Vec<_> = (0..conns)
            .map(|_| {
                let bytes = bytes.to_vec();
                let addr = self.addr;
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).expect("connect");
                    s.set_write_timeout(Some(Duration::from_secs(3))).ok();
                    let _ = s.write_all(&bytes);
                    s
                })
            })
            .collect();
        let held = threads
            .into_iter()
            .map(|t| t.join().expect("sender"))
            .collect();
        // Let listen finish what it can take.
        std::thread::sleep(Duration::from_secs(2));
        held
    }

    fn report(mut self, scenario: &str, sent: usize) {
        let pid = self.child.id();
        let hwm = proc_rss_kib(pid, "VmHWM:");
        let rss = proc_rss_kib(pid, "VmRSS:");
        let cpu = proc_cpu(pid);
        let _ = self.child.kill();
        let _ = self.child.wait();
        println!(
            "| {scenario} | {:.1} | {:.1} | {:.2} | {} | {} |",
            hwm as f64 / 1024.0,
            rss as f64 / 1024.0,
            cpu,
            self.stderr_lines.load(Ordering::Relaxed),
            sent
        );
    }
}

fn encode(env: &Envelope) -> Vec<u8> {
    wire::encode_envelope(env).expect("encode")
}

fn main() {
    let conns: usize = env_or("CONNS", 8);
    let frames: usize = env_or("FRAMES", 12);
    println!("## `xce-agent listen` against hostile frames, stdout never read\n");
    println!(
        "| scenario | peak RSS MiB (VmHWM) | RSS at end MiB | CPU s | stderr lines | bytes sent |"
    );
    println!("|---|---|---|---|---|---|");

    let idle = Listen::start();
    idle.report("idle", 0);

    let listen = Listen::start();
    let mut bytes = encode(&Envelope::Hello(Hello::new(
        "node001",
        "boot",
        "digest",
        link_common::numeric_declared(&["gpu".to_owned()]),
    )));
    for seq in 1..=frames as u64 {
        bytes.extend(link_common::zero_sized_batch(seq, 1_000_000));
    }
    let _held = listen.flood(conns, &bytes);
    listen.report(
        &format!("amplification: {conns} conns x {frames} batches of 1,000,000 zero-sized resvals"),
        conns * bytes.len(),
    );

    let listen = Listen::start();
    let names: Vec<String> = (0..MAX_DECLARED).map(|i| format!("resource_{i}")).collect();
    let mut bytes = encode(&Envelope::Hello(Hello::new(
        "node002",
        "boot",
        "digest",
        link_common::numeric_declared(&names),
    )));
    for seq in 1..=frames as u64 {
        bytes.extend(encode(&Envelope::Batch(Batch {
            seq,
            full: true,
            sent_at_ms: 1,
            resvals: names
                .iter()
                .map(|n| link_common::resval(n, Value::Numeric(seq as f64)))
                .collect(),
        })));
    }
    let _held = listen.flood(conns, &bytes);
    listen.report(
        &format!("slow stdout: {conns} conns x {frames} full batches of {MAX_DECLARED} resvals"),
        conns * bytes.len(),
    );

    // Issue 35: what one authenticated node, or many sessions before their hello, may make
    // the receiver hold (the budget: a host's share, the pre-hello frame limit).
    let string_declared = |names: &[String]| -> Vec<Declared> {
        names
            .iter()
            .map(|n| Declared {
                name: n.clone(),
                instance: String::new(),
                valtype: Valtype::String,
                interval_ms: 1000,
                shared: false,
            })
            .collect()
    };
    let big: usize = env_or("BIG_FRAMES", 50);
    let listen = Listen::start();
    let mut bytes = encode(&Envelope::Hello(Hello::new(
        "node003",
        "boot",
        "digest",
        string_declared(&["note".to_owned()]),
    )));
    let four_mib = "x".repeat(4 << 20);
    for seq in 1..=big as u64 {
        bytes.extend(encode(&Envelope::Batch(Batch {
            seq,
            full: true,
            sent_at_ms: 1,
            resvals: vec![link_common::resval("note", Value::String(four_mib.clone()))],
        })));
    }
    let _held = listen.flood(1, &bytes);
    listen.report(
        &format!("one node: {big} batches of one 4 MiB string value"),
        bytes.len(),
    );

    let listen = Listen::start();
    let names: Vec<String> = (0..1000).map(|i| format!("s{i:04}")).collect();
    let mut bytes = encode(&Envelope::Hello(Hello::new(
        "node004",
        "boot",
        "digest",
        string_declared(&names),
    )));
    let cap = "y".repeat(xce_agent::value::MAX_STRING_VALUE);
    for seq in 1..=frames as u64 {
        bytes.extend(encode(&Envelope::Batch(Batch {
            seq,
            full: true,
            sent_at_ms: 1,
            resvals: names
                .iter()
                .map(|n| link_common::resval(n, Value::String(cap.clone())))
                .collect(),
        })));
    }
    let _held = listen.flood(1, &bytes);
    listen.report(
        &format!("one node: 1,000 string resources at the 1 KiB cap, {frames} full batches"),
        bytes.len(),
    );

    let sessions: usize = env_or("SESSIONS", 200);
    let listen = Listen::start();
    let words = ((7 << 20) / 8) as u32;
    let mut bytes = 0u32.to_le_bytes().to_vec();
    bytes.extend_from_slice(&words.to_le_bytes());
    bytes.extend(std::iter::repeat_n(0u8, 7 << 20));
    let _held = listen.flood(sessions, &bytes);
    listen.report(
        &format!("{sessions} sessions x a 7 MiB frame before any hello"),
        sessions * bytes.len(),
    );

    let secs = env_or::<u64>("SECS", 10);
    println!("\n## the agent against a hostile controller, {secs} s each\n");
    println!("| controller sends | agent CPU s | agent log lines | hellos (snapshots) received | welcomes sent |");
    println!("|---|---|---|---|---|");
    let amplification = link_common::zero_sized_welcome(1_000_000);
    hostile_controller("welcomes of 1,000,000 zero-sized assignments", secs, |_| {
        amplification.clone()
    });
    let encode_welcome = |assigned: Vec<(String, String)>| {
        wire::encode_controller(&ControllerMessage::Welcome(assigned)).expect("encode")
    };
    let a = encode_welcome(vec![("pool".into(), "all".into())]);
    let b = encode_welcome(Vec::new());
    hostile_controller("two welcomes alternated (churn)", secs, |i| {
        if i % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        }
    });
}

/// Run the real agent against a controller that writes `frame(i)` for i = 0, 1, ... as fast
/// as the agent reads them, on every connection, for `secs`; print one row.
fn hostile_controller(what: &str, secs: u64, frame: impl Fn(u64) -> Vec<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("seven.sh");
    std::fs::write(&script, "#!/bin/sh\necho 7\n").expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod dir");
    std::fs::write(
        dir.path().join("agent.yaml"),
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\nrun_as: root\ncontrollers: [\"{addr}\"]\n\
             insecure_plaintext: true\n",
            dir.path().display()
        ),
    )
    .expect("agent.yaml");
    std::fs::write(
        dir.path().join("resources.yaml"),
        "resources:\n  - name: own\n    interval: 1s\n    probe: {kind: exec, command: [seven.sh]}\n  \
         - name: pool\n    interval: 1s\n    resourcemap: [{location: [all]}]\n    \
         probe: {kind: exec, command: [seven.sh]}\n",
    )
    .expect("resources.yaml");
    let log = dir.path().join("agent.log");
    let mut agent = Command::new(agent_bin())
        .arg("--config")
        .arg(dir.path().join("agent.yaml"))
        .env("XCE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start the agent");
    let hellos = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    listener.set_nonblocking(true).expect("nonblocking");
    let mut conns = Vec::new();
    while Instant::now() < deadline {
        let Ok((stream, _)) = listener.accept() else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        stream.set_nonblocking(false).expect("blocking");
        let reader = stream.try_clone().expect("clone");
        let hellos = hellos.clone();
        // Read (and count) what the agent sends, so its writes never stall.
        conns.push(std::thread::spawn(move || {
            let mut r = BufReader::new(reader);
            while let Ok(msg) = capnp::serialize::read_message(&mut r, wire::reader_options()) {
                if let Ok(Envelope::Hello(_)) = wire::decode_envelope(&msg) {
                    hellos.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        let mut writer = stream;
        let sent = sent.clone();
        let frames: Vec<Vec<u8>> = (0..2).map(&frame).collect();
        conns.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while Instant::now() < deadline {
                // Blocks while the agent does not read; ends when it drops the connection
                // (or is stopped).
                if writer.write_all(&frames[(i % 2) as usize]).is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            let _ = writer.shutdown(std::net::Shutdown::Both);
        }));
    }
    if let Ok(Some(status)) = agent.try_wait() {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("the agent exited during the run: {status}\n{log}");
    }
    let cpu = proc_cpu(agent.id());
    // SIGTERM to this child only, then reap it.
    let _ = Command::new("kill").arg(agent.id().to_string()).status();
    let _ = agent.wait();
    for c in conns {
        let _ = c.join();
    }
    let lines = std::fs::read_to_string(&log)
        .map(|l| l.lines().count())
        .unwrap_or(0);
    println!(
        "| {what} | {cpu:.2} | {lines} | {} | {} |",
        hellos.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed)
    );
}
