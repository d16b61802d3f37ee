//! Starting a child without copying the agent's address space: the only `unsafe` of the child
//! engine lives here.
//!
//! The child is created with `CLONE_VM` (clone3 where the kernel has it, with `CLONE_PIDFD`,
//! and `CLONE_INTO_CGROUP` when the probe has a cgroup): it shares the agent's memory until
//! it calls `execve`. No page is write-protected and no copy-on-write fault follows, however
//! large the agent is — that is what std's `fork()` path (any `pre_exec`) costs a
//! multi-threaded process.
//!
//! Two ways to wait, [`Report`]:
//! - [`Report::AtSpawn`]: `CLONE_VFORK`, as glibc's and musl's `posix_spawn`: the cloning
//!   thread sleeps until the child has exec'd or exited, so a failure before `execve` is known
//!   when [`spawn`] returns. The clone(2) fallback and every architecture but x86_64 always
//!   take this way (see "errno" below).
//! - [`Report::AtExit`] (exec runs, on x86_64 with clone3): no `CLONE_VFORK`. The cloning
//!   thread goes on at once — no sleep and wake-up of a runtime worker for each child's
//!   pre-exec work, and runs that fall due together are cloned back to back. What the child
//!   still runs on (its stack and its [`Prepared`]) is then lent to it in an [`InFlight`],
//!   and a failure before `execve` is read once the child has exited ([`InFlight::failure`]).
//!
//! How long the loan lasts: `CLONE_CHILD_CLEARTID` on a word of the `Prepared`
//! (`in_our_memory`, set to 1 before the clone). The kernel zeroes that word when the child
//! lets go of the agent's memory, in `mm_release`: at its `execve`'s point of no return
//! (after argv, envp and the path were copied in; an exec that fails later kills the child
//! rather than return to our memory) or at its exit — the same mechanism `pthread_join`
//! waits on. While the word is not zero the stack and the `Prepared` are never freed nor
//! reused: an [`InFlight`] dropped early (the run future dropped on reload, shutdown or a
//! timeout; a child handed to the blocking pool or the orphan reaper) goes to a quarantine,
//! swept at the next spawn, whoever reaps the child and whenever. Stacks come from a small
//! pool (no mmap, mprotect, munmap or fresh page fault per run), which keeps at most
//! [`STACKS_KEPT`] free ones; a child that dumps core may leave its word set (the kernel keeps
//! it for the debugger), and then its loan stays quarantined: a leak, never a reuse.
//!
//! Rules the child side keeps, as glibc's and musl's `posix_spawn` and Go's
//! `forkAndExecInChild1` do:
//! - It runs on its own small stack (from the pool, with a guard page), never on the parent's.
//! - It makes only raw system calls on data prepared before the clone ([`Prepared`]): no
//!   allocation, no lock, no libc wrapper that touches process-wide state. In particular the
//!   credential calls are raw `setgroups` / `setresgid` / `setresuid`: glibc's wrappers
//!   broadcast the change to every thread of the process, which here are the agent's.
//! - errno: the child has the parent thread's TLS (its `fs` base), and `libc::syscall` stores
//!   errno there on a failure. Under `CLONE_VFORK` that thread sleeps, so nobody reads it;
//!   without it the thread runs on and would see its errno change under it. So on x86_64 the
//!   child makes every system call with a `syscall` instruction of its own ([`sys`]), which
//!   returns -errno in a register and touches no memory but its arguments; only there is
//!   [`Report::AtExit`] taken.
//! - Every signal is blocked in the parent around the clone, so no handler of the agent's can
//!   run on the child's stack; the child (with its own copy of the dispositions: no
//!   `CLONE_SIGHAND`) resets every disposition to the default and then unblocks everything (a
//!   probe starts with an empty mask).
//! - The child starts a session of its own (`setsid`): its own process group, and no
//!   controlling terminal, whoever started the agent from which terminal. Without the vfork
//!   wait the parent may signal before that `setsid`: the group does not exist yet (ESRCH),
//!   so the parent signals the pid itself then (`Child::signal_run`).
//! - Everything the parent opened for the child is close-on-exec, and the child marks every
//!   descriptor above 2 close-on-exec (`close_range`), so a probe sees only 0, 1 and 2 whatever
//!   the agent inherited; and [`CAPTURE_FD`] for a probe with `capture:`.
//! - The descriptor table. Under [`Report::AtExit`], while the agent holds many descriptors
//!   (`fd::MANY_HELD`), the clone shares the agent's table (`CLONE_FILES`) and the child's first
//!   call makes it one of its own holding only the descriptors below its own highest
//!   (`close_range(K, ~0, CLOSE_RANGE_UNSHARE)`; `unshare(CLONE_FILES)`, a whole copy, before
//!   Linux 5.9). So the clone does not take a reference on every file the agent holds (two
//!   per contained probe, past the first 512 placed high, out of the child's part) on the
//!   agent's time, nor does the child's exec close them again (BENCHMARKS.md 23j, 23l).
//!   Until the child has a table of its own, a descriptor the agent closes is closed for the
//!   child too, and its number can be taken by the agent's next open before the child's
//!   `dup3`: the parent keeps its copies of the child's pipe ends, the checked program's
//!   descriptor (`exec_fd`) and the capture pipe in the loan ([`InFlight::hold`]) until the
//!   child has exec'd or exited. Otherwise (`CLONE_VFORK`, fewer held descriptors, a
//!   terminal's slave) the child gets its copy at the clone, and the parent closes them as
//!   soon as the clone returns. Where a seccomp filter refuses both calls, the child exits at
//!   [`Stage::Unshare`] and later clones copy the table (learnt once per process, said once
//!   in the log).
//! - A failure before `execve` succeeds is stored as (stage, errno) in [`Prepared`], the
//!   memory the child shares with the agent, and the child exits 127: no pipe to make, read
//!   and close for every run.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

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
    /// A descriptor table of its own, when the clone shared the agent's (`CLONE_FILES`).
    Unshare,
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
    const ALL: [Stage; 12] = [
        Stage::Unshare,
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
            Stage::Unshare => "getting a descriptor table of its own (close_range, unshare)",
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

    /// `limits`: `(RLIMIT_*, soft, hard)`; those past [`Self::MAX`] are dropped (callers
    /// give one of each kind).
    pub fn new(limits: impl IntoIterator<Item = (c_int, u64, u64)>) -> Self {
        let none = libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let mut set = [(0, none); Self::MAX];
        let mut len = 0;
        for (slot, (resource, soft, hard)) in set.iter_mut().zip(limits) {
            *slot = (
                resource,
                libc::rlimit64 {
                    rlim_cur: soft,
                    rlim_max: hard,
                },
            );
            len += 1;
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
    /// See [`Plan::unblock`].
    unblock: [bool; 3],
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
    share_table: bool,
    /// Highest descriptor to mark close-on-exec one by one where `close_range` is missing.
    max_fd: c_int,
    /// Above 0 when the clone shares the agent's descriptor table (`CLONE_FILES`, with
    /// [`Report::AtExit`]): the child's first call unshares it, copying the descriptors
    /// below this one only (its own highest, plus one). 0: the kernel copies it all.
    unshare_below: c_int,
    /// Written by the child when it fails before `execve` succeeds: `(stage + 1) << 32 |
    /// errno`; 0 while nothing failed.
    failure: AtomicU64,
    /// 1 from before a [`Report::AtExit`] clone until the kernel zeroes it
    /// (`CLONE_CHILD_CLEARTID`): the child no longer runs in the agent's memory.
    in_our_memory: AtomicU32,
}

/// What a [`Prepared`] is built from: nothing in it is allocated per run but what the caller
/// chose to make per run.
pub struct Plan<'a> {
    pub exec: Arc<ExecArgs>,
    pub credentials: Option<(u32, u32, Arc<[u32]>)>,
    pub rlimits: Rlimits,
    pub no_new_privs: bool,
    pub stdio: [&'a OwnedFd; 3],
    /// Which of `stdio` are the write ends of pipes made non-blocking for the agent's read
    /// ends ([`crate::probe::fd::pipe_nonblocking`]): the child makes its 0, 1 or 2 blocking
    /// again before its exec, so that a probe writes as it would to any pipe. The capture
    /// pipe is always such a pipe.
    pub unblock: [bool; 3],
    /// The run's cgroup directory, open (`O_PATH` will do).
    pub cgroup: Option<&'a OwnedFd>,
    /// The program the script rule checked, open (>= 3, close-on-exec): executed with
    /// `execveat(fd, "", AT_EMPTY_PATH)` instead of `path`. Binaries only, see
    /// [`super::super::security::CheckedProgram::script`].
    pub exec_fd: Option<&'a OwnedFd>,
    /// The write end of a capture pipe (close-on-exec, non-blocking: see `unblock`): the
    /// child gets it as [`CAPTURE_FD`], blocking. `exec_fd` must not be [`CAPTURE_FD`] then.
    pub capture: Option<&'a OwnedFd>,
    pub clone_call: CloneCall,
    /// Where the clone does not wait for the exec, share the agent's descriptor table until
    /// the child's first call (see the module's text). `false` for a terminal's slave, which
    /// the agent must not hold a moment past the child's exec.
    pub share_table: bool,
}

impl Prepared {
    pub fn new(plan: Plan<'_>) -> Self {
        // The soft limit the agent was started with (not the one it raised itself to: the
        // loop it bounds makes a call per descriptor number): looked up once, not per run.
        static MAX_FD: OnceLock<c_int> = OnceLock::new();
        let max_fd =
            *MAX_FD.get_or_init(|| crate::probe::open_files::started_soft().min(65_536) as c_int);
        Self {
            exec: plan.exec,
            credentials: plan.credentials,
            rlimits: plan.rlimits,
            no_new_privs: plan.no_new_privs,
            stdio: plan.stdio.map(|f| f.as_raw_fd()),
            unblock: plan.unblock,
            cgroup: plan.cgroup.map(AsRawFd::as_raw_fd),
            join_by_write: None,
            exec_fd: plan.exec_fd.map(AsRawFd::as_raw_fd),
            capture: plan.capture.map(AsRawFd::as_raw_fd),
            clone_call: plan.clone_call,
            share_table: plan.share_table,
            max_fd,
            unshare_below: 0,
            failure: AtomicU64::new(0),
            in_our_memory: AtomicU32::new(0),
        }
    }
}

/// A started child: its pid and, where the kernel gives one, a pidfd (readable once it exits).
pub struct Started {
    pub pid: libc::pid_t,
    pub pidfd: Option<OwnedFd>,
}

/// When a failure before `execve` is known (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// [`spawn`] returns it (`CLONE_VFORK`: the cloning thread waits for the exec).
    AtSpawn,
    /// [`InFlight::failure`] says it once the child has exited (no wait, where it can be
    /// done safely; elsewhere as `AtSpawn`, and the `InFlight` then holds nothing).
    AtExit,
}

const CHILD_STACK: usize = 64 * 1024;
const PAGE: usize = 4096;
/// Free stacks the pool keeps for the next spawns; more (after a burst of concurrent
/// children) are unmapped when given back.
pub const STACKS_KEPT: usize = 16;

/// A child stack: an anonymous mapping with a guard page at its low end.
struct Stack {
    base: *mut c_void,
    len: usize,
}

// SAFETY: a mapping's address and length; whoever holds the `Stack` is the only one to use
// the memory (or to lend it to a child, see `Loan`).
unsafe impl Send for Stack {}

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
        // SAFETY: the mapping is this struct's own, and a `Stack` is dropped only when no
        // child runs on it: given back after a vfork clone returned, or by a `Loan` whose
        // child the kernel says has left the agent's memory.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The free stacks, process-wide like the children that run on them.
fn free_stacks() -> MutexGuard<'static, Vec<Stack>> {
    static FREE: Mutex<Vec<Stack>> = Mutex::new(Vec::new());
    FREE.lock().unwrap_or_else(|p| p.into_inner())
}

fn take_stack() -> io::Result<Stack> {
    sweep_quarantine();
    match free_stacks().pop() {
        Some(stack) => Ok(stack),
        None => Stack::map(),
    }
}

fn give_back(stack: Stack) {
    let mut free = free_stacks();
    if free.len() < STACKS_KEPT {
        free.push(stack);
        return;
    }
    drop(free);
    drop(stack);
}

/// A stack and a `Prepared` lent to a child started without the vfork wait.
struct Loan {
    stack: Stack,
    /// From `Box::into_raw`: the child reads it through a shared reference, the parent only
    /// its atomics, until the loan is freed.
    prepared: NonNull<Prepared>,
    /// The agent's copies of the descriptors the child uses, while the child may still be
    /// using them in the table it shares with the agent (see [`InFlight::hold`]).
    held: Vec<HeldFd>,
}

/// A descriptor kept open for a child that shares the agent's descriptor table: held for
/// its drop (the close), never read.
#[allow(dead_code)]
pub enum HeldFd {
    Own(OwnedFd),
    Shared(Arc<OwnedFd>),
}

// SAFETY: the stack as above; the `Prepared` is `Send` and owned by the loan alone.
unsafe impl Send for Loan {}

impl Loan {
    fn prepared(&self) -> &Prepared {
        // SAFETY: the box is freed only by `free`, which consumes the loan.
        unsafe { self.prepared.as_ref() }
    }

    /// The kernel zeroed `in_our_memory`: the child has exec'd or exited, and never reads
    /// or writes the agent's memory again. Acquire: its stores before (the failure) are
    /// seen after.
    fn child_left(&self) -> bool {
        self.prepared().in_our_memory.load(Ordering::Acquire) == 0
    }

    /// Only once the child has left (or never was).
    fn free(self) {
        // SAFETY: from `Box::into_raw` in `spawn`, freed once, here; no child uses it.
        drop(unsafe { Box::from_raw(self.prepared.as_ptr()) });
        give_back(self.stack);
    }
}

/// What a child started with [`Report::AtExit`] runs on before its `execve`: kept until the
/// kernel says it has left the agent's memory, however the handle goes (see the module's
/// text). Empty for a child started with the vfork wait.
#[derive(Default)]
pub struct InFlight(Option<Loan>);

impl InFlight {
    /// The child failed before `execve` (and exited 127): where, and the errno. `None` while
    /// it may still run in the agent's memory, or when it exec'd.
    pub fn failure(&self) -> Option<ChildFailed> {
        let loan = self.0.as_ref().filter(|l| l.child_left())?;
        let failed = decode_failure(loan.prepared().failure.load(Ordering::Acquire))?;
        learn_from(&failed);
        Some(failed)
    }

    /// Keep `fd` (one the child uses: a pipe end, the checked program) open until the child
    /// has a descriptor table of its own, where it shares the agent's; else close it now.
    /// While they share it, closing it here would close it for the child too, and another
    /// of the agent's opens could take its number before the child's `dup3` or exec.
    pub fn hold(&mut self, fd: HeldFd) {
        match &mut self.0 {
            Some(loan) if loan.prepared().unshare_below > 0 && !loan.child_left() => {
                loan.held.push(fd)
            }
            _ => drop(fd),
        }
    }

    /// Close what [`InFlight::hold`] kept once the child no longer needs the agent's table:
    /// it has exec'd (the loan's word is zero: its table was unshared before) or `exited`
    /// (an exited process has no table; a child that dumped core may leave the word set).
    /// Until then a pipe the agent holds a write end of reports no end.
    pub fn let_go(&mut self, exited: bool) {
        if let Some(loan) = &mut self.0 {
            if !loan.held.is_empty() && (exited || loan.child_left()) {
                loan.held.clear();
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(loan) = self.0.take() else { return };
        if loan.child_left() {
            loan.free();
            return;
        }
        let mut q = quarantine();
        q.push(loan);
        QUARANTINED.store(q.len(), Ordering::Relaxed);
    }
}

/// Loans whose handle went while their child was still in the agent's memory.
fn quarantine() -> MutexGuard<'static, Vec<Loan>> {
    static HELD: Mutex<Vec<Loan>> = Mutex::new(Vec::new());
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many loans the quarantine holds: a spawn looks at the lock only when there are some.
static QUARANTINED: AtomicUsize = AtomicUsize::new(0);

/// Free the quarantined loans whose children have left.
fn sweep_quarantine() {
    if QUARANTINED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut q = quarantine();
    let mut left = Vec::new();
    let mut i = 0;
    while i < q.len() {
        if q[i].child_left() {
            left.push(q.swap_remove(i));
        } else {
            i += 1;
        }
    }
    QUARANTINED.store(q.len(), Ordering::Relaxed);
    drop(q);
    left.into_iter().for_each(Loan::free);
}

fn decode_failure(failure: u64) -> Option<ChildFailed> {
    if failure == 0 {
        return None;
    }
    let stage_index = (failure >> 32) as usize - 1;
    let errno = failure as u32 as i32;
    Some(ChildFailed {
        stage: Stage::ALL.get(stage_index).copied().unwrap_or(Stage::Exec),
        error: io::Error::from_raw_os_error(errno),
    })
}

// What the kernel lacks is a fact about the kernel (and the process's seccomp filter), the
// same for every agent in the process: process-wide, learnt once.

/// The kernel refused clone3 once (old kernel, or a seccomp filter): use clone from then on.
static CLONE3_MISSING: AtomicBool = AtomicBool::new(false);
/// A child could not unshare the descriptor table it shared with the agent (a seccomp
/// filter refusing both `close_range` and `unshare`): later clones copy the table instead.
static UNSHARE_REFUSED: AtomicBool = AtomicBool::new(false);

/// What a child's failure says about the kernel: a refused unshare is the filter's, not the
/// probe's, so the next clones do without it (`child::run` starts that run again).
fn learn_from(failed: &ChildFailed) {
    if failed.stage == Stage::Unshare && !UNSHARE_REFUSED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "a probe's child could not get a descriptor table of its own ({}): from now on each child copies the agent's at the clone",
            failed.error
        );
    }
}

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

/// Start the child described by `prepared` (in its cgroup, if it has one). With
/// [`Report::AtExit`] a failure before `execve` comes from the returned [`InFlight`] once the
/// child has exited; with [`Report::AtSpawn`] (and wherever the vfork wait is kept) it is
/// returned here, and the failed child reaped.
pub fn spawn(prepared: Prepared, report: Report) -> Result<(Started, InFlight), ChildFailed> {
    let setup = |error: io::Error| ChildFailed {
        stage: Stage::Exec,
        error,
    };
    let stack = take_stack().map_err(setup)?;
    let loan = Loan {
        stack,
        prepared: NonNull::from(Box::leak(Box::new(prepared))),
        held: Vec::new(),
    };
    let cloned = {
        let _blocked = SignalsBlocked::new();
        clone_child(loan.prepared.as_ptr(), &loan.stack, report)
    };
    let (started, waited) = match cloned {
        Ok(c) => c,
        Err(e) => {
            // No child was made: nothing runs on the loan.
            loan.prepared().in_our_memory.store(0, Ordering::Relaxed);
            loan.free();
            return Err(setup(e));
        }
    };
    if !waited {
        return Ok((started, InFlight(Some(loan))));
    }
    // The child has exec'd or failed: with CLONE_VFORK the clone returns only then, and what
    // the child stored before is visible here (the kernel's wake-up of this thread orders it).
    let failure = decode_failure(loan.prepared().failure.load(Ordering::Acquire));
    loan.free();
    match failure {
        None => Ok((started, InFlight::default())),
        Some(failed) => {
            // Reap the failed child now: it has exited (status 127) or is about to.
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(started.pid), None);
            Err(failed)
        }
    }
}

/// Clone the child; whether this thread waited for its exec (`CLONE_VFORK`).
fn clone_child(
    prepared: *mut Prepared,
    stack: &Stack,
    report: Report,
) -> io::Result<(Started, bool)> {
    // SAFETY: `prepared` is the loan's box, which no child uses yet: this is its only access.
    let p = unsafe { &mut *prepared };
    let cgroup_dir = p.cgroup;
    #[cfg(target_arch = "x86_64")]
    if p.clone_call == CloneCall::Newest && !CLONE3_MISSING.load(Ordering::Relaxed) {
        p.join_by_write = None;
        let wait = report == Report::AtSpawn;
        p.in_our_memory.store(u32::from(!wait), Ordering::Relaxed);
        // Without the vfork wait, and where the agent holds many descriptors, the clone
        // shares the table (no copy of every descriptor the agent holds, and none for the
        // child's exec to close): the child unshares the part below its own highest
        // descriptor first thing.
        let share = p.share_table
            && crate::probe::fd::many_held()
            && !UNSHARE_REFUSED.load(Ordering::Relaxed);
        p.unshare_below = match wait || !share {
            true => 0,
            false => {
                let own = p.stdio.iter().chain(&p.exec_fd).chain(&p.capture);
                own.copied().max().unwrap_or(2) + 1
            }
        };
        match clone3_child(prepared, stack, cgroup_dir, wait) {
            Ok(s) => return Ok((s, wait)),
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
    let _ = report;
    // SAFETY: as above (the clone3 attempt, if any, made no child).
    let p = unsafe { &mut *prepared };
    p.unshare_below = 0;
    // The fallback waits for the exec: the child writes `cgroup.procs` (it joins by itself,
    // after the clone, which the leaf's emptiness and kill rely on having happened before
    // the clone returns), and glibc's clone wrapper is not ours to reason about for errno.
    p.in_our_memory.store(0, Ordering::Relaxed);
    p.join_by_write = match cgroup_dir {
        Some(dir) => Some(open_procs(dir)?),
        None => None,
    };
    legacy_clone_child(prepared.cast(), stack).map(|s| (s, true))
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
fn clone3_child(
    prepared: *mut Prepared,
    stack: &Stack,
    cgroup_dir: Option<RawFd>,
    wait: bool,
) -> io::Result<Started> {
    let mut pidfd: c_int = -1;
    let mut args = CloneArgs {
        flags: libc::CLONE_VM as u64 | CLONE_PIDFD,
        pidfd: &mut pidfd as *mut c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.base as u64 + PAGE as u64,
        stack_size: (stack.len - PAGE) as u64,
        ..CloneArgs::default()
    };
    if wait {
        args.flags |= libc::CLONE_VFORK as u64;
    } else {
        // SAFETY: a plain field of the loan's box, set by `clone_child` before this.
        if unsafe { (*prepared).unshare_below } > 0 {
            args.flags |= libc::CLONE_FILES as u64;
        }
        // The kernel zeroes this word (and wakes a futex on it, unused here) when the child
        // lets go of our memory: at its exec or its exit.
        args.flags |= libc::CLONE_CHILD_CLEARTID as u64;
        // SAFETY: a field of the loan's box, alive until the word is zero.
        args.child_tid = unsafe { std::ptr::addr_of!((*prepared).in_our_memory) } as u64;
    }
    if let Some(dir) = cgroup_dir {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = dir as u64;
    }
    let entry: extern "C" fn(*mut c_void) -> c_int = child_main;
    let arg = prepared.cast::<c_void>();
    let ret: i64;
    // SAFETY: clone3 with CLONE_VM and its own stack. In the parent the instruction returns
    // like any system call (the child's pid or -errno) and only rax, rcx and r11 change. In
    // the child it returns 0 with rsp at the top of `stack` (16-byte aligned, so `call` gives
    // the ABI's entry alignment); the child calls `child_main(arg)`, which never returns (it
    // execs or exits), and the exit below is only a backstop. `arg` and `stack` outlive every
    // use the child makes of them: with CLONE_VFORK this thread sleeps until the child has
    // exec'd or exited; without, they belong to the loan that `spawn` returns, which is freed
    // only after the kernel has cleared `in_our_memory` (CLONE_CHILD_CLEARTID), i.e. after the
    // child's exec or exit. The child touches no memory of this thread's (not its stack, not
    // its TLS: `child_main` makes its system calls with `sys`), so this thread may run on.
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
        // CLONE_VFORK argument of clone3 above holds (this thread sleeps until the child has
        // exec'd or exited). With CLONE_PIDFD the pidfd is written to the parent_tid
        // argument, a local here.
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

/// One system call of the child's: the result, or -errno. On x86_64 its own `syscall`
/// instruction, which writes no memory (errno is not set: see the module's text).
///
/// # Safety
/// As the system call `n` with these arguments.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sys(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the kernel's x86_64 calling convention: number in rax, arguments in rdi, rsi,
    // rdx, r10, r8, r9; the result in rax; rcx and r11 clobbered. No stack is used.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Elsewhere libc's trampoline, whose errno goes to the parent thread's TLS: only ever
/// called under CLONE_VFORK there, with that thread asleep.
///
/// # Safety
/// As the system call `n` with these arguments.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn sys(n: libc::c_long, a: [usize; 6]) -> isize {
    // SAFETY: as the caller's.
    unsafe {
        let r = libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
        if r == -1 {
            -(*libc::__errno_location() as isize)
        } else {
            r as isize
        }
    }
}

/// A system call's arguments, as machine words (the unused ones 0), written out arm by arm:
/// no slice copy (a call to `memcpy` in a debug build) in the child.
macro_rules! sys {
    ($n:expr $(,)?) => {
        sys($n, [0; 6])
    };
    ($n:expr, $a:expr $(,)?) => {
        sys($n, [$a as usize, 0, 0, 0, 0, 0])
    };
    ($n:expr, $a:expr, $b:expr $(,)?) => {
        sys($n, [$a as usize, $b as usize, 0, 0, 0, 0])
    };
    ($n:expr, $a:expr, $b:expr, $c:expr $(,)?) => {
        sys($n, [$a as usize, $b as usize, $c as usize, 0, 0, 0])
    };
    ($n:expr, $a:expr, $b:expr, $c:expr, $d:expr $(,)?) => {
        sys($n, [$a as usize, $b as usize, $c as usize, $d as usize, 0, 0])
    };
    ($n:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr $(,)?) => {
        sys($n, [$a as usize, $b as usize, $c as usize, $d as usize, $e as usize, 0])
    };
}

/// The child side. Runs on the child stack, sharing the agent's memory, with every signal
/// blocked; only raw system calls ([`sys`]) on `Prepared`. Never returns.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Prepared` the parent passed; the parent does not touch it (but
    // for its atomics) until this child has exec'd or exited.
    let p = unsafe { &*(arg as *const Prepared) };
    // SAFETY (for every `sys` call below): raw system calls with integer arguments or
    // pointers into `p`, static data or this stack.
    unsafe {
        let fail = |stage: Stage, ret: isize| -> ! {
            let errno = (-ret) as u32;
            // A plain store into the shared memory: no lock, no system call.
            p.failure.store(
                ((stage as u64 + 1) << 32) | u64::from(errno),
                Ordering::Release,
            );
            sys!(libc::SYS_exit_group, 127);
            #[allow(clippy::empty_loop)]
            loop {}
        };
        // A descriptor table of its own before anything else: until then it is the agent's
        // (CLONE_FILES), and a dup3 would replace the agent's 0, 1 or 2. Only what is below
        // `unshare_below` is copied (Linux 5.9's close_range); before it, all of it.
        if p.unshare_below > 0 {
            let r = sys!(
                libc::SYS_close_range,
                p.unshare_below as u32,
                u32::MAX,
                libc::CLOSE_RANGE_UNSHARE,
            );
            if r < 0 {
                let r = sys!(libc::SYS_unshare, libc::CLONE_FILES);
                if r < 0 {
                    fail(Stage::Unshare, r);
                }
            }
        }
        // Default dispositions before anything can be unblocked: the agent's handlers must
        // never run here, and an ignored SIGPIPE must not be inherited. An all-zero kernel
        // sigaction is SIG_DFL, no flags, empty mask.
        let default_action = [0u64; 4];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                sys!(
                    libc::SYS_rt_sigaction,
                    sig,
                    default_action.as_ptr(),
                    0,
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
        let r = sys!(libc::SYS_setsid);
        if r < 0 {
            fail(Stage::SetSid, r);
        }
        if let Some(procs) = &p.join_by_write {
            let r = sys!(libc::SYS_write, procs.as_raw_fd(), c"0".as_ptr(), 1);
            if r != 1 {
                fail(Stage::JoinCgroup, r.min(-libc::EIO as isize));
            }
        }
        for (target, &source) in p.stdio.iter().enumerate() {
            let r = sys!(libc::SYS_dup3, source, target, 0);
            if r < 0 {
                fail(Stage::Redirect, r);
            }
            // Blocking again (the file status flags are the open pipe's, shared with the
            // agent's copy of this end, which the agent no longer writes through). A pipe
            // the agent made has no other status flag: 0 clears O_NONBLOCK alone.
            if p.unblock[target] {
                let r = sys!(libc::SYS_fcntl, target, libc::F_SETFL, 0);
                if r < 0 {
                    fail(Stage::Redirect, r);
                }
            }
        }
        for (resource, limit) in &p.rlimits {
            let limit: *const libc::rlimit64 = limit;
            let r = sys!(libc::SYS_prlimit64, 0, *resource, limit, 0);
            if r != 0 {
                fail(Stage::Rlimit, r);
            }
        }
        if let Some((uid, gid, groups)) = &p.credentials {
            // Groups and gid while still privileged, uid last.
            let r = sys!(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            if r != 0 {
                fail(Stage::SetGroups, r);
            }
            let r = sys!(libc::SYS_setresgid, *gid, *gid, *gid);
            if r != 0 {
                fail(Stage::SetGid, r);
            }
            let r = sys!(libc::SYS_setresuid, *uid, *uid, *uid);
            if r != 0 {
                fail(Stage::SetUid, r);
            }
        }
        if p.no_new_privs {
            let r = sys!(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1);
            if r != 0 {
                fail(Stage::NoNewPrivs, r);
            }
        }
        let r = sys!(libc::SYS_chdir, p.exec.cwd.as_ptr());
        if r != 0 {
            fail(Stage::Chdir, r);
        }
        // Close-on-exec, not closed: a descriptor the agent holds is not the child's to close.
        if sys!(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) != 0
        {
            // Before Linux 5.11: one fcntl per possible descriptor.
            for fd in 3..p.max_fd {
                sys!(libc::SYS_fcntl, fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        // After close_range, which would mark it close-on-exec again. Already there, it only
        // loses its close-on-exec flag (dup3 onto itself is EINVAL).
        if let Some(source) = p.capture {
            let r = if source == CAPTURE_FD {
                sys!(libc::SYS_fcntl, source, libc::F_SETFD, 0)
            } else {
                sys!(libc::SYS_dup3, source, CAPTURE_FD, 0)
            };
            if r < 0 {
                fail(Stage::Redirect, r);
            }
            let r = sys!(libc::SYS_fcntl, CAPTURE_FD, libc::F_SETFL, 0);
            if r < 0 {
                fail(Stage::Redirect, r);
            }
        }
        sys!(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &NO_SIGNALS as *const u64,
            0,
            KERNEL_SIGSET_SIZE,
        );
        let r = match p.exec_fd {
            // What the script rule checked, by its descriptor: no path lookup between the
            // check and the exec for a rename or a swapped directory to win. The descriptor
            // is close-on-exec: the program does not inherit it.
            Some(fd) => sys!(
                libc::SYS_execveat,
                fd,
                c"".as_ptr(),
                p.exec.argv_ptrs.as_ptr(),
                p.exec.envp_ptrs.as_ptr(),
                libc::AT_EMPTY_PATH,
            ),
            None => sys!(
                libc::SYS_execve,
                p.exec.path.as_ptr(),
                p.exec.argv_ptrs.as_ptr(),
                p.exec.envp_ptrs.as_ptr(),
            ),
        };
        fail(Stage::Exec, r)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(null: &OwnedFd) -> Prepared {
        prepared_in(null, c"/")
    }

    /// `/bin/true`, started in `cwd`.
    fn prepared_in(null: &OwnedFd, cwd: &std::ffi::CStr) -> Prepared {
        let exec = ExecArgs::new(
            c"/bin/true".into(),
            vec![c"/bin/true".into()],
            Arc::from(Vec::new()),
            cwd.into(),
        );
        Prepared::new(Plan {
            exec: Arc::new(exec),
            credentials: None,
            rlimits: Rlimits::new([]),
            no_new_privs: true,
            stdio: [null, null, null],
            unblock: [false; 3],
            cgroup: None,
            exec_fd: None,
            capture: None,
            clone_call: CloneCall::Newest,
            share_table: true,
        })
    }

    fn quarantined(prepared: NonNull<Prepared>) -> bool {
        quarantine().iter().any(|l| l.prepared == prepared)
    }

    fn is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD on a number: no memory, no change.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    /// The descriptors a child that shares the agent's table uses stay open while it may
    /// still use them (its word set: it has not exec'd), through a look that finds it
    /// still there; they close once it has exec'd (the word cleared) or has exited. A child
    /// with a table of its own (no sharing) needs none kept.
    #[test]
    fn a_sharing_childs_descriptors_are_held_until_it_execs_or_exits() {
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let mut shared = prepared(&null);
        shared.unshare_below = 10;
        let loan = |p: Prepared| Loan {
            stack: take_stack().unwrap(),
            prepared: NonNull::from(Box::leak(Box::new(p))),
            held: Vec::new(),
        };
        let mut run = InFlight(Some(loan(shared)));
        fn word(run: &InFlight) -> &AtomicU32 {
            &run.0.as_ref().unwrap().prepared().in_our_memory
        }
        word(&run).store(1, Ordering::Relaxed);
        let (a, b) = (fd(), fd());
        let (a_no, b_no) = (a.as_raw_fd(), b.as_raw_fd());
        run.hold(HeldFd::Own(a));
        run.hold(HeldFd::Shared(Arc::new(b)));
        run.let_go(false);
        assert!(
            is_open(a_no) && is_open(b_no),
            "held while the child may use them"
        );
        word(&run).store(0, Ordering::Relaxed);
        run.let_go(false);
        assert!(!is_open(a_no) && !is_open(b_no), "closed once it exec'd");

        word(&run).store(1, Ordering::Relaxed);
        let c = fd();
        let c_no = c.as_raw_fd();
        run.hold(HeldFd::Own(c));
        run.let_go(true);
        assert!(!is_open(c_no), "closed once it exited, word or not");
        word(&run).store(0, Ordering::Relaxed);
        drop(run);

        let mut own_table = InFlight(Some(loan(prepared(&null))));
        let d = fd();
        let d_no = d.as_raw_fd();
        own_table.hold(HeldFd::Own(d));
        assert!(!is_open(d_no), "a child with its own table needs none held");
    }

    /// A loan whose child (here: none, its word set by hand) has not left our memory is
    /// neither freed nor handed out again when its handle goes, until the word is zero.
    #[test]
    fn a_loan_outlives_its_handle_until_the_kernel_clears_its_word() {
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let loan = Loan {
            stack: take_stack().unwrap(),
            prepared: NonNull::from(Box::leak(Box::new(prepared(&null)))),
            held: Vec::new(),
        };
        let (ptr, base) = (loan.prepared, loan.stack.base);
        loan.prepared().in_our_memory.store(1, Ordering::Relaxed);
        drop(InFlight(Some(loan)));
        assert!(quarantined(ptr));
        let taken: Vec<Stack> = (0..=STACKS_KEPT).map(|_| take_stack().unwrap()).collect();
        assert!(taken.iter().all(|s| s.base != base));
        assert!(quarantined(ptr));
        // What the kernel does at the child's exec or exit. SAFETY: the box is alive (held
        // by the quarantine, which only this test's loan points at).
        unsafe { ptr.as_ref() }
            .in_our_memory
            .store(0, Ordering::Release);
        taken.into_iter().for_each(give_back);
        sweep_quarantine();
        assert!(!quarantined(ptr));
    }

    /// A child started without the wait: its failure before exec is read from its loan,
    /// once it has exited.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_failure_before_exec_waits_in_the_loan_for_the_exit() {
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let p = prepared_in(&null, c"/nonexistent-directory-of-the-test");
        let failed = match spawn(p, Report::AtExit) {
            Ok((started, in_flight)) => {
                let pid = nix::unistd::Pid::from_raw(started.pid);
                let status = nix::sys::wait::waitpid(pid, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(pid, 127));
                in_flight.failure().expect("a failure")
            }
            // A kernel without clone3: the clone(2) fallback waited for the exit.
            Err(failed) => failed,
        };
        assert_eq!(failed.stage, Stage::Chdir);
        assert_eq!(failed.error.raw_os_error(), Some(libc::ENOENT));
    }
}
