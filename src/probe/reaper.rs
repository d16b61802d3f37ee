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
//! is harmless). On SIGCHLD the reaper lists our zombie children from
//! `/proc/self/task/*/children` and `waitpid`s the unregistered ones with `WNOHANG`.
//!
//! Every probe run's own exit raises SIGCHLD too (exec resets a child's exit signal to
//! SIGCHLD, so it cannot be turned off for them), and a scan reads a /proc file per thread:
//! scanned on every signal it cost a busy agent (50 runs a second) some 30 system calls
//! per run. So a signal starts one scan [`REAP_AFTER`] later, which reaps what every signal
//! of that time announced; an idle agent gets no signal and wakes for none.
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

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use tokio::sync::watch;

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
    }
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

/// How long after a SIGCHLD the reaper scans: the signals of that time get one scan. An
/// orphan's zombie waits that long (it holds a pid, nothing else).
pub const REAP_AFTER: Duration = Duration::from_millis(500);

/// Our children (of any thread) that are zombies and not registered (`reg`: held by the
/// caller, so that none is registered meanwhile).
fn orphan_zombies(reg: &BTreeSet<i32>) -> Vec<i32> {
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
    pids.into_iter()
        .filter(|pid| !reg.contains(pid))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // The state follows the last ')': the command name may contain anything.
                stat.rsplit(')')
                    .next()
                    .and_then(|s| s.split_whitespace().next())
                    == Some("Z")
            })
        })
        .collect()
}

/// Reap every zombie child that is not a registered (tokio-owned) child. Returns how many.
pub fn reap_orphans() -> usize {
    let reg = registry();
    let mut reaped = 0;
    for pid in orphan_zombies(&reg) {
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
    reaped
}

/// Total orphans reaped so far; changes whenever the reaper reaps one (tests wait on it).
pub fn reaped() -> watch::Receiver<u64> {
    reaped_counter().subscribe()
}

/// See `process::become_subreaper`.
pub fn become_subreaper() -> io::Result<()> {
    static STARTED: OnceLock<()> = OnceLock::new();
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if STARTED.set(()).is_ok() {
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        tokio::spawn(async move {
            reap_orphans();
            while sigchld.recv().await.is_some() {
                tokio::time::sleep(REAP_AFTER).await;
                reap_orphans();
            }
        });
    }
    Ok(())
}
