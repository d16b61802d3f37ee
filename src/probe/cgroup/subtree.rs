//! The agent's subtree over a root path: made (or taken over from systemd), locked, its
//! controllers enabled, its probes' cgroups made and removed, and stale sibling subtrees
//! removed where provably abandoned (see the module's doc).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error::{CgroupError, SetUpError};
use super::host::Host;
use super::kernel::Kernel;
use super::leaf::{dir_name, ProbeCgroup};
use super::liveness::{CgroupId, LockDir, SubtreeLock, Wait};
use crate::config::Limits;

/// Controllers the agent enables for its probes where the parent offers them.
const WANTED: [&str; 3] = ["cpu", "memory", "pids"];

/// Where a tree is made: the parameters of [`Tree::set_up`].
#[derive(Debug, Clone)]
pub struct Layout {
    /// The cgroup the agent is in: its subtree is made below it, or (delegated) is it.
    pub own: PathBuf,
    /// systemd started the agent as a service with `Delegate=yes`: `own` is handed over
    /// whole, and is the subtree.
    pub delegated: bool,
    /// The subtree's name below `own` where not delegated (`xce-agent.<pid>.<start>`).
    pub name: String,
    /// This process moves into the subtree's `agent/`: an agent does (its liveness is read
    /// there, and a delegated cgroup with children may not hold it). A test whose probes
    /// only need containing stays where it is, so such tests share one process.
    pub move_in: bool,
    pub kernel: Kernel,
    /// The directory only the agent's user can enter that holds the subtrees' lock files
    /// (see `liveness.rs`): shared by every agent on the host, a temp dir in unit tests.
    pub locks: PathBuf,
}

impl Layout {
    /// For this process, in its own cgroup on the host's v2 mount.
    pub fn for_this_process(host: &Host, move_in: bool) -> Result<Self, SetUpError> {
        let pid = std::process::id();
        let start = start_time(pid).ok_or(SetUpError::NoStartTime)?;
        Ok(Self {
            own: host.own.clone(),
            delegated: std::env::var_os("INVOCATION_ID").is_some()
                && host.own.extension().is_some_and(|e| e == "service"),
            name: format!("xce-agent.{pid}.{start}"),
            move_in,
            kernel: Kernel::CGROUPFS,
            locks: LockDir::default_path()?,
        })
    }
}

/// The agent's subtree.
#[derive(Debug)]
pub struct Tree {
    pub base: PathBuf,
    /// The lock that tells other agents this subtree's agent is alive; held for the tree's
    /// life (the process's, for an agent).
    owned: SubtreeLock,
    /// Controllers enabled for the probes' cgroups.
    pub controllers: Vec<String>,
    /// The cgroup the agent was in before it moved into `agent/`, to go back to at shutdown.
    origin: PathBuf,
    /// `<base>` was made by us (and is removed at shutdown), not handed over by systemd.
    own_base: bool,
    /// This process moved into `agent/` (and moves back to `origin` at shutdown).
    moved_in: bool,
    registry: Arc<Registry>,
    /// A limit's controller found missing was logged (once per controller, not per probe:
    /// the default `pids` limit is on every probe).
    missing_logged: [AtomicBool; 2],
}

/// What a tree shares with its probes' cgroups (which hold it weakly: the tree holds them).
#[derive(Debug)]
pub(super) struct Registry {
    pub(super) probes: Mutex<HashMap<String, Arc<ProbeCgroup>>>,
    /// Leaves are named by one counter for the whole tree: a name is never used twice, even
    /// for a probe removed and added again.
    next_leaf: AtomicU64,
    pub(super) kernel: Kernel,
}

impl Registry {
    pub(super) fn next_leaf_name(&self) -> String {
        format!("run-{}", self.next_leaf.fetch_add(1, Ordering::Relaxed))
    }

    fn probes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ProbeCgroup>>> {
        self.probes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last run of a removed probe checked in: its leaves go, and the probe's directory
    /// too unless a probe of the same name was added since and uses it.
    pub(super) fn finish_removal(&self, name: &str, path: &Path, leaves: &[PathBuf]) {
        let deadline = Instant::now() + REMOVAL_PATIENCE;
        for leaf in leaves {
            remove_dir_by(&self.kernel, leaf, deadline);
        }
        // Under the lock: a probe of the same name added now waits for this, not the
        // reverse (its directory is made under the same lock).
        let probes = self.probes();
        if !probes.contains_key(name) {
            // Once, not patiently: its leaves are gone, and the lock is held.
            if let Err(e) = (self.kernel.rmdir)(path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove cgroup {}: {e}", path.display());
                }
            }
        }
    }
}

impl Tree {
    /// Make the agent's subtree under `layout.own` (or take over `own`, delegated), lock it,
    /// move this process into its `agent/`, and enable the controllers for the probes.
    /// Stale siblings are removed first where provably abandoned.
    pub fn set_up(layout: Layout) -> Result<Tree, SetUpError> {
        let Layout {
            own,
            delegated,
            name,
            move_in,
            kernel,
            locks,
        } = layout;
        let locks = LockDir::open(&locks)?;
        let (base, owned) = if delegated {
            let owned = match locks.lock(&own, Wait::No) {
                Ok(Some(lock)) => lock,
                Ok(None) => return Err(SetUpError::Taken(own)),
                Err(source) => return Err(SetUpError::Lock { path: own, source }),
            };
            (own.clone(), owned)
        } else {
            remove_abandoned_siblings(&kernel, &locks, &own);
            let base = create_subtree(&kernel, &own, &name)?;
            // Blocking: a neighbour judging this new subtree holds its lock for as long as
            // it takes to see that it has no `agent/` yet, and then leaves it alone. Only
            // an agent can hold it (the lock directory is closed to other users).
            let locked = locks
                .lock(&base, Wait::Yes)
                .and_then(|lock| lock.ok_or_else(|| io::ErrorKind::WouldBlock.into()));
            match locked {
                Ok(lock) => (base, lock),
                Err(source) => {
                    let _ = (kernel.rmdir)(&base);
                    return Err(SetUpError::Lock { path: base, source });
                }
            }
        };
        let undo = |base: &Path| {
            let _ = (kernel.rmdir)(&base.join("agent"));
            if !delegated {
                let _ = (kernel.rmdir)(base);
            }
        };
        let agent = base.join("agent");
        if let Err(source) = create_dir_if_missing(&kernel, &agent).and_then(|()| match move_in {
            true => fs::write(agent.join("cgroup.procs"), "0"),
            false => Ok(()),
        }) {
            undo(&base);
            return Err(SetUpError::MoveIn {
                path: agent,
                source,
            });
        }
        let probes = base.join("probes");
        // A delegated subtree may still hold the probe cgroups (and processes) of the agent
        // that ran in it before this one (systemd restarted it after a crash): none of them
        // are this agent's (its lock is ours now), and a leaf left there would refuse this
        // agent's run of the same name.
        if delegated && probes.is_dir() {
            tracing::warn!(
                "removing {} left by the agent that ran in this unit before (and any process still in it): this agent holds the unit's lock",
                probes.display()
            );
            remove_tree(&kernel, &probes);
        }
        if let Err(source) = create_dir_if_missing(&kernel, &probes) {
            if move_in {
                let _ = fs::write(own.join("cgroup.procs"), "0");
            }
            undo(&base);
            return Err(SetUpError::Create {
                path: probes,
                source,
            });
        }
        let controllers = enable_controllers(&kernel, &base, &probes);
        Ok(Tree {
            base,
            owned,
            controllers,
            origin: own,
            own_base: !delegated,
            moved_in: move_in,
            registry: Arc::new(Registry {
                probes: Mutex::new(HashMap::new()),
                next_leaf: AtomicU64::new(1),
                kernel,
            }),
            missing_logged: Default::default(),
        })
    }

    /// The file whose lock proves this tree's agent alive (see `liveness.rs`).
    pub fn lock_path(&self) -> PathBuf {
        self.owned.path()
    }

    /// The probe's cgroup, made on first use; `limits` (memory, pids) applied when changed.
    pub fn probe(&self, name: &str, limits: &Limits) -> Result<Arc<ProbeCgroup>, CgroupError> {
        let mut probes = self.registry.probes();
        let cg = match probes.get(name) {
            Some(cg) => cg.clone(),
            None => {
                let path = self.base.join("probes").join(dir_name(name));
                if let Err(source) = create_dir_if_missing(&self.registry.kernel, &path) {
                    return Err(CgroupError::CreateProbe { path, source });
                }
                let cg = Arc::new(ProbeCgroup::new(name, path, &self.registry));
                probes.insert(name.to_owned(), cg.clone());
                cg
            }
        };
        drop(probes);
        cg.apply(limits, &self.controllers, &self.missing_logged);
        Ok(cg)
    }

    /// The probe's cgroup, if it has one.
    pub fn probe_if_made(&self, name: &str) -> Option<Arc<ProbeCgroup>> {
        self.registry.probes().get(name).cloned()
    }

    /// Every probe's cgroup, for `/metrics`.
    pub fn probes(&self) -> Vec<Arc<ProbeCgroup>> {
        self.registry.probes().values().cloned().collect()
    }

    /// Remove the cgroups of probes not in `keep` (after a reload). One whose run is still
    /// ending (the scheduler has cancelled it: a stream in its SIGTERM grace) is removed by
    /// that run when it checks in, so the reload does not cut the grace short with a kill.
    pub fn retain(&self, keep: &[&str]) {
        let gone: Vec<Arc<ProbeCgroup>> = {
            let mut probes = self.registry.probes();
            let names: Vec<String> = probes
                .keys()
                .filter(|n| !keep.contains(&n.as_str()))
                .cloned()
                .collect();
            names.iter().filter_map(|n| probes.remove(n)).collect()
        };
        // One patience for them all: a reload that drops many probes stuck on a hung
        // filesystem waits it once.
        let deadline = Instant::now() + REMOVAL_PATIENCE;
        for cg in gone {
            if cg.mark_removed_if_in_use() {
                continue;
            }
            // The retired leaves, and any process that is somehow still there.
            remove_tree_by(&self.registry.kernel, &cg.path, deadline);
        }
    }

    /// At shutdown: every probe's cgroup killed and removed (runs still ending too: the
    /// stop has waited for them as long as it will), the agent back where it started, its
    /// subtree removed.
    pub fn shut_down(&self) {
        self.registry.probes().clear();
        let kernel = &self.registry.kernel;
        // Deepest first: every probe's leaves, then the probe.
        let probes_gone = remove_tree(kernel, &self.base.join("probes"));
        if !self.moved_in || fs::write(self.origin.join("cgroup.procs"), "0").is_ok() {
            let agent_gone = remove_dir_patiently(kernel, &self.base.join("agent"));
            // Not waited for where a child is left: it cannot go (and that was waited for).
            if self.own_base && probes_gone && agent_gone {
                remove_dir_patiently(kernel, &self.base);
            }
        }
        // Still held: the file goes, the proof with the process (see `liveness.rs`).
        self.owned.remove_file();
    }
}

/// A tree dropped without [`Tree::shut_down`] (a test's, a benchmark's, an agent's on an
/// error path) still leaves no cgroup behind; after a shutdown this finds nothing to do.
impl Drop for Tree {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Enable what the parent offers of [`WANTED`] on the way down to the probes' cgroups.
fn enable_controllers(kernel: &Kernel, base: &Path, probes: &Path) -> Vec<String> {
    let offered = read_words(&base.join("cgroup.controllers"));
    for dir in [base, probes] {
        for c in WANTED.iter().filter(|c| offered.iter().any(|o| o == *c)) {
            let control = dir.join("cgroup.subtree_control");
            if let Err(e) = (kernel.subtree_control)(&control, &format!("+{c}")) {
                tracing::debug!(controller = c, "cannot enable in {}: {e}", dir.display());
            }
        }
    }
    read_words(&probes.join("cgroup.subtree_control"))
}

pub(super) fn read_words(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

pub(super) fn create_dir_if_missing(kernel: &Kernel, path: &Path) -> io::Result<()> {
    match (kernel.mkdir)(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// `<own>/<name>`, or `<name>.<n>` where that is taken (two PID namespaces can each have a
/// process with the same pid that started in the same clock tick).
fn create_subtree(kernel: &Kernel, own: &Path, name: &str) -> Result<PathBuf, SetUpError> {
    let mut path = own.join(name);
    for n in 1..=16 {
        match (kernel.mkdir)(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                path = own.join(format!("{name}.{n}"));
            }
            Err(source) => return Err(SetUpError::Create { path, source }),
        }
    }
    Err(SetUpError::Create {
        path,
        source: io::ErrorKind::AlreadyExists.into(),
    })
}

/// Why a sibling subtree is left alone, or that it is abandoned.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Another process holds its lock: a live agent.
    Locked,
    /// No `agent/` or no `probes/` yet: an agent may have made it and not locked it yet,
    /// or (where it keeps its lock where this agent cannot see it) not moved in yet.
    SettingUp,
    /// Its `agent/` holds a process: an agent alive in it (one of an earlier version, which
    /// takes no lock, or one that is moving out of it at its stop).
    AgentInside,
    /// Nobody holds its lock, and its `agent/` is empty though its agent had moved in
    /// (`probes/` is made after): its agent has ended.
    Abandoned,
}

pub(super) fn judge(dir: &Path, lock: Option<&SubtreeLock>) -> Verdict {
    if lock.is_none() {
        return Verdict::Locked;
    }
    let agent = dir.join("agent");
    if !agent.is_dir() || !dir.join("probes").is_dir() {
        return Verdict::SettingUp;
    }
    match fs::read_to_string(agent.join("cgroup.events")) {
        Ok(events) if events.lines().any(|l| l == "populated 0") => Verdict::Abandoned,
        _ => Verdict::AgentInside,
    }
}

/// Kill and remove the sibling subtrees (`xce-agent.<pid>.<start>`, or `xce-agent.<pid>` as
/// earlier versions named them) that agents which ended without cleaning up have left:
/// only those [`judge`] finds abandoned, each while holding its lock.
fn remove_abandoned_siblings(kernel: &Kernel, locks: &Arc<LockDir>, own: &Path) {
    let Ok(entries) = fs::read_dir(own) else {
        return;
    };
    // One patience for them all: a start beside many dead agents' subtrees, each with a
    // probe stuck on a hung filesystem, waits it once.
    let deadline = Instant::now() + REMOVAL_PATIENCE;
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(is_subtree_name) {
            continue;
        }
        let dir = e.path();
        let lock = match locks.lock(&dir, Wait::No) {
            Ok(lock) => lock,
            Err(e) => {
                tracing::debug!("cannot lock {}: {e}; left alone", dir.display());
                continue;
            }
        };
        // The cgroup judged is the one locked, not one made under the same name since.
        let replaced = lock
            .as_ref()
            .is_some_and(|l| CgroupId::of(&dir).ok() != Some(l.cgroup));
        let verdict = judge(&dir, lock.as_ref());
        if replaced {
            tracing::debug!(
                "cgroup subtree {} replaced while judged: left alone",
                dir.display()
            );
        } else if verdict == Verdict::Abandoned {
            tracing::warn!(
                "removing the cgroup subtree {} (and any process still in it): its agent has ended (nobody holds its lock and its agent/ cgroup is empty)",
                dir.display()
            );
            remove_tree_by(kernel, &dir, deadline);
        } else {
            tracing::debug!("cgroup subtree {} left alone: {verdict:?}", dir.display());
        }
        // A file this agent holds proves nothing to anyone: unlinked before it is let go,
        // so judging leaves no file behind (see `liveness.rs`).
        if let Some(lock) = lock {
            lock.remove_file();
        }
    }
}

/// `xce-agent.` followed by one to three dot-separated numbers: `<pid>.<start>`, `<pid>` (as
/// earlier versions named a subtree), `<pid>.<start>.<n>` (where the first was taken).
pub(super) fn is_subtree_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("xce-agent.") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() <= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// When process `pid` started (clock ticks since boot); `None` if there is no such process.
pub(super) fn start_time(pid: u32) -> Option<u64> {
    use procfs::FromRead;
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    procfs::process::Stat::from_read(&stat[..])
        .ok()
        .map(|s| s.starttime)
}

/// Kill whatever is in a cgroup subtree and remove it, deepest first, within one
/// [`REMOVAL_PATIENCE`] for the whole subtree; whether it is gone.
pub(super) fn remove_tree(kernel: &Kernel, dir: &Path) -> bool {
    remove_tree_by(kernel, dir, Instant::now() + REMOVAL_PATIENCE)
}

pub(super) fn remove_tree_by(kernel: &Kernel, dir: &Path, deadline: Instant) -> bool {
    let mut children_gone = true;
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                children_gone &= remove_tree_by(kernel, &e.path(), deadline);
            }
        }
    }
    kill_path(dir);
    if !children_gone {
        // A cgroup with a child left cannot go: not waited for (the child was, and said so).
        return false;
    }
    remove_dir_by(kernel, dir, deadline)
}

/// How long a cgroup (or a subtree) whose processes were killed may stay busy before it is
/// left: their exits take microseconds, but on a loaded host a killed process waits its
/// turn to run its exit (half a second was once too short on a 2-core host running the
/// test suite). Only a process the kernel cannot end (in uninterruptible sleep on a hung
/// filesystem) takes all of it, once per removal, not once per cgroup.
const REMOVAL_PATIENCE: Duration = Duration::from_secs(5);

/// A cgroup whose last processes are still exiting is busy for a moment: tried again,
/// 1 ms then doubling up to 32 ms apart, for [`REMOVAL_PATIENCE`]; whether it is gone.
pub(super) fn remove_dir_patiently(kernel: &Kernel, dir: &Path) -> bool {
    remove_dir_by(kernel, dir, Instant::now() + REMOVAL_PATIENCE)
}

pub(super) fn remove_dir_by(kernel: &Kernel, dir: &Path, deadline: Instant) -> bool {
    let mut pause = Duration::from_millis(1);
    loop {
        match (kernel.rmdir)(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!("cannot remove cgroup {}: {e}", dir.display());
                return false;
            }
            _ => return true,
        }
        if Instant::now() >= deadline {
            tracing::warn!("cannot remove cgroup {}: still busy", dir.display());
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(32));
    }
}

/// `cgroup.kill` (Linux 5.14); before it, SIGKILL to each process listed until none is left.
fn kill_path(dir: &Path) {
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for _ in 0..100 {
        let pids = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let mut any = false;
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            any = true;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if !any {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
