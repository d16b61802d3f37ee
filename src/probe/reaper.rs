//! Reaping the orphans of probes without stealing tokio's children.
//!
//! The agent is a child subreaper (`PR_SET_CHILD_SUBREAPER`): when a probe exits and leaves a
//! backgrounded grandchild behind, that grandchild is reparented to the agent. Its process
//! group is still killed by the probe's `GroupGuard`, but its zombie is then ours to reap.
//!
//! tokio waits for the children it spawned by pid; a `waitpid(-1)` here would steal their exit
//! statuses. So the reaper only reaps zombies that are *not* registered: every child the agent
//! spawns goes through [`start_registered`], which holds the registry lock across the fork so
//! the reaper can never see an unregistered child of ours, and keeps the pid registered until
//! the `Child` is gone (waited for, or handed to tokio's own orphan queue, where a reap by us
//! is harmless). A scan lists our zombie children from `/proc/self/task/*/children` and
//! `waitpid`s the unregistered ones with `WNOHANG`.
//!
//! What starts a scan is the end of a run, not SIGCHLD. Every probe run's own exit raises
//! SIGCHLD (exec resets a child's exit signal to SIGCHLD, so it cannot be turned off for them),
//! and a handler for it cost a busy agent (50 runs a second) a signal frame, a pipe write and
//! a wake-up of the runtime per run, some 10 % of its CPU. Orphans come from a run's process
//! tree, and they become ours when their parents die: by the end of the run (its group killed)
//! for all but what escaped the group and the cgroup. So the end of a registration (a run's
//! child reaped, or handed to the blocking pool's wait) starts one scan [`REAP_AFTER`] later,
//! which reaps what every run of that time left; and while a scan sees an unregistered child of
//! ours still alive (an escapee, which will die on its own time), scans repeat every
//! [`RESCAN_EVERY`] until none is left. An idle agent with no escapee wakes for none. (On
//! kernels without pidfds a child's exit is still waited for by SIGCHLD, in `child/`; the
//! reaper does not need it there either.) The agent's threads block SIGCHLD altogether
//! ([`hold_child_signals`]): unhandled, it would still wake a thread whenever a child exits
//! while its parent thread is inside a spawn.
//!
//! A grandchild that calls `setsid` leaves the probe's process group; where cgroups are
//! writable it is still ended with its run (`cgroup/`), and once it exits its zombie is
//! reaped here.
//!
//! The registry, the reaped count and the started reaper are process-wide, not part of an
//! agent's `Supervisor`, by nature: the kernel makes a *process* the subreaper, and a
//! `waitpid` of the reaper reaps any child of the process, whichever agent (or test) in it
//! spawned that child; so every spawn in the process must be registered in the one registry
//! the one reaper reads.

use std::collections::BTreeSet;
use std::io;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use tokio::sync::{watch, Notify};

fn registry() -> MutexGuard<'static, BTreeSet<i32>> {
    static SPAWNED: OnceLock<Mutex<BTreeSet<i32>>> = OnceLock::new();
    SPAWNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn reaped_counter() -> &'static watch::Sender<u64> {
    static REAPED: OnceLock<watch::Sender<u64>> = OnceLock::new();
    REAPED.get_or_init(|| watch::channel(0).0)
}

/// A spawned child's pid, kept out of the orphan reaper's reach while registered.
#[derive(Debug)]
pub struct Registered(i32);

impl Drop for Registered {
    fn drop(&mut self) {
        registry().remove(&self.0);
        // Whatever the run left behind is ours to reap now (its group was killed before).
        run_ended().notify_one();
    }
}

/// Woken at the end of every registration: a run's orphans are ours to reap from then on.
fn run_ended() -> &'static Notify {
    static ENDED: OnceLock<Notify> = OnceLock::new();
    ENDED.get_or_init(Notify::new)
}

/// Start a child with `start` (which returns it and its pid) and register the pid atomically
/// with respect to the reaper. Every child the agent starts goes through here.
pub fn start_registered<T, E>(
    start: impl FnOnce() -> Result<(T, i32), E>,
) -> Result<(T, Registered), E> {
    let mut reg = registry();
    let (child, pid) = start()?;
    reg.insert(pid);
    Ok((child, Registered(pid)))
}

/// How long after the end of a run the reaper scans: the runs of that time get one scan. An
/// orphan's zombie waits that long (it holds a pid, nothing else).
pub const REAP_AFTER: Duration = Duration::from_millis(500);

/// How often the reaper scans again while an unregistered child of ours is still alive (an
/// escapee of a run, reaped when it dies on its own: its zombie waits at most this long).
pub const RESCAN_EVERY: Duration = Duration::from_secs(5);

/// Our unregistered children (of any thread): the zombies among them, and whether any other
/// is still alive. `reg` is held by the caller, so that none is registered meanwhile.
struct Orphans {
    zombies: Vec<i32>,
    alive: bool,
}

fn orphans(reg: &BTreeSet<i32>) -> Orphans {
    let mut pids = BTreeSet::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                pids.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    let mut found = Orphans {
        zombies: Vec::new(),
        alive: false,
    };
    for pid in pids.into_iter().filter(|pid| !reg.contains(pid)) {
        // Gone between the two reads: nothing to reap, nothing alive.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The state follows the last ')': the command name may contain anything.
        match stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
        {
            Some("Z") => found.zombies.push(pid),
            Some(_) => found.alive = true,
            None => {}
        }
    }
    found
}

/// Reap every zombie child that is not a registered (tokio-owned) child: how many, and
/// whether an unregistered child of ours is still alive.
fn reap() -> (usize, bool) {
    let reg = registry();
    let mut reaped = 0;
    let found = orphans(&reg);
    for pid in found.zombies {
        if let Ok(status) = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            if status.pid().is_some() {
                reaped += 1;
            }
        }
    }
    drop(reg);
    if reaped > 0 {
        reaped_counter().send_modify(|n| *n += reaped as u64);
    }
    (reaped, found.alive)
}

/// SIGCHLD ignored (`SIG_IGN`, inherited across exec from whoever started the agent) makes
/// the kernel reap every child at once: no exit status, no zombie to keep a run's process
/// group ours. No handler replaces that disposition any more (the reaper needs none), so it
/// goes back to the default (which keeps zombies and wakes nobody). A handler is left alone.
fn unignore_sigchld() -> io::Result<()> {
    // SAFETY: `sigaction` is a plain C struct (zeroed is a valid value); sigaction with a
    // null new action only reads the disposition into `old`, on this stack.
    let (rc, old) = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let rc = libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old);
        (rc, old)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if old.sa_sigaction == libc::SIG_IGN {
        // SAFETY: SIG_DFL installs no handler: no code of ours runs on the signal.
        if unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) } == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Keep SIGCHLD from waking any thread of the agent: block it in the calling thread before
/// it starts any other (threads inherit their creator's mask). Call first thing in `main`.
///
/// With SIGCHLD at its default disposition the kernel discards it, but only while no thread
/// blocks it: a child that exits while its parent thread is inside a spawn (every signal
/// blocked around the clone, as in glibc's posix_spawn) has its SIGCHLD kept and handed to
/// another thread, which the kernel wakes to discard it. With runs that fall due together,
/// that was the main thread woken for one run in two, some 9 % of a busy agent's CPU
/// (BENCHMARKS.md section 21d). Blocked everywhere, the signal stays pending, once, and wakes
/// no one; exits are seen on pidfds. Children do not inherit the mask: the spawn empties it
/// before exec (`child/spawn.rs`), as std's `Command` does.
pub fn hold_child_signals() {
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&sigchld()), None);
}

/// The calling thread takes SIGCHLD again: a kernel without pidfds reports a child's exit by
/// SIGCHLD only (`child/`), so the thread that waits for it must not block it.
pub fn accept_child_signals() {
    let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&sigchld()), None);
}

fn sigchld() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set
}

/// This process as the child subreaper, with its orphan reaper started: what
/// [`become_subreaper`] returns, and the only way to what the reaper did. A process that is
/// not the subreaper has no orphans of its probes to reap, only children that others wait
/// for (a test's own `Command`s), which a scan of its own would steal.
#[derive(Debug, Clone)]
pub struct Subreaper(());

impl Subreaper {
    /// Total orphans reaped so far; changes whenever the reaper reaps one (tests wait on it).
    pub fn reaped(&self) -> watch::Receiver<u64> {
        reaped_counter().subscribe()
    }
}

/// Make the agent the reaper of its probes' orphans: a probe's backgrounded grandchild whose
/// parent exited is reparented to the agent (not to init), so it stays visible and is reaped
/// here instead of piling up as a zombie under some other process. Call inside the tokio
/// runtime, at daemon / `--once` / `probe` start ([`super::supervisor::Supervisor::start`]):
/// the first call starts the orphan reaper task, in that runtime.
pub fn become_subreaper() -> io::Result<Subreaper> {
    static STARTED: OnceLock<()> = OnceLock::new();
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    unignore_sigchld()?;
    if STARTED.set(()).is_ok() {
        tokio::spawn(async move {
            let (_, mut alive) = reap();
            loop {
                if alive {
                    tokio::select! {
                        () = run_ended().notified() => {}
                        () = crate::timer::sleep(RESCAN_EVERY) => {}
                    }
                } else {
                    run_ended().notified().await;
                }
                crate::timer::sleep(REAP_AFTER).await;
                (_, alive) = reap();
            }
        });
    }
    Ok(Subreaper(()))
}
