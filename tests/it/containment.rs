//! Containment: where a cgroup v2 hierarchy is writable (root; CI's hybrid host has one at
//! /sys/fs/cgroup/unified), each probe runs in its own cgroup and nothing a run starts
//! outlives it — not a setsid daemon, not a double fork, not 200 background sleeps — and the
//! agent leaves no cgroup behind when it stops. Elsewhere the tests print why they skip.

use crate::support as common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::{in_own_process, load_task, read_pid, resource, wait_gone, Setup};
use std::sync::Arc;
use xce_agent::config::Limits;

use xce_agent::plan::ProbeTask;
use xce_agent::probe::cgroup::{self, Containment};
use xce_agent::probe::supervisor::Supervisor;
use xce_agent::probe::ProbeContext;
use xce_agent::probe::{run_once, Outcome};

/// A cgroup tree of this test's own (`xce-agent.<pid>.<start>[.<n>]`, as the agent makes
/// one) for the probes it runs, or a printed reason to skip. The test process stays where
/// it is, so these tests share one process. The guard removes the subtree when the test
/// ends (as the agent does at exit), so a test leaves nothing behind.
fn contained() -> Option<Contained> {
    contain(Containment::under_own_cgroup(false))
}

/// As the agent does it: this process moves into the tree's `agent/` (and is the child
/// subreaper); for a test in a process of its own.
fn contained_as_the_agent() -> Option<Contained> {
    xce_agent::probe::reaper::become_subreaper().unwrap();
    contain(Containment::for_this_process())
}

fn contain(containment: Containment) -> Option<Contained> {
    let supervisor = Supervisor::new(containment);
    match &supervisor.containment {
        Containment::Cgroups(_) => Some(Contained(supervisor)),
        Containment::ProcessGroups(why) => {
            eprintln!("skipped: no writable cgroup v2 hierarchy here ({why}); CI runs as root on a host with one");
            None
        }
    }
}

struct Contained(Arc<Supervisor>);

impl Contained {
    fn tree(&self) -> &cgroup::Tree {
        self.0.containment.tree().expect("contained")
    }

    /// The planned task `name` of the site, with a context whose runs are contained here.
    fn task(&self, s: &Setup, name: &str) -> (ProbeTask, ProbeContext) {
        let (task, mut ctx) = load_task(s, name);
        ctx.supervisor = self.0.clone();
        (task, ctx)
    }

    fn probe_cgroup(&self, name: &str) -> PathBuf {
        self.tree()
            .probe(name, &Limits::default())
            .expect("probe cgroup")
            .path
            .clone()
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        self.0.containment.shut_down();
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

fn populated(cg: &Path) -> bool {
    std::fs::read_to_string(cg.join("cgroup.events"))
        .unwrap()
        .lines()
        .any(|l| l == "populated 1")
}

/// The pids a probe wrote to `path`, one a line (none if it wrote nothing).
fn pids_listed(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// `pid` has ended. (This process is not the subreaper: an orphan's zombie is init's.)
fn assert_gone(pid: i32) {
    wait_gone(pid);
    assert!(!common::alive(pid), "{pid} outlived its run");
}

#[tokio::test]
async fn a_double_forked_setsid_daemon_dies_with_its_run() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, pids) = setup(
        "dfork",
        "",
        "#!/bin/sh\n( setsid sleep 1000 >/dev/null 2>&1 & echo $! > \"$D/daemon.pid\" )\necho 1\n",
    );
    let (task, ctx) = contained.task(&s, "dfork");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_gone(read_pid(&pids.join("daemon.pid")));
    assert!(!populated(&contained.probe_cgroup("dfork")));
}

#[tokio::test]
async fn a_run_that_hangs_past_its_timeout_leaves_nothing() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, pids) = setup(
        "hang",
        ", timeout: 1s",
        "#!/bin/sh\nsetsid sleep 1000 &\necho $! > \"$D/escaped.pid\"\necho $$ > \"$D/leader.pid\"\nexec sleep 1000\n",
    );
    let (task, ctx) = contained.task(&s, "hang");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::TimedOut, "{:?}", run.error());
    assert_gone(read_pid(&pids.join("escaped.pid")));
    assert_gone(read_pid(&pids.join("leader.pid")));
    assert!(!populated(&contained.probe_cgroup("hang")));
}

#[tokio::test]
async fn two_hundred_background_sleeps_are_all_ended() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, pids) = setup(
        "many",
        "",
        "#!/bin/sh\nfor i in $(seq 200); do setsid sleep 1000 >/dev/null 2>&1 & echo $! >> \"$D/many.pids\"; done\necho 1\n",
    );
    let (task, ctx) = contained.task(&s, "many");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    let all = pids_listed(&pids.join("many.pids"));
    assert_eq!(all.len(), 200);
    for pid in all {
        assert_gone(pid);
    }
    assert!(!populated(&contained.probe_cgroup("many")));
}

#[tokio::test]
async fn a_probe_runs_in_its_own_cgroup() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, _) = setup(
        "where",
        ", format: kv",
        "#!/bin/sh\necho \"cg = $(cut -d: -f3 /proc/self/cgroup | tail -n1)\"\n",
    );
    let (task, ctx) = contained.task(&s, "where");
    let run = run_once(&task, &ctx).await;
    let out = String::from_utf8_lossy(&run.exec.unwrap().stdout).into_owned();
    // A leaf of the probe's cgroup: `.../probes/where/run-<n>`.
    let leaf = out.trim_end().rsplit_once('/');
    assert!(
        leaf.is_some_and(
            |(parent, leaf)| parent.ends_with("/probes/where") && leaf.starts_with("run-")
        ),
        "probe ran in {out:?}"
    );
}

/// A stale probe leaf under `subtree` (`probes/old/run-1`) holding a running `sleep`, beside
/// the empty `agent/` its agent left, as an agent that died (or a process that had this pid
/// before) would have left them; `None` where this process may not make cgroups (the caller
/// skips).
fn leave_a_stale_probe(subtree: &Path) -> Option<common::KillOnDrop> {
    leave_a_stale_probe_locked_by_nobody(subtree, None).map(|(sleep, _)| sleep)
}

/// As [`leave_a_stale_probe`], with a process of uid 65534 holding a `flock` of `mode`
/// (`-s` shared, `-x` exclusive) on the subtree's cgroup directory from before any agent may
/// judge it: as any user can, for cgroup directories are readable by everyone.
fn leave_a_stale_probe_locked_by_nobody(
    subtree: &Path,
    mode: Option<&str>,
) -> Option<(common::KillOnDrop, Option<common::KillOnDrop>)> {
    let leaf = subtree.join("probes/old/run-1");
    let mut planting = None;
    if let Err(e) = std::fs::create_dir_all(&leaf).and_then(|()| {
        planting = Some(planting_lock(subtree));
        std::fs::create_dir(subtree.join("agent")).or_else(|e| {
            (e.kind() == std::io::ErrorKind::AlreadyExists)
                .then_some(())
                .ok_or(e)
        })
    }) {
        eprintln!(
            "skipped: cannot make {} ({e}); CI runs as root on a host with a cgroup v2 mount",
            leaf.display()
        );
        return None;
    }
    // Not on the test's output: the test that runs this one reads that to its end.
    let sleep = Command::new("sleep")
        .arg("1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sleep = common::KillOnDrop(sleep);
    std::fs::write(leaf.join("cgroup.procs"), sleep.0.id().to_string()).unwrap();
    let locker = mode.map(|mode| nobody_flocking(subtree, mode));
    drop(planting);
    Some((sleep, locker))
}

/// A process of uid 65534 holding a `flock` of `mode` (`-s`, `-x`) on the directory `dir`
/// until it is dropped; returns once the lock is held (it says so on a pipe).
fn nobody_flocking(dir: &Path, mode: &str) -> common::KillOnDrop {
    use std::io::BufRead;
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args([
            "sh",
            "-c",
            "exec 9<\"$1\" && flock \"$2\" 9 && echo held && exec sleep 1000",
        ])
        .arg("sh")
        .arg(dir)
        .arg(mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = common::KillOnDrop(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line,
        "held\n",
        "nobody could not flock {mode} {}",
        dir.display()
    );
    child
}

/// The lock an agent holds on its subtree, held while a test plants one: until its process
/// is in place, any agent (a test's tree, a test's daemon) setting up beside it would find
/// it abandoned and remove it under the test's hands.
fn planting_lock(subtree: &Path) -> cgroup::SubtreeLock {
    planting_lock_if_there(subtree)
        .unwrap()
        .expect("waited for")
}

/// The subtree's lock, waited for; an error where the subtree is gone.
fn planting_lock_if_there(subtree: &Path) -> std::io::Result<Option<cgroup::SubtreeLock>> {
    let locks = cgroup::LockDir::default_path().unwrap();
    cgroup::LockDir::open(&locks)
        .unwrap()
        .lock(subtree, cgroup::Wait::Yes)
}

fn assert_stale_probe_ended(mut sleep: common::KillOnDrop, subtree: &Path) {
    let pid = sleep.0.id() as i32;
    wait_gone(pid);
    // Before the wait below, which a probe left running would hold for its whole sleep.
    assert!(
        !common::alive(pid),
        "the stale probe {pid} in {} was left running",
        subtree.display()
    );
    assert!(
        !sleep.0.wait().unwrap().success(),
        "the stale probe exited by itself: it was to be killed"
    );
    // Another agent starting beside this test (a test's daemon) may have found the subtree
    // abandoned first: it removes it under the subtree's lock, which this agent's start then
    // could not take (it left the subtree to it). Its removal ends before it lets go.
    if subtree.join("probes/old").exists() {
        if let Ok(Some(lock)) = planting_lock_if_there(subtree) {
            lock.remove_file();
        }
    }
    assert!(
        !subtree.join("probes/old").exists(),
        "{} left in place",
        subtree.join("probes/old").display()
    );
}

/// The cgroup v2 hierarchy and this process's place in it, or a printed reason to skip.
fn v2_host() -> Option<cgroup::Host> {
    cgroup::detect()
        .inspect_err(|e| {
            eprintln!("skipped: {e}; CI runs as root on a host with a cgroup v2 mount")
        })
        .ok()
}

/// Subtrees named by this process's own pid can only be an earlier process's (pids are
/// reused; in a container the agent may get the same pid at every start): one with another
/// start time, and one named as earlier versions did (`xce-agent.<pid>`). Both are killed
/// and removed, and this process is contained in a subtree of its own all the same.
#[tokio::test]
async fn subtrees_left_under_this_pid_are_removed_and_this_process_is_contained() {
    if !in_own_process!(
        "subtrees_left_under_this_pid_are_removed_and_this_process_is_contained",
        "it moves the process into a cgroup (and makes it the child subreaper), as the agent"
    ) {
        return;
    }
    let Some(host) = v2_host() else {
        return;
    };
    let pid = std::process::id();
    // Start time 1: one clock tick after boot, long before this process.
    let earlier = host.own.join(format!("xce-agent.{pid}.1"));
    let legacy = host.own.join(format!("xce-agent.{pid}"));
    let Some(earlier_sleep) = leave_a_stale_probe(&earlier) else {
        return;
    };
    let legacy_sleep = leave_a_stale_probe(&legacy).unwrap();
    let Some(contained) = contained_as_the_agent() else {
        panic!("the stale subtrees under this pid stopped containment");
    };
    let base = &contained.tree().base;
    let name = base.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with(&format!("xce-agent.{pid}.")) && *base != earlier,
        "{}",
        base.display()
    );
    assert_eq!(
        leaf_of(pid as i32),
        base.join("agent"),
        "this process moved in"
    );
    assert_stale_probe_ended(earlier_sleep, &earlier);
    assert_stale_probe_ended(legacy_sleep, &legacy);
    assert!(!earlier.exists() && !legacy.exists());
}

/// A sibling whose `agent/` holds a process is an agent's, alive, whatever its name says and
/// whether or not it holds the lock (an agent of an earlier version takes none): it is left
/// alone, and so is what runs in it.
#[tokio::test]
async fn a_sibling_with_a_process_in_its_agent_cgroup_is_left_alone() {
    let Some(host) = v2_host() else {
        return;
    };
    // Named as if by a process with this pid that started one tick after boot: by pid and
    // start time it would be dead.
    let sibling = host.own.join(format!("xce-agent.{}.2", std::process::id()));
    let mut planting = None;
    if let Err(e) = std::fs::create_dir(&sibling).and_then(|()| {
        planting = Some(planting_lock(&sibling));
        std::fs::create_dir(sibling.join("agent"))?;
        std::fs::create_dir(sibling.join("probes"))
    }) {
        eprintln!(
            "skipped: cannot make {} ({e}); CI runs as root on a host with a cgroup v2 mount",
            sibling.display()
        );
        return;
    }
    let agent = common::KillOnDrop(
        Command::new("sleep")
            .arg("1000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::fs::write(sibling.join("agent/cgroup.procs"), agent.0.id().to_string()).unwrap();
    drop(planting);
    let contained = contained();
    let left_alone = sibling.join("agent").is_dir() && common::alive(agent.0.id() as i32);
    drop((contained, agent));
    remove_dirs(&sibling);
    assert!(
        left_alone,
        "the live sibling {} was removed",
        sibling.display()
    );
}

/// Under systemd (`Delegate=yes`) the unit's cgroup is the agent's subtree, and after a
/// crash and restart it may still hold the probe cgroups of the agent that ran before:
/// their processes are killed and the cgroups removed before this agent's first run.
#[tokio::test]
async fn a_delegated_subtree_is_cleared_of_the_previous_agents_probes() {
    if !in_own_process!(
        "a_delegated_subtree_is_cleared_of_the_previous_agents_probes",
        "it moves the process into a unit's cgroup and sets INVOCATION_ID, as systemd does"
    ) {
        return;
    }
    let Some(host) = v2_host() else {
        return;
    };
    // This process as systemd would start a service: in `<name>.service`, INVOCATION_ID set.
    let unit = InUnit {
        unit: host
            .own
            .join(format!("xce-test-{}.service", std::process::id())),
        parent: host.own.clone(),
    };
    let Some(sleep) = leave_a_stale_probe(&unit.unit) else {
        return;
    };
    std::fs::write(unit.unit.join("cgroup.procs"), "0").unwrap();
    std::env::set_var("INVOCATION_ID", "0123456789abcdef0123456789abcdef");
    let Some(contained) = contained_as_the_agent() else {
        panic!("the delegated subtree {} was refused", unit.unit.display());
    };
    assert_eq!(contained.tree().base, unit.unit);
    assert_stale_probe_ended(sleep, &unit.unit);
}

/// Any user can open a cgroup directory and `flock` it. Under a delegated unit a process of
/// uid 65534 holding a shared, then an exclusive lock on the unit's cgroup changes nothing:
/// the agent takes the unit over (it is not "another agent"), clears the probes the agent
/// before it left, and contains its own.
#[tokio::test]
async fn nobody_flocking_a_units_cgroup_changes_nothing_for_its_agent() {
    if !in_own_process!(
        "nobody_flocking_a_units_cgroup_changes_nothing_for_its_agent",
        "it moves the process into a unit's cgroup and sets INVOCATION_ID, as systemd does"
    ) {
        return;
    }
    let Some(host) = v2_host() else {
        return;
    };
    let unit = InUnit {
        unit: host
            .own
            .join(format!("xce-test-{}.service", std::process::id())),
        parent: host.own.clone(),
    };
    let Some((sleep, shared)) = leave_a_stale_probe_locked_by_nobody(&unit.unit, Some("-s")) else {
        return;
    };
    std::fs::write(unit.unit.join("cgroup.procs"), "0").unwrap();
    std::env::set_var("INVOCATION_ID", "0123456789abcdef0123456789abcdef");
    let Some(contained) = contained_as_the_agent() else {
        panic!(
            "nobody's shared flock on {} stopped containment",
            unit.unit.display()
        );
    };
    assert_eq!(contained.tree().base, unit.unit);
    assert_stale_probe_ended(sleep, &unit.unit);
    // The agent stops (back in the unit's cgroup) and starts again, with an exclusive lock
    // held by nobody this time.
    drop((contained, shared));
    let _exclusive = nobody_flocking(&unit.unit, "-x");
    let Some(contained) = contained_as_the_agent() else {
        panic!(
            "nobody's exclusive flock on {} stopped containment",
            unit.unit.display()
        );
    };
    assert_eq!(contained.tree().base, unit.unit);
    assert!(
        contained
            .tree()
            .lock_path()
            .starts_with(cgroup::LockDir::default_path().unwrap()),
        "{}",
        contained.tree().lock_path().display()
    );
}

/// A dead agent's subtree whose cgroup directory a process of uid 65534 holds a `flock` on
/// (shared on one, exclusive on another) is still removed by the next agent, with the
/// processes left in it.
#[tokio::test]
async fn nobody_flocking_a_dead_agents_subtree_does_not_keep_it() {
    let Some(host) = v2_host() else {
        return;
    };
    let pid = std::process::id();
    // Start times 5 and 6: ticks after boot, long before this process: dead agents' names.
    let shared_dir = host.own.join(format!("xce-agent.{pid}.5"));
    let exclusive_dir = host.own.join(format!("xce-agent.{pid}.6"));
    let Some((shared_sleep, _shared)) =
        leave_a_stale_probe_locked_by_nobody(&shared_dir, Some("-s"))
    else {
        return;
    };
    let (exclusive_sleep, _exclusive) =
        leave_a_stale_probe_locked_by_nobody(&exclusive_dir, Some("-x")).unwrap();
    let Some(_contained) = contained() else {
        panic!("the stale subtrees stopped containment");
    };
    assert_stale_probe_ended(shared_sleep, &shared_dir);
    assert_stale_probe_ended(exclusive_sleep, &exclusive_dir);
    assert!(!shared_dir.exists() && !exclusive_dir.exists());
}

/// The start of a plain agent: a process of uid 65534 that takes a `flock` on the agent's
/// new subtree the moment it is made (the race that once hung a start: the agent waited for
/// its own subtree's lock) neither delays the set-up nor keeps it from its containment. And
/// it cannot open the lock file that is the agent's proof.
#[test]
fn nobody_flocking_a_new_subtree_neither_delays_nor_uncontains_an_agent() {
    let Some(host) = v2_host() else {
        return;
    };
    if nix::unistd::access(&host.own, nix::unistd::AccessFlags::W_OK).is_err() {
        eprintln!(
            "skipped: {} is not writable; CI runs as root",
            host.own.display()
        );
        return;
    }
    for mode in ["-s", "-x"] {
        *NEW_SUBTREE_FLOCK.lock().unwrap() = (mode, None);
        let layout = cgroup::Layout {
            kernel: cgroup::Kernel {
                mkdir: mkdir_then_nobody_flocks_it,
                ..cgroup::Kernel::CGROUPFS
            },
            ..cgroup::Layout::for_this_process(&host, false).unwrap()
        };
        // On a thread of its own: a set-up that waits for nobody's lock fails the test
        // within the hang guard, not the suite's time.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(cgroup::Tree::set_up(layout));
        });
        let tree = rx
            .recv_timeout(common::HANG_GUARD)
            .unwrap_or_else(|e| panic!("set-up waited for nobody's flock {mode}: {e}"))
            .unwrap_or_else(|e| panic!("nobody's flock {mode} stopped containment: {e}"));
        let locker = NEW_SUBTREE_FLOCK.lock().unwrap().1.take();
        assert!(
            locker.is_some(),
            "nobody did not lock {}",
            tree.base.display()
        );
        let opened = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["sh", "-c", "exec 9<\"$1\"", "sh"])
            .arg(tree.lock_path())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(
            !opened.success(),
            "nobody opened {}",
            tree.lock_path().display()
        );
        tree.shut_down();
        assert!(!tree.base.exists(), "{} left behind", tree.base.display());
    }
}

/// The lock mode for the next subtree made by [`mkdir_then_nobody_flocks_it`], and the
/// locker it started.
static NEW_SUBTREE_FLOCK: std::sync::Mutex<(&str, Option<common::KillOnDrop>)> =
    std::sync::Mutex::new(("-s", None));

/// cgroupfs's mkdir; a new agent subtree is then locked by nobody before the agent goes on.
fn mkdir_then_nobody_flocks_it(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir(path)?;
    let is_subtree = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("xce-agent."));
    if is_subtree {
        let mut slot = NEW_SUBTREE_FLOCK.lock().unwrap();
        slot.1 = Some(nobody_flocking(path, slot.0));
    }
    Ok(())
}

/// The unit's cgroup of the test above: at the end (passed or not) the agent's stop moves
/// the process back to where it started, then out of the unit, and the unit's cgroup goes,
/// as systemd would remove it.
struct InUnit {
    unit: PathBuf,
    parent: PathBuf,
}

impl Drop for InUnit {
    fn drop(&mut self) {
        let _ = std::fs::write(self.parent.join("cgroup.procs"), "0");
        remove_dirs(&self.unit);
    }
}

/// An empty cgroup tree, deepest first.
fn remove_dirs(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_dirs(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The agent's cgroup subtree, from its /proc/<pid>/cgroup (`.../xce-agent.<pid>.<start>/agent`).
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
    let Some(_contained) = contained() else {
        return;
    };
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
    let Some(_contained) = contained() else {
        return;
    };
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
    // The default pids limit: said to be unenforced where the controller is missing.
    let pids_available = cgroup::detect().is_ok_and(|h| {
        h.controllers.iter().any(|c| c == "pids")
            && nix::unistd::access(&h.own, nix::unistd::AccessFlags::W_OK).is_ok()
    });
    assert_eq!(
        text.contains("limits NOT ENFORCED: pids.max of shown is not set on this host"),
        !pids_available,
        "{text}"
    );
}

#[tokio::test]
async fn a_probes_cpu_is_counted_by_its_cgroup() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, _) = setup(
        "busy",
        "",
        "#!/bin/sh\ni=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; echo 1\n",
    );
    let (task, ctx) = contained.task(&s, "busy");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    let usage = contained.0.containment.usage_by_probe();
    let (_, busy) = usage
        .iter()
        .find(|(n, _)| n == "busy")
        .expect("busy's cgroup");
    assert!(busy.cpu > std::time::Duration::ZERO, "{busy:?}");
}

#[tokio::test]
async fn probe_name_shows_the_cgroup_and_its_usage() {
    let Some(_contained) = contained() else {
        return;
    };
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
    // The default pids limit (agent.yaml's probe_pids_max).
    assert_eq!(
        spec(1).limits,
        Limits {
            pids: Some(xce_agent::config::limits::DEFAULT_PROBE_PIDS_MAX),
            ..Limits::default()
        }
    );
}

/// Where the pids controller is enabled for the probes, the default limit is their cgroup's
/// pids.max; where it is not, `--once` says once (not once per probe) that the limit is not
/// enforced, and what to do.
#[tokio::test]
async fn the_default_pids_limit_is_set_or_said_to_be_unenforced() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, _) = setup("limited", "", "#!/bin/sh\necho 1\n");
    // Two probes, so that "once" means once.
    std::fs::write(
        s.path().join("resources.yaml"),
        format!(
            "resources:\n{}{}",
            resource("limited", "{kind: exec, command: [limited]}"),
            resource("limited2", "{kind: exec, command: [limited]}")
        ),
    )
    .unwrap();
    let enabled = contained.tree().controllers.clone();
    if enabled.iter().any(|c| c == "pids") {
        let (task, ctx) = contained.task(&s, "limited");
        run_once(&task, &ctx).await;
        let max =
            std::fs::read_to_string(contained.probe_cgroup("limited").join("pids.max")).unwrap();
        assert_eq!(max.trim(), "128");
    } else {
        eprintln!("the pids controller is not enabled here ({enabled:?}): checking the warning");
        let out = agent_command(&s).arg("--once").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(stderr.matches("limits NOT ENFORCED").count(), 1, "{stderr}");
        assert!(
            stderr.contains("pids.max is not set for this probe or any other"),
            "{stderr}"
        );
    }
}

// Reloads: an old task's teardown (`cgroup.kill` of the probe's cgroup) must never reach
// a new task's run of the same probe, and a removed probe's cgroup goes with its last run.
// The scheduler runs in this process (on a multi-thread runtime, as in the daemon); the
// probes are real processes gated by FIFOs, and blocking waits run off the runtime.

/// A stream probe `a` (elim format) whose script gets its generation as `$1` and `D` (a dir
/// every user may write) for its files; FIFOs `release` and `ping` in `D`.
fn stream_site(body: &str) -> (Setup, PathBuf) {
    let (s, d) = setup("el", "", body);
    for fifo in ["release", "ping"] {
        let path = d.join(fifo);
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::empty()).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
    }
    write_generation(&s, &d, "stream", "v1");
    (s, d)
}

/// resources.yaml with probe `a` of `kind` running `el GENERATION`.
fn write_generation(s: &Setup, d: &Path, kind: &str, generation: &str) {
    let format = if kind == "stream" {
        ", format: elim"
    } else {
        ""
    };
    let probe = format!(
        "{{kind: {kind}, command: [el, {generation}]{format}, timeout: 1h, env: {{D: {}}}}}",
        d.display()
    );
    let text = resource("a", &probe).replace("interval: 60s", "interval: 1s");
    std::fs::write(
        s.path().join("resources.yaml"),
        format!("resources:\n{text}"),
    )
    .unwrap();
}

fn write_no_probes(s: &Setup) {
    std::fs::write(s.path().join("resources.yaml"), "resources: []\n").unwrap();
}

fn plan_of(s: &Setup) -> xce_agent::plan::Plan {
    let config = xce_agent::config::load(&s.agent_yaml(), None).unwrap();
    xce_agent::plan::plan_for(&config, "node001", &Default::default())
}

struct Reloading {
    sched: xce_agent::schedule::Scheduler,
    store: std::sync::Arc<xce_agent::store::Store>,
    plan: xce_agent::plan::Plan,
}

impl Reloading {
    fn start(s: &Setup, contained: &Contained) -> Self {
        let plan = plan_of(s);
        let store = std::sync::Arc::new(xce_agent::store::Store::new());
        store.declare(xce_agent::daemon::declared(&plan));
        let (_, ctx) = contained.task(s, "a");
        let mut sched = xce_agent::schedule::Scheduler::new(
            store.clone(),
            ctx,
            8,
            tokio_util::sync::CancellationToken::new(),
        );
        sched.start(&plan);
        Self { sched, store, plan }
    }

    /// What the daemon does on SIGHUP: the diff of the old and new plan, executed.
    fn reload(&mut self, s: &Setup) {
        let plan = plan_of(s);
        let changes = xce_agent::reload::probe_changes(&self.plan.tasks, &plan.tasks, false);
        self.store.declare(xce_agent::daemon::declared(&plan));
        self.sched.apply(&changes, &plan);
        let names: Vec<&str> = plan.tasks.iter().map(|t| t.name.as_str()).collect();
        self.sched.context().supervisor.containment.retain(&names);
        self.plan = plan;
    }

    async fn value(&self, v: f64) {
        common::wait_for(&self.store, "a", |r| {
            r.value == xce_agent::value::Value::Numeric(v)
        })
        .await;
    }
}

/// The leaf cgroup a process is in.
fn leaf_of(pid: i32) -> PathBuf {
    let host = cgroup::detect().unwrap();
    let line = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = line.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    host.mount.join(path.trim_start_matches('/'))
}

async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

fn starts(d: &Path, generation: &str) -> Vec<i32> {
    pids_listed(&d.join(format!("{generation}.starts")))
}

/// Ask the run waiting on `ping` who it is: it answers with its pid in `pong`. Asked again
/// while no answer came: a run killed after it opened `ping` never answers, the run that
/// replaced it does. A failed run in `store` ends the wait with its error.
async fn ping(d: &Path, store: &xce_agent::store::Store) -> i32 {
    let (ping, pong) = (d.join("ping"), d.join("pong"));
    common::wait_until("a run to answer on ping", || {
        if pong.exists() {
            return true;
        }
        if let Some(r) = store
            .get("a", "")
            .filter(|r| r.status == xce_agent::value::Status::Failed)
        {
            panic!("the new run failed: {:?}", r.error);
        }
        // Non-blocking: with no reader the open fails (ENXIO) instead of waiting for one.
        if let Ok(mut w) = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&ping)
        {
            let _ = std::io::Write::write_all(&mut w, b"\n");
        }
        false
    })
    .await;
    read_pid(&pong)
}

/// Generation v1 leaves a setsid holder (only `cgroup.kill` reaches it) and, on SIGTERM,
/// notes `v1 term` in `order` and never exits by itself: its run ends when the SIGTERM grace
/// does, with SIGKILL. Any later generation notes in `order` whether v1 was still there when
/// it started, then answers one `ping` with its pid, then runs until it is stopped.
const GENERATIONS: &str = "#!/bin/sh
echo $$ >> \"$D/$1.starts\"
if [ \"$1\" = v1 ]; then
  setsid sleep 100000 >/dev/null 2>&1 &
  echo $! > \"$D/holder.tmp\"; mv \"$D/holder.tmp\" \"$D/holder\"
  trap 'echo \"v1 term\" >> \"$D/order\"; read x < \"$D/release\"; exit 0' TERM
  echo '1 a 1'
else
  if [ -d \"/proc/$(head -n 1 \"$D/v1.starts\")\" ]; then
    echo \"$1 starts beside v1\" >> \"$D/order\"
  else
    echo \"$1 starts\" >> \"$D/order\"
  fi
  echo '1 a 2'
  read x < \"$D/ping\"
  echo $$ > \"$D/pong.tmp\"; mv \"$D/pong.tmp\" \"$D/pong\"
fi
while :; do sleep 100000 & wait $!; done
";

/// Generation v1 of probe `a` running and reported, under a scheduler in this process.
struct V1 {
    s: Setup,
    d: PathBuf,
    agent: Reloading,
    /// v1's pid, and its setsid holder's.
    pid: i32,
    holder: i32,
}

impl V1 {
    async fn reporting(contained: &Contained) -> Self {
        let (s, d) = stream_site(GENERATIONS);
        let agent = Reloading::start(&s, contained);
        agent.value(1.0).await;
        let holder = read_pid(&d.join("holder"));
        let pid = starts(&d, "v1")[0];
        Self {
            s,
            d,
            agent,
            pid,
            holder,
        }
    }
}

/// What the generations noted, in order.
fn order(d: &Path) -> Vec<String> {
    std::fs::read_to_string(d.join("order"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A restarted stream's new run starts once the old run has ended (here, at the end of its
/// SIGTERM grace), never beside it; and the old run's teardown (`cgroup.kill` of its leaf)
/// does not reach the new run: the run that answers is the first and only v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_restarted_stream_starts_once_its_old_run_has_ended_and_is_not_killed() {
    let Some(contained) = contained() else {
        return;
    };
    let V1 {
        s,
        d,
        mut agent,
        holder,
        ..
    } = V1::reporting(&contained).await;
    write_generation(&s, &d, "stream", "v2");
    agent.reload(&s);
    // The holder goes only with the old run's teardown: from here on that has happened.
    off_runtime(move || wait_gone(holder)).await;
    agent.value(2.0).await;
    let answered = ping(&d, &agent.store).await;
    assert_eq!(order(&d), ["v1 term", "v2 starts"]);
    assert_eq!(
        starts(&d, "v2"),
        vec![answered],
        "the new run was killed by the old run's teardown and restarted"
    );
    agent.sched.stop().await;
    assert_gone(answered);
    assert!(!populated(&contained.probe_cgroup("a")));
}

/// A run whose leftovers were killed retires its leaf: the next run is cloned into a fresh
/// one. (Here the kernel SIGKILLs a child cloned into a cgroup that was once written
/// `cgroup.kill`: reusing the leaf killed every later run of the probe at birth.)
#[tokio::test]
async fn the_run_after_one_whose_leftovers_were_killed_is_not_killed_at_birth() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, pids) = setup(
        "leaves",
        "",
        "#!/bin/sh\n( setsid sleep 100000 >/dev/null 2>&1 & echo $! >> \"$D/left.pids\" )\necho 1\n",
    );
    let (task, ctx) = contained.task(&s, "leaves");
    for run in 1..=3 {
        let done = run_once(&task, &ctx).await;
        assert_eq!(done.outcome, Outcome::Ok, "run {run}: {:?}", done.error());
    }
    for pid in pids_listed(&pids.join("left.pids")) {
        assert_gone(pid);
    }
    // The retired leaves go as later runs start, once their processes have gone (a leaf
    // whose killed processes are still exiting is busy: its removal waits for the next run).
    // Here they have all gone, so the next run's start removes them all: at most its own
    // leaf, and the one before it, are left.
    let done = run_once(&task, &ctx).await;
    assert_eq!(done.outcome, Outcome::Ok, "run 4: {:?}", done.error());
    let leaves = std::fs::read_dir(contained.probe_cgroup("leaves"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .count();
    assert!(leaves <= 2, "{leaves} leaves left behind");
}

/// The exec kind: a restart cancels the old run, whose child is still running, so its
/// leaf is killed; the new task's first run must still run and report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_restarted_exec_probe_reports_from_its_new_run() {
    let Some(contained) = contained() else {
        return;
    };
    let (s, d) = stream_site(
        "#!/bin/sh\necho $$ >> \"$D/$1.starts\"\nif [ \"$1\" = v1 ]; then read x < \"$D/release\"; echo 1; else echo 2; fi\n",
    );
    write_generation(&s, &d, "exec", "v1");
    let mut agent = Reloading::start(&s, &contained);
    let started = d.join("v1.starts");
    common::wait_until("the first run to start", || started.exists()).await;
    let old = read_pid(&started);
    write_generation(&s, &d, "exec", "v2");
    agent.reload(&s);
    let first = common::wait_for(&agent.store, "a", |r| {
        r.status != xce_agent::value::Status::Pending
    })
    .await;
    assert_eq!(
        (first.status, &first.value, &first.error),
        (
            xce_agent::value::Status::Ok,
            &xce_agent::value::Value::Numeric(2.0),
            &None
        ),
        "the new task's first run"
    );
    assert_gone(old);
    agent.sched.stop().await;
}

/// A probe removed by one reload and added again by the next, while its old stream is
/// still ending: the new run starts once the old one has ended, the old run's teardown
/// reaches neither the new run nor the new cgroup, and the old leaf is gone with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_removed_and_re_added_by_two_quick_reloads_keeps_its_new_run() {
    let Some(contained) = contained() else {
        return;
    };
    let V1 {
        s,
        d,
        mut agent,
        pid: old,
        holder,
    } = V1::reporting(&contained).await;
    let old_leaf = leaf_of(old);
    write_no_probes(&s);
    agent.reload(&s);
    write_generation(&s, &d, "stream", "v2");
    agent.reload(&s);
    off_runtime(move || wait_gone(holder)).await;
    assert_gone(old);
    agent.value(2.0).await;
    let answered = ping(&d, &agent.store).await;
    assert_eq!(order(&d), ["v1 term", "v2 starts"]);
    assert_eq!(
        starts(&d, "v2"),
        vec![answered],
        "the re-added probe's run was killed"
    );
    assert_ne!(leaf_of(answered), old_leaf);
    // Removed off the runtime once the old run has checked its leaf in.
    common::wait_until("the old leaf to be removed", || !old_leaf.exists()).await;
    agent.sched.stop().await;
    assert_gone(answered);
}

/// A probe removed by a reload is stopped as a restarted one is: SIGTERM, its grace, then
/// its leaf killed; the reload does not cut the grace short by killing the probe's cgroup,
/// and the cgroup is removed once the run has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_stream_gets_its_sigterm_grace_and_its_cgroup_goes_after() {
    let Some(contained) = contained() else {
        return;
    };
    let V1 {
        s,
        d,
        mut agent,
        pid: old,
        holder,
    } = V1::reporting(&contained).await;
    let probe = contained.probe_cgroup("a");
    write_no_probes(&s);
    agent.reload(&s);
    assert!(
        probe.exists(),
        "the reload removed the cgroup of a run still ending"
    );
    off_runtime(move || wait_gone(holder)).await;
    assert_gone(old);
    assert_eq!(
        order(&d),
        ["v1 term"],
        "the run was not given its SIGTERM grace"
    );
    common::wait_until("the removed probe's cgroup to go", || !probe.exists()).await;
    agent.sched.stop().await;
}

/// Shutdown right after a restart, while the old stream is still ending: the new run never
/// starts, and nothing is left, neither process nor cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_restart_leaves_no_process_and_no_cgroup() {
    let Some(contained) = contained() else {
        return;
    };
    let V1 {
        s,
        d,
        mut agent,
        pid: old,
        holder,
    } = V1::reporting(&contained).await;
    let probes = contained.probe_cgroup("a");
    write_generation(&s, &d, "stream", "v2");
    agent.reload(&s);
    agent.sched.stop().await;
    contained.0.containment.shut_down();
    off_runtime(move || wait_gone(holder)).await;
    assert_gone(old);
    assert_eq!(
        starts(&d, "v2"),
        Vec::<i32>::new(),
        "v2 started during shutdown"
    );
    assert!(!probes.exists(), "{} left behind", probes.display());
}

/// A writable cgroup v2 tree and PID namespaces, or a printed reason to skip.
fn cgroups_and_pid_namespaces() -> bool {
    let Some(host) = v2_host() else {
        return false;
    };
    if nix::unistd::access(&host.own, nix::unistd::AccessFlags::W_OK).is_err() {
        eprintln!(
            "skipped: {} is not writable; CI runs as root",
            host.own.display()
        );
        return false;
    }
    pid_namespaces()
}

/// `unshare --pid --fork --mount-proc` (util-linux): whether this host lets a test start a
/// process in a PID namespace of its own, with the reason to skip if not.
fn pid_namespaces() -> bool {
    let ok = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: `unshare --pid --fork --mount-proc` fails here (not root, or no util-linux); CI runs as root");
    }
    ok
}

/// A daemon on `s` whose probe `held` runs for the test's whole length (its pid written to
/// held.pid, as seen from the daemon's PID namespace).
fn holding_site() -> (Setup, PathBuf) {
    setup(
        "held",
        ", timeout: 60s",
        "#!/bin/sh\necho $$ > \"$D/held.tmp\"\nmv \"$D/held.tmp\" \"$D/held.pid\"\nexec sleep 1000\n",
    )
}

/// Whether the agent whose cgroup subtree is `subtree` is still whole: the subtree is there,
/// its agent in `agent/` and its probe running in `probes/held`.
fn whole(subtree: &Path) -> bool {
    subtree.join("agent").is_dir()
        && populated(&subtree.join("agent"))
        && populated(&subtree.join("probes/held"))
}

/// The process `unshare --fork` started (the agent, pid 1 in its namespace), by its host pid.
fn forked_child(unshare: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("unshare's children");
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("unshare has forked the agent")
}

/// An agent in a PID namespace of its own (a container's, `unshare -p`) shares the cgroup
/// tree with the host's agents but sees none of their pids: it must not take their subtrees
/// for dead ones. Here a host daemon runs a probe; an agent in another PID namespace runs
/// `--once` beside it, in the same parent cgroup; the daemon and its probe live on.
#[tokio::test]
async fn an_agent_in_another_pid_namespace_leaves_a_host_agent_alone() {
    if !cgroups_and_pid_namespaces() {
        return;
    }
    let (s, pids) = holding_site();
    let daemon = common::KillOnDrop(
        agent_command(&s)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    common::wait_for_file(&pids.join("held.pid"));
    let subtree = subtree_of(daemon.0.id()).expect("the daemon's cgroup");
    assert!(whole(&subtree), "{} before", subtree.display());

    let (other, _) = setup("quick", "", "#!/bin/sh\necho 1\n");
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(common::agent_bin())
        .args(["--config", other.agent_yaml().to_str().unwrap(), "--once"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("INVOCATION_ID")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("no cgroup containment"), "{stderr}");
    assert!(
        whole(&subtree),
        "the namespaced agent removed {}: {stderr}",
        subtree.display()
    );
    stop(daemon);
    assert!(!subtree.exists(), "{} left behind", subtree.display());
}

/// The other way: a daemon in a PID namespace of its own (pid 1 there, so by the host's pid 1
/// it would look dead), and a host agent running `--once` beside it.
#[tokio::test]
async fn a_host_agent_leaves_an_agent_in_another_pid_namespace_alone() {
    if !cgroups_and_pid_namespaces() {
        return;
    }
    let (s, pids) = holding_site();
    let unshare = common::KillOnDrop(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(common::agent_bin())
            .args(["--config", s.agent_yaml().to_str().unwrap()])
            .env_remove("NOTIFY_SOCKET")
            .env_remove("INVOCATION_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    common::wait_for_file(&pids.join("held.pid"));
    let daemon = forked_child(unshare.0.id());
    let subtree = subtree_of(daemon).expect("the namespaced daemon's cgroup");
    assert!(
        subtree
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("xce-agent.1."),
        "{}",
        subtree.display()
    );
    assert!(whole(&subtree), "{} before", subtree.display());

    let (other, _) = setup("quick", "", "#!/bin/sh\necho 1\n");
    let out = agent_command(&other).arg("--once").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        whole(&subtree),
        "the host agent removed {}: {stderr}",
        subtree.display()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    stop_waited(unshare);
    assert!(!subtree.exists(), "{} left behind", subtree.display());
}

/// SIGTERM to a daemon we started; it exits 0.
fn stop(daemon: common::KillOnDrop) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    stop_waited(daemon);
}

fn stop_waited(mut child: common::KillOnDrop) {
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
}
