//! Why a file read gave no text, as data: the path, what was tried, and the kernel's error as
//! the source. The texts stay the same from tick to tick for the same cause: a probe logs a
//! failure when its text changes.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Why a read gave no text.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not started: a stuck read stands in the way.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Started and outlived its timeout; its thread is now stuck.
    #[error("read of {} timed out after {}", .path.display(), humantime::format_duration(*.after))]
    TimedOut { path: PathBuf, after: Duration },
    /// The file could not be read (missing, too big, not text, permission denied).
    #[error(transparent)]
    Failed(#[from] Unreadable),
}

/// Why a read was not started.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// All `running` reads that may run at once took the whole timeout.
    #[error("{running} other file reads took the whole timeout (hung filesystem?); {} was not read", .path.display())]
    Busy { running: usize, path: PathBuf },
    #[error("an earlier read of {} is still blocked in the kernel (hung filesystem?); not starting another", .path.display())]
    PathStuck { path: PathBuf },
    #[error("{} is on {}, where a read of {} is stuck in the kernel (hung mount?); not reading it until that read returns", .path.display(), .mount.display(), .other.display())]
    MountStuck {
        path: PathBuf,
        mount: PathBuf,
        /// The stuck read's path.
        other: PathBuf,
    },
    #[error("{stuck} reads are stuck in the kernel (max_stuck_reads); not starting another of {}, which has not answered yet", .path.display())]
    TooManyStuck { stuck: usize, path: PathBuf },
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("file reads are shut down")]
    ShutDown,
    #[error("cannot start a thread to read {}: {source}", .path.display())]
    NoThread { path: PathBuf, source: io::Error },
    #[error("the thread reading {} ended without a result", .path.display())]
    ThreadLost { path: PathBuf },
    /// The reader thread could not take the probe user's rights.
    #[error("cannot read {} as {user}: {source}", .path.display())]
    AsUser {
        path: PathBuf,
        user: String,
        source: io::Error,
    },
    /// `step` (list, open, stat, read) failed.
    #[error("cannot {step} {}: {source}", .path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// Opening it was denied to the probe's user: the message says how to allow it.
    #[error("cannot open {}: permission denied for {user} (file probes read as run_as); make it readable by {user} (e.g. chgrp a group of {user} and chmod g+r), or set `run_as: root` on this probe", .path.display())]
    Denied {
        path: PathBuf,
        user: String,
        source: io::Error,
    },
    #[error("no mtime for {}: {source}", .path.display())]
    NoMtime { path: PathBuf, source: io::Error },
    #[error("{} is a directory", .path.display())]
    Directory { path: PathBuf },
    #[error("{} is larger than max_bytes ({max_bytes})", .path.display())]
    TooLarge { path: PathBuf, max_bytes: u64 },
    #[error("{} contains NUL bytes", .path.display())]
    Nul { path: PathBuf },
    #[error("{} is not valid UTF-8", .path.display())]
    NotUtf8 {
        path: PathBuf,
        source: std::str::Utf8Error,
    },
}

impl Unreadable {
    /// `step` of reading `path` failed with `source`.
    pub fn io(step: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        Self::Io {
            step,
            path: path.to_owned(),
            source,
        }
    }
}
