//! The one child engine for exec and stream probes: start a child (own process group, its
//! probe's cgroup, credentials, limits, cleared environment, stdin /dev/null or a pipe for
//! [`Tick`]s (`stdin.rs`), stdout a pipe or a pty (`pty.rs`), stderr a pipe), read its output
//! with one [`Reader`], end it with one termination routine, and say how it ended with one
//! [`Ending`]. Each item has one name, `child::`'s: its submodules are private.
//!
//! Never waits on a pipe after the deadline: a backgrounded grandchild can hold it open
//! forever. The deadline ends the whole group (SIGTERM, a grace period during which output is
//! still drained, then SIGKILL and `cgroup.kill`).

mod capture;
mod drive;
mod output;
mod pty;
mod spawn;
mod stdin;

use std::ffi::{CString, OsString};
use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Pid, Uid};
use tokio::io::unix::AsyncFd;
use tokio::time::{sleep_until, Instant};

pub use capture::{CaptureReader, Captured, CAPTURE_CAP};
pub use drive::{drive, AfterExit, Driven, Ended, Event, Flow, Ticks, Watch};
pub use output::{Got, Reader, Tail};
pub use spawn::{CloneCall, Stage, CAPTURE_FD, STACKS_KEPT};
pub use stdin::{Tick, TickWriter};

use super::cgroup::{ProbeCgroup, RunCgroup};
use super::fd;
use super::path::PROBE_PATH;
use super::reaper::{self, Registered};
use crate::config::{Limits, StdoutMode};

pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);
pub const DEFAULT_STDOUT_CAP: usize = 64 * 1024;
pub const DEFAULT_STDERR_TAIL: usize = 4 * 1024;
/// After SIGKILL, how long pipes may still be drained before we stop waiting on them: only a
/// process outside the group and the cgroup can still hold them, and we do not wait for it.
pub const AFTER_KILL_DRAIN: Duration = Duration::from_millis(200);

/// Who a child runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub uid: Uid,
    pub gid: Gid,
    pub groups: Vec<Gid>,
    /// `groups` as setgroups(2) takes them, made with them ([`Credentials::new`]): a run
    /// shares them, it does not convert them again.
    setgroups: Arc<[libc::gid_t]>,
}

impl Credentials {
    /// Look a user up and collect its supplementary groups, as login would.
    pub fn resolve(user: &str) -> Result<Self, UserError> {
        let pw = nix::unistd::User::from_name(user)
            .map_err(|e| UserError::Lookup(user.to_owned(), e))?
            .ok_or_else(|| UserError::NoSuchUser(user.to_owned()))?;
        let cname = CString::new(user).map_err(|_| UserError::BadName(user.to_owned()))?;
        let groups = nix::unistd::getgrouplist(&cname, pw.gid)
            .map_err(|e| UserError::Groups(user.to_owned(), e))?;
        Ok(Self::new(user.to_owned(), pw.uid, pw.gid, groups))
    }

    pub fn new(user: String, uid: Uid, gid: Gid, groups: Vec<Gid>) -> Self {
        Self {
            setgroups: groups.iter().map(|g| g.as_raw()).collect(),
            user,
            uid,
            gid,
            groups,
        }
    }

    /// The supplementary groups as setgroups(2) takes them.
    pub fn raw_groups(&self) -> Arc<[libc::gid_t]> {
        self.setgroups.clone()
    }
}

/// Why a probe's user cannot be looked up (the user's name first in each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    #[error("cannot look up user {0:?}: {1}")]
    Lookup(String, nix::Error),
    #[error("no such user {0:?}")]
    NoSuchUser(String),
    #[error("bad user name {0:?}")]
    BadName(String),
    #[error("cannot list groups of {0:?}: {1}")]
    Groups(String, nix::Error),
}

/// A child's whole environment: its pairs (shown by `probe NAME`) and the `NAME=value`
/// strings its exec takes, made once and shared: a probe's runs reuse them.
#[derive(Debug, Clone)]
pub struct Env {
    pairs: Arc<[(String, String)]>,
    /// `None` where a name or value holds a NUL byte: the spawn says so.
    envp: Option<Arc<[CString]>>,
}

impl Env {
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        let envp = pairs
            .iter()
            .map(|(k, v)| {
                // One allocation each: NAME=value and the NUL CString adds, sized up front.
                let mut kv = Vec::with_capacity(k.len() + v.len() + 2);
                kv.extend_from_slice(k.as_bytes());
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .collect();
        Self {
            pairs: pairs.into(),
            envp,
        }
    }

    /// `PATH` (the probes' fixed one) and nothing else: a new `ChildSpec`'s, made once.
    pub fn path_only() -> Self {
        static PATH_ONLY: OnceLock<Env> = OnceLock::new();
        PATH_ONLY
            .get_or_init(|| Self::new(vec![("PATH".to_owned(), PROBE_PATH.to_owned())]))
            .clone()
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }
}

/// What a child is started with. Cheap to clone (its strings are shared), so a probe can keep
/// one made at its first run and start each run from a copy.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub program: Arc<Path>,
    /// `program` as the script rule passed it, held open: the child executes this descriptor,
    /// not the path (`None`: the path, where the rule is not enforced).
    pub checked: Option<super::security::CheckedProgram>,
    pub args: Arc<[OsString]>,
    /// The whole environment (`NAME`, `value`), shared with the run's record.
    pub env: Env,
    pub cwd: Arc<Path>,
    /// `None`: run as the agent's own user.
    pub credentials: Option<Arc<Credentials>>,
    pub limits: Limits,
    /// `PR_SET_NO_NEW_PRIVS`: setuid binaries do not raise the probe's privileges.
    pub no_new_privs: bool,
    /// The probe's cgroup, where containment is on.
    pub cgroup: Option<Arc<ProbeCgroup>>,
    pub timeout: Duration,
    pub grace: Duration,
    pub stdout_cap: usize,
    pub stderr_tail: usize,
    /// A pipe (the default) or a pseudo-terminal.
    pub stdout: StdoutMode,
    /// A pipe the agent writes ticks to ([`Child::tick`]); else /dev/null.
    pub stdin_pipe: bool,
    /// A capture pipe on [`spawn::CAPTURE_FD`] (`capture:`), read by [`run`] into
    /// [`ChildOutcome::captured`].
    pub capture: bool,
    /// clone3 where the kernel has it (the default), or clone(2).
    pub clone_call: CloneCall,
    /// `program`, `args`, `env` and `cwd` as the exec takes them, made by
    /// [`ChildSpec::prepare`]; `None`: made at each start.
    exec_args: Option<Arc<spawn::ExecArgs>>,
}

impl ChildSpec {
    pub fn new(program: impl AsRef<Path>, timeout: Duration) -> Self {
        Self {
            program: program.as_ref().into(),
            checked: None,
            args: Arc::new([]),
            env: Env::path_only(),
            cwd: Path::new("/").into(),
            credentials: None,
            limits: Limits::default(),
            no_new_privs: true,
            cgroup: None,
            timeout,
            grace: DEFAULT_GRACE,
            stdout_cap: DEFAULT_STDOUT_CAP,
            stderr_tail: DEFAULT_STDERR_TAIL,
            stdout: StdoutMode::Pipe,
            stdin_pipe: false,
            capture: false,
            clone_call: CloneCall::default(),
            exec_args: None,
        }
    }

    /// Make the strings and pointer arrays the exec takes now, once, for every child
    /// started from this spec or a clone of it (a probe's runs): `program`, `args`, `env`
    /// and `cwd` must not change after this (a spec that needs others is made anew).
    pub fn prepare(&mut self) -> io::Result<()> {
        self.exec_args = Some(Arc::new(self.exec_args()?));
        Ok(())
    }

    fn exec_args(&self) -> io::Result<spawn::ExecArgs> {
        let path = c_string(self.program.as_os_str().as_bytes(), "the program")?;
        let argv = std::iter::once(Ok(path.clone()))
            .chain(
                self.args
                    .iter()
                    .map(|a| c_string(a.as_bytes(), "an argument")),
            )
            .collect::<io::Result<Vec<_>>>()?;
        let envp = (self.env.envp.clone()).ok_or_else(|| holds_nul("an environment variable"))?;
        let cwd = c_string(self.cwd.as_os_str().as_bytes(), "the directory")?;
        Ok(spawn::ExecArgs::new(path, argv, envp, cwd))
    }
}

/// How the child process itself ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Still not reaped after SIGKILL (uninterruptible sleep, e.g. a hung NFS mount); a
    /// background task reaps it when the kernel lets it go.
    Unreaped,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited with status {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {}", signal_name(*s)),
            Exit::Unreaped => f.write_str("did not exit"),
        }
    }
}

pub fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.as_str().to_owned())
}

/// How a run ended, as the engine saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exited and closed its output before the deadline.
    Finished,
    /// The deadline passed; the group got SIGTERM (and SIGKILL if `killed`).
    TimedOut {
        after: Duration,
        killed: bool,
        exited_before_deadline: bool,
    },
    /// Wrote more than the stdout cap; the group was ended at once.
    OutputOverflow { cap: usize, killed: bool },
}

impl Ending {
    pub fn is_timeout(&self) -> bool {
        matches!(self, Ending::TimedOut { .. })
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Finished => f.write_str("finished"),
            Ending::TimedOut {
                after,
                killed,
                exited_before_deadline,
            } => {
                let what = if *exited_before_deadline {
                    "exited, but a background process kept its output open"
                } else {
                    "did not finish"
                };
                let how = if *killed {
                    "killed after SIGTERM grace"
                } else {
                    "terminated"
                };
                write!(
                    f,
                    "timed out after {}: {what}; process group {how}",
                    humantime::format_duration(*after)
                )
            }
            Ending::OutputOverflow { cap, .. } => write!(f, "output exceeds {cap} bytes"),
        }
    }
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
    /// What the stand-ins wrote on the capture pipe, with [`ChildSpec::capture`].
    pub captured: Option<Captured>,
}

impl ChildOutcome {
    pub fn succeeded(&self) -> bool {
        self.ending == Ending::Finished && self.exit == Exit::Code(0)
    }

    pub fn stderr_text(&self) -> String {
        Tail {
            buf: self.stderr_tail.clone(),
            keep: self.stderr_tail.len(),
            total: self.stderr_total,
        }
        .text()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start {program}: {}{}", stage_prefix(*.stage), why.as_ref().map_or_else(|| source.to_string(), |w| format!("{w} (the kernel said: {source})")))]
pub struct SpawnError {
    pub program: String,
    pub stage: Option<Stage>,
    #[source]
    pub source: io::Error,
    /// What the kernel's errno means for this file (a script with CRLF line endings, a `#!`
    /// interpreter that is missing), where it can be told: said instead of the errno.
    pub why: Option<super::security::NotRunnable>,
}

fn stage_prefix(stage: Option<Stage>) -> String {
    match stage {
        None | Some(Stage::Exec) => String::new(),
        Some(s) => format!("{} failed: ", s.as_str()),
    }
}

pub(crate) fn signal_group(pgid: Pid, sig: Signal) {
    // Never 0 or 1: killpg(0) would signal the agent's own group.
    if pgid.as_raw() > 1 {
        // ESRCH: the group is already gone, which is what we wanted.
        let _ = killpg(pgid, sig);
    }
}

/// Signal the group a child of ours leads, or the child alone before it has made its group.
/// For an unreaped child only (its pid is ours until reaped, so never a stranger's). Its
/// group exists from its `setsid` on and, its zombie included, as long as it is unreaped: a
/// missing group (ESRCH) means a child started without the vfork wait that has not reached
/// its `setsid` yet. Its signals are blocked until just before its exec, and by then its
/// dispositions are the defaults: it gets the signal as a probe would.
fn signal_run(pid: Pid, sig: Signal) {
    if pid.as_raw() > 1 && killpg(pid, sig) == Err(nix::errno::Errno::ESRCH) {
        let _ = nix::sys::signal::kill(pid, sig);
    }
}

/// How the exit of a child is noticed: its pidfd turns readable, or (kernels before 5.3)
/// SIGCHLD arrives.
enum ExitWatch {
    Pidfd(AsyncFd<OwnedFd>),
    Sigchld(tokio::signal::unix::Signal),
}

/// A started child. Its zombie is reaped only when the run ends: until then its pid and
/// process group cannot be reused, so signalling the group can never hit a stranger.
pub struct Child {
    pub pid: u32,
    pgid: Pid,
    watch: ExitWatch,
    exit: Option<Exit>,
    reaped: bool,
    /// The rest of the run was ended after the leader exited: nothing of it is left to end
    /// (so the end of a run and the drop of its child signal the group once, not twice).
    ended: bool,
    /// The run's own leaf of its probe's cgroup.
    cgroup: Option<RunCgroup>,
    registered: Option<Registered>,
    /// The agent's end of the child's stdin, with `stdin_pipe`.
    stdin: Option<TickWriter>,
    /// The agent's end of the capture pipe, with [`ChildSpec::capture`], until taken.
    capture: Option<OwnedFd>,
    /// What the child runs on until its exec, where it was started without the vfork wait
    /// (an exec run, [`run`]); its failure before the exec is read from here at its exit.
    launch: spawn::InFlight,
}

/// The stdin of a child without a stdin pipe. Process-wide: one read-only descriptor of a
/// device, no agent's configuration or state, never changed once open.
fn dev_null() -> io::Result<&'static OwnedFd> {
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd);
    }
    let fd = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let fd = fd::above_stdio(fd)?;
    Ok(NULL.get_or_init(|| fd))
}

fn c_string(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| holds_nul(what))
}

/// Why `what` cannot be handed to execve.
fn holds_nul(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what} contains a NUL byte"),
    )
}

fn rlimits(limits: &Limits) -> spawn::Rlimits {
    // Soft and hard alike: what `limits:` sets, the probe may not raise again.
    let both = |resource: libc::c_int, v: u64| (resource, v, v);
    // A crashing probe must not fill the disk with cores.
    let core = Some(both(libc::RLIMIT_CORE as libc::c_int, 0));
    // Without `open_files:`, the soft limit the agent was started with, not the one it
    // raised itself to (super::open_files); the hard limit stays.
    let open_files = match limits.open_files {
        Some(n) => Some(both(libc::RLIMIT_NOFILE as libc::c_int, n)),
        None => super::open_files::for_children()
            .map(|(soft, hard)| (libc::RLIMIT_NOFILE as libc::c_int, soft, hard)),
    };
    let set = [
        core,
        limits
            .cpu
            .map(|cpu| both(libc::RLIMIT_CPU as libc::c_int, cpu.as_secs().max(1))),
        limits
            .address_space
            .map(|bytes| both(libc::RLIMIT_AS as libc::c_int, bytes)),
        open_files,
        limits
            .processes
            .map(|n| both(libc::RLIMIT_NPROC as libc::c_int, n)),
    ];
    spawn::Rlimits::new(set.into_iter().flatten())
}

/// The agent's end of a pty, non-blocking (the reader registers it with the reactor only
/// when a read would wait; its pipes are made non-blocking by `pipe2`).
fn nonblocking(fd: OwnedFd) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(fd)
}

/// Why `spec`'s child could not be started, at `stage` (`None`: before the clone).
fn spawn_error(spec: &ChildSpec, stage: Option<Stage>, source: io::Error) -> SpawnError {
    SpawnError {
        program: spec.program.display().to_string(),
        why: matches!(stage, Some(Stage::Exec))
            .then(|| super::security::why_exec_failed(&spec.program, &source))
            .flatten(),
        stage,
        source,
    }
}

impl Child {
    /// Start `spec`'s child; its output is read through the returned [`Reader`]. A failure
    /// before the child's exec is returned here (the cloning thread waits for the exec).
    pub fn start(spec: &ChildSpec) -> Result<(Child, Reader), SpawnError> {
        Self::start_reporting(spec, spawn::Report::AtSpawn)
    }

    /// As [`Child::start`]; with [`spawn::Report::AtExit`] the cloning thread does not wait
    /// for the exec, and a failure before it is known at the child's exit
    /// ([`Child::failed_before_exec`]).
    fn start_reporting(
        spec: &ChildSpec,
        report: spawn::Report,
    ) -> Result<(Child, Reader), SpawnError> {
        let fail = |stage: Option<Stage>, source: io::Error| spawn_error(spec, stage, source);
        let io_fail = |e: io::Error| fail(None, e);
        let exec = match &spec.exec_args {
            Some(made) => made.clone(),
            None => Arc::new(spec.exec_args().map_err(io_fail)?),
        };
        // The agent's ends of the output pipes are non-blocking (it reads them, registering
        // them with the reactor only when a read would wait); the child's are made blocking
        // again in the child. The pty's master is made non-blocking here.
        let (out_read, out_write) = match spec.stdout {
            StdoutMode::Pipe => fd::pipe_nonblocking(),
            StdoutMode::Pty => {
                pty::open().and_then(|(master, slave)| Ok((nonblocking(master)?, slave)))
            }
        }
        .map_err(io_fail)?;
        let (err_read, err_write) = fd::pipe_nonblocking().map_err(io_fail)?;
        let stdin = if spec.stdin_pipe {
            let (read, write) = fd::pipe().map_err(io_fail)?;
            Some((read, TickWriter::new(write).map_err(io_fail)?))
        } else {
            None
        };
        let null = dev_null().map_err(io_fail)?;
        // A leaf of its own: whatever an ending run of the same probe kills, it is not this.
        let cgroup = spec
            .cgroup
            .as_ref()
            .map(ProbeCgroup::checkout)
            .transpose()
            .map_err(|e| fail(Some(Stage::JoinCgroup), e.into()))?;
        // The checked program's descriptor (a binary's), on one above 0-2: the stdio the
        // child dup3s there must not land on it.
        let checked = spec.checked.as_ref().filter(|c| !c.script);
        // Nor on the capture descriptor, which the child's dup3 would replace before the exec.
        let in_the_way = |fd: i32| fd <= 2 || (spec.capture && fd == spawn::CAPTURE_FD);
        let moved_up = match checked {
            Some(c) if in_the_way(std::os::fd::AsRawFd::as_raw_fd(&*c.fd)) => Some(
                c.fd.try_clone()
                    .and_then(|fd| fd::above(fd, spawn::CAPTURE_FD + 1))
                    .map_err(io_fail)?,
            ),
            _ => None,
        };
        let capture = match spec.capture {
            true => Some(fd::pipe_nonblocking().map_err(io_fail)?),
            false => None,
        };
        let exec_fd = checked.map(|c| moved_up.as_ref().unwrap_or(&c.fd));
        let child_stdin = stdin.as_ref().map_or(null, |(read, _)| read);
        let watch_sigchld = || {
            reaper::accept_child_signals();
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        };
        let prepared = spawn::Prepared::new(spawn::Plan {
            exec,
            credentials: spec
                .credentials
                .as_ref()
                .map(|c| (c.uid.as_raw(), c.gid.as_raw(), c.raw_groups())),
            rlimits: rlimits(&spec.limits),
            no_new_privs: spec.no_new_privs,
            stdio: [child_stdin, &out_write, &err_write],
            unblock: [false, spec.stdout == StdoutMode::Pipe, true],
            cgroup: cgroup.as_ref().and_then(RunCgroup::spawn_dir),
            exec_fd,
            capture: capture.as_ref().map(|(_, write)| write),
            clone_call: spec.clone_call,
            share_table: spec.stdout == StdoutMode::Pipe,
        });
        let ((started, mut launch), registered) = reaper::start_registered(|| {
            spawn::spawn(prepared, report).map(|s| {
                let pid = s.0.pid;
                (s, pid)
            })
        })
        .map_err(|e| fail(Some(e.stage), e.error))?;
        // The child's ends: held here, a pipe (or the pty) would never report its end. Where
        // the child shares the agent's descriptor table until its first call unshares it,
        // they are kept (with the checked program's descriptor) until it has exec'd or
        // exited ([`spawn::InFlight::let_go`]); else the child has its own copies already
        // and they are closed now.
        use spawn::HeldFd;
        let stdin = stdin.map(|(read, writer)| {
            launch.hold(HeldFd::Own(read));
            writer
        });
        launch.hold(HeldFd::Own(out_write));
        launch.hold(HeldFd::Own(err_write));
        let capture = capture.map(|(read, write)| {
            launch.hold(HeldFd::Own(write));
            read
        });
        match (moved_up, checked) {
            (Some(fd), _) => launch.hold(HeldFd::Own(fd)),
            (None, Some(c)) => launch.hold(HeldFd::Shared(c.fd.clone())),
            (None, None) => {}
        }
        let pid = Pid::from_raw(started.pid);
        let watch = match started.pidfd {
            Some(fd) => spawn::watch_pidfd(fd).map(ExitWatch::Pidfd),
            None => watch_sigchld().map(ExitWatch::Sigchld),
        };
        let reader = Reader::new(out_read, err_read, spec.stdout_cap, spec.stderr_tail);
        match watch {
            Ok(watch) => Ok((
                Child {
                    pid: started.pid as u32,
                    pgid: pid,
                    watch,
                    exit: None,
                    reaped: false,
                    ended: false,
                    cgroup,
                    registered: Some(registered),
                    stdin,
                    capture,
                    launch,
                },
                reader,
            )),
            Err(e) => {
                // Cannot supervise it: it must not run unsupervised.
                signal_run(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                drop(registered);
                Err(io_fail(e))
            }
        }
    }

    pub fn exited(&self) -> bool {
        self.exit.is_some()
    }

    /// The agent's end of the capture pipe (once), with [`ChildSpec::capture`].
    pub fn take_capture(&mut self) -> Option<OwnedFd> {
        self.capture.take()
    }

    pub fn exit(&self) -> Option<Exit> {
        self.exit
    }

    /// Wait until the child exits (cancel-safe). With a pidfd the status is looked at only
    /// once the pidfd says the child has exited, not also before: a run's first look would
    /// almost always find it still running (one `waitid` a run saved).
    pub async fn wait(&mut self) -> Exit {
        let exit = self.wait_exit().await;
        self.launch.let_go(true);
        exit
    }

    /// What [`Child::wait`] held for a child that shares the agent's descriptor table goes
    /// once it has exec'd: called at each turn of the driver, so a long run's pipes report
    /// their end when the child's copies close, not only after its exit.
    pub fn let_go_if_exec(&mut self) {
        self.launch.let_go(self.exit.is_some());
    }

    async fn wait_exit(&mut self) -> Exit {
        loop {
            if let Some(e) = self.exit {
                return e;
            }
            let Child {
                watch,
                pgid,
                reaped,
                exit,
                ..
            } = self;
            match watch {
                ExitWatch::Pidfd(fd) => match fd.readable().await {
                    Ok(mut ready) => {
                        if let Some(e) = peek_exit(*pgid, reaped, exit) {
                            return e;
                        }
                        ready.clear_ready();
                    }
                    Err(_) => {
                        if let Some(e) = peek_exit(*pgid, reaped, exit) {
                            return e;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                ExitWatch::Sigchld(s) => {
                    if let Some(e) = peek_exit(*pgid, reaped, exit) {
                        return e;
                    }
                    s.recv().await;
                }
            }
        }
    }

    /// Send one `stdin: signal` tick; [`Tick::Closed`] where the child has no stdin pipe.
    pub fn tick(&self) -> Tick {
        self.stdin.as_ref().map_or(Tick::Closed, TickWriter::send)
    }

    /// Write `bytes` to the child's stdin pipe (a goodbye), never blocking.
    pub fn say(&self, bytes: &[u8]) -> Tick {
        self.stdin.as_ref().map_or(Tick::Closed, |w| w.write(bytes))
    }

    pub fn signal_group(&self, sig: Signal) {
        if self.reaped {
            signal_group(self.pgid, sig);
        } else {
            signal_run(self.pgid, sig);
        }
    }

    /// The child failed before its exec (and exited 127), where it was started without the
    /// vfork wait; known once it has exited.
    fn failed_before_exec(&self) -> Option<spawn::ChildFailed> {
        self.launch.failure()
    }

    /// Whatever is left of the run goes: SIGKILL to the group, `cgroup.kill` to the cgroup
    /// (which catches what left the group). Then the leader is reaped if it has exited.
    pub fn end_rest(&mut self) {
        if self.ended {
            return;
        }
        self.signal_group(Signal::SIGKILL);
        if let Some(cg) = &mut self.cgroup {
            cg.kill();
        }
        if self.exit.is_some() {
            if !self.reaped {
                let _ = waitpid(self.pgid, Some(WaitPidFlag::WNOHANG));
                self.reaped = true;
            }
            self.ended = true;
        }
    }

    /// Read output and wait for the exit until both are done or `within` passes; `true` if
    /// both are done.
    async fn settle(&mut self, reader: &mut Reader, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if self.exit.is_some() && !reader.open() {
                return true;
            }
            tokio::select! {
                _ = reader.next(), if reader.open() => {}
                _ = self.wait(), if self.exit.is_none() => {}
                _ = sleep_until(until) => return false,
            }
        }
    }

    /// The one termination routine: SIGTERM to the group, output still read during `grace`,
    /// then SIGKILL to the group and `cgroup.kill`, and a last short drain. Returns whether
    /// the SIGKILL was needed. The rest of the run is ended with [`Child::end_rest`] after.
    pub async fn terminate(&mut self, reader: &mut Reader, grace: Duration) -> bool {
        self.signal_group(Signal::SIGTERM);
        if self.settle(reader, grace).await {
            return false;
        }
        self.end_rest();
        self.settle(reader, AFTER_KILL_DRAIN).await;
        true
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.end_rest();
        self.launch.let_go(self.exit.is_some());
        if self.reaped {
            return;
        }
        // Killed above; reap it now if it is already gone, else whenever the kernel lets it.
        if matches!(waitpid(self.pgid, Some(WaitPidFlag::WNOHANG)), Ok(s) if s != WaitStatus::StillAlive)
        {
            return;
        }
        let pid = self.pgid;
        let registered = self.registered.take();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn_blocking(move || {
                let _ = waitpid(pid, None);
                drop(registered);
            });
        }
        // Without a runtime the registration goes now and the orphan reaper reaps it.
    }
}

/// The leader's exit status without reaping it (the zombie keeps the pid and group the
/// agent's); `None` while it runs.
fn peek_exit(pgid: Pid, reaped: &mut bool, exit: &mut Option<Exit>) -> Option<Exit> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    let found = match waitid(Id::Pid(pgid), flags) {
        Ok(WaitStatus::Exited(_, code)) => Exit::Code(code),
        Ok(WaitStatus::Signaled(_, sig, _)) => Exit::Signal(sig as i32),
        Ok(_) => return None,
        Err(nix::errno::Errno::EINTR) => return None,
        // Nobody else may reap it; if it is gone all the same, nothing more is known.
        Err(_) => {
            *reaped = true;
            Exit::Code(-1)
        }
    };
    *exit = Some(found);
    Some(found)
}

/// Run the child to completion or to its deadline. Never waits on a pipe past
/// deadline + grace + a short drain.
pub async fn run(spec: &ChildSpec) -> Result<ChildOutcome, SpawnError> {
    let mut first = true;
    let start = Instant::now();
    // One body, not a retrying wrapper around it: the run path's code keeps its names, which
    // link/steady-text.ld places together.
    let (child, mut reader, driven, capture) = loop {
        let (mut child, mut reader) = Child::start_reporting(spec, spawn::Report::AtExit)?;
        let watch = Watch::run_until(start + spec.timeout, spec.grace);
        let mut capture = child
            .take_capture()
            .and_then(|fd| CaptureReader::new(fd, CAPTURE_CAP).ok());
        let driven = {
            let driving = drive(&mut child, &mut reader, &watch, |_| Flow::Continue);
            match &mut capture {
                None => driving.await,
                // Read beside the run, so that a stand-in never waits on a full pipe.
                Some(c) => {
                    tokio::pin!(driving);
                    loop {
                        tokio::select! {
                            driven = &mut driving => break driven,
                            () = c.next(), if c.open() => {}
                        }
                    }
                }
            }
        };
        match child.failed_before_exec() {
            // The child could not leave the descriptor table it shared with the agent (a
            // seccomp filter refusing `close_range` and `unshare`: it exited at its first
            // call). The spawn has learnt that; the run starts again, its child copying it.
            Some(failed) if failed.stage == Stage::Unshare && std::mem::take(&mut first) => {}
            Some(failed) => return Err(spawn_error(spec, Some(failed.stage), failed.error)),
            None => break (child, reader, driven, capture),
        }
    };
    let captured = capture.map(|mut c| {
        c.drain_now();
        c.finish()
    });
    let ending = match driven.ended {
        Ended::Overflow => Ending::OutputOverflow {
            cap: spec.stdout_cap,
            killed: driven.killed,
        },
        Ended::Deadline | Ended::Cancelled | Ended::Stopped => Ending::TimedOut {
            after: spec.timeout,
            killed: driven.killed,
            exited_before_deadline: driven.exited_before_end,
        },
        Ended::Exited => Ending::Finished,
    };
    Ok(ChildOutcome {
        pid: child.pid,
        exit: child.exit().unwrap_or(Exit::Unreaped),
        ending,
        stdout: std::mem::take(&mut reader.stdout),
        stderr_tail: std::mem::take(&mut reader.stderr.buf),
        stderr_total: reader.stderr.total,
        duration: start.elapsed(),
        captured,
    })
}
