//! A receiver under load as a separate process (`xce-agent listen`, or the C example
//! controller on libxce_receiver), its stdout piped and counted line by line as an admin or
//! a controller would consume it; and the frames the simulated agents send it.

// Each bench that includes this module uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xce_agent::config::agent::TlsPaths;
use xce_agent::link::wire::{self, Batch, Declared, Envelope, Heartbeat, Hello};
use xce_agent::value::{Resval, Status, Valtype, Value};

use super::proc_stats;

/// `res00`, `res01`, ...: the simulated agents' resources.
pub fn name(i: usize) -> String {
    format!("res{i:02}")
}

/// A hello declaring `resources` numeric resources.
pub fn hello(host: &str, resources: usize) -> Hello {
    Hello::new(
        host,
        "boot",
        "digest",
        (0..resources)
            .map(|i| Declared {
                name: name(i),
                instance: String::new(),
                valtype: Valtype::Numeric,
                interval_ms: 30_000,
                shared: false,
            })
            .collect(),
    )
}

/// A batch of the resources `first..first + n` (modulo `resources`), encoded.
pub fn batch(seq: u64, full: bool, first: usize, n: usize, resources: usize) -> Vec<u8> {
    let resvals = (first..first + n)
        .map(|i| Resval {
            name: name(i % resources),
            instance: String::new(),
            value: Value::Numeric(seq as f64 + i as f64),
            status: Status::Ok,
            last_report_ms: Some(1_760_000_000_000 + seq),
            error: None,
        })
        .collect();
    let env = Envelope::Batch(Batch {
        seq,
        full,
        sent_at_ms: 1_760_000_000_000 + seq,
        resvals,
    });
    wire::encode_envelope(&env).expect("encode")
}

/// A heartbeat after batch `seq`, encoded.
pub fn heartbeat(seq: u64) -> Vec<u8> {
    wire::encode_envelope(&Envelope::Heartbeat(Heartbeat {
        seq,
        sent_at_ms: 1_760_000_000_000 + seq,
    }))
    .expect("encode")
}

/// A bound-then-released loopback address for a receiver.
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// What one output line is, for the counters.
#[derive(Clone, Copy, PartialEq)]
pub enum Line {
    /// A host's hello was taken (listen: `"event":"hello"`; C: `accepted HOST ...`).
    Accepted,
    /// One resval delivered (listen: `"event":"resval"`; C: `resval HOST ...`).
    Resval,
    Other,
}

/// listen's JSON lines.
pub fn listen_json_line(line: &[u8]) -> Line {
    let has = |pat: &[u8]| line.windows(pat.len()).any(|w| w == pat);
    if has(b"\"event\":\"resval\"") {
        Line::Resval
    } else if has(b"\"event\":\"hello\"") {
        Line::Accepted
    } else {
        Line::Other
    }
}

/// The C example controller's lines (`accepted HOST ...`, `resval HOST ...`, ...).
pub fn c_example_line(line: &[u8]) -> Line {
    if line.starts_with(b"resval ") {
        Line::Resval
    } else if line.starts_with(b"accepted ") {
        Line::Accepted
    } else {
        Line::Other
    }
}

/// A receiver process whose stdout lines are counted: all of them, accepted hosts, resvals.
pub struct Receiver {
    pub child: Child,
    pub lines: Arc<AtomicU64>,
    pub hellos: Arc<AtomicU64>,
    pub resvals: Arc<AtomicU64>,
    /// Shown when it falls behind.
    pub label: String,
}

impl Receiver {
    /// `xce-agent listen ADDR --format json` with TLS from `tls`, or `--insecure`.
    pub fn listen(addr: SocketAddr, tls: Option<&TlsPaths>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xce-agent"));
        cmd.args(["listen", &addr.to_string(), "--format", "json"]);
        match tls {
            Some(p) => cmd
                .arg("--tls-ca")
                .arg(&p.ca)
                .arg("--tls-cert")
                .arg(&p.cert)
                .arg("--tls-key")
                .arg(&p.key),
            None => cmd.arg("--insecure"),
        };
        // The probe connection: connect + closed in plaintext; a refused handshake is one line.
        Self::start("listen", cmd, addr, listen_json_line, tls.map_or(2, |_| 1))
    }

    /// Start `cmd`, which must listen on `addr`; wait until it accepts a connection and has
    /// printed `probe_lines` lines for that probe.
    pub fn start(
        label: &str,
        mut cmd: Command,
        addr: SocketAddr,
        classify: fn(&[u8]) -> Line,
        probe_lines: u64,
    ) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {label}: {e}"));
        let counters = || Arc::new(AtomicU64::new(0));
        let (lines, hellos, resvals) = (counters(), counters(), counters());
        let out = child.stdout.take().expect("stdout");
        let (l, h, r) = (lines.clone(), hellos.clone(), resvals.clone());
        std::thread::spawn(move || {
            let mut rd = BufReader::with_capacity(1 << 16, out);
            let mut buf = Vec::new();
            while matches!(rd.read_until(b'\n', &mut buf), Ok(k) if k > 0) {
                match classify(&buf) {
                    Line::Accepted => h.fetch_add(1, Ordering::Relaxed),
                    Line::Resval => r.fetch_add(1, Ordering::Relaxed),
                    Line::Other => 0,
                };
                l.fetch_add(1, Ordering::Relaxed);
                buf.clear();
            }
        });
        let t0 = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{label} exited before listening on {addr}: {status}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{label} not listening on {addr}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let me = Self {
            child,
            lines,
            hellos,
            resvals,
            label: label.to_owned(),
        };
        me.wait(&me.lines, probe_lines);
        me
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// utime + stime so far.
    pub fn cpu(&self) -> Duration {
        Duration::from_secs_f64(proc_stats::proc_cpu(self.child.id()))
    }

    /// utime + stime of its main thread so far: in the C example, the controller's own
    /// event loop (poll, pop, its table, printing); the library's work is on other threads.
    pub fn main_thread_cpu(&self) -> Duration {
        Duration::from_secs_f64(proc_stats::thread_cpu(self.child.id(), self.child.id()))
    }

    /// Resident memory now (VmRSS), MiB.
    pub fn rss_mib(&self) -> f64 {
        proc_stats::proc_rss_kib(self.child.id(), "VmRSS:") as f64 / 1024.0
    }

    /// Peak resident memory (VmHWM), MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        proc_stats::proc_rss_kib(self.child.id(), "VmHWM:") as f64 / 1024.0
    }

    /// Wait until `counter` reaches `n` (at most 10 minutes: then the receiver fell behind).
    pub fn wait(&self, counter: &AtomicU64, n: u64) {
        let t0 = Instant::now();
        while counter.load(Ordering::Relaxed) < n {
            if t0.elapsed() > Duration::from_secs(600) {
                panic!(
                    "{} fell behind: {} of {n} after 10 min",
                    self.label,
                    counter.load(Ordering::Relaxed)
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
