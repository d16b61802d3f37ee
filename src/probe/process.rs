//! Supervising one probe child: its own process group, a deadline that ends the whole group
//! (SIGTERM, a grace period during which output is still drained, then SIGKILL), bounded
//! output, and no waiting on a pipe after the deadline, since a backgrounded grandchild can
//! hold it open forever.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::resource::{setrlimit, Resource as Rlimit};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Gid, Pid, Uid};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::{sleep_until, Instant};

use crate::config::Limits;

/// The fixed PATH probes get: the environment is cleared, so nothing of the agent's leaks in.
pub const PROBE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);
pub const DEFAULT_STDOUT_CAP: usize = 64 * 1024;
pub const DEFAULT_STDERR_TAIL: usize = 4 * 1024;
/// After SIGKILL, how long pipes may still be drained before we stop waiting on them: only a
/// process that left the group (setsid) can still hold them, and we do not wait for it.
const AFTER_KILL_DRAIN: Duration = Duration::from_millis(200);

/// Who a child runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
}

impl Credentials {
    /// Look a user up and collect its supplementary groups, as login would.
    pub fn resolve(user: &str) -> Result<Self, String> {
        let pw = nix::unistd::User::from_name(user)
            .map_err(|e| format!("cannot look up user {user:?}: {e}"))?
            .ok_or_else(|| format!("no such user {user:?}"))?;
        let cname = CString::new(user).map_err(|_| format!("bad user name {user:?}"))?;
        let groups = nix::unistd::getgrouplist(&cname, pw.gid)
            .map_err(|e| format!("cannot list groups of {user:?}: {e}"))?;
        Ok(Self {
            user: user.to_owned(),
            uid: pw.uid,
            gid: pw.gid,
            groups,
        })
    }
}

#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    /// `None`: run as the agent's own user.
    pub credentials: Option<Credentials>,
    pub limits: Limits,
    pub timeout: Duration,
    pub grace: Duration,
    pub stdout_cap: usize,
    pub stderr_tail: usize,
}

impl ChildSpec {
    pub fn new(program: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: vec![("PATH".into(), PROBE_PATH.into())],
            cwd: PathBuf::from("/"),
            credentials: None,
            limits: Limits::default(),
            timeout,
            grace: DEFAULT_GRACE,
            stdout_cap: DEFAULT_STDOUT_CAP,
            stderr_tail: DEFAULT_STDERR_TAIL,
        }
    }
}

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Still not reaped after SIGKILL (uninterruptible sleep, e.g. a hung NFS mount); a
    /// background task reaps it when the kernel lets it go.
    Unreaped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exited and closed its output before the deadline.
    Finished,
    /// The deadline passed; the group got SIGTERM (and SIGKILL if `killed`).
    TimedOut {
        killed: bool,
        exited_before_deadline: bool,
    },
    /// Wrote more than the stdout cap; the group was ended at once.
    OutputOverflow { killed: bool },
}

#[derive(Debug, Clone)]
pub struct ChildOutcome {
    pub pid: u32,
    pub exit: Exit,
    pub ending: Ending,
    pub stdout: Vec<u8>,
    /// The last `stderr_tail` bytes of stderr, and how many bytes it wrote in all.
    pub stderr_tail: Vec<u8>,
    pub stderr_total: u64,
    pub duration: Duration,
}

impl ChildOutcome {
    pub fn succeeded(&self) -> bool {
        self.ending == Ending::Finished && self.exit == Exit::Code(0)
    }

    pub fn stderr_text(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr_tail);
        let text = text.trim();
        if self.stderr_total > self.stderr_tail.len() as u64 {
            format!("…{text}")
        } else {
            text.to_owned()
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start {program}: {source}")]
pub struct SpawnError {
    pub program: String,
    #[source]
    pub source: io::Error,
}

/// Stdout kept up to a cap (anything more is an error, so the child is ended at once).
struct Capped {
    buf: Vec<u8>,
    cap: usize,
    overflow: bool,
}

/// Stderr: only the tail matters for the error message.
pub(crate) struct Tail {
    pub(crate) buf: Vec<u8>,
    pub(crate) keep: usize,
    pub(crate) total: u64,
}

impl Tail {
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            buf: Vec::new(),
            keep,
            total: 0,
        }
    }

    /// The kept tail as text, `…` first when older output was dropped.
    pub(crate) fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.buf);
        let text = text.trim();
        if self.total > self.buf.len() as u64 {
            format!("…{text}")
        } else {
            text.to_owned()
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        self.buf.extend_from_slice(chunk);
        if self.buf.len() > self.keep {
            let cut = self.buf.len() - self.keep;
            self.buf.drain(..cut);
        }
    }
}

async fn read_opt<R: AsyncRead + Unpin>(r: &mut Option<R>, buf: &mut [u8]) -> io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn signal_group(pgid: Pid, sig: Signal) {
    // Never 0 or 1: killpg(0) would signal the agent's own group.
    if pgid.as_raw() > 1 {
        // ESRCH: the group is already gone, which is what we wanted.
        let _ = killpg(pgid, sig);
    }
}

/// Kills the child's whole group when a run ends, however it ends: normally, on error, or
/// because the agent dropped the run (reload, shutdown). A daemonised grandchild that closed
/// its output is still in the group and goes too.
pub struct GroupGuard(pub Pid);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, Signal::SIGKILL);
    }
}

/// A crashing probe must not fill the disk with cores. On the posix_spawn path there is no
/// hook in the child, so the agent's own core limit (which children inherit) goes to 0, once.
/// The agent loses its own core dumps with it, which on a node daemon that may hold
/// credentials in memory is no loss.
fn no_core_dumps_for_children() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = setrlimit(Rlimit::RLIMIT_CORE, 0, 0) {
            tracing::warn!("cannot set RLIMIT_CORE to 0: {e}");
        }
    });
}

fn build_command(spec: &ChildSpec) -> tokio::process::Command {
    let mut cmd = std::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: one signal reaches every descendant that did not setsid.
        .process_group(0);
    if spec.credentials.is_none() && spec.limits == Limits::default() {
        // Nothing to do between fork and exec: leave std on its posix_spawn path (vfork-like,
        // much cheaper than fork for a large agent). The core limit is inherited instead.
        no_core_dumps_for_children();
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        return cmd;
    }
    let creds = spec.credentials.clone();
    let limits = spec.limits.clone();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (setrlimit, setgroups, setgid, setuid) on data
    // prepared before the fork; it does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            let set = |r, v: u64| setrlimit(r, v, v).map_err(io::Error::from);
            // A crashing probe must not fill the disk with cores.
            set(Rlimit::RLIMIT_CORE, 0)?;
            if let Some(cpu) = limits.cpu {
                set(Rlimit::RLIMIT_CPU, cpu.as_secs().max(1))?;
            }
            if let Some(bytes) = limits.address_space {
                set(Rlimit::RLIMIT_AS, bytes)?;
            }
            if let Some(n) = limits.open_files {
                set(Rlimit::RLIMIT_NOFILE, n)?;
            }
            if let Some(n) = limits.processes {
                set(Rlimit::RLIMIT_NPROC, n)?;
            }
            if let Some(c) = &creds {
                // Order matters: groups and gid while still privileged, uid last.
                nix::unistd::setgroups(&c.groups).map_err(io::Error::from)?;
                nix::unistd::setgid(c.gid).map_err(io::Error::from)?;
                nix::unistd::setuid(c.uid).map_err(io::Error::from)?;
            }
            Ok(())
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    // If the agent drops a run (shutdown), the child must not outlive it.
    cmd.kill_on_drop(true);
    cmd
}

pub(crate) fn exit_of(status: ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Code(-1),
    }
}

/// A child started in its own process group. Dropping it kills the leader (tokio reaps it
/// later) and then the whole group; the registration tells the orphan reaper to keep its
/// hands off a pid that tokio will wait for.
pub struct Spawned {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub pgid: Pid,
    pub group: GroupGuard,
    pub registered: super::reaper::Registered,
}

/// Start the child (own group, credentials, limits, cleared env, stdin /dev/null, stdout and
/// stderr piped). Shared by the exec and stream kinds.
pub fn spawn(spec: &ChildSpec) -> Result<Spawned, SpawnError> {
    let mut cmd = build_command(spec);
    let (child, registered) =
        super::reaper::spawn_registered(&mut cmd).map_err(|source| SpawnError {
            program: spec.program.display().to_string(),
            source,
        })?;
    let pid = child.id().unwrap_or(0);
    let pgid = Pid::from_raw(pid as i32);
    Ok(Spawned {
        child,
        pid,
        pgid,
        group: GroupGuard(pgid),
        registered,
    })
}

/// Make the agent the reaper of its probes' orphans: a probe's backgrounded grandchild whose
/// parent exited is reparented to the agent (not to init), so it stays visible and is reaped
/// here instead of piling up as a zombie under some other process. Call once, inside the
/// tokio runtime, at daemon / `--once` / `probe` start. It also starts the orphan reaper task.
pub fn become_subreaper() -> io::Result<()> {
    super::reaper::become_subreaper()
}

/// Run the child to completion or to its deadline. Never waits on a pipe past
/// deadline + grace + a short drain.
pub async fn run(spec: &ChildSpec) -> Result<ChildOutcome, SpawnError> {
    let start = Instant::now();
    let Spawned {
        mut child,
        pid,
        pgid,
        group,
        registered,
    } = spawn(spec)?;
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let mut out = Capped {
        buf: Vec::new(),
        cap: spec.stdout_cap,
        overflow: false,
    };
    let mut err = Tail::new(spec.stderr_tail);
    let mut out_chunk = vec![0u8; 8192];
    let mut err_chunk = vec![0u8; 4096];
    let mut status: Option<ExitStatus> = None;
    #[derive(PartialEq)]
    enum Phase {
        Running,
        Terminating,
        Killed,
    }
    let mut phase = Phase::Running;
    let mut timed_out = false;
    let mut exited_before_deadline = false;
    let mut next_step = start + spec.timeout;

    loop {
        if status.is_some() && out_pipe.is_none() && err_pipe.is_none() {
            break;
        }
        tokio::select! {
            r = read_opt(&mut out_pipe, &mut out_chunk) => match r {
                Ok(0) | Err(_) => out_pipe = None,
                Ok(n) => {
                    let room = out.cap.saturating_sub(out.buf.len());
                    out.buf.extend_from_slice(&out_chunk[..n.min(room)]);
                    if n > room && !out.overflow {
                        out.overflow = true;
                        if phase == Phase::Running {
                            signal_group(pgid, Signal::SIGTERM);
                            phase = Phase::Terminating;
                            next_step = Instant::now() + spec.grace;
                        }
                    }
                }
            },
            r = read_opt(&mut err_pipe, &mut err_chunk) => match r {
                Ok(0) | Err(_) => err_pipe = None,
                Ok(n) => err.push(&err_chunk[..n]),
            },
            s = child.wait(), if status.is_none() => {
                status = s.ok();
                if status.is_none() {
                    // wait() itself failed: nothing more to learn about the child.
                    status = Some(std::os::unix::process::ExitStatusExt::from_raw(-1i32 << 8));
                }
                if phase == Phase::Running {
                    exited_before_deadline = true;
                }
            },
            _ = sleep_until(next_step) => match phase {
                Phase::Running => {
                    timed_out = true;
                    signal_group(pgid, Signal::SIGTERM);
                    phase = Phase::Terminating;
                    next_step = Instant::now() + spec.grace;
                }
                Phase::Terminating => {
                    signal_group(pgid, Signal::SIGKILL);
                    phase = Phase::Killed;
                    next_step = Instant::now() + AFTER_KILL_DRAIN;
                }
                Phase::Killed => break,
            },
        }
    }
    // Whatever is left of the group goes now, before the leader is reaped below.
    drop(group);
    let exit = match status {
        Some(s) => exit_of(s),
        None => match child.try_wait() {
            Ok(Some(s)) => exit_of(s),
            _ => {
                // Stuck in the kernel; reap it whenever it comes back, off this run.
                tokio::spawn(async move {
                    let _ = child.wait().await;
                    drop(registered);
                });
                Exit::Unreaped
            }
        },
    };
    let killed = phase == Phase::Killed;
    let ending = if out.overflow {
        Ending::OutputOverflow { killed }
    } else if timed_out {
        Ending::TimedOut {
            killed,
            exited_before_deadline,
        }
    } else {
        Ending::Finished
    };
    Ok(ChildOutcome {
        pid,
        exit,
        ending,
        stdout: out.buf,
        stderr_tail: err.buf,
        stderr_total: err.total,
        duration: start.elapsed(),
    })
}
