//! The open-file limit through the real binary: an agent whose contained probes hold more
//! descriptors than the soft limit it was started with (systemd gives a service 1024) raises
//! its own to the hard limit, and its probes get the one it was started with; where the hard
//! limit is too low for the configured probes, the agent says so at start.

use nix::sys::resource::{getrlimit, Resource};
use xce_agent::status::ProbeInfo;
use xce_agent::value::Value;

use crate::support::{self as common, wait_until, AgentProc, Setup};

/// Contained, each of these holds two descriptors (its leaf cgroup's directory and
/// `cgroup.events`): 600 and more, past a soft limit of 256, and past the count from which
/// a child shares the agent's table at the clone (`child/spawn.rs`), so these runs take
/// that way once every probe has run.
const PROBES: usize = 300;
const SOFT: u64 = 256;

/// `PROBES` exec probes, each printing its own open-file limit (`ulimit -n`), once a minute.
fn site() -> Setup {
    let mut resources = String::from("resources:\n");
    for i in 0..PROBES {
        resources.push_str(&format!(
            "  - name: nofile{i:03}\n    valtype: numeric\n    interval: 60s\n    \
             resourcemap: [{{location: [default]}}]\n    \
             probe: {{kind: exec, command: [nofile.sh]}}\n"
        ));
    }
    let setup = Setup::with_agent(&resources, "run_as: root\nstatus_socket: status.sock\n");
    setup.script("nofile.sh", "#!/bin/sh\nulimit -n\n");
    setup
}

fn spawn(setup: &Setup, soft: u64, hard: u64) -> AgentProc {
    AgentProc::spawn_with_open_files(&setup.agent_yaml(), &setup.file("agent.log"), soft, hard)
}

/// Every probe ran and none failed to start; each saw the soft limit the agent was started
/// with, not the one the agent raised itself to.
#[tokio::test]
async fn probes_past_the_soft_limit_all_run_and_see_the_limit_the_agent_was_started_with() {
    let (_, hard_now) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let hard = hard_now.min(4096);
    if hard < 1024 {
        eprintln!(
            "skipped: this test's hard open-file limit is {hard_now}; it needs 1024 to give \
             the agent room above a soft limit of {SOFT}"
        );
        return;
    }
    let setup = site();
    let mut agent = spawn(&setup, SOFT, hard);
    // Every probe's first run ended, and its value is in (unless a run failed: said below).
    let (report, _) = common::wait_status(&setup, "every probe's first run", |r| {
        let ended = |p: &&ProbeInfo| p.runs_ok + p.runs_failed + p.runs_timeout > 0;
        let failed = r.probes.iter().any(|p| p.runs_failed > 0);
        let valued = r.resources.iter().all(|v| v.value != Value::Unknown);
        r.probes.iter().filter(ended).count() == PROBES && (failed || valued)
    })
    .await;
    let failed: u64 = report.probes.iter().map(|p| p.runs_failed).sum();
    let log = agent.log_text();
    let first: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN "))
        .take(3)
        .collect();
    assert_eq!(
        failed, 0,
        "runs failed to start; the first warnings: {first:#?}"
    );
    let limits: Vec<&Value> = report.resources.iter().map(|v| &v.value).collect();
    assert!(
        limits.iter().all(|v| **v == Value::Numeric(SOFT as f64)),
        "every probe should see the soft limit the agent was started with ({SOFT}): {limits:?}"
    );
    agent.assert_alive();
    assert!(!log.contains("Too many open files"), "{first:#?}");
    assert!(
        !log.contains("open-file limit"),
        "no shortfall to say: {log}"
    );
    held_descriptors_are_high(agent.pid(), &log);
    agent.terminate().await;
}

/// The leaves' descriptors (two a contained probe) past the first `MANY_HELD` sit at
/// `HELD_FROM` and above, where a child's copy of the agent's table (the part below its own
/// highest descriptor) leaves them out; the agent's raised limit leaves room for them there.
fn held_descriptors_are_high(pid: u32, log: &str) {
    use xce_agent::probe::fd::{HELD_FROM, MANY_HELD};
    if !log.contains("probes are contained: each in its own cgroup") {
        eprintln!("the held descriptors not checked: no containment here (no writable cgroup v2)");
        return;
    }
    let (mut low, mut high) = (0, 0);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().contains("/probes/nofile") {
            continue;
        }
        let n: i32 = entry.file_name().to_string_lossy().parse().unwrap();
        match n >= HELD_FROM {
            true => high += 1,
            false => low += 1,
        }
    }
    assert_eq!(
        (low, high),
        (MANY_HELD, 2 * PROBES - MANY_HELD),
        "(below {HELD_FROM}, from it)"
    );
}

/// A hard limit below what the configured probes need is said at start, with the numbers
/// and the way out; the agent runs on.
#[tokio::test]
async fn a_hard_limit_too_low_for_the_probes_is_said_at_start() {
    let setup = site();
    let mut agent = spawn(&setup, SOFT, SOFT);
    wait_until("the agent's start", || {
        agent.log_text().contains("started host=")
    })
    .await;
    let log = agent.log_text();
    if !log.contains("probes are contained: each in its own cgroup") {
        eprintln!(
            "skipped: the agent cannot contain its probes here (no writable cgroup v2), so \
             they hold no descriptors; CI runs as root on a host with a cgroup v2 mount"
        );
        agent.terminate().await;
        return;
    }
    let want = format!(
        "the open-file limit (RLIMIT_NOFILE) is {SOFT} (hard limit {SOFT}), and {PROBES} \
         contained probes need about"
    );
    assert!(log.contains(&want), "{want:?} not in the log:\n{log}");
    assert!(log.contains("LimitNOFILE="), "{log}");
    agent.assert_alive();
    agent.terminate().await;
}
