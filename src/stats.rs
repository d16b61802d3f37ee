//! Counters per probe (runs by outcome, durations, restarts), written by each probe's
//! sink (`probe::sink`), and the scheduler's lateness, read by the metrics endpoint. Lock-free: counting a run never waits
//! on a scrape.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Per-probe counters, read by the metrics endpoint.
#[derive(Debug, Default)]
pub struct ProbeStats {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub timeout: AtomicU64,
    /// A stream's updates that did not parse (a line, a block): none of it applied.
    pub rejected: AtomicU64,
    pub skipped_overlap: AtomicU64,
    pub restarts: AtomicU64,
    /// Agent CPU (ns, on the thread that did it) spent on the probe's output: a stream's
    /// lines read, parsed and applied; an exec or file run's output parsed.
    pub agent_cpu_ns: AtomicU64,
    /// Names the probe's output gave that are not in its `provides:` (each time; counted,
    /// not remembered).
    pub unexpected_names: AtomicU64,
    pub last_success_ms: AtomicU64,
    pub last_duration_us: AtomicU64,
    /// Unix ms of the next scheduled run (0: not scheduled, e.g. a stream).
    pub next_due_ms: AtomicU64,
    pub duration: DurationHistogram,
}

/// Run durations in fixed buckets (seconds, Prometheus `le` bounds): lock-free counters, so
/// recording a run never waits on a scrape.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    /// Non-cumulative: `buckets[i]` counts runs in `(BOUNDS[i-1], BOUNDS[i]]`; the last is +Inf.
    pub buckets: [AtomicU64; DurationHistogram::BOUNDS.len() + 1],
    pub sum_us: AtomicU64,
    pub count: AtomicU64,
}

impl DurationHistogram {
    pub const BOUNDS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = Self::BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(Self::BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

/// How far behind its timetable the scheduler runs: a run starts at its slot unless every
/// place under `max_parallel` is taken (or the agent's threads are starved), and then waits.
#[derive(Debug, Default)]
pub struct ScheduleStats {
    /// Runs past their slot that wait for a place under `max_parallel` now.
    pub waiting: AtomicU64,
    /// From each timed run's slot to its start (streams have no slots).
    pub start_delay: DurationHistogram,
}

impl ScheduleStats {
    /// Count a run as waiting until the guard is dropped (it started, or was cancelled).
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(&self.waiting)
    }
}

/// One run in [`ScheduleStats::waiting`] while it lives.
#[derive(Debug)]
pub struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    probes: Mutex<BTreeMap<String, Arc<ProbeStats>>>,
    pub schedule: ScheduleStats,
}

impl Stats {
    pub fn probe(&self, name: &str) -> Arc<ProbeStats> {
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// The counters of `name`, if it ever counted anything (a lookup, no insert).
    pub fn get(&self, name: &str) -> Option<Arc<ProbeStats>> {
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub fn all(&self) -> Vec<(String, Arc<ProbeStats>)> {
        self.probes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// CPU time this thread has used (CLOCK_THREAD_CPUTIME_ID): what a piece of work cost the
/// agent, measured around it on the thread that does it.
pub fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
