//! Freshness as a choice (issue 40): the end-to-end latency from a probe's print to the
//! receiver's event, with agent.yaml's `coalesce: 0` and with the default window (200ms),
//! and the daemon's CPU each costs.
//!
//! The agent: the real `xce-agent` daemon as root, `run_as: nobody`, containment on, PROBES
//! (5) exec probes at interval 1 s, each printing the wall clock in milliseconds
//! (`date +%s%3N`), so every run is a change. The receiver: `xce-agent listen --format json`,
//! a process of its own, on loopback, over mutual TLS as shipped (a cluster CA and the
//! certificates made here with `xce-agent tls init/issue`; LINK=plain for `--insecure`);
//! the bench reads its lines as they come and takes each resval's latency as the wall clock
//! at that moment minus the value (the moment of the print). The daemon's CPU is its utime +
//! stime over the window.
//!
//! Run (as root): `cargo bench --bench freshness` (env PROBES=5 SECS=20 WINDOWS="0 200ms"
//! LINK=tls).

mod support {
    pub mod daemon;
    pub mod env;
    pub mod proc_stats;
}

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use support::daemon::{agent_bin, free_port, Daemon};
use support::env::env_or;
use support::proc_stats::{proc_cpu, proc_rss_kib};

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The `"value":N` of a listen JSON resval line.
fn value_of(line: &str) -> Option<f64> {
    let rest = &line[line.find("\"value\":")? + 8..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim_matches('"').parse().ok()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("freshness: skipped: the shipped configuration needs a root agent (run as root)");
        return;
    }
    let probes: usize = env_or("PROBES", 5);
    let secs: u64 = env_or("SECS", 20);
    let windows: String = env_or("WINDOWS", "0 200ms".to_string());
    let tls = env_or("LINK", "tls".to_string()) != "plain";
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let pki = tls.then(|| Pki::make(dir.path()));
    let script = dir.path().join("now.sh");
    std::fs::write(&script, "#!/bin/sh\ndate +%s%3N\n").expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut resources = String::from("resources:\n");
    for i in 0..probes {
        resources.push_str(&format!(
            "  - name: t{i:02}\n    valtype: numeric\n    interval: 1s\n    \
             resourcemap: [{{location: [default]}}]\n    \
             probe: {{kind: exec, command: [{}], format: value}}\n",
            script.display()
        ));
    }
    println!("## freshness: a probe's print to the receiver's event");
    println!(
        "agent: `{}` as root, run_as: nobody, {probes} exec probes at 1s printing the time; \
         receiver: `xce-agent listen` on loopback, {}; window {secs} s each",
        agent_bin(),
        if tls {
            "mutual TLS"
        } else {
            "plaintext (`--insecure`)"
        },
    );
    println!();
    println!("| coalesce | values | latency p50 (ms) | p90 | p99 | max | daemon CPU (ms/s) | daemon CPU per value (µs) | daemon VmRSS (MiB) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for window in windows.split_whitespace() {
        let port = free_port();
        let mut listen = Command::new(agent_bin());
        listen.args(["listen", &format!("127.0.0.1:{port}"), "--format", "json"]);
        match &pki {
            Some(p) => listen.args(p.listen_args()),
            None => listen.arg("--insecure"),
        };
        let mut listen = listen
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start listen");
        let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
        let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let out = listen.stdout.take().expect("stdout");
        let (lat, on) = (latencies.clone(), measuring.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let at = now_ms();
                if !line.contains("\"event\":\"resval\"") {
                    continue;
                }
                if let (Some(v), true) = (
                    value_of(&line),
                    on.load(std::sync::atomic::Ordering::Relaxed),
                ) {
                    lat.lock().expect("lock").push(at - v);
                }
            }
        });
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "listen not listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let link = match &pki {
            Some(p) => p.agent_yaml(),
            None => "insecure_plaintext: true\n".to_owned(),
        };
        let extra = format!("controllers: [\"localhost:{port}\"]\n{link}coalesce: {window}\n");
        let daemon = Daemon::start(dir.path(), &resources, &extra);
        // Past the startup spread and the first snapshot.
        std::thread::sleep(Duration::from_secs(3));
        measuring.store(true, std::sync::atomic::Ordering::Relaxed);
        let c0 = proc_cpu(daemon.pid());
        let w0 = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let cpu = proc_cpu(daemon.pid()) - c0;
        let wall = w0.elapsed().as_secs_f64();
        measuring.store(false, std::sync::atomic::Ordering::Relaxed);
        let rss_mib = proc_rss_kib(daemon.pid(), "VmRSS:") as f64 / 1024.0;
        drop(daemon);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(listen.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = listen.wait();
        let mut l = latencies.lock().expect("lock").clone();
        l.sort_by(f64::total_cmp);
        assert!(
            !l.is_empty(),
            "no value reached the receiver with coalesce {window}"
        );
        println!(
            "| {window} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {rss_mib:.1} |",
            l.len(),
            percentile(&l, 0.5),
            percentile(&l, 0.9),
            percentile(&l, 0.99),
            l.last().copied().unwrap_or(f64::NAN),
            cpu * 1e3 / wall,
            cpu * 1e6 / l.len() as f64,
        );
    }
}

/// The site PKI of the shipped configuration, made with the agent's own `tls init/issue`:
/// node001 (the daemon's host) and localhost (the receiver it dials).
struct Pki {
    hosts: std::path::PathBuf,
    ca: std::path::PathBuf,
}

impl Pki {
    fn make(dir: &std::path::Path) -> Self {
        let ca = dir.join("ca");
        let hosts = dir.join("hosts");
        let run = |args: &[&std::ffi::OsStr]| {
            let o = Command::new(agent_bin())
                .args(args)
                .output()
                .expect("xce-agent tls");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };
        run(&["tls".as_ref(), "init".as_ref(), ca.as_os_str()]);
        run(&[
            "tls".as_ref(),
            "issue".as_ref(),
            "--ca".as_ref(),
            ca.as_os_str(),
            "--out".as_ref(),
            hosts.as_os_str(),
            "node001".as_ref(),
            "localhost".as_ref(),
        ]);
        Self { hosts, ca }
    }

    fn listen_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--tls-ca".into(),
            self.ca.join("ca.pem").into(),
            "--tls-cert".into(),
            self.hosts.join("localhost.pem").into(),
            "--tls-key".into(),
            self.hosts.join("localhost.key").into(),
        ]
    }

    fn agent_yaml(&self) -> String {
        format!(
            "tls:\n  ca: {}\n  cert: {}\n  key: {}\n",
            self.ca.join("ca.pem").display(),
            self.hosts.join("node001.pem").display(),
            self.hosts.join("node001.key").display(),
        )
    }
}
