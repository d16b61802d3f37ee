//! A probe's own state directory, where its plugin keeps what it needs from one run to the
//! next: a Munin plugin's `MUNIN_PLUGSTATE`, into which Munin::Plugin's `save_state` writes
//! `MUNIN_STATEFILE` (diskstats keeps its last counters there to compute rates).
//!
//! munin-node gives each user one directory (`/var/lib/munin-node/plugin-state/nobody`); the
//! agent gives each probe one, `<state>/plugin-state/<probe>`, so two probes of one user do
//! not share files either. `<state>` is systemd's `$STATE_DIRECTORY` (the unit's
//! `StateDirectory=xce-agent`), else `/var/lib/xce-agent` as root, else
//! `$XDG_STATE_HOME/xce-agent` (`$HOME/.local/state/xce-agent` without it).
//!
//! The directory is made at the probe's first run that needs it, mode 0700, owned by the
//! user the probe runs as; before every such run it is checked, as are the two directories
//! above it the agent owns: a symbolic link, another owner or a directory others may write
//! is refused with the path and the fix, since a probe as one user must not be handed a
//! directory another user controls. The agent's own directories are writable by the agent
//! only, so nobody else can swap an entry between the check and the run.

use std::ffi::OsStr;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::unistd::{Gid, Uid};

/// A root agent's state directory outside systemd.
pub const ROOT_STATE_DIR: &str = "/var/lib/xce-agent";
/// The directory under the state directory that holds one directory per probe.
pub const PLUGIN_STATE: &str = "plugin-state";

/// The agent's state directory for a process of `euid` with these environment variables
/// (see the module's text); `None` for a user without `$XDG_STATE_HOME` or `$HOME`.
pub fn state_root(
    euid: u32,
    state_directory: Option<&OsStr>,
    xdg_state_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    let absolute = |v: Option<&OsStr>| {
        v.map(Path::new)
            .filter(|p| p.is_absolute())
            .map(Path::to_owned)
    };
    // systemd lists several directories separated by spaces when the unit names several.
    let systemd = state_directory
        .and_then(OsStr::to_str)
        .and_then(|v| v.split(' ').next())
        .map(OsStr::new);
    if let Some(dir) = absolute(systemd) {
        return Some(dir);
    }
    if euid == 0 {
        return Some(PathBuf::from(ROOT_STATE_DIR));
    }
    absolute(xdg_state_home)
        .or_else(|| absolute(home).map(|h| h.join(".local/state")))
        .map(|d| d.join("xce-agent"))
}

/// This process's state directory (read from its environment once).
pub fn here() -> Option<&'static Path> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        state_root(
            nix::unistd::geteuid().as_raw(),
            std::env::var_os("STATE_DIRECTORY").as_deref(),
            std::env::var_os("XDG_STATE_HOME").as_deref(),
            std::env::var_os("HOME").as_deref(),
        )
    })
    .as_deref()
}

/// `<state>/plugin-state/<probe>`. A probe's name is a resource name (letters, digits, `_`),
/// so it is one path component.
pub fn probe_dir(probe: &str) -> Option<PathBuf> {
    here().map(|root| root.join(PLUGIN_STATE).join(probe))
}

#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("no state directory for the probe's plugin: the agent runs as a user without $XDG_STATE_HOME or $HOME (set one, or run it under systemd with StateDirectory=)")]
    NoRoot,
    #[error("cannot make the probe's state directory {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is a symbolic link, not the probe's state directory: remove it (the agent makes the directory again)", .0.display())]
    Link(PathBuf),
    #[error("{} is not a directory: remove it (the agent makes the directory again)", .0.display())]
    NotDirectory(PathBuf),
    #[error("{} is owned by uid {found}, not uid {want} (the user the probe runs as, or the agent above it): remove it (the agent makes it again)", path.display())]
    Owner {
        path: PathBuf,
        found: u32,
        want: u32,
    },
    #[error("{} may be written by others (mode {mode:o}): chmod go-w it", path.display())]
    Writable { path: PathBuf, mode: u32 },
}

/// Make (at first need) and check the state directory of `probe` for a probe running as
/// `owner` (the agent's own user when `None`); its path, for `MUNIN_PLUGSTATE`.
pub fn ensure(probe: &str, owner: Option<(Uid, Gid)>) -> Result<PathBuf, StateDirError> {
    let dir = probe_dir(probe).ok_or(StateDirError::NoRoot)?;
    ensure_at(&dir, owner)
}

/// [`ensure`] for the directory `dir`, whose two parents are the agent's.
pub fn ensure_at(dir: &Path, owner: Option<(Uid, Gid)>) -> Result<PathBuf, StateDirError> {
    let (uid, gid) = owner.unwrap_or_else(|| (Uid::effective(), Gid::effective()));
    let agent = Uid::effective();
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| StateDirError::Io { path, source }
    };
    let plugin_state = dir.parent().unwrap_or(dir);
    let root = plugin_state.parent().unwrap_or(plugin_state);
    // Readable by all as root (as systemd's StateDirectoryMode=0755): each probe's own
    // directory is closed. A user's agent keeps its tree private.
    let parent_mode = if agent.is_root() { 0o755 } else { 0o700 };
    for parent in [root, plugin_state] {
        make(parent, parent_mode).map_err(io(parent))?;
        check(parent, agent)?;
    }
    if make(dir, 0o700).map_err(io(dir))? {
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            dir,
            Some(uid),
            Some(gid),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| StateDirError::Io {
            path: dir.to_owned(),
            source: e.into(),
        })?;
    }
    check(dir, uid)?;
    Ok(dir.to_owned())
}

/// What [`ensure`] would refuse, for `check`, which makes nothing: each of the probe's
/// state directory and the two above it that exists, checked as a run would check it.
pub fn inspect(probe: &str, owner: Option<Uid>) -> Result<(), StateDirError> {
    let dir = probe_dir(probe).ok_or(StateDirError::NoRoot)?;
    let agent = Uid::effective();
    let plugin_state = dir.parent().unwrap_or(&dir);
    let root = plugin_state.parent().unwrap_or(plugin_state);
    let wants = [
        (root, agent),
        (plugin_state, agent),
        (dir.as_path(), owner.unwrap_or(agent)),
    ];
    for (path, owner) in wants {
        if std::fs::symlink_metadata(path).is_ok() {
            check(path, owner)?;
        }
    }
    Ok(())
}

/// Make `dir` with `mode` where it is missing (not its parents, but for the state root's):
/// whether this call made it.
fn make(dir: &Path, mode: u32) -> std::io::Result<bool> {
    let made = std::fs::DirBuilder::new().mode(mode).create(dir);
    match made {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The state root's parents (`~/.local/state`): the usual mode for them.
            if let Some(parent) = dir.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)?;
            }
            std::fs::DirBuilder::new().mode(mode).create(dir)?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// `path` is a directory (not a link to one) that `owner` owns and nobody else may write.
fn check(path: &Path, owner: Uid) -> Result<(), StateDirError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| StateDirError::Io {
        path: path.to_owned(),
        source,
    })?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(StateDirError::Link(path.to_owned()));
    }
    if !kind.is_dir() {
        return Err(StateDirError::NotDirectory(path.to_owned()));
    }
    if meta.uid() != owner.as_raw() {
        return Err(StateDirError::Owner {
            path: path.to_owned(),
            found: meta.uid(),
            want: owner.as_raw(),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StateDirError::Writable {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_state_root_follows_systemd_then_root_then_xdg() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert_eq!(
            state_root(0, os("/var/lib/xce-agent /var/lib/other"), None, None),
            Some(PathBuf::from("/var/lib/xce-agent"))
        );
        assert_eq!(
            state_root(0, None, os("/home/x/.st"), None),
            Some(PathBuf::from(ROOT_STATE_DIR))
        );
        assert_eq!(
            state_root(1000, None, os("/home/x/.st"), os("/home/x")),
            Some(PathBuf::from("/home/x/.st/xce-agent"))
        );
        assert_eq!(
            state_root(1000, None, os("relative"), os("/home/x")),
            Some(PathBuf::from("/home/x/.local/state/xce-agent"))
        );
        assert_eq!(state_root(1000, None, None, None), None);
    }

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state").join(PLUGIN_STATE).join("disk_io");
        (tmp, dir)
    }

    #[test]
    fn made_at_first_need_private_and_checked_after() {
        let (_tmp, dir) = tree();
        assert_eq!(ensure_at(&dir, None).unwrap(), dir);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        // The second time it is only checked.
        std::fs::write(dir.join("state"), "kept").unwrap();
        ensure_at(&dir, None).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("state")).unwrap(), "kept");
    }

    #[test]
    fn a_link_a_file_or_a_directory_others_may_write_is_refused() {
        let (tmp, dir) = tree();
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let e = ensure_at(&dir, None).unwrap_err();
        assert!(matches!(e, StateDirError::Link(_)), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_file(&dir).unwrap();
        std::fs::write(&dir, "").unwrap();
        let e = ensure_at(&dir, None).unwrap_err();
        assert!(matches!(e, StateDirError::NotDirectory(_)), "{e}");
        std::fs::remove_file(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_at(&dir, None).unwrap_err();
        assert!(e.to_string().contains("mode 777"), "{e}");
        // The agent's own directory above it, too.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let above = dir.parent().unwrap();
        std::fs::set_permissions(above, std::fs::Permissions::from_mode(0o757)).unwrap();
        let e = ensure_at(&dir, None).unwrap_err();
        assert!(matches!(e, StateDirError::Writable { .. }), "{e}");
    }

    #[test]
    fn another_owner_is_refused() {
        if !Uid::effective().is_root() {
            eprintln!("skipped: needs root (CI runs the tests as root)");
            return;
        }
        let (_tmp, dir) = tree();
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        ensure_at(&dir, Some((nobody.uid, nobody.gid))).unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.uid(), nobody.uid.as_raw());
        // The probe's run_as changed: the old user's directory is not handed to root.
        let e = ensure_at(&dir, None).unwrap_err();
        assert!(
            matches!(e, StateDirError::Owner { found, want: 0, .. } if found == nobody.uid.as_raw()),
            "{e}"
        );
    }
}
