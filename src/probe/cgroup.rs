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
//! host's. The owner holds an exclusive `flock` on `<base>` from just after making it until
//! its process ends, however it ends (the kernel drops the lock with the last descriptor).
//! The lock lives on the cgroup's inode, which every PID namespace, cgroup namespace and
//! mount of the hierarchy shares. An agent that starts removes a sibling subtree only when
//! it is provably abandoned: it takes the sibling's lock itself (no live agent holds it),
//! and the sibling's `agent/` exists (so its owner had taken the lock before making it) and
//! is unpopulated (no agent, not even an earlier version that took no lock, is in it). It
//! holds that lock while it kills and removes the subtree, and says so at WARN; anything
//! else is left alone.
//! Where no v2 hierarchy is writable (not root, v1-only host) probes are contained by process
//! group only, and the log and `check` say so.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;

use crate::config::Limits;

/// Controllers the agent enables for its probes where the parent offers them.
const WANTED: [&str; 3] = ["cpu", "memory", "pids"];

/// Where probes are contained, or why they are not.
#[derive(Debug)]
pub enum Containment {
    Cgroups(Tree),
    ProcessGroups(String),
}

/// The agent's subtree.
#[derive(Debug)]
pub struct Tree {
    pub base: PathBuf,
    /// The flock on `base` that tells other agents this subtree's agent is alive; held for
    /// the process's life.
    _owned: SubtreeLock,
    /// Controllers enabled for the probes' cgroups.
    pub controllers: Vec<String>,
    /// The cgroup the agent was in before it moved into `agent/`, to go back to at shutdown.
    origin: PathBuf,
    /// `<base>` was made by us (and is removed at shutdown), not handed over by systemd.
    own_base: bool,
    probes: Mutex<HashMap<String, Arc<ProbeCgroup>>>,
    /// A limit's controller found missing was logged (once per controller, not per probe:
    /// the default `pids` limit is on every probe).
    missing_logged: [std::sync::atomic::AtomicBool; 2],
}

/// One probe's cgroup: the parent of its runs' leaves, where its limits are set and its
/// usage is read.
#[derive(Debug)]
pub struct ProbeCgroup {
    pub name: String,
    pub path: PathBuf,
    /// What was written to `memory.max` / `pids.max`; `None` until the first run (the
    /// directory may be left from a removed probe of the same name, with its old limits).
    limits: Mutex<Option<(Option<u64>, Option<u64>)>>,
    leaves: Mutex<Leaves>,
}

#[derive(Debug, Default)]
struct Leaves {
    /// Empty and never killed: the next run may be cloned into one.
    idle: Vec<Leaf>,
    /// Killed: removed once their last processes have gone.
    retired: Vec<PathBuf>,
    /// Checked out by runs.
    in_use: usize,
    /// The probe was removed from the config while a run was still ending (a stream in
    /// its SIGTERM grace): the last run to check in removes the cgroup.
    removed: bool,
}

/// A leaf cgroup, held open.
#[derive(Debug)]
struct Leaf {
    path: PathBuf,
    /// `O_PATH` directory, for clone3's `CLONE_INTO_CGROUP`.
    dir: OwnedFd,
    /// `cgroup.procs` open for writing, for the clone(2) fallback.
    procs: OwnedFd,
    /// `cgroup.procs` open for reading, for killing each process before Linux 5.14.
    listed: Option<fs::File>,
    /// `cgroup.events` and `cgroup.kill` (Linux 5.14+), held open: ending a run costs one
    /// read, and one write when something is left. Held, not opened by path: a removed
    /// leaf's name may be taken again, and a kill must never reach another run.
    events: Option<fs::File>,
    kill_file: Option<fs::File>,
}

/// The leaf one run is in, from [`ProbeCgroup::checkout`]; back to its probe when dropped
/// (idle if the run left it empty, else killed and retired).
#[derive(Debug)]
pub struct RunCgroup {
    probe: Arc<ProbeCgroup>,
    leaf: Option<Leaf>,
    killed: bool,
    /// Seen empty once the run had started: only a clone into it could fill it again.
    empty: bool,
}

/// What the host offers, found without changing anything (for `check`).
#[derive(Debug, Clone)]
pub struct Host {
    pub mount: PathBuf,
    pub own: PathBuf,
    pub controllers: Vec<String>,
}

static STATE: OnceLock<Containment> = OnceLock::new();

/// Why the host offers no cgroup v2 tree to the agent.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// `/proc/self/mountinfo` or `/proc/self/cgroup`.
    #[error("cannot read {path}: {source}")]
    Unreadable {
        path: &'static str,
        source: io::Error,
    },
    #[error("no cgroup v2 hierarchy is mounted")]
    NoHierarchy,
    #[error("the agent has no cgroup v2 path in /proc/self/cgroup")]
    NoPath,
}

/// The v2 mount point and the agent's cgroup in it.
pub fn detect() -> Result<Host, DetectError> {
    let read = |path: &'static str| {
        fs::read_to_string(path).map_err(|source| DetectError::Unreadable { path, source })
    };
    let mountinfo = read("/proc/self/mountinfo")?;
    let (mount, root) = v2_mount(&mountinfo).ok_or(DetectError::NoHierarchy)?;
    let cgroup = read("/proc/self/cgroup")?;
    let path = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(DetectError::NoPath)?;
    let own = cgroup_dir(&mount, &root, path);
    let controllers = read_words(&own.join("cgroup.controllers"));
    Ok(Host {
        mount,
        own,
        controllers,
    })
}

/// The directory of the cgroup at `path` (from `/proc/self/cgroup`) under the v2 mount at
/// `mount`, whose root within the hierarchy is `root` (from mountinfo: `/`, or a subtree's
/// path where only that subtree is mounted).
fn cgroup_dir(mount: &Path, root: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    let below_root = path.strip_prefix(root).unwrap_or(path);
    mount.join(below_root.strip_prefix("/").unwrap_or(below_root))
}

/// The first cgroup2 mount of `mountinfo`: (mount point, root within the hierarchy).
fn v2_mount(mountinfo: &str) -> Option<(PathBuf, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut f = before.split_whitespace();
        let root = f.nth(3)?;
        let point = f.next()?;
        Some((
            PathBuf::from(unescape(point)),
            PathBuf::from(unescape(root)),
        ))
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn read_words(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Set up containment once per process (daemon, `--once`, `probe NAME`) and log which.
pub fn init() -> &'static Containment {
    STATE.get_or_init(|| match set_up() {
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
    })
}

/// The sentence the log and `check` give when there is no containment.
pub fn fallback_text(why: &str) -> String {
    format!("no cgroup containment ({why}): probes are contained by process group only, so a descendant that calls setsid can outlive its run")
}

/// One line for `check`: what containment the agent would get here, without setting it up.
pub fn check_text() -> String {
    let host = match detect() {
        Ok(h) => h,
        Err(why) => return fallback_text(&why.to_string()),
    };
    let controllers = if host.controllers.is_empty() {
        "none".to_owned()
    } else {
        host.controllers.join(" ")
    };
    match nix::unistd::access(&host.own, nix::unistd::AccessFlags::W_OK) {
        Ok(()) => format!(
            "containment: each probe in its own cgroup under {} (cgroup v2 at {}; controllers available: {controllers})",
            host.own.display(),
            host.mount.display()
        ),
        Err(e) => fallback_text(&format!(
            "{} is not writable: {e}; controllers available: {controllers}",
            host.own.display()
        )),
    }
}

/// What to do where a controller the limits need is missing from the agent's cgroup tree.
const ENABLE_CONTROLLER: &str = "a hybrid host keeps it on cgroup v1 (boot with systemd.unified_cgroup_hierarchy=1); under systemd the unit's Delegate=yes (as shipped) hands it to the agent";

/// `check`'s note on the `memory` and `pids` limits this host would not enforce, from each
/// probe's `(name, limits)`: a limit needs its controller in the agent's cgroup v2 tree.
pub fn unenforced_limits_text<'a>(
    probes: impl Iterator<Item = (&'a str, &'a Limits)> + Clone,
) -> Vec<String> {
    let host = detect()
        .ok()
        .filter(|h| nix::unistd::access(&h.own, nix::unistd::AccessFlags::W_OK).is_ok());
    let mut out = Vec::new();
    for (controller, file) in [("memory", "memory.max"), ("pids", "pids.max")] {
        let limited: Vec<&str> = probes
            .clone()
            .filter(|(_, l)| match controller {
                "memory" => l.memory.is_some(),
                _ => l.pids.is_some(),
            })
            .map(|(name, _)| name)
            .collect();
        if limited.is_empty() {
            continue;
        }
        let why = match &host {
            Some(h) if h.controllers.iter().any(|c| c == controller) => continue,
            Some(h) => format!(
                "the {controller} controller is not available in the cgroup v2 tree at {}: {ENABLE_CONTROLLER}",
                h.own.display()
            ),
            None => "there is no cgroup containment here (see the containment line)".to_owned(),
        };
        out.push(format!(
            "limits NOT ENFORCED: {file} of {} is not set on this host: {why}",
            list_some(&limited)
        ));
    }
    out
}

/// `a, b, c and 7 more`.
fn list_some(names: &[&str]) -> String {
    const SHOWN: usize = 5;
    let shown = names[..names.len().min(SHOWN)].join(", ");
    match names.len().saturating_sub(SHOWN) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// The tree, if `init` set one up.
pub fn active() -> Option<&'static Tree> {
    match STATE.get() {
        Some(Containment::Cgroups(t)) => Some(t),
        _ => None,
    }
}

fn set_up() -> Result<Tree, String> {
    let host = detect().map_err(|e| e.to_string())?;
    let io = |what: &str, p: &Path, e: io::Error| format!("cannot {what} {}: {e}", p.display());
    let delegated = std::env::var_os("INVOCATION_ID").is_some()
        && host.own.extension().is_some_and(|e| e == "service");
    let (base, owned) = if delegated {
        let owned = match lock_subtree(&host.own, Wait::No) {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                return Err(format!(
                    "another agent holds this unit's cgroup {}",
                    host.own.display()
                ))
            }
            Err(e) => return Err(io("lock", &host.own, e)),
        };
        (host.own.clone(), owned)
    } else {
        remove_abandoned_siblings(&host.own);
        let pid = std::process::id();
        let start =
            start_time(pid).ok_or("cannot read this process's start time from /proc/self/stat")?;
        let base = create_subtree(&host.own, &format!("xce-agent.{pid}.{start}"))
            .map_err(|(p, e)| io("create", &p, e))?;
        // Blocking: a neighbour judging this new subtree holds its lock for as long as it
        // takes to see that it has no `agent/` yet, and then leaves it alone.
        let locked = lock_subtree(&base, Wait::Yes)
            .and_then(|lock| lock.ok_or_else(|| io::ErrorKind::WouldBlock.into()));
        match locked {
            Ok(lock) => (base, lock),
            Err(e) => {
                let _ = fs::remove_dir(&base);
                return Err(io("lock", &base, e));
            }
        }
    };
    let undo = |base: &Path| {
        let _ = fs::remove_dir(base.join("agent"));
        if !delegated {
            let _ = fs::remove_dir(base);
        }
    };
    let agent = base.join("agent");
    if let Err(e) =
        create_dir_if_missing(&agent).and_then(|()| fs::write(agent.join("cgroup.procs"), "0"))
    {
        undo(&base);
        return Err(io("move the agent into", &agent, e));
    }
    let probes = base.join("probes");
    // A delegated subtree may still hold the probe cgroups (and processes) of the agent
    // that ran in it before this one (systemd restarted it after a crash): none of them are
    // this agent's (its lock is ours now), and a leaf left there would refuse this agent's
    // run of the same name.
    if delegated && probes.is_dir() {
        tracing::warn!(
            "removing {} left by the agent that ran in this unit before (and any process still in it): this agent holds the unit's lock",
            probes.display()
        );
        remove_tree(&probes);
    }
    if let Err(e) = create_dir_if_missing(&probes) {
        let _ = fs::write(host.own.join("cgroup.procs"), "0");
        undo(&base);
        return Err(io("create", &probes, e));
    }
    let controllers = enable_controllers(&base, &probes);
    Ok(Tree {
        base,
        _owned: owned,
        controllers,
        origin: host.own,
        own_base: !delegated,
        probes: Mutex::new(HashMap::new()),
        missing_logged: Default::default(),
    })
}

/// Enable what the parent offers of [`WANTED`] on the way down to the probes' cgroups.
fn enable_controllers(base: &Path, probes: &Path) -> Vec<String> {
    let offered = read_words(&base.join("cgroup.controllers"));
    for dir in [base, probes] {
        for c in WANTED.iter().filter(|c| offered.iter().any(|o| o == *c)) {
            if let Err(e) = fs::write(dir.join("cgroup.subtree_control"), format!("+{c}")) {
                tracing::debug!(controller = c, "cannot enable in {}: {e}", dir.display());
            }
        }
    }
    read_words(&probes.join("cgroup.subtree_control"))
}

/// The exclusive flock an agent holds on its subtree's directory (see the module's doc).
type SubtreeLock = nix::fcntl::Flock<fs::File>;

#[derive(Clone, Copy, PartialEq)]
enum Wait {
    Yes,
    No,
}

/// Lock `dir`; `None` when another process holds it (only with `Wait::No`).
fn lock_subtree(dir: &Path, wait: Wait) -> io::Result<Option<SubtreeLock>> {
    use nix::fcntl::{Flock, FlockArg};
    // std opens close-on-exec: no probe ever inherits the lock (it would outlive the agent).
    let file = fs::File::open(dir)?;
    let arg = match wait {
        Wait::Yes => FlockArg::LockExclusive,
        Wait::No => FlockArg::LockExclusiveNonblock,
    };
    match Flock::lock(file, arg) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) if wait == Wait::No => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

/// `<own>/<name>`, or `<name>.<n>` where that is taken (two PID namespaces can each have a
/// process with the same pid that started in the same clock tick).
fn create_subtree(own: &Path, name: &str) -> Result<PathBuf, (PathBuf, io::Error)> {
    let mut path = own.join(name);
    for n in 1..=16 {
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                path = own.join(format!("{name}.{n}"));
            }
            Err(e) => return Err((path, e)),
        }
    }
    Err((path, io::ErrorKind::AlreadyExists.into()))
}

/// Why a sibling subtree is left alone, or that it is abandoned.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Another process holds its lock: a live agent.
    Locked,
    /// No `agent/` yet: an agent may have made it and not locked it yet.
    SettingUp,
    /// Its `agent/` holds a process: an agent alive in it (one of an earlier version, which
    /// takes no lock, or one that is moving out of it at its stop).
    AgentInside,
    /// Nobody holds its lock and its `agent/` is empty: its agent has ended.
    Abandoned,
}

fn judge(dir: &Path, lock: Option<&SubtreeLock>) -> Verdict {
    if lock.is_none() {
        return Verdict::Locked;
    }
    let agent = dir.join("agent");
    if !agent.is_dir() {
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
fn remove_abandoned_siblings(own: &Path) {
    let Ok(entries) = fs::read_dir(own) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(is_subtree_name) {
            continue;
        }
        let dir = e.path();
        let lock = match lock_subtree(&dir, Wait::No) {
            Ok(lock) => lock,
            Err(e) => {
                tracing::debug!("cannot lock {}: {e}; left alone", dir.display());
                continue;
            }
        };
        let verdict = judge(&dir, lock.as_ref());
        if verdict != Verdict::Abandoned {
            tracing::debug!("cgroup subtree {} left alone: {verdict:?}", dir.display());
            continue;
        }
        tracing::warn!(
            "removing the cgroup subtree {} (and any process still in it): its agent has ended (nobody holds its lock and its agent/ cgroup is empty)",
            dir.display()
        );
        remove_tree(&dir);
        drop(lock);
    }
}

/// `xce-agent.` followed by one to three dot-separated numbers: `<pid>.<start>`, `<pid>` (as
/// earlier versions named a subtree), `<pid>.<start>.<n>` (where the first was taken).
fn is_subtree_name(name: &str) -> bool {
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
fn start_time(pid: u32) -> Option<u64> {
    use procfs::FromRead;
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    procfs::process::Stat::from_read(&stat[..])
        .ok()
        .map(|s| s.starttime)
}

/// Kill whatever is in a cgroup subtree and remove it, deepest first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    kill_path(dir);
    remove_dir_patiently(dir);
}

/// A cgroup whose last processes are still exiting is busy for a moment.
fn remove_dir_patiently(dir: &Path) {
    for _ in 0..100 {
        match fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!("cannot remove cgroup {}: {e}", dir.display());
                return;
            }
            _ => return,
        }
    }
    tracing::warn!("cannot remove cgroup {}: still busy", dir.display());
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

/// A directory name for a probe: resource names are LSF names, but never trust a path.
fn dir_name(probe: &str) -> String {
    let s: String = probe
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

impl Tree {
    /// The probe's cgroup, made on first use; `limits` (memory, pids) applied when changed.
    pub fn probe(&self, name: &str, limits: &Limits) -> io::Result<Arc<ProbeCgroup>> {
        let mut probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        let cg = match probes.get(name) {
            Some(cg) => cg.clone(),
            None => {
                let path = self.base.join("probes").join(dir_name(name));
                create_dir_if_missing(&path)?;
                let cg = Arc::new(ProbeCgroup {
                    name: name.to_owned(),
                    path,
                    limits: Mutex::new(None),
                    leaves: Mutex::new(Leaves::default()),
                });
                probes.insert(name.to_owned(), cg.clone());
                cg
            }
        };
        drop(probes);
        cg.apply(limits, &self.controllers, &self.missing_logged);
        Ok(cg)
    }

    /// Remove the cgroups of probes not in `keep` (after a reload). One whose run is still
    /// ending (the scheduler has cancelled it: a stream in its SIGTERM grace) is removed by
    /// that run when it checks in, so the reload does not cut the grace short with a kill.
    pub fn retain(&self, keep: &[&str]) {
        let gone: Vec<Arc<ProbeCgroup>> = {
            let mut probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
            let names: Vec<String> = probes
                .keys()
                .filter(|n| !keep.contains(&n.as_str()))
                .cloned()
                .collect();
            names.iter().filter_map(|n| probes.remove(n)).collect()
        };
        for cg in gone {
            let mut leaves = cg.leaves.lock().unwrap_or_else(|p| p.into_inner());
            if leaves.in_use > 0 {
                leaves.removed = true;
                continue;
            }
            drop(leaves);
            // The retired leaves, and any process that is somehow still there.
            remove_tree(&cg.path);
        }
    }

    /// The last run of a removed probe checked in: its leaves go, and the probe's directory
    /// too unless a probe of the same name was added since and uses it.
    fn finish_removal(&self, name: &str, path: &Path, leaves: &[PathBuf]) {
        for leaf in leaves {
            remove_dir_patiently(leaf);
        }
        // Under the lock: a probe of the same name added now waits for this, not the
        // reverse (its directory is made under the same lock).
        let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        if !probes.contains_key(name) {
            // Once, not patiently: its leaves are gone, and the lock is held.
            if let Err(e) = fs::remove_dir(path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove cgroup {}: {e}", path.display());
                }
            }
        }
    }

    /// At shutdown: every probe's cgroup killed and removed (runs still ending too: the
    /// stop has waited for them as long as it will), the agent back where it started, its
    /// subtree removed.
    pub fn shut_down(&self) {
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // Deepest first: every probe's leaves, then the probe.
        remove_tree(&self.base.join("probes"));
        if fs::write(self.origin.join("cgroup.procs"), "0").is_ok() {
            remove_dir_patiently(&self.base.join("agent"));
            if self.own_base {
                remove_dir_patiently(&self.base);
            }
        }
    }
}

/// CPU and memory a probe's runs used, from its cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu: Duration,
    /// `memory.peak`, where the memory controller is enabled.
    pub peak_memory: Option<u64>,
}

impl ProbeCgroup {
    fn apply(
        &self,
        limits: &Limits,
        enabled: &[String],
        missing_logged: &[std::sync::atomic::AtomicBool; 2],
    ) {
        let want = (limits.memory, limits.pids);
        let mut applied = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        if *applied == Some(want) {
            return;
        }
        for ((controller, file, value), logged) in [
            ("memory", "memory.max", want.0),
            ("pids", "pids.max", want.1),
        ]
        .into_iter()
        .zip(missing_logged)
        {
            let text = value.map_or_else(|| "max".to_owned(), |v| v.to_string());
            if !enabled.iter().any(|c| c == controller) {
                if value.is_some() && !logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(probe = %self.name, "limits NOT ENFORCED: the {controller} controller is not enabled in this agent's cgroup tree, so {file} is not set for this probe or any other: {ENABLE_CONTROLLER}");
                }
                continue;
            }
            if let Err(e) = fs::write(self.path.join(file), &text) {
                tracing::warn!(probe = %self.name, "cannot set {file} to {text}: {e}");
            }
        }
        *applied = Some(want);
    }

    /// A leaf for one run: an idle one, else a fresh one. Retired leaves that have emptied
    /// are removed on the way.
    pub fn checkout(self: &Arc<Self>) -> io::Result<RunCgroup> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        leaves.retired.retain(|dir| match fs::remove_dir(dir) {
            Err(e) => e.kind() != io::ErrorKind::NotFound,
            Ok(()) => false,
        });
        let leaf = match leaves.idle.pop() {
            Some(leaf) => leaf,
            None => Leaf::create(&self.path)?,
        };
        leaves.in_use += 1;
        Ok(RunCgroup {
            probe: self.clone(),
            leaf: Some(leaf),
            killed: false,
            empty: false,
        })
    }

    fn checkin(&self, leaf: Leaf, killed: bool, empty: bool) {
        let reusable = !killed && (empty || !leaf.populated());
        if !killed && !reusable {
            leaf.kill();
        }
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        leaves.in_use -= 1;
        if leaves.removed && leaves.in_use == 0 {
            let mut dirs = std::mem::take(&mut leaves.retired);
            dirs.extend(leaves.idle.drain(..).map(|l| l.path.clone()));
            dirs.push(leaf.path.clone());
            drop((leaves, leaf));
            if let Some(tree) = active() {
                // A leaf just killed is busy for a moment: wait for it off the runtime.
                let (name, path) = (self.name.clone(), self.path.clone());
                let finish = move || tree.finish_removal(&name, &path, &dirs);
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => drop(rt.spawn_blocking(finish)),
                    Err(_) => finish(),
                }
            }
            return;
        }
        if reusable {
            leaves.idle.push(leaf);
        } else {
            leaves.retired.push(leaf.path.clone());
        }
    }

    pub fn usage(&self) -> Usage {
        let cpu = fs::read_to_string(self.path.join("cpu.stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .map_or(Duration::ZERO, Duration::from_micros);
        let peak_memory = fs::read_to_string(self.path.join("memory.peak"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        Usage { cpu, peak_memory }
    }
}

/// Leaves are named by one counter for the whole agent: a name is never used twice, even
/// for a probe removed and added again.
fn next_leaf_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    format!(
        "run-{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn create_dir_if_missing(path: &Path) -> io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

impl Leaf {
    fn create(probe: &Path) -> io::Result<Self> {
        let path = probe.join(next_leaf_name());
        fs::create_dir(&path)?;
        let opened = Self::open(&path);
        if opened.is_err() {
            let _ = fs::remove_dir(&path);
        }
        opened
    }

    fn open(path: &Path) -> io::Result<Self> {
        let dir = open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let procs = open(
            &path.join("cgroup.procs"),
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let kill_file = fs::OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.kill"))
            .ok();
        let listed = match kill_file {
            Some(_) => None,
            None => fs::File::open(path.join("cgroup.procs")).ok(),
        };
        Ok(Self {
            path: path.to_owned(),
            dir: super::child::spawn::above_stdio(dir)?,
            procs: super::child::spawn::above_stdio(procs)?,
            listed,
            events: fs::File::open(path.join("cgroup.events")).ok(),
            kill_file,
        })
    }

    /// Whether any process is in the leaf (`cgroup.events`; unknown counts as yes).
    fn populated(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let Some(events) = &self.events else {
            return true;
        };
        match events.read_at(&mut buf, 0) {
            Ok(n) => !String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == "populated 0"),
            Err(_) => true,
        }
    }

    /// SIGKILL to everything in the leaf: `cgroup.kill`, or before Linux 5.14 each process
    /// listed until none is left. Only through the descriptors held: a removed leaf gets
    /// ENODEV, never a kill by its (maybe reused) path.
    fn kill(&self) {
        use std::io::Write;
        if let Some(f) = &self.kill_file {
            let _ = (&*f).write_all(b"1");
            return;
        }
        let Some(listed) = &self.listed else {
            return;
        };
        for _ in 0..100 {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; 64 * 1024];
            let n = listed.read_at(&mut buf, 0).unwrap_or(0);
            let pids: Vec<i32> = String::from_utf8_lossy(&buf[..n])
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl RunCgroup {
    /// `(directory, cgroup.procs)` of the leaf, for the spawn.
    pub fn spawn_fds(&self) -> Option<(&OwnedFd, &OwnedFd)> {
        self.leaf.as_ref().map(|l| (&l.dir, &l.procs))
    }

    /// End everything left in the run's leaf; the leaf is retired, never cloned into again.
    pub fn kill(&mut self) {
        let Some(leaf) = &self.leaf else { return };
        if self.killed || self.empty {
            return;
        }
        if leaf.populated() {
            leaf.kill();
            self.killed = true;
        } else {
            self.empty = true;
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.leaf.as_ref().map(|l| l.path.as_path())
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if let Some(leaf) = self.leaf.take() {
            self.probe.checkin(leaf, self.killed, self.empty);
        }
    }
}

/// Usage of every probe's cgroup, for `/metrics`.
pub fn usage_by_probe() -> Vec<(String, Usage)> {
    let Some(tree) = active() else {
        return Vec::new();
    };
    let probes: Vec<Arc<ProbeCgroup>> = tree
        .probes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    probes
        .iter()
        .map(|cg| (cg.name.clone(), cg.usage()))
        .collect()
}

/// One probe's cgroup and its usage, if it has one.
pub fn usage_of(probe: &str) -> Option<(PathBuf, Usage)> {
    let cg = active()?
        .probes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(probe)
        .cloned()?;
    Some((cg.path.clone(), cg.usage()))
}

/// Kill and remove cgroups of probes no longer configured.
pub fn retain(keep: &[&str]) {
    if let Some(t) = active() {
        t.retain(keep);
    }
}

/// At agent shutdown.
pub fn shut_down() {
    if let Some(t) = active() {
        t.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unified_mount_of_a_hybrid_host() {
        let mi = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                  32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                  41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v2_mount(mi),
            Some(("/sys/fs/cgroup/unified".into(), "/".into()))
        );
    }

    #[test]
    fn the_agents_own_cgroup_is_found_below_the_mount() {
        let (mount, root) = (Path::new("/sys/fs/cgroup"), Path::new("/"));
        // Under systemd: the unit's cgroup, not the mount (the hierarchy's root).
        assert_eq!(
            cgroup_dir(mount, root, "/system.slice/xce-agent.service"),
            Path::new("/sys/fs/cgroup/system.slice/xce-agent.service")
        );
        assert_eq!(cgroup_dir(mount, root, "/"), mount);
        // Only a subtree mounted (a container's view): paths are below its root.
        assert_eq!(
            cgroup_dir(
                mount,
                Path::new("/machine.slice/c1"),
                "/machine.slice/c1/init.scope"
            ),
            Path::new("/sys/fs/cgroup/init.scope")
        );
        assert_eq!(
            cgroup_dir(mount, Path::new("/machine.slice/c1"), "/machine.slice/c1"),
            mount
        );
    }

    #[test]
    fn a_v1_only_host_has_no_v2_mount() {
        let mi = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(v2_mount(mi), None);
    }

    #[test]
    fn only_agent_subtree_names_are_considered() {
        for ok in [
            "xce-agent.4242.123456",
            "xce-agent.4242",
            "xce-agent.1.99.2",
        ] {
            assert!(is_subtree_name(ok), "{ok}");
        }
        for not in [
            "xce-agent.service",
            "xce-agent.4242.x",
            "xce-agent.",
            "xce-agent.1..2",
            "xce-agent.1.2.3.4",
            "other.4242",
            "",
        ] {
            assert!(!is_subtree_name(not), "{not}");
        }
    }

    /// The verdicts on a plain directory tree (no cgroupfs needed: the lock is a flock, the
    /// events a file).
    #[test]
    fn a_sibling_is_abandoned_only_when_unlocked_set_up_and_empty() {
        let dir = tempfile::tempdir().unwrap();
        let sib = dir.path();
        let held = lock_subtree(sib, Wait::No).unwrap().expect("free");
        assert!(
            lock_subtree(sib, Wait::No).unwrap().is_none(),
            "flock is per open file"
        );
        assert_eq!(judge(sib, None), Verdict::Locked);
        assert_eq!(judge(sib, Some(&held)), Verdict::SettingUp);
        fs::create_dir(sib.join("agent")).unwrap();
        fs::write(sib.join("agent/cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert_eq!(judge(sib, Some(&held)), Verdict::AgentInside);
        fs::write(sib.join("agent/cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        assert_eq!(judge(sib, Some(&held)), Verdict::Abandoned);
        drop(held);
        assert!(lock_subtree(sib, Wait::No).unwrap().is_some());
    }

    #[test]
    fn this_process_has_a_start_time_and_a_dead_pid_has_none() {
        assert!(start_time(std::process::id()).is_some());
        // Above the largest pid_max Linux allows.
        assert_eq!(start_time(4_194_305), None);
    }

    #[test]
    fn probe_names_never_make_paths() {
        assert_eq!(dir_name("../etc"), "___etc");
        assert_eq!(dir_name("gpu_free-1"), "gpu_free-1");
    }
}
