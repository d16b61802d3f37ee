//! The orphan reaper task started by `become_subreaper` reaps, on its own, a probe's
//! grandchild that was reparented to the agent — without stealing tokio's own children.
//! (In a process of its own: the reaper task lives in the first runtime that starts it.)

use crate::support::{in_own_process, load_task, our_zombie, read_pid, resource, wait_gone, Setup};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use xce_agent::probe::child::{self, ChildSpec, Exit};
use xce_agent::probe::{reaper, run_once, Outcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reparented_orphans_are_reaped_by_the_reaper_task() {
    if !in_own_process!(
        "reparented_orphans_are_reaped_by_the_reaper_task",
        "it makes the process the child subreaper, whose reaper reaps any child of it"
    ) {
        return;
    }
    let subreaper = reaper::become_subreaper().unwrap();
    let s = Setup::new("resources: []\n");
    let pids = s.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    std::fs::set_permissions(&pids, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(
        s.path().join("resources.yaml"),
        format!(
            "resources:\n{}",
            resource(
                "orphan",
                &format!(
                    "{{kind: exec, command: [orphan], env: {{D: {}}}}}",
                    pids.display()
                )
            )
        ),
    )
    .unwrap();
    s.script(
        "orphan",
        "#!/bin/sh\nsleep 1000 >/dev/null 2>&1 &\necho $! > \"$D/orphan.pid\"\necho 1\n",
    );
    let (task, ctx) = load_task(&s, "orphan");
    let mut reaped = subreaper.reaped();
    // Several runs: tokio's own children are never stolen (each run still sees exit 0).
    for _ in 0..3 {
        let run = run_once(&task, &ctx).await;
        assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
        let pid = read_pid(&pids.join("orphan.pid"));
        wait_gone(pid);
        let guard = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while our_zombie(pid) {
                reaped.changed().await.unwrap();
            }
        });
        guard.await.expect("orphan never reaped by the reaper task");
    }
}

/// Whether this process has a handler for SIGCHLD (`SigCgt` in /proc/self/status).
fn catches_sigchld() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap();
    mask & (1 << (libc::SIGCHLD - 1)) != 0
}

/// No SIGCHLD announces an orphan's death: a child of ours that is still alive when the scan
/// after a run looks (an escapee of a run, dying on its own later) is reaped by the rescans.
/// And on a kernel with pidfds the agent catches no SIGCHLD at all (its cost per run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_that_dies_later_is_reaped_by_a_rescan_without_sigchld() {
    if !in_own_process!(
        "an_orphan_that_dies_later_is_reaped_by_a_rescan_without_sigchld",
        "it makes the process the child subreaper, whose reaper reaps any child of it"
    ) {
        return;
    }
    let mut reaped = reaper::become_subreaper().unwrap().reaped();
    // Not registered, as a run's escapee reparented to the agent is not; alive at the scan.
    let late = std::process::Command::new("/bin/sleep")
        .arg("2")
        .spawn()
        .unwrap();
    let pid = late.id() as i32;
    drop(late);
    let spec = ChildSpec::new("/bin/true", Duration::from_secs(30));
    let run = child::run(&spec).await.unwrap();
    assert_eq!(run.exit, Exit::Code(0));
    wait_gone(pid);
    let guard = tokio::time::timeout(Duration::from_secs(60), async {
        while our_zombie(pid) {
            reaped.changed().await.unwrap();
        }
    });
    guard.await.expect("late orphan never reaped by a rescan");
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) };
    if pidfd < 0 {
        eprintln!("no pidfds on this kernel: exits are waited for by SIGCHLD here");
        return;
    }
    // SAFETY: closes the descriptor just opened, which nothing else holds.
    unsafe { libc::close(pidfd as i32) };
    assert!(!catches_sigchld(), "a SIGCHLD handler is installed");
}

/// An agent started with SIGCHLD ignored (inherited from its parent) would have its children
/// reaped by the kernel, their exit statuses lost: the reaper restores the default.
#[tokio::test]
async fn an_inherited_ignored_sigchld_does_not_lose_exit_statuses() {
    if !in_own_process!(
        "an_inherited_ignored_sigchld_does_not_lose_exit_statuses",
        "it sets the process's SIGCHLD disposition, and makes it the child subreaper"
    ) {
        return;
    }
    // SAFETY: SIG_IGN installs no handler; as a parent that ignores SIGCHLD passes it on.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    reaper::become_subreaper().unwrap();
    let mut spec = ChildSpec::new("/bin/sh", Duration::from_secs(30));
    spec.args = vec!["-c".into(), "exit 3".into()].into();
    let run = child::run(&spec).await.unwrap();
    assert_eq!(run.exit, Exit::Code(3));
}
