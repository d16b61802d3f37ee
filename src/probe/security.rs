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
        } else if self.program.starts_with(&self.path) {
            format!("{p} (a directory above {})", self.program.display())
        } else {
            format!("{p} (the interpreter or script it runs, or a directory above it)")
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

/// Check a probe's `command:` (argv; the first word resolved to `program`): the program
/// exists, is an executable regular file, and it, its `#!` interpreter and the scripts it is
/// given pass [`check_command`] (only enforced when the agent is root). `run_as_uid`: the
/// user the probe runs as.
pub fn verdict(
    program: &Path,
    command: &[String],
    plugin_dir: &Path,
    run_as_uid: Option<Uid>,
) -> Verdict {
    let name = command.first().map_or("", String::as_str);
    if let Err(e) = check_runnable(program, name, plugin_dir) {
        return Verdict::Problem(e.to_string());
    }
    let args = command.get(1..).unwrap_or_default();
    match check_command(program, args, plugin_dir, run_as_uid) {
        Ok(()) => Verdict::Ok,
        Err(e) if enforced() => Verdict::Refused(e.to_string()),
        Err(e) => Verdict::Unenforced(e.to_string()),
    }
}

/// Why a program cannot run here, and the fix.
#[derive(Debug, thiserror::Error)]
pub enum NotRunnable {
    /// `rule`: where a relative `command:` was looked up, or empty.
    #[error("{} not found{rule}", .program.display())]
    NotFound { program: PathBuf, rule: String },
    #[error("cannot read {}: {source}", .program.display())]
    Unreadable {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// The permission bits.
    #[error("{p} is not executable (mode {mode:04o}); fix: chmod 755 {p}", p = .program.display())]
    NotExecutable { program: PathBuf, mode: u32 },
}

/// The part of [`verdict`] every run checks, whoever the agent runs as: the program exists
/// and is an executable regular file, or the error says where it was looked up and the fix.
pub fn check_runnable(program: &Path, command: &str, plugin_dir: &Path) -> Result<(), NotRunnable> {
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
            return Err(NotRunnable::NotFound {
                program: program.to_owned(),
                rule,
            });
        }
        Err(source) => {
            return Err(NotRunnable::Unreadable {
                program: program.to_owned(),
                source,
            })
        }
    };
    if !meta.is_file() {
        return Err(NotRunnable::NotAFile(program.to_owned()));
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(NotRunnable::NotExecutable {
            program: program.to_owned(),
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

/// Interpreters whose first non-option argument is the script they run: that script gets the
/// same rule as a program (`command: [/bin/sh, dir/evil.sh]` must not slip past the check).
const INTERPRETERS: &[&str] = &[
    "sh", "bash", "dash", "ksh", "mksh", "zsh", "csh", "tcsh", "fish", "perl", "python", "ruby",
    "lua", "tclsh", "php", "node", "Rscript",
];

fn is_interpreter(program: &Path) -> bool {
    let Some(name) = program.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    INTERPRETERS.contains(&name)
        || name
            .strip_prefix("python")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        || name
            .strip_prefix("perl")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The script an interpreter is given: its first argument that is not an option, unless an
/// option says the code is inline (`-c`, `-e`). Relative to `/`, the probe's cwd.
fn interpreter_script(args: &[String]) -> Option<PathBuf> {
    for a in args {
        if a == "-c" || a == "-e" || a == "-E" {
            return None;
        }
        if !a.starts_with('-') {
            return Some(Path::new("/").join(a));
        }
    }
    None
}

/// Every file a command runs or feeds to an interpreter, besides the program itself: the
/// interpreter's script and any argument that is a path under `plugin_dir`.
fn scripts_among_args(program: &Path, args: &[String], plugin_dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if is_interpreter(program) {
        files.extend(interpreter_script(args));
    }
    for a in args {
        let p = Path::new(a);
        // Only files that exist: an argument may name an output the probe will create.
        if p.is_absolute()
            && p.starts_with(plugin_dir)
            && p.exists()
            && !files.iter().any(|f| f == p)
        {
            files.push(p.to_owned());
        }
    }
    files
}

/// The interpreter(s) a file's `#!` line names: the path, and for `#!/usr/bin/env NAME` also
/// NAME as found on the probes' PATH.
fn shebang_interpreters(file: &Path) -> Vec<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(file)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Vec::new();
    };
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    let mut words = text.split_whitespace();
    let Some(interp) = words.next() else {
        return Vec::new();
    };
    let mut found = vec![PathBuf::from(interp)];
    if Path::new(interp).file_name().is_some_and(|n| n == "env") {
        if let Some(name) = words.find(|w| !w.starts_with('-')) {
            let on_path = super::child::PROBE_PATH
                .split(':')
                .map(|d| Path::new(d).join(name))
                .find(|p| p.is_file());
            found.extend(on_path);
        }
    }
    found
}

/// What a cached verdict was given for: the identity of a file and of its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            mode: m.mode(),
            uid: m.uid(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// A passed walk: the identities of the file and its directory when it passed, and the
/// interpreters its `#!` names (read during the walk).
#[derive(Debug, Clone)]
struct PassedWalk {
    file: Identity,
    dir: Identity,
    interpreters: Vec<PathBuf>,
}

type VerdictCache = std::collections::HashMap<(PathBuf, Option<u32>), PassedWalk>;

fn verdicts() -> std::sync::MutexGuard<'static, VerdictCache> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<VerdictCache>> = std::sync::OnceLock::new();
    CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn walk_counts() -> std::sync::MutexGuard<'static, std::collections::HashMap<PathBuf, u64>> {
    static WALKS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<PathBuf, u64>>> =
        std::sync::OnceLock::new();
    WALKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// How many full walks `path` has had (tests see whether a run re-walked).
pub fn full_walks(path: &Path) -> u64 {
    walk_counts().get(path).copied().unwrap_or(0)
}

/// `check_program` once per file, not once per run: a passed verdict is reused while the file
/// and its directory keep the identity (dev, ino, mode, owner, mtime, ctime) they had when it
/// passed — two stat calls. Replacing the file, or swapping its directory for another (a
/// rename, a new directory in its place), changes one of them and the full walk runs again;
/// so does any chmod or chown of either (ctime). Returns the `#!` interpreters of the file.
fn check_file_cached(
    path: &Path,
    run_as_uid: Option<Uid>,
) -> Result<Vec<PathBuf>, InsecureProgram> {
    let key = (path.to_owned(), run_as_uid.map(|u| u.as_raw()));
    let dir = path.parent().unwrap_or(Path::new("/"));
    let now = Identity::of(path).zip(Identity::of(dir));
    if let (Some((file, dir_id)), Some(v)) = (&now, verdicts().get(&key)) {
        if *file == v.file && *dir_id == v.dir {
            return Ok(v.interpreters.clone());
        }
    }
    *walk_counts().entry(path.to_owned()).or_default() += 1;
    // Identities first, then the walk: a change between the two re-walks next run.
    let before = Identity::of(path).zip(Identity::of(dir));
    let walked = check_program(path, run_as_uid);
    let mut cache = verdicts();
    if walked.is_err() {
        cache.remove(&key);
    }
    walked?;
    let interpreters = shebang_interpreters(path);
    if let Some((file, dir)) = before {
        cache.insert(
            key,
            PassedWalk {
                file,
                dir,
                interpreters: interpreters.clone(),
            },
        );
    }
    Ok(interpreters)
}

/// The whole rule for a command: the program, the interpreters its `#!` names, the script an
/// interpreter is given, and any argument that is a path under `plugin_dir`.
pub fn check_command(
    program: &Path,
    args: &[String],
    plugin_dir: &Path,
    run_as_uid: Option<Uid>,
) -> Result<(), InsecureProgram> {
    let interpreters = check_file_cached(program, run_as_uid)?;
    for i in interpreters {
        check_file_cached(&i, run_as_uid).map_err(|e| InsecureProgram {
            program: program.to_owned(),
            ..e
        })?;
    }
    for script in scripts_among_args(program, args, plugin_dir) {
        check_file_cached(&script, run_as_uid).map_err(|e| InsecureProgram {
            program: program.to_owned(),
            ..e
        })?;
    }
    Ok(())
}
