//! What can go wrong, per operation: setting the tree up (after which the agent contains
//! probes by process group only), making a probe's cgroup or a run's leaf (that run fails),
//! setting a limit (logged; the probe runs without it).

use std::io;
use std::path::PathBuf;

pub use super::host::DetectError;
pub use super::liveness::LockDirError;

/// Why the agent has no cgroup tree of its own.
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    /// The runs of a library caller (a test, a benchmark) that asked for none.
    #[error("not set up for this caller")]
    NotAsked,
    #[error(transparent)]
    Detect(#[from] DetectError),
    #[error(transparent)]
    LockDir(#[from] LockDirError),
    #[error("another agent holds this unit's cgroup {}", .0.display())]
    Taken(PathBuf),
    #[error("cannot read this process's start time from /proc/self/stat")]
    NoStartTime,
    #[error("cannot lock {}: {source}", .path.display())]
    Lock { path: PathBuf, source: io::Error },
    #[error("cannot create {}: {source}", .path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot move the agent into {}: {source}", .path.display())]
    MoveIn { path: PathBuf, source: io::Error },
}

/// Why a probe's run gets no cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot create {}: {source}", .path.display())]
    CreateProbe { path: PathBuf, source: io::Error },
    #[error("cannot create {}: {source}", .path.display())]
    CreateLeaf { path: PathBuf, source: io::Error },
    #[error("cannot open {}: {source}", .path.display())]
    OpenLeaf { path: PathBuf, source: io::Error },
    #[error("the agent's cgroup tree has been shut down")]
    ShutDown,
}

impl From<CgroupError> for io::Error {
    /// For the spawn's error, which says the stage ("joining the probe's cgroup").
    fn from(e: CgroupError) -> Self {
        let kind = match &e {
            CgroupError::CreateProbe { source, .. }
            | CgroupError::CreateLeaf { source, .. }
            | CgroupError::OpenLeaf { source, .. } => source.kind(),
            CgroupError::ShutDown => io::ErrorKind::NotFound,
        };
        io::Error::new(kind, e)
    }
}

/// A limit (`memory.max`, `pids.max`) that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot set {file} to {value}: {source}")]
pub struct LimitError {
    pub file: &'static str,
    pub value: String,
    pub source: io::Error,
}
