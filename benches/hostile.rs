//! What hostile frames cost the real `xce-agent listen` (issue 12 item 11): its peak RSS
//! (VmHWM), CPU (utime + stime) and stderr lines, with stdout a pipe that nobody reads (the
//! slowest stdout there is). Each scenario runs a fresh listen:
//! 1. idle: started, one probe connection;
//! 2. amplification: CONNS (8) connections each send a hello declaring one resource, then
//!    FRAMES (12) 72-byte batches announcing 1,000,000 zero-sized resvals;
//! 3. slow stdout: CONNS connections each send a hello declaring 10,000 resources (the most a
//!    hello may declare), then FRAMES full batches of 10,000 resvals (the largest legal batch).
//!
//! Run: `cargo bench --bench hostile` (env CONNS=8 FRAMES=12).

#[path = "../tests/link_common/mod.rs"]
mod link_common;
mod proc_stats;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proc_stats::{proc_cpu, proc_rss_kib};
use xce_agent::link::limits::MAX_DECLARED;
use xce_agent::link::wire::{self, Batch, Envelope, Hello};
use xce_agent::value::Value;

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

struct Listen {
    child: Child,
    addr: SocketAddr,
    stderr_lines: Arc<AtomicU64>,
}

impl Listen {
    /// listen with stdout piped and never read; stderr lines counted by a thread.
    fn start() -> Self {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut child = Command::new(env!("CARGO_BIN_EXE_xce-agent"))
            .args(["listen", &addr.to_string()])
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
    let conns = env_or("CONNS", 8);
    let frames = env_or("FRAMES", 12);
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
}
