//! The script rule beyond argv[0] — the script an interpreter is given, a script's `#!`
//! interpreter, the command a launcher runs, the files inline code and arguments name, the
//! `env:` entries that load code — and its verdict cache: one full walk per script, reused while the script and
//! its directory keep their identity, never across a swapped directory.

use crate::support as common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::{load_task, resource, Setup};
use xce_agent::probe::security::{check_command, check_probe, InsecureProgram, Problem, Verdicts};
use xce_agent::probe::{run_once, Outcome};

fn root() -> bool {
    let r = nix::unistd::geteuid().is_root();
    if !r {
        eprintln!("skipped: ownership cases need root (CI runs the tests as root)");
    }
    r
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `<tmp>/plugins/probe`, root-owned, 0755 throughout.
fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    chmod(d.path(), 0o755);
    let plugins = d.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    chmod(&plugins, 0o755);
    let p = common::script(&plugins, "probe", "#!/bin/sh\necho 1\n");
    (d, plugins, p)
}

fn check(program: &Path, args: &[&str], plugins: &Path) -> Result<(), Problem> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    check_command(program, &args, plugins, None).map_err(|e| e.problem)
}

/// As an agent checks `program` before each run, with the verdicts it keeps between runs.
fn check_again(verdicts: &Verdicts, program: &Path) -> Result<(), Problem> {
    verdicts
        .check_probe(program, &[], &BTreeMap::new(), None)
        .map_err(|e| e.problem)
}

#[test]
fn a_passed_script_is_walked_once_and_then_only_revalidated() {
    if !root() {
        return;
    }
    let (_d, _, p) = tree();
    let verdicts = Verdicts::default();
    for _ in 0..5 {
        check_again(&verdicts, &p).unwrap();
    }
    assert_eq!(verdicts.full_walks(&p), 1);
}

#[test]
fn a_swapped_directory_never_passes_on_the_old_verdict() {
    if !root() {
        return;
    }
    let (d, plugins, p) = tree();
    let verdicts = Verdicts::default();
    check_again(&verdicts, &p).unwrap();
    // Someone swaps the directory for a world-writable one holding the same file (a hard
    // link: same inode, same content).
    let old = d.path().join("old");
    std::fs::rename(&plugins, &old).unwrap();
    std::fs::create_dir(&plugins).unwrap();
    chmod(&plugins, 0o777);
    std::fs::hard_link(old.join("probe"), &p).unwrap();
    assert_eq!(
        check_again(&verdicts, &p),
        Err(Problem::WritableByOthers { mode: 0o40777 })
    );
}

#[test]
fn a_chmod_after_the_pass_is_seen() {
    if !root() {
        return;
    }
    let (_d, _, p) = tree();
    let verdicts = Verdicts::default();
    check_again(&verdicts, &p).unwrap();
    chmod(&p, 0o757);
    assert!(matches!(
        check_again(&verdicts, &p),
        Err(Problem::WritableByOthers { .. })
    ));
    assert_eq!(verdicts.full_walks(&p), 2);
}

#[test]
fn the_script_an_interpreter_runs_is_checked() {
    if !root() {
        return;
    }
    let (d, plugins, _) = tree();
    let open_dir = d.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    chmod(&open_dir, 0o777);
    let evil = common::script(&open_dir, "evil.sh", "echo 1\n");
    chmod(&evil, 0o777);
    let e = check(Path::new("/bin/sh"), &[evil.to_str().unwrap()], &plugins);
    assert!(matches!(e, Err(Problem::WritableByOthers { .. })), "{e:?}");
    // Inline code is not a script path.
    check(Path::new("/bin/sh"), &["-c", "echo 1"], &plugins).unwrap();
}

#[test]
fn an_argument_under_plugin_dir_is_checked() {
    if !root() {
        return;
    }
    let (_d, plugins, p) = tree();
    let data = common::script(&plugins, "helper", "echo 1\n");
    chmod(&data, 0o666);
    let e = check(&p, &["--helper", data.to_str().unwrap()], &plugins);
    assert!(matches!(e, Err(Problem::WritableByOthers { .. })), "{e:?}");
}

#[test]
fn a_world_writable_shebang_interpreter_is_refused() {
    if !root() {
        return;
    }
    let (_d, plugins, _) = tree();
    let interp = plugins.join("myshell");
    std::fs::copy("/bin/sh", &interp).unwrap();
    chmod(&interp, 0o777);
    let p = common::script(
        &plugins,
        "uses_it",
        &format!("#!{}\necho 1\n", interp.display()),
    );
    let e = check_command(&p, &[], &plugins, None).unwrap_err();
    assert_eq!(e.path, interp);
    assert!(
        e.to_string().contains("the interpreter or script it runs"),
        "{e}"
    );
}

#[tokio::test]
async fn a_root_agent_refuses_sh_with_a_writable_script() {
    if !root() {
        return;
    }
    let s = Setup::new("resources: []\n");
    let open_dir = s.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    chmod(&open_dir, 0o777);
    let evil = common::script(&open_dir, "evil.sh", "echo 1\n");
    chmod(&evil, 0o777);
    std::fs::write(
        s.path().join("resources.yaml"),
        format!(
            "resources:\n{}",
            resource(
                "evil",
                &format!("{{kind: exec, command: [/bin/sh, {}]}}", evil.display())
            )
        ),
    )
    .unwrap();
    let (task, ctx) = load_task(&s, "evil");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Failed);
    assert!(
        run.error().unwrap().contains("refusing to run /bin/sh"),
        "{:?}",
        run.error()
    );
}

/// The files a launcher, an interpreter's inline code, an argument or an `env:` entry names,
/// as the probe's run would reach them: a root-owned dir (0755) holding `evil.sh` (0777),
/// `ok.sh` (0755), `open/` (0777) and `sticky/` (1777, as /tmp usually is: made here, for
/// a /tmp may be 0755) beside it.
struct Reach {
    _d: tempfile::TempDir,
    dir: PathBuf,
    evil: PathBuf,
    ok: PathBuf,
    open: PathBuf,
    sticky: PathBuf,
}

fn reach() -> Reach {
    let d = tempfile::tempdir().unwrap();
    chmod(d.path(), 0o755);
    let dir = d.path().to_owned();
    let evil = common::script(&dir, "evil.sh", "#!/bin/sh\necho 1\n");
    chmod(&evil, 0o777);
    let ok = common::script(&dir, "ok.sh", "#!/bin/sh\necho 1\n");
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let sticky = dir.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    Reach {
        _d: d,
        dir,
        evil,
        ok,
        open,
        sticky,
    }
}

/// `command` (its first word the program) with `env`, as a root agent checks it before a run.
fn probe_verdict(command: &[String], env: &[(&str, String)]) -> Result<(), InsecureProgram> {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    check_probe(Path::new(&command[0]), &command[1..], &env, None)
}

fn words(template: &[&str], r: &Reach) -> Vec<String> {
    template
        .iter()
        .map(|w| {
            w.replace("EVIL", r.evil.to_str().unwrap())
                .replace("OK", r.ok.to_str().unwrap())
                .replace("OPEN", r.open.to_str().unwrap())
                .replace("DIR", r.dir.to_str().unwrap())
        })
        .collect()
}

/// Launchers, inline code and arguments anywhere: each command runs `evil.sh` (0777) and is
/// refused naming it; the same command running `ok.sh` passes.
#[test]
fn the_rule_follows_launchers_inline_code_and_every_argument() {
    if !root() {
        return;
    }
    let r = reach();
    let table: &[(&str, &[&str])] = &[
        ("stdbuf", &["/usr/bin/stdbuf", "-oL", "EVIL"]),
        (
            "stdbuf, mode apart",
            &["/usr/bin/stdbuf", "-o", "L", "EVIL"],
        ),
        ("timeout", &["/usr/bin/timeout", "-s", "KILL", "10", "EVIL"]),
        ("nice", &["/usr/bin/nice", "-n", "5", "EVIL", "--flag"]),
        ("env", &["/usr/bin/env", "A=1", "EVIL"]),
        ("ionice", &["/usr/bin/ionice", "-c", "3", "EVIL"]),
        ("setsid", &["/usr/bin/setsid", "-w", "EVIL"]),
        ("chrt", &["/usr/bin/chrt", "-o", "0", "EVIL"]),
        ("flock -c", &["/usr/bin/flock", "/", "-c", "EVIL --x"]),
        (
            "launchers nested",
            &[
                "/usr/bin/nice",
                "/usr/bin/timeout",
                "5",
                "/usr/bin/stdbuf",
                "-oL",
                "EVIL",
            ],
        ),
        (
            "a launcher runs an interpreter",
            &["/usr/bin/timeout", "5", "/bin/sh", "EVIL"],
        ),
        ("sh -c sources it", &["/bin/sh", "-c", ". EVIL"]),
        (
            "sh -c runs it",
            &["/bin/sh", "-c", "exec EVIL --x && echo done"],
        ),
        ("sh -ec", &["/bin/sh", "-ec", "x=$(EVIL)"]),
        (
            "sh -c after an option's value",
            &["/bin/sh", "-o", "errexit", "-c", ". EVIL"],
        ),
        ("bash -c", &["/bin/bash", "-c", "source \"EVIL\""]),
        (
            "python3 -c",
            &["/usr/bin/python3", "-c", "exec(open('EVIL').read())"],
        ),
        ("perl -e", &["/usr/bin/perl", "-e", "do 'EVIL'"]),
        ("an argument outside plugin_dir", &["OK", "EVIL"]),
        ("an --option=FILE argument", &["OK", "--config=EVIL"]),
    ];
    for (what, template) in table {
        let command = words(template, &r);
        let e = probe_verdict(&command, &[]).expect_err(what);
        assert_eq!(e.path, r.evil, "{what}: {e}");
        assert!(
            matches!(e.problem, Problem::WritableByOthers { .. }),
            "{what}: {e}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("refusing to run {}: ", command[0]))
                && text.contains(&format!("fix: chmod go-w {}", r.evil.display())),
            "{what}: {text}"
        );
        // The same command running a clean script passes.
        let clean: Vec<&str> = template
            .iter()
            .map(|w| if *w == "EVIL" { "OK" } else { w })
            .collect();
        let clean: Vec<String> = words(&clean, &r)
            .into_iter()
            .map(|w| w.replace(r.evil.to_str().unwrap(), r.ok.to_str().unwrap()))
            .collect();
        probe_verdict(&clean, &[]).unwrap_or_else(|e| panic!("{what}, clean: {e}"));
    }
    // Data that is not a regular file, and inline code naming no file, pass.
    for clean in [
        &["/bin/sh", "-c", "echo 1 > /dev/null; cat /proc/loadavg"][..],
        &["OK", "/dev/null", "/tmp", "-p", "/"],
        &["/usr/bin/timeout", "5", "OK"],
    ] {
        let command = words(clean, &r);
        probe_verdict(&command, &[]).unwrap_or_else(|e| panic!("{command:?}: {e}"));
    }
}

/// `env:` entries that load code: each refused naming what is at fault; the same variable
/// naming root's files passes.
#[test]
fn env_entries_that_load_code_are_checked_or_refused() {
    if !root() {
        return;
    }
    let r = reach();
    let evil = r.evil.display().to_string();
    let ok = r.ok.display().to_string();
    let open = r.open.display().to_string();
    let sticky = r.sticky.display().to_string();
    let missing_in_open = format!("{open}/later.sh");
    // (variable, value, the path at fault or "" when the variable is refused outright)
    let refused: &[(&str, String, &str)] = &[
        ("BASH_ENV", evil.clone(), &evil),
        ("ENV", evil.clone(), &evil),
        (
            "LD_PRELOAD",
            format!("/lib/x86_64-linux-gnu/libc.so.6 {evil}"),
            &evil,
        ),
        ("LD_AUDIT", evil.clone(), &evil),
        ("LD_LIBRARY_PATH", format!("/usr/lib:{open}"), &open),
        ("PYTHONPATH", open.clone(), &open),
        ("PERL5LIB", open.clone(), &open),
        ("RUBYLIB", open.clone(), &open),
        ("PATH", format!("{open}:/usr/bin:/bin"), &open),
        // A search path entry in a sticky directory: anyone may add a name to it (/tmp).
        ("PYTHONPATH", sticky.clone(), &sticky),
        // Not there yet, in a directory anyone may write: whoever creates it wins.
        ("BASH_ENV", missing_in_open.clone(), &open),
        ("PERL5OPT", "-Mstrict".to_owned(), ""),
        ("NODE_OPTIONS", format!("--require {ok}"), ""),
        ("PYTHONSTARTUP", ok.clone(), ""),
    ];
    for (name, value, at) in refused {
        let command = words(&["OK"], &r);
        let e = probe_verdict(&command, &[(name, value.clone())])
            .expect_err(&format!("{name}={value}"));
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("refusing to run {ok}: ")),
            "{text}"
        );
        if at.is_empty() {
            assert_eq!(
                e.problem,
                Problem::CodeLoadingEnv {
                    name: name.to_string()
                },
                "{text}"
            );
            assert!(
                text.contains(&format!("fix: remove {name} from the probe's env:")),
                "{text}"
            );
        } else {
            assert_eq!(e.path, Path::new(at), "{name}={value}: {text}");
            assert!(text.contains(&format!("env: {name}")), "{name}: {text}");
        }
    }
    let sticky = probe_verdict(&words(&["OK"], &r), &[("PYTHONPATH", sticky.clone())]).unwrap_err();
    assert!(
        matches!(sticky.problem, Problem::SharedSearchDir { .. }),
        "{sticky}"
    );
    assert!(
        sticky
            .to_string()
            .contains("fix: name a directory only root can write"),
        "{sticky}"
    );
    let missing = probe_verdict(
        &words(&["OK"], &r),
        &[("BASH_ENV", missing_in_open.clone())],
    )
    .unwrap_err()
    .to_string();
    assert!(
        missing.contains(&format!("{missing_in_open} does not exist, and anyone who may write {open} (mode 0777) may create it")),
        "{missing}"
    );
    // `env NAME=VALUE` in the command is an env: entry too.
    let via_env = words(&["/usr/bin/env", "BASH_ENV=EVIL", "/bin/sh", "OK"], &r);
    assert_eq!(probe_verdict(&via_env, &[]).unwrap_err().path, r.evil);
    // A bare command a launcher looks up on the probe's PATH, in a directory anyone may write.
    let planted = common::script(&r.open, "planted", "#!/bin/sh\necho 1\n");
    chmod(&planted, 0o755);
    let e = probe_verdict(
        &["/usr/bin/env".to_owned(), "planted".to_owned()],
        &[("PATH", format!("/usr/bin:{open}"))],
    )
    .unwrap_err();
    assert_eq!(e.path, r.open, "{e}");
    // Root's own files and directories pass, and variables that load nothing are not looked at.
    for (name, value) in [
        ("BASH_ENV", ok.clone()),
        ("LD_LIBRARY_PATH", "/usr/lib:/lib".to_owned()),
        ("PATH", format!("/usr/bin:/bin:{}", r.dir.display())),
        ("PYTHONPATH", r.dir.display().to_string()),
        ("LD_PRELOAD", "libc.so.6".to_owned()),
        ("D", open.clone()),
        ("LANG", "C".to_owned()),
    ] {
        probe_verdict(&words(&["OK"], &r), &[(name, value.clone())])
            .unwrap_or_else(|e| panic!("{name}={value}: {e}"));
    }
}

/// The exec path itself refuses them: `stdbuf -oL evil.sh` (the usual cure for a buffering
/// elim) never starts, and `BASH_ENV` pointing at a writable file neither.
#[tokio::test]
async fn a_root_agent_never_starts_a_launcher_of_a_writable_script() {
    if !root() {
        return;
    }
    let r = reach();
    for (what, probe) in [
        (
            "stdbuf",
            format!(
                "{{kind: exec, command: [/usr/bin/stdbuf, -oL, {}]}}",
                r.evil.display()
            ),
        ),
        (
            "BASH_ENV",
            format!(
                "{{kind: exec, command: [/bin/bash, -c, 'echo 1'], env: {{BASH_ENV: {}}}}}",
                r.evil.display()
            ),
        ),
    ] {
        let s = Setup::new(&format!("resources:\n{}", resource("r", &probe)));
        let (task, ctx) = load_task(&s, "r");
        let run = run_once(&task, &ctx).await;
        assert_eq!(run.outcome, Outcome::Failed, "{what}");
        let err = run.error().unwrap();
        assert!(err.starts_with("refusing to run "), "{what}: {err}");
        assert!(err.contains(&r.evil.display().to_string()), "{what}: {err}");
        assert_eq!(
            run.exec.unwrap().exit,
            None,
            "{what}: it must not have started"
        );
    }
}

/// `check` lists each of them under PROBLEMS, with the fix.
#[test]
fn check_lists_launched_scripts_and_code_loading_env() {
    if !root() {
        return;
    }
    let r = reach();
    let s = Setup::new(&format!(
        "resources:\n{}{}{}",
        resource(
            "a",
            &format!(
                "{{kind: exec, command: [/usr/bin/stdbuf, -oL, {}]}}",
                r.evil.display()
            )
        ),
        resource(
            "b",
            &format!(
                "{{kind: exec, command: [/bin/sh, -c, '. {}']}}",
                r.evil.display()
            )
        ),
        resource(
            "c",
            &format!(
                "{{kind: stream, command: [{}], format: elim, env: {{LD_PRELOAD: {}}}}}",
                r.ok.display(),
                r.evil.display()
            )
        ),
    ));
    let out = assert_cmd::Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["-c", s.agent_yaml().to_str().unwrap(), "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("PROBLEMS (3)"), "{text}");
    let fix = format!("fix: chmod go-w {}", r.evil.display());
    for (name, program) in [("a", "/usr/bin/stdbuf"), ("b", "/bin/sh")] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}: refusing to run {program}: ")))
            .unwrap_or_else(|| panic!("{name}: {text}"));
        assert!(line.contains(&fix), "{line}");
    }
    let c = text.lines().find(|l| l.starts_with("c: ")).unwrap();
    assert!(c.contains("env: LD_PRELOAD") && c.contains(&fix), "{c}");
}
