//! Running one probe once: builtin, exec, file, or a stream until its first values. A run
//! (and each update of a long-running stream, `stream.rs`) yields one [`ProbeRun`]: one
//! reading per resource the probe feeds, plus what an admin needs to debug it, which one
//! [`sink::Sink`] counts, logs and records for every kind.

pub mod builtin;
pub mod capture;
pub mod cgroup;
pub mod child;
pub mod exec;
pub mod failure;
pub mod fd;
pub mod file;
pub mod file_reader;
pub mod open_files;
pub mod output_log;
pub mod path;
pub mod plugin_state;
pub mod read_error;
pub mod reader_creds;
pub mod reaper;
pub mod resolve;
pub mod security;
pub mod sink;
pub mod stream;
pub mod supervisor;

pub use failure::RunFailure;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::ProbeKind;
use crate::output;
use crate::plan::ProbeTask;
use crate::value::{Failure, Reading};
use failure::ParseFailure;

/// Where builtin probes get their values: the shared sampler's latest snapshot.
pub trait BuiltinSource: Send + Sync {
    /// `None`: this host has no such index.
    fn reading(&self, index: &str) -> Option<Reading>;
}

/// What every probe run may need from the agent.
#[derive(Clone)]
pub struct ProbeContext {
    pub host: String,
    pub plugin_dir: PathBuf,
    /// Default user for exec/stream probes when the agent runs as root.
    pub run_as: String,
    pub builtin: Arc<dyn BuiltinSource>,
    /// File reads: their own threads, and the bound on reads stuck in the kernel.
    pub files: Arc<file_reader::FileReads>,
    /// The agent's containment and its caches (users, script verdicts): made once by
    /// whoever runs probes, shared by every run.
    pub supervisor: Arc<supervisor::Supervisor>,
}

/// How a run went, for counters and the `--once` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Failed,
    TimedOut,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timeout",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProbeRun {
    pub started: SystemTime,
    pub duration: Duration,
    pub outcome: Outcome,
    /// One per resource the probe feeds, in the task's feed order.
    pub readings: Vec<(String, Reading)>,
    /// Names the output reported that the probe does not provide (logged once, ignored):
    /// the first [`UNEXPECTED_LISTED`] of them.
    pub unexpected: Vec<String>,
    /// How many more there were (counted, not listed).
    pub unexpected_more: usize,
    /// Agent CPU spent parsing the run's output (on the blocking pool).
    pub agent_cpu: Duration,
    /// For exec probes: the child's details.
    pub exec: Option<exec::ExecDetail>,
    /// Output lines that did not parse while the rest of the output still counted.
    pub bad_lines: Vec<String>,
    /// Why the run failed as a whole (each fed resource then fails with this same error).
    pub failure: Option<Arc<RunFailure>>,
}

impl ProbeRun {
    /// Every fed resource gets the same failure.
    pub fn all_failed(
        task: &ProbeTask,
        started: SystemTime,
        duration: Duration,
        outcome: Outcome,
        failure: RunFailure,
    ) -> Self {
        // One shared error for the run and every resource it feeds.
        let failure = Arc::new(failure);
        let why = Failure::shared(failure.clone());
        Self {
            started,
            duration,
            outcome,
            readings: task
                .feeds
                .iter()
                .map(|f| (f.name.clone(), Reading::Failed(why.clone())))
                .collect(),
            unexpected: Vec::new(),
            unexpected_more: 0,
            agent_cpu: Duration::ZERO,
            exec: None,
            bad_lines: Vec::new(),
            failure: Some(failure),
        }
    }

    /// A run whose output parsed: one typed reading per fed resource; failed if any failed.
    pub fn from_pairs(
        task: &ProbeTask,
        started: SystemTime,
        duration: Duration,
        pairs: Vec<output::Pair>,
    ) -> Self {
        let (readings, unexpected) = readings_from_pairs(task, pairs);
        Self::parsed(started, duration, readings, unexpected, Vec::new())
    }

    /// A run whose output was read: failed if any reading failed, else ok.
    pub(crate) fn parsed(
        started: SystemTime,
        duration: Duration,
        readings: Vec<(String, Reading)>,
        unexpected: Vec<String>,
        bad_lines: Vec<String>,
    ) -> Self {
        let any_failed = readings
            .iter()
            .any(|(_, r)| matches!(r, Reading::Failed(_)));
        Self {
            started,
            duration,
            outcome: if any_failed {
                Outcome::Failed
            } else {
                Outcome::Ok
            },
            readings,
            unexpected,
            unexpected_more: 0,
            agent_cpu: Duration::ZERO,
            exec: None,
            bad_lines,
            failure: None,
        }
    }

    /// A run that gives one reading for the resource it is declared on (builtin, file).
    /// A failed or stale reading is a failed run; a pending one (a rate's first sample) is not.
    pub fn single(
        task: &ProbeTask,
        started: SystemTime,
        duration: Duration,
        reading: Reading,
    ) -> Self {
        let outcome = match reading {
            Reading::Failed(_) | Reading::Stale(_) => Outcome::Failed,
            Reading::Ok(_) | Reading::Pending(_) => Outcome::Ok,
        };
        Self {
            started,
            duration,
            outcome,
            readings: vec![(task.name.clone(), reading)],
            unexpected: Vec::new(),
            unexpected_more: 0,
            agent_cpu: Duration::ZERO,
            exec: None,
            bad_lines: Vec::new(),
            failure: None,
        }
    }

    /// A finished run's parsed output: one reading per fed resource, picked by `select`.
    /// A resource the output leaves out keeps its last value (pending) until `stale_after`
    /// says otherwise, with the reason; but a run that gives no fed resource any value is a
    /// failed run, unless its format calls empty output an answer and it printed nothing.
    pub fn from_output(
        task: &ProbeTask,
        started: SystemTime,
        duration: Duration,
        how: (output::Format, &output::Selection),
        parsed: &output::Parsed,
        text: &str,
    ) -> Self {
        let (format, selection) = how;
        let mut readings: Vec<(String, Reading)> = Vec::with_capacity(task.feeds.len());
        let mut absent = Vec::new();
        for feed in &task.feeds {
            let pick = selection.pick_for(&feed.name, feed.is_shared());
            match output::select::reading(format, &pick, parsed, &feed.name, feed.valtype) {
                Some(r) => readings.push((feed.name.clone(), r)),
                None => {
                    absent.push(readings.len());
                    let why =
                        output::select::absent_reason(format, &pick, parsed, text, &feed.name);
                    readings.push((feed.name.clone(), Reading::Pending(why)));
                }
            }
        }
        let any_value = readings.iter().any(|(_, r)| matches!(r, Reading::Ok(_)));
        let said_nothing = format.def().empty_is_an_answer && text.trim().is_empty();
        if !any_value && !said_nothing {
            for i in absent {
                if let Reading::Pending(why) = &readings[i].1 {
                    readings[i].1 = Reading::Failed(why.clone().into());
                }
            }
        }
        let (mut unexpected, mut unexpected_more) = (Vec::new(), 0);
        if !format.selectable() {
            let fed = feed_names(task);
            for s in parsed
                .samples
                .iter()
                .filter(|s| !fed.contains(s.name.as_str()))
            {
                if unexpected.len() < UNEXPECTED_LISTED {
                    unexpected.push(s.name.clone());
                } else {
                    unexpected_more += 1;
                }
            }
        }
        let mut bad_lines: Vec<String> = parsed.bad_lines.iter().map(ToString::to_string).collect();
        if parsed.bad_lines_more > 0 {
            bad_lines.push(format!(
                "and {} more lines (the first {} are listed)",
                parsed.bad_lines_more,
                parsed.bad_lines.len()
            ));
        }
        let mut run = Self::parsed(started, duration, readings, unexpected, bad_lines);
        run.unexpected_more = unexpected_more;
        run
    }

    /// Whether the run counts as ok: what `--once` and `probe NAME` both exit by.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// The error shown (and logged) for the run as a whole, if any, as text. Pending is not
    /// an error: a rate's first sample, or a name an ELIM line did not carry this time, is
    /// normal.
    pub fn error(&self) -> Option<String> {
        self.readings.iter().find_map(|(_, r)| match r {
            Reading::Failed(e) => Some(e.to_string()),
            Reading::Stale(e) => Some(e.clone()),
            Reading::Ok(_) | Reading::Pending(_) => None,
        })
    }
}

/// Names outside `provides:` one run lists (its output may hold a million).
pub const UNEXPECTED_LISTED: usize = 1000;

/// Turn parsed `name -> raw` pairs into one typed reading per fed resource.
pub fn readings_from_pairs(
    task: &ProbeTask,
    pairs: Vec<output::Pair>,
) -> (Vec<(String, Reading)>, Vec<String>) {
    // One pass over the pairs, one look-up per feed: a line or an output of many pairs is
    // never scanned once per fed resource. The first pair of a name counts, as before.
    let mut by_name: HashMap<&str, &str> = HashMap::with_capacity(pairs.len());
    for (n, v) in &pairs {
        by_name.entry(n.as_str()).or_insert(v.as_str());
    }
    let readings = task
        .feeds
        .iter()
        .map(|feed| {
            let r = match by_name.get(feed.name.as_str()) {
                Some(raw) => match feed.valtype.parse(raw) {
                    Ok(v) => Reading::Ok(v),
                    Err(e) => Reading::Failed(Failure::new(e)),
                },
                // Not reported this run (ELIM style: a line may carry a subset). The last good
                // value stands until it goes stale; a name never reported stays pending.
                None => Reading::Pending(format!("{:?} is not in the probe's output", feed.name)),
            };
            (feed.name.clone(), r)
        })
        .collect();
    let fed = feed_names(task);
    let unexpected = pairs
        .into_iter()
        .filter(|(n, _)| !fed.contains(n.as_str()))
        .map(|(n, _)| n)
        .collect();
    (readings, unexpected)
}

/// The names a task feeds, and those of its `provides:` this host drops (another host reports
/// them): none is a name outside `provides:`.
fn feed_names(task: &ProbeTask) -> FedNames<'_> {
    if task.feeds.len() + task.dropped.len() <= FEW_NAMES {
        FedNames::Few(task)
    } else {
        FedNames::Many(names_of(task).collect())
    }
}

fn names_of(task: &ProbeTask) -> impl Iterator<Item = &str> {
    let dropped = task.dropped.iter().map(String::as_str);
    task.feeds.iter().map(|f| f.name.as_str()).chain(dropped)
}

/// Up to this many names are looked up by a scan (most probes feed one resource: no set to
/// build at every run); more, in a set, so that a look-up per output name costs no scan.
const FEW_NAMES: usize = 8;

enum FedNames<'a> {
    Few(&'a ProbeTask),
    Many(HashSet<&'a str>),
}

impl FedNames<'_> {
    fn contains(&self, name: &str) -> bool {
        match self {
            FedNames::Few(task) => names_of(task).any(|n| n == name),
            FedNames::Many(set) => set.contains(name),
        }
    }
}

/// Output up to this size is parsed where the run is, on the runtime's thread: it takes
/// microseconds, less than the hop to the blocking pool and back would cost every run.
/// Longer output goes to the blocking pool (`off_runtime`).
pub const INLINE_PARSE_BYTES: usize = 4 * 1024;

/// Run `work` here, and the CPU this thread spent on it (a small output's parse).
pub(crate) fn in_place<T>(work: impl FnOnce() -> T) -> (T, Duration) {
    let cpu = crate::stats::thread_cpu();
    let answer = work();
    (answer, crate::stats::thread_cpu().saturating_sub(cpu))
}

/// Run `work` (parsing a finished run's output, typing its values) on the blocking pool,
/// off the async runtime's threads, and wait for it at most `timeout` (the probe's): the
/// status socket, the link and the other probes go on meanwhile. `Err` says why there is
/// no answer (the work outlived the timeout, and is left to finish on its own; or it
/// panicked).
pub(crate) async fn off_runtime<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<(T, Duration), RunFailure> {
    let handle = tokio::task::spawn_blocking(move || in_place(work));
    match tokio::time::timeout(timeout, handle).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(RunFailure::Parse(ParseFailure::Panicked(e))),
        Err(_) => Err(RunFailure::Parse(ParseFailure::TimedOut(timeout))),
    }
}

/// What a probe's runs reuse: made on its first run and kept by its loop (the probe and
/// the context of a loop never change: a reload starts a new loop).
#[derive(Debug, Default)]
pub struct RunCache {
    /// An exec probe's environment and the strings its exec takes (20-odd allocations a run
    /// otherwise: BENCHMARKS.md section 21d).
    env: std::sync::OnceLock<child::Env>,
    /// An exec probe's resolved command and prepared child spec ([`exec::Launch`]).
    launch: std::sync::Mutex<Option<Arc<exec::Launch>>>,
}

/// Run one probe once; a stream: until its first values (`--once`, `probe NAME`).
pub async fn run_once(task: &ProbeTask, ctx: &ProbeContext) -> ProbeRun {
    run_reusing(task, ctx, &RunCache::default()).await
}

/// [`run_once`] for a probe's loop, with what its earlier runs made.
pub async fn run_reusing(task: &ProbeTask, ctx: &ProbeContext, cache: &RunCache) -> ProbeRun {
    let started = SystemTime::now();
    let t0 = std::time::Instant::now();
    match &task.kind {
        ProbeKind::Builtin { index } => {
            let reading = ctx.builtin.reading(index).unwrap_or_else(|| {
                Reading::Failed(
                    format!("builtin index {index:?} is not available on this host").into(),
                )
            });
            ProbeRun::single(task, started, t0.elapsed(), reading)
        }
        ProbeKind::Exec(spec) => exec::run(task, spec, ctx, cache, started).await,
        ProbeKind::File(spec) => file::run(task, spec, ctx, started).await,
        ProbeKind::Stream(_) => stream::first_values(task, ctx).await,
    }
}
