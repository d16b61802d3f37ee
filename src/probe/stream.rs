//! Stream probes: a long-running process read line by line; an unmodified LSF elim works.
//!
//! The child runs like an exec probe (own process group, run_as, limits, cleared env, stdin
//! /dev/null, stdout a pipe or with `stdout: pty` a terminal) and also gets `LSF_RESOURCES`
//! and `ELIM_ABORT_VALUE`. With `stdin: signal` its stdin is a pipe that gets a newline when
//! the child starts and at every interval after; a tick the child has not read room for is
//! dropped and counted as an overlap skip, never waited on. Each complete stdout line is
//! read as its format's table entry says (`output::Streaming`): a line format's line is
//! one update, a block format's lines (ClassAd's `Name = value` lines of one ad) are one
//! update at their terminator (`-`). Each update is applied at once, as one run through
//! the probe's sink (counted and shown like any probe's runs; one that does not parse is a
//! rejected run). A partial line waits for its newline and a line longer than [`MAX_LINE`] is skipped, never blocking. When the child
//! exits it is restarted after a backoff (1 s doubling to [`BACKOFF_CAP`], reset after a
//! good long run); exit [`ELIM_ABORT_VALUE`] means "nothing to report here": no restart.
//! Silent for longer than the task's stale time (no line; for ClassAd, no `-`): its values
//! are marked stale and, with `restart_on_silence`, the group is killed and restarted.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use super::child::{self, drive, AfterExit, Child, Ended, Event, Exit, Flow};
use super::child::{Ticks, Watch};
use super::exec::{self, ExecDetail};
use super::sink::Sink;
mod updates;

use super::failure::{Exited, NoFirstValues, NoValues, Restarting, SpawnRefused, StreamStopped};
use super::{Outcome, ProbeContext, ProbeRun, RunFailure};
use crate::config::{StdinMode, StreamSpec};
use crate::output::Streaming;
use crate::output::ELIM_ABORT_VALUE;
use crate::plan::ProbeTask;
use crate::stats::Stats;
use crate::store::Store;
use crate::value::{Failure, Reading};
use updates::{FirstValues, Gathered, Updates};

/// Longest stdout line accepted; a longer one is an error and skipped.
pub const MAX_LINE: usize = 64 * 1024;
pub const BACKOFF_START: Duration = Duration::from_secs(1);
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// A child that ran this long (and said something) earns a fresh backoff.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// Most stdout a stream's lines may bring per second: past it the agent stops reading until
/// the second is over (the pipe fills and the child waits in its write), so a stream printing
/// at full speed costs the agent a bounded share of a core, which `status` and `/metrics`
/// (`xce_probe_agent_cpu_seconds`) attribute to it. An ELIM prints a line per interval.
pub const STREAM_BYTES_PER_SEC: usize = 1 << 20;

/// The stream child's environment: the exec variables, `LSF_RESOURCES`, `ELIM_ABORT_VALUE`,
/// then the probe's `env:` (which may override them).
pub fn stream_env(task: &ProbeTask, spec: &StreamSpec, host: &str) -> child::Env {
    let provides: Vec<&str> = task.feeds.iter().map(|f| f.name.as_str()).collect();
    let mut extra = BTreeMap::new();
    extra.insert("LSF_RESOURCES".to_owned(), provides.join(" "));
    extra.insert("ELIM_ABORT_VALUE".to_owned(), ELIM_ABORT_VALUE.to_string());
    extra.extend(spec.exec.env.clone());
    exec::probe_env(task, host, &extra, &[])
}

/// Splits a byte stream into lines of at most `max` bytes. A longer line is reported once as
/// an error and its bytes dropped up to the next newline.
pub struct LineSplitter {
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Complete(Vec<u8>),
    TooLong,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            max,
            skipping: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Line>) {
        let mut rest = chunk;
        while !rest.is_empty() {
            match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    if self.skipping {
                        self.skipping = false;
                    } else if self.buf.len() + i > self.max {
                        out.push(Line::TooLong);
                    } else {
                        self.buf.extend_from_slice(&rest[..i]);
                        out.push(Line::Complete(std::mem::take(&mut self.buf)));
                    }
                    self.buf.clear();
                    rest = &rest[i + 1..];
                }
                None => {
                    if !self.skipping {
                        if self.buf.len() + rest.len() > self.max {
                            out.push(Line::TooLong);
                            self.buf.clear();
                            self.skipping = true;
                        } else {
                            self.buf.extend_from_slice(rest);
                        }
                    }
                    rest = &[];
                }
            }
        }
    }

    /// Bytes of an unfinished line (never applied).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// How one run of the stream child ended.
#[derive(Debug)]
enum End {
    Cancelled,
    Aborted(StreamStopped),
    /// Exited or could not start; restart after the backoff.
    Restart(StreamStopped),
    /// Silent too long with `restart_on_silence`.
    Hung,
    /// Its executable was replaced (a load sensor: restarted at once, as sge_execd does).
    Replaced,
}

fn spec_of(task: &ProbeTask) -> Option<&StreamSpec> {
    match &task.kind {
        crate::config::ProbeKind::Stream(s) => Some(s),
        _ => None,
    }
}

/// Keep the stream process running and its values in the store until cancelled.
pub async fn supervise(
    task: Arc<ProbeTask>,
    ctx: ProbeContext,
    store: Arc<Store>,
    stats: Arc<Stats>,
    cancel: CancellationToken,
) {
    let Some(spec) = spec_of(&task).cloned() else {
        return;
    };
    let mut sink = Sink::new(task.clone(), store, &stats);
    let mut backoff = BACKOFF_START;
    loop {
        let began = Instant::now();
        let mut said_something = false;
        let end = run_child(&spec, &ctx, &mut sink, &cancel, &mut said_something).await;
        // What the log held back of this run is said once it has ended.
        sink.log().flush(&task.name);
        let why = match end {
            End::Cancelled => return,
            End::Aborted(why) => {
                let why = Failure::new(why);
                // `why` ends with the child's last stderr line: escaped for the journal too.
                tracing::warn!(probe = %task.name, "{}; not restarted", crate::text::escape(&why.to_string()));
                sink.record_all(&Reading::Failed(why));
                cancel.cancelled().await;
                return;
            }
            End::Hung => {
                tracing::warn!(probe = %task.name, "silent for {}; restarting it", humantime::format_duration(task.stale_after));
                None
            }
            End::Replaced => {
                tracing::info!(probe = %task.name, "its executable changed; restarting it");
                sink.stats().restarts.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            End::Restart(why) => Some(why),
        };
        if said_something && began.elapsed() >= BACKOFF_RESET_AFTER {
            backoff = BACKOFF_START;
        }
        if let Some(why) = why {
            let why = Failure::new(Restarting {
                why,
                after: backoff,
            });
            tracing::warn!(probe = %task.name, "{}", crate::text::escape(&why.to_string()));
            sink.record_all(&Reading::Failed(why));
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_CAP);
        sink.stats().restarts.fetch_add(1, Ordering::Relaxed);
    }
}

/// The exec probe's child spec, with the stream's stdin.
fn stream_child_spec(
    task: &ProbeTask,
    spec: &StreamSpec,
    ctx: &ProbeContext,
    env: child::Env,
) -> Result<(child::ChildSpec, std::sync::Arc<str>), SpawnRefused> {
    let (mut child_spec, user) = exec::child_spec(task, &spec.exec, ctx, env)?;
    child_spec.stdin_pipe = spec.stdin == StdinMode::Signal;
    Ok((child_spec, user))
}

/// How a stream child is watched: the format's goodbye before it is stopped, the rest of
/// its group ended with the leader; `stdin: signal` ticks, the read bound and silence are
/// the daemon's ([`run_child`]), a deadline and one tick `--once`'s ([`first_values`]).
fn watch<'a>(spec: &StreamSpec, grace: Duration) -> Watch<'a> {
    let goodbye = match &spec.exec.format.def().stream {
        Streaming::Blocks(blocks) => blocks.goodbye,
        Streaming::Lines(_) | Streaming::Sessions(_) | Streaming::No => None,
    };
    Watch {
        deadline: None,
        cancel: None,
        ticks: Ticks::None,
        bytes_per_sec: None,
        silence: None,
        after_exit: AfterExit::EndTheRest,
        cap_ends_it: false,
        grace,
        goodbye,
        quick_exit: None,
    }
}

/// Run the child once, applying its lines, until it exits, hangs or the probe is cancelled.
async fn run_child(
    spec: &StreamSpec,
    ctx: &ProbeContext,
    sink: &mut Sink,
    cancel: &CancellationToken,
    said_something: &mut bool,
) -> End {
    let task = &sink.task_arc();
    let env = stream_env(task, spec, &ctx.host);
    let (mut child_spec, _user) = match stream_child_spec(task, spec, ctx, env) {
        Ok(c) => c,
        Err(e) => return End::Restart(StreamStopped::Refused(e.into())),
    };
    // Lines are applied as they come; nothing of stdout needs keeping.
    child_spec.stdout_cap = 0;
    let (mut child, mut reader) = match Child::start(&child_spec) {
        Ok(c) => c,
        Err(e) => return End::Restart(StreamStopped::Spawn(e.into())),
    };
    let mut lines = LineSplitter::new(MAX_LINE);
    let mut updates = Updates::new(spec.exec.format);
    let mut err_lines = LineSplitter::new(4096);
    let mut batch = Vec::new();
    let mut marked_stale = false;
    let mut dropped_ticks = 0u64;
    // A load sensor asked on stdin is restarted when its executable changes, as sge_execd
    // does: what it was started from is looked at after each report (one stat an interval).
    let program = &child_spec.program;
    let started_from = spec
        .exec
        .format
        .def()
        .stream
        .asked_on_stdin()
        .then(|| modified(program))
        .flatten();
    let mut replaced = false;
    let watch = Watch {
        cancel: Some(cancel),
        // The first tick is at once: a child started (or restarted) is asked for values now.
        ticks: match spec.stdin {
            StdinMode::Signal => Ticks::Every(task.interval),
            StdinMode::None => Ticks::None,
        },
        bytes_per_sec: Some(STREAM_BYTES_PER_SEC),
        silence: Some(task.stale_after),
        ..watch(spec, child_spec.grace)
    };
    let driven = drive(&mut child, &mut reader, &watch, |event| match event {
        Event::Stdout(chunk) => {
            let cpu = crate::stats::thread_cpu();
            let mut flow = Flow::Continue;
            lines.push(chunk, &mut batch);
            for line in batch.drain(..) {
                *said_something = true;
                let began = std::time::Instant::now();
                let update = updates.take(&task.name, line, sink.log().declared());
                if update.is_report() {
                    flow = Flow::Heard;
                    marked_stale = false;
                }
                updates::apply(sink, spec, update, began);
            }
            let spent = crate::stats::thread_cpu().saturating_sub(cpu);
            sink.stats()
                .agent_cpu_ns
                .fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
            if flow == Flow::Heard && started_from.is_some() && modified(program) != started_from {
                replaced = true;
                return Flow::Stop;
            }
            flow
        }
        Event::Stderr(chunk) => {
            let cpu = crate::stats::thread_cpu();
            let mut got = Vec::new();
            err_lines.push(chunk, &mut got);
            for l in got {
                if let Line::Complete(l) = l {
                    let text = String::from_utf8_lossy(&l);
                    let now = std::time::Instant::now();
                    sink.log()
                        .stderr(&task.name, &text, "stream probe wrote to stderr", now);
                }
            }
            let spent = crate::stats::thread_cpu().saturating_sub(cpu);
            sink.stats()
                .agent_cpu_ns
                .fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
            Flow::Continue
        }
        Event::TickDropped => {
            dropped_ticks += 1;
            sink.stats().skipped_overlap.fetch_add(1, Ordering::Relaxed);
            // Once per run, and again at each power of two: a stuck child is heard without
            // a line per interval.
            if dropped_ticks.is_power_of_two() {
                tracing::warn!(probe = %task.name, dropped = dropped_ticks, "stdin signal dropped: the stream child is not reading its stdin");
            }
            Flow::Continue
        }
        Event::Silent if spec.restart_on_silence => {
            sink.record_all(&Reading::Stale(silence_text(task)));
            Flow::Stop
        }
        Event::Silent => {
            if !std::mem::replace(&mut marked_stale, true) {
                tracing::warn!(probe = %task.name, "{}", silence_text(task));
                sink.record_all(&Reading::Stale(silence_text(task)));
            }
            Flow::Continue
        }
    })
    .await;
    // What the child declared dies with it: the next child starts with the room again.
    let (bytes, entries) = updates.charged();
    sink.log().declared().release(bytes, entries);
    match driven.ended {
        Ended::Cancelled => return End::Cancelled,
        Ended::Stopped if replaced => return End::Replaced,
        // Else only silence stops a stream from here.
        Ended::Stopped => return End::Hung,
        Ended::Exited | Ended::Deadline | Ended::Overflow => {}
    }
    if lines.pending() > 0 {
        tracing::debug!(probe = %task.name, bytes = lines.pending(), "stream ended inside a line; the partial line is dropped");
    }
    if let Some(last) = updates.finish() {
        tracing::debug!(probe = %task.name, "the stream exited inside an update; its lines are applied as HTCondor does");
        updates::apply(sink, spec, last, std::time::Instant::now());
    }

    let exit = child.exit().unwrap_or(Exit::Unreaped);
    let stderr = reader.stderr.text();
    let said = stderr.lines().rev().map(str::trim).find(|l| !l.is_empty());
    let exited = Exited {
        exit,
        said: said.map(str::to_owned),
    };
    if exit == Exit::Code(ELIM_ABORT_VALUE) {
        End::Aborted(StreamStopped::Aborted(exited))
    } else {
        End::Restart(StreamStopped::Exited(exited))
    }
}

/// When `program` was last modified; `None` when it cannot be read (a sensor removed under
/// its running process counts as changed: its restart says why it cannot start).
fn modified(program: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(program).and_then(|m| m.modified()).ok()
}

fn silence_text(task: &ProbeTask) -> String {
    format!(
        "stream silent for {} (silence)",
        humantime::format_duration(task.stale_after)
    )
}

/// `--once` / `probe NAME`: start the stream, take the first line that gives values (for kv:
/// until every fed resource has one or a line that is not `name = value` ends the set; for
/// classad: the ads, each ended by `-`, until every fed resource has a value), or
/// fail at the task timeout (for a stream, by default one interval plus grace:
/// [`crate::config::probe_spec::default_stream_timeout`]); then stop the group.
pub async fn first_values(task: &ProbeTask, ctx: &ProbeContext) -> ProbeRun {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let Some(spec) = spec_of(task) else {
        return ProbeRun::all_failed(
            task,
            started,
            t0.elapsed(),
            Outcome::Failed,
            RunFailure::NoFirstValues(NoFirstValues::new(NoValues::NotAStream, "")),
        );
    };
    let env = stream_env(task, spec, &ctx.host);
    let mut detail = ExecDetail::new(spec.exec.command.as_slice().into(), "".into(), &env);
    let failed = |detail: ExecDetail, outcome, why: RunFailure| {
        let mut run = ProbeRun::all_failed(task, started, t0.elapsed(), outcome, why);
        run.exec = Some(detail);
        run
    };
    let (child_spec, user) = match stream_child_spec(task, spec, ctx, env) {
        Ok(c) => c,
        Err(e) => return failed(detail, Outcome::Failed, RunFailure::Refused(e.into())),
    };
    detail.argv = exec::argv_of(&child_spec);
    detail.user = user;
    let (mut child, mut reader) = match Child::start(&child_spec) {
        Ok(c) => c,
        Err(e) => return failed(detail, Outcome::Failed, RunFailure::Spawn(e.into())),
    };
    let mut lines = LineSplitter::new(MAX_LINE);
    let mut batch = Vec::new();
    let mut gathered = Gathered::new(spec.exec.format, spec.declared_state);
    let mut result: Option<FirstValues> = None;
    let watch = Watch {
        deadline: Some(t0 + task.timeout),
        ticks: match spec.stdin {
            StdinMode::Signal => Ticks::Once,
            StdinMode::None => Ticks::None,
        },
        ..watch(spec, child_spec.grace)
    };
    let driven = drive(&mut child, &mut reader, &watch, |event| {
        let Event::Stdout(chunk) = event else {
            return Flow::Continue;
        };
        lines.push(chunk, &mut batch);
        for line in batch.drain(..) {
            result = gathered.take(task, spec, line);
            if result.is_some() {
                return Flow::Stop;
            }
        }
        Flow::Continue
    })
    .await;
    // Stopped at the deadline, it has exited now, but not by itself.
    let result = result.unwrap_or_else(|| gathered.at_end(driven.exited_before_end));
    let exit = child.exit();
    detail.exit = exit;
    detail.stderr = reader.stderr.text();
    detail.stdout = std::mem::take(&mut reader.stdout);
    drop(reader);
    let duration = t0.elapsed();
    let (outcome, why) = match result {
        FirstValues::Got => {
            let mut run = gathered.into_run(task, spec, (started, duration), &detail.stdout);
            run.exec = Some(detail);
            return run;
        }
        FirstValues::TimedOut => (
            Outcome::TimedOut,
            NoValues::TimedOut {
                after: task.timeout,
                missing: gathered.missing(),
            },
        ),
        FirstValues::Bad(why) => (Outcome::Failed, NoValues::Rejected(why)),
        FirstValues::Ended if exit == Some(Exit::Code(ELIM_ABORT_VALUE)) => {
            (Outcome::Failed, NoValues::Aborted)
        }
        FirstValues::Ended => (Outcome::Failed, NoValues::Ended(exit)),
    };
    let why = RunFailure::NoFirstValues(NoFirstValues::new(why, &detail.stderr));
    let mut run = ProbeRun::all_failed(task, started, duration, outcome, why);
    run.exec = Some(detail);
    run
}
