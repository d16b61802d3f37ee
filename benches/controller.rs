//! The controller side at scale (issue #25 item 8): AGENTS simulated agents, each with its
//! own certificate (`xce-agent tls issue`), connect over TLS 1.3 (a full handshake each, real
//! capnp frames) to two receivers in turn, each a separate process:
//!   (a) the C example controller (`examples/c/xce-controller-example`) linked with the
//!       release libxce_receiver,
//!   (b) `xce-agent listen --format json`.
//! Each receiver's stdout is piped here and counted line by line (the C example's `accepted`
//! and `resval` lines, listen's JSON), so a phase ends when the receiver has delivered all of
//! it. Per receiver, in this order, all agents staying connected throughout:
//!   1. connect: TCP + TLS handshake + hello (RESOURCES declared), CONCURRENCY at a time;
//!   2. snapshot: each agent its full snapshot (RESOURCES values in one batch);
//!   3. deltas: DELTA_ROUNDS rounds, each agent a batch of 5 changed values;
//!   4. single: SINGLE_ROUNDS rounds, each agent a batch of 1 changed value;
//!   5. heartbeats: HEARTBEAT_ROUNDS rounds, each agent a heartbeat, then a batch of 1 as the
//!      end marker (its cost, measured in 4, is subtracted).
//!
//! The receiver's CPU is utime + stime from /proc/PID/stat over each phase (never wall time);
//! memory is VmRSS with every agent connected (after the snapshot) minus VmRSS before the
//! first, per agent, and VmHWM; write(2) calls per resval (`syscw`, /proc/PID/io) say how
//! each receiver's output is buffered; the main thread's share of the CPU per resval
//! (/proc/PID/task/PID/stat) is, in the C example, the controller's own loop (poll, pop, its
//! table, printing), the rest the library's threads. Then the issue's goal: 10,000 agents x 50 resources changing every 60 s projected
//! from the per-resval and per-heartbeat costs, and the C API's cost per resval over
//! listen's.
//!
//! First, once (the bench checks and says so if they are missing):
//!   cargo build --release -p xce-receiver
//!   make -C examples/c PROFILE=release
//! Run: `cargo bench --bench controller` (env AGENTS=1000, a comma list runs each size:
//! AGENTS=1000,10000; RESOURCES=50; DELTA_ROUNDS, SINGLE_ROUNDS, HEARTBEAT_ROUNDS default to
//! what gives about 100,000 resvals in batches of 5, 50,000 batches of 1 and 100,000
//! heartbeats; CONCURRENCY=64 handshakes in flight; XCE_CONTROLLER_EXAMPLE=path for another
//! build of the example).

mod support {
    pub mod env;
    pub mod proc_stats;
    pub mod receiver;
}

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use rustls::pki_types::ServerName;
use support::env::env_or;
use support::receiver::{self, batch, free_addr, heartbeat, hello, Receiver};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use xce_agent::config::agent::TlsPaths;
use xce_agent::link::tls::Material;
use xce_agent::link::wire::{self, Envelope};

/// The issue's goal: this many agents x resources, each value changing every this often.
const GOAL_AGENTS: f64 = 10_000.0;
const GOAL_RESOURCES: f64 = 50.0;
const GOAL_PERIOD_S: f64 = 60.0;
/// The agent's heartbeat interval (10 s): at most one heartbeat per agent per interval.
const HEARTBEAT_S: f64 = 10.0;

fn host(i: usize) -> String {
    format!("node{:05}", i + 1)
}

struct Pki {
    ca: PathBuf,
    hosts: PathBuf,
}

impl Pki {
    fn paths(&self, host: &str) -> TlsPaths {
        TlsPaths {
            ca: self.ca.join("ca.pem"),
            cert: self.hosts.join(format!("{host}.pem")),
            key: self.hosts.join(format!("{host}.key")),
            crl: None,
        }
    }
}

/// The release library and the example linked with it, or a panic saying how to build them.
fn c_example() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let libdir = target.join("release");
    let lib = libdir.join("libxce_receiver.so");
    let how = "build them first:\n  cargo build --release -p xce-receiver\n  make -C examples/c PROFILE=release";
    if let Some(p) = std::env::var_os("XCE_CONTROLLER_EXAMPLE") {
        return PathBuf::from(p);
    }
    assert!(lib.exists(), "no {}: {how}", lib.display());
    let exe = root.join("examples/c/xce-controller-example");
    let bytes = std::fs::read(&exe).unwrap_or_else(|e| panic!("no {} ({e}): {how}", exe.display()));
    // The Makefile links with -rpath to the library's directory: a debug build says so.
    let rpath = libdir.to_string_lossy().into_owned();
    assert!(
        bytes.windows(rpath.len()).any(|w| w == rpath.as_bytes()),
        "{} is not linked with the release library in {rpath} (a debug build?): {how}",
        exe.display()
    );
    let (exe_t, lib_t) = (
        std::fs::metadata(&exe).and_then(|m| m.modified()),
        std::fs::metadata(&lib).and_then(|m| m.modified()),
    );
    if let (Ok(e), Ok(l)) = (exe_t, lib_t) {
        if e < l {
            eprintln!(
                "note: {} is older than {}; it loads the library at run time, so it runs the new one",
                exe.display(),
                lib.display()
            );
        }
    }
    exe
}

fn start_c(exe: &Path, addr: SocketAddr, ctl: &TlsPaths) -> Receiver {
    let mut cmd = Command::new(exe);
    cmd.arg(addr.to_string())
        .arg("--tls-ca")
        .arg(&ctl.ca)
        .arg("--tls-cert")
        .arg(&ctl.cert)
        .arg("--tls-key")
        .arg(&ctl.key)
        // Listen has no staleness; here a host silent through another phase would go stale
        // and be accepted again with all its values, so the phases' counts would not add up.
        // The staleness bookkeeping per frame is the same whatever the grace.
        .args(["--agent-heartbeat-ms", "3600000"]);
    // The probe connection (connect, close): a refused handshake, one line.
    Receiver::start("C example", cmd, addr, receiver::c_example_line, 1)
}

/// The open-file soft limit of `pid` (/proc/PID/limits).
fn nofile(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// write(2)-family calls of `pid` so far (`syscw`, /proc/PID/io): how its output is buffered.
fn write_calls(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("syscw:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

type Agent = TlsStream<TcpStream>;

/// Agents per loopback source address: a source address has about 28,000 ephemeral ports
/// toward one receiver, so 50,000 agents come from 127.0.0.1, 127.0.0.2 and 127.0.0.3.
const AGENTS_PER_SOURCE: usize = 20_000;

/// The source address agent `i` connects from.
fn source(i: usize) -> std::net::IpAddr {
    std::net::Ipv4Addr::new(127, 0, 0, 1 + (i / AGENTS_PER_SOURCE) as u8).into()
}

async fn connect(
    addr: SocketAddr,
    from: std::net::IpAddr,
    cfg: Arc<rustls::ClientConfig>,
    host: String,
    resources: usize,
) -> Agent {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    let tcp = socket.connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let mut s = tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .unwrap_or_else(|e| panic!("{host}: handshake: {e}"));
    let out = wire::encode_envelope(&Envelope::Hello(hello(&host, resources))).expect("encode");
    s.write_all(&out).await.expect("hello");
    s.flush().await.expect("flush");
    s
}

/// Write `frame(agent index)` to every agent, in order.
async fn round(agents: &mut [Agent], frame: impl Fn(usize) -> Vec<u8>) {
    for (i, a) in agents.iter_mut().enumerate() {
        a.write_all(&frame(i)).await.expect("write");
        a.flush().await.expect("flush");
    }
}

/// One receiver's figures.
struct Figures {
    label: String,
    nofile: u64,
    handshake_ms: f64,
    snapshot_ms: f64,
    resval_us: f64,
    resval_writes: f64,
    resval_main_us: f64,
    single_us: f64,
    single_writes: f64,
    single_main_us: f64,
    heartbeat_us: f64,
    idle_mib: f64,
    connected_mib: f64,
    peak_mib: f64,
    connect_wall_s: f64,
}

impl Figures {
    fn per_agent_kib(&self, agents: usize) -> f64 {
        (self.connected_mib - self.idle_mib) * 1024.0 / agents as f64
    }

    /// Cores for the goal: every value its own frame at worst (`single`), batches of 5 at
    /// best, and one heartbeat per agent per heartbeat interval (an upper bound).
    fn goal_cores(&self, per_resval_us: f64) -> f64 {
        let resvals = GOAL_AGENTS * GOAL_RESOURCES / GOAL_PERIOD_S;
        let heartbeats = GOAL_AGENTS / HEARTBEAT_S;
        (resvals * per_resval_us + heartbeats * self.heartbeat_us) / 1e6
    }
}

struct Load {
    agents: usize,
    resources: usize,
    delta_rounds: usize,
    single_rounds: usize,
    heartbeat_rounds: usize,
    concurrency: usize,
}

fn measure(
    rt: &tokio::runtime::Runtime,
    rx: Receiver,
    load: &Load,
    pki: &Pki,
    addr: SocketAddr,
) -> Figures {
    let n = load.agents;
    let res = load.resources;
    let nofile = nofile(rx.pid());
    assert!(
        nofile as usize > n + 64,
        "{}: open-file limit {nofile} is too low for {n} agents (raise the hard limit: ulimit -Hn)",
        rx.label
    );
    let configs: Vec<_> = (0..n)
        .map(|i| {
            Material::load(&pki.paths(&host(i)))
                .expect("material")
                .client_config()
                .expect("client config")
        })
        .collect();
    let idle_mib = rx.rss_mib();
    let counts = |rx: &Receiver| {
        (
            rx.hellos.load(Ordering::Relaxed),
            rx.resvals.load(Ordering::Relaxed),
        )
    };

    // 1. connect: handshake + hello
    let (h0, _) = counts(&rx);
    let (cpu0, t0) = (rx.cpu(), Instant::now());
    let mut agents: Vec<Agent> = rt.block_on(
        futures::stream::iter(configs.into_iter().enumerate())
            .map(|(i, cfg)| connect(addr, source(i), cfg, host(i), res))
            .buffer_unordered(load.concurrency)
            .collect(),
    );
    rx.wait(&rx.hellos, h0 + n as u64);
    let handshake_ms = (rx.cpu() - cpu0).as_secs_f64() * 1e3 / n as f64;
    let connect_wall_s = t0.elapsed().as_secs_f64();
    let phase =
        |what: &str| eprintln!("{}: {what} ({:.1} s)", rx.label, t0.elapsed().as_secs_f64());
    phase("connected");

    // 2. the full snapshot
    let (_, r0) = counts(&rx);
    let cpu0 = rx.cpu();
    rt.block_on(round(&mut agents, |_| batch(1, true, 0, res, res)));
    rx.wait(&rx.resvals, r0 + (n * res) as u64);
    let snapshot_ms = (rx.cpu() - cpu0).as_secs_f64() * 1e3 / n as f64;
    let connected_mib = rx.rss_mib();

    // 3. deltas of 5
    let mut seq = 1;
    let (_, r0) = counts(&rx);
    let (cpu0, w0, m0) = (rx.cpu(), write_calls(rx.pid()), rx.main_thread_cpu());
    for k in 0..load.delta_rounds {
        seq += 1;
        rt.block_on(round(&mut agents, |_| batch(seq, false, k * 5, 5, res)));
    }
    let deltas = (n * load.delta_rounds * 5) as u64;
    rx.wait(&rx.resvals, r0 + deltas);
    let resval_us = (rx.cpu() - cpu0).as_secs_f64() * 1e6 / deltas as f64;
    let resval_writes = (write_calls(rx.pid()) - w0) as f64 / deltas as f64;
    let resval_main_us = (rx.main_thread_cpu() - m0).as_secs_f64() * 1e6 / deltas as f64;
    phase("deltas of 5 done");

    // 4. deltas of 1
    let (_, r0) = counts(&rx);
    let (cpu0, w0, m0) = (rx.cpu(), write_calls(rx.pid()), rx.main_thread_cpu());
    for k in 0..load.single_rounds {
        seq += 1;
        rt.block_on(round(&mut agents, |_| batch(seq, false, k, 1, res)));
    }
    let singles = (n * load.single_rounds) as u64;
    rx.wait(&rx.resvals, r0 + singles);
    let single_us = (rx.cpu() - cpu0).as_secs_f64() * 1e6 / singles as f64;
    let single_writes = (write_calls(rx.pid()) - w0) as f64 / singles as f64;
    let single_main_us = (rx.main_thread_cpu() - m0).as_secs_f64() * 1e6 / singles as f64;
    phase("deltas of 1 done");

    // 5. heartbeats, then one batch of 1 each to know they were all read
    let (_, r0) = counts(&rx);
    let cpu0 = rx.cpu();
    for _ in 0..load.heartbeat_rounds {
        rt.block_on(round(&mut agents, |_| heartbeat(seq)));
    }
    seq += 1;
    rt.block_on(round(&mut agents, |_| batch(seq, false, 0, 1, res)));
    rx.wait(&rx.resvals, r0 + n as u64);
    let hb_cpu = (rx.cpu() - cpu0).as_secs_f64() * 1e6 - n as f64 * single_us;
    let heartbeat_us = hb_cpu / (n * load.heartbeat_rounds) as f64;

    let peak_mib = rx.peak_rss_mib();
    phase("heartbeats done");
    rt.block_on(async {
        for a in agents.iter_mut() {
            let _ = a.shutdown().await;
        }
    });
    drop(agents);
    let label = rx.label.clone();
    drop(rx);
    Figures {
        label,
        nofile,
        handshake_ms,
        snapshot_ms,
        resval_us,
        resval_writes,
        resval_main_us,
        single_us,
        single_writes,
        single_main_us,
        heartbeat_us,
        idle_mib,
        connected_mib,
        peak_mib,
        connect_wall_s,
    }
}

fn report(load: &Load, figs: &[Figures]) {
    let n = load.agents;
    println!(
        "\n## {n} agents x {} resources, TLS 1.3 (full handshakes, a certificate per agent)",
        load.resources
    );
    println!(
        "({} rounds of 5-value deltas = {} resvals, {} rounds of 1-value deltas, {} rounds of heartbeats = {} heartbeats)",
        load.delta_rounds,
        n * load.delta_rounds * 5,
        load.single_rounds,
        load.heartbeat_rounds,
        n * load.heartbeat_rounds
    );
    println!(
        "| receiver | nofile | CPU/handshake+hello (ms) | CPU/snapshot of {} (ms) | CPU/resval, batches of 5 (us) | of it main thread | write(2)/resval | CPU/resval, batches of 1 (us) | of it main thread | write(2)/resval | CPU/heartbeat (us) | RSS idle -> {n} connected (MiB) | RSS/agent (KiB) | VmHWM (MiB) | connect wall (s) |",
        load.resources
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for f in figs {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} -> {:.1} | {:.1} | {:.1} | {:.1} |",
            f.label,
            f.nofile,
            f.handshake_ms,
            f.snapshot_ms,
            f.resval_us,
            f.resval_main_us,
            f.resval_writes,
            f.single_us,
            f.single_main_us,
            f.single_writes,
            f.heartbeat_us,
            f.idle_mib,
            f.connected_mib,
            f.per_agent_kib(n),
            f.peak_mib,
            f.connect_wall_s
        );
    }
    println!(
        "\ngoal: {GOAL_AGENTS} agents x {GOAL_RESOURCES} resources changing every {GOAL_PERIOD_S} s ({:.0} resvals/s, at most {:.0} heartbeats/s), projected from the costs above, within 0.2 core:",
        GOAL_AGENTS * GOAL_RESOURCES / GOAL_PERIOD_S,
        GOAL_AGENTS / HEARTBEAT_S
    );
    for f in figs {
        println!(
            "{:12} {:.3} core (values in batches of 5) .. {:.3} core (each value its own batch)",
            f.label,
            f.goal_cores(f.resval_us),
            f.goal_cores(f.single_us)
        );
    }
    if let [c, l] = figs {
        println!(
            "C API / listen per resval: {:.2}x (batches of 5), {:.2}x (batches of 1); per heartbeat {:.2}x; per handshake + hello {:.2}x; per snapshot {:.2}x (goal per resval <= 1.5x)",
            c.resval_us / l.resval_us,
            c.single_us / l.single_us,
            c.heartbeat_us / l.heartbeat_us,
            c.handshake_ms / l.handshake_ms,
            c.snapshot_ms / l.snapshot_ms
        );
    }
}

/// Raise the open-file hard limit to `want` where allowed (root); silent otherwise (the
/// assert below names the limit).
fn raise_hard_fd_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if hard < want {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, soft.max(want), want);
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let exe = c_example();
    let sizes: Vec<usize> = env_or("AGENTS", "1000".to_owned())
        .split(',')
        .map(|s| s.trim().parse().expect("AGENTS: a comma list of numbers"))
        .collect();
    let max = *sizes.iter().max().expect("AGENTS");
    // A descriptor per agent here and in the receiver (which raises its own soft limit
    // too, as the library and listen do). As root the hard limit is raised too (the
    // receivers are children: they inherit it).
    raise_hard_fd_limit(max as u64 + 4096);
    let limit = xce_agent::receiver::session::raise_fd_limit();
    assert!(
        limit as usize > max + 256,
        "open-file limit {limit} is too low for {max} agents: raise the hard limit (ulimit -Hn {})",
        max + 1024
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki {
        ca: dir.path().join("ca"),
        hosts: dir.path().join("hosts"),
    };
    let t0 = Instant::now();
    xce_agent::tls_ca::init(&pki.ca, 30).expect("tls init");
    let names = [format!("node[00001-{max:05}]"), "localhost".to_owned()];
    xce_agent::tls_ca::issue(&pki.ca, &pki.hosts, &names, None, 30).expect("tls issue");
    eprintln!(
        "{max} agent certificates issued in {:.1} s; C example: {}",
        t0.elapsed().as_secs_f64(),
        exe.display()
    );
    let ctl = pki.paths("localhost");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    for n in sizes {
        let per = |total: usize, min: usize| (total / n).max(min);
        let load = Load {
            agents: n,
            resources: env_or("RESOURCES", 50),
            delta_rounds: env_or("DELTA_ROUNDS", per(20_000, 2)),
            single_rounds: env_or("SINGLE_ROUNDS", per(50_000, 2)),
            heartbeat_rounds: env_or("HEARTBEAT_ROUNDS", per(100_000, 5)),
            concurrency: env_or("CONCURRENCY", 64),
        };
        let mut figs = Vec::new();
        for which in ["C example", "listen"] {
            let addr = free_addr();
            let rx = if which == "listen" {
                Receiver::listen(addr, Some(&ctl))
            } else {
                start_c(&exe, addr, &ctl)
            };
            let t = Instant::now();
            figs.push(measure(&rt, rx, &load, &pki, addr));
            eprintln!(
                "{which}: {n} agents measured in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        report(&load, &figs);
    }
}
