//! Containment: where a cgroup v2 hierarchy is writable (root; CI's hybrid host has one at
//! /sys/fs/cgroup/unified), each probe runs in its own cgroup and nothing a run starts
//! outlives it — not a setsid daemon, not a double fork, not 200 background sleeps — and the
//! agent leaves no cgroup behind when it stops. Elsewhere the tests print why they skip.

use crate::support as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::{in_own_process, load_task, read_pid, resource, wait_gone, Setup};
use xce_agent::config::Limits;
use xce_agent::probe::cgroup::{self, Containment};
use xce_agent::probe::{reaper, run_once, Outcome};

/// Containment for this test process, or a printed reason to skip.
fn contained() -> bool {
    xce_agent::probe::child::become_subreaper().unwrap();
    match cgroup::init() {
        Containment::Cgroups(_) => true,
        Containment::ProcessGroups(why) => {
            eprintln!("skipped: no writable cgroup v2 hierarchy here ({why}); CI runs as root on a host with one");
            false
        }
    }
}

/// A probe `name` running `body`, with `D=<a dir every user may write>` for its pid files.
fn setup(name: &str, extra: &str, body: &str) -> (Setup, PathBuf) {
    let s = Setup::new("resources: []\n");
    let pids = common::pids_dir(&s);
    let probe = format!(
        "{{kind: exec, command: [{name}], env: {{D: {}}}{extra}}}",
        pids.display()
    );
    std::fs::write(
        s.path().join("resources.yaml"),
        format!("resources:\n{}", resource(name, &probe)),
    )
    .unwrap();
    s.script(name, body);
    (s, pids)
}

fn probe_cgroup(name: &str) -> PathBuf {
    cgroup::active()
        .expect("contained")
        .probe(name, &Limits::default())
        .expect("probe cgroup")
        .path
        .clone()
}

fn populated(cg: &Path) -> bool {
    std::fs::read_to_string(cg.join("cgroup.events"))
        .unwrap()
        .lines()
        .any(|l| l == "populated 1")
}

fn assert_gone(pid: i32) {
    wait_gone(pid);
    reaper::reap_orphans();
    assert!(!common::alive(pid), "{pid} outlived its run");
}

#[tokio::test]
async fn a_double_forked_setsid_daemon_dies_with_its_run() {
    if !in_own_process!("a_double_forked_setsid_daemon_dies_with_its_run") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, pids) = setup(
        "dfork",
        "",
        "#!/bin/sh\n( setsid sleep 1000 >/dev/null 2>&1 & echo $! > \"$D/daemon.pid\" )\necho 1\n",
    );
    let (task, ctx) = load_task(&s, "dfork");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_gone(read_pid(&pids.join("daemon.pid")));
    assert!(!populated(&probe_cgroup("dfork")));
}

#[tokio::test]
async fn a_run_that_hangs_past_its_timeout_leaves_nothing() {
    if !in_own_process!("a_run_that_hangs_past_its_timeout_leaves_nothing") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, pids) = setup(
        "hang",
        ", timeout: 1s",
        "#!/bin/sh\nsetsid sleep 1000 &\necho $! > \"$D/escaped.pid\"\necho $$ > \"$D/leader.pid\"\nexec sleep 1000\n",
    );
    let (task, ctx) = load_task(&s, "hang");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::TimedOut, "{:?}", run.error());
    assert_gone(read_pid(&pids.join("escaped.pid")));
    assert_gone(read_pid(&pids.join("leader.pid")));
    assert!(!populated(&probe_cgroup("hang")));
}

#[tokio::test]
async fn two_hundred_background_sleeps_are_all_ended() {
    if !in_own_process!("two_hundred_background_sleeps_are_all_ended") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, pids) = setup(
        "many",
        "",
        "#!/bin/sh\nfor i in $(seq 200); do setsid sleep 1000 >/dev/null 2>&1 & echo $! >> \"$D/many.pids\"; done\necho 1\n",
    );
    let (task, ctx) = load_task(&s, "many");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    let list = std::fs::read_to_string(pids.join("many.pids")).unwrap();
    let all: Vec<i32> = list.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(all.len(), 200);
    for pid in all {
        assert_gone(pid);
    }
    assert!(!populated(&probe_cgroup("many")));
}

#[tokio::test]
async fn a_probe_runs_in_its_own_cgroup() {
    if !in_own_process!("a_probe_runs_in_its_own_cgroup") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, _) = setup(
        "where",
        ", format: kv",
        "#!/bin/sh\necho \"cg = $(cut -d: -f3 /proc/self/cgroup | tail -n1)\"\n",
    );
    let (task, ctx) = load_task(&s, "where");
    let run = run_once(&task, &ctx).await;
    let out = String::from_utf8_lossy(&run.exec.unwrap().stdout).into_owned();
    assert!(
        out.trim_end().ends_with("/probes/where"),
        "probe ran in {out:?}"
    );
}

/// The agent's cgroup subtree, from its /proc/<pid>/cgroup (`.../xce-agent.<pid>/agent`).
fn subtree_of(pid: u32) -> Option<PathBuf> {
    let host = cgroup::detect().ok()?;
    let line = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = line.lines().find_map(|l| l.strip_prefix("0::"))?;
    let agent = host.mount.join(path.trim_start_matches('/'));
    Some(agent.parent()?.to_owned())
}

fn agent_command(s: &Setup) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xce-agent"));
    cmd.arg("--config")
        .arg(s.agent_yaml())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("INVOCATION_ID")
        .stdin(Stdio::null());
    cmd
}

#[tokio::test]
async fn a_stopped_daemon_leaves_no_process_and_no_cgroup() {
    if !in_own_process!("a_stopped_daemon_leaves_no_process_and_no_cgroup") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, pids) = setup(
        "held",
        ", timeout: 30s",
        "#!/bin/sh\nsetsid sleep 1000 >/dev/null 2>&1 &\necho $! > \"$D/held.tmp\"\nmv \"$D/held.tmp\" \"$D/held.pid\"\nexec sleep 1000\n",
    );
    let mut daemon = agent_command(&s)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = pids.join("held.pid");
    common::wait_for_file(&pid_file);
    let escaped = read_pid(&pid_file);
    let subtree = subtree_of(daemon.id()).expect("the daemon's cgroup");
    assert!(
        subtree.join("probes/held").is_dir(),
        "{}",
        subtree.display()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(daemon.wait().unwrap().success());
    assert_gone(escaped);
    assert!(!subtree.exists(), "{} left behind", subtree.display());
}

#[tokio::test]
async fn once_contains_its_probes_and_cleans_up() {
    if !in_own_process!("once_contains_its_probes_and_cleans_up") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, pids) = setup(
        "oneshot",
        "",
        "#!/bin/sh\nsetsid sleep 1000 >/dev/null 2>&1 &\necho $! > \"$D/oneshot.pid\"\necho 1\n",
    );
    let out = agent_command(&s).arg("--once").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_gone(read_pid(&pids.join("oneshot.pid")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("no cgroup containment"), "{stderr}");
}

#[tokio::test]
async fn check_names_the_containment_and_its_controllers() {
    let (s, _) = setup("shown", "", "#!/bin/sh\necho 1\n");
    let out = agent_command(&s).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("containment: each probe in its own cgroup")
            || text.contains("no cgroup containment"),
        "{text}"
    );
    if cgroup::detect().is_ok() {
        assert!(text.contains("controllers available"), "{text}");
    }
}

#[tokio::test]
async fn a_probes_cpu_is_counted_by_its_cgroup() {
    if !in_own_process!("a_probes_cpu_is_counted_by_its_cgroup") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, _) = setup(
        "busy",
        "",
        "#!/bin/sh\ni=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; echo 1\n",
    );
    let (task, ctx) = load_task(&s, "busy");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    let usage = cgroup::usage_by_probe();
    let (_, busy) = usage
        .iter()
        .find(|(n, _)| n == "busy")
        .expect("busy's cgroup");
    assert!(busy.cpu > std::time::Duration::ZERO, "{busy:?}");
}

#[tokio::test]
async fn probe_name_shows_the_cgroup_and_its_usage() {
    if !in_own_process!("probe_name_shows_the_cgroup_and_its_usage") {
        return;
    }
    if !contained() {
        return;
    }
    let (s, _) = setup("shown_cg", "", "#!/bin/sh\necho 1\n");
    let out = agent_command(&s)
        .args(["probe", "shown_cg"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("cgroup:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("/probes/shown_cg (cpu "), "{line}");
}

#[test]
fn cgroup_limits_and_the_no_new_privs_opt_out_are_read_from_the_config() {
    let yaml = "resources:\n  - name: capped\n    interval: 10s\n    probe: {kind: exec, command: [x], limits: {memory: 256MiB, pids: 64}, no_new_privs: false}\n  - name: plain\n    interval: 10s\n    probe: {kind: exec, command: [x]}\n";
    let res = xce_agent::config::resources::parse(Path::new("resources.yaml"), yaml).unwrap();
    let spec = |i: usize| match &res.resources[i].probe.as_ref().unwrap().kind {
        xce_agent::config::ProbeKind::Exec(e) => e.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(spec(0).limits.memory, Some(256 << 20));
    assert_eq!(spec(0).limits.pids, Some(64));
    assert!(!spec(0).no_new_privs);
    assert!(spec(1).no_new_privs);
    assert_eq!(spec(1).limits, Limits::default());
}
