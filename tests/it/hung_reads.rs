//! A hung filesystem, played by FIFOs without a writer (their `open` blocks in the kernel as a
//! read on a dead NFS server does): stuck reads are bounded and named, the healthy probes
//! keep producing readings, and every command ends — the daemon on SIGTERM with its last
//! values sent, `--once` and `probe` with what they could read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{agent_bin, wait_until, Site, View};
use crate::support::{guard, Controller};
use xce_agent::probe::file_reader::{FileReads, ReadOutcome, ReadRequest};
use xce_agent::probe::read_error::ReadError;
use xce_agent::receiver::session::{EventKind, ListenOpts};
use xce_agent::value::{Status, Value};

fn fifo(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
    p
}

/// Give a blocked reader its writer, so the read returns (at EOF).
fn unblock(p: &Path) {
    drop(
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .expect("open the FIFO for writing"),
    );
}

fn request(path: &Path) -> ReadRequest {
    ReadRequest {
        path: path.to_owned(),
        max_bytes: 4096,
        max_age: None,
        // Only how long a read is waited for before it counts as stuck; nothing is timed.
        timeout: Duration::from_millis(200),
        creds: None,
        textfiles: false,
    }
}

fn text(r: Result<ReadOutcome, ReadError>) -> String {
    match r {
        Ok(ReadOutcome::Text(t)) => t,
        other => panic!("expected text, got {other:?}"),
    }
}

fn refused(r: Result<ReadOutcome, ReadError>) -> String {
    match r {
        Err(ReadError::Refused(e)) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A fixture mount table in which each of `dirs` is a mount of its own.
fn mountinfo(dir: &Path, dirs: &[&Path]) -> PathBuf {
    let mut t =
        String::from("1 0 0:1 / / rw - ext4 /dev/root rw\n2 1 0:2 / /proc rw - proc proc rw\n");
    for (i, d) in dirs.iter().enumerate() {
        t.push_str(&format!(
            "{n} 1 0:{n} / {} rw - nfs srv:/e{n} rw\n",
            d.display(),
            n = i + 10
        ));
    }
    let p = dir.join("mountinfo");
    std::fs::write(&p, t).expect("write mountinfo");
    p
}

async fn until_unstuck(files: &FileReads) {
    wait_until("the stuck reads to return", || files.stuck_count() == 0).await;
}

#[tokio::test]
async fn a_stuck_read_fails_its_mount_at_once_and_other_mounts_still_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let (hung, fine) = (tmp.path().join("hung"), tmp.path().join("fine"));
    std::fs::create_dir_all(&hung).unwrap();
    std::fs::create_dir_all(&fine).unwrap();
    let files = FileReads::with_mountinfo(32, &mountinfo(tmp.path(), &[&hung, &fine]));
    let blocked = fifo(&hung, "fifo");
    let neighbour = hung.join("neighbour");
    std::fs::write(&neighbour, "1\n").unwrap();
    std::fs::write(fine.join("v"), "7\n").unwrap();

    assert!(matches!(
        files.read(request(&blocked)).await,
        Err(ReadError::TimedOut { .. })
    ));
    assert_eq!(files.stuck_count(), 1);
    let again = refused(files.read(request(&blocked)).await);
    assert!(again.contains("is still blocked in the kernel"), "{again}");
    let same_mount = refused(files.read(request(&neighbour)).await);
    assert!(
        same_mount.contains(&format!("is on {}, where a read of", hung.display())),
        "{same_mount}"
    );
    assert_eq!(text(files.read(request(&fine.join("v"))).await), "7\n");
    assert!(text(files.read(request(Path::new("/proc/uptime"))).await).contains('.'));

    unblock(&blocked);
    until_unstuck(&files).await;
    assert_eq!(text(files.read(request(&neighbour)).await), "1\n");
}

#[tokio::test]
async fn past_the_bound_only_paths_that_answered_are_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = (0..5).map(|i| tmp.path().join(format!("m{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let known = tmp.path().join("known");
    std::fs::create_dir_all(&known).unwrap();
    let mut mounts: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    mounts.push(&known);
    let files = FileReads::with_mountinfo(3, &mountinfo(tmp.path(), &mounts));
    std::fs::write(known.join("answers"), "5\n").unwrap();
    std::fs::write(known.join("new"), "6\n").unwrap();
    assert_eq!(
        text(files.read(request(&known.join("answers"))).await),
        "5\n"
    );

    let fifos: Vec<PathBuf> = dirs.iter().map(|d| fifo(d, "fifo")).collect();
    for f in &fifos[..3] {
        assert!(matches!(
            files.read(request(f)).await,
            Err(ReadError::TimedOut { .. })
        ));
    }
    assert_eq!(files.stuck_count(), 3);
    let past = refused(files.read(request(&fifos[3])).await);
    assert!(
        past.starts_with("3 reads are stuck in the kernel (max_stuck_reads); not starting another"),
        "{past}"
    );
    let unknown = refused(files.read(request(&known.join("new"))).await);
    assert!(unknown.contains("has not answered yet"), "{unknown}");
    assert_eq!(
        text(files.read(request(&known.join("answers"))).await),
        "5\n"
    );
    assert_eq!(files.stuck_count(), 3, "a refused read starts no thread");

    for f in &fifos[..3] {
        unblock(f);
    }
    until_unstuck(&files).await;
    assert!(matches!(
        files.read(request(&fifos[4])).await,
        Err(ReadError::TimedOut { .. })
    ));
    unblock(&fifos[4]);
    until_unstuck(&files).await;
}

/// A probe stopped (reload, shutdown) while its read is blocked: the thread still counts.
#[tokio::test]
async fn an_abandoned_read_counts_as_stuck_until_it_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let files = FileReads::with_mountinfo(32, &mountinfo(tmp.path(), &[]));
    let blocked = fifo(tmp.path(), "fifo");
    let mut req = request(&blocked);
    req.timeout = Duration::from_secs(3600);
    // One poll starts the reader thread; dropping the future is what a stopped probe does.
    let mut read = Box::pin(files.read(req));
    assert!(futures::poll!(&mut read).is_pending());
    drop(read);
    assert_eq!(files.stuck_count(), 1);
    unblock(&blocked);
    until_unstuck(&files).await;
}

fn file_probe(name: &str, path: &Path) -> String {
    format!(
        "  - name: {name}\n    valtype: numeric\n    interval: 1\n    probe: {{kind: file, path: '{}'}}\n",
        path.display()
    )
}

/// Apply batches until each of `names` has had `n` distinct good values.
async fn readings_of_each(ctl: &mut Controller, view: &mut View, names: &[&str], n: usize) {
    let mut seen: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    guard("distinct readings of each healthy probe", async {
        while names
            .iter()
            .any(|k| seen.get(*k).map_or(0, |s| s.len()) < n)
        {
            let batch = ctl.next_batch().await;
            view.apply(&batch);
            for r in batch
                .resvals
                .iter()
                .filter(|r| names.contains(&r.name.as_str()))
            {
                if let (Status::Ok, Value::Numeric(v)) = (r.status, &r.value) {
                    seen.entry(r.name.clone())
                        .or_default()
                        .insert(v.to_string());
                }
            }
        }
    })
    .await;
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The issue's scenario: 600 file probes on 600 hung paths, next to a /proc/uptime file
/// probe, a `date` exec probe and a builtin, all every second.
#[tokio::test]
async fn six_hundred_hung_paths_leave_the_healthy_probes_producing_readings() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let mut resources = String::from("resources:\n");
    let site = Site::new(&[ctl.addr.to_string()], "");
    // The probes spread over the second (`spread: probes`), as the scenario was written:
    // under `spread: host` all 603 fall due at one instant, and a healthy read that ends
    // while the first HEALTHY_READS hung reads wait out their timeout frees a place for a
    // 17th hung path (one more line, one more stuck thread, still within max_stuck_reads).
    let agent_yaml = std::fs::read_to_string(site.agent_yaml()).unwrap();
    std::fs::write(site.agent_yaml(), format!("{agent_yaml}spread: probes\n")).unwrap();
    let hung = site.path().join("hung");
    std::fs::create_dir_all(&hung).unwrap();
    for i in 0..600 {
        resources.push_str(&file_probe(
            &format!("hung{i}"),
            &fifo(&hung, &format!("f{i}")),
        ));
    }
    resources.push_str(
        "  - name: uptime\n    valtype: numeric\n    interval: 1\n    probe: {kind: file, path: /proc/uptime, regex: '^(\\S+)'}\n\
         \x20 - name: clock\n    valtype: numeric\n    interval: 1\n    probe: {kind: exec, command: [/bin/date, '+%s%N']}\n\
         \x20 - name: mem\n    valtype: numeric\n    interval: 1\n    probe: {kind: builtin}\n",
    );
    std::fs::write(site.file("resources.yaml"), resources).unwrap();
    let mut agent = site.spawn_agent();

    let mut view = View::default();
    // The builtin sampler's `mem` changes on its 15 s tick: one good value is its reading.
    readings_of_each(&mut ctl, &mut view, &["mem"], 1).await;
    let healthy = ["uptime", "clock"];
    readings_of_each(&mut ctl, &mut view, &healthy, 3).await;
    // The hung probes are failing, each with a reason, not pending forever.
    for i in 0..600 {
        let r = &view.values[&format!("hung{i}")];
        assert_ne!(r.status, Status::Ok, "{r:?}");
    }
    // Threads are bounded by the reads that may run plus those that may be stuck.
    let threads = threads_of(agent.pid());
    assert!(threads < 80, "{threads} threads in the agent");
    // Steady state: more readings of the healthy probes, and no log line per tick.
    let lines_before = agent.log_text().lines().count();
    readings_of_each(&mut ctl, &mut view, &healthy, 6).await;
    let log = agent.log_text();
    let new_lines: Vec<&str> = log.lines().skip(lines_before).collect();
    assert!(
        new_lines.len() < 10,
        "logged per tick:\n{}",
        new_lines.join("\n")
    );
    assert!(
        log.matches("a read is stuck in the kernel").count() <= 16,
        "one line per stuck path:\n{log}"
    );
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
}

/// SIGTERM while a read is blocked in the kernel: the daemon sends its last values, closes
/// the connection cleanly and exits.
#[tokio::test]
async fn sigterm_with_a_blocked_read_exits_after_sending_the_last_values() {
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let site = Site::new(&[ctl.addr.to_string()], "");
    let blocked = fifo(site.path(), "hung");
    site.counter_script("count");
    std::fs::write(
        site.file("resources.yaml"),
        format!(
            "resources:\n{}  - name: count\n    valtype: numeric\n    interval: 1\n    probe: {{kind: exec, command: [count.sh]}}\n",
            file_probe("hung", &blocked)
        ),
    )
    .unwrap();
    let agent_yaml = std::fs::read_to_string(site.agent_yaml()).unwrap();
    std::fs::write(
        site.agent_yaml(),
        format!("{agent_yaml}metrics: 127.0.0.1:0\n"),
    )
    .unwrap();
    let mut agent = site.spawn_agent();
    agent.wait_log("a read is stuck in the kernel", 1).await;
    site.wait_runs("count", 2).await;
    let metrics = scrape(&agent.log_text()).await;
    assert!(metrics.contains("\nxce_file_reads_stuck 1\n"), "{metrics}");
    assert!(
        metrics.contains("\nxce_file_reads_stuck_limit 32\n"),
        "{metrics}"
    );
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
    let runs = site.runs("count");
    // Everything the agent sent, then a clean close (the link's last flush came before it).
    let mut view = View::default();
    loop {
        match ctl.next().await.kind {
            EventKind::Batch { batch, .. } => view.apply(&batch),
            EventKind::Closed(None) => break,
            EventKind::Closed(Some(e)) => panic!("connection dropped uncleanly: {e}"),
            _ => {}
        }
    }
    let count = &view.values["count"];
    assert_eq!(count.value, Value::Numeric(runs as f64), "{count:?}");
    assert_eq!(view.values["hung"].status, Status::Failed);
    assert!(agent.log_text().contains("stopped"));
}

/// GET /metrics from the address the agent logged (the server closes after answering).
async fn scrape(log: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = regex::Regex::new(r"metrics endpoint listening addr=(\S+)")
        .unwrap()
        .captures(log)
        .map(|c| c[1].to_owned())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
    guard("a metrics answer", async {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
}

fn once_site(blocked: &Path) -> Site {
    let site = Site::new(&[], "");
    site.script("ok.sh", "#!/bin/sh\necho 3\n");
    std::fs::write(
        site.file("resources.yaml"),
        format!(
            "resources:\n{}  - name: ok\n    valtype: numeric\n    interval: 1\n    probe: {{kind: exec, command: [ok.sh]}}\n",
            file_probe("hung", blocked)
        ),
    )
    .unwrap();
    site
}

/// Run the agent binary to its end (bounded by the hang guard) and return (code, stdout).
async fn run_to_end(args: &[&str]) -> (Option<i32>, String, String) {
    let out = guard(
        "the command to exit",
        tokio::process::Command::new(agent_bin())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run xce-agent");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn once_prints_and_exits_while_a_read_is_stuck() {
    let tmp = tempfile::tempdir().unwrap();
    let blocked = fifo(tmp.path(), "hung");
    let site = once_site(&blocked);
    let config = site.agent_yaml();
    let (code, stdout, stderr) =
        run_to_end(&["--config", config.to_str().unwrap(), "--once"]).await;
    assert_eq!(code, Some(1), "a probe failed: {stdout}{stderr}");
    assert!(stdout.contains("timed out after 1s"), "{stdout}");
    let ok_line = stdout.lines().find(|l| l.starts_with("ok ")).unwrap_or("");
    assert!(ok_line.contains(" 3 "), "{stdout}");
}

#[tokio::test]
async fn probe_command_prints_and_exits_while_a_read_is_stuck() {
    let tmp = tempfile::tempdir().unwrap();
    let blocked = fifo(tmp.path(), "hung");
    let site = once_site(&blocked);
    let config = site.agent_yaml();
    let (code, stdout, stderr) =
        run_to_end(&["--config", config.to_str().unwrap(), "probe", "hung"]).await;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("timed out after 1s"), "{stdout}");
}
