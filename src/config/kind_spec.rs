//! What each probe kind runs or reads, validated: the program of an exec or stream probe
//! with its limits, the file of a file probe. Below `probe_spec`, whose kind table builds
//! these; above the field shapes they are made of.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::pattern::Pattern;
use super::stdio::{StdinMode, StdoutMode};
use crate::output::{Format, Selection};

#[derive(Debug, Clone, PartialEq)]
pub struct ExecSpec {
    /// The argv; for `shell:`, [`SHELL`], `-c` and the line.
    pub command: Vec<String>,
    /// Given as `shell:`: a shell runs `command[2]`.
    pub shell: bool,
    pub format: Format,
    /// `select:` and `aggregate:`: which sample feeds which resource.
    pub select: Selection,
    pub env: BTreeMap<String, String>,
    pub run_as: Option<String>,
    pub limits: Limits,
    /// `PR_SET_NO_NEW_PRIVS` for the child (default on; off only for a probe that needs a
    /// setuid helper).
    pub no_new_privs: bool,
    /// `stdout: pty` for a program that block-buffers a pipe.
    pub stdout: StdoutMode,
    /// `trusted:`: the admin's reason for letting this probe's program text (which the
    /// script rule cannot prove safe) run as root; `None`: such a probe is refused as root.
    pub trusted: Option<String>,
    /// `capture:`: the commands whose calls become this probe's values (empty: none).
    pub capture: Vec<Capturer>,
}

/// What `capture:` can stand in for: each a family of commands a script reports through.
/// The agent's stand-ins of these commands come first on the probe's PATH (`probe::capture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capturer {
    /// The node's state as the scheduler is told it: Slurm's `scontrol update ...
    /// State=DRAIN|DOWN|RESUME`, PBS/Torque's `pbsnodes -o|-c|-r`.
    NodeState,
    /// Ganglia's `gmetric -n NAME -v VALUE`: each call a sample.
    Gmetric,
}

impl Capturer {
    pub const ALL: &'static [Capturer] = &[Capturer::NodeState, Capturer::Gmetric];

    /// The name `capture:` takes.
    pub fn name(self) -> &'static str {
        match self {
            Capturer::NodeState => "node_state",
            Capturer::Gmetric => "gmetric",
        }
    }

    /// The commands stood in for.
    pub fn commands(self) -> &'static [&'static str] {
        match self {
            Capturer::NodeState => &["scontrol", "pbsnodes"],
            Capturer::Gmetric => &["gmetric"],
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.name() == name)
    }

    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|c| c.name()).collect()
    }
}

/// The shell that runs a `shell:` line.
pub const SHELL: &str = "/bin/sh";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub cpu: Option<Duration>,
    pub address_space: Option<u64>,
    pub open_files: Option<u64>,
    pub processes: Option<u64>,
    /// cgroup `memory.max` of the probe's cgroup (bytes), where containment is on.
    pub memory: Option<u64>,
    /// cgroup `pids.max` of the probe's cgroup.
    pub pids: Option<u64>,
}

impl Limits {
    /// The cgroup controllers that limits can need, with the file each limit is set in.
    pub const CGROUP_CONTROLLERS: [(&'static str, &'static str); 2] =
        [("memory", "memory.max"), ("pids", "pids.max")];

    /// Whether these limits set one on `controller` (one of [`Self::CGROUP_CONTROLLERS`]):
    /// a limit that is enforced only where the probes' cgroups have that controller.
    pub fn uses_controller(&self, controller: &str) -> bool {
        match controller {
            "memory" => self.memory.is_some(),
            "pids" => self.pids.is_some(),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FileSpec {
    pub path: PathBuf,
    pub regex: Option<Pattern>,
    pub max_age: Option<Duration>,
    pub max_bytes: u64,
    /// The file's text in a probe output format (a node_exporter textfile); with a
    /// directory as `path`, its `*.prom` files.
    pub format: Option<Format>,
    pub select: Selection,
    /// Who reads the file when the agent is root (default: agent.yaml's `run_as`).
    pub run_as: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpec {
    pub exec: ExecSpec,
    /// Values go stale after this long without a line; default 3 intervals.
    pub silence: Option<Duration>,
    pub restart_on_silence: bool,
    /// `stdin: signal`: a newline at each interval asks the child for a batch.
    pub stdin: StdinMode,
    /// `declared_state`: the probe's budget for what it declares, in bytes
    /// (`output::DeclaredBudget`).
    pub declared_state: usize,
}

pub const DEFAULT_FILE_MAX_BYTES: u64 = 64 * 1024;
