//! The script rule beyond argv[0] — the script an interpreter is given, a script's `#!`
//! interpreter — and its verdict cache: one full walk per script, reused while the script and
//! its directory keep their identity, never across a swapped directory.

use crate::support as common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::{load_task, resource, Setup};
use xce_agent::probe::security::{check_command, full_walks, Problem};
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

#[test]
fn a_passed_script_is_walked_once_and_then_only_revalidated() {
    if !root() {
        return;
    }
    let (_d, plugins, p) = tree();
    for _ in 0..5 {
        check(&p, &[], &plugins).unwrap();
    }
    assert_eq!(full_walks(&p), 1);
}

#[test]
fn a_swapped_directory_never_passes_on_the_old_verdict() {
    if !root() {
        return;
    }
    let (d, plugins, p) = tree();
    check(&p, &[], &plugins).unwrap();
    // Someone swaps the directory for a world-writable one holding the same file (a hard
    // link: same inode, same content).
    let old = d.path().join("old");
    std::fs::rename(&plugins, &old).unwrap();
    std::fs::create_dir(&plugins).unwrap();
    chmod(&plugins, 0o777);
    std::fs::hard_link(old.join("probe"), &p).unwrap();
    assert_eq!(
        check(&p, &[], &plugins),
        Err(Problem::WritableByOthers { mode: 0o40777 })
    );
}

#[test]
fn a_chmod_after_the_pass_is_seen() {
    if !root() {
        return;
    }
    let (_d, plugins, p) = tree();
    check(&p, &[], &plugins).unwrap();
    chmod(&p, 0o757);
    assert!(matches!(
        check(&p, &[], &plugins),
        Err(Problem::WritableByOthers { .. })
    ));
    assert_eq!(full_walks(&p), 2);
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
