//! Where every run of a probe goes, whatever its kind: an exec, file or builtin run, and a
//! stream's next update (a line, a block, an ad) alike. One [`Sink`] per probe counts the run
//! ([`ProbeStats`]), logs what its output and failure say under the probe's [`OutputLog`]
//! limits, and records its readings in the [`Store`]. So a stream's updates are counted,
//! timed and shown like any other probe's runs (`status`, `xce_probe_runs_total`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::output_log::OutputLog;
use super::{Outcome, ProbeRun};
use crate::config::probe_spec::FailureLog;
use crate::plan::ProbeTask;
use crate::stats::{ProbeStats, Stats};
use crate::store::Store;
use crate::value::Reading;

/// One probe's road from a run to the store (see the module's text).
pub struct Sink {
    task: Arc<ProbeTask>,
    store: Arc<Store>,
    stats: Arc<ProbeStats>,
    log: OutputLog,
}

impl Sink {
    pub fn new(task: Arc<ProbeTask>, store: Arc<Store>, stats: &Stats) -> Self {
        let stats = stats.probe(&task.name);
        let log = OutputLog::with_declared_limit(task.kind.declared_state_budget());
        Self {
            task,
            store,
            stats,
            log,
        }
    }

    pub fn task(&self) -> &ProbeTask {
        &self.task
    }

    pub fn task_arc(&self) -> Arc<ProbeTask> {
        self.task.clone()
    }

    /// The probe's counters (a stream adds its read CPU, dropped ticks and restarts here).
    pub fn stats(&self) -> &ProbeStats {
        &self.stats
    }

    /// The probe's log limits (a stream's stderr lines, and their summary when it ends).
    pub fn log(&mut self) -> &mut OutputLog {
        &mut self.log
    }

    /// Count, log and record one run (its readings move into the store).
    pub fn take(&mut self, run: ProbeRun) {
        count(&self.stats, &run);
        self.log.log_run(&self.task.name, &run);
        self.say_declared_budget();
        self.log_failure(&run);
        let at = run.started + run.duration;
        for (i, (name, reading)) in run.readings.into_iter().enumerate() {
            let instance = self.task.instance_of(i, &name);
            self.store.record(&name, instance, reading, at);
        }
    }

    /// Warn, once per probe, when its declared-state budget has refused something (a
    /// stream's session charges it through [`OutputLog::declared`]).
    pub fn say_declared_budget(&mut self) {
        self.log.say_declared_budget(&self.task.name);
    }

    /// A stream's update that did not parse (a line, a block): counted as rejected and
    /// logged under the malformed lines' limit; with `fail`, every fed resource fails with
    /// `why` (their previous values stand until stale), else nothing is recorded.
    pub fn reject(&mut self, why: &str, fail: bool) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        self.malformed(why);
        if fail {
            self.record_all(&Reading::Failed(why.into()));
        }
    }

    /// Log a malformed part of an update that still applied (a block's bad line).
    pub fn malformed(&mut self, why: &str) {
        self.log.malformed(&self.task.name, why, Instant::now());
    }

    /// What befell the probe as a whole, not a run (a stream child that exited, went
    /// silent, aborted): every fed resource gets `reading`, nothing is counted.
    pub fn record_all(&self, reading: &Reading) {
        let now = SystemTime::now();
        for f in &self.task.feeds {
            self.store
                .record(&f.name, &f.instance, reading.clone(), now);
        }
    }

    /// Say why a run failed when it is news, as its kind's [`FailureLog`] says.
    fn log_failure(&mut self, run: &ProbeRun) {
        let task = &self.task;
        let Some(err) = run.error() else {
            tracing::debug!(probe = %task.name, "ok");
            return;
        };
        if task.kind.failure_log() == FailureLog::RateLimited {
            self.log.malformed(&task.name, &err, Instant::now());
            return;
        }
        let previous = task
            .feeds
            .first()
            .and_then(|f| self.store.get(&f.name, &f.instance))
            .and_then(|r| r.error);
        if previous.map(|p| p.to_string()).as_ref() != Some(&err) {
            let stderr = run.exec.as_ref().map_or("", |e| e.stderr.as_str());
            tracing::warn!(probe = %task.name, outcome = run.outcome.as_str(), stderr = %crate::text::escape(stderr.trim()), "{}", crate::text::escape(&err));
        }
    }
}

/// Count one run in its probe's counters.
fn count(s: &ProbeStats, run: &ProbeRun) {
    let counter = match run.outcome {
        Outcome::Ok => {
            s.last_success_ms
                .store(crate::value::unix_ms(SystemTime::now()), Ordering::Relaxed);
            &s.ok
        }
        Outcome::Failed => &s.failed,
        Outcome::TimedOut => &s.timeout,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    s.last_duration_us
        .store(run.duration.as_micros() as u64, Ordering::Relaxed);
    s.agent_cpu_ns
        .fetch_add(run.agent_cpu.as_nanos() as u64, Ordering::Relaxed);
    s.unexpected_names.fetch_add(
        (run.unexpected.len() + run.unexpected_more) as u64,
        Ordering::Relaxed,
    );
    s.duration.observe(run.duration);
}
