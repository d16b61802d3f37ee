//! Helpers for the binary-level tests: the real `xce-agent` binary as a child process that is
//! always killed on drop, config directories with exec and file probes, and waits that poll
//! files with short bounded retries (never a fixed sleep for correctness).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use xce_agent::link::wire::Batch;
use xce_agent::value::Resval;

/// Every wait is bounded by this so a broken agent fails the test instead of hanging it.
/// Not a timing assertion: a healthy run needs a small fraction of it.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Poll step of the file waits: short, so the wait ends soon after the condition holds.
const POLL: Duration = Duration::from_millis(50);

pub fn agent_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("xce-agent")
}

/// A temp dir holding agent.yaml (host node001, plugin_dir = the dir, probes as root so a
/// root test run can write the probes' files) and resources.yaml.
pub struct Site {
    pub dir: tempfile::TempDir,
}

impl Site {
    pub fn new(controllers: &[String], resources: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod tempdir");
        let list: Vec<String> = controllers.iter().map(|c| format!("\"{c}\"")).collect();
        let agent = format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\nrun_as: root\ncontrollers: [{}]\n{}",
            dir.path().display(),
            list.join(", "),
            // Plaintext, said in words; the TLS tests write a tls: section instead.
            if controllers.is_empty() { "" } else { "insecure_plaintext: true\n" }
        );
        std::fs::write(dir.path().join("agent.yaml"), agent).expect("write agent.yaml");
        std::fs::write(dir.path().join("resources.yaml"), resources).expect("write resources");
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn agent_yaml(&self) -> PathBuf {
        self.file("agent.yaml")
    }

    /// An executable script in the plugin dir (0755, not group/other writable).
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.file(name);
        std::fs::write(&p, body).expect("write script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    /// Replace a file's content atomically, so a probe never reads half of it.
    pub fn write_atomic(&self, name: &str, content: &str) {
        let tmp = self.file(&format!(".{name}.tmp"));
        std::fs::write(&tmp, content).expect("write tmp");
        std::fs::rename(&tmp, self.file(name)).expect("rename");
    }

    /// `xce-agent --config agent.yaml` with its log in `agent.log`.
    pub fn spawn_agent(&self) -> AgentProc {
        AgentProc::spawn(&self.agent_yaml(), &self.file("agent.log"))
    }

    /// A counter probe: each run adds one to `<name>.count`, appends the new count to
    /// `<name>.runs` and prints it. Proves the agent keeps probing and which value is latest.
    pub fn counter_script(&self, name: &str) -> PathBuf {
        let d = self.path().display();
        self.script(
            &format!("{name}.sh"),
            &format!(
                "#!/bin/sh\nn=$(cat {d}/{name}.count 2>/dev/null || echo 0)\nn=$((n + 1))\n\
                 echo $n > {d}/{name}.count\necho $n >> {d}/{name}.runs\necho $n\n"
            ),
        )
    }

    /// Runs recorded by `counter_script(name)` so far.
    pub fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.file(&format!("{name}.runs")))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Wait until the counter probe has run `n` times in all.
    pub async fn wait_runs(&self, name: &str, n: usize) {
        wait_for(&format!("{name} to run {n} times"), || self.runs(name) >= n).await;
    }
}

/// Poll `cond` with short waits until it holds; panics after `HANG_GUARD`.
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let polled = async {
        while !cond() {
            tokio::time::sleep(POLL).await;
        }
    };
    if tokio::time::timeout(HANG_GUARD, polled).await.is_err() {
        panic!("timed out waiting for {what}");
    }
}

/// The real agent binary; killed (by its PID, through the Child) and reaped on drop.
pub struct AgentProc {
    child: Child,
    pub log: PathBuf,
}

impl AgentProc {
    pub fn spawn(config: &Path, log: &Path) -> Self {
        let err = File::create(log).expect("create log");
        let child = Command::new(agent_bin())
            .arg("--config")
            .arg(config)
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn xce-agent");
        Self {
            child,
            log: log.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent must still be running (a crash would otherwise look like a hang).
    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("xce-agent exited ({status}); log:\n{}", self.log_text());
        }
    }

    /// SIGTERM (to this PID only) and wait for the exit, bounded by the hang guard.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let mut status = None;
        wait_for("the agent to exit after SIGTERM", || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        })
        .await;
        status.expect("exited")
    }

    /// Resident set size in KiB, from /proc/PID/status.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// Wait until the log contains `needle` at least `n` times.
    pub async fn wait_log(&mut self, needle: &str, n: usize) {
        let log = self.log.clone();
        let what = format!("{n} x {needle:?} in the agent log");
        wait_for(&what, || {
            std::fs::read_to_string(&log)
                .map(|s| s.matches(needle).count() >= n)
                .unwrap_or(false)
        })
        .await;
        self.assert_alive();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- agent log (last 40 lines) ---\n{}", tail.join("\n"));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `xce-agent listen 127.0.0.1:0 --format json`: its stdout and stderr lines arrive on
/// channels (reader threads), so waits are bounded with `recv_timeout`.
pub struct ListenProc {
    child: Child,
    pub addr: SocketAddr,
    pub stdout: mpsc::Receiver<String>,
    pub stderr: mpsc::Receiver<String>,
}

fn lines_of<R: std::io::Read + Send + 'static>(r: R) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl ListenProc {
    /// A plaintext receiver, said in words.
    pub fn spawn() -> Self {
        Self::spawn_format("json")
    }

    /// `xce-agent listen 127.0.0.1:0 --format FORMAT`, plaintext (`--insecure`).
    pub fn spawn_format(format: &str) -> Self {
        Self::spawn_with(&["--format", format])
    }

    /// `xce-agent listen 127.0.0.1:0` with these options; `--insecure` unless they give the
    /// `--tls-*` files, and `--format json` unless they name a format.
    pub fn spawn_with(options: &[&str]) -> Self {
        let mut args = vec!["listen", "127.0.0.1:0"];
        if !options.contains(&"--tls-ca") && !options.contains(&"--insecure") {
            args.push("--insecure");
        }
        if !options.contains(&"--format") {
            args.extend(["--format", "json"]);
        }
        let mut child = Command::new(agent_bin())
            .args(args)
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn xce-agent listen");
        let out: ChildStdout = child.stdout.take().expect("stdout piped");
        let err: ChildStderr = child.stderr.take().expect("stderr piped");
        let stdout = lines_of(out);
        let stderr = lines_of(err);
        let mut me = Self {
            child,
            addr: "0.0.0.0:0".parse().expect("addr"),
            stdout,
            stderr,
        };
        let line = me.next_err_matching("listening on");
        me.addr = line
            .rsplit(' ')
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        me
    }

    /// The next stderr line containing `needle` (earlier lines are skipped).
    pub fn next_err_matching(&mut self, needle: &str) -> String {
        loop {
            match self.stderr.recv_timeout(HANG_GUARD) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(e) => panic!("no stderr line with {needle:?} from listen: {e}"),
            }
        }
    }

    /// The next stdout JSON line for which `pred` holds.
    pub fn next_json(
        &mut self,
        mut pred: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        loop {
            let line = match self.stdout.recv_timeout(HANG_GUARD) {
                Ok(l) => l,
                Err(e) => panic!("listen printed no expected line: {e}"),
            };
            let v: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("listen printed a non-JSON line {line:?}: {e}"));
            if pred(&v) {
                return v;
            }
        }
    }

    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("xce-agent listen exited: {status}");
        }
    }

    /// SIGTERM (to this PID only), then every stdout and stderr line not read yet, up to
    /// the end of both streams: what a test counts once listen has said all it will.
    pub fn terminate_and_collect(&mut self) -> (Vec<String>, Vec<String>) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let rest = |rx: &mpsc::Receiver<String>| {
            let mut lines = Vec::new();
            loop {
                match rx.recv_timeout(HANG_GUARD) {
                    Ok(l) => lines.push(l),
                    Err(mpsc::RecvTimeoutError::Disconnected) => return lines,
                    Err(e) => panic!("listen did not end its output after SIGTERM: {e}"),
                }
            }
        };
        (rest(&self.stdout), rest(&self.stderr))
    }
}

impl Drop for ListenProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener on a fixed port (a controller coming back on its address). SO_REUSEADDR, so
/// the old connections' TIME_WAIT does not block the bind.
pub fn listen_on(addr: SocketAddr) -> TcpListener {
    let s = TcpSocket::new_v4().expect("socket");
    s.set_reuseaddr(true).expect("reuseaddr");
    s.bind(addr).expect("bind again");
    s.listen(1024).expect("listen")
}

/// The controller's view of one host: the latest resval per name, as batches update it.
#[derive(Debug, Default)]
pub struct View {
    pub values: BTreeMap<String, Resval>,
}

impl View {
    pub fn apply(&mut self, batch: &Batch) {
        if batch.full {
            self.values.clear();
        }
        for r in &batch.resvals {
            self.values.insert(r.name.clone(), r.clone());
        }
    }
}
