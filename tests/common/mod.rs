//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Write an executable script.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A temp dir with agent.yaml (plugin_dir = the dir itself) and the given resources.yaml.
pub struct Setup {
    pub dir: tempfile::TempDir,
}

impl Setup {
    pub fn new(resources: &str) -> Self {
        Self::with_agent(resources, "")
    }

    pub fn with_agent(resources: &str, agent_extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // World-readable, not writable: probes may run as another user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // A test that lists controllers without a tls: section talks plaintext, which
        // agent.yaml must then say in words.
        let plaintext = agent_extra.contains("controllers:")
            && !agent_extra.contains("tls:")
            && !agent_extra.contains("insecure_plaintext");
        let agent = format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\n{agent_extra}{}",
            dir.path().display(),
            if plaintext {
                "insecure_plaintext: true\n"
            } else {
                ""
            }
        );
        std::fs::write(dir.path().join("agent.yaml"), agent).unwrap();
        std::fs::write(dir.path().join("resources.yaml"), resources).unwrap();
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn agent_yaml(&self) -> PathBuf {
        self.dir.path().join("agent.yaml")
    }

    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        script(self.dir.path(), name, body)
    }
}

/// Whether a process is still running (a zombie waiting for its reaper counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
    }
}

pub fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Plan `resources_yaml` for node001 and return the task named `name`, with a probe context
/// whose plugin_dir is `plugin_dir`.
pub fn task_from_yaml(
    resources_yaml: &str,
    name: &str,
    plugin_dir: &Path,
) -> (xce_agent::plan::ProbeTask, xce_agent::probe::ProbeContext) {
    let r =
        xce_agent::config::resources::parse(Path::new("resources.yaml"), resources_yaml).unwrap();
    let plan = xce_agent::plan::make_plan(&r, "node001", &Default::default());
    let task = plan
        .tasks
        .into_iter()
        .find(|t| t.name == name)
        .expect("task planned");
    let ctx = xce_agent::probe::ProbeContext {
        host: "node001".into(),
        plugin_dir: plugin_dir.to_owned(),
        // Tests may run as root (CI): run probes as root there so temp files stay readable.
        run_as: "root".into(),
        builtin: std::sync::Arc::new(NoBuiltins),
        files: xce_agent::probe::file_reader::FileReads::new(32),
    };
    (task, ctx)
}

/// A builtin source with no indices, for tests that run probes through the library.
pub struct NoBuiltins;

impl xce_agent::probe::BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<xce_agent::value::Reading> {
        None
    }
}

/// Load the setup's config and return the planned task of `name` with a probe context.
pub fn load_task(
    setup: &Setup,
    name: &str,
) -> (xce_agent::plan::ProbeTask, xce_agent::probe::ProbeContext) {
    let config = xce_agent::config::load(&setup.agent_yaml(), None)
        .unwrap_or_else(|e| panic!("config invalid: {e}"));
    let plan = xce_agent::plan::make_plan(&config.resources, "node001", &Default::default());
    let task = plan
        .tasks
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} not planned: {:?}", plan.skipped))
        .clone();
    let ctx = xce_agent::probe::ProbeContext {
        host: "node001".into(),
        plugin_dir: config.agent.plugin_dir.clone(),
        run_as: config.agent.run_as.clone(),
        builtin: std::sync::Arc::new(NoBuiltins),
        files: xce_agent::probe::file_reader::FileReads::new(32),
    };
    (task, ctx)
}

/// One dynamic numeric resource on every host whose probe is `probe` (a YAML flow mapping).
pub fn resource(name: &str, probe: &str) -> String {
    format!(
        "  - name: {name}\n    valtype: numeric\n    interval: 60s\n    resourcemap: [{{location: [default]}}]\n    probe: {probe}\n"
    )
}

/// Declare every feed of `task` in `store`.
pub fn declare(store: &xce_agent::store::Store, task: &xce_agent::plan::ProbeTask) {
    store.declare(task.feeds.iter().map(|f| xce_agent::store::Declared {
        name: f.name.clone(),
        instance: task.instance.clone(),
        valtype: f.valtype,
        stale_after: task.stale_after,
    }));
}

/// Wait (on the store's watch, no polling) until `pred` holds for resource `name`.
pub async fn wait_for(
    store: &xce_agent::store::Store,
    name: &str,
    pred: impl Fn(&xce_agent::value::Resval) -> bool,
) -> xce_agent::value::Resval {
    let mut rx = store.subscribe();
    let wait = async {
        loop {
            if let Some(r) = store.get(name, "") {
                if pred(&r) {
                    return r;
                }
            }
            rx.changed().await.expect("store dropped");
        }
    };
    // A hang guard, not a timing threshold: a broken agent must fail the test, not hang CI.
    tokio::time::timeout(std::time::Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name} never reached the expected state: {:?}",
                store.get(name, "")
            )
        })
}

/// Block until process `pid` has exited (pidfd readiness; no polling), with a hang guard.
pub fn wait_gone(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return; // already gone (ESRCH)
    }
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; fd is closed right after.
    let n = unsafe { libc::poll(&mut pfd, 1, 60_000) };
    unsafe { libc::close(fd) };
    assert!(n == 1, "process {pid} still running after 60 s");
}

/// Whether `pid` is a zombie child of this test process (nobody reaped it).
pub fn our_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let mut f = stat.rsplit(')').next().unwrap_or("").split_whitespace();
    let state = f.next();
    let ppid: i32 = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    state == Some("Z") && ppid == std::process::id() as i32
}

/// `pids/` in the setup's dir, writable by all: probes write their pids there, and they run
/// as `nobody` when the tests run as root.
pub fn pids_dir(s: &Setup) -> PathBuf {
    let pids = s.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    std::fs::set_permissions(&pids, std::fs::Permissions::from_mode(0o777)).unwrap();
    pids
}

/// Where a test needs a tool that not every build machine has, the test is marked
/// `#[ignore = "needs TOOL ..."]`: plain `cargo test` lists it as ignored with that reason
/// instead of passing it silently, and CI (which installs the tools) runs the ignored tests
/// with `cargo test -- --ignored`. Run that way, a missing tool fails the test.
pub fn require_tool(program: &str, args: &[&str], install: &str) {
    let ok = std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "this test needs `{program}` (install: {install})");
}

/// Block until `path` exists (a file a probe writes: there is no event to wait on), with a
/// hang guard, not a timing threshold.
pub fn wait_for_file(path: &Path) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < give_up,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
