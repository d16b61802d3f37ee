//! Stream probes end to end: a real long-running child, values observed through the store's
//! watch (no sleeps), restarts, the abort value, partial and overlong lines, silence, and
//! ClassAd streams (one ad per `-`, gated by FIFOs).

use crate::support as common;

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::support::{declare, load_task, resource, wait_for, Setup};
use tokio_util::sync::CancellationToken;
use xce_agent::probe::stream::{self, Line, LineSplitter};
use xce_agent::probe::{run_once, Outcome};
use xce_agent::stats::Stats;
use xce_agent::store::Store;
use xce_agent::value::{Status, Value};

/// A setup whose resources are `a` (the stream, providing a and b) and `b`, with `pids/`
/// writable by the probe user; `DIR` in `probe` becomes that directory.
fn setup(probe: &str, body: &str) -> Setup {
    setup_every("60s", probe, body)
}

/// [`setup`] with `a`'s interval (a stream's stdin ticks and first-values deadline).
fn setup_every(interval: &str, probe: &str, body: &str) -> Setup {
    let s = Setup::new("resources: []\n");
    let pids = common::pids_dir(&s);
    let probe = probe.replace("DIR", &pids.display().to_string());
    std::fs::write(
        s.path().join("resources.yaml"),
        format!(
            "resources:\n{}{}",
            resource("a", &probe).replace("interval: 60s", &format!("interval: {interval}")),
            "  - {name: b, valtype: numeric, interval: 60s, resourcemap: [{location: [default]}]}\n"
        ),
    )
    .unwrap();
    s.script("el", body);
    s
}

struct Running {
    store: Arc<Store>,
    stats: Arc<Stats>,
    cancel: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

fn start(s: &Setup) -> Running {
    let (task, ctx) = load_task(s, "a");
    let store = Arc::new(Store::new());
    declare(&store, &task);
    let stats = Arc::new(Stats::default());
    let cancel = CancellationToken::new();
    let handle = tokio::spawn(stream::supervise(
        Arc::new(task),
        ctx,
        store.clone(),
        stats.clone(),
        cancel.clone(),
    ));
    Running {
        store,
        stats,
        cancel,
        handle,
    }
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        self.handle.await.unwrap();
    }
    fn restarts(&self) -> u64 {
        self.stats.probe("a").restarts.load(Ordering::Relaxed)
    }
}

const ELIM: &str = "{kind: stream, command: [el], format: elim, provides: [a, b], env: {D: DIR}}";

/// A FIFO in the setup's `pids/` that a script blocks on (`read x < "$D/NAME"`) until the
/// test releases it.
fn fifo(s: &Setup, name: &str) -> std::path::PathBuf {
    let path = s.path().join("pids").join(name);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    path
}

async fn release(fifo: &std::path::Path) {
    let fifo = fifo.to_owned();
    tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n").unwrap())
        .await
        .unwrap();
}

fn num(v: f64) -> impl Fn(&xce_agent::value::Resval) -> bool {
    move |r| r.status == Status::Ok && r.value == Value::Numeric(v)
}

#[tokio::test]
async fn values_arrive_as_lines_are_written_and_the_group_dies_on_cancel() {
    let s = setup(
        ELIM,
        "#!/bin/sh\necho $$ > \"$D/el.pid\"\necho \"2 a 5 b 7\"\necho \"1 b 8\"\nexec sleep 1000\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(5.0)).await;
    wait_for(&r.store, "b", num(8.0)).await;
    let pid = common::read_pid(&s.path().join("pids/el.pid"));
    r.stop().await;
    common::wait_gone(pid);
    assert!(!common::alive(pid));
}

#[tokio::test]
async fn environment_has_lsf_resources_and_elim_abort_value() {
    let s = setup(
        "{kind: stream, command: [el], format: kv, provides: [a, b]}",
        "#!/bin/sh\n[ \"$LSF_RESOURCES\" = \"a b\" ] && [ \"$ELIM_ABORT_VALUE\" = 97 ] && echo 'a = 1'\nexec sleep 1000\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(1.0)).await;
    r.stop().await;
}

/// Each line applied is a run of the probe, counted and timed with its last success; a
/// line that does not parse is a rejected one.
#[tokio::test]
async fn a_streams_lines_are_counted_as_runs() {
    let s = setup(
        ELIM,
        "#!/bin/sh\necho '1 a 1'\necho 'garbage'\necho '2 a 2 b 3'\nexec sleep 1000\n",
    );
    let r = start(&s);
    wait_for(&r.store, "b", num(3.0)).await;
    let probe = r.stats.probe("a");
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(
        (load(&probe.ok), load(&probe.rejected), load(&probe.failed)),
        (2, 1, 0)
    );
    assert!(load(&probe.last_success_ms) > 0);
    assert_eq!(probe.duration.count.load(Ordering::Relaxed), 2);
    r.stop().await;
}

#[tokio::test]
async fn a_crash_is_restarted_and_counted() {
    let s = setup(
        ELIM,
        "#!/bin/sh\nn=$(cat \"$D/n\" 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n > \"$D/n\"\necho \"1 a $n\"\n[ $n -ge 2 ] && exec sleep 1000\necho crashing >&2\nexit 3\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", |v| {
        v.status == Status::Failed
            && v.error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("exited with status 3: crashing; restarting in 1s")
    })
    .await;
    wait_for(&r.store, "a", num(2.0)).await;
    assert_eq!(r.restarts(), 1);
    r.stop().await;
}

#[tokio::test]
async fn the_abort_value_stops_restarts() {
    let s = setup(
        ELIM,
        "#!/bin/sh\necho \"nothing to do here\" >&2\nexit \"$ELIM_ABORT_VALUE\"\n",
    );
    let r = start(&s);
    let v = wait_for(&r.store, "a", |v| v.status == Status::Failed).await;
    let err = v.error.unwrap().to_string();
    assert!(err.starts_with("elim aborted (exit 97"), "{err}");
    assert!(err.contains("nothing to do here"), "{err}");
    // The supervisor records the abort and then only waits for cancellation.
    assert_eq!(r.restarts(), 0);
    assert!(!r.handle.is_finished());
    r.stop().await;
}

#[tokio::test]
async fn a_partial_line_waits_for_its_newline_and_blocks_nothing() {
    let s = setup(
        ELIM,
        "#!/bin/sh\necho \"1 a 5\"\nprintf '1 a'\nread x < \"$D/fifo\"\necho \" 9\"\nexec sleep 1000\n",
    );
    let fifo = fifo(&s, "fifo");
    let r = start(&s);
    wait_for(&r.store, "a", num(5.0)).await;
    // Another probe runs to completion while the stream sits inside a line.
    let other = Setup::new(&format!(
        "resources:\n{}",
        resource("o", "{kind: exec, command: [o]}")
    ));
    other.script("o", "#!/bin/sh\necho 3\n");
    let (task, ctx) = load_task(&other, "o");
    assert_eq!(run_once(&task, &ctx).await.outcome, Outcome::Ok);
    let a = r.store.get("a", "").unwrap();
    assert_eq!((a.status, a.value), (Status::Ok, Value::Numeric(5.0)));
    // Complete the line: now it is applied.
    release(&fifo).await;
    wait_for(&r.store, "a", num(9.0)).await;
    r.stop().await;
}

#[tokio::test]
async fn an_overlong_line_is_skipped_and_later_lines_apply() {
    let s = setup(
        ELIM,
        "#!/bin/sh\nhead -c 70000 /dev/zero | tr '\\0' x\necho\necho \"1 a 4\"\nexec sleep 1000\n",
    );
    let r = start(&s);
    let v = wait_for(&r.store, "a", num(4.0)).await;
    assert_eq!(v.error, None);
    r.stop().await;
}

#[tokio::test]
async fn silence_marks_values_stale() {
    let s = setup(
        "{kind: stream, command: [el], format: elim, provides: [a, b], silence: 1s}",
        "#!/bin/sh\necho \"1 a 5\"\nexec sleep 1000\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(5.0)).await;
    let v = wait_for(&r.store, "a", |v| v.status == Status::Stale).await;
    assert_eq!(v.value, Value::Unknown);
    assert!(v
        .error
        .unwrap()
        .to_string()
        .contains("stream silent for 1s"));
    assert_eq!(r.restarts(), 0, "no hang restart unless asked");
    r.stop().await;
}

#[tokio::test]
async fn restart_on_silence_restarts_a_hung_stream() {
    let s = setup(
        "{kind: stream, command: [el], format: elim, provides: [a, b], silence: 1s, restart_on_silence: true, env: {D: DIR}}",
        "#!/bin/sh\nn=$(cat \"$D/n\" 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n > \"$D/n\"\necho \"1 a $n\"\nexec sleep 1000\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(1.0)).await;
    wait_for(&r.store, "a", |v| v.status == Status::Stale).await;
    wait_for(&r.store, "a", num(2.0)).await;
    assert!(r.restarts() >= 1);
    r.stop().await;
}

fn elim_example_setup(provides: &str) -> Setup {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/plugins/elim_proc"
    );
    let probe = format!(
        "{{kind: stream, command: [elim.example], format: elim, provides: [{provides}], env: {{ELIM_PROC_ROOT: {fixture}, ELIM_INTERVAL: \"1\"}}}}"
    );
    let mut yaml = String::from("resources:\n");
    for (i, name) in provides.split(", ").enumerate() {
        if i == 0 {
            yaml.push_str(&resource(name, &probe));
        } else {
            yaml.push_str(&format!(
                "  - {{name: {name}, valtype: numeric, interval: 60s, resourcemap: [{{location: [default]}}]}}\n"
            ));
        }
    }
    let s = Setup::new(&yaml);
    let body =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/plugins/elim.example"))
            .unwrap();
    s.script("elim.example", &body);
    s
}

#[tokio::test]
async fn an_unmodified_lsf_elim_works() {
    let s = elim_example_setup("nprocs, nzombies, oom_kills");
    let (task, ctx) = load_task(&s, "nprocs");
    let store = Arc::new(Store::new());
    declare(&store, &task);
    let cancel = CancellationToken::new();
    let h = tokio::spawn(stream::supervise(
        Arc::new(task),
        ctx,
        store.clone(),
        Arc::new(Stats::default()),
        cancel.clone(),
    ));
    wait_for(&store, "nprocs", num(4.0)).await;
    wait_for(&store, "nzombies", num(1.0)).await;
    wait_for(&store, "oom_kills", num(2.0)).await;
    cancel.cancel();
    h.await.unwrap();
}

#[tokio::test]
async fn an_unmodified_lsf_elim_that_has_nothing_to_report_aborts() {
    let s = elim_example_setup("mem");
    let (task, ctx) = load_task(&s, "mem");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Failed);
    let err = run.error().unwrap();
    assert!(err.starts_with("elim aborted (exit 97"), "{err}");
    assert!(err.contains("none of LSF_RESOURCES (mem)"), "{err}");
}

/// `--once` and `probe NAME` run a stream like any probe (`run_once`): until its first
/// values.
#[tokio::test]
async fn first_values_takes_the_first_line_then_stops_the_group() {
    let s = elim_example_setup("nprocs, nzombies, oom_kills");
    let (task, ctx) = load_task(&s, "nprocs");
    let run = run_once(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    let vals: Vec<String> = run
        .readings
        .iter()
        .map(|(n, r)| format!("{n}={r:?}"))
        .collect();
    assert_eq!(
        vals,
        [
            "nprocs=Ok(Numeric(4.0))",
            "nzombies=Ok(Numeric(1.0))",
            "oom_kills=Ok(Numeric(2.0))"
        ]
    );
    // TERM trap: elim.example exits 0 when stopped.
    let exit = run.exec.unwrap().exit;
    assert_eq!(exit, Some(xce_agent::probe::child::Exit::Code(0)));
}

/// IBM's elim.uptime.pl in miniature: a Perl elim that prints without flushing. Perl
/// block-buffers a pipe and line-buffers a terminal. The `syswrite` after the `print` goes to
/// fd 1 at once, past Perl's buffer: when its line `1 b 1` has been applied, the `print`'s
/// line `1 a 5` has been applied before it if (and only if) Perl wrote it out.
const BUFFERED_PERL_ELIM: &str =
    "#!/usr/bin/perl\nprint \"1 a 5\\n\";\nsyswrite(STDOUT, \"1 b 1\\n\");\nsleep 1000;\n";

#[tokio::test]
async fn a_block_buffering_elim_holds_its_lines_back_from_a_pipe() {
    let s = setup(ELIM, BUFFERED_PERL_ELIM);
    let r = start(&s);
    wait_for(&r.store, "b", num(1.0)).await;
    let a = r.store.get("a", "").unwrap();
    assert_eq!(a.status, Status::Pending, "{a:?}");
    r.stop().await;
}

#[tokio::test]
async fn stdout_pty_delivers_each_line_of_a_block_buffering_elim() {
    let s = setup(
        "{kind: stream, command: [el], format: elim, provides: [a, b], stdout: pty}",
        BUFFERED_PERL_ELIM,
    );
    let r = start(&s);
    wait_for(&r.store, "b", num(1.0)).await;
    let a = r.store.get("a", "").unwrap();
    assert_eq!((a.status, a.value), (Status::Ok, Value::Numeric(5.0)));
    r.stop().await;
    // `--once` and `probe NAME` read the same terminal: the first line is the print's.
    let (task, ctx) = load_task(&s, "a");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_eq!(
        run.readings[0].1,
        xce_agent::value::Reading::Ok(Value::Numeric(5.0))
    );
    // No terminal `\r\n`: the line reached the agent as it was printed.
    let stdout = run.exec.unwrap().stdout;
    assert!(
        stdout.starts_with(b"1 a 5\n"),
        "{:?}",
        String::from_utf8_lossy(&stdout)
    );
}

/// influxdata's execd example `count.sh`, as an elim: one batch per line read from stdin.
const COUNT_SH: &str = "#!/bin/sh\ni=1\nwhile read line; do echo \"1 a $i\"; i=$((i + 1)); done\n";

#[tokio::test]
async fn stdin_signal_asks_a_count_script_for_one_batch_per_interval() {
    let s = setup_every(
        "1s",
        "{kind: stream, command: [el], format: elim, provides: [a, b], stdin: signal}",
        COUNT_SH,
    );
    let r = start(&s);
    // One batch at the start, one per interval after; the script never ends, so it was
    // never restarted (with stdin /dev/null it reads EOF and exits at once).
    wait_for(&r.store, "a", num(1.0)).await;
    wait_for(&r.store, "a", num(2.0)).await;
    wait_for(&r.store, "a", num(3.0)).await;
    assert_eq!(r.restarts(), 0);
    let probe = r.stats.probe("a");
    assert_eq!(probe.skipped_overlap.load(Ordering::Relaxed), 0);
    r.stop().await;
}

#[tokio::test]
async fn without_stdin_signal_a_count_script_reads_end_of_file_and_exits() {
    let s = setup(ELIM, COUNT_SH);
    let (task, ctx) = load_task(&s, "a");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Failed);
    let err = run.error().unwrap();
    assert_eq!(err, "exited with status 0 before reporting any values");
}

#[tokio::test]
async fn stdin_signal_asks_once_for_first_values() {
    let s = setup(
        "{kind: stream, command: [el], format: elim, provides: [a, b], stdin: signal}",
        COUNT_SH,
    );
    let (task, ctx) = load_task(&s, "a");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_eq!(
        run.readings[0].1,
        xce_agent::value::Reading::Ok(Value::Numeric(1.0))
    );
}

#[tokio::test]
async fn a_stream_answering_one_signal_and_exiting_is_restarted_and_asked_again() {
    // EPIPE on the next tick is normal: the exit is what the supervisor acts on.
    let s = setup_every(
        "1s",
        "{kind: stream, command: [el], format: elim, provides: [a, b], stdin: signal, env: {D: DIR}}",
        "#!/bin/sh\nn=$(cat \"$D/n\" 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n > \"$D/n\"\nread line\necho \"1 a $n\"\n",
    );
    let r = start(&s);
    // Each value is followed at once by the exit's failure, which keeps it: match the value.
    let value = |n: f64| move |v: &xce_agent::value::Resval| v.value == Value::Numeric(n);
    wait_for(&r.store, "a", value(1.0)).await;
    wait_for(&r.store, "a", value(2.0)).await;
    assert!(r.restarts() >= 1);
    r.stop().await;
}

#[test]
fn a_streams_first_values_deadline_defaults_from_its_interval() {
    let yaml = |interval: &str, probe: &str| {
        format!(
            "resources:\n  - {{name: a, valtype: numeric, interval: {interval}, resourcemap: [{{location: [default]}}], probe: {probe}}}\n"
        )
    };
    let timeout = |interval: &str, probe: &str| {
        let dir = tempfile::tempdir().unwrap();
        common::task_from_yaml(&yaml(interval, probe), "a", dir.path())
            .0
            .timeout
    };
    let secs = std::time::Duration::from_secs;
    let stream = "{kind: stream, command: [el], format: elim}";
    // An elim reporting every 60 s (IBM's elim.css) is waited for 60 s + 30 s.
    assert_eq!(timeout("60s", stream), secs(90));
    assert_eq!(timeout("10s", stream), secs(20));
    assert_eq!(timeout("5m", stream), secs(330));
    // An explicit timeout is the deadline; an exec probe's default stays min(interval, 30 s).
    assert_eq!(
        timeout(
            "60s",
            "{kind: stream, command: [el], format: elim, timeout: 5s}"
        ),
        secs(5)
    );
    assert_eq!(timeout("60s", "{kind: exec, command: [el]}"), secs(30));
}

#[tokio::test]
async fn a_stream_silent_past_its_first_values_deadline_says_which_deadline() {
    let err = first_values_timing_out(
        "{kind: stream, command: [el], format: elim, provides: [a, b], timeout: 1s}",
        "#!/bin/sh\necho 0\nexec sleep 1000\n",
    )
    .await;
    assert_eq!(err, "timed out after 1s: no complete line with values");
}

/// The error of `first_values` on a stream that must time out.
async fn first_values_timing_out(probe: &str, body: &str) -> String {
    let s = setup(probe, body);
    let (task, ctx) = load_task(&s, "a");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::TimedOut);
    run.error().unwrap().to_owned()
}

#[test]
fn line_splitter_buffers_partials_and_rejects_overlong_lines() {
    let mut sp = LineSplitter::new(8);
    let mut out = Vec::new();
    sp.push(b"1 a 5\n1 a", &mut out);
    assert_eq!(out, vec![Line::Complete(b"1 a 5".to_vec())]);
    assert_eq!(sp.pending(), 3);
    out.clear();
    sp.push(b" 6\n", &mut out);
    assert_eq!(out, vec![Line::Complete(b"1 a 6".to_vec())]);
    out.clear();
    // Over the limit before its newline: reported once, skipped to the next newline.
    sp.push(b"123456789", &mut out);
    sp.push(b"abc", &mut out);
    sp.push(b"def\nok\n", &mut out);
    assert_eq!(out, vec![Line::TooLong, Line::Complete(b"ok".to_vec())]);
    out.clear();
    sp.push(b"123456789\n", &mut out);
    assert_eq!(out, vec![Line::TooLong]);
}

// ClassAd streams (HTCondor startd cron jobs that keep running): `Name = value` lines
// gather into one ad, applied at its `-` line.

const CLASSAD: &str =
    "{kind: stream, command: [el], format: classad, provides: [a, b], env: {D: DIR}}";

#[tokio::test]
async fn a_classad_stream_applies_each_ad_together_at_its_dash() {
    let s = setup(
        CLASSAD,
        "#!/bin/sh\necho 'a = 1'\necho 'b = 2'\necho '-'\nread x < \"$D/next\"\necho 'A = 3'\necho 'b = 4'\necho '-'\nexec sleep 1000\n",
    );
    let next = fifo(&s, "next");
    let r = start(&s);
    let a = wait_for(&r.store, "a", num(1.0)).await;
    // One update: both values, one stamp; the second ad is not printed until released.
    let b = r.store.get("b", "").unwrap();
    assert_eq!((b.status, &b.value), (Status::Ok, &Value::Numeric(2.0)));
    assert_eq!(a.last_report_ms, b.last_report_ms);
    release(&next).await;
    // Attribute names are case-insensitive: `A` feeds a.
    wait_for(&r.store, "a", num(3.0)).await;
    wait_for(&r.store, "b", num(4.0)).await;
    r.stop().await;
}

#[tokio::test]
async fn named_ads_of_a_classad_stream_update_only_their_own_resources() {
    let s = setup(
        "{kind: stream, command: [el], format: classad, provides: [a, b], env: {D: DIR}, select: {a: 'Requests{ad=\"SQUID0\"}', b: 'Requests{ad=\"SQUID1\"}'}}",
        "#!/bin/sh\nprintf 'Requests = 5\\n- SQUID0\\nRequests = 7\\n- SQUID1\\n'\nread x < \"$D/next\"\nprintf 'Requests = 6\\n- SQUID0\\n'\nexec sleep 1000\n",
    );
    let next = fifo(&s, "next");
    let r = start(&s);
    wait_for(&r.store, "a", num(5.0)).await;
    let b = wait_for(&r.store, "b", num(7.0)).await;
    release(&next).await;
    wait_for(&r.store, "a", num(6.0)).await;
    // SQUID0's update left SQUID1's resource as it was, stamp included.
    assert_eq!(r.store.get("b", "").unwrap(), b);
    r.stop().await;
}

#[tokio::test]
async fn first_values_of_a_classad_stream_wait_for_every_named_ad() {
    let probe = "{kind: stream, command: [squid], format: classad, provides: [SQUID1_Requests]}";
    let s = Setup::new(&format!(
        "resources:\n{}  - {{name: SQUID1_Requests, valtype: numeric, interval: 60s, resourcemap: [{{location: [default]}}]}}\n",
        resource("SQUID0_Requests", probe)
    ));
    // The CMR squid monitor's shape: one ad per squid, each named by its `- NAME` line.
    s.script(
        "squid",
        "#!/bin/sh\nprintf 'Requests = 5\\nUp = true\\n- SQUID0\\n'\nprintf 'Requests = 7\\n- SQUID1\\n'\nexec sleep 1000\n",
    );
    let (task, ctx) = load_task(&s, "SQUID0_Requests");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    let vals: Vec<String> = run
        .readings
        .iter()
        .map(|(n, r)| format!("{n}={r:?}"))
        .collect();
    assert_eq!(
        vals,
        [
            "SQUID0_Requests=Ok(Numeric(5.0))",
            "SQUID1_Requests=Ok(Numeric(7.0))"
        ]
    );
}

#[tokio::test]
async fn a_malformed_line_in_an_ad_is_named_and_the_rest_of_the_ad_applies() {
    let s = setup(
        CLASSAD,
        "#!/bin/sh\nprintf 'a = 1\\nb = 7\\n-\\n'\nread x < \"$D/next\"\nprintf 'a = 2\\nb =\\n-\\n'\nexec sleep 1000\n",
    );
    let next = fifo(&s, "next");
    let r = start(&s);
    wait_for(&r.store, "b", num(7.0)).await;
    release(&next).await;
    wait_for(&r.store, "a", num(2.0)).await;
    // b's line did not parse: b keeps its last good value (until its stale time), never 0.
    let b = r.store.get("b", "").unwrap();
    assert_eq!((b.status, b.value), (Status::Ok, Value::Numeric(7.0)));
    r.stop().await;

    // `--once` and `probe NAME` name the line, counted from the stream's start.
    let s = setup(
        CLASSAD,
        "#!/bin/sh\nprintf 'a = 1\\nb =\\n-\\n'\nexec sleep 1000\n",
    );
    let (task, ctx) = load_task(&s, "a");
    let run = stream::first_values(&task, &ctx).await;
    assert_eq!(run.bad_lines, ["line 2: b has no value"]);
    assert_eq!(
        run.readings[0].1,
        xce_agent::value::Reading::Ok(Value::Numeric(1.0))
    );
    let xce_agent::value::Reading::Pending(why) = &run.readings[1].1 else {
        panic!("{:?}", run.readings[1]);
    };
    assert!(
        why.contains("did not parse, the first: line 2: b has no value"),
        "{why}"
    );
}

#[tokio::test]
async fn an_ad_left_without_its_dash_is_applied_when_the_stream_exits() {
    // As HTCondor does when a cron job exits: what it printed after its last `-` is
    // published. The second start only sleeps, so the values seen are the first run's.
    let s = setup(
        CLASSAD,
        "#!/bin/sh\n[ -e \"$D/ran\" ] && exec sleep 1000\ntouch \"$D/ran\"\nprintf 'a = 1\\nb = 2\\n-\\na = 5\\n'\nexit 3\n",
    );
    let r = start(&s);
    // The exit's failure follows at once and keeps the value: match the value.
    let a = wait_for(&r.store, "a", |v| v.value == Value::Numeric(5.0)).await;
    assert!(a.last_report_ms.is_some());
    let b = r.store.get("b", "").unwrap();
    assert_eq!(b.value, Value::Numeric(2.0), "{b:?}");
    r.stop().await;
}

#[tokio::test]
async fn an_ad_still_open_at_the_first_values_deadline_is_not_an_answer() {
    let err = first_values_timing_out(
        "{kind: stream, command: [el], format: classad, provides: [a, b], timeout: 1s}",
        "#!/bin/sh\nprintf 'a = 1\\nb = 2\\n'\nexec sleep 1000\n",
    )
    .await;
    assert_eq!(
        err,
        "timed out after 1s: no `-` line ended the ClassAd it began (2 lines read)"
    );
}

#[tokio::test]
async fn lines_of_an_ad_that_never_ends_are_not_reports_and_the_stream_goes_stale() {
    let s = setup(
        "{kind: stream, command: [el], format: classad, provides: [a, b], silence: 1s}",
        "#!/bin/sh\nprintf 'a = 1\\n-\\n'\nwhile :; do echo 'a = 2'; sleep 0.2; done\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(1.0)).await;
    let a = wait_for(&r.store, "a", |v| v.status == Status::Stale).await;
    assert!(a
        .error
        .unwrap()
        .to_string()
        .contains("stream silent for 1s"));
    r.stop().await;
}

/// influxdata's execd `count.sh` shape in Perl, printing one ClassAd per line read from
/// stdin, never flushing: only a terminal on stdout gets its ads out as it prints them.
const COUNT_CLASSAD_PERL: &str =
    "#!/usr/bin/perl\nmy $i = 1;\nwhile (<STDIN>) { print \"a = $i\\nb = $i\\n-\\n\"; $i++; }\n";

#[tokio::test]
async fn a_classad_stream_answers_stdin_signals_through_a_pty() {
    let s = setup_every(
        "1s",
        "{kind: stream, command: [el], format: classad, provides: [a, b], stdin: signal, stdout: pty}",
        COUNT_CLASSAD_PERL,
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(1.0)).await;
    wait_for(&r.store, "b", num(2.0)).await;
    assert_eq!(r.restarts(), 0);
    r.stop().await;
}

#[tokio::test]
async fn an_ad_that_never_ends_is_dropped_at_its_bound_and_the_next_ad_applies() {
    // A kv script declared classad: attributes forever, no `-`. Memory stays bounded.
    let s = setup(
        CLASSAD,
        "#!/bin/sh\nyes 'attr = 1' | head -n 9000\nread x < \"$D/next\"\nprintf -- '-\\na = 3\\n-\\n'\nexec sleep 1000\n",
    );
    let next = fifo(&s, "next");
    let r = start(&s);
    let a = wait_for(&r.store, "a", |v| v.status == Status::Failed).await;
    assert_eq!(
        a.error.unwrap().to_string(),
        "a ClassAd ran past 65536 bytes without a `-` line; a stream's ClassAd output ends each update with `-`"
    );
    release(&next).await;
    // The `-` ends the dropped ad (nothing applied); the next ad applies.
    wait_for(&r.store, "a", num(3.0)).await;
    r.stop().await;
}

/// A hostile stream through the real daemon (issue 26, item 5): 1000 malformed lines, 1000
/// distinct stderr lines and 5000 ever-new names outside `provides:`, then it aborts. The log
/// gets a burst of each and one summary line with the count of the rest; the agent remembers
/// a bounded set of names.
#[tokio::test]
async fn a_hostile_stream_costs_the_log_a_bounded_number_of_lines() {
    use xce_agent::probe::output_log::{LOG_BURST, UNEXPECTED_REMEMBERED};
    let site = common::Site::new(
        &[],
        "resources:\n  - {name: a, valtype: numeric, interval: 60s, resourcemap: [{location: [default]}], probe: {kind: stream, command: [hostile], format: kv}}\n",
    );
    site.script(
        "hostile",
        "#!/bin/sh\ni=0\nwhile [ $i -lt 1000 ]; do echo \"garbage $i\"; echo \"err $i\" >&2; i=$((i+1)); done\n\
         i=0\nwhile [ $i -lt 5000 ]; do echo \"job_$i = 1\"; i=$((i+1)); done\necho 'a = 1'\nexit 97\n",
    );
    let mut agent = site.spawn_agent();
    common::wait_until("the stream to abort", || {
        agent.log_text().contains("not restarted")
    })
    .await;
    let log = agent.log_text();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("bad kv line"), LOG_BURST as usize, "{log}");
    assert_eq!(
        count(&format!(
            "{} more malformed lines not logged",
            1000 - LOG_BURST
        )),
        1,
        "{log}"
    );
    assert_eq!(
        count("stream probe wrote to stderr"),
        LOG_BURST as usize,
        "{log}"
    );
    assert_eq!(
        count(&format!(
            "{} more stderr lines not logged",
            1000 - LOG_BURST
        )),
        1,
        "{log}"
    );
    assert_eq!(count("not in provides:"), UNEXPECTED_REMEMBERED, "{log}");
    assert_eq!(
        count(&format!(
            "{} more names outside provides: not logged",
            5000 - UNEXPECTED_REMEMBERED
        )),
        1,
        "{log}"
    );
    assert!(log.lines().count() < 200, "{log}");
    agent.assert_alive();
}

/// The agent CPU a stream's lines cost is counted for that probe (status and /metrics show
/// it): 20,000 lines read, parsed and applied cost more than nothing. So are the names
/// outside `provides:`, each time, though only a bounded set is remembered.
#[tokio::test]
async fn the_agent_cpu_a_streams_lines_cost_is_attributed_to_it() {
    let s = setup(
        ELIM,
        "#!/bin/sh\ni=0\nwhile [ $i -lt 20000 ]; do echo \"2 b $i job_$i 1\"; i=$((i+1)); done\necho \"1 a 5\"\nexec sleep 1000\n",
    );
    let r = start(&s);
    wait_for(&r.store, "a", num(5.0)).await;
    let cpu = r.stats.probe("a").agent_cpu_ns.load(Ordering::Relaxed);
    assert!(cpu > 0, "no agent CPU counted for 20,000 lines");
    let stats = r.stats.probe("a");
    common::wait_until("20,000 names outside provides: counted", || {
        stats.unexpected_names.load(Ordering::Relaxed) == 20_000
    })
    .await;
    assert_eq!(
        r.store.get("b", "").map(|v| v.value),
        Some(Value::Numeric(19999.0))
    );
    r.stop().await;
}
