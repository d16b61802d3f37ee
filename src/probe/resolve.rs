//! What a probe's `command:` runs, resolved once for the run, `check` and `probe NAME`: the
//! program (absolute; a relative one under plugin_dir; a bare name not there on the probes'
//! fixed PATH, so `awk` is awk) and, for an interpreter (`python3 telegraf/x.py`), its
//! relative script under plugin_dir: the probe's working directory is `/`, where a relative
//! script would never be found.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::unistd::Uid;

use super::path::PROBE_PATH;
use super::security::{self, MissingScript, NotRunnable, Verdict};

/// Where a probe's program was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// `command:` names it by its absolute path.
    Absolute,
    /// Under plugin_dir.
    PluginDir,
    /// A bare name that is not in plugin_dir, found on [`PROBE_PATH`].
    ProbePath,
}

/// A `command:` as the child will get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub found: Found,
    /// The interpreter's relative script, as written, when it was made absolute.
    pub script: Option<String>,
}

impl Resolved {
    /// The whole argv, as `probe NAME` and the logs show it.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = vec![self.program.display().to_string()];
        argv.extend(self.args.iter().cloned());
        argv
    }

    /// What `check` notes about where the program came from, if it is worth a note.
    pub fn note(&self, name: &str, plugin_dir: &Path) -> Option<String> {
        match self.found {
            Found::ProbePath => Some(format!(
                "`{name}` is {} (not in plugin_dir {}: found on the probes' PATH {PROBE_PATH})",
                self.program.display(),
                plugin_dir.display()
            )),
            Found::Absolute | Found::PluginDir => None,
        }
    }
}

/// The programs found on [`PROBE_PATH`] that the log has named, by probe: each is named once
/// per probe (and again when the name comes to mean another file).
#[derive(Debug, Default)]
pub struct PathNotes(Mutex<HashMap<String, HashSet<PathBuf>>>);

impl PathNotes {
    /// Whether `probe` running `program` is new here (and now noted). Looks up without
    /// allocating: only a new pair is copied in.
    pub fn first(&self, probe: &str, program: &Path) -> bool {
        let Ok(mut seen) = self.0.lock() else {
            return true;
        };
        if seen.get(probe).is_some_and(|p| p.contains(program)) {
            return false;
        }
        seen.entry(probe.to_owned())
            .or_default()
            .insert(program.to_owned())
    }
}

/// `argv[0]`: absolute as written; else under plugin_dir; else, for a bare name (no `/`) not
/// in plugin_dir, the first regular file of that name on [`PROBE_PATH`]. A name found
/// nowhere stays under plugin_dir, where [`security::check_runnable`] says where it looked.
pub fn program(plugin_dir: &Path, name: &str) -> (PathBuf, Found) {
    let p = Path::new(name);
    if p.is_absolute() {
        return (p.to_owned(), Found::Absolute);
    }
    let under = plugin_dir.join(p);
    if name.contains('/') || std::fs::symlink_metadata(&under).is_ok() {
        return (under, Found::PluginDir);
    }
    PROBE_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| candidate.is_file())
        .map_or((under, Found::PluginDir), |hit| (hit, Found::ProbePath))
}

/// The program (which must exist and be executable: [`security::check_runnable`]) and its
/// arguments, an interpreter's relative script made absolute under plugin_dir. A relative
/// script not there is an error that says where it was looked for.
pub fn command(plugin_dir: &Path, command: &[String]) -> Result<Resolved, NotRunnable> {
    let name = command.first().map_or("", String::as_str);
    let (program, found) = program(plugin_dir, name);
    security::check_runnable(&program, name, plugin_dir)?;
    let mut args = command.get(1..).unwrap_or_default().to_vec();
    let mut script = None;
    let interpreter = program.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let relative_script = security::is_interpreter(&program)
        .then(|| security::script_arg(interpreter, &args))
        .flatten()
        .filter(|&i| !args[i].starts_with('/'));
    if let Some(i) = relative_script {
        let looked = plugin_dir.join(&args[i]);
        if !looked.is_file() {
            return Err(NotRunnable::ScriptNotFound(Box::new(MissingScript {
                interpreter: program
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                script: args[i].clone(),
                looked,
                plugin_dir: plugin_dir.to_owned(),
            })));
        }
        script = Some(std::mem::replace(
            &mut args[i],
            looked.display().to_string(),
        ));
    }
    Ok(Resolved {
        program,
        args,
        found,
        script,
    })
}

/// Check a probe's `command:` (argv, resolved by [`command`]): the program exists, is an
/// executable regular file, and everything it will run (with `env`, the probe's `env:`)
/// passes [`security::check_probe`] (only enforced when the agent is root). `run_as_uid`: the
/// user the probe runs as (`None` with a root agent: root, where untrusted program text is
/// refused, see [`security::check_text`]); `trusted`: the probe's `trusted:` reason.
pub fn verdict(
    command: &[String],
    env: &BTreeMap<String, String>,
    plugin_dir: &Path,
    run_as_uid: Option<Uid>,
    trusted: Option<&str>,
) -> Verdict {
    let resolved = match self::command(plugin_dir, command) {
        Ok(r) => r,
        Err(e) => return Verdict::Problem(e.to_string()),
    };
    let program = &resolved.program;
    if let Some(e) = security::script_problem(program, false)
        .or_else(|| security::shell_script_problem(program, &resolved.args))
    {
        return Verdict::Problem(e.to_string());
    }
    let checked = security::check_probe(program, &resolved.args, env, run_as_uid).and_then(|()| {
        match security::enforced() && run_as_uid.is_none_or(|u| u.is_root()) {
            true => security::check_text(program, &resolved.args, env, trusted),
            false => Ok(()),
        }
    });
    match checked {
        Ok(()) => Verdict::Ok,
        Err(e) if security::enforced() => Verdict::Refused(e.to_string()),
        Err(e) => Verdict::Unenforced(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_program_on_the_path_is_noted_once_per_probe_and_again_when_it_changes() {
        let notes = PathNotes::default();
        assert!(notes.first("a", Path::new("/usr/bin/echo")));
        assert!(!notes.first("a", Path::new("/usr/bin/echo")));
        assert!(notes.first("b", Path::new("/usr/bin/echo")));
        assert!(notes.first("a", Path::new("/bin/echo")));
        assert!(!notes.first("a", Path::new("/bin/echo")));
    }

    #[test]
    fn a_bare_name_not_in_plugin_dir_is_found_on_the_probe_path() {
        let dir = tempfile::tempdir().unwrap();
        let (sh, found) = program(dir.path(), "sh");
        assert_eq!(found, Found::ProbePath);
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        // A name in plugin_dir wins over the PATH.
        std::fs::write(dir.path().join("sh"), "").unwrap();
        assert_eq!(
            program(dir.path(), "sh"),
            (dir.path().join("sh"), Found::PluginDir)
        );
        // A relative path is plugin_dir's only.
        assert_eq!(
            program(dir.path(), "bin/sh"),
            (dir.path().join("bin/sh"), Found::PluginDir)
        );
        assert_eq!(
            program(dir.path(), "no-such-program-xce"),
            (dir.path().join("no-such-program-xce"), Found::PluginDir)
        );
    }

    #[test]
    fn an_interpreters_relative_script_is_under_plugin_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("telegraf")).unwrap();
        std::fs::write(dir.path().join("telegraf/x.sh"), "echo 1\n").unwrap();
        let r = command(
            dir.path(),
            &words(&["/bin/sh", "-o", "errexit", "telegraf/x.sh"]),
        )
        .unwrap();
        let want = dir.path().join("telegraf/x.sh").display().to_string();
        assert_eq!(r.args, ["-o", "errexit", want.as_str()]);
        assert_eq!(r.script.as_deref(), Some("telegraf/x.sh"));
        let e = command(dir.path(), &words(&["/bin/sh", "telegraf/gone.sh"])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("sh's script telegraf/gone.sh not found: a relative script is looked up in plugin_dir"),
            "{e}"
        );
        // A shell's -e is errexit: `sh -e x.sh` runs x.sh (Perl's -e is code).
        let r = command(dir.path(), &words(&["/bin/sh", "-e", "telegraf/x.sh"])).unwrap();
        assert_eq!(r.args, ["-e", want.as_str()]);
        // Inline code, a module, an absolute script: nothing to resolve.
        for argv in [
            &["/bin/sh", "-c", "x.sh"][..],
            &["/bin/sh", "/etc/x.sh"],
            &["/usr/bin/perl", "-e", "telegraf/x.sh"],
        ] {
            let r = command(dir.path(), &words(argv)).unwrap();
            assert_eq!(r.args, words(&argv[1..]));
            assert_eq!(r.script, None);
        }
    }
}
