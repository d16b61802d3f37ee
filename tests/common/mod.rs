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
        let agent = format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\n{agent_extra}",
            dir.path().display()
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
    };
    (task, ctx)
}

pub struct NoBuiltins;

impl xce_agent::probe::BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<xce_agent::value::Reading> {
        None
    }
}
