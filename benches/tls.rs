//! What TLS costs the receiver, side by side with plaintext in one run (the physical floor
//! is the same work without TLS):
//! 1. `xce-agent listen` CPU per agent connect: TCP + handshake + hello + full snapshot of
//!    10 resvals + close, CONNECTS times in a row; TLS with a full handshake each time and
//!    with session resumption;
//! 2. listen CPU per delta resval: one connection, DELTAS batches of 5 resvals;
//! 3. a reconnect storm: STORM agents (the library's link task, each with its own
//!    certificate from `xce-agent tls issue`) streaming to listen, listen killed and started
//!    again on the same port: time until every agent has sent its hello again, listen's CPU
//!    over that time and its peak RSS (VmHWM) with every agent connected.
//!
//! listen's CPU is utime + stime from /proc/PID/stat; its stdout (JSON lines) is read and
//! counted here, as an admin would pipe it (benches/support/receiver.rs, shared with
//! benches/controller.rs).
//!
//! Run: `cargo bench --bench tls` (env CONNECTS=500 DELTAS=20000 STORM=1000).

mod support {
    pub mod env;
    pub mod proc_stats;
    pub mod receiver;
}

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::ServerName;
use support::env::env_or;
use support::receiver::{batch, free_addr, hello, name, Receiver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use xce_agent::config::agent::TlsPaths;
use xce_agent::link::assignment::Assigned;
use xce_agent::link::client::{self, LinkConfig, LinkStats};
use xce_agent::link::tls::Material;
use xce_agent::link::wire::{self, Envelope};
use xce_agent::store::{self, Store};
use xce_agent::value::{Reading, Valtype, Value};

const RESOURCES: usize = 10;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    TlsFull,
    TlsResumed,
}

/// One agent connection: hello, full snapshot, then `deltas` batches of 5, then close and
/// wait for the receiver to close too (so it has read everything).
async fn session(
    addr: SocketAddr,
    tls: Option<&tokio_rustls::TlsConnector>,
    deltas: u64,
) -> std::io::Result<()> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut s: Box<dyn xce_agent::link::tls::LinkStream> = match tls {
        Some(c) => Box::new(
            c.connect(ServerName::try_from("localhost").expect("name"), tcp)
                .await?,
        ),
        None => Box::new(tcp),
    };
    let mut out =
        wire::encode_envelope(&Envelope::Hello(hello("node0001", RESOURCES))).expect("encode");
    out.extend(batch(1, true, 0, RESOURCES, RESOURCES));
    s.write_all(&out).await?;
    for seq in 2..deltas + 2 {
        s.write_all(&batch(seq, false, 0, 5, RESOURCES)).await?;
    }
    s.flush().await?;
    s.shutdown().await?;
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink).await;
    Ok(())
}

fn connector(paths: &TlsPaths, mode: Mode) -> Option<tokio_rustls::TlsConnector> {
    let cfg = Material::load(paths)
        .expect("material")
        .client_config()
        .expect("client");
    let mut cfg = (*cfg).clone();
    match mode {
        Mode::Plain => return None,
        Mode::TlsFull => cfg.resumption = rustls::client::Resumption::disabled(),
        Mode::TlsResumed => {}
    }
    Some(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

fn connects(rt: &tokio::runtime::Runtime, ctl: &TlsPaths, node: &TlsPaths) {
    let n: u64 = env_or("CONNECTS", 500);
    println!("## listen CPU per agent connect ({n} connects in a row, hello + 10 resvals each)");
    let mut floor = None;
    for (label, mode) in [
        ("plaintext", Mode::Plain),
        ("TLS 1.3, full handshake", Mode::TlsFull),
        ("TLS 1.3, resumed session", Mode::TlsResumed),
    ] {
        let addr = free_addr();
        let listen = Receiver::listen(addr, (mode != Mode::Plain).then_some(ctl));
        let tls = connector(node, mode);
        let base = listen.lines.load(Ordering::Relaxed);
        let (cpu0, t0) = (listen.cpu(), Instant::now());
        rt.block_on(async {
            for _ in 0..n {
                session(addr, tls.as_ref(), 0).await.expect("session");
            }
        });
        // connect + hello + 10 resvals + closed per session.
        listen.wait(&listen.lines, base + n * (RESOURCES as u64 + 3));
        let cpu = (listen.cpu() - cpu0).as_secs_f64() * 1e3 / n as f64;
        let wall = t0.elapsed().as_secs_f64() * 1e3 / n as f64;
        let floor_ms = *floor.get_or_insert(cpu);
        println!(
            "{label:28} listen CPU {cpu:.3} ms/connect ({:.2}x plaintext), wall {wall:.2} ms/connect",
            cpu / floor_ms
        );
    }
}

fn deltas(rt: &tokio::runtime::Runtime, ctl: &TlsPaths, node: &TlsPaths) {
    let n: u64 = env_or("DELTAS", 20_000);
    println!("\n## listen CPU per delta resval (one connection, {n} deltas of 5 resvals)");
    let mut floor = None;
    for (label, mode) in [("plaintext", Mode::Plain), ("TLS 1.3", Mode::TlsResumed)] {
        let addr = free_addr();
        let listen = Receiver::listen(addr, (mode != Mode::Plain).then_some(ctl));
        let tls = connector(node, mode);
        let base = listen.lines.load(Ordering::Relaxed);
        let cpu0 = listen.cpu();
        rt.block_on(session(addr, tls.as_ref(), n))
            .expect("session");
        listen.wait(&listen.lines, base + 3 + RESOURCES as u64 + n * 5);
        let us = (listen.cpu() - cpu0).as_secs_f64() * 1e6 / (n * 5) as f64;
        let floor_us = *floor.get_or_insert(us);
        println!(
            "{label:28} listen CPU {us:.2} us/resval ({:.2}x plaintext)",
            us / floor_us
        );
    }
}

fn storm(rt: &tokio::runtime::Runtime, ctl: &TlsPaths, ca: &Path, hosts: &Path) {
    let agents: usize = env_or("STORM", 1000);
    println!("\n## reconnect storm: {agents} agents, listen restarted on the same port");
    for tls in [false, true] {
        let addr = free_addr();
        let listen = Receiver::listen(addr, tls.then_some(ctl));
        let stop = tokio_util::sync::CancellationToken::new();
        let stats: Vec<Arc<LinkStats>> = (0..agents)
            .map(|i| {
                let host = format!("node{:04}", i + 1);
                let client_tls = tls.then(|| {
                    let paths = TlsPaths {
                        ca: ca.join("ca.pem"),
                        cert: hosts.join(format!("{host}.pem")),
                        key: hosts.join(format!("{host}.key")),
                        crl: None,
                    };
                    Material::load(&paths)
                        .expect("material")
                        .client_config()
                        .expect("client")
                });
                let store = Arc::new(Store::new());
                store.declare((0..RESOURCES).map(|r| store::Declared {
                    name: name(r),
                    instance: String::new(),
                    valtype: Valtype::Numeric,
                    stale_after: Duration::from_secs(3600),
                }));
                for r in 0..RESOURCES {
                    store.record(
                        &name(r),
                        "",
                        Reading::Ok(Value::Numeric(r as f64)),
                        SystemTime::now(),
                    );
                }
                let cfg = LinkConfig {
                    controllers: vec![format!("localhost:{}", addr.port())],
                    tls: client_tls,
                    ..LinkConfig::default()
                };
                let (_hello_tx, hello_rx) =
                    tokio::sync::watch::channel(Arc::new(hello(&host, RESOURCES)));
                let (assigned, _) = tokio::sync::watch::channel(Assigned::new());
                let stats = Arc::new(LinkStats::default());
                let link_stats = stats.clone();
                let stop = stop.clone();
                rt.spawn(async move {
                    let _keep = _hello_tx;
                    client::run(cfg, store, hello_rx, assigned, link_stats, stop).await;
                });
                stats
            })
            .collect();
        listen.wait(&listen.hellos, agents as u64);
        drop(listen);
        let (t0, listen) = (Instant::now(), Receiver::listen(addr, tls.then_some(ctl)));
        let cpu0 = listen.cpu();
        listen.wait(&listen.hellos, agents as u64);
        let secs = t0.elapsed().as_secs_f64();
        let cpu = (listen.cpu() - cpu0).as_secs_f64();
        let peak_mib = listen.peak_rss_mib();
        let failures: u64 = stats
            .iter()
            .map(|s| {
                xce_agent::link::tls::Failure::ALL
                    .iter()
                    .map(|f| s.tls_failures(*f))
                    .sum::<u64>()
            })
            .sum();
        println!(
            "{:28} all {agents} streaming again after {secs:.2} s; listen CPU {cpu:.2} s ({:.2} ms/agent), peak RSS {peak_mib:.1} MiB; TLS failures {failures}",
            if tls { "TLS 1.3" } else { "plaintext" },
            cpu * 1e3 / agents as f64
        );
        stop.cancel();
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, hosts) = (dir.path().join("ca"), dir.path().join("hosts"));
    xce_agent::tls_ca::init(&ca, 30).expect("tls init");
    let storm_n: usize = env_or("STORM", 1000);
    let names = [format!("node[0001-{storm_n:04}]"), "localhost".to_owned()];
    xce_agent::tls_ca::issue(&ca, &hosts, &names, None, 30).expect("tls issue");
    let paths = |host: &str| TlsPaths {
        ca: ca.join("ca.pem"),
        cert: hosts.join(format!("{host}.pem")),
        key: hosts.join(format!("{host}.key")),
        crl: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (ctl, node) = (paths("localhost"), paths("node0001"));
    connects(&rt, &ctl, &node);
    deltas(&rt, &ctl, &node);
    storm(&rt, &ctl, &ca, &hosts);
}
