//! When probes run. One timer per probe, at a deterministic offset within its interval
//! (`plan::splay`: by default the host's one offset, so a host's probes fall due together and
//! share a wake-up; with `spread: probes`, a hash of host and name) aligned to the wall clock,
//! so a cluster's nodes spread out and keep their slots across restarts. A probe still
//! running at its next tick is skipped and counted, never overlapped; a global budget caps
//! how many run at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::timer::sleep_until;
use futures::FutureExt as _;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ProbeKind;
use crate::plan::{Plan, ProbeTask};
use crate::probe::sink::Sink;
use crate::probe::{self, ProbeContext, ProbeRun};
use crate::reload::{probe_changes, Changes, ProbeKey};
use crate::stats::Stats;
use crate::store::Store;

/// After a (re)start the first runs spread over at most this long, not a whole interval:
/// an hourly probe must not leave its value pending for an hour.
pub const STARTUP_SPREAD: Duration = Duration::from_secs(15);

/// How long after `now` a probe's first run is: at its offset within `min(interval,
/// STARTUP_SPREAD)`, aligned to the wall clock as its later runs are. So the first runs of a
/// host's probes whose offsets agree modulo that span (under `spread: host` all those at 15 s
/// and its multiples, and each interval's probes among themselves) fall due at one instant and
/// share a wake-up, and a cluster restarted at once still spreads over the span.
pub fn first_run_after(now: SystemTime, interval: Duration, splay: Duration) -> Duration {
    let span = interval.min(STARTUP_SPREAD);
    let offset = Duration::from_millis((splay.as_millis() % span.as_millis().max(1)) as u64);
    next_slot(now, span, offset)
}

/// The next wall-clock slot of a probe: the first t > now with (t - splay) % interval == 0.
pub fn next_slot(now: SystemTime, interval: Duration, splay: Duration) -> Duration {
    // In u128: no interval, however long, can overflow this.
    let interval_ms = interval.as_millis().max(1);
    let now_ms = u128::from(crate::value::unix_ms(now));
    let phase = (now_ms + interval_ms - splay.as_millis() % interval_ms) % interval_ms;
    Duration::from_millis(u64::try_from(interval_ms - phase).unwrap_or(u64::MAX))
}

/// Record a run's readings (a one-shot pass, which counts and logs nothing: it prints).
pub fn record_run(store: &Store, task: &ProbeTask, run: &ProbeRun) {
    let at = run.started + run.duration;
    for (i, (name, reading)) in run.readings.iter().enumerate() {
        store.record(name, task.instance_of(i, name), reading.clone(), at);
    }
}

struct Running {
    cancel: CancellationToken,
    handle: JoinHandle<()>,
}

/// Owns one loop per probe of the current plan.
pub struct Scheduler {
    store: Arc<Store>,
    ctx: ProbeContext,
    budget: Arc<Semaphore>,
    pub stats: Arc<Stats>,
    running: BTreeMap<ProbeKey, Running>,
    /// The loops of stopped probes that are still ending (a stream in its SIGTERM grace).
    /// A probe started again waits for its entry here: its new run never runs beside its old.
    ending: BTreeMap<ProbeKey, JoinHandle<()>>,
    shutdown: CancellationToken,
    sweeper: JoinHandle<()>,
}

impl Scheduler {
    pub fn new(
        store: Arc<Store>,
        ctx: ProbeContext,
        max_parallel: usize,
        shutdown: CancellationToken,
    ) -> Self {
        let sweeper = tokio::spawn(sweep_loop(store.clone(), shutdown.clone()));
        Self {
            store,
            ctx,
            budget: Arc::new(Semaphore::new(max_parallel.max(1))),
            stats: Arc::new(Stats::default()),
            running: BTreeMap::new(),
            ending: BTreeMap::new(),
            shutdown,
            sweeper,
        }
    }

    pub fn context(&self) -> &ProbeContext {
        &self.ctx
    }

    /// Start every probe of `plan` (on a scheduler that runs none yet).
    pub fn start(&mut self, plan: &Plan) {
        self.apply(&probe_changes(&[], &plan.tasks, false), plan);
    }

    /// Execute the probes' part of `changes` (see `reload::diff`), whose new tasks are
    /// `plan`'s: stopped and restarted probes are cancelled (their process groups killed),
    /// started and restarted ones begin at their slot, kept ones are not touched.
    ///
    /// A restarted probe (or one removed and added back while it was still ending) starts
    /// once its old loop has ended, as LSF stops an elim before it starts the new one: a
    /// probe that holds a device, a port or a license seat could not start beside its old
    /// self, and two runs of one stream would report the same resources at once. The wait
    /// is at most the old run's SIGTERM grace; no other probe waits.
    pub fn apply(&mut self, changes: &Changes, plan: &Plan) {
        self.ending.retain(|_, h| !h.is_finished());
        for probe in changes.to_stop() {
            if let Some(r) = self.running.remove(probe) {
                r.cancel.cancel();
                // `running` and `ending` never hold one key both: a start takes the key
                // out of `ending`, so this insert replaces nothing.
                self.ending.insert(probe.clone(), r.handle);
            }
        }
        let mut starting = changes.to_start().peekable();
        if starting.peek().is_none() {
            return;
        }
        let tasks: HashMap<(&str, &str), &ProbeTask> = plan
            .tasks
            .iter()
            .map(|t| ((t.name.as_str(), t.instance.as_str()), t))
            .collect();
        for probe in starting {
            let Some(task) = tasks.get(&(probe.name.as_str(), probe.instance.as_str())) else {
                tracing::error!(%probe, "a change starts a probe its plan does not have (a bug: please report it)");
                continue;
            };
            let cancel = self.shutdown.child_token();
            let handle = tokio::spawn(after_old_loop(
                self.ending.remove(probe),
                cancel.clone(),
                probe_loop(
                    Arc::new((*task).clone()),
                    self.ctx.clone(),
                    self.store.clone(),
                    self.budget.clone(),
                    self.stats.clone(),
                    cancel.clone(),
                ),
            ));
            self.running
                .insert(probe.clone(), Running { cancel, handle });
        }
    }

    /// Stop every probe and wait for their loops (and so their children) to end.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for (_, r) in std::mem::take(&mut self.running) {
            r.cancel.cancel();
            let _ = r.handle.await;
        }
        for (_, h) in std::mem::take(&mut self.ending) {
            let _ = h.await;
        }
        let _ = (&mut self.sweeper).await;
    }
}

/// Run `new_loop` once the probe's `old` loop has ended, unless it was cancelled meanwhile.
/// The old loop is awaited even then: a later start of the probe waits on this one, and so
/// on the old loop through it.
async fn after_old_loop(
    old: Option<JoinHandle<()>>,
    cancel: CancellationToken,
    new_loop: impl std::future::Future<Output = ()>,
) {
    if let Some(old) = old {
        let _ = old.await;
    }
    if !cancel.is_cancelled() {
        new_loop.await;
    }
}

/// Sweeps are at least this far apart: values go stale within a second of their time.
const SWEEP_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// Age the store's values when one can go stale, not on a fixed tick: an idle agent whose
/// values are fresh for an hour wakes for them once an hour, not every second (an HPC job
/// feels every wake-up on its cores).
async fn sweep_loop(store: Arc<Store>, shutdown: CancellationToken) {
    loop {
        let now = SystemTime::now();
        store.sweep(now);
        let wait = store.next_stale_at(now).map(|at| {
            at.duration_since(now)
                .unwrap_or_default()
                .max(SWEEP_AT_MOST_EVERY)
        });
        let sleep = async {
            match wait {
                // Just past the time: a value exactly `stale_after` old is still fresh.
                Some(wait) => crate::timer::sleep(wait + Duration::from_millis(1)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = store.redeclared() => {}
            _ = sleep => {}
        }
    }
}

/// What one probe's loop and each of its runs share: made once per probe, borrowed by
/// each run (nothing cloned per tick).
struct Shared {
    task: Arc<ProbeTask>,
    ctx: ProbeContext,
    budget: Arc<Semaphore>,
    /// Where the runs go (a run at a time; the lock is never contended).
    sink: Mutex<Sink>,
    /// What the probe's runs reuse.
    cache: probe::RunCache,
    /// The scheduler's lateness (`ScheduleStats`) is counted here.
    stats: Arc<Stats>,
}

/// A run in flight, polled by its probe's loop: no task of its own, no hop between
/// runtime threads per run. Boxed so the run's large state machine is freed when the run
/// ends (an idle agent holds one loop per probe).
type InFlightRun<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

async fn probe_loop(
    task: Arc<ProbeTask>,
    ctx: ProbeContext,
    store: Arc<Store>,
    budget: Arc<Semaphore>,
    stats: Arc<Stats>,
    cancel: CancellationToken,
) {
    if let ProbeKind::Stream(_) = task.kind {
        // Boxed: inline, the supervisor's (large) state machine would make every probe's
        // loop future as big, and an idle agent holds one per probe (10,000 resources).
        Box::pin(probe::stream::supervise(task, ctx, store, stats, cancel)).await;
        return;
    }
    let probe_stats = stats.probe(&task.name);
    let first = first_run_after(SystemTime::now(), task.interval, task.splay);
    let mut next = later(first);
    let due = |after: Duration| {
        let at = SystemTime::now()
            .checked_add(after)
            .map_or(u64::MAX, crate::value::unix_ms);
        probe_stats.next_due_ms.store(at, Ordering::Relaxed);
    };
    due(first);
    let shared = Shared {
        sink: Mutex::new(Sink::new(task.clone(), store, &stats)),
        task,
        ctx,
        budget,
        cache: probe::RunCache::default(),
        stats,
    };
    let mut inflight: Option<InFlightRun<'_>> = None;
    // Skipped ticks are logged once per streak, not once per tick.
    let mut skipping = false;
    loop {
        let run_ended = async {
            match inflight.as_mut() {
                Some(run) => run.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Dropping the run drops its child: the group is killed.
            _ = cancel.cancelled() => break,
            _ = run_ended => {
                inflight = None;
                continue;
            }
            _ = sleep_until(next) => {}
        }
        let slot = next;
        let after = next_slot(SystemTime::now(), shared.task.interval, shared.task.splay);
        next = later(after);
        due(after);
        if inflight.is_some() {
            probe_stats.skipped_overlap.fetch_add(1, Ordering::Relaxed);
            if !std::mem::replace(&mut skipping, true) {
                tracing::warn!(probe = %shared.task.name, "still running at its next tick; this run is skipped (and later ones, until it ends)");
            }
            continue;
        }
        skipping = false;
        // A run that panics (a bug) ends that run, not the probe's loop: the next tick runs
        // it again, as when each run was a task of its own.
        let run = std::panic::AssertUnwindSafe(run_one(&shared, slot)).catch_unwind();
        inflight = Some(Box::pin(run.map(|ended| {
            if ended.is_err() {
                tracing::error!(probe = %shared.task.name, "a probe run panicked (a bug: please report it); it runs again at its next tick");
            }
        })));
    }
}

/// `now + after`, saturating at a year out (the config bounds intervals well below that).
fn later(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .or_else(|| now.checked_add(Duration::from_secs(366 * 86_400)))
        .unwrap_or(now)
}

/// One run of the probe whose slot was `slot`; how late it starts is counted.
async fn run_one(shared: &Shared, slot: Instant) {
    let schedule = &shared.stats.schedule;
    let _permit = match uses_budget(&shared.task) {
        true => {
            let _waiting = schedule.waiting();
            match shared.budget.acquire().await {
                Ok(p) => Some(p),
                Err(_) => return,
            }
        }
        false => None,
    };
    schedule.start_delay.observe(slot.elapsed());
    let run = probe::run_reusing(&shared.task, &shared.ctx, &shared.cache).await;
    shared
        .sink
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take(run);
}

/// File reads have their own capacity (`file_reader`): a hung filesystem must not take the
/// budget that exec probes and the builtins run on.
fn uses_budget(task: &ProbeTask) -> bool {
    !matches!(task.kind, ProbeKind::File(_))
}

/// Run every probe of `plan` once, at most `max_parallel` at a time, record the readings,
/// and return each run in plan order (`--once`).
pub async fn run_all_once(
    plan: &Plan,
    ctx: &ProbeContext,
    store: &Store,
    max_parallel: usize,
    running: &InFlight,
) -> Vec<(ProbeTask, ProbeRun)> {
    let budget = Arc::new(Semaphore::new(max_parallel.max(1)));
    let mut handles = Vec::new();
    for task in plan.tasks.iter().cloned() {
        let (ctx, budget, running) = (ctx.clone(), budget.clone(), running.clone());
        handles.push(tokio::spawn(async move {
            let _permit = match uses_budget(&task) {
                true => budget.acquire_owned().await.ok(),
                false => None,
            };
            running.started(&task);
            let run = probe::run_once(&task, &ctx).await;
            running.ended(&task.name);
            (task, run)
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        if let Ok((task, run)) = h.await {
            record_run(store, &task, &run);
            out.push((task, run));
        }
    }
    out
}

/// The probes of a one-shot pass that are running now, with when each started and its
/// deadline, for `--once` to say what it waits for.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<std::sync::Mutex<BTreeMap<String, (Instant, Duration)>>>);

impl InFlight {
    fn started(&self, task: &ProbeTask) {
        self.lock()
            .insert(task.name.clone(), (Instant::now(), task.timeout));
    }

    fn ended(&self, name: &str) {
        self.lock().remove(name);
    }

    /// `name (12s of 30s)` for each probe still running, longest-running first.
    pub fn describe(&self) -> Vec<String> {
        let mut now: Vec<(String, Duration, Duration)> = self
            .lock()
            .iter()
            .map(|(n, (t0, timeout))| (n.clone(), t0.elapsed(), *timeout))
            .collect();
        now.sort_by_key(|(_, ran, _)| std::cmp::Reverse(*ran));
        now.into_iter()
            .map(|(n, ran, timeout)| {
                format!(
                    "{n} ({}s of its {}s timeout)",
                    ran.as_secs(),
                    timeout.as_secs()
                )
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Instant, Duration)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_and_spread() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let i = Duration::from_secs(60);
        // 1_000_000 % 60 == 40: the slot at offset 10 is 30 s away.
        assert_eq!(
            next_slot(t, i, Duration::from_secs(10)),
            Duration::from_secs(30)
        );
        assert_eq!(
            next_slot(t, i, Duration::from_secs(40)),
            Duration::from_secs(60)
        );
        assert_eq!(
            next_slot(t, i, Duration::from_secs(45)),
            Duration::from_secs(5)
        );
    }

    /// After a (re)start a host's probes at 15 s, 30 s, 1 min and 1 h (`spread: host`) run
    /// first at one instant within [`STARTUP_SPREAD`], on the wall clock as their later runs;
    /// a 1 s probe's first run is one of its own slots.
    #[test]
    fn a_hosts_first_runs_fall_due_together_within_the_startup_spread() {
        use crate::plan::{splay, Spread};
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let first = |secs: u64| {
            let i = Duration::from_secs(secs);
            first_run_after(now, i, splay(Spread::Host, "node001", "x", i))
        };
        for secs in [30, 60, 3600] {
            assert_eq!(first(secs), first(15), "{secs} s");
        }
        assert!(first(3600) <= STARTUP_SPREAD);
        let one = Duration::from_secs(1);
        assert!(first(1) <= one);
        let splay_1s = splay(Spread::Host, "node001", "x", one);
        assert_eq!(first(1), next_slot(now, one, splay_1s));
    }
}
