//! Containment with cgroup v2: each probe in its own cgroup, each run ended with `cgroup.kill`,
//! so nothing a probe starts (a `setsid` daemon, a double fork) outlives its run.
//!
//! Layout, under the agent's own cgroup `<own>` on the writable v2 mount (found in
//! `/proc/self/mountinfo`: `/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a
//! hybrid one):
//!
//! ```text
//! <base>/agent/          the agent itself (a cgroup with children may not hold processes)
//! <base>/probes/<name>/  one per probe: its limits and its usage, over all its runs
//! <base>/probes/<name>/run-<n>/  a leaf; every run is cloned straight into one
//! ```
//!
//! A leaf is used by one run at a time, and by a later run only if the run before left it
//! empty: a run whose leftovers had to be killed retires its leaf (removed once empty), and
//! the next run gets a fresh one. So a run that is ending (a stream in its SIGTERM grace)
//! can only ever kill its own processes, never a later run's (the scheduler also starts a
//! restarted probe only once its old run has ended). And a killed leaf is never cloned into
//! again: on some kernels (6.18 here) `clone3(CLONE_INTO_CGROUP)` into a cgroup that was
//! once written `cgroup.kill` SIGKILLs the child at birth, so reusing one would kill every
//! later run of the probe.
//!
//! A probe removed by a reload keeps its cgroup until its last run has ended: the reload
//! does not cut that run's SIGTERM grace short with a kill; the run removes the cgroup as it
//! checks its leaf in.
//!
//! `<base>` is `<own>` when systemd started the agent as a service (`Delegate=yes` hands it
//! that subtree), otherwise `<own>/xce-agent.<pid>.<start>` (`<start>`: the process's start
//! time, in clock ticks since boot, from `/proc/<pid>/stat`): several agents (or test
//! processes) on one host never share a subtree, and a later process that gets a dead one's
//! pid (pids are reused; a container's agent may get the same low pid at every start) never
//! finds its own name taken.
//!
//! Who owns a subtree is never judged by its pid: a pid means nothing outside its PID
//! namespace, and agents in containers or under `unshare -p` share the cgroup tree with the
//! host's. The owner holds an exclusive `flock` on the subtree's lock file from just after
//! making `<base>` until its process ends, however it ends (the kernel drops the lock with
//! the last descriptor). The file is in a directory only root can enter
//! (`/run/xce-agent/locks`; [`Layout::locks`]) and is named by the cgroup's identity, which
//! every PID namespace, cgroup namespace and mount of the hierarchy shares (`liveness.rs`):
//! no other user can hold or forge it. The cgroup directory itself is never locked: it is
//! readable by everyone, and a user's `flock` on it once switched a delegated agent's
//! containment off, hung a plain agent's start and kept dead subtrees. An agent that starts
//! removes a sibling subtree only when it is provably abandoned: it takes the sibling's lock
//! itself (no live agent here holds it), and the sibling's `probes/` exists (its owner had
//! taken the lock, made `agent/`, moved in, then made `probes/`) while its `agent/` is
//! unpopulated (no agent, not even an earlier version that took no lock, or one whose lock
//! is in a lock directory this agent cannot see, is in it). It holds that lock while it
//! kills and removes the subtree, and says so at WARN; anything else is left alone.
//! Where no v2 hierarchy is writable (not root, v1-only host) probes are contained by process
//! group only, and the log and `check` say so.
//!
//! The manager is [`Tree`] over a root path ([`Layout`]: the cgroup it is made under, and
//! the [`Kernel`] whose cgroupfs it is), so its lifecycle is unit-tested on a temp dir;
//! [`Containment`] is what one agent (its `Supervisor`) holds: a tree, or why there is none.

mod error;
mod host;
mod kernel;
mod leaf;
mod liveness;
mod subtree;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use error::{CgroupError, DetectError, LimitError, LockDirError, SetUpError};
pub use host::{check_text, detect, dir_of, fallback_text, unenforced_limits_text, Host};
pub use kernel::Kernel;
pub use leaf::{ProbeCgroup, RunCgroup, Usage};
pub use liveness::{LockDir, SubtreeLock, Unsafe, Wait, DEFAULT_LOCK_DIR};
pub use subtree::{Layout, Tree};

/// Where probes are contained, or why they are not.
#[derive(Debug)]
pub enum Containment {
    Cgroups(Tree),
    ProcessGroups(SetUpError),
}

impl Containment {
    /// Containment for this process (daemon, `--once`, `probe NAME`), logged: a subtree of
    /// its own cgroup on the host's v2 mount, or process groups where there is none. The
    /// process moves into it.
    pub fn for_this_process() -> Self {
        Self::under_own_cgroup(true)
    }

    /// As [`Self::for_this_process`]; `move_in: false` leaves the process where it is
    /// (tests that share one process, each with a tree of its own).
    pub fn under_own_cgroup(move_in: bool) -> Self {
        let made = detect()
            .map_err(SetUpError::from)
            .and_then(|host| Tree::set_up(Layout::for_this_process(&host, move_in)?));
        Self::logged(made)
    }

    /// The tree `made`, or the fallback, said in the log.
    pub fn logged(made: Result<Tree, SetUpError>) -> Self {
        match made {
            Ok(tree) => {
                tracing::info!(
                    cgroup = %tree.base.display(),
                    controllers = %tree.controllers.join(" "),
                    "probes are contained: each in its own cgroup, each run ended with cgroup.kill"
                );
                Containment::Cgroups(tree)
            }
            Err(why) => {
                tracing::warn!("{}", fallback_text(&why));
                Containment::ProcessGroups(why)
            }
        }
    }

    pub fn tree(&self) -> Option<&Tree> {
        match self {
            Containment::Cgroups(t) => Some(t),
            Containment::ProcessGroups(_) => None,
        }
    }

    /// Usage of every probe's cgroup, for `/metrics`.
    pub fn usage_by_probe(&self) -> Vec<(String, Usage)> {
        let probes = self.tree().map(Tree::probes).unwrap_or_default();
        probes
            .iter()
            .map(|cg| (cg.name.clone(), cg.usage()))
            .collect()
    }

    /// One probe's cgroup and its usage, if it has one.
    pub fn usage_of(&self, probe: &str) -> Option<(PathBuf, Usage)> {
        let cg = self.tree()?.probe_if_made(probe)?;
        Some((cg.path.clone(), cg.usage()))
    }

    /// Kill and remove cgroups of probes no longer configured.
    pub fn retain(&self, keep: &[&str]) {
        if let Some(t) = self.tree() {
            t.retain(keep);
        }
    }

    /// At agent shutdown.
    pub fn shut_down(&self) {
        if let Some(t) = self.tree() {
            t.shut_down();
        }
    }
}
