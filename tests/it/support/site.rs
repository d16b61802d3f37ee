//! A site in a temp dir: agent.yaml (host node001, plugin_dir = the dir) beside
//! resources.yaml, with the probe scripts it runs. `Site` is what the binary-level tests start
//! the agent on; `Setup` is the same directory for the tests that run probes in this process.

use std::ops::Deref;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::process::AgentProc;
use super::wait::wait_until;

/// Write an executable script (0755, not group/other writable).
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod script");
    p
}

/// One dynamic numeric resource on every host whose probe is `probe` (a YAML flow mapping).
pub fn resource(name: &str, probe: &str) -> String {
    format!(
        "  - name: {name}\n    valtype: numeric\n    interval: 60s\n    resourcemap: [{{location: [default]}}]\n    probe: {probe}\n"
    )
}

pub struct Site {
    pub dir: tempfile::TempDir,
}

impl Site {
    /// Probes as root (so a root test run can write the probes' files), reporting to
    /// `controllers` in plaintext, said in words; the TLS tests write a tls: section instead.
    pub fn new(controllers: &[String], resources: &str) -> Self {
        let list: Vec<String> = controllers.iter().map(|c| format!("\"{c}\"")).collect();
        let plaintext = if controllers.is_empty() {
            ""
        } else {
            "insecure_plaintext: true\n"
        };
        Self::write(
            resources,
            &format!(
                "run_as: root\ncontrollers: [{}]\n{plaintext}",
                list.join(", ")
            ),
        )
    }

    /// Probes as root, reporting only to the local worker's door at `sock` (no tls: section
    /// needed: the socket's owner is the peer's identity).
    pub fn reporting_to_unix(sock: &Path, resources: &str) -> Self {
        Self::write(
            resources,
            &format!("run_as: root\ncontrollers: [\"unix:{}\"]\n", sock.display()),
        )
    }

    /// agent.yaml ends with `agent_extra`.
    fn write(resources: &str, agent_extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // World-readable, not writable: probes may run as another user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod tempdir");
        let agent = format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\n{agent_extra}",
            dir.path().display()
        );
        std::fs::write(dir.path().join("agent.yaml"), agent).expect("write agent.yaml");
        std::fs::write(dir.path().join("resources.yaml"), resources).expect("write resources");
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn agent_yaml(&self) -> PathBuf {
        self.file("agent.yaml")
    }

    /// An executable script in the plugin dir.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        script(self.path(), name, body)
    }

    /// Replace a file's content atomically, so a probe never reads half of it.
    pub fn write_atomic(&self, name: &str, content: &str) {
        let tmp = self.file(&format!(".{name}.tmp"));
        std::fs::write(&tmp, content).expect("write tmp");
        std::fs::rename(&tmp, self.file(name)).expect("rename");
    }

    /// `xce-agent --config agent.yaml` with its log in `agent.log`.
    pub fn spawn_agent(&self) -> AgentProc {
        AgentProc::spawn(&self.agent_yaml(), &self.file("agent.log"))
    }

    /// A counter probe: each run adds one to `<name>.count`, appends the new count to
    /// `<name>.runs` and prints it. Proves the agent keeps probing and which value is latest.
    pub fn counter_script(&self, name: &str) -> PathBuf {
        let d = self.path().display();
        self.script(
            &format!("{name}.sh"),
            &format!(
                "#!/bin/sh\nn=$(cat {d}/{name}.count 2>/dev/null || echo 0)\nn=$((n + 1))\n\
                 echo $n > {d}/{name}.count\necho $n >> {d}/{name}.runs\necho $n\n"
            ),
        )
    }

    /// Runs recorded by `counter_script(name)` so far.
    pub fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.file(&format!("{name}.runs")))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Wait until the counter probe has run `n` times in all.
    pub async fn wait_runs(&self, name: &str, n: usize) {
        wait_until(&format!("{name} to run {n} times"), || self.runs(name) >= n).await;
    }
}

/// A site whose probes run as the agent's default `run_as` (`nobody` when the tests run as
/// root), for the tests that load its config and run probes in this process.
pub struct Setup(Site);

impl Setup {
    pub fn new(resources: &str) -> Self {
        Self::with_agent(resources, "")
    }

    /// agent.yaml ends with `agent_extra`. Controllers listed without a tls: section talk
    /// plaintext, which agent.yaml must then say in words.
    pub fn with_agent(resources: &str, agent_extra: &str) -> Self {
        let plaintext = agent_extra.contains("controllers:")
            && !agent_extra.contains("tls:")
            && !agent_extra.contains("insecure_plaintext");
        let plaintext = if plaintext {
            "insecure_plaintext: true\n"
        } else {
            ""
        };
        Self(Site::write(resources, &format!("{agent_extra}{plaintext}")))
    }
}

impl Deref for Setup {
    type Target = Site;

    fn deref(&self) -> &Site {
        &self.0
    }
}

/// `pids/` in the site's dir, writable by all: probes write their pids there, and they run
/// as `nobody` when the tests run as root.
pub fn pids_dir(s: &Site) -> PathBuf {
    let pids = s.path().join("pids");
    std::fs::create_dir(&pids).expect("mkdir pids");
    std::fs::set_permissions(&pids, std::fs::Permissions::from_mode(0o777)).expect("chmod pids");
    pids
}

/// `xce-agent status ARGS` against the daemon of `site`: exit code, stdout, stderr.
pub fn status(site: &Site, args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(super::process::agent_bin())
        .arg("status")
        .arg("--config")
        .arg(site.agent_yaml())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run xce-agent status");
    (
        o.status.code().expect("exit code"),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `status --format json` until `pred` holds; that answer and the exit code.
pub async fn wait_status(
    site: &Site,
    what: &str,
    mut pred: impl FnMut(&xce_agent::status::StatusReport) -> bool,
) -> (xce_agent::status::StatusReport, i32) {
    let mut last = None;
    wait_until(what, || {
        let (code, out, _) = status(site, &["--format", "json"]);
        let Ok(report) = serde_json::from_str(&out) else {
            return false;
        };
        let done = pred(&report);
        last = Some((report, code));
        done
    })
    .await;
    last.expect("an answer")
}
