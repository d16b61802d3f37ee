//! The orphan reaper task started by `become_subreaper` reaps, on its own, a probe's
//! grandchild that was reparented to the agent — without stealing tokio's own children.
//! (In a process of its own: the reaper task lives in the first runtime that starts it.)

use crate::support::{in_own_process, load_task, our_zombie, read_pid, resource, wait_gone, Setup};
use std::os::unix::fs::PermissionsExt;
use xce_agent::probe::{process, reaper, run_once, Outcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reparented_orphans_are_reaped_by_the_reaper_task() {
    if !in_own_process!("reparented_orphans_are_reaped_by_the_reaper_task") {
        return;
    }
    process::become_subreaper().unwrap();
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
    let mut reaped = reaper::reaped();
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
