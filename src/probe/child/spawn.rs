//! Starting a child without copying the agent's address space: the only `unsafe` of the child
//! engine lives here.
//!
//! The child is created with `CLONE_VM | CLONE_VFORK` (clone3 where the kernel has it, with
//! `CLONE_PIDFD`, and `CLONE_INTO_CGROUP` when the probe has a cgroup): it shares the agent's
//! memory until it calls `execve`, and the cloning thread sleeps until then. No page is
//! write-protected and no copy-on-write fault follows, however large the agent is — that is
//! what std's `fork()` path (any `pre_exec`) costs a multi-threaded process.
//!
//! Rules the child side keeps, as glibc's and musl's `posix_spawn` and Go's
//! `forkAndExecInChild1` do:
//! - It runs on its own small stack (mmap'd once per thread, with a guard page), never on the
//!   parent's: the parent's frames stay intact for when it resumes.
//! - It makes only raw system calls on data prepared before the clone ([`Prepared`]): no
//!   allocation, no lock, no libc wrapper that touches process-wide state. In particular the
//!   credential calls are raw `setgroups` / `setresgid` / `setresuid`: glibc's wrappers
//!   broadcast the change to every thread of the process, which here are the agent's.
//! - Every signal is blocked in the parent around the clone, so no handler of the agent's can
//!   run on the child's stack; the child resets every disposition to the default and then
//!   unblocks everything (a probe starts with an empty mask).
//! - The child starts a session of its own (`setsid`): its own process group, and no
//!   controlling terminal, whoever started the agent from which terminal.
//! - Everything the parent opened for the child is close-on-exec, and the child marks every
//!   descriptor above 2 close-on-exec (`close_range`), so a probe sees only 0, 1 and 2 whatever
//!   the agent inherited; and [`CAPTURE_FD`] for a probe with `capture:`.
//! - A failure before `execve` succeeds is stored as (stage, errno) in [`Prepared`], the
//!   memory the child shares with the agent, and the child exits 127; the parent reads it
//!   after the clone returns (with `CLONE_VFORK` the child has then either exec'd or exited),
//!   as glibc's `posix_spawn` does: no pipe to make, read and close for every run.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

/// The descriptor a probe with `capture:` inherits: the write end of the pipe its stand-ins
/// report on. A single digit, since dash redirects only those (`printf ... >&7`); not 3,
/// which scripts juggle stdout with (`exec 3>&1`), nor 9, the usual `flock` descriptor.
pub const CAPTURE_FD: c_int = 7;
/// Which system call starts a child: a value of its spec, not a switch of the process, so that
/// one child can take the clone(2) path while others beside it take clone3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloneCall {
    /// clone3 where the kernel takes it (learnt once per process), else clone(2).
    #[default]
    Newest,
    /// clone(2), as on a kernel without clone3 (for the tests of that path).
    Legacy,
}

/// Where a child failed before its `execve` succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    SetSid,
    JoinCgroup,
    Redirect,
    Rlimit,
    SetGroups,
    SetGid,
    SetUid,
    NoNewPrivs,
    Chdir,
    CloseFds,
    Exec,
}

impl Stage {
    const ALL: [Stage; 11] = [
        Stage::SetSid,
        Stage::JoinCgroup,
        Stage::Redirect,
        Stage::Rlimit,
        Stage::SetGroups,
        Stage::SetGid,
        Stage::SetUid,
        Stage::NoNewPrivs,
        Stage::Chdir,
        Stage::CloseFds,
        Stage::Exec,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::SetSid => "setsid",
            Stage::JoinCgroup => "joining the probe's cgroup",
            Stage::Redirect => "redirecting stdin/stdout/stderr (and the capture pipe)",
            Stage::Rlimit => "setting a resource limit",
            Stage::SetGroups => "setgroups",
            Stage::SetGid => "setresgid",
            Stage::SetUid => "setresuid",
            Stage::NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
            Stage::Chdir => "chdir",
            Stage::CloseFds => "closing inherited descriptors",
            Stage::Exec => "execve",
        }
    }
}

/// A child that failed before exec: where, and the kernel's errno.
#[derive(Debug)]
pub struct ChildFailed {
    pub stage: Stage,
    pub error: io::Error,
}

/// A program's path, argv and environment as `execve` takes them: NUL-terminated strings and
/// the NULL-terminated pointer arrays into them, built once and shared (a probe's runs reuse
/// one: [`super::ChildSpec::prepare`]), never changed once built.
pub struct ExecArgs {
    path: CString,
    /// Kept alive for `argv_ptrs`.
    _argv: Vec<CString>,
    argv_ptrs: Box<[*const c_char]>,
    _envp: Arc<[CString]>,
    envp_ptrs: Box<[*const c_char]>,
    cwd: CString,
}

// SAFETY: the raw pointers point into the CStrings owned by the same struct (the argv, and
// the environment's `Arc`, which it holds), which are never mutated or freed while it lives;
// nothing is ever written through them, so sharing and sending it between threads is sharing
// and sending immutable strings.
unsafe impl Send for ExecArgs {}
unsafe impl Sync for ExecArgs {}

impl std::fmt::Debug for ExecArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecArgs")
            .field("path", &self.path)
            .field("argv", &self._argv)
            .finish_non_exhaustive()
    }
}

impl ExecArgs {
    pub fn new(path: CString, argv: Vec<CString>, envp: Arc<[CString]>, cwd: CString) -> Self {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Box<[*const c_char]>>()
        };
        Self {
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            path,
            _argv: argv,
            _envp: envp,
            cwd,
        }
    }
}

/// Resource limits a child sets, `(RLIMIT_*, limit)`: at most one of each kind there is
/// (core, cpu, address space, open files, processes), held in place, not allocated per run.
#[derive(Clone, Copy)]
pub struct Rlimits {
    set: [(c_int, libc::rlimit64); Rlimits::MAX],
    len: usize,
}

impl Rlimits {
    pub const MAX: usize = 5;

    /// `limits`: `(RLIMIT_*, value)`, soft and hard limit alike; those past [`Self::MAX`]
    /// are dropped (callers give one of each kind).
    pub fn new(limits: &[(c_int, u64)]) -> Self {
        let none = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let mut set = [(0, none); Self::MAX];
        let len = limits.len().min(Self::MAX);
        for (slot, &(resource, v)) in set.iter_mut().zip(limits) {
            *slot = (
                resource,
                libc::rlimit64 {
                    rlim_cur: v,
                    rlim_max: v,
                },
            );
        }
        Self { set, len }
    }
}

impl<'a> IntoIterator for &'a Rlimits {
    type Item = &'a (c_int, libc::rlimit64);
    type IntoIter = std::slice::Iter<'a, (c_int, libc::rlimit64)>;
    fn into_iter(self) -> Self::IntoIter {
        self.set[..self.len].iter()
    }
}

/// Everything the child reads, built before the clone. The child only reads it.
pub struct Prepared {
    /// The path, argv, environment and working directory (shared, prebuilt).
    exec: Arc<ExecArgs>,
    /// `(uid, gid, supplementary groups)`; `None`: keep the agent's.
    credentials: Option<(libc::uid_t, libc::gid_t, Arc<[libc::gid_t]>)>,
    rlimits: Rlimits,
    no_new_privs: bool,
    /// Descriptors that become 0, 1, 2 (all >= 3, all close-on-exec in the parent).
    stdio: [RawFd; 3],
    /// The run's cgroup directory (for clone3's CLONE_INTO_CGROUP).
    cgroup: Option<RawFd>,
    /// For the clone(2) fallback only: the cgroup's `cgroup.procs`, opened through its
    /// directory just before the clone; the child writes "0" there, which moves the writer.
    join_by_write: Option<OwnedFd>,
    /// See [`Plan::exec_fd`].
    exec_fd: Option<RawFd>,
    /// See [`Plan::capture`].
    capture: Option<RawFd>,
    clone_call: CloneCall,
    /// Highest descriptor to mark close-on-exec one by one where `close_range` is missing.
    max_fd: c_int,
    /// Written by the child when it fails before `execve` succeeds: `(stage + 1) << 32 |
    /// errno`; 0 while nothing failed.
    failure: AtomicU64,
}

/// What a [`Prepared`] is built from: nothing in it is allocated per run but what the caller
/// chose to make per run.
pub struct Plan<'a> {
    pub exec: Arc<ExecArgs>,
    pub credentials: Option<(u32, u32, Arc<[u32]>)>,
    pub rlimits: Rlimits,
    pub no_new_privs: bool,
    pub stdio: [&'a OwnedFd; 3],
    /// The run's cgroup directory, open (`O_PATH` will do).
    pub cgroup: Option<&'a OwnedFd>,
    /// The program the script rule checked, open (>= 3, close-on-exec): executed with
    /// `execveat(fd, "", AT_EMPTY_PATH)` instead of `path`. Binaries only, see
    /// [`super::super::security::CheckedProgram::script`].
    pub exec_fd: Option<&'a OwnedFd>,
    /// The write end of a capture pipe (close-on-exec): the child gets it as [`CAPTURE_FD`].
    /// `exec_fd` must not be [`CAPTURE_FD`] then.
    pub capture: Option<&'a OwnedFd>,
    pub clone_call: CloneCall,
}

impl Prepared {
    pub fn new(plan: Plan<'_>) -> Self {
        // The agent's own limit, which it never changes: looked up once, not per run.
        static MAX_FD: OnceLock<c_int> = OnceLock::new();
        let max_fd = *MAX_FD.get_or_init(|| {
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or(1024, |(soft, _)| soft.min(65_536) as c_int)
        });
        Self {
            exec: plan.exec,
            credentials: plan.credentials,
            rlimits: plan.rlimits,
            no_new_privs: plan.no_new_privs,
            stdio: plan.stdio.map(|f| f.as_raw_fd()),
            cgroup: plan.cgroup.map(AsRawFd::as_raw_fd),
            join_by_write: None,
            exec_fd: plan.exec_fd.map(AsRawFd::as_raw_fd),
            capture: plan.capture.map(AsRawFd::as_raw_fd),
            clone_call: plan.clone_call,
            max_fd,
            failure: AtomicU64::new(0),
        }
    }
}

/// A started child: its pid and, where the kernel gives one, a pidfd (readable once it exits).
pub struct Started {
    pub pid: libc::pid_t,
    pub pidfd: Option<OwnedFd>,
}

const CHILD_STACK: usize = 64 * 1024;
const PAGE: usize = 4096;

/// One child stack per thread: a thread clones one child at a time (it sleeps until that child
/// has exec'd), so a thread's stack is never in use twice at once.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    fn map() -> io::Result<Self> {
        let len = CHILD_STACK + PAGE;
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // The lowest page is the guard: a child overflowing its stack faults instead of
        // writing into the agent's memory. SAFETY: the page belongs to the mapping above.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping the mapping made above, used by nothing yet.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(Self { base, len })
    }

    /// The highest address, 16-byte aligned, where a new stack starts.
    fn top(&self) -> *mut c_void {
        // SAFETY: base + len is one past the end of the mapping, where a downward stack starts.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping is this struct's own; no child runs on it once the thread that
        // owns it is gone (clone returned before the thread could exit).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

thread_local! {
    static STACK_OWNER: std::cell::OnceCell<Stack> = const { std::cell::OnceCell::new() };
}

fn with_stack<T>(f: impl FnOnce(&Stack) -> io::Result<T>) -> io::Result<T> {
    STACK_OWNER.with(|cell| {
        let stack = match cell.get() {
            Some(s) => s,
            None => {
                let s = Stack::map()?;
                cell.get_or_init(|| s)
            }
        };
        f(stack)
    })
}

// What the kernel lacks is a fact about the kernel (and the process's seccomp filter), the
// same for every agent in the process: process-wide, learnt once. The clone stack above is
// per thread by nature (a child runs on its spawning thread's stack until it execs).

/// The kernel refused clone3 once (old kernel, or a seccomp filter): use clone from then on.
static CLONE3_MISSING: AtomicBool = AtomicBool::new(false);
/// The kernel refused `CLONE_PIDFD` on clone: wait by SIGCHLD from then on.
static PIDFD_MISSING: AtomicBool = AtomicBool::new(false);

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args` (version 2, with `cgroup`): the same on every architecture.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Every signal, for `rt_sigprocmask` (the kernel's set is 64 bits on Linux).
const ALL_SIGNALS: u64 = !0;
const NO_SIGNALS: u64 = 0;
const KERNEL_SIGSET_SIZE: usize = 8;

/// Blocks every signal of the calling thread, and restores its mask when dropped.
struct SignalsBlocked(u64);

impl SignalsBlocked {
    fn new() -> Self {
        let mut old: u64 = 0;
        // SAFETY: rt_sigprocmask reads one 8-byte set and writes one, both on our stack.
        // Raw, unlike pthread_sigmask, so glibc's internal signals are blocked too, as in
        // glibc's own posix_spawn.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &ALL_SIGNALS as *const u64,
                &mut old as *mut u64,
                KERNEL_SIGSET_SIZE,
            )
        };
        Self(old)
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: as above; restores the set saved by `new`.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &self.0 as *const u64,
                std::ptr::null_mut::<u64>(),
                KERNEL_SIGSET_SIZE,
            )
        };
    }
}

/// Start the child described by `prepared` (in its cgroup, if it has one).
pub fn spawn(prepared: &mut Prepared) -> Result<Started, ChildFailed> {
    let setup = |error: io::Error| ChildFailed {
        stage: Stage::Exec,
        error,
    };
    prepared.failure.store(0, Ordering::Relaxed);
    let started = with_stack(|stack| {
        let _blocked = SignalsBlocked::new();
        clone_child(prepared, stack)
    })
    .map_err(setup)?;
    // The child has exec'd or failed: with CLONE_VFORK the clone returns only then, and what
    // the child stored before is visible here (the kernel's wake-up of this thread orders it).
    let failure = prepared.failure.load(Ordering::Acquire);
    if failure == 0 {
        return Ok(started);
    }
    let stage_index = (failure >> 32) as usize - 1;
    let errno = failure as u32 as i32;
    // Reap the failed child now: it has exited (status 127) or is about to.
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(started.pid), None);
    Err(ChildFailed {
        stage: Stage::ALL.get(stage_index).copied().unwrap_or(Stage::Exec),
        error: io::Error::from_raw_os_error(errno),
    })
}

fn clone_child(prepared: &mut Prepared, stack: &Stack) -> io::Result<Started> {
    let cgroup_dir = prepared.cgroup;
    #[cfg(target_arch = "x86_64")]
    if prepared.clone_call == CloneCall::Newest && !CLONE3_MISSING.load(Ordering::Relaxed) {
        prepared.join_by_write = None;
        let arg = prepared as *mut Prepared as *mut c_void;
        match clone3_child(arg, stack, cgroup_dir) {
            Ok(s) => return Ok(s),
            // ENOSYS: no clone3; E2BIG / EINVAL: no CLONE_INTO_CGROUP (or a seccomp filter).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL | libc::EPERM)
                ) =>
            {
                tracing::info!("clone3 unavailable ({e}); probes start with clone(2)");
                CLONE3_MISSING.store(true, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    prepared.join_by_write = match cgroup_dir {
        Some(dir) => Some(open_procs(dir)?),
        None => None,
    };
    let arg = prepared as *mut Prepared as *mut c_void;
    legacy_clone_child(arg, stack)
}

/// The `cgroup.procs` of the cgroup whose directory is `dir`, for writing, opened through
/// `dir` (never by path).
fn open_procs(dir: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is open for the whole spawn (the caller's plan borrows its owner).
    let dir = unsafe { std::os::fd::BorrowedFd::borrow_raw(dir) };
    let how = nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC;
    Ok(nix::fcntl::openat(
        dir,
        c"cgroup.procs",
        how,
        nix::sys::stat::Mode::empty(),
    )?)
}

#[cfg(target_arch = "x86_64")]
fn clone3_child(arg: *mut c_void, stack: &Stack, cgroup_dir: Option<RawFd>) -> io::Result<Started> {
    let mut pidfd: c_int = -1;
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | CLONE_PIDFD,
        pidfd: &mut pidfd as *mut c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.base as u64 + PAGE as u64,
        stack_size: (stack.len - PAGE) as u64,
        ..CloneArgs::default()
    };
    if let Some(dir) = cgroup_dir {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = dir as u64;
    }
    let entry: extern "C" fn(*mut c_void) -> c_int = child_main;
    let ret: i64;
    // SAFETY: clone3 with CLONE_VM | CLONE_VFORK and its own stack. In the parent the
    // instruction returns like any system call (the child's pid or -errno) and only rax, rcx
    // and r11 change. In the child it returns 0 with rsp at the top of `stack` (16-byte
    // aligned, so `call` gives the ABI's entry alignment); the child calls `child_main(arg)`,
    // which never returns (it execs or exits), and the exit below is only a backstop. The
    // parent thread sleeps until the child has exec'd or exited, so `arg` (on the parent's
    // side, borrowed mutably for this call) and `stack` outlive every use the child makes.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "mov edi, 127",
            "mov eax, 231",
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &mut args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    if ret < 0 {
        return Err(io::Error::from_raw_os_error((-ret) as i32));
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nothing else owns.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok(Started {
        pid: ret as libc::pid_t,
        pidfd,
    })
}

fn legacy_clone_child(arg: *mut c_void, stack: &Stack) -> io::Result<Started> {
    let base = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    loop {
        let with_pidfd = !PIDFD_MISSING.load(Ordering::Relaxed);
        let flags = if with_pidfd {
            base | libc::CLONE_PIDFD
        } else {
            base
        };
        let mut pidfd: c_int = -1;
        // SAFETY: glibc's clone switches to `stack` and calls `child_main(arg)` there; the
        // same argument as for clone3 above holds (CLONE_VFORK keeps `arg` and `stack` alive
        // for the child's whole life before exec). With CLONE_PIDFD the pidfd is written to
        // the parent_tid argument, a local here.
        let pid = unsafe {
            libc::clone(
                child_main,
                stack.top(),
                flags,
                arg,
                &mut pidfd as *mut c_int,
            )
        };
        if pid < 0 {
            let e = io::Error::last_os_error();
            if with_pidfd && e.raw_os_error() == Some(libc::EINVAL) {
                PIDFD_MISSING.store(true, Ordering::Relaxed);
                continue;
            }
            return Err(e);
        }
        // SAFETY: as in clone3_child.
        let pidfd = (with_pidfd && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
        return Ok(Started { pid, pidfd });
    }
}

/// The child side. Runs on the child stack, sharing the agent's memory, with every signal
/// blocked; only raw system calls on `Prepared`. Never returns.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Prepared` the parent passed; the parent does not touch it until
    // this child has exec'd or exited.
    let p = unsafe { &*(arg as *const Prepared) };
    // SAFETY (for every `sys` call below): raw system calls with integer arguments or
    // pointers into `p` or this stack; `libc::syscall` is a plain trampoline that takes no
    // lock (on error it stores errno in the parent thread's TLS slot, which that thread, asleep
    // under CLONE_VFORK, does not read until this child is gone).
    unsafe {
        let fail = |stage: Stage| -> ! {
            let errno = *libc::__errno_location();
            // A plain store into the shared memory: no lock, no system call.
            p.failure.store(
                ((stage as u64 + 1) << 32) | u64::from(errno as u32),
                Ordering::Release,
            );
            libc::syscall(libc::SYS_exit_group, 127);
            #[allow(clippy::empty_loop)]
            loop {}
        };
        // Default dispositions before anything can be unblocked: the agent's handlers must
        // never run here, and an ignored SIGPIPE must not be inherited. An all-zero kernel
        // sigaction is SIG_DFL, no flags, empty mask.
        let default_action = [0u64; 4];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    default_action.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    KERNEL_SIGSET_SIZE,
                );
            }
        }
        // A session of its own, which makes it a process group of its own too (pgid = pid,
        // what the group kill relies on) and leaves it without a controlling terminal: a
        // probe must not reach the terminal of an admin who runs `probe NAME` or `--once`
        // (open("/dev/tty"), TIOCSTI into a root shell), as su, runuser and bubblewrap
        // learnt (CVE-2005-4890, CVE-2016-2779, CVE-2017-5226). Cannot fail: the child is
        // new, so it leads no process group yet.
        if libc::syscall(libc::SYS_setsid) < 0 {
            fail(Stage::SetSid);
        }
        if let Some(procs) = &p.join_by_write {
            if libc::syscall(libc::SYS_write, procs.as_raw_fd(), c"0".as_ptr(), 1) != 1 {
                fail(Stage::JoinCgroup);
            }
        }
        for (target, &source) in p.stdio.iter().enumerate() {
            if libc::syscall(libc::SYS_dup3, source, target as c_int, 0) < 0 {
                fail(Stage::Redirect);
            }
        }
        for (resource, limit) in &p.rlimits {
            let limit: *const libc::rlimit64 = limit;
            if libc::syscall(
                libc::SYS_prlimit64,
                0,
                *resource,
                limit,
                std::ptr::null_mut::<libc::rlimit64>(),
            ) != 0
            {
                fail(Stage::Rlimit);
            }
        }
        if let Some((uid, gid, groups)) = &p.credentials {
            // Groups and gid while still privileged, uid last.
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
                fail(Stage::SetGroups);
            }
            if libc::syscall(libc::SYS_setresgid, *gid, *gid, *gid) != 0 {
                fail(Stage::SetGid);
            }
            if libc::syscall(libc::SYS_setresuid, *uid, *uid, *uid) != 0 {
                fail(Stage::SetUid);
            }
        }
        if p.no_new_privs
            && libc::syscall(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            fail(Stage::NoNewPrivs);
        }
        if libc::syscall(libc::SYS_chdir, p.exec.cwd.as_ptr()) != 0 {
            fail(Stage::Chdir);
        }
        // Close-on-exec, not closed: a descriptor the agent holds is not the child's to close.
        if libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) != 0
        {
            // Before Linux 5.11: one fcntl per possible descriptor.
            for fd in 3..p.max_fd {
                libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        // After close_range, which would mark it close-on-exec again. Already there, it only
        // loses its close-on-exec flag (dup3 onto itself is EINVAL).
        if let Some(source) = p.capture {
            let done = if source == CAPTURE_FD {
                libc::syscall(libc::SYS_fcntl, source, libc::F_SETFD, 0)
            } else {
                libc::syscall(libc::SYS_dup3, source, CAPTURE_FD, 0)
            };
            if done < 0 {
                fail(Stage::Redirect);
            }
        }
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &NO_SIGNALS as *const u64,
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_SIZE,
        );
        match p.exec_fd {
            // What the script rule checked, by its descriptor: no path lookup between the
            // check and the exec for a rename or a swapped directory to win. The descriptor
            // is close-on-exec: the program does not inherit it.
            Some(fd) => {
                libc::syscall(
                    libc::SYS_execveat,
                    fd,
                    c"".as_ptr(),
                    p.exec.argv_ptrs.as_ptr(),
                    p.exec.envp_ptrs.as_ptr(),
                    libc::AT_EMPTY_PATH,
                );
            }
            None => {
                libc::syscall(
                    libc::SYS_execve,
                    p.exec.path.as_ptr(),
                    p.exec.argv_ptrs.as_ptr(),
                    p.exec.envp_ptrs.as_ptr(),
                );
            }
        }
        fail(Stage::Exec)
    }
}

/// Register a pidfd with the runtime: it turns readable when the child exits.
pub fn watch_pidfd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` is moved into the `AsyncFd`, so the descriptor stays open and
    // refers to the same pidfd until the `AsyncFd` is dropped, and `as_raw_fd` always
    // returns it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}
