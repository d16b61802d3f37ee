//! Script permission checks (sshd StrictModes / PBS style): refused programs, the fix in the
//! message, exec refusing to run them, `check` listing them.

use crate::support as common;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use crate::support::{load_task, resource, Setup};
use nix::unistd::{chown, Uid};
use xce_agent::probe::security::{check_program, Problem};
use xce_agent::probe::{run_once, Outcome};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A root-owned 0755 dir (under /tmp, which is root's and sticky) with a 0755 script.
fn tree() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    chmod(d.path(), 0o755);
    let sub = d.path().join("plugins");
    std::fs::create_dir(&sub).unwrap();
    chmod(&sub, 0o755);
    let p = common::script(&sub, "probe", "#!/bin/sh\necho 1\n");
    (d, p)
}

fn root() -> bool {
    let r = nix::unistd::geteuid().is_root();
    if !r {
        eprintln!("skipped: ownership cases need root (CI runs the tests as root)");
    }
    r
}

#[test]
fn a_clean_tree_passes_even_under_sticky_tmp() {
    let (_d, p) = tree();
    if !root() {
        return;
    }
    check_program(&p, None).unwrap();
}

#[test]
fn group_or_other_writable_program_is_refused_with_the_fix() {
    let (_d, p) = tree();
    if !root() {
        return;
    }
    for mode in [0o775, 0o757, 0o777] {
        chmod(&p, mode);
        let e = check_program(&p, None).unwrap_err();
        assert_eq!(e.path, p);
        assert!(matches!(e.problem, Problem::WritableByOthers { .. }));
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("fix: chmod go-w {}", p.display())),
            "{msg}"
        );
    }
}

#[test]
fn writable_directory_on_the_path_is_refused() {
    let (_d, p) = tree();
    if !root() {
        return;
    }
    let dir = p.parent().unwrap();
    chmod(dir, 0o777);
    let e = check_program(&p, None).unwrap_err();
    assert_eq!(e.path, dir);
    let msg = e.to_string();
    assert!(msg.contains("a directory above"), "{msg}");
    assert!(
        msg.contains(&format!("chmod go-w {}", dir.display())),
        "{msg}"
    );
    // Sticky is allowed only for root-owned directories like /tmp.
    chmod(dir, 0o1777);
    check_program(&p, None).unwrap();
    chown(dir, Some(Uid::from_raw(65534)), None).unwrap();
    assert!(check_program(&p, None).is_err());
}

#[test]
fn foreign_owner_is_refused_unless_it_is_run_as() {
    let (_d, p) = tree();
    if !root() {
        return;
    }
    chown(&p, Some(Uid::from_raw(4242)), None).unwrap();
    let e = check_program(&p, None).unwrap_err();
    assert_eq!(e.problem, Problem::BadOwner { uid: 4242 });
    assert!(e
        .to_string()
        .contains(&format!("fix: chown root {}", p.display())));
    check_program(&p, Some(Uid::from_raw(4242))).unwrap();
    assert!(check_program(&p, Some(Uid::from_raw(4243))).is_err());
}

#[test]
fn symlinks_are_followed_and_their_targets_checked() {
    let (d, p) = tree();
    if !root() {
        return;
    }
    let evil = d.path().join("evil");
    std::fs::create_dir(&evil).unwrap();
    let target = common::script(&evil, "real", "#!/bin/sh\necho 1\n");
    chmod(&evil, 0o777);
    let link = p.parent().unwrap().join("linked");
    symlink(&target, &link).unwrap();
    let e = check_program(&link, None).unwrap_err();
    assert_eq!(e.path, evil);
    chmod(&evil, 0o755);
    check_program(&link, None).unwrap();
    // Relative links too.
    let rel = p.parent().unwrap().join("rel");
    symlink("../evil/real", &rel).unwrap();
    check_program(&rel, None).unwrap();
    chmod(&target, 0o777);
    assert_eq!(check_program(&rel, None).unwrap_err().path, target);
}

#[test]
fn missing_program_and_directories_are_reported() {
    let (_d, p) = tree();
    let e = check_program(&p.with_file_name("nope"), None).unwrap_err();
    assert!(matches!(e.problem, Problem::Missing(_)));
    let e = check_program(p.parent().unwrap(), None).unwrap_err();
    assert_eq!(e.problem, Problem::NotRegularFile);
}

#[tokio::test]
async fn exec_refuses_an_insecure_program() {
    if !root() {
        return;
    }
    let s = Setup::new(&format!(
        "resources:\n{}",
        resource("p", "{kind: exec, command: [p]}")
    ));
    let p = s.script("p", "#!/bin/sh\necho 1\n");
    chmod(&p, 0o777);
    let (task, ctx) = load_task(&s, "p");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Failed);
    let err = run.error().unwrap();
    assert!(err.starts_with("refusing to run"), "{err}");
    assert!(err.contains("chmod go-w"), "{err}");
    let detail = run.exec.unwrap();
    assert_eq!(detail.exit, None, "the program must not have been started");
}

#[test]
fn check_lists_each_refusal_under_problems() {
    if !root() {
        return;
    }
    let s = Setup::new(&format!(
        "resources:\n{}{}{}",
        resource("a", "{kind: exec, command: [a]}"),
        resource("b", "{kind: stream, command: [b], format: elim}"),
        resource("c", "{kind: exec, command: [c]}"),
    ));
    chmod(&s.script("a", "#!/bin/sh\n"), 0o777);
    let b = s.script("b", "#!/bin/sh\n");
    chown(&b, Some(Uid::from_raw(4242)), None).unwrap();
    s.script("c", "#!/bin/sh\n");
    let out = assert_cmd::Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["-c", s.agent_yaml().to_str().unwrap(), "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("PROBLEMS (2)"), "{text}");
    assert!(text.contains(&format!(
        "a: refusing to run {}",
        s.path().join("a").display()
    )));
    assert!(
        text.contains(&format!("chown root {}", b.display())),
        "{text}"
    );
    assert!(!text.contains("c: refusing"), "{text}");
}

/// A script that cannot start says why in the admin's words — in `check`, `--once` and
/// `probe NAME` alike — instead of the kernel's "No such file or directory" for a file that
/// exists: CRLF line endings, a `#!` interpreter that is missing (directly or through
/// `env`, whose own message the runs show) or not executable, and (once the kernel refused
/// it) no `#!` at all.
#[test]
fn a_script_that_cannot_start_says_why_everywhere() {
    // (script, body, what check says (None: nothing), what a run says)
    let cases: [(&str, &str, Option<&str>, &str); 5] = [
        (
            "crlf",
            "#!/bin/sh\r\necho 1\r\n",
            Some("has Windows (CRLF) line endings: its #! line names interpreter /bin/sh followed by a carriage return"),
            "has Windows (CRLF) line endings",
        ),
        (
            "gone",
            "#!/usr/bin/python9\nprint(1)\n",
            Some("interpreter /usr/bin/python9 (from its #! line) not found"),
            "interpreter /usr/bin/python9 (from its #! line) not found",
        ),
        (
            "envgone",
            "#!/usr/bin/env nosuchinterp\n",
            Some("interpreter nosuchinterp (from its #! line) not found on the probes' PATH"),
            "/usr/bin/env: 'nosuchinterp': No such file or directory",
        ),
        (
            "noexec",
            "#!INTERP\n",
            Some("(from its #! line) is not a program the kernel can run"),
            "(from its #! line) is not a program the kernel can run",
        ),
        (
            "bare",
            "echo 1\n",
            None,
            "has no #! line and is not a binary the kernel can run",
        ),
    ];
    for (name, body, check_why, run_why) in cases {
        let s = Setup::with_agent(
            &format!(
                "resources:\n{}",
                resource(name, &format!("{{kind: exec, command: [{name}]}}"))
            ),
            "run_as: root\n",
        );
        // An "interpreter" that is a plain text file, not executable.
        let interp = s.path().join("interp.txt");
        std::fs::write(&interp, "not a program\n").unwrap();
        s.script(name, &body.replace("INTERP", interp.to_str().unwrap()));
        let run = |args: &[&str]| crate::support::agent_output(&s.agent_yaml(), args);
        let (code, text) = run(&["--once"]);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(text.contains(run_why), "{name} --once: {text}");
        let (code, text) = run(&["probe", name]);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(
            text.contains(check_why.unwrap_or(run_why)),
            "{name} probe: {text}"
        );
        let (code, text) = run(&["check"]);
        match check_why {
            Some(why) => {
                assert_eq!(code, Some(1), "{name}: {text}");
                assert!(text.contains(why), "{name} check: {text}");
            }
            None => assert_eq!(code, Some(0), "{name}: {text}"),
        }
    }
}
