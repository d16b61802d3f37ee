//! File probes: real files in temp dirs, and every way reading one can go wrong.

use crate::support as common;

use std::time::{Duration, SystemTime};

use crate::support::task_from_yaml;
use xce_agent::plan::ProbeTask;
use xce_agent::probe::{run_once, Outcome, ProbeContext, ProbeRun};
use xce_agent::value::{Reading, Value};

/// The task and context of a file probe on `path`; runs of one context share its reads.
fn file_task(path: &std::path::Path, extra: &str, valtype: &str) -> (ProbeTask, ProbeContext) {
    let y = format!(
        "resources:\n  - name: f\n    valtype: {valtype}\n    interval: 30\n    probe: {{kind: file, path: '{}', timeout: 1s{extra}}}\n",
        path.display()
    );
    task_from_yaml(&y, "f", std::path::Path::new("/"))
}

async fn probe(path: &std::path::Path, extra: &str, valtype: &str) -> ProbeRun {
    let (task, ctx) = file_task(path, extra, valtype);
    run_once(&task, &ctx).await
}

fn failure(r: &ProbeRun) -> String {
    match &r.readings[0].1 {
        Reading::Failed(e) => e.to_string(),
        other => panic!("expected failure, got {other:?}"),
    }
}

#[tokio::test]
async fn reads_first_line_or_regex_capture() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v");
    std::fs::write(&p, "\n 17 \nrest\n").unwrap();
    assert_eq!(
        probe(&p, "", "numeric").await.readings[0].1,
        Reading::Ok(Value::Numeric(17.0))
    );
    std::fs::write(&p, "fw_ver: 20.31.1014 (MT_0000000222)\n").unwrap();
    let r = probe(&p, ", regex: 'fw_ver: (\\S+)'", "string").await;
    assert_eq!(
        r.readings[0].1,
        Reading::Ok(Value::String("20.31.1014".into()))
    );
    let r = probe(&p, ", regex: 'nomatch (\\d+)'", "string").await;
    assert!(
        failure(&r).starts_with("regex \"nomatch (\\\\d+)\" does not match"),
        "{}",
        failure(&r)
    );
}

#[tokio::test]
async fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("absent");
    let r = probe(&p, "", "numeric").await;
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        failure(&r),
        format!(
            "cannot open {}: No such file or directory (os error 2)",
            p.display()
        )
    );
}

#[tokio::test]
async fn unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    // A symlink loop cannot be opened even by root (CI runs as root, where mode 000 reads).
    let p = dir.path().join("loop");
    std::os::unix::fs::symlink(&p, &p).unwrap();
    let r = probe(&p, "", "numeric").await;
    assert!(failure(&r).starts_with(&format!(
        "cannot open {}: Too many levels of symbolic links",
        p.display()
    )));
    let d = probe(dir.path(), "", "numeric").await;
    assert_eq!(
        failure(&d),
        format!("{} is a directory", dir.path().display())
    );
}

#[tokio::test]
async fn too_old_is_stale_not_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("written_by_cron");
    std::fs::write(&p, "5\n").unwrap();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let r = probe(&p, ", max_age: 10m", "numeric").await;
    match &r.readings[0].1 {
        Reading::Stale(e) => assert!(
            e.contains("not modified for 1h") && e.ends_with("(max_age 10m)"),
            "{e}"
        ),
        other => panic!("expected stale, got {other:?}"),
    }
    let fresh = probe(&p, ", max_age: 2h", "numeric").await;
    assert_eq!(fresh.readings[0].1, Reading::Ok(Value::Numeric(5.0)));
}

#[tokio::test]
async fn oversized_and_binary_files_fail() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big");
    std::fs::write(&p, vec![b'1'; 5000]).unwrap();
    let r = probe(&p, ", max_bytes: 4KiB", "numeric").await;
    assert_eq!(
        failure(&r),
        format!("{} is larger than max_bytes (4096)", p.display())
    );
    std::fs::write(&p, b"1\x002").unwrap();
    assert_eq!(
        failure(&probe(&p, "", "numeric").await),
        format!("{} contains NUL bytes", p.display())
    );
}

/// A FIFO with no writer blocks open() forever, like a hung NFS mount: the probe must give up
/// at its timeout, and a second run must not pile another blocked thread on the same path.
#[tokio::test]
async fn blocking_path_times_out_without_piling_up() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fifo");
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let (task, ctx) = file_task(&p, "", "numeric");
    let r = run_once(&task, &ctx).await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert!(failure(&r).starts_with(&format!("read of {} timed out", p.display())));
    let again = run_once(&task, &ctx).await;
    assert!(
        failure(&again).contains("is still blocked"),
        "{}",
        failure(&again)
    );
    // Unblock the stuck reader so the test leaves no thread behind.
    drop(std::fs::OpenOptions::new().write(true).open(&p).unwrap());
}

/// Two resources reading the same file at the same moment both get the value: only a read
/// that outlived its timeout marks a path as blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_of_one_path_both_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shared");
    std::fs::write(&p, "9\n").unwrap();
    let runs = futures::future::join_all((0..16).map(|_| probe(&p, "", "numeric"))).await;
    for r in runs {
        assert_eq!(r.readings[0].1, Reading::Ok(Value::Numeric(9.0)));
    }
}

/// A root agent's file probe reads with its run_as user's rights: an /etc/shadow-like file
/// (0600, root's) fails for `nobody` with the fix; `run_as: root` on the probe reads it; the
/// switch is the reader thread's alone (the agent keeps its groups).
#[tokio::test]
async fn a_root_agent_reads_files_with_the_probe_users_rights() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP a_root_agent_reads_files_with_the_probe_users_rights: needs root (file probes read as run_as only when the agent is root)");
        return;
    }
    let groups_before = nix::unistd::getgroups().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shadow = dir.path().join("shadow");
    std::fs::write(&shadow, "root:*:19000:0:99999:7:::\n").unwrap();
    std::fs::set_permissions(&shadow, std::fs::Permissions::from_mode(0o600)).unwrap();
    let public = dir.path().join("public");
    std::fs::write(&public, "12\n").unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();

    let as_nobody = |path: &std::path::Path, extra: &str| {
        let (task, mut ctx) = file_task(path, extra, "string");
        ctx.run_as = "nobody".into();
        async move { run_once(&task, &ctx).await }
    };
    let denied = as_nobody(&shadow, ", regex: '^(\\w+):'").await;
    assert_eq!(
        failure(&denied),
        format!(
            "cannot open {}: permission denied for nobody (file probes read as run_as); make it readable by nobody (e.g. chgrp a group of nobody and chmod g+r), or set `run_as: root` on this probe",
            shadow.display()
        )
    );
    assert_eq!(
        as_nobody(&public, "").await.readings[0].1,
        Reading::Ok(Value::String("12".into()))
    );
    let as_root = as_nobody(&shadow, ", regex: '^(\\w+):', run_as: root").await;
    assert_eq!(
        as_root.readings[0].1,
        Reading::Ok(Value::String("root".into()))
    );
    assert_eq!(nix::unistd::getgroups().unwrap(), groups_before);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let fsuid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        fsuid.split_whitespace().skip(1).all(|u| u == "0"),
        "{fsuid}"
    );
}

/// `check` says who each file probe reads as, and the bound on stuck reads.
#[test]
fn check_says_who_each_file_probe_reads_as() {
    let setup = common::Setup::with_agent(
        "resources:\n  - name: up\n    interval: 30\n    probe: {kind: file, path: /proc/uptime}\n  - name: secret\n    interval: 30\n    probe: {kind: file, path: /etc/shadow, run_as: root}\n",
        "run_as: nobody\nmax_stuck_reads: 7\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xce-agent"))
        .arg("--config")
        .arg(setup.agent_yaml())
        .arg("check")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    if nix::unistd::geteuid().is_root() {
        assert!(
            stdout.contains("up: reads /proc/uptime as nobody (run_as)"),
            "{stdout}"
        );
        assert!(
            stdout.contains("secret: reads /etc/shadow as root (`run_as: root`)"),
            "{stdout}"
        );
    } else {
        assert!(stdout.contains("up: reads /proc/uptime as "), "{stdout}");
        assert!(stdout.contains("(the agent is not root)"), "{stdout}");
    }
    assert!(
        stdout.contains("file reads: at most 7 may be stuck in the kernel (max_stuck_reads)"),
        "{stdout}"
    );
}

/// A read that fails keeps the kernel's error as its source, under the text shown.
#[tokio::test]
async fn a_failed_read_keeps_the_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("missing");
    let r = probe(&p, "", "numeric").await;
    let Reading::Failed(f) = &r.readings[0].1 else {
        panic!("{:?}", r.readings)
    };
    assert!(
        f.to_string()
            .starts_with(&format!("cannot open {}: ", p.display())),
        "{f}"
    );
    let io = f
        .source()
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .expect("the io error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}
