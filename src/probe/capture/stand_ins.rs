//! The directory of stand-ins: one subdirectory per [`Capturer`] holding a stand-in for each
//! of its commands, all one shell script (`stand_in.sh`) that tells them apart by its name.
//! A probe's PATH starts with the subdirectories of its `capture:`.
//!
//! Where: `/run/xce-agent/capture` as root, `$XDG_RUNTIME_DIR/xce-agent/capture` as another
//! user (`$TMPDIR/xce-agent-capture-UID` without it). The agent writes the scripts when a
//! probe first needs them (a file is replaced by a rename, so a probe running meanwhile reads
//! the old script or the new one, whole) and leaves them for its next start. It refuses a
//! directory it does not own or that others may write: the stand-ins run as the probes'
//! users, with their rights.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::config::Capturer;
use crate::probe::child::CAPTURE_FD;

/// The stand-in's text, with the capture descriptor written in.
fn script() -> String {
    include_str!("stand_in.sh").replace("@FD@", &CAPTURE_FD.to_string())
}

/// Where the stand-ins go for an agent running as `uid`.
pub fn default_dir(uid: u32) -> PathBuf {
    if uid == 0 {
        return PathBuf::from("/run/xce-agent/capture");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(runtime) => PathBuf::from(runtime).join("xce-agent/capture"),
        None => std::env::temp_dir().join(format!("xce-agent-capture-{uid}")),
    }
}

/// Why the stand-ins cannot be put in place.
#[derive(Debug, thiserror::Error)]
#[error("cannot put capture's stand-ins in {}: {why}", dir.display())]
pub struct StandInsError {
    pub dir: PathBuf,
    pub why: String,
}

/// The stand-ins of one agent: written on first use.
#[derive(Debug)]
pub struct StandIns {
    dir: PathBuf,
    made: OnceLock<Result<(), String>>,
}

impl StandIns {
    pub fn at(dir: PathBuf) -> Self {
        Self {
            dir,
            made: OnceLock::new(),
        }
    }

    /// For this process's user.
    pub fn for_this_process() -> Self {
        Self::at(default_dir(nix::unistd::geteuid().as_raw()))
    }

    /// The directory a probe's PATH starts with for `capturer`, the stand-ins written first.
    pub fn dir_for(&self, capturer: Capturer) -> Result<PathBuf, StandInsError> {
        self.made
            .get_or_init(|| write_all(&self.dir).map_err(|e| e.to_string()))
            .clone()
            .map_err(|why| StandInsError {
                dir: self.dir.clone(),
                why,
            })?;
        Ok(self.dir.join(capturer.name()))
    }

    pub fn root(&self) -> &Path {
        &self.dir
    }
}

fn write_all(dir: &Path) -> io::Result<()> {
    made_and_ours(dir)?;
    let text = script();
    for capturer in Capturer::ALL {
        let sub = dir.join(capturer.name());
        made_and_ours(&sub)?;
        for command in capturer.commands() {
            write_script(&sub.join(command), &text)?;
        }
    }
    Ok(())
}

/// `dir` exists (made 0755 with its parents), is a directory this user owns, and nobody
/// else may write it.
fn made_and_ours(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() {
        return Err(io::Error::other("not a directory"));
    }
    if meta.uid() != me {
        return Err(io::Error::other(format!(
            "{} is owned by uid {}, not this agent's {me}",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is writable by group or others (mode {:o})",
            dir.display(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// The script at `path`, 0755: left alone when it already says `text`, else replaced by
/// a rename.
fn write_script(path: &Path, text: &str) -> io::Result<()> {
    let current = std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file() && m.mode() & 0o7777 == 0o755)
        .and_then(|_| std::fs::read(path).ok());
    if current.as_deref() == Some(text.as_bytes()) {
        return Ok(());
    }
    // A name of this writer's own: two agents (or two in one process) writing at once each
    // rename a whole file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("new.{}.{n}", std::process::id()));
    let write = || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn each_capturer_gets_its_commands_as_0755_scripts_rewritten_when_changed() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("capture");
        let stand_ins = StandIns::at(dir.clone());
        let node_state = stand_ins.dir_for(Capturer::NodeState).unwrap();
        assert_eq!(node_state, dir.join("node_state"));
        for (sub, command) in [
            ("node_state", "scontrol"),
            ("node_state", "pbsnodes"),
            ("gmetric", "gmetric"),
        ] {
            let path = dir.join(sub).join(command);
            assert_eq!(mode(&path), 0o755, "{}", path.display());
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.starts_with("#!/bin/sh\n") && text.contains(">&7"),
                "{text}"
            );
            assert!(!text.contains("@FD@"));
        }
        assert_eq!(mode(&dir), 0o755);
        // A changed script is put back by the next agent, and nothing else is left beside it.
        let scontrol = dir.join("node_state/scontrol");
        std::fs::write(&scontrol, "#!/bin/sh\nexec /usr/bin/scontrol \"$@\"\n").unwrap();
        StandIns::at(dir.clone())
            .dir_for(Capturer::Gmetric)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&scontrol).unwrap(), script());
        let names: Vec<_> = std::fs::read_dir(dir.join("node_state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_directory_others_can_write_is_refused_with_why() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("capture");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = StandIns::at(dir.clone())
            .dir_for(Capturer::NodeState)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is writable by group or others (mode 777)"),
            "{err}"
        );
        assert!(!dir.join("node_state").exists());
    }
}
