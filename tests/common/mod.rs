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
