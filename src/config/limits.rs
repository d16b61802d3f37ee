//! The bound of every number a config may hold. Each is named here, with why it is where it
//! is, and carried by its field's row in the field tables (`Field::bound`): the field's
//! validation checks against that constant and the section-5 man pages print it from the
//! row, so the two read the same numbers (`tests/it/config_limits.rs` holds every row to the
//! parser). A value past its bound is a config error that names the bound, so nothing later
//! (plans, timers, deadlines) can overflow on it; the arithmetic on config values saturates
//! anyway.

use std::time::Duration;

use super::scalar::{format_duration, format_size};

const SECOND: Duration = Duration::from_secs(1);
const DAY: Duration = Duration::from_secs(86_400);
/// 30d.
const MONTH: Duration = Duration::from_secs(30 * 86_400);
/// A year: 365d.
const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// Default for agent.yaml's `max_interval`: a probe that runs less than daily is a cron job.
pub const DEFAULT_MAX_INTERVAL: Duration = DAY;

/// From `min` to `max`, both accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Between<T> {
    pub min: T,
    pub max: T,
}

impl<T> Between<T> {
    pub const fn new(min: T, max: T) -> Self {
        Self { min, max }
    }
}

impl<T: PartialOrd> Between<T> {
    pub fn contains(&self, value: &T) -> bool {
        self.min <= *value && *value <= self.max
    }
}

/// What a bounded field accepts, as its row in a field table declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Duration(Between<Duration>),
    /// `interval`: from `min` to agent.yaml's `max_interval`, which is `max` unless raised.
    Interval(Between<Duration>),
    Count(Between<u64>),
    /// Bytes.
    Size(Between<u64>),
}

impl Bound {
    /// The range as the admin writes its ends: `1s to 1d`, `1 to 1024`, `1 to 16MiB`.
    pub fn describe(self) -> String {
        match self {
            Bound::Duration(b) => {
                format!("{} to {}", format_duration(b.min), format_duration(b.max))
            }
            Bound::Interval(b) => format!(
                "{} to agent.yaml's max_interval ({} unless raised)",
                format_duration(b.min),
                format_duration(b.max)
            ),
            Bound::Count(b) => format!("{} to {}", b.min, b.max),
            Bound::Size(b) => format!("{} to {}", format_size(b.min), format_size(b.max)),
        }
    }
}

/// resources.yaml's `interval` (absent or 0: a static resource). Its top is agent.yaml's
/// `max_interval`; see [`Bounds`].
pub const INTERVAL: Between<Duration> = Between::new(SECOND, DEFAULT_MAX_INTERVAL);
/// agent.yaml's `max_interval`: what the bound on `interval` may be raised to.
pub const MAX_INTERVAL: Between<Duration> = Between::new(SECOND, YEAR);
/// `timeout` and `limits.cpu`: a probe run longer than a day is not a probe.
pub const RUN_TIME: Between<Duration> = Between::new(SECOND, DAY);
/// `stale_after` and `silence` are a few intervals; the default interval bound is a day.
pub const FEW_INTERVALS: Between<Duration> = Between::new(SECOND, MONTH);
/// `max_age`: a file written weekly by a cron job may legitimately be weeks old.
pub const MAX_AGE: Between<Duration> = Between::new(SECOND, YEAR);
/// agent.yaml's `coalesce`: how long the link waits after a change for more before sending.
/// 0 sends at once; past a few seconds a value is late for scheduling and the heartbeat
/// (10 s) would come first.
pub const COALESCE: Between<Duration> = Between::new(Duration::ZERO, Duration::from_secs(10));
/// Default of `coalesce`: a probe's burst of values (a kv probe's several lines, a grid
/// slot's runs) goes out as one batch.
pub const DEFAULT_COALESCE: Duration = Duration::from_millis(200);
/// agent.yaml's `release_code_after`: 0 never; past a day the start-up code has long been
/// resident for nothing.
pub const RELEASE_CODE_AFTER: Between<Duration> = Between::new(Duration::ZERO, DAY);
/// Default of `release_code_after`: the start-up's first runs of the probes, the sampler's
/// first ticks and the link's connect are done by then (BENCHMARKS.md section 23c).
pub const DEFAULT_RELEASE_CODE_AFTER: Duration = Duration::from_secs(30);
/// `tls.expiry_warning`.
pub const TLS_EXPIRY_WARNING: Between<Duration> = Between::new(Duration::ZERO, YEAR);
/// A stream probe's `declared_state`: what it may make the agent keep of what it declares
/// (Netdata charts and dimensions, names; default `output::DECLARED_STATE_BYTES`, 2 MiB).
/// At least some 300 entries, so a plugin's first charts are kept; at most what a handful of
/// such probes may cost a compute node beside its jobs.
pub const DECLARED_STATE: Between<u64> = Between::new(64 << 10, 256 << 20);
/// A file probe's `max_bytes`: one read of a small file, never a log.
pub const MAX_BYTES: Between<u64> = Between::new(1, 16 << 20);
/// `limits.address_space` and `limits.memory`: 1 PiB; larger means "no limit": leave it out.
pub const MEMORY: Between<u64> = Between::new(0, 1 << 50);
/// `limits.open_files`: the kernel's default nr_open.
pub const OPEN_FILES: Between<u64> = Between::new(0, 1 << 20);
/// `limits.processes`, `limits.pids` and `probe_pids_max`: the kernel's pid_max ceiling.
pub const PROCESSES: Between<u64> = Between::new(0, 1 << 22);
/// agent.yaml's `max_parallel`: probes running at once.
pub const MAX_PARALLEL: Between<u64> = Between::new(1, 1024);
/// agent.yaml's `max_stuck_reads`.
pub const MAX_STUCK_READS: Between<u64> = Between::new(1, 1024);

/// agent.yaml's `probe_pids_max`: the `pids.max` of each exec and stream probe's cgroup
/// unless its `limits: {pids: N}` says otherwise. One probe's fork bomb then stops at this
/// many tasks instead of filling the unit's `TasksMax` (1024 in the shipped unit) and keeping
/// every other probe from starting; a probe script with a few pipelines needs a handful.
pub const DEFAULT_PROBE_PIDS_MAX: u64 = 128;

/// agent.yaml's `max_stuck_reads` default.
pub const DEFAULT_MAX_STUCK_READS: usize = 32;

/// The bounds resources.yaml is validated against (from agent.yaml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_interval: Duration,
    /// `pids.max` for probes whose `limits:` give none; `None`: no default limit.
    pub probe_pids_max: Option<u64>,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_interval: DEFAULT_MAX_INTERVAL,
            probe_pids_max: Some(DEFAULT_PROBE_PIDS_MAX),
        }
    }
}

/// A duration past its field's bound; the message names the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field} {} is longer than the limit of {}{}",
    format_duration(*.value),
    format_duration(*.bound),
    if *.from_max_interval { raise_max_interval() } else { String::new() }
)]
pub struct TooLong {
    pub field: String,
    pub value: Duration,
    pub bound: Duration,
    /// The bound is agent.yaml's `max_interval`, which the admin may raise.
    pub from_max_interval: bool,
}

fn raise_max_interval() -> String {
    format!(
        " (agent.yaml's max_interval; raise it there, up to {}, if the probe really runs that rarely)",
        format_duration(MAX_INTERVAL.max)
    )
}

/// Check a duration field against its bound.
pub fn check_duration(field: &str, d: Duration, bound: Duration) -> Result<Duration, TooLong> {
    if d > bound {
        Err(TooLong {
            field: field.to_owned(),
            value: d,
            bound,
            from_max_interval: false,
        })
    } else {
        Ok(d)
    }
}

/// The interval check, with what to do about it.
pub fn check_interval(d: Duration, bounds: &Bounds) -> Result<Duration, TooLong> {
    check_duration("interval", d, bounds.max_interval).map_err(|e| TooLong {
        from_max_interval: true,
        ..e
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_named_in_the_message() {
        let e = check_interval(DAY * 2, &Bounds::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("interval 2d is longer than the limit of 1d"),
            "{e}"
        );
        assert!(e.contains("max_interval"), "{e}");
        assert_eq!(check_interval(DAY, &Bounds::default()), Ok(DAY));
        assert!(
            e.ends_with("up to 365d, if the probe really runs that rarely)"),
            "{e}"
        );
    }
}
