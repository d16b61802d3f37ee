//! The daemon through the real binary: SIGHUP reload (diff, refused broken config), SIGTERM
//! (probe trees killed, exit 0), systemd notifications on a fake NOTIFY_SOCKET. The
//! controller is the reference receiver, in-process on 127.0.0.1.

use crate::support as common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use crate::support::{alive, read_pid, wait_until, AgentProc, Setup};
use crate::support::{guard, Controller};
use nix::sys::signal::Signal;
use xce_agent::link::wire::{Batch, Hello};
use xce_agent::receiver::session::{EventKind, ListenOpts};
use xce_agent::value::Value;

/// Probes write their pids into the test's temp dir: run them as the test's own user (the
/// agent drops to `nobody` by default when it is root, as in CI containers; when it is not
/// root, probes run as the agent anyway).
const AS_ME: &str = "run_as: root\n";

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A probe that records each start (its pid, one line per run) and then sleeps, holding
/// its run open: the scheduler skips its ticks instead of starting another.
fn long_probe(setup: &Setup, name: &str) -> PathBuf {
    let starts = setup.path().join(format!("{name}.starts"));
    setup.script(
        name,
        &format!(
            "#!/bin/sh\necho $$ >> {}\nexec sleep 100000\n",
            starts.display()
        ),
    );
    starts
}

/// A numeric resource whose exec probe is the script of the same name.
fn resource(name: &str, interval: &str, timeout: &str) -> String {
    exec_resource(name, name, interval, timeout)
}

fn exec_resource(name: &str, command: &str, interval: &str, timeout: &str) -> String {
    format!(
        "  - name: {name}\n    valtype: numeric\n    interval: {interval}\n    resourcemap:\n      - location: [default]\n    probe:\n      kind: exec\n      command: [{command}]\n      timeout: {timeout}\n"
    )
}

/// The `counter` resource, probed by the support's counter script (`counter.sh`, counting
/// its runs in `counter.count`).
fn counter(interval: &str, timeout: &str) -> String {
    exec_resource("counter", "counter.sh", interval, timeout)
}

/// Skip deltas of the running config until the next hello; return it and the full
/// snapshot that must follow it.
async fn next_hello(ctl: &mut Controller) -> (Hello, Batch) {
    let hello = loop {
        match ctl.next().await.kind {
            EventKind::Hello(h) => break h,
            EventKind::Closed(why) => panic!("connection closed: {why:?}"),
            _ => {}
        }
    };
    let batch = ctl.next_batch().await;
    assert!(batch.full, "the batch after hello must be full: {batch:?}");
    ((*hello).clone(), batch)
}

/// Batches until one carries a numeric value for `name` satisfying `pred`.
async fn until_value(ctl: &mut Controller, name: &str, pred: impl Fn(f64) -> bool) -> f64 {
    loop {
        let batch = ctl.next_batch().await;
        for r in batch.resvals {
            if r.name == name {
                if let Value::Numeric(v) = r.value {
                    if pred(v) {
                        return v;
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn sighup_applies_the_diff_and_a_broken_file_keeps_the_old_config() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let v1 = format!(
        "resources:\n{}{}{}",
        resource("long", "10s", "100s"),
        resource("gone", "10s", "100s"),
        counter("1s", "1s"),
    );
    let setup = Setup::with_agent(
        &v1,
        &format!("{AS_ME}controllers: [\"127.0.0.1:{}\"]\n", ctl.addr.port()),
    );
    let long_starts = long_probe(&setup, "long");
    let gone_starts = long_probe(&setup, "gone");
    setup.counter_script("counter");
    let count_file = setup.file("counter.count");
    setup.script("added", "#!/bin/sh\necho 42\n");
    let mut daemon = setup.spawn_agent();

    let (hello1, _) = next_hello(&mut ctl).await;
    let mut names1: Vec<_> = hello1.resources.iter().map(|d| d.name.as_str()).collect();
    names1.sort();
    assert_eq!(names1, ["counter", "gone", "long"], "{hello1:?}");
    until_value(&mut ctl, "counter", |v| v >= 1.0).await;
    wait_until("both long probes to start", || {
        lines(&long_starts).len() == 1 && lines(&gone_starts).len() == 1
    })
    .await;
    let long_pid = read_pid(&long_starts);
    let gone_pid = read_pid(&gone_starts);
    assert!(alive(long_pid) && alive(gone_pid));

    // Reload: `long` unchanged, `gone` removed, `added` new, `counter` unchanged.
    let v2 = format!(
        "resources:\n{}{}{}",
        resource("long", "10s", "100s"),
        counter("1s", "1s"),
        resource("added", "1s", "1s"),
    );
    std::fs::write(setup.path().join("resources.yaml"), &v2).expect("write v2");
    daemon.signal(Signal::SIGHUP);
    let (hello2, snapshot) = next_hello(&mut ctl).await;
    assert_ne!(hello2.config_digest, hello1.config_digest);
    assert_eq!(hello2.boot_id, hello1.boot_id, "a reload is not a restart");
    let mut names2: Vec<_> = hello2.resources.iter().map(|d| d.name.as_str()).collect();
    names2.sort();
    assert_eq!(names2, ["added", "counter", "long"]);
    let mut snap_names: Vec<_> = snapshot.resvals.iter().map(|r| r.name.as_str()).collect();
    snap_names.sort();
    assert_eq!(snap_names, ["added", "counter", "long"]);
    // The kept counter did not restart from pending: its value survived the reload.
    let counter = snapshot
        .resvals
        .iter()
        .find(|r| r.name == "counter")
        .expect("counter in snapshot");
    assert!(matches!(counter.value, Value::Numeric(_)), "{counter:?}");

    until_value(&mut ctl, "added", |v| v == 42.0).await;
    wait_until("the removed probe's process to be killed", || {
        !alive(gone_pid)
    })
    .await;
    // The unchanged probe's run was neither killed nor restarted.
    assert!(alive(long_pid), "unchanged probe was killed by the reload");
    assert_eq!(
        lines(&long_starts).len(),
        1,
        "unchanged probe was restarted"
    );
    let log = daemon.log_text();
    assert!(
        log.contains("probe gone stopped (gone from the plan)"),
        "{log}"
    );
    assert!(
        log.contains("probe added started (new in the plan)"),
        "{log}"
    );
    assert!(!log.contains("probe long "), "{log}");

    // A broken file: the error is logged with its position and the old config keeps going.
    let broken = v2.replace(
        "valtype: numeric\n    interval: 1s",
        "valtype: numberic\n    interval: 1s",
    );
    std::fs::write(setup.path().join("resources.yaml"), broken).expect("write broken");
    daemon.signal(Signal::SIGHUP);
    let position = regex::Regex::new(r"resources\.yaml:\d+:\d+: .*numberic").expect("regex");
    wait_until("the reload error in the log", || {
        position.is_match(&daemon.log_text()) && daemon.log_text().contains("reload failed")
    })
    .await;
    counter_goes_on_without_a_hello(&mut ctl, &count_file).await;
    assert!(alive(long_pid));

    let (status, stderr) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "exit {status:?}\n{stderr}");
    wait_until("the long probe to be killed at shutdown", || {
        !alive(long_pid)
    })
    .await;
    ctl.stop().await;
}

/// A probe whose task changed is restarted (its running child killed) and the reload says
/// what changed in it; settings that apply only at the next restart say
/// so instead of being silently ignored.
#[tokio::test]
async fn a_changed_probe_restarts_and_the_reload_says_what_changed() {
    let v1 = format!(
        "resources:\n{}{}",
        resource("long", "10s", "100s"),
        resource("steady", "10s", "100s"),
    );
    let setup = Setup::with_agent(&v1, AS_ME);
    let long_starts = long_probe(&setup, "long");
    let steady_starts = long_probe(&setup, "steady");
    let mut daemon = setup.spawn_agent();
    wait_until("both probes to start", || {
        lines(&long_starts).len() == 1 && lines(&steady_starts).len() == 1
    })
    .await;
    let (long_pid, steady_pid) = (read_pid(&long_starts), read_pid(&steady_starts));

    let v2 = format!(
        "resources:\n{}{}",
        resource("long", "10s", "200s"),
        resource("steady", "10s", "100s"),
    );
    std::fs::write(setup.path().join("resources.yaml"), v2).expect("write v2");
    let agent = std::fs::read_to_string(setup.agent_yaml()).expect("agent.yaml");
    std::fs::write(
        setup.agent_yaml(),
        format!("{agent}metrics: 127.0.0.1:1\nmax_stuck_reads: 4\n"),
    )
    .expect("write agent.yaml");
    daemon.signal(Signal::SIGHUP);
    wait_until("the reload's summary", || {
        daemon.log_text().contains("plan applied")
    })
    .await;
    wait_until("the changed probe's old run to be killed", || {
        !alive(long_pid)
    })
    .await;
    assert!(alive(steady_pid), "the unchanged probe was killed");
    assert_eq!(
        lines(&steady_starts).len(),
        1,
        "the unchanged probe restarted"
    );
    let log = daemon.log_text();
    assert!(
        log.contains("probe long restarted: timeout, stale_after changed"),
        "{log}"
    );
    for setting in ["metrics", "max_stuck_reads"] {
        let line = format!("{setting} changed: it takes effect at the next restart of the agent");
        assert!(log.contains(&line), "{line:?} not in\n{log}");
    }
    assert!(!log.contains("probe steady"), "{log}");
    // The summary counts the restart (it once said only `probes_restarted=false`, which
    // read as "none restarted").
    wait_until("the reload's count", || {
        daemon.log_text().contains("reloaded")
    })
    .await;
    let log = daemon.log_text();
    assert!(
        log.contains("restarted=1 all_probes_restarted=false"),
        "{log}"
    );

    let (status, stderr) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "exit {status:?}\n{stderr}");
}

/// After a refused reload: values still arrive, from the same plan (no new hello), and the
/// `counter` probe (a script counting its runs in `count_file`) keeps running.
async fn counter_goes_on_without_a_hello(ctl: &mut Controller, count_file: &Path) {
    let before = std::fs::read_to_string(count_file)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .expect("counter file");
    loop {
        match ctl.next().await.kind {
            EventKind::Hello(h) => panic!("a refused reload sent a hello: {h:?}"),
            EventKind::Batch { batch, .. } => {
                let newer = batch.resvals.iter().any(|r| {
                    r.name == "counter" && matches!(r.value, Value::Numeric(v) if v > before)
                });
                if newer {
                    return;
                }
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn sighup_refuses_what_check_calls_a_problem_and_keeps_the_old_plan() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let v1 = format!("resources:\n{}", counter("1s", "1s"));
    let setup = Setup::with_agent(
        &v1,
        &format!("{AS_ME}controllers: [\"127.0.0.1:{}\"]\n", ctl.addr.port()),
    );
    setup.counter_script("counter");
    let count_file = setup.file("counter.count");
    let mut daemon = setup.spawn_agent();
    next_hello(&mut ctl).await;
    until_value(&mut ctl, "counter", |v| v >= 1.0).await;
    let refusals = |daemon: &AgentProc| daemon.log_text().matches("reload refused").count();

    // A program that is not there: `check` says "not found", and so does the reload.
    let missing = format!("{v1}{}", resource("absent", "1s", "1s"));
    std::fs::write(setup.path().join("resources.yaml"), missing).expect("write");
    daemon.signal(Signal::SIGHUP);
    wait_until("the refused reload in the log", || refusals(&daemon) == 1).await;
    let log = daemon.log_text();
    let wanted = format!(
        "absent: {} not found",
        setup.path().join("absent").display()
    );
    assert!(log.contains(&wanted), "{log}");
    counter_goes_on_without_a_hello(&mut ctl, &count_file).await;

    // An unknown run_as user (only a root agent switches users, so only it can tell).
    if nix::unistd::geteuid().is_root() {
        let nosuchuser = v1.replace("timeout: 1s", "timeout: 1s\n      run_as: nosuchuser");
        std::fs::write(setup.path().join("resources.yaml"), nosuchuser).expect("write");
        daemon.signal(Signal::SIGHUP);
        wait_until("the second refused reload", || refusals(&daemon) == 2).await;
        let log = daemon.log_text();
        assert!(
            log.contains("counter: run_as: no such user \"nosuchuser\""),
            "{log}"
        );
        counter_goes_on_without_a_hello(&mut ctl, &count_file).await;
    } else {
        eprintln!("skipped: the run_as half needs root (CI runs the tests as root)");
    }
    let (status, stderr) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "exit {status:?}\n{stderr}");
    ctl.stop().await;
}

#[tokio::test]
async fn sigterm_kills_the_whole_probe_tree_and_exits_zero() {
    let setup = Setup::with_agent(
        &format!("resources:\n{}", resource("tree", "10s", "100s")),
        AS_ME,
    );
    let pids = setup.path().join("pids");
    // A shell with a background child and a grandchild in a subshell: the whole process
    // group must go, not just the direct child.
    setup.script(
        "tree",
        &format!(
            "#!/bin/sh\nsleep 100000 &\necho $! >> {p}\n(sleep 100000 & echo $! >> {p}; wait) &\necho $! >> {p}\necho $$ >> {p}\nwait\n",
            p = pids.display()
        ),
    );
    let mut daemon = setup.spawn_agent();
    wait_until("the probe tree to start", || lines(&pids).len() == 4).await;
    let tree: Vec<i32> = lines(&pids)
        .iter()
        .map(|l| l.trim().parse().expect("pid"))
        .collect();
    assert!(tree.iter().all(|p| alive(*p)));

    let (status, stderr) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "exit {status:?}\n{stderr}");
    // The agent waits for its probe groups before exiting, so they are gone already; a
    // zombie waiting for init to reap it counts as gone.
    let left: Vec<_> = tree.iter().filter(|p| alive(**p)).collect();
    assert!(left.is_empty(), "still running after exit: {left:?}");
}

/// Notifications read from the fake systemd socket, one datagram each.
struct NotifySocket {
    sock: tokio::net::UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    fn bind(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let std_sock = UnixDatagram::bind(&path).expect("bind notify socket");
        std_sock.set_nonblocking(true).expect("nonblocking");
        let sock = tokio::net::UnixDatagram::from_std(std_sock).expect("tokio socket");
        Self { sock, path }
    }

    async fn next(&self) -> String {
        let mut buf = vec![0u8; 4096];
        let n = guard("a systemd notification", self.sock.recv(&mut buf))
            .await
            .expect("recv");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// Skip notifications until one has the line `line`; returns that datagram.
    async fn until(&self, line: &str) -> String {
        loop {
            let msg = self.next().await;
            if msg.lines().any(|l| l == line) {
                return msg;
            }
        }
    }
}

#[tokio::test]
async fn systemd_ready_reloading_watchdog_stopping() {
    let setup = Setup::new(&format!("resources:\n{}", resource("one", "1s", "1s")));
    setup.script("one", "#!/bin/sh\necho 1\n");
    let notify = NotifySocket::bind(setup.path());
    let socket = notify.path.to_string_lossy().into_owned();
    // 200 ms: small, so pings come during the test; pings are sent at half of it.
    let mut daemon = AgentProc::spawn_with_env(
        &setup.agent_yaml(),
        &setup.file("agent.log"),
        &[("NOTIFY_SOCKET", &socket), ("WATCHDOG_USEC", "200000")],
    );

    let ready = notify.until("READY=1").await;
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=1 probes")),
        "{ready:?}"
    );
    notify.until("WATCHDOG=1").await;

    std::fs::write(
        setup.path().join("resources.yaml"),
        format!("resources:\n{}", resource("one", "2s", "1s")),
    )
    .expect("rewrite");
    daemon.signal(Signal::SIGHUP);
    let reloading = notify.until("RELOADING=1").await;
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "systemd >= 253 needs MONOTONIC_USEC with RELOADING=1: {reloading:?}"
    );
    notify.until("READY=1").await;
    notify.until("WATCHDOG=1").await;

    daemon.signal(Signal::SIGTERM);
    notify.until("STOPPING=1").await;
    let status = daemon.wait_exit().await;
    assert!(status.success(), "{status:?}\n{}", daemon.log_text());
}

/// Reloading agent.yaml itself: a new controller list moves the stream to the new controller
/// (hello + full snapshot there), and a new plugin_dir restarts the probes from it.
#[tokio::test]
async fn sighup_applies_new_controllers_and_plugin_dir() {
    let mut old_ctl = Controller::bind(ListenOpts::default()).await;
    let mut new_ctl = Controller::bind(ListenOpts::default()).await;
    let setup = Setup::new(&format!("resources:\n{}", resource("which", "1s", "5s")));
    let other = setup.path().join("other-plugins");
    std::fs::create_dir(&other).unwrap();
    setup.script("which", "#!/bin/sh\necho 1\n");
    common::script(&other, "which", "#!/bin/sh\necho 2\n");
    let agent_yaml = |controller: &str, plugin_dir: &Path| {
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\n{AS_ME}controllers: [\"{controller}\"]\ninsecure_plaintext: true\n",
            plugin_dir.display()
        )
    };
    std::fs::write(
        setup.agent_yaml(),
        agent_yaml(&old_ctl.addr.to_string(), setup.path()),
    )
    .unwrap();
    let mut daemon = setup.spawn_agent();
    old_ctl.next_hello_and_snapshot().await;
    until_value(&mut old_ctl, "which", |v| v == 1.0).await;

    std::fs::write(
        setup.agent_yaml(),
        agent_yaml(&new_ctl.addr.to_string(), &other),
    )
    .unwrap();
    daemon.signal(Signal::SIGHUP);
    let (hello, _) = new_ctl.next_hello_and_snapshot().await;
    assert!(hello.resources.iter().any(|d| d.name == "which"));
    until_value(&mut new_ctl, "which", |v| v == 2.0).await;
    let (status, stderr) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "{stderr}");
}

/// Every thread of a running agent blocks SIGCHLD (a child's exit wakes none of them: it is
/// seen on the child's pidfd), and its probes start with nothing blocked all the same.
#[tokio::test]
async fn no_agent_thread_takes_sigchld_and_probes_block_no_signal() {
    let setup = Setup::with_agent(
        &format!("resources:\n{}", resource("mask", "1s", "5s")),
        AS_ME,
    );
    let seen = setup.path().join("mask.seen");
    setup.script(
        "mask",
        &format!(
            "#!/bin/sh\nawk '/^SigBlk/{{print $2}}' /proc/self/status > {0}.tmp && mv {0}.tmp {0}\necho 1\n",
            seen.display()
        ),
    );
    let notify = NotifySocket::bind(setup.path());
    let socket = notify.path.to_string_lossy().into_owned();
    let mut daemon = AgentProc::spawn_with_env(
        &setup.agent_yaml(),
        &setup.file("agent.log"),
        &[("NOTIFY_SOCKET", &socket)],
    );
    notify.until("READY=1").await;
    wait_until("the probe's first run", || seen.exists()).await;
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap().trim(),
        "0000000000000000"
    );

    const SIGCHLD_BIT: u64 = 1 << (libc::SIGCHLD - 1);
    let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.pid())).unwrap();
    for task in tasks {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            .unwrap();
        assert_ne!(
            blocked & SIGCHLD_BIT,
            0,
            "a thread takes SIGCHLD:\n{status}"
        );
    }
    daemon.terminate().await;
}

/// Whether the status shows `name` with the numeric value `want`.
fn value_is(name: &str, want: f64) -> impl Fn(&xce_agent::status::StatusReport) -> bool + '_ {
    move |r| {
        r.resources
            .iter()
            .any(|v| v.name == name && v.value == Value::Numeric(want))
    }
}

/// A probe's runs reuse the environment its first run made; a reload that changes its
/// `env:` restarts it, and the new runs see the new value.
#[tokio::test]
async fn a_reloaded_env_reaches_the_probes_next_runs() {
    let with = |level: &str| {
        format!(
            "resources:\n  - name: level\n    valtype: numeric\n    interval: 1s\n    resourcemap:\n      - location: [default]\n    probe:\n      kind: exec\n      command: [level]\n      env: {{LEVEL: \"{level}\"}}\n"
        )
    };
    let setup = Setup::with_agent(&with("7"), &format!("{AS_ME}status_socket: status.sock\n"));
    setup.script("level", "#!/bin/sh\necho \"$LEVEL\"\n");
    let mut daemon = setup.spawn_agent();
    let value_is = |want| value_is("level", want);
    common::wait_status(&setup, "the first value", value_is(7.0)).await;
    std::fs::write(setup.path().join("resources.yaml"), with("8")).expect("write v2");
    daemon.signal(Signal::SIGHUP);
    common::wait_status(&setup, "the value of the new env", value_is(8.0)).await;
    daemon.terminate().await;
}

/// A probe's runs reuse the launch its first run made (the resolved command, its argv,
/// the user's name); a reload that changes its command and its `run_as` restarts it, and
/// the new runs run the new command as the new user.
#[tokio::test]
async fn a_reloaded_command_and_run_as_reach_the_probes_next_runs() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: switching users needs a root agent (CI runs the tests as root)");
        return;
    }
    let with = |script: &Path, user: &str| {
        format!(
            "resources:\n  - name: uid\n    valtype: numeric\n    interval: 1s\n    resourcemap:\n      - location: [default]\n    probe:\n      kind: exec\n      command: [{}]\n      run_as: {user}\n",
            script.display()
        )
    };
    let setup = Setup::with_agent("resources: []\n", "status_socket: status.sock\n");
    let first = setup.script("uid.sh", "#!/bin/sh\nid -u\n");
    let second = setup.script("uid_plus.sh", "#!/bin/sh\necho $(( $(id -u) + 1000 ))\n");
    std::fs::write(setup.path().join("resources.yaml"), with(&first, "nobody")).unwrap();
    let mut daemon = setup.spawn_agent();
    let value_is = |want| value_is("uid", want);
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap().uid;
    common::wait_status(&setup, "nobody's uid", value_is(f64::from(nobody.as_raw()))).await;
    std::fs::write(setup.path().join("resources.yaml"), with(&second, "root")).unwrap();
    daemon.signal(Signal::SIGHUP);
    // 1000: the new script, as root (the old script, or the old user, gives another value).
    common::wait_status(&setup, "the new command as root", value_is(1000.0)).await;
    daemon.terminate().await;
}
