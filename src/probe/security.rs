//! Script permission checks, as sshd's `StrictModes` and PBS's `chk_file_sec` do them: a
//! root agent runs probe programs on every node, so anyone who can change a program, or
//! replace it through a directory on its path, can run code as the probe's user everywhere.
//!
//! The rule, for the program and every directory from it up to `/` (symlinks are followed and
//! the directories along each link's target are checked too):
//! - owned by root or by the probe's `run_as` user;
//! - not writable by group or other — except a directory with the sticky bit owned by root
//!   (like `/tmp`, mode 1777): there nobody but an entry's owner can rename or remove it, and
//!   the entry itself is checked by this same rule, so the path cannot be swapped;
//! - the program itself is a regular file.
//!
//! Enforced only when the agent runs as root: a non-root agent runs its own scripts with its
//! own rights (the developer case), and `check` says so.

use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::unistd::Uid;

/// Symlinks followed at most, like the kernel's ELOOP limit.
const MAX_SYMLINKS: usize = 40;

/// Why a program is refused, with the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsecureProgram {
    pub program: PathBuf,
    /// The file or directory at fault (the program itself or one of its directories).
    pub path: PathBuf,
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    WritableByOthers { mode: u32 },
    BadOwner { uid: u32 },
    NotRegularFile,
    Missing(String),
    TooManySymlinks,
}

impl fmt::Display for InsecureProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        let what = if self.path == self.program {
            format!("{p}")
        } else {
            format!("{p} (a directory above {})", self.program.display())
        };
        match &self.problem {
            Problem::WritableByOthers { mode } => write!(
                f,
                "refusing to run {}: {what} is writable by group or other (mode {:04o}); fix: chmod go-w {p}",
                self.program.display(),
                mode & 0o7777
            ),
            Problem::BadOwner { uid } => write!(
                f,
                "refusing to run {}: {what} is owned by uid {uid}, not root or the probe's run_as user; fix: chown root {p}",
                self.program.display()
            ),
            Problem::NotRegularFile => write!(f, "{p} is not a regular file"),
            Problem::Missing(e) => write!(f, "cannot check {p}: {e}"),
            Problem::TooManySymlinks => write!(f, "{p}: too many levels of symbolic links"),
        }
    }
}

impl std::error::Error for InsecureProgram {}

/// Check `path` (absolute) and every directory up to `/`. `run_as_uid`: the user the probe
/// runs as, who may own them too (`None`: only root).
pub fn check_program(path: &Path, run_as_uid: Option<Uid>) -> Result<(), InsecureProgram> {
    let fail = |at: &Path, problem| InsecureProgram {
        program: path.to_owned(),
        path: at.to_owned(),
        problem,
    };
    let owner_ok = |uid: u32| uid == 0 || run_as_uid.is_some_and(|u| u.as_raw() == uid);
    let check_dir = |dir: &Path| -> Result<(), InsecureProgram> {
        let m = std::fs::metadata(dir).map_err(|e| fail(dir, Problem::Missing(e.to_string())))?;
        if !owner_ok(m.uid()) {
            return Err(fail(dir, Problem::BadOwner { uid: m.uid() }));
        }
        let mode = m.permissions().mode();
        let sticky_root = mode & 0o1000 != 0 && m.uid() == 0;
        if mode & 0o022 != 0 && !sticky_root {
            return Err(fail(dir, Problem::WritableByOthers { mode }));
        }
        Ok(())
    };
    // Walk the path one component at a time, following symlinks by hand so that every
    // directory a lookup passes through is checked, not only the final real path.
    let mut pending: Vec<PathBuf> = vec![path.to_owned()];
    let mut current = PathBuf::from("/");
    let mut links = 0;
    check_dir(&current)?;
    while let Some(next) = pending.pop() {
        let mut comps: Vec<Component> = next.components().collect();
        if next.is_absolute() {
            current = PathBuf::from("/");
        }
        comps.reverse();
        while let Some(c) = comps.pop() {
            match c {
                Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
                Component::ParentDir => {
                    current.pop();
                    continue;
                }
                Component::Normal(name) => {
                    let candidate = current.join(name);
                    let m = std::fs::symlink_metadata(&candidate)
                        .map_err(|e| fail(&candidate, Problem::Missing(e.to_string())))?;
                    if m.file_type().is_symlink() {
                        links += 1;
                        if links > MAX_SYMLINKS {
                            return Err(fail(&candidate, Problem::TooManySymlinks));
                        }
                        let target = std::fs::read_link(&candidate)
                            .map_err(|e| fail(&candidate, Problem::Missing(e.to_string())))?;
                        // Resolve the target first, then the rest of this path under it.
                        let rest: PathBuf = comps.iter().rev().collect();
                        comps.clear();
                        if rest.as_os_str().is_empty() {
                            pending.push(target);
                        } else {
                            pending.push(rest);
                            pending.push(target);
                        }
                        break;
                    }
                    current = candidate;
                    if comps.is_empty() && pending.is_empty() {
                        // The program itself.
                        if !m.is_file() {
                            return Err(fail(&current, Problem::NotRegularFile));
                        }
                        if !owner_ok(m.uid()) {
                            return Err(fail(&current, Problem::BadOwner { uid: m.uid() }));
                        }
                        let mode = m.permissions().mode();
                        if mode & 0o022 != 0 {
                            return Err(fail(&current, Problem::WritableByOthers { mode }));
                        }
                    } else {
                        check_dir(&current)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether the agent enforces the checks: only a root agent runs scripts as other users.
pub fn enforced() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The one verdict on a probe's program that `check`, `probe NAME` and a reload all give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// It cannot run here (missing, not executable): the text says why and how to fix it.
    Problem(String),
    /// A root agent refuses to run it (see [`check_program`]); the text has the fix.
    Refused(String),
    /// A root agent would refuse it; this agent is not root and runs it anyway.
    Unenforced(String),
}

/// Check the program `command` (the first word of a probe's `command:`), resolved to
/// `program`: it exists, is an executable regular file, and passes [`check_program`] (only
/// enforced when the agent is root). `run_as_uid`: the user the probe runs as.
pub fn verdict(
    program: &Path,
    command: &str,
    plugin_dir: &Path,
    run_as_uid: Option<Uid>,
) -> Verdict {
    if let Err(e) = check_runnable(program, command, plugin_dir) {
        return Verdict::Problem(e);
    }
    match check_program(program, run_as_uid) {
        Ok(()) => Verdict::Ok,
        Err(e) if enforced() => Verdict::Refused(e.to_string()),
        Err(e) => Verdict::Unenforced(e.to_string()),
    }
}

/// The part of [`verdict`] every run checks, whoever the agent runs as: the program exists
/// and is an executable regular file, or the text says where it was looked up and the fix.
pub fn check_runnable(program: &Path, command: &str, plugin_dir: &Path) -> Result<(), String> {
    let meta = match std::fs::metadata(program) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let rule = if Path::new(command).is_absolute() {
                String::new()
            } else {
                format!(
                    " (`{command}` is not an absolute path, so it is looked up in plugin_dir {})",
                    plugin_dir.display()
                )
            };
            return Err(format!("{} not found{rule}", program.display()));
        }
        Err(e) => return Err(format!("cannot read {}: {e}", program.display())),
    };
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", program.display()));
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(format!(
            "{p} is not executable (mode {:04o}); fix: chmod 755 {p}",
            mode & 0o7777,
            p = program.display()
        ));
    }
    Ok(())
}
