//! Exec supervision: whatever a probe's process tree does (background children, ignoring
//! SIGTERM, forking several levels deep, dying by a signal), after the run nothing of the
//! tree is left running and no zombie of ours is left unreaped.

use crate::support as common;

use crate::support::{load_task, our_zombie, read_pid, resource, wait_gone, Setup};
use xce_agent::probe::{run_once, Outcome};
use xce_agent::value::{Reading, Value};

fn setup(name: &str, probe: &str, body: &str) -> Setup {
    let s = Setup::new(&format!("resources:\n{}", resource(name, probe)));
    s.script(name, body);
    s
}

/// Every pid written to `files` is gone and not our zombie. (This process is not the child
/// subreaper: the probe's orphans are init's, and `exec_reaper` tests the reaping of ours.)
fn assert_tree_gone(s: &Setup, files: &[&str]) {
    for f in files {
        let pid = read_pid(&s.path().join("pids").join(f));
        wait_gone(pid);
        assert!(!our_zombie(pid), "{f} ({pid}) left as our zombie");
        assert!(!common::alive(pid), "{f} ({pid}) still running");
    }
}

#[tokio::test]
async fn background_child_is_killed_with_the_group() {
    let s = setup(
        "bg",
        "{kind: exec, command: [bg]}",
        "#!/bin/sh\nsleep 1000 >/dev/null 2>&1 &\necho $! > \"$D/bg.pid\"\necho 5\n",
    );
    let s = with_env(s, "bg", "{kind: exec, command: [bg], env: {D: DIR}}");
    let (task, ctx) = load_task(&s, "bg");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_eq!(run.readings[0].1, Reading::Ok(Value::Numeric(5.0)));
    assert_tree_gone(&s, &["bg.pid"]);
}

/// Rewrite the resource so the probe gets `D=<the temp dir>` (where it writes its pids).
/// `pids/` is writable by all: the probe runs as `nobody` when the tests run as root.
fn with_env(s: Setup, name: &str, probe: &str) -> Setup {
    let pids = common::pids_dir(&s);
    let probe = probe.replace("DIR", &pids.display().to_string());
    std::fs::write(
        s.path().join("resources.yaml"),
        format!("resources:\n{}", resource(name, &probe)),
    )
    .unwrap();
    s
}

#[tokio::test]
async fn background_child_holding_stdout_does_not_hold_the_run() {
    let s = setup(
        "holder",
        "",
        "#!/bin/sh\nsleep 1000 &\necho $! > \"$D/holder.pid\"\necho 5\n",
    );
    let s = with_env(
        s,
        "holder",
        "{kind: exec, command: [holder], timeout: 1s, env: {D: DIR}}",
    );
    let (task, ctx) = load_task(&s, "holder");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::TimedOut);
    let err = run.error().unwrap();
    assert!(
        err.contains("a background process kept its output open"),
        "{err}"
    );
    assert_tree_gone(&s, &["holder.pid"]);
}

#[tokio::test]
async fn a_tree_that_ignores_sigterm_is_killed() {
    let s = setup(
        "deaf",
        "",
        "#!/bin/sh\ntrap '' TERM\necho $$ > \"$D/deaf.pid\"\nsleep 1000 &\necho $! > \"$D/deafchild.pid\"\nwait\nwait\n",
    );
    let s = with_env(
        s,
        "deaf",
        "{kind: exec, command: [deaf], timeout: 1s, env: {D: DIR}}",
    );
    let (task, ctx) = load_task(&s, "deaf");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::TimedOut);
    let err = run.error().unwrap();
    assert!(err.contains("killed after SIGTERM grace"), "{err}");
    assert_tree_gone(&s, &["deaf.pid", "deafchild.pid"]);
}

#[tokio::test]
async fn a_tree_several_levels_deep_is_killed() {
    // Level 1 starts level 2 in the background, which starts level 3; level 1 then reports
    // and exits, leaving 2 and 3 behind (their output goes to /dev/null).
    let body = r#"#!/bin/sh
sh -c 'sh -c "sleep 1000 & echo \$! > $D/l3.pid; wait" & echo $! > $D/l2.pid; wait' >/dev/null 2>&1 &
echo $! > "$D/l1.pid"
while [ ! -s "$D/l3.pid" ]; do sleep 0.05; done
echo 3
"#;
    let s = setup("deep", "", body);
    let s = with_env(s, "deep", "{kind: exec, command: [deep], env: {D: DIR}}");
    let (task, ctx) = load_task(&s, "deep");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_tree_gone(&s, &["l1.pid", "l2.pid", "l3.pid"]);
}

#[tokio::test]
async fn exit_by_signal_is_a_failure_without_a_core() {
    let s = setup(
        "segv",
        "",
        "#!/bin/sh\necho $$ > \"$D/segv.pid\"\necho 1\nkill -SEGV $$\n",
    );
    let s = with_env(s, "segv", "{kind: exec, command: [segv], env: {D: DIR}}");
    let (task, ctx) = load_task(&s, "segv");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Failed);
    assert_eq!(run.error().as_deref(), Some("killed by signal SIGSEGV"));
    assert_tree_gone(&s, &["segv.pid"]);
    assert!(!s.path().join("pids/core").exists());
}

// A grandchild that calls setsid leaves the process group: where cgroups are writable it is
// ended with its run all the same (tests/it/containment.rs).
