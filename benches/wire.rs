//! The wire, three figures in one run:
//! 1. bytes per resval of encoded frames (full snapshot of 50 and 10,000, deltas of 1 and 5);
//! 2. encode + send rate: batches of 50 encoded with `link::wire` and written to a loopback
//!    TCP sink thread, resvals/s and the sender thread's CPU per resval;
//! 3. the real `xce-agent listen` receiving from AGENTS (1,000) simulated agents in this
//!    process: hello + full snapshot of 50 resvals each, then a delta of DELTA_N resvals every
//!    second per agent for SECS seconds. The receiver's CPU comes from /proc/PID/stat, its
//!    stdout (one line per resval, as an admin would run it) is counted here.
//!
//! Run: `cargo bench --bench wire` (env AGENTS=1000 SECS=20 DELTA_N=5).

mod support {
    pub mod env;
    pub mod proc_stats;
    pub mod rusage;
}

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::env::env_or;
use support::proc_stats::{proc_cpu, proc_rss_kib};
use support::rusage::{self, UsageWho};
use tokio::io::AsyncWriteExt;
use xce_agent::link::wire::{self, Batch, Declared, Envelope, Hello};
use xce_agent::value::{Resval, Status, Valtype, Value};

const NAMES: [&str; 10] = [
    "scratch_free_mb",
    "gpu_ut",
    "ib_port_state",
    "license_ansys",
    "tmp_inodes_pct",
    "r15s",
    "mem",
    "localdisk_health",
    "fs_lustre_ok",
    "cpu_temp_c",
];

fn name(i: usize) -> String {
    format!("{}{}", NAMES[i % NAMES.len()], i / NAMES.len())
}

/// A realistic resval: mostly numbers, one in ten a string or a boolean, a few failed.
fn resval(i: usize, tick: u64) -> Resval {
    let now = 1_760_000_000_000 + tick * 1000;
    let (value, status, error) = match i % 10 {
        2 => (Value::String("ACTIVE".into()), Status::Ok, None),
        7 => (Value::Boolean(true), Status::Ok, None),
        9 if tick % 7 == 0 => (
            Value::Numeric(61.0),
            Status::Failed,
            Some("exited with status 1: sensors: no chip found".into()),
        ),
        _ => (
            Value::Numeric(((i as u64 * 7919 + tick * 104_729) % 100_000) as f64 / 10.0),
            Status::Ok,
            None,
        ),
    };
    Resval {
        name: name(i),
        instance: String::new(),
        value,
        status,
        last_report_ms: Some(now),
        error,
    }
}

fn valtype(i: usize) -> Valtype {
    match i % 10 {
        2 => Valtype::String,
        7 => Valtype::Boolean,
        _ => Valtype::Numeric,
    }
}

fn hello(host: &str, n: usize) -> Envelope {
    Envelope::Hello(Hello::new(
        host,
        "5f0c3d1e-1b7a-4c59-9d2f-0a1b2c3d4e5f",
        "0123456789abcdef",
        (0..n)
            .map(|i| Declared {
                name: name(i),
                instance: String::new(),
                valtype: valtype(i),
                interval_ms: 30_000,
                shared: false,
            })
            .collect(),
    ))
}

fn batch(seq: u64, full: bool, idx: impl Iterator<Item = usize>, tick: u64) -> Envelope {
    Envelope::Batch(Batch {
        seq,
        full,
        sent_at_ms: 1_760_000_000_000 + tick * 1000,
        resvals: idx.map(|i| resval(i, tick)).collect(),
    })
}

fn frame(env: &Envelope) -> Vec<u8> {
    wire::encode_envelope(env).expect("encode")
}

/// utime + stime of a process, in seconds.
fn sizes() {
    println!("## bytes per resval (capnp stream framing, unpacked)\n");
    println!("| frame | resvals | bytes | bytes/resval |\n|---|---|---|---|");
    for (what, n, full) in [
        ("full snapshot", 50, true),
        ("full snapshot", 10_000, true),
        ("delta", 1, false),
        ("delta", 5, false),
    ] {
        let b = frame(&batch(2, full, 0..n, 3)).len();
        println!("| {what} | {n} | {b} | {:.1} |", b as f64 / n as f64);
    }
    let h = frame(&hello("node00001", 50)).len();
    println!("| hello (50 declared) | - | {h} | - |\n");
}

fn encode_send() {
    let secs: f64 = env_or("SEND_SECS", 3.0);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let sink = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    let mut out = TcpStream::connect(addr).expect("connect");
    out.set_nodelay(true).expect("nodelay");
    let (c0, t0) = (rusage::cpu(UsageWho::RUSAGE_THREAD), Instant::now());
    let (mut resvals, mut seq) = (0u64, 1u64);
    // Values change every batch, as they would: each batch is built and encoded afresh.
    while t0.elapsed().as_secs_f64() < secs {
        let env = batch(seq, true, 0..50, seq);
        out.write_all(&frame(&env)).expect("send");
        resvals += 50;
        seq += 1;
    }
    let (cpu, wall) = (rusage::cpu(UsageWho::RUSAGE_THREAD) - c0, t0.elapsed());
    drop(out);
    let bytes = sink.join().expect("sink");
    println!("## encode + send, batches of 50 to a loopback TCP sink ({secs} s)\n");
    println!("| resvals/s | MB/s | sender CPU per resval |\n|---|---|---|");
    println!(
        "| {:.0} | {:.1} | {:.2} µs |\n",
        resvals as f64 / wall.as_secs_f64(),
        bytes as f64 / wall.as_secs_f64() / 1e6,
        cpu.as_secs_f64() * 1e6 / resvals as f64
    );
}

async fn sim_agent(
    addr: std::net::SocketAddr,
    host: String,
    n: usize,
    delta_n: usize,
    start_deltas: Arc<tokio::sync::Notify>,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(&frame(&hello(&host, n))).await?;
    s.write_all(&frame(&batch(1, true, 0..n, 0))).await?;
    start_deltas.notified().await;
    // Spread the agents over the second, as their splay does.
    let jitter = wire_jitter(&host);
    tokio::time::sleep(jitter).await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut seq = 2u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let first = (seq as usize * delta_n) % n;
                let idx = (0..delta_n).map(|k| (first + k) % n);
                s.write_all(&frame(&batch(seq, false, idx, seq))).await?;
                seq += 1;
            }
        }
    }
    s.shutdown().await
}

fn wire_jitter(host: &str) -> Duration {
    let h = xce_agent::config::fnv1a(&[host.as_bytes()]);
    Duration::from_millis(h % 1000)
}

fn receiver() {
    let agents: usize = env_or("AGENTS", 1000);
    let secs: u64 = env_or("SECS", 20);
    let delta_n: usize = env_or("DELTA_N", 5);
    let n = 50usize;
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xce-agent"))
        .args(["listen", &addr.to_string(), "--insecure"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start xce-agent listen");
    let pid = child.id();
    let lines = Arc::new(AtomicU64::new(0));
    let reader = {
        let lines = lines.clone();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            let mut r = BufReader::with_capacity(1 << 16, out);
            let mut buf = Vec::new();
            while matches!(r.read_until(b'\n', &mut buf), Ok(k) if k > 0) {
                lines.fetch_add(1, Ordering::Relaxed);
                buf.clear();
            }
        })
    };
    while TcpStream::connect(addr).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // That probe connection shows up as connect + closed.
    let wait_lines = |target: u64, limit: Duration| {
        let t0 = Instant::now();
        while lines.load(Ordering::Relaxed) < target && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
        lines.load(Ordering::Relaxed)
    };
    wait_lines(2, Duration::from_secs(10));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let start_deltas = Arc::new(tokio::sync::Notify::new());
    let stop = tokio_util::sync::CancellationToken::new();
    let base = lines.load(Ordering::Relaxed);
    let (cpu0, t0) = (proc_cpu(pid), Instant::now());
    let tasks: Vec<_> = (0..agents)
        .map(|i| {
            rt.spawn(sim_agent(
                addr,
                format!("node{i:05}"),
                n,
                delta_n,
                start_deltas.clone(),
                stop.clone(),
            ))
        })
        .collect();
    // connect + hello + n resvals per agent.
    let snap_target = base + (agents * (n + 2)) as u64;
    let got = wait_lines(snap_target, Duration::from_secs(120));
    let (cpu1, t1) = (proc_cpu(pid), Instant::now());
    let snap_secs = (t1 - t0).as_secs_f64();
    let rss_after_snap = proc_rss_kib(pid, "VmRSS:");
    start_deltas.notify_waiters();
    // Let every agent pass its jitter before measuring the steady state.
    std::thread::sleep(Duration::from_secs(2));
    let (l2, cpu2, t2) = (lines.load(Ordering::Relaxed), proc_cpu(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let (l3, cpu3, t3) = (lines.load(Ordering::Relaxed), proc_cpu(pid), Instant::now());
    stop.cancel();
    let mut failed = 0;
    for t in tasks {
        if !matches!(rt.block_on(t), Ok(Ok(()))) {
            failed += 1;
        }
    }
    let rss = proc_rss_kib(pid, "VmRSS:");
    let hwm = proc_rss_kib(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    let snap_cpu = cpu1 - cpu0;
    let delta_resvals = (l3 - l2) as f64;
    let steady_cpu = cpu3 - cpu2;
    let steady_wall = (t3 - t2).as_secs_f64();
    let per_resval_us = steady_cpu * 1e6 / delta_resvals.max(1.0);
    let per_agent_ms = snap_cpu * 1e3 / agents as f64;
    println!("## `xce-agent listen` receiving from {agents} simulated agents on loopback\n");
    println!("| phase | resvals | wall s | receiver CPU s | CPU per unit |\n|---|---|---|---|---|");
    println!(
        "| connect + hello + full snapshot of {n} | {} (lines {got} of {snap_target}) | {snap_secs:.2} | {snap_cpu:.2} | {per_agent_ms:.2} ms per agent |",
        agents * n
    );
    println!(
        "| deltas of {delta_n} resvals/s per agent | {delta_resvals:.0} ({:.0}/s) | {steady_wall:.1} | {steady_cpu:.2} ({:.1} % of a core) | {per_resval_us:.1} µs per resval |",
        delta_resvals / steady_wall,
        steady_cpu / steady_wall * 100.0
    );
    println!(
        "\nreceiver RSS after snapshots {} KiB, at end {} KiB (peak {} KiB); agents that failed: {failed}\n",
        rss_after_snap, rss, hwm
    );
    // On paper: 10,000 nodes x 50 resources.
    let nodes = 10_000.0;
    println!("## extended to 10,000 nodes x 50 resources (same per-unit costs)\n");
    println!(
        "- all 10,000 reconnect at once (controller restart): 10,000 x {per_agent_ms:.2} ms = {:.1} s of one core",
        nodes * per_agent_ms / 1e3
    );
    for rate in [50.0 / 30.0, delta_n as f64] {
        let per_s = nodes * rate;
        println!(
            "- steady state at {rate:.2} changed resvals/s per node: {per_s:.0} resvals/s x {per_resval_us:.1} µs = {:.1} % of one core",
            per_s * per_resval_us / 1e4
        );
    }
}

fn main() {
    sizes();
    encode_send();
    receiver();
}
