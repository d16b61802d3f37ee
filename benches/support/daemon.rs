//! The real `xce-agent` daemon under a bench: started on a resources.yaml body in a
//! directory of the bench's, with /metrics on loopback (its run counters), stopped with
//! SIGTERM (it removes its cgroups on the way out).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under measurement.
pub fn agent_bin() -> String {
    std::env::var("XCE_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_xce-agent").to_owned())
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `probes` numeric resources `r000`, `r001`, ... each probed by exec of `script` every
/// `interval` (a resources.yaml body).
pub fn exec_resources(probes: usize, interval: &str, script: &Path) -> String {
    let mut y = String::from("resources:\n");
    for i in 0..probes {
        y.push_str(&format!(
            "  - name: r{i:03}\n    valtype: numeric\n    interval: {interval}\n    \
             resourcemap: [{{location: [default]}}]\n    \
             probe: {{kind: exec, command: [{}], format: value}}\n",
            script.display()
        ));
    }
    y
}

/// `dir` made world-readable (not writable: probes run as nobody) with the trivial probe
/// script `tiny.sh` (`#!/bin/sh\necho 1`) in it; its path.
pub fn tiny_script(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = dir.join("tiny.sh");
    std::fs::write(&script, "#!/bin/sh\necho 1\n").expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// A daemon on `resources` (a resources.yaml body) in `dir`, with /metrics on loopback.
pub struct Daemon {
    pub child: Child,
    pub port: u16,
}

impl Daemon {
    /// `extra`: more agent.yaml lines (each ending in a newline).
    pub fn start(dir: &Path, resources: &str, extra: &str) -> Self {
        Self::start_bin(&agent_bin(), dir, resources, extra)
    }

    /// As [`Self::start`], running the binary `bin`.
    pub fn start_bin(bin: &str, dir: &Path, resources: &str, extra: &str) -> Self {
        let port = free_port();
        std::fs::write(
            dir.join("agent.yaml"),
            format!(
                "host: node001\n{controllers}resources: resources.yaml\nplugin_dir: {d}\n\
                 run_as: nobody\nmetrics: 127.0.0.1:{port}\nstatus_socket: {d}/status.sock\n{extra}",
                d = dir.display(),
                // No link unless `extra` names controllers.
                controllers = if extra.contains("controllers:") { "" } else { "controllers: []\n" },
            ),
        )
        .expect("write agent.yaml");
        std::fs::write(dir.join("resources.yaml"), resources).expect("write resources.yaml");
        let child = Command::new(bin)
            .arg("--config")
            .arg(dir.join("agent.yaml"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start xce-agent");
        let me = Self { child, port };
        let t0 = Instant::now();
        while me.scrape().is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the daemon serves no /metrics"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        me
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn scrape(&self) -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.contains("xce_").then_some(body)
    }

    /// Runs so far (every outcome but a skipped tick), and how many of them did not succeed.
    pub fn runs(&self) -> (u64, u64) {
        let body = self.scrape().expect("scrape /metrics");
        let (mut all, mut bad) = (0, 0);
        for line in body
            .lines()
            .filter(|l| l.starts_with("xce_probe_runs_total{"))
        {
            let n: u64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64;
            if line.contains("outcome=\"ok\"") {
                all += n;
            } else if !line.contains("skipped_overlap") {
                all += n;
                bad += n;
            }
        }
        (all, bad)
    }

    /// Wait (up to a minute) until the daemon has made `n` runs.
    pub fn wait_for_runs(&self, n: u64) {
        let t0 = Instant::now();
        while self.runs().0 < n {
            assert!(t0.elapsed() < Duration::from_secs(60), "first runs missing");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Voluntary + involuntary context switches of every thread now, and the thread count.
    pub fn switches(&self) -> (u64, usize) {
        let mut sum = 0;
        let mut threads = 0;
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid())).expect("tasks");
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            threads += 1;
            sum += status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
        (sum, threads)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: it removes its cgroups on the way out.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}
