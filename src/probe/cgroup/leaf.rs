//! One probe's cgroup and the leaves its runs are cloned into: checked out per run, killed
//! (`cgroup.kill`) and retired when a run left something behind, reused when it left none.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;

use super::error::{CgroupError, LimitError};
use super::host::ENABLE_CONTROLLER;
use super::subtree::Registry;
use crate::config::Limits;
use crate::probe::fd::{above_stdio, held_high, Held};

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
    /// Its tree (weakly: the tree holds its probes), for leaf names, the kernel, and the
    /// removal a removed probe's last run finishes.
    tree: Weak<Registry>,
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
    /// `O_PATH` directory, for clone3's `CLONE_INTO_CGROUP`, and the one its other files
    /// are opened through when needed (`cgroup.kill`, `cgroup.procs`): relative to the
    /// directory held, never by path, as a removed leaf's name may be taken again and a
    /// kill must never reach another run (a removed leaf's files are gone: ENOENT).
    dir: Held<OwnedFd>,
    /// `cgroup.events`, held open: ending a run costs one read. The only other descriptor a
    /// leaf holds: every descriptor the agent holds is copied into each child's table by
    /// the clone (`dup_fd`, on the agent's time) and closed again by its exec, so the
    /// files a run seldom needs are not held (BENCHMARKS.md section 23a).
    events: Option<Held<fs::File>>,
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

/// A directory name for a probe: resource names are LSF names, but never trust a path.
pub(super) fn dir_name(probe: &str) -> String {
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

/// CPU and memory a probe's runs used, from its cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu: Duration,
    /// `memory.peak`, where the memory controller is enabled.
    pub peak_memory: Option<u64>,
}

impl ProbeCgroup {
    pub(super) fn new(name: &str, path: PathBuf, tree: &Arc<Registry>) -> Self {
        Self {
            name: name.to_owned(),
            path,
            limits: Mutex::new(None),
            leaves: Mutex::new(Leaves::default()),
            tree: Arc::downgrade(tree),
        }
    }

    fn leaves(&self) -> std::sync::MutexGuard<'_, Leaves> {
        self.leaves.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A probe removed by a reload: `true` when a run still uses it (the last run to check
    /// in removes it), `false` when it may go now.
    pub(super) fn mark_removed_if_in_use(&self) -> bool {
        let mut leaves = self.leaves();
        leaves.removed = leaves.in_use > 0;
        leaves.removed
    }

    pub(super) fn apply(
        &self,
        limits: &Limits,
        enabled: &[String],
        missing_logged: &[AtomicBool; 2],
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
                if value.is_some() && !logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(probe = %self.name, "limits NOT ENFORCED: the {controller} controller is not enabled in this agent's cgroup tree, so {file} is not set for this probe or any other: {ENABLE_CONTROLLER}");
                }
                continue;
            }
            if let Err(source) = fs::write(self.path.join(file), &text) {
                let e = LimitError {
                    file,
                    value: text,
                    source,
                };
                tracing::warn!(probe = %self.name, "{e}");
            }
        }
        *applied = Some(want);
    }

    /// A leaf for one run: an idle one, else a fresh one. Retired leaves that have emptied
    /// are removed on the way.
    pub fn checkout(self: &Arc<Self>) -> Result<RunCgroup, CgroupError> {
        let tree = self.tree.upgrade().ok_or(CgroupError::ShutDown)?;
        let mut leaves = self.leaves();
        leaves.retired.retain(|dir| match (tree.kernel.rmdir)(dir) {
            Err(e) => e.kind() != io::ErrorKind::NotFound,
            Ok(()) => false,
        });
        let leaf = match leaves.idle.pop() {
            Some(leaf) => leaf,
            None => Leaf::create(&tree, &self.path)?,
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
        let mut leaves = self.leaves();
        leaves.in_use -= 1;
        if leaves.removed && leaves.in_use == 0 {
            let mut dirs = std::mem::take(&mut leaves.retired);
            dirs.extend(leaves.idle.drain(..).map(|l| l.path.clone()));
            dirs.push(leaf.path.clone());
            drop((leaves, leaf));
            if let Some(tree) = self.tree.upgrade() {
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

impl Leaf {
    fn create(tree: &Registry, probe: &Path) -> Result<Self, CgroupError> {
        let path = probe.join(tree.next_leaf_name());
        if let Err(source) = (tree.kernel.mkdir)(&path) {
            return Err(CgroupError::CreateLeaf { path, source });
        }
        Self::open(&path).map_err(|source| {
            let _ = (tree.kernel.rmdir)(&path);
            CgroupError::OpenLeaf {
                path: path.clone(),
                source,
            }
        })
    }

    fn open(path: &Path) -> io::Result<Self> {
        let dir = open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // Both held while the probe is configured, and counted: past `fd::MANY_HELD`, high,
        // out of each child's copy of the agent's descriptor table.
        let events = fs::File::open(path.join("cgroup.events")).ok();
        Ok(Self {
            path: path.to_owned(),
            dir: held_high(above_stdio(dir)?),
            events: events.map(|f| held_high(f.into())),
        })
    }

    /// One of the leaf's files, opened through the directory held (close-on-exec).
    fn open_file(&self, name: &std::ffi::CStr, how: OFlag) -> nix::Result<OwnedFd> {
        nix::fcntl::openat(&*self.dir, name, how | OFlag::O_CLOEXEC, Mode::empty())
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
    /// listed until none is left. Only through the directory held: a removed leaf's files
    /// are gone (and a removed leaf was empty), never a kill by its (maybe reused) path.
    fn kill(&self) {
        use std::io::Write;
        if let Ok(kill_file) = self.open_file(c"cgroup.kill", OFlag::O_WRONLY) {
            let _ = fs::File::from(kill_file).write_all(b"1");
            return;
        }
        let Ok(listed) = self.open_file(c"cgroup.procs", OFlag::O_RDONLY) else {
            return;
        };
        let listed = fs::File::from(listed);
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
    /// The leaf's directory, for the spawn (clone3 clones into it; the clone(2) fallback
    /// opens its `cgroup.procs` through it).
    pub fn spawn_dir(&self) -> Option<&OwnedFd> {
        self.leaf.as_ref().map(|l| &*l.dir)
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
