//! File probes: real files in temp dirs, and every way reading one can go wrong.

mod common;

use std::time::{Duration, SystemTime};

use common::task_from_yaml;
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
        Reading::Failed(e) => e.clone(),
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
