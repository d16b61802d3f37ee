//! The proof that a subtree's agent is alive: an exclusive `flock` on a lock file named
//! after the subtree's cgroup, in a directory only the agent's user (root) can enter.
//!
//! Why not a lock on the cgroup directory itself (as before): cgroup directories are
//! readable by everyone, so any user could open one and hold a shared or exclusive `flock`
//! on it. Holding it made a delegated agent refuse its own unit ("another agent holds this
//! unit's cgroup"), hung a plain agent's start (it waits for its new subtree's lock), and
//! kept a dead agent's subtree, with its processes, from being removed. A file in a
//! directory of mode 0700 cannot be opened by another user at all, so only the agent's own
//! user can hold or forge the proof. The cgroup directory is never locked now: a lock on it
//! means nothing to any agent.
//!
//! The lock file is named by the cgroup's identity (`cgroup.<dev>.<ino>.lock`), not its
//! path: the kernel never gives a live cgroup's id to another (64-bit ids are not reused
//! within a boot), and every mount of the hierarchy, every cgroup namespace and every
//! spelling of the path (`/sys/fs/cgroup/unified/...`) names the same id. No escaping, and
//! two cgroups never share a file.
//!
//! A lock file nobody holds proves nothing, so whoever holds one may unlink it (the owner at
//! its shutdown, a neighbour that judged the subtree): a holder's proof counts only while
//! the directory still names the file it locked, which [`LockDir::lock`] checks after each
//! lock and retries otherwise. So unlinking never lets two processes both hold a subtree.
//!
//! Agents that do not share the lock directory (a container with its own `/run`) cannot see
//! each other's locks. That is why the lock is one proof of two: a sibling is judged
//! abandoned only when its lock is free here *and* its agent has moved out of its `agent/`
//! cgroup (see `subtree.rs`); an agent never kills what it cannot prove abandoned.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

/// Where root's agents keep their locks: under the unit's `RuntimeDirectory=xce-agent`, so
/// a unit with `ProtectSystem=strict` may still write it.
pub const DEFAULT_LOCK_DIR: &str = "/run/xce-agent/locks";

/// Why the lock directory is refused or cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum LockDirError {
    #[error("cannot create or open the lock directory {}: {source}", .path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("the lock directory {} is refused: {why} (it must be a directory of the agent's user, mode 0700, with no directory above it writable by another user)", .path.display())]
    Unsafe { path: PathBuf, why: Unsafe },
    #[error("no lock directory for a user other than root: XDG_RUNTIME_DIR is not set")]
    NoPlace,
}

/// What makes a lock directory one that another user could enter or change.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Unsafe {
    #[error("it is a symbolic link")]
    Symlink,
    #[error("it is not a directory")]
    NotDirectory,
    #[error("it is owned by uid {0}, not the agent's")]
    Owner(u32),
    #[error("its mode is {0:04o}: group or others have access")]
    Mode(u32),
    #[error("{} above it is owned by uid {uid}", .dir.display())]
    AncestorOwner { dir: PathBuf, uid: u32 },
    #[error("{} above it is writable by others (mode {mode:04o}, not sticky)", .dir.display())]
    AncestorWritable { dir: PathBuf, mode: u32 },
}

/// The lock directory, opened once and checked: every lock file is opened relative to it,
/// so a later change to the path above it cannot redirect a lock.
#[derive(Debug)]
pub struct LockDir {
    path: PathBuf,
    dir: OwnedFd,
}

impl LockDir {
    /// This process's lock directory: [`DEFAULT_LOCK_DIR`] for root, else
    /// `$XDG_RUNTIME_DIR/xce-agent/locks` (a user's agent with a delegated cgroup).
    pub fn default_path() -> Result<PathBuf, LockDirError> {
        if nix::unistd::geteuid().is_root() {
            return Ok(PathBuf::from(DEFAULT_LOCK_DIR));
        }
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(|d| Path::new(&d).join("xce-agent/locks"))
            .ok_or(LockDirError::NoPlace)
    }

    /// Open `path` (made with mode 0700 where missing), refusing one another user could
    /// enter or replace.
    pub fn open(path: &Path) -> Result<Arc<LockDir>, LockDirError> {
        let failed = |source: io::Error| LockDirError::Open {
            path: path.to_owned(),
            source,
        };
        let refused = |why: Unsafe| LockDirError::Unsafe {
            path: path.to_owned(),
            why,
        };
        // Directories made above it as root are left open to read (`/run/xce-agent` also
        // holds the status socket, which `status` reaches as other users); a user's own
        // (`$XDG_RUNTIME_DIR/xce-agent`) is private, as the status socket's code makes it:
        // whichever of the two makes it first, its mode is the same.
        if let Some(parent) = path.parent().filter(|p| !p.exists()) {
            let mode = if nix::unistd::geteuid().is_root() {
                0o755
            } else {
                0o700
            };
            fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(parent)
                .map_err(failed)?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(path)
            .or_else(|e| match fs::symlink_metadata(path) {
                // There already, or a symlink to nowhere: judged below.
                Ok(_) => Ok(()),
                Err(_) => Err(e),
            })
            .map_err(failed)?;
        let me = nix::unistd::geteuid().as_raw();
        for above in path
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
        {
            let meta = fs::metadata(above).map_err(failed)?;
            if meta.uid() != 0 && meta.uid() != me {
                return Err(refused(Unsafe::AncestorOwner {
                    dir: above.to_owned(),
                    uid: meta.uid(),
                }));
            }
            let mode = meta.mode() & 0o7777;
            // Sticky (/tmp): others may add entries but not rename or remove ours.
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                return Err(refused(Unsafe::AncestorWritable {
                    dir: above.to_owned(),
                    mode,
                }));
            }
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dir = match nix::fcntl::open(path, flags, Mode::empty()) {
            Ok(dir) => dir,
            // O_NOFOLLOW with O_DIRECTORY says ENOTDIR for a symlink: which one it was.
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                let symlink = fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink());
                return Err(refused(match symlink {
                    true => Unsafe::Symlink,
                    false => Unsafe::NotDirectory,
                }));
            }
            Err(e) => return Err(failed(e.into())),
        };
        // Checked on what was opened, not on the path again.
        let meta = fs::File::from(dir.try_clone().map_err(failed)?)
            .metadata()
            .map_err(failed)?;
        if meta.uid() != me {
            return Err(refused(Unsafe::Owner(meta.uid())));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refused(Unsafe::Mode(meta.mode() & 0o7777)));
        }
        Ok(Arc::new(LockDir {
            path: path.to_owned(),
            dir,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lock the subtree at `subtree` (exclusive); `None` when another process holds it
    /// (only with [`Wait::No`]). The lock is the one an agent holds on its subtree.
    pub fn lock(self: &Arc<Self>, subtree: &Path, wait: Wait) -> io::Result<Option<SubtreeLock>> {
        let cgroup = CgroupId::of(subtree)?;
        let name = cgroup.file_name();
        let arg = match wait {
            Wait::Yes => FlockArg::LockExclusive,
            Wait::No => FlockArg::LockExclusiveNonblock,
        };
        loop {
            // Close-on-exec: no probe ever inherits the lock (it would outlive the agent);
            // no symlink followed, though only this user can put one there.
            let fd = nix::fcntl::openat(
                self.dir.as_fd(),
                name.as_str(),
                OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::S_IRUSR | Mode::S_IWUSR,
            )?;
            let lock = match Flock::lock(fs::File::from(fd), arg) {
                Ok(lock) => lock,
                Err((_, Errno::EWOULDBLOCK)) if wait == Wait::No => return Ok(None),
                Err((_, e)) => return Err(e.into()),
            };
            let held = lock.metadata()?;
            match nix::sys::stat::fstatat(
                self.dir.as_fd(),
                name.as_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(now) if now.st_ino == held.ino() && now.st_dev == held.dev() => {
                    return Ok(Some(SubtreeLock {
                        _lock: lock,
                        dir: self.clone(),
                        name,
                        cgroup,
                    }))
                }
                // Unlinked by its last holder while this one waited for it: a lock on a
                // file the directory no longer names proves nothing. Again.
                Ok(_) | Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
pub enum Wait {
    Yes,
    No,
}

/// A cgroup's identity: the same through every mount, namespace and path spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CgroupId {
    dev: u64,
    ino: u64,
}

impl CgroupId {
    /// The cgroup at `path` (not followed: a cgroup is never a symlink).
    pub(super) fn of(path: &Path) -> io::Result<CgroupId> {
        let meta = fs::symlink_metadata(path)?;
        if !meta.is_dir() {
            return Err(io::ErrorKind::NotADirectory.into());
        }
        Ok(CgroupId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Its lock file's name in the lock directory.
    pub(super) fn file_name(&self) -> String {
        format!("cgroup.{}.{}.lock", self.dev, self.ino)
    }
}

/// The exclusive lock on a subtree's lock file (see the module's doc); the kernel drops it
/// with the last descriptor, however the holder ends.
#[derive(Debug)]
pub struct SubtreeLock {
    _lock: Flock<fs::File>,
    dir: Arc<LockDir>,
    name: String,
    /// The cgroup it was taken for, as it was then.
    pub(super) cgroup: CgroupId,
}

impl SubtreeLock {
    /// Unlink the lock file, still holding it (its subtree is gone, or judged): a later
    /// locker makes a fresh one. See the module's doc for why this is safe. Only while the
    /// directory names the file held: a second call (a shutdown, then the drop) must not
    /// unlink the file a later agent of the same cgroup (a unit's) locked since. Nobody
    /// else can put a file there while ours is named: lockers only make one where none is.
    pub fn remove_file(&self) {
        let held = match self._lock.metadata() {
            Ok(held) => held,
            Err(_) => return,
        };
        let named = nix::sys::stat::fstatat(
            self.dir.dir.as_fd(),
            self.name.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        if !named.is_ok_and(|now| now.st_ino == held.ino() && now.st_dev == held.dev()) {
            return;
        }
        match nix::unistd::unlinkat(
            self.dir.dir.as_fd(),
            self.name.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => tracing::debug!(
                "cannot remove the lock file {}: {e}",
                self.dir.path.join(&self.name).display()
            ),
        }
    }

    /// The lock file's path, for tests and logs.
    pub fn path(&self) -> PathBuf {
        self.dir.path.join(&self.name)
    }
}
