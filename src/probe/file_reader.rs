//! File reads off the runtime, on threads of their own, so that a hung filesystem costs a
//! bounded number of threads and nothing else.
//!
//! Each read runs on a short-lived thread of its own (not tokio's shared blocking pool, so
//! the builtin sampler and the exec path never queue behind a stuck `open`). At most
//! [`HEALTHY_READS`] reads run at once; a read that outlives its timeout is *stuck*: its
//! thread is left in the kernel, it stops counting against the running reads, and it is
//! remembered with its mount until it returns. While it is stuck:
//! - a new read of the same path fails at once;
//! - a read of another path on the same mount fails at once (one hung NFS mount is one
//!   failure, not one per file);
//! - once `max_stuck` reads are stuck, a read of a path that has not answered before fails
//!   at once; paths that answered keep their capacity.
//!
//! One log line when a path gets stuck and one when it comes back, never one per tick.
//! Nothing here waits for a stuck thread: shutdown exits the process past them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Semaphore;

use super::child::Credentials;

/// Reads that may run at once (not stuck). A read lasts at most its timeout, so this is
/// throughput, not a limit on how many probes may read files.
pub const HEALTHY_READS: usize = 16;

/// Reader threads need little stack: a path, a buffer on the heap, a few syscalls.
const READER_STACK: usize = 128 * 1024;

/// How often the mount table is re-read while a read is stuck (mounts come and go).
const MOUNTS_TTL: Duration = Duration::from_secs(5);

/// What a file read gave.
#[derive(Debug)]
pub enum ReadOutcome {
    Text(String),
    /// This file (the probe's path, or one `*.prom` file of its directory) is this old.
    TooOld(PathBuf, Duration),
}

use super::read_error::{ReadError, Refusal, Unreadable};

/// One read: the path and how to read it.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub path: PathBuf,
    pub max_bytes: u64,
    pub max_age: Option<Duration>,
    pub timeout: Duration,
    /// `None`: read with the agent's own rights.
    pub creds: Option<std::sync::Arc<Credentials>>,
    /// A directory is read as a node_exporter textfile directory: its `*.prom` files.
    pub textfiles: bool,
}

struct Stuck {
    mount: PathBuf,
    since: Instant,
}

#[derive(Default)]
struct State {
    stuck: BTreeMap<PathBuf, Stuck>,
    /// Paths whose last read answered: past the stuck bound they may still be read.
    answered: BTreeSet<PathBuf>,
    mounts: Option<(Instant, Vec<PathBuf>)>,
}

/// The agent's file reads: shared by every file probe of one process.
pub struct FileReads {
    max_stuck: usize,
    running: Arc<Semaphore>,
    mountinfo: PathBuf,
    state: Mutex<State>,
}

impl FileReads {
    pub fn new(max_stuck: usize) -> Arc<Self> {
        Self::with_mountinfo(max_stuck, Path::new("/proc/self/mountinfo"))
    }

    /// With the mount table read from `mountinfo` (a fixture in tests).
    pub fn with_mountinfo(max_stuck: usize, mountinfo: &Path) -> Arc<Self> {
        Arc::new(Self {
            max_stuck,
            running: Arc::new(Semaphore::new(HEALTHY_READS)),
            mountinfo: mountinfo.to_owned(),
            state: Mutex::default(),
        })
    }

    pub fn max_stuck(&self) -> usize {
        self.max_stuck
    }

    /// Reads stuck in the kernel now (for /metrics).
    pub fn stuck_count(&self) -> usize {
        self.lock().stuck.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read `req.path` on a thread of its own, giving up after `req.timeout`.
    pub async fn read(self: &Arc<Self>, req: ReadRequest) -> Result<ReadOutcome, ReadError> {
        if let Some(r) = self.refusal(&req.path) {
            return Err(r.into());
        }
        // The timeout covers the wait for a free reader too: a run never outlasts it.
        let deadline = tokio::time::Instant::now() + req.timeout;
        let permit =
            match tokio::time::timeout_at(deadline, self.running.clone().acquire_owned()).await {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => return Err(Unreadable::ShutDown.into()),
                Err(_) => {
                    return Err(Refusal::Busy {
                        running: HEALTHY_READS,
                        path: req.path,
                    }
                    .into())
                }
            };
        // Checked again: a read of this mount may have got stuck while this one queued.
        if let Some(r) = self.refusal(&req.path) {
            return Err(r.into());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let slot = Arc::new(Mutex::new(Slot::default()));
        let (reads, thread_slot, path) = (self.clone(), slot.clone(), req.path.clone());
        let timeout = req.timeout;
        let spawned = std::thread::Builder::new()
            .name("xce-file-read".into())
            .stack_size(READER_STACK)
            .spawn(move || {
                let result = read_file(&req);
                reads.finished(&req.path, &thread_slot, result.is_ok());
                let _ = tx.send(result);
            });
        if let Err(source) = spawned {
            return Err(Unreadable::NoThread { path, source }.into());
        }
        // Dropped before the read finishes (timeout, or the probe was stopped): the thread
        // is accounted as stuck until it returns.
        let abandon = Abandon {
            reads: self,
            path: &path,
            slot: &slot,
        };
        let result = tokio::time::timeout_at(deadline, rx).await;
        drop(permit);
        match result {
            Ok(Ok(r)) => {
                std::mem::forget(abandon);
                r.map_err(ReadError::Failed)
            }
            Ok(Err(_)) => {
                std::mem::forget(abandon);
                Err(Unreadable::ThreadLost { path }.into())
            }
            Err(_) => {
                drop(abandon);
                Err(ReadError::TimedOut {
                    path,
                    after: timeout,
                })
            }
        }
    }

    /// Why a read of `path` must not start now, if it must not.
    fn refusal(&self, path: &Path) -> Option<Refusal> {
        let mut st = self.lock();
        if st.stuck.is_empty() {
            return None;
        }
        let path = path.to_owned();
        if st.stuck.contains_key(&path) {
            return Some(Refusal::PathStuck { path });
        }
        let mount = self.mount_of(&mut st, &path);
        if let Some((other, _)) = st.stuck.iter().find(|(_, s)| s.mount == mount) {
            let other = other.clone();
            return Some(Refusal::MountStuck { path, mount, other });
        }
        if st.stuck.len() >= self.max_stuck && !st.answered.contains(&path) {
            let stuck = st.stuck.len();
            return Some(Refusal::TooManyStuck { stuck, path });
        }
        None
    }

    /// The mount point `path` lives on, from the mount table (by name: nothing under a
    /// possibly hung mount is touched). Re-read at most every [`MOUNTS_TTL`].
    fn mount_of(&self, st: &mut State, path: &Path) -> PathBuf {
        let fresh = st
            .mounts
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < MOUNTS_TTL);
        if !fresh {
            let table = std::fs::read_to_string(&self.mountinfo)
                .map(|t| mount_points(&t))
                .unwrap_or_default();
            st.mounts = Some((Instant::now(), table));
        }
        let table = st.mounts.as_ref().map(|(_, t)| t.as_slice()).unwrap_or(&[]);
        longest_mount(table, path)
    }

    /// The read gave up waiting: if the thread is still in the kernel, the path is stuck.
    fn abandoned(&self, path: &Path, slot: &Mutex<Slot>) {
        let mut st = self.lock();
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return;
        }
        s.stuck = true;
        st.answered.remove(path);
        let mount = self.mount_of(&mut st, path);
        tracing::warn!(
            path = %path.display(),
            mount = %mount.display(),
            stuck = st.stuck.len() + 1,
            "a read is stuck in the kernel (hung filesystem?); reads on this mount fail at once until it returns"
        );
        st.stuck.insert(
            path.to_owned(),
            Stuck {
                mount,
                since: Instant::now(),
            },
        );
    }

    /// Called by the reader thread when its read returns, whenever that is.
    fn finished(&self, path: &Path, slot: &Mutex<Slot>, answered: bool) {
        let mut st = self.lock();
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        s.finished = true;
        if answered {
            st.answered.insert(path.to_owned());
        }
        if s.stuck {
            if let Some(was) = st.stuck.remove(path) {
                tracing::warn!(
                    path = %path.display(),
                    after = %humantime::format_duration(Duration::from_secs(was.since.elapsed().as_secs())),
                    "a stuck read returned; reads on its mount start again"
                );
            }
        }
    }
}

/// One read's state, changed under the `FileReads` lock so that "finished" and "gave up"
/// cannot miss each other: whichever comes second sees the other.
#[derive(Default)]
struct Slot {
    finished: bool,
    stuck: bool,
}

struct Abandon<'a> {
    reads: &'a FileReads,
    path: &'a Path,
    slot: &'a Mutex<Slot>,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.reads.abandoned(self.path, self.slot);
    }
}

/// Mount points from /proc/self/mountinfo (field 5, with the kernel's octal escapes).
fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_octal(m)))
        .collect()
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 4]).ok())
            .flatten()
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The longest mount point that is a component prefix of `path` (`/` when none is).
fn longest_mount(table: &[PathBuf], path: &Path) -> PathBuf {
    table
        .iter()
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.components().count())
        .cloned()
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// The read itself, on the reader thread.
fn read_file(req: &ReadRequest) -> Result<ReadOutcome, Unreadable> {
    if let Some(creds) = &req.creds {
        super::reader_creds::become_reader(creds).map_err(|source| Unreadable::AsUser {
            path: req.path.clone(),
            user: creds.user.clone(),
            source,
        })?;
    }
    if req.textfiles && req.path.is_dir() {
        read_textfile_dir(req)
    } else {
        read_one(req, &req.path, req.max_bytes)
    }
}

/// The files a node_exporter textfile collector reads: `*.prom` in the directory, in name
/// order, joined; `max_bytes` bounds them all together, `max_age` each.
fn read_textfile_dir(req: &ReadRequest) -> Result<ReadOutcome, Unreadable> {
    let dir = &req.path;
    let entries = std::fs::read_dir(dir).map_err(|e| Unreadable::io("list", dir, e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "prom") && p.is_file())
        .collect();
    files.sort();
    let mut all = String::new();
    for f in files {
        let left = req.max_bytes.saturating_sub(all.len() as u64);
        match read_one(req, &f, left)? {
            old @ ReadOutcome::TooOld(..) => return Ok(old),
            ReadOutcome::Text(t) => {
                all.push_str(&t);
                if !all.ends_with('\n') {
                    all.push('\n');
                }
            }
        }
    }
    Ok(ReadOutcome::Text(all))
}

/// One file, at most `max_bytes`, text only, `max_age` checked on its mtime.
fn read_one(req: &ReadRequest, path: &Path, max_bytes: u64) -> Result<ReadOutcome, Unreadable> {
    let f = std::fs::File::open(path).map_err(|source| match (&req.creds, source.kind()) {
        (Some(c), std::io::ErrorKind::PermissionDenied) => Unreadable::Denied {
            path: path.to_owned(),
            user: c.user.clone(),
            source,
        },
        _ => Unreadable::io("open", path, source),
    })?;
    let meta = f.metadata().map_err(|e| Unreadable::io("stat", path, e))?;
    // Owned only for an error: a good read allocates no path.
    let path_buf = || path.to_owned();
    if meta.is_dir() {
        return Err(Unreadable::Directory { path: path_buf() });
    }
    if let Some(max_age) = req.max_age {
        let mtime = meta.modified().map_err(|source| Unreadable::NoMtime {
            path: path_buf(),
            source,
        })?;
        // A future mtime (clock skew) counts as fresh.
        let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
        if age > max_age {
            return Ok(ReadOutcome::TooOld(path_buf(), age));
        }
    }
    let mut buf = Vec::new();
    f.take(max_bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| Unreadable::io("read", path, e))?;
    if buf.len() as u64 > max_bytes {
        let path = path_buf();
        return Err(Unreadable::TooLarge { path, max_bytes });
    }
    if buf.contains(&0) {
        return Err(Unreadable::Nul { path: path_buf() });
    }
    String::from_utf8(buf)
        .map(ReadOutcome::Text)
        .map_err(|e| Unreadable::NotUtf8 {
            path: path_buf(),
            source: e.utf8_error(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_of_a_path_is_its_longest_mount_point() {
        let table = mount_points(
            "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n\
             23 22 0:22 / /proc rw - proc proc rw\n\
             24 22 0:23 / /scratch\\040space rw - nfs srv:/x rw\n\
             25 22 0:24 / /scratch rw - nfs srv:/y rw\n",
        );
        let at = |p: &str| longest_mount(&table, Path::new(p));
        assert_eq!(at("/proc/uptime"), Path::new("/proc"));
        assert_eq!(at("/scratch space/f"), Path::new("/scratch space"));
        assert_eq!(at("/scratch/f"), Path::new("/scratch"));
        assert_eq!(at("/scratchy/f"), Path::new("/"));
        assert_eq!(longest_mount(&[], Path::new("/x")), Path::new("/"));
    }
}
