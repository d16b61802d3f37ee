//! The clone(2) path, taken on kernels without clone3 (or where a seccomp filter refuses it):
//! the same child as clone3 gives — descriptors 0-2 only, errors with their errno, and, with
//! containment, the child joining its probe's cgroup by writing to `cgroup.procs`.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use xce_agent::probe::cgroup::Containment;
use xce_agent::probe::child::{self, ChildSpec, CloneCall, Exit};

/// A child of `program` started with clone(2).
fn legacy(program: impl AsRef<Path>, timeout: Duration) -> ChildSpec {
    let mut spec = ChildSpec::new(program, timeout);
    spec.clone_call = CloneCall::Legacy;
    spec
}

#[tokio::test]
async fn clone2_children_see_only_0_to_2_and_report_exec_errors() {
    let mut spec = legacy("/bin/sh", Duration::from_secs(30));
    spec.args = vec![OsString::from("-c"), OsString::from("ls /proc/$$/fd")].into();
    let o = child::run(&spec).await.unwrap();
    assert_eq!(o.exit, Exit::Code(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0\n1\n2\n");
    let missing = legacy("/nonexistent/xce", Duration::from_secs(5));
    let e = child::run(&missing).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "cannot start /nonexistent/xce: No such file or directory (os error 2)"
    );
}

#[tokio::test]
async fn clone2_children_join_their_cgroup() {
    // A tree of this test's own; this process stays where it is.
    let containment = Containment::under_own_cgroup(false);
    let Some(tree) = containment.tree() else {
        eprintln!(
            "skipped: no writable cgroup v2 hierarchy here; CI runs as root on a host with one"
        );
        return;
    };
    let mut spec = legacy("/bin/cat", Duration::from_secs(30));
    spec.args = vec![OsString::from("/proc/self/cgroup")].into();
    spec.cgroup = Some(
        tree.probe("legacy", &xce_agent::config::Limits::default())
            .unwrap(),
    );
    let o = child::run(&spec).await.unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    // A leaf of the probe's cgroup: `.../probes/legacy/run-<n>`.
    let leaf = out.trim_end().rsplit_once('/');
    assert!(
        leaf.is_some_and(
            |(probe, leaf)| probe.ends_with("/probes/legacy") && leaf.starts_with("run-")
        ),
        "{out}"
    );
}
