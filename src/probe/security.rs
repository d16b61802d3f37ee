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
//! It follows the code that will run ([`check_probe`]): `#!` interpreters, an interpreter's
//! script or the files its inline code names, the command a launcher runs, every argument
//! that names an existing file, and the `env:` entries that load code — where a directory
//! that is *searched* (`PATH`, `PYTHONPATH`, ...) gets no sticky exception, since anyone who
//! may add a name to it may plant the one a search finds first.
//!
//! What the rule cannot read it says so: program text (a `shell:` line, `sh -c`, `env -S`,
//! awk, sed, `find -exec`, xargs, ... — [`program_text`]) is checked word by word but cannot
//! be proven safe, so it runs as root only with the probe's `trusted:` reason
//! ([`check_text`]); a path such text names that does not exist yet is judged by who may
//! create it, at every run. The program itself is judged by its open descriptor, which a
//! binary is executed by ([`CheckedProgram`]).
//!
//! Enforced only when the agent runs as root: a non-root agent runs its own scripts with its
//! own rights (the developer case), and `check` says so.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

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
    /// How the command reaches `path` when it is neither the program nor a directory above
    /// it, e.g. "named by env: BASH_ENV"; `None`: an interpreter or script it runs.
    pub via: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    WritableByOthers {
        mode: u32,
    },
    BadOwner {
        uid: u32,
    },
    NotRegularFile,
    Missing(String),
    TooManySymlinks,
    /// An `env:` entry whose value loads code by a name the agent cannot follow
    /// ([`REFUSED_ENV`]).
    CodeLoadingEnv {
        name: String,
    },
    /// A file or directory a code-loading `env:` entry names does not exist, and the directory
    /// it would be created in (`path`) is writable by others: whoever creates it first decides
    /// what the child loads.
    Creatable {
        missing: PathBuf,
        mode: u32,
    },
    /// A sticky directory anyone may write (`/tmp`) on a search path: its entries cannot be
    /// swapped, but anyone may add the name a search finds first.
    SharedSearchDir {
        mode: u32,
    },
    /// The command runs program text ([`program_text`]) as root, and the probe does not say
    /// `trusted:`: what the text computes (cd, globs, quotes, variables, files made later) is
    /// beyond what the rule can read.
    ProgramText {
        what: String,
    },
    /// The file was replaced or renamed while it was being checked: the descriptor held is
    /// not the file the walk judged.
    Changed,
}

impl fmt::Display for InsecureProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        let what = if let Some(via) = &self.via {
            format!("{p} ({via}, or a directory above it)")
        } else if self.path == self.program {
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
            Problem::SharedSearchDir { mode } => write!(
                f,
                "refusing to run {}: {what} is searched for code, and its sticky bit does not stop anyone from adding a name to it (mode {:04o}); fix: name a directory only root can write",
                self.program.display(),
                mode & 0o7777
            ),
            Problem::Creatable { missing, mode } => write!(
                f,
                "refusing to run {}: {} does not exist, and anyone who may write {p} (mode {:04o}) may create it{}; fix: create it, root-owned, or name another path",
                self.program.display(),
                missing.display(),
                mode & 0o7777,
                self.via.as_deref().map(|v| format!(" ({v})")).unwrap_or_default(),
            ),
            Problem::ProgramText { what } => write!(
                f,
                "refusing to run {} as root: it runs program text ({what}), which the script rule cannot prove safe by reading it: the files the text names are checked, not what it computes (cd, quotes, globs, variables, files made later); fix: give the probe an unprivileged run_as, or put the code in a root-owned script named in command:, or, if root must run this text, say why in the probe's `trusted:`",
                self.program.display()
            ),
            Problem::Changed => write!(
                f,
                "refusing to run {}: {p} was replaced while it was being checked; this run is refused, the next one checks it afresh",
                self.program.display()
            ),
            Problem::CodeLoadingEnv { name } => write!(
                f,
                "refusing to run {}: env: {name} makes it load code by names the agent cannot check; fix: remove {name} from the probe's env: and name what it loads in command:, where the script rule checks it",
                self.program.display()
            ),
        }
    }
}

impl std::error::Error for InsecureProgram {}

/// Check `path` (absolute) and every directory up to `/`. `run_as_uid`: the user the probe
/// runs as, who may own them too (`None`: only root).
pub fn check_program(path: &Path, run_as_uid: Option<Uid>) -> Result<(), InsecureProgram> {
    walk(path, run_as_uid, Last::File)
}

/// What the last component of a walked path must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Last {
    /// A regular file, not writable by group or other.
    File,
    /// A directory that is searched for code (an entry of `PATH`, `PYTHONPATH`, ...): not
    /// writable by group or other, sticky or not, since anyone who may create an entry in it
    /// may plant a name that the search finds first.
    SearchDir,
}

fn walk(path: &Path, run_as_uid: Option<Uid>, last: Last) -> Result<(), InsecureProgram> {
    let fail = |at: &Path, problem| InsecureProgram {
        program: path.to_owned(),
        path: at.to_owned(),
        problem,
        via: None,
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
                    if comps.is_empty() && pending.is_empty() && last == Last::SearchDir {
                        if !m.is_dir() {
                            // A file on a search path (a zip on PYTHONPATH): the file rule.
                            return walk(&current, run_as_uid, Last::File).map_err(|e| {
                                InsecureProgram {
                                    program: path.to_owned(),
                                    ..e
                                }
                            });
                        }
                        if !owner_ok(m.uid()) {
                            return Err(fail(&current, Problem::BadOwner { uid: m.uid() }));
                        }
                        let mode = m.permissions().mode();
                        if mode & 0o022 != 0 && mode & 0o1000 != 0 {
                            return Err(fail(&current, Problem::SharedSearchDir { mode }));
                        }
                        if mode & 0o022 != 0 {
                            return Err(fail(&current, Problem::WritableByOthers { mode }));
                        }
                    } else if comps.is_empty() && pending.is_empty() {
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
    agent_is_root()
}

/// Whether the agent runs as root. Its effective uid never changes (the agent switches
/// credentials only in its children), so it is asked once, not twice a run.
pub fn agent_is_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| nix::unistd::geteuid().is_root())
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
    // No backslash in the text: tables and logs escape one (`\\r`), which would spoil the fix.
    #[error(
        "{p} has Windows (CRLF) line endings: its #! line names interpreter {} followed by a carriage return, and no such file exists; fix: sed -i 's/[[:cntrl:]]*$//' {p}",
        .interpreter.trim_end_matches('\r'), p = .program.display()
    )]
    CrLf {
        program: PathBuf,
        interpreter: String,
    },
    /// A shell's script with CRLF line endings: the shell reads each `\r` as part of a word.
    #[error(
        "{p} has Windows (CRLF) line endings: {shell} reads the carriage return at the end of each line as part of its last word; fix: sed -i 's/[[:cntrl:]]*$//' {p}",
        p = .script.display()
    )]
    CrLfScript { script: PathBuf, shell: String },
    #[error("{}: interpreter {} (from its #! line) not found{}", .program.display(), .interpreter.display(), .via)]
    InterpreterMissing {
        program: PathBuf,
        interpreter: PathBuf,
        /// Where it was looked for, for `#!/usr/bin/env NAME`.
        via: String,
    },
    #[error("{}: interpreter {} (from its #! line) is not a program the kernel can run (an executable binary, or a script with its own #!)", .program.display(), .interpreter.display())]
    InterpreterNotExecutable {
        program: PathBuf,
        interpreter: PathBuf,
    },
    #[error("{p} has no #! line and is not a binary the kernel can run; fix: make its first line #!/bin/sh (or the interpreter it is written for)", p = .program.display())]
    NoShebang { program: PathBuf },
    /// An interpreter's relative script that is not under plugin_dir (boxed: the error
    /// travels in every spawn result).
    #[error(transparent)]
    ScriptNotFound(Box<MissingScript>),
}

/// An interpreter's relative script that is not under plugin_dir.
#[derive(Debug, thiserror::Error)]
#[error("{interpreter}'s script {script} not found: a relative script is looked up in plugin_dir, and {} does not exist; give its path under plugin_dir {} or an absolute path", .looked.display(), .plugin_dir.display())]
pub struct MissingScript {
    pub interpreter: String,
    pub script: String,
    pub looked: PathBuf,
    pub plugin_dir: PathBuf,
}

/// What stops the kernel from running `program`, an executable regular file, that only its
/// first line shows: CRLF line endings, a missing or non-executable `#!` interpreter, and
/// (with `no_shebang`, once the kernel has said ENOEXEC: binfmt_misc may run other files) no
/// `#!` at all. `None` when none of these (a binary, or a script that will start).
pub fn script_problem(program: &Path, no_shebang: bool) -> Option<NotRunnable> {
    let head = head_of(program).ok()?;
    if head.starts_with(b"\x7fELF") || head.is_empty() {
        return None;
    }
    let program = program.to_owned();
    let Some(text) = shebang_of(&head) else {
        return no_shebang.then_some(NotRunnable::NoShebang { program });
    };
    let mut words = text.split([' ', '\t']).filter(|w| !w.is_empty());
    let interpreter = words.next()?;
    if interpreter.ends_with('\r') || text.ends_with('\r') {
        return Some(NotRunnable::CrLf {
            program,
            interpreter: interpreter.to_owned(),
        });
    }
    let usable =
        |p: &Path| std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    let interp = PathBuf::from(interpreter);
    match usable(&interp) {
        Err(_) => {
            return Some(NotRunnable::InterpreterMissing {
                program,
                interpreter: interp,
                via: String::new(),
            })
        }
        Ok(false) => {
            return Some(NotRunnable::InterpreterNotExecutable {
                program,
                interpreter: interp,
            })
        }
        // Executable, yet the kernel would not run it (ENOEXEC): not a program at all.
        Ok(true) if no_shebang => {
            return Some(NotRunnable::InterpreterNotExecutable {
                program,
                interpreter: interp,
            })
        }
        Ok(true) => {}
    }
    if interp.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.starts_with('-'))?;
        let found = super::path::PROBE_PATH
            .split(':')
            .any(|d| usable(&Path::new(d).join(name)).unwrap_or(false));
        if !found {
            return Some(NotRunnable::InterpreterMissing {
                program,
                interpreter: PathBuf::from(name),
                via: format!(
                    " on the probes' PATH ({}), where {} looks",
                    super::path::PROBE_PATH,
                    interp.display()
                ),
            });
        }
    }
    None
}

/// Shells that read a script's carriage returns as part of its words (Python, Perl and Ruby
/// read CRLF sources as they are).
const SHELLS: &[&str] = &["sh", "bash", "dash", "ksh", "mksh", "zsh"];

/// A shell's script (`command: [/bin/sh, x.sh]`, `args` as resolved: absolute) saved with
/// CRLF line endings, which fails line by line with `$'\r': command not found`.
pub fn shell_script_problem(program: &Path, args: &[String]) -> Option<NotRunnable> {
    let shell = file_name(program);
    if !SHELLS.contains(&shell) {
        return None;
    }
    let script = Path::new("/").join(&args[script_arg(shell, args)?]);
    let head = head_of(&script).ok()?;
    head.windows(2)
        .any(|w| w == b"\r\n")
        .then(|| NotRunnable::CrLfScript {
            script,
            shell: shell.to_owned(),
        })
}

/// Why execve of `program` failed with `error`, in the admin's words, where its first line
/// tells (ENOENT for a file that exists is its interpreter's; ENOEXEC, no `#!`).
pub fn why_exec_failed(program: &Path, error: &std::io::Error) -> Option<NotRunnable> {
    match error.raw_os_error()? {
        libc::ENOEXEC if program.is_file() => script_problem(program, true),
        libc::ENOENT | libc::EACCES if program.is_file() => script_problem(program, false),
        _ => None,
    }
}

/// The part of [`super::resolve::verdict`] every run checks, whoever the agent runs as: the
/// program exists and is an executable regular file, or the error says where it was looked up
/// and the fix. Returns what it found there (for [`Verdicts::check_and_open_seen`]).
pub fn check_runnable(
    program: &Path,
    command: &str,
    plugin_dir: &Path,
) -> Result<std::fs::Metadata, NotRunnable> {
    let meta = match std::fs::metadata(program) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let rule = if Path::new(command).is_absolute() {
                String::new()
            } else if !command.contains('/') {
                format!(
                    " (`{command}` is not an absolute path, so it is looked up in plugin_dir {}, then on the probes' PATH {}, and is in neither)",
                    plugin_dir.display(),
                    super::path::PROBE_PATH
                )
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
    Ok(meta)
}

/// Interpreters whose first non-option argument is the script they run: that script gets the
/// same rule as a program (`command: [/bin/sh, dir/evil.sh]` must not slip past the check).
const INTERPRETERS: &[&str] = &[
    "sh", "bash", "dash", "ksh", "mksh", "zsh", "csh", "tcsh", "fish", "perl", "python", "ruby",
    "lua", "tclsh", "php", "node", "Rscript",
];

pub(crate) fn is_interpreter(program: &Path) -> bool {
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
/// option says the code is inline (`-c`, `-e`). Relative to `/`, the probe's cwd (a probe's
/// relative script was made absolute under plugin_dir by [`super::resolve::command`]).
fn interpreter_script(interpreter: &str, args: &[String]) -> Option<PathBuf> {
    script_arg(interpreter, args).map(|i| Path::new("/").join(&args[i]))
}

/// Options that take the next word as their value, not as the script (`sh -o pipefail x.sh`,
/// `python3 -W ignore x.py`).
const OPTIONS_WITH_A_VALUE: &[&str] = &["-o", "+o", "-O", "+O", "-W", "-X"];

/// Which argument is an interpreter's script: its first that is not an option or an option's
/// value; `None` when an option says the code is inline (`-c`, `-e`) or a module
/// (`python3 -m NAME`, found on its own search path, not a file the command names).
pub(crate) fn script_arg(interpreter: &str, args: &[String]) -> Option<usize> {
    // The interpreter's own inline-code options: a shell's `-e` is errexit (`sh -e x.sh`
    // runs x.sh), Perl's and Ruby's `-e` is code.
    if inline_flag(interpreter, args).is_some() {
        return None;
    }
    let mut i = 0;
    while let Some(a) = args.get(i) {
        // `python -m module`: no script file.
        if a == "-m" {
            return None;
        }
        if OPTIONS_WITH_A_VALUE.contains(&a.as_str()) {
            i += 2;
            continue;
        }
        if !a.starts_with('-') && !a.starts_with('+') {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Programs that run the command their arguments name (`stdbuf -oL x.sh`): the command they
/// run is followed as the probe's own program is.
const LAUNCHERS: &[&str] = &[
    "env", "stdbuf", "timeout", "nice", "ionice", "setsid", "chrt", "nohup", "taskset", "numactl",
    "prlimit", "setpriv", "unshare", "flock", "cgexec", "time", "unbuffer", "xargs", "chronic",
    "sudo", "runuser", "su", "doas",
];

fn file_name(program: &Path) -> &str {
    program.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// How deep launchers are followed (`nice timeout 5 stdbuf -oL env x.sh` is 4).
const MAX_LAUNCHERS: usize = 16;

/// Where the probe's processes look a bare command name up: its `PATH` (agent default, or
/// its `env:`), then its working directory `/` (bash's `.` and `source` also look there).
/// Relative names and PATH entries are relative to `/`, the probe's working directory.
fn lookup(word: &str, path_var: &str) -> Option<PathBuf> {
    if word.is_empty() || word.len() > 4096 {
        return None;
    }
    if word.contains('/') {
        let p = Path::new("/").join(word);
        return p.is_file().then_some(p);
    }
    path_var
        .split(':')
        .chain(std::iter::once("/"))
        .map(|d| Path::new("/").join(d).join(word))
        .find(|p| p.is_file())
}

/// The words of inline code (`sh -c CODE`, `python3 -c CODE`, `perl -e CODE`) that may name a
/// file: split at blanks, quotes and the shell's operators. Each is then looked up as
/// [`lookup`] does: `. x.sh`, `exec /opt/x`, `open('/opt/x.py')` all name a file.
fn code_words(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| c.is_whitespace() || "\"'`;|&<>(){}[]$=,:".contains(c))
        .filter(|w| !w.is_empty() && !w.starts_with('-'))
}

/// The paths an argument word may name: the word, what follows `=` in `--opt=/x` or
/// `NAME=/x`, what follows the option letters in `-I/x`. Only words with a `/`: a bare word
/// is data to most programs (a launcher's bare command is followed on its own).
fn path_words(word: &str) -> Vec<&str> {
    let mut found = Vec::new();
    if !word.contains('/') {
        return found;
    }
    if !word.starts_with('-') {
        found.push(word);
    }
    if let Some((_, v)) = word.split_once('=') {
        found.push(v);
    }
    if word.starts_with('-') {
        if let Some(i) = word.find('/') {
            if !found.contains(&&word[i..]) {
                found.push(&word[i..]);
            }
        }
    }
    found
}

/// Every file a command runs or may read code from, besides the program itself, as the child
/// will see them (`path_var`: its PATH): every argument that names an existing regular file;
/// an interpreter's script, or the files its inline code names; and for a launcher
/// ([`LAUNCHERS`]) the command it runs, followed in turn, with `env NAME=VALUE` entries
/// checked as the probe's own `env:` is.
fn code_files(
    program: &Path,
    args: &[String],
    path_var: &str,
    depth: usize,
    files: &mut Vec<(PathBuf, Option<String>)>,
    env_entries: &mut Vec<(String, String)>,
    creatable: &mut Vec<(PathBuf, String)>,
) {
    // A path in program text that does not exist (yet): judged by who may create it.
    let mut missing = |w: &str, via: String| {
        let p = Path::new("/").join(w);
        let absent = w.contains('/') && w.len() <= 4096 && std::fs::symlink_metadata(&p).is_err();
        if absent && !creatable.iter().any(|(c, _)| *c == p) {
            creatable.push((p, via));
        }
    };
    let mut add = |p: PathBuf, via: Option<String>| {
        if !files.iter().any(|(f, _)| *f == p) {
            files.push((p, via));
        }
    };
    for a in args {
        for w in path_words(a) {
            let p = Path::new("/").join(w);
            if p.is_file() {
                add(p, Some("named in its arguments".to_owned()));
            }
        }
    }
    if is_interpreter(program) {
        match inline_code_of(file_name(program), args) {
            Some(code) => {
                for w in code_words(code) {
                    match lookup(w, path_var) {
                        Some(p) => add(p, Some(format!("named in its inline code ({w})"))),
                        None => missing(w, format!("named in its inline code ({w})")),
                    }
                }
            }
            None => {
                if let Some(script) = interpreter_script(file_name(program), args) {
                    add(script, None);
                }
            }
        }
    }
    let name = file_name(program);
    // Launchers that hand a `-c`/`--command` string to a shell.
    if ["flock", "su", "runuser"].contains(&name) {
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-c" || a == "--command" {
                for w in code_words(it.next().map_or("", String::as_str)) {
                    let via = format!("named in the command {name} runs ({w})");
                    match lookup(w, path_var) {
                        Some(p) => add(p, Some(via)),
                        None => missing(w, via),
                    }
                }
                break;
            }
        }
    }
    if depth < MAX_LAUNCHERS && LAUNCHERS.contains(&name) {
        // The command is the first word the launcher would find as a program; options and
        // their values (`-n 5`, `-s KILL 10`) find none. Over-reaching is safe: a word taken
        // for the command is only checked.
        for (i, a) in args.iter().enumerate() {
            if a.starts_with('-') {
                continue;
            }
            if name == "env" {
                if let Some((k, v)) = a.split_once('=') {
                    env_entries.push((k.to_owned(), v.to_owned()));
                    continue;
                }
            }
            if let Some(inner) = lookup(a, path_var) {
                add(inner.clone(), Some(format!("run by {name}")));
                code_files(
                    &inner,
                    &args[i + 1..],
                    path_var,
                    depth + 1,
                    files,
                    env_entries,
                    creatable,
                );
                break;
            }
        }
    }
}

/// awk's names: an awk program calls `system()`, pipes to commands and reads with `getline`.
const AWKS: &[&str] = &["awk", "gawk", "mawk", "nawk", "original-awk"];

/// Launchers that hand a command line to a shell with `-c`/`--command`.
const SHELL_COMMAND_LAUNCHERS: &[&str] = &["flock", "su", "runuser", "script"];

/// Programs whose every run is a command line for a shell (or for another host).
const ALWAYS_TEXT: &[&str] = &["watch", "parallel", "ssh", "expect"];

/// Long interpreter options whose value is inline code (`node --eval`, `--print`); the short
/// ones are `-c`/`-e`/`-E`, and php's `-r` and node's `-p`, by name.
const INLINE_LONG_OPTIONS: &[&str] = &["--eval", "--print", "--command", "--exec"];

/// What program text a command runs, in words (`None`: only files, which the rule checks):
/// an interpreter's inline code (`sh -c`, a `shell:` line, `python3 -c`, `perl -e`), `env -S`,
/// any awk or sed program (awk's `system()`, sed's `e` command), `find -exec`, `xargs`, the
/// `-c` of `flock`/`su`/`runuser`/`script`, and the same behind any launcher (`LAUNCHERS`).
/// Such text cannot be proven safe by reading it: `cd /x && ./s`, `x.s?`, `"/x"/s`, `PATH=/x:$PATH
/// s`, a variable, a file made later all run code the words do not show.
pub fn program_text(program: &Path, args: &[String], path_var: &str) -> Option<String> {
    program_text_at(program, args, path_var, 0)
}

fn program_text_at(
    program: &Path,
    args: &[String],
    path_var: &str,
    depth: usize,
) -> Option<String> {
    let name = file_name(program);
    if depth > MAX_LAUNCHERS {
        return Some(format!("{name}: launchers nested too deep to follow"));
    }
    // `busybox APPLET ARGS` is APPLET.
    if name == "busybox" {
        let (applet, rest) = args.split_first()?;
        return program_text_at(Path::new(applet), rest, path_var, depth + 1);
    }
    if is_interpreter(program) {
        if let Some(flag) = inline_flag(name, args) {
            return Some(format!("{name} {flag}: code given inline"));
        }
    }
    if AWKS.contains(&name) {
        return Some(format!(
            "{name}: an awk program (system(), pipes, getline run commands)"
        ));
    }
    if name == "sed" || name == "gsed" {
        return Some(format!(
            "{name}: a sed program (its e command runs a shell)"
        ));
    }
    if name == "find" {
        if let Some(a) = args
            .iter()
            .find(|a| ["-exec", "-execdir", "-ok", "-okdir"].contains(&a.as_str()))
        {
            return Some(format!("find {a}: commands built from the names it finds"));
        }
    }
    if name == "xargs" {
        return Some("xargs: commands built from its input".to_owned());
    }
    if ALWAYS_TEXT.contains(&name) {
        return Some(format!("{name}: a command line it hands on"));
    }
    if SHELL_COMMAND_LAUNCHERS.contains(&name) {
        if let Some(a) = args.iter().find(|a| {
            *a == "-c" || a.starts_with("--command") || a.starts_with("--session-command")
        }) {
            return Some(format!("{name} {a}: a command line for a shell"));
        }
    }
    if name == "env" {
        // Its options and NAME=VALUE entries come before the command.
        let split = args
            .iter()
            .take_while(|a| a.starts_with('-') || a.contains('='))
            .find(|a| {
                a.starts_with("--split-string")
                    || (a.starts_with('-') && !a.starts_with("--") && a.contains('S'))
            });
        if let Some(a) = split {
            return Some(format!("env {a}: a command line it splits itself"));
        }
    }
    if LAUNCHERS.contains(&name) {
        for (i, a) in args.iter().enumerate() {
            if a.starts_with('-') || (name == "env" && a.contains('=')) {
                continue;
            }
            if let Some(inner) = lookup(a, path_var) {
                return program_text_at(&inner, &args[i + 1..], path_var, depth + 1);
            }
        }
    }
    None
}

/// The option that gives an interpreter its code inline, wherever it stands among the
/// options (`sh -o pipefail -c`, `bash -ec`, `perl -w -e`, `node --eval`, `php -r`); `None`
/// once the script (the first non-option word) is reached. A shell's `-e` is errexit and
/// Python's `-E` ignores the environment: only `-c` is theirs.
fn inline_flag<'a>(name: &str, args: &'a [String]) -> Option<&'a str> {
    let only_c = SHELLS.contains(&name)
        || ["csh", "tcsh", "fish"].contains(&name)
        || name.starts_with("python");
    let mut i = 0;
    while let Some(a) = args.get(i) {
        let inline_long = INLINE_LONG_OPTIONS.iter().any(|o| a.starts_with(o))
            || (["php", "node"].contains(&name) && (a == "-r" || a == "-p"));
        if inline_long {
            return Some(a);
        }
        if a == "--" {
            return None;
        }
        if OPTIONS_WITH_A_VALUE.contains(&a.as_str()) {
            i += 2;
            continue;
        }
        if let Some(letters) = a.strip_prefix('-').filter(|l| !l.starts_with('-')) {
            if letters
                .chars()
                .any(|c| c == 'c' || (!only_c && (c == 'e' || c == 'E')))
            {
                return Some(a);
            }
        } else if !a.starts_with('-') && !a.starts_with('+') {
            return None;
        }
        i += 1;
    }
    None
}

/// The code [`inline_flag`] gives: its `=VALUE`, or the word after it.
fn inline_code_of<'a>(name: &str, args: &'a [String]) -> Option<&'a str> {
    let flag = inline_flag(name, args)?;
    if let Some((_, value)) = flag.split_once('=').filter(|_| flag.starts_with("--")) {
        return Some(value);
    }
    let at = args.iter().position(|a| std::ptr::eq(a.as_str(), flag))?;
    args.get(at + 1).map(String::as_str)
}

/// The rule for program text ([`program_text`]) run as root: refused unless the probe says
/// why it is trusted. The files the text names are checked by [`check_probe`] all the same.
pub fn check_text(
    program: &Path,
    args: &[String],
    env: &BTreeMap<String, String>,
    trusted: Option<&str>,
) -> Result<(), InsecureProgram> {
    if trusted.is_some() {
        return Ok(());
    }
    let path_var = env
        .get("PATH")
        .map_or(super::path::PROBE_PATH, String::as_str);
    match program_text(program, args, path_var) {
        None => Ok(()),
        Some(what) => Err(InsecureProgram {
            program: program.to_owned(),
            path: program.to_owned(),
            problem: Problem::ProgramText { what },
            via: None,
        }),
    }
}

/// `env:` entries whose value is interpreter options that load code by module or file names
/// (`-Mfoo`, `--require x`, `-javaagent:x.jar`): refused, as the agent cannot follow them
/// without each interpreter's option parser; the same options in `command:` are visible, and
/// the files they name are checked there.
pub const REFUSED_ENV: &[&str] = &[
    "PERL5OPT",
    "NODE_OPTIONS",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "PYTHONSTARTUP",
];

/// `env:` entries that are search paths for code, checked entry by entry: a directory must
/// not be writable by group or other, sticky or not (anyone who may add a name to it may
/// plant the one a search finds first); a file entry gets the file rule.
pub const SEARCH_PATH_ENV: &[&str] = &[
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PERL5LIB",
    "PERLLIB",
    "RUBYLIB",
    "NODE_PATH",
    "GCONV_PATH",
    "LUA_PATH",
    "LUA_CPATH",
    "TCLLIBPATH",
    "CLASSPATH",
];

/// `env:` entries that name files the child loads or runs: each file gets the file rule.
pub const CODE_FILE_ENV: &[&str] = &["BASH_ENV", "ENV", "LD_PRELOAD", "LD_AUDIT"];

/// The paths a code-loading `env:` value names: split at `:` (and at blanks and `;` where the
/// variable allows them); relative entries are relative to `/`, the probe's working directory.
/// `LUA_PATH`'s `?` templates name the directory before the first `?`.
fn env_paths(name: &str, value: &str) -> Vec<PathBuf> {
    let seps: &[char] = match name {
        "LD_PRELOAD" => &[':', ' ', '\t'],
        "LUA_PATH" | "LUA_CPATH" => &[';'],
        "TCLLIBPATH" => &[' ', '\t'],
        _ => &[':'],
    };
    value
        .split(seps)
        .filter_map(|e| {
            // A `?` template (`/opt/lua/?.lua`) names the directory it is in.
            let e = match e.find('?') {
                Some(i) => {
                    let head = &e[..i];
                    &head[..head.rfind('/')?.max(1)]
                }
                None => e,
            };
            // An empty PATH entry is the working directory.
            if e.is_empty() && name != "PATH" {
                return None;
            }
            // A bare library name is searched for in the system's and LD_LIBRARY_PATH's
            // directories, which are checked on their own.
            if name == "LD_PRELOAD" && !e.contains('/') {
                return None;
            }
            Some(Path::new("/").join(e))
        })
        .collect()
}

/// A path the child may load code from that does not exist yet: whoever may create it
/// decides what it holds, so the nearest directory above it that exists must pass the
/// search-directory rule.
fn nearest_existing(path: &Path) -> &Path {
    let mut p = path;
    while std::fs::symlink_metadata(p).is_err() {
        match p.parent() {
            Some(up) => p = up,
            None => break,
        }
    }
    p
}

/// The first bytes of `file`: where its `#!` line (the kernel reads at most 256) or an ELF
/// header is.
fn head_of(file: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(256);
    std::fs::File::open(file)?
        .take(256)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// The text of a file head's `#!` line, without the `#!` and the newline.
fn shebang_of(head: &[u8]) -> Option<String> {
    let line = head.strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    Some(String::from_utf8_lossy(line).into_owned())
}

/// The interpreter(s) a file's `#!` line names: the path, and for `#!/usr/bin/env NAME` also
/// NAME as found on the probes' PATH.
fn shebang_interpreters(file: &Path) -> Vec<PathBuf> {
    let Some(text) = head_of(file).ok().as_deref().and_then(shebang_of) else {
        return Vec::new();
    };
    let mut words = text.split_whitespace();
    let Some(interp) = words.next() else {
        return Vec::new();
    };
    let mut found = vec![PathBuf::from(interp)];
    if Path::new(interp).file_name().is_some_and(|n| n == "env") {
        if let Some(name) = words.find(|w| !w.starts_with('-')) {
            let on_path = super::path::PROBE_PATH
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
        Self::from_meta(&std::fs::metadata(path).ok()?)
    }

    fn from_meta(m: &std::fs::Metadata) -> Option<Self> {
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
    interpreters: Arc<[PathBuf]>,
    /// It starts with `#!`.
    script: bool,
    /// The program held open when it passed ([`Verdicts::check_and_open`]): while its path
    /// names the same file, runs execute this descriptor without opening it again. An open
    /// descriptor keeps its inode allocated, so the same (dev, ino) is this very file.
    held: Option<Arc<std::os::fd::OwnedFd>>,
}

/// A program the rule passed, held open: the child executes this descriptor (`execveat` with
/// `AT_EMPTY_PATH`) when it is a binary, so what runs is the file that was checked, whatever
/// its path names by the time of the exec (a rename over it, a swapped directory).
#[derive(Debug, Clone)]
pub struct CheckedProgram {
    /// Opened `O_PATH | O_CLOEXEC`: enough to fstat and to execute, not to read.
    pub fd: Arc<std::os::fd::OwnedFd>,
    /// A `#!` script, which the child executes by its path, not by this descriptor: for a
    /// script executed by descriptor the kernel hands the interpreter `/dev/fd/N` as the
    /// script's path, which breaks the plugins that find their own files from `$0` (netdata's
    /// charts.d, munin's) and Perl, which reads `/dev/fd/N` from that very descriptor (an
    /// `O_PATH` one it cannot read). A script's path is as safe as its directories, which
    /// the walk proved only root or the probe's user can change.
    pub script: bool,
}

/// Passed verdicts of one agent ([`super::supervisor::Supervisor`]), keyed by file and the
/// user it runs as, and how many full walks each file had (tests see whether a run
/// re-walked).
#[derive(Debug, Default)]
pub struct Verdicts {
    /// By user, then file: a run's lookup borrows the path, it does not copy it.
    passed: std::sync::Mutex<Passed>,
    walks: std::sync::Mutex<std::collections::HashMap<PathBuf, u64>>,
}

type Passed =
    std::collections::HashMap<Option<u32>, std::collections::HashMap<PathBuf, PassedWalk>>;

impl Verdicts {
    fn passed(&self) -> std::sync::MutexGuard<'_, Passed> {
        self.passed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many full walks `path` has had.
    pub fn full_walks(&self, path: &Path) -> u64 {
        let walks = self.walks.lock().unwrap_or_else(|p| p.into_inner());
        walks.get(path).copied().unwrap_or(0)
    }

    /// `check_program` once per file, not once per run: a passed verdict is reused while the
    /// file and its directory keep the identity (dev, ino, mode, owner, mtime, ctime) they
    /// had when it passed — two stat calls. Replacing the file, or swapping its directory for
    /// another (a rename, a new directory in its place), changes one of them and the full
    /// walk runs again; so does any chmod or chown of either (ctime). Returns the `#!`
    /// interpreters of the file.
    fn check_file(
        &self,
        path: &Path,
        run_as_uid: Option<Uid>,
    ) -> Result<Arc<[PathBuf]>, InsecureProgram> {
        self.check_identified(path, Identity::of(path), run_as_uid)
            .map(|(interpreters, _)| interpreters)
    }

    /// [`Self::check_file`] for the file whose identity is `file_id`: an open descriptor's
    /// (see [`Self::check_and_open`]) or the path's. With a descriptor's, a full walk of the
    /// path must end at that same file, or the file changed while it was checked and is
    /// refused. Returns the `#!` interpreters and whether it is a `#!` script.
    fn check_identified(
        &self,
        path: &Path,
        file_id: Option<Identity>,
        run_as_uid: Option<Uid>,
    ) -> Result<(Arc<[PathBuf]>, bool), InsecureProgram> {
        let user = run_as_uid.map(|u| u.as_raw());
        let dir = path.parent().unwrap_or(Path::new("/"));
        // Identities first, then the walk: a change between the two re-walks next run.
        let before = file_id.clone().zip(Identity::of(dir));
        if let Some((file, dir_id)) = &before {
            let passed = self.passed();
            if let Some(v) = passed.get(&user).and_then(|files| files.get(path)) {
                if *file == v.file && *dir_id == v.dir {
                    return Ok((v.interpreters.clone(), v.script));
                }
            }
        }
        *self
            .walks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(path.to_owned())
            .or_default() += 1;
        let walked = check_program(path, run_as_uid);
        let mut cache = self.passed();
        let files = cache.entry(user).or_default();
        if walked.is_err() {
            files.remove(path);
        }
        walked?;
        // The walk judged the file the path named then: it must be the one held.
        if file_id.is_some() && Identity::of(path) != file_id {
            files.remove(path);
            return Err(InsecureProgram {
                program: path.to_owned(),
                path: path.to_owned(),
                problem: Problem::Changed,
                via: None,
            });
        }
        let interpreters: Arc<[PathBuf]> = shebang_interpreters(path).into();
        let script = head_of(path).is_ok_and(|h| h.starts_with(b"#!"));
        if let Some((file, dir)) = before {
            files.insert(
                path.to_owned(),
                PassedWalk {
                    file,
                    dir,
                    interpreters: interpreters.clone(),
                    script,
                    held: None,
                },
            );
        }
        Ok((interpreters, script))
    }

    /// [`Self::check_probe`], with the program opened first and judged by the identity of
    /// the open file (owner, mode, inode, times): the descriptor returned is what the child
    /// executes. The descriptor is kept with the passed verdict, so a run whose path still
    /// names that file costs what the cached check always cost (a stat of the file and one
    /// of its directory) and executes the file that passed.
    pub fn check_and_open(
        &self,
        program: &Path,
        args: &[String],
        env: &BTreeMap<String, String>,
        run_as_uid: Option<Uid>,
    ) -> Result<CheckedProgram, InsecureProgram> {
        self.check_and_open_seen(program, None, args, env, run_as_uid)
    }

    /// [`Self::check_and_open`], where the caller has just stat'ed `program` (`seen`: a run
    /// that asked [`check_runnable`] a moment before): its answer is the file's identity
    /// now, as a stat of its own would be, one system call fewer. The directory is still
    /// stat'ed here, after it, as always.
    pub fn check_and_open_seen(
        &self,
        program: &Path,
        seen: Option<&std::fs::Metadata>,
        args: &[String],
        env: &BTreeMap<String, String>,
        run_as_uid: Option<Uid>,
    ) -> Result<CheckedProgram, InsecureProgram> {
        use std::os::unix::fs::OpenOptionsExt;
        let user = run_as_uid.map(|u| u.as_raw());
        let dir = program.parent().unwrap_or(Path::new("/"));
        let file = seen.map_or_else(|| Identity::of(program), Identity::from_meta);
        let now = file.zip(Identity::of(dir));
        let cached = now.and_then(|(file, dir_id)| {
            let passed = self.passed();
            let v = passed.get(&user)?.get(program)?;
            let same = v.file == file && v.dir == dir_id;
            let fd = v.held.clone().filter(|_| same)?;
            Some((fd, v.script, v.interpreters.clone()))
        });
        if let Some((fd, script, interpreters)) = cached {
            self.check_rest(program, &interpreters, args, env, run_as_uid)?;
            return Ok(CheckedProgram { fd, script });
        }
        let missing = |e: std::io::Error| InsecureProgram {
            program: program.to_owned(),
            path: program.to_owned(),
            problem: Problem::Missing(e.to_string()),
            via: None,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(program)
            .map_err(missing)?;
        let held = Identity::from_meta(&file.metadata().map_err(missing)?);
        let (interpreters, script) = self.check_identified(program, held.clone(), run_as_uid)?;
        let fd = Arc::new(std::os::fd::OwnedFd::from(file));
        if let Some(v) = self
            .passed()
            .get_mut(&user)
            .and_then(|files| files.get_mut(program))
            .filter(|v| Some(&v.file) == held.as_ref())
        {
            v.held = Some(fd.clone());
        }
        self.check_rest(program, &interpreters, args, env, run_as_uid)?;
        Ok(CheckedProgram { fd, script })
    }
}

/// The whole rule for a command: the program, the interpreters its `#!` names, the script an
/// interpreter is given, and every existing file its arguments name (see [`check_probe`]).
pub fn check_command(
    program: &Path,
    args: &[String],
    plugin_dir: &Path,
    run_as_uid: Option<Uid>,
) -> Result<(), InsecureProgram> {
    let _ = plugin_dir;
    check_probe(program, args, &BTreeMap::new(), run_as_uid)
}

/// The rule for everything a probe will run: the program and the interpreters its `#!`
/// names; every existing regular file an argument names; an interpreter's script or the files
/// its inline code (`-c`, `-e`) names; the command a launcher runs (`LAUNCHERS`), followed
/// in turn; and the `env:` entries that load code: [`REFUSED_ENV`] refused, the files and
/// directories of [`CODE_FILE_ENV`] and [`SEARCH_PATH_ENV`] checked. Every file checked has
/// its `#!` interpreters checked too. Arguments are checked wherever they point, not only
/// under plugin_dir.
pub fn check_probe(
    program: &Path,
    args: &[String],
    env: &BTreeMap<String, String>,
    run_as_uid: Option<Uid>,
) -> Result<(), InsecureProgram> {
    Verdicts::default().check_probe(program, args, env, run_as_uid)
}

impl Verdicts {
    /// [`check_probe`], reusing this agent's passed verdicts.
    pub fn check_probe(
        &self,
        program: &Path,
        args: &[String],
        env: &BTreeMap<String, String>,
        run_as_uid: Option<Uid>,
    ) -> Result<(), InsecureProgram> {
        let interpreters = self.check_file(program, run_as_uid)?;
        self.check_rest(program, &interpreters, args, env, run_as_uid)
    }

    /// Everything [`Self::check_probe`] checks once the program itself has passed.
    fn check_rest(
        &self,
        program: &Path,
        interpreters: &[PathBuf],
        args: &[String],
        env: &BTreeMap<String, String>,
        run_as_uid: Option<Uid>,
    ) -> Result<(), InsecureProgram> {
        let as_program = |e: InsecureProgram, via: Option<String>| InsecureProgram {
            program: program.to_owned(),
            via: e.via.or(via),
            ..e
        };
        for i in interpreters {
            self.check_file(i, run_as_uid)
                .map_err(|e| as_program(e, None))?;
        }
        let path_var = env
            .get("PATH")
            .map_or(super::path::PROBE_PATH, String::as_str);
        let mut files = Vec::new();
        let mut env_entries: Vec<(String, String)> =
            env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut creatable = Vec::new();
        code_files(
            program,
            args,
            path_var,
            0,
            &mut files,
            &mut env_entries,
            &mut creatable,
        );
        for (file, via) in files {
            for i in self
                .check_file(&file, run_as_uid)
                .map_err(|e| as_program(e, via.clone()))?
                .iter()
            {
                self.check_file(i, run_as_uid)
                    .map_err(|e| as_program(e, via.clone()))?;
            }
        }
        for (name, value) in &env_entries {
            check_env_entry(name, value, run_as_uid).map_err(|e| as_program(e, None))?;
        }
        // Not cached: a path that is missing now is judged again at every run.
        for (path, via) in &creatable {
            check_creatable(path, via, run_as_uid).map_err(|e| as_program(e, None))?;
        }
        Ok(())
    }
}

/// One `env:` entry (or an `env NAME=VALUE` word of the command): see [`check_probe`].
fn check_env_entry(
    name: &str,
    value: &str,
    run_as_uid: Option<Uid>,
) -> Result<(), InsecureProgram> {
    let last = if REFUSED_ENV.contains(&name) {
        return Err(InsecureProgram {
            program: PathBuf::new(),
            path: PathBuf::from(name),
            problem: Problem::CodeLoadingEnv {
                name: name.to_owned(),
            },
            via: None,
        });
    } else if SEARCH_PATH_ENV.contains(&name) {
        Last::SearchDir
    } else if CODE_FILE_ENV.contains(&name) {
        Last::File
    } else {
        return Ok(());
    };
    let via = Some(format!("named by env: {name}"));
    for path in env_paths(name, value) {
        let existing = nearest_existing(&path);
        if existing == path {
            walk(&path, run_as_uid, last).map_err(|e| InsecureProgram {
                via: via.clone(),
                ..e
            })?;
            continue;
        }
        check_creatable(&path, via.as_deref().unwrap_or_default(), run_as_uid)?;
    }
    Ok(())
}

/// A path the child may run or load code from that does not exist (yet): whoever may create
/// it decides what it holds, so the nearest directory above it that exists must be one only
/// root (or the probe's user) can write — sticky or not: in `/tmp` anyone may create the
/// name, and would own what runs. Judged at every run (a missing path has no identity to
/// cache), so a file made there later never runs.
fn check_creatable(path: &Path, via: &str, run_as_uid: Option<Uid>) -> Result<(), InsecureProgram> {
    let existing = nearest_existing(path);
    if existing == path {
        // Made since it was found missing: a file gets the file rule (a directory or a
        // device is data, as when the words were read).
        if !path.is_file() {
            return Ok(());
        }
        return walk(path, run_as_uid, Last::File).map_err(|e| InsecureProgram {
            via: Some(via.to_owned()),
            ..e
        });
    }
    walk(existing, run_as_uid, Last::SearchDir).map_err(|e| match e.problem {
        Problem::WritableByOthers { mode } | Problem::SharedSearchDir { mode }
            if e.path == existing =>
        {
            InsecureProgram {
                problem: Problem::Creatable {
                    missing: path.to_owned(),
                    mode,
                },
                via: Some(via.to_owned()),
                ..e
            }
        }
        _ => InsecureProgram {
            via: Some(via.to_owned()),
            ..e
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn inline_code_is_the_word_after_an_option_that_says_so() {
        let table: &[(&str, &[&str], Option<&str>)] = &[
            ("sh", &["-c", "echo 1"], Some("echo 1")),
            ("sh", &["-ec", "set -x"], Some("set -x")),
            ("python3", &["-u", "-c", "print(1)"], Some("print(1)")),
            ("perl", &["-e", "print 1"], Some("print 1")),
            ("perl", &["-E", "say 1"], Some("say 1")),
            // A shell's -e is errexit: x.sh is its script, not code.
            ("sh", &["-e", "x.sh"], None),
            ("sh", &["x.sh", "-c", "not code"], None),
            ("bash", &["--norc", "x.sh"], None),
            ("sh", &["-c"], None),
            ("sh", &[], None),
        ];
        for (name, args, code) in table {
            assert_eq!(
                inline_code_of(name, &strings(args)),
                *code,
                "{name} {args:?}"
            );
        }
    }

    #[test]
    fn program_text_is_every_payload_the_rule_cannot_read() {
        let path = "/usr/bin:/bin";
        let table: &[(&[&str], Option<&str>)] = &[
            (
                &["/bin/sh", "-c", "echo 1"],
                Some("sh -c: code given inline"),
            ),
            (
                &["/bin/sh", "-o", "errexit", "-c", "x"],
                Some("sh -c: code given inline"),
            ),
            (
                &["/bin/bash", "-ec", "x"],
                Some("bash -ec: code given inline"),
            ),
            (
                &["/usr/bin/python3", "-c", "x"],
                Some("python3 -c: code given inline"),
            ),
            (
                &["/usr/bin/perl", "-w", "-e", "x"],
                Some("perl -e: code given inline"),
            ),
            (
                &["/usr/bin/node", "--eval=x"],
                Some("node --eval=x: code given inline"),
            ),
            (
                &["/usr/bin/env", "-S", "sh x"],
                Some("env -S: a command line it splits itself"),
            ),
            (
                &["/usr/bin/env", "A=1", "--split-string=sh x"],
                Some("env --split-string=sh x: a command line it splits itself"),
            ),
            (
                &["/usr/bin/awk", "-f", "/x.awk"],
                Some("awk: an awk program (system(), pipes, getline run commands)"),
            ),
            (
                &["/bin/sed", "s/a/b/"],
                Some("sed: a sed program (its e command runs a shell)"),
            ),
            (
                &["/usr/bin/find", "/", "-execdir", "x", ";"],
                Some("find -execdir: commands built from the names it finds"),
            ),
            (
                &["/usr/bin/xargs", "x"],
                Some("xargs: commands built from its input"),
            ),
            (
                &["/usr/bin/flock", "/", "-c", "x"],
                Some("flock -c: a command line for a shell"),
            ),
            // Behind launchers, and busybox's applets.
            (
                &["/usr/bin/timeout", "5", "/usr/bin/nice", "sed", "p"],
                Some("sed: a sed program (its e command runs a shell)"),
            ),
            (
                &["/bin/busybox", "awk", "1"],
                Some("awk: an awk program (system(), pipes, getline run commands)"),
            ),
            // Files: the rule checks them.
            (&["/bin/sh", "/x.sh"], None),
            (&["/bin/sh", "-e", "/x.sh"], None),
            (&["/usr/bin/python3", "-E", "/x.py"], None),
            (&["/usr/bin/find", "/", "-name", "x"], None),
            (&["/usr/bin/env", "A=1", "/x"], None),
            (&["/opt/probe", "-c", "x"], None),
        ];
        for (argv, want) in table {
            let args = strings(&argv[1..]);
            assert_eq!(
                program_text(Path::new(argv[0]), &args, path).as_deref(),
                *want,
                "{argv:?}"
            );
        }
    }

    #[test]
    fn path_words_are_the_paths_an_argument_may_name() {
        let table: &[(&str, &[&str])] = &[
            ("/opt/x.sh", &["/opt/x.sh"]),
            ("dir/x.sh", &["dir/x.sh"]),
            ("--config=/etc/x.conf", &["/etc/x.conf"]),
            ("-I/opt/lib", &["/opt/lib"]),
            ("KEY=/opt/x", &["KEY=/opt/x", "/opt/x"]),
            ("value", &[]),
            ("-oL", &[]),
            ("10", &[]),
        ];
        for (word, paths) in table {
            assert_eq!(path_words(word), *paths, "{word:?}");
        }
    }

    #[test]
    fn env_paths_split_each_variable_as_its_reader_does() {
        let table: &[(&str, &str, &[&str])] = &[
            ("PATH", "/a:/b", &["/a", "/b"]),
            // An empty PATH entry is the working directory, `/`.
            ("PATH", "/a::/b", &["/a", "/", "/b"]),
            ("PYTHONPATH", "/a::rel", &["/a", "/rel"]),
            ("LD_PRELOAD", "/a.so libc.so.6:/b.so", &["/a.so", "/b.so"]),
            ("LUA_PATH", "/opt/lua/?.lua;;", &["/opt/lua"]),
            ("TCLLIBPATH", "/a /b", &["/a", "/b"]),
            ("BASH_ENV", "/etc/x.sh", &["/etc/x.sh"]),
        ];
        for (name, value, paths) in table {
            let want: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
            assert_eq!(env_paths(name, value), want, "{name}={value}");
        }
    }
}
