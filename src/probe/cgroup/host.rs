//! What the host offers: the cgroup v2 mount and the agent's own cgroup in it, found
//! without changing anything; and what `check` says about it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::subtree::read_words;
use crate::config::Limits;

/// What the host offers, found without changing anything (for `check`).
#[derive(Debug, Clone)]
pub struct Host {
    pub mount: PathBuf,
    pub own: PathBuf,
    pub controllers: Vec<String>,
}

/// Why the host offers no cgroup v2 tree to the agent.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// `/proc/self/mountinfo` or `/proc/self/cgroup`.
    #[error("cannot read {path}: {source}")]
    Unreadable {
        path: &'static str,
        source: io::Error,
    },
    #[error("no cgroup v2 hierarchy is mounted")]
    NoHierarchy,
    #[error("the agent has no cgroup v2 path in /proc/self/cgroup")]
    NoPath,
}

/// The v2 mount point and the agent's cgroup in it.
pub fn detect() -> Result<Host, DetectError> {
    let read = |path: &'static str| {
        fs::read_to_string(path).map_err(|source| DetectError::Unreadable { path, source })
    };
    let mountinfo = read("/proc/self/mountinfo")?;
    let (mount, root) = v2_mount(&mountinfo).ok_or(DetectError::NoHierarchy)?;
    let cgroup = read("/proc/self/cgroup")?;
    let path = v2_path(&cgroup).ok_or(DetectError::NoPath)?;
    let own = cgroup_dir(&mount, &root, path);
    let controllers = read_words(&own.join("cgroup.controllers"));
    Ok(Host {
        mount,
        own,
        controllers,
    })
}

/// The cgroup v2 directory of process `pid`, found as [`detect`] finds the agent's own
/// (a bench reads a daemon's subtree through it); `None` where there is none.
pub fn dir_of(pid: u32) -> Option<PathBuf> {
    let (mount, root) = v2_mount(&fs::read_to_string("/proc/self/mountinfo").ok()?)?;
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(cgroup_dir(&mount, &root, v2_path(&cgroup)?))
}

/// The v2 line's path of a `/proc/PID/cgroup` text (`0::/path`).
fn v2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The directory of the cgroup at `path` (from `/proc/self/cgroup`) under the v2 mount at
/// `mount`, whose root within the hierarchy is `root` (from mountinfo: `/`, or a subtree's
/// path where only that subtree is mounted).
pub(super) fn cgroup_dir(mount: &Path, root: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    let below_root = path.strip_prefix(root).unwrap_or(path);
    mount.join(below_root.strip_prefix("/").unwrap_or(below_root))
}

/// The first cgroup2 mount of `mountinfo`: (mount point, root within the hierarchy).
pub(super) fn v2_mount(mountinfo: &str) -> Option<(PathBuf, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut f = before.split_whitespace();
        let root = f.nth(3)?;
        let point = f.next()?;
        Some((
            PathBuf::from(unescape(point)),
            PathBuf::from(unescape(root)),
        ))
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The sentence the log and `check` give when there is no containment.
pub fn fallback_text(why: &dyn std::fmt::Display) -> String {
    format!("no cgroup containment ({why}): probes are contained by process group only, so a descendant that calls setsid can outlive its run")
}

/// One line for `check`: what containment the agent would get here, without setting it up.
pub fn check_text() -> String {
    let host = match detect() {
        Ok(h) => h,
        Err(why) => return fallback_text(&why),
    };
    let controllers = if host.controllers.is_empty() {
        "none".to_owned()
    } else {
        host.controllers.join(" ")
    };
    match nix::unistd::access(&host.own, nix::unistd::AccessFlags::W_OK) {
        Ok(()) => format!(
            "containment: each probe in its own cgroup under {} (cgroup v2 at {}; controllers available: {controllers})",
            host.own.display(),
            host.mount.display()
        ),
        Err(e) => fallback_text(&format_args!(
            "{} is not writable: {e}; controllers available: {controllers}",
            host.own.display()
        )),
    }
}

/// What to do where a controller the limits need is missing from the agent's cgroup tree.
pub(super) const ENABLE_CONTROLLER: &str = "a hybrid host keeps it on cgroup v1 (boot with systemd.unified_cgroup_hierarchy=1); under systemd the unit's Delegate=yes (as shipped) hands it to the agent";

/// `check`'s note on the `memory` and `pids` limits this host would not enforce, from each
/// probe's `(name, limits)`: a limit needs its controller in the agent's cgroup v2 tree.
pub fn unenforced_limits_text<'a>(
    probes: impl Iterator<Item = (&'a str, &'a Limits)> + Clone,
) -> Vec<String> {
    let host = detect()
        .ok()
        .filter(|h| nix::unistd::access(&h.own, nix::unistd::AccessFlags::W_OK).is_ok());
    let mut out = Vec::new();
    for (controller, file) in Limits::CGROUP_CONTROLLERS {
        let limited: Vec<&str> = probes
            .clone()
            .filter(|(_, l)| l.uses_controller(controller))
            .map(|(name, _)| name)
            .collect();
        if limited.is_empty() {
            continue;
        }
        let why = match &host {
            Some(h) if h.controllers.iter().any(|c| c == controller) => continue,
            Some(h) => format!(
                "the {controller} controller is not available in the cgroup v2 tree at {}: {ENABLE_CONTROLLER}",
                h.own.display()
            ),
            None => "there is no cgroup containment here (see the containment line)".to_owned(),
        };
        out.push(format!(
            "limits NOT ENFORCED: {file} of {} is not set on this host: {why}",
            list_some(&limited)
        ));
    }
    out
}

/// `a, b, c and 7 more`.
fn list_some(names: &[&str]) -> String {
    const SHOWN: usize = 5;
    let shown = names[..names.len().min(SHOWN)].join(", ");
    match names.len().saturating_sub(SHOWN) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}
