//! Processes: the real `xce-agent` binary as a child that is always killed on drop, the
//! state of other processes read from /proc, and tests that run in a process of their own.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::mpsc;

use nix::sys::signal::Signal;

use super::wait::{wait_until, HANG_GUARD};

pub fn agent_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("xce-agent")
}

/// `xce-agent -c CONFIG ARGS` run to its end (RUST_LOG unset): its exit code, and its
/// stdout followed by its stderr.
pub fn agent_output(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(agent_bin())
        .arg("-c")
        .arg(config)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run xce-agent");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The real agent binary; killed (by its PID, through the Child) and reaped on drop.
pub struct AgentProc {
    child: Child,
    pub log: PathBuf,
}

impl AgentProc {
    pub fn spawn(config: &Path, log: &Path) -> Self {
        Self::spawn_with_env(config, log, &[])
    }

    /// With `env` set: a test's own systemd variables. Those of the shell that runs the tests
    /// are removed, so the agent logs to `log`, not to a journal, and notifies no one.
    pub fn spawn_with_env(config: &Path, log: &Path, env: &[(&str, &str)]) -> Self {
        Self::spawn_from(Command::new(agent_bin()), config, log, env)
    }

    /// Started with the open-file limit `soft` / `hard` (RLIMIT_NOFILE), as a unit's
    /// LimitNOFILE= would start it: `sh` sets the limit and execs the agent (same PID).
    pub fn spawn_with_open_files(config: &Path, log: &Path, soft: u64, hard: u64) -> Self {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!(
                "ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\""
            ))
            .arg(agent_bin());
        Self::spawn_from(sh, config, log, &[])
    }

    fn spawn_from(mut cmd: Command, config: &Path, log: &Path, env: &[(&str, &str)]) -> Self {
        let err = File::create(log).expect("create log");
        cmd.arg("--config")
            .arg(config)
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        for systemd in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "JOURNAL_STREAM",
        ] {
            cmd.env_remove(systemd);
        }
        // The default status socket in the test's own directory (as systemd's
        // RuntimeDirectory= would give it), not in this machine's /run/xce-agent.
        if let Some(dir) = config.parent() {
            cmd.env("RUNTIME_DIRECTORY", dir);
        }
        let child = cmd
            .envs(env.iter().copied())
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

    /// `signal` to this PID only.
    pub fn signal(&self, signal: Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|e| panic!("{signal}: {e}"));
    }

    /// SIGTERM (to this PID only) and wait for the exit, bounded by the hang guard.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(Signal::SIGTERM);
        self.wait_exit().await
    }

    /// Wait for the exit (a signal already sent), bounded by the hang guard.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut status = None;
        wait_until("the agent to exit", || {
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
        wait_until(&what, || {
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
        // SIGTERM first: the agent then ends its probes and removes its cgroup subtree, which
        // a SIGKILL leaves behind (for the next agent to find). SIGKILL only if it outlives
        // the bound (a test that dropped it mid-grace).
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            let until = std::time::Instant::now() + DROP_GRACE;
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a dropped agent gets to stop on SIGTERM before it is killed.
const DROP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// `xce-agent listen 127.0.0.1:0 --format json`: its stdout and stderr lines arrive on
/// channels (reader threads), so waits are bounded with `recv_timeout`.
pub struct ListenProc {
    child: Child,
    pub addr: SocketAddr,
    pub stdout: mpsc::Receiver<String>,
    pub stderr: mpsc::Receiver<String>,
}

pub fn lines_of<R: std::io::Read + Send + 'static>(r: R) -> mpsc::Receiver<String> {
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
        Self::spawn_at("127.0.0.1:0", options)
    }

    /// As [`Self::spawn_with`], listening on `addr` (a controller back on its old port).
    pub fn spawn_at(addr: &str, options: &[&str]) -> Self {
        let mut args = vec!["listen", addr];
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
        nix::sys::signal::kill(pid, Signal::SIGTERM).expect("SIGTERM");
        (
            lines_until_closed(&self.stdout, "listen"),
            lines_until_closed(&self.stderr, "listen"),
        )
    }
}

impl Drop for ListenProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Field 3 (state) and 4 (ppid) of `/proc/PID/stat`. The state follows the last ')': the
/// command name may contain anything.
fn state_and_parent(pid: i32) -> Option<(String, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit(')').next()?.split_whitespace();
    let state = fields.next()?.to_owned();
    let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((state, ppid))
}

/// Whether a process is still running (a zombie waiting for its reaper counts as gone).
pub fn alive(pid: i32) -> bool {
    state_and_parent(pid).is_some_and(|(state, _)| state != "Z" && state != "X")
}

/// Whether `pid` is a zombie child of this test process (nobody reaped it).
pub fn our_zombie(pid: i32) -> bool {
    state_and_parent(pid)
        .is_some_and(|(state, ppid)| state == "Z" && ppid == std::process::id() as i32)
}

/// The pid a probe wrote to `path`.
pub fn read_pid(path: &Path) -> i32 {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no pid in {}: {e}", path.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {text:?} is not a pid: {e}", path.display()))
}

/// Block until process `pid` has exited (pidfd readiness; no polling), with the hang guard.
pub fn wait_gone(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return; // already gone (ESRCH)
    }
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // A signal handled on this thread (SIGCHLD, with many children exiting) ends poll early
    // with EINTR: poll again for the rest of the guard. (Taken for a hang, it failed
    // `two_hundred_background_sleeps_are_all_ended` at once as "still running after 60s".)
    let give_up = std::time::Instant::now() + HANG_GUARD;
    let n = loop {
        let left = give_up.saturating_duration_since(std::time::Instant::now());
        // SAFETY: one valid pollfd; fd is closed right after the loop.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    // SAFETY: fd came from pidfd_open above and nothing else owns it.
    unsafe { libc::close(fd) };
    assert!(
        n == 1,
        "process {pid} still running after {HANG_GUARD:?} (poll: {n}, {})",
        std::io::Error::last_os_error()
    );
}

/// Where a test needs a tool that not every build machine has, the test is marked
/// `#[ignore = "needs TOOL ..."]`: plain `cargo test` lists it as ignored with that reason
/// instead of passing it silently, and CI (which installs the tools) runs the ignored tests
/// with `cargo test -- --ignored`. Run that way, a missing tool fails the test.
pub fn require_tool(program: &str, args: &[&str], install: &str) {
    let ok = Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "this test needs `{program}` (install: {install})");
}

/// Names the one test a copy of this binary started by [`in_own_process!`] runs.
const OWN_PROCESS: &str = "XCE_IT_OWN_PROCESS";

/// For a test that changes what a process has only once and for all — it makes the process
/// the child subreaper, whose reaper would reap other tests' children, sets its SIGCHLD
/// disposition, or moves it into a cgroup. All tests share this process, so such a test runs
/// alone in a fresh copy of the test binary, saying why in one line:
/// `if !in_own_process!("fn_name", "why") { return; }` as its first line. The macro is true
/// in that copy (run the test); in the caller it runs the copy, fails if the test failed there
/// or did not run, and is false (the test is done). What a spec or a handle can carry (the
/// clone call, the subreaper's count) is a value, and needs no process of its own.
macro_rules! in_own_process {
    ($test:literal, $why:literal) => {
        $crate::support::run_in_own_process(module_path!(), $test, $why)
    };
}
pub(crate) use in_own_process;

/// See [`in_own_process!`]: `module` is the test's `module_path!()`, `test` its fn name, `why`
/// what of the process it changes.
pub fn run_in_own_process(module: &str, test: &str, why: &str) -> bool {
    // module_path!() starts with the crate (`it::`); libtest names tests without it.
    let module = module.split_once("::").map_or("", |(_, m)| m);
    let name = format!("{module}::{test}");
    if std::env::var_os(OWN_PROCESS).is_some_and(|v| v == name.as_str()) {
        return true;
    }
    let binary = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(binary)
        .args([&name, "--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(OWN_PROCESS, &name)
        // Its frames would be this runner's; the message and its file:line say where.
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // What the test says (a skip's reason) reaches this test's output.
    eprint!("{stderr}");
    if !out.status.success() {
        eprint!("{stdout}");
    }
    // The failure's own words lead this test's message, which is all a log's tail may keep.
    let failure: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains(" panicked at "))
        .take(12)
        .collect();
    assert!(
        out.status.success(),
        "{name} failed in its own process (as {why}) ({}): {}",
        out.status,
        failure.join("\n")
    );
    assert!(
        stdout.contains(" 1 passed;"),
        "{name} did not run in its own process (no test of that name?):\n{stdout}"
    );
    false
}

/// A child process of the test that is killed and reaped when the test ends, passed or not.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every line still to come from `rx` until its process closes the stream, within the hang
/// guard per line; `who` names the process in the failure.
pub fn lines_until_closed(rx: &mpsc::Receiver<String>, who: &str) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(HANG_GUARD) {
            Ok(l) => lines.push(l),
            Err(mpsc::RecvTimeoutError::Disconnected) => return lines,
            Err(e) => panic!("{who} did not end its output after SIGTERM: {e}"),
        }
    }
}
