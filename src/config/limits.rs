//! The bounds on every number a config may hold, in one table.
//! A value past its bound is a config error that names the bound, so nothing later (plans,
//! timers, deadlines) can overflow on it; the arithmetic on config values saturates anyway.

use std::time::Duration;

use super::scalar::format_duration;

const DAY: Duration = Duration::from_secs(86_400);

/// Default for agent.yaml's `max_interval`: a probe that runs less than daily is a cron job.
pub const DEFAULT_MAX_INTERVAL: Duration = DAY;
/// What `max_interval` itself may be raised to.
pub const MAX_INTERVAL_CEILING: Duration = Duration::from_secs(365 * 86_400); // a year: 365d

/// Bounds on durations other than `interval`, by field.
pub fn duration_bound(field: &str) -> Duration {
    match field {
        // A file written weekly by a cron job may legitimately be weeks old.
        "max_age" => MAX_INTERVAL_CEILING,
        // stale_after and silence are a few intervals; the default interval bound is a day.
        "stale_after" | "silence" => DAY * 30,
        // timeout, cpu limit: a probe run longer than a day is not a probe.
        _ => DAY,
    }
}

/// Bounds on counts and sizes, by field: (largest accepted, what it means).
pub fn count_bound(field: &str) -> u64 {
    match field {
        "address_space" => 1 << 50, // 1 PiB: larger means "no limit"; leave it out
        "open_files" => 1 << 20,    // the kernel's default nr_open
        "processes" => 1 << 22,     // the kernel's pid_max ceiling
        "pids" => 1 << 22,          // pids.max of a probe's cgroup: the same ceiling
        "memory" => 1 << 50,        // memory.max of a probe's cgroup: 1 PiB, as address_space
        _ => u64::MAX,
    }
}

/// agent.yaml's `probe_pids_max`: the `pids.max` of each exec and stream probe's cgroup
/// unless its `limits: {pids: N}` says otherwise. One probe's fork bomb then stops at this
/// many tasks instead of filling the unit's `TasksMax` (1024 in the shipped unit) and keeping
/// every other probe from starting; a probe script with a few pipelines needs a handful.
pub const DEFAULT_PROBE_PIDS_MAX: u64 = 128;

/// agent.yaml's `max_stuck_reads`: default and range.
pub const DEFAULT_MAX_STUCK_READS: usize = 32;
pub const MAX_STUCK_READS_RANGE: std::ops::RangeInclusive<i64> = 1..=1024;

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
        format_duration(MAX_INTERVAL_CEILING)
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
