//! What a frame may cost. Work, memory and log lines per frame are bounded by what the peer
//! declared (a host's resvals by its hello), never by what a list header claims: a 72-byte
//! frame can announce a million zero-sized structs. The same limits are written in
//! docs/protocol.md for the C controller.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::wire::Hello;
use crate::config::hostlist::{
    check_instance_name, validate_host_name, InstanceNameError, InvalidHostName,
};
use crate::config::resources::{check_resource_name, NameError};
use crate::text::escape;

/// Most resource instances one hello may declare. A node with ten thousand dynamic resources
/// is a configuration error; the bound keeps a hostile hello's decoded size near 1 MiB.
pub const MAX_DECLARED: u32 = 10_000;

/// Most (name, instance) pairs one welcome may assign: every assigned instance is declared in
/// the agent's next hello, so the hello's bound applies.
pub const MAX_ASSIGNED: u32 = MAX_DECLARED;

/// Longest free-text hello field (agentVersion, bootId, configDigest): ours are under 64.
pub const MAX_HELLO_TEXT: usize = 256;

/// Bytes of printed output `listen` holds for a slow stdout before its connections stop
/// reading (and TCP pushes back on the agents).
pub const LISTEN_BUFFER_BYTES: usize = 1 << 20;

/// A connection's repeated warnings are summarised once per this interval.
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Controller messages the agent reads per second, after a burst of as many: a controller
/// acks each batch (a few per second) and welcomes rarely; one that sends faster is slowed
/// down by TCP instead of costing the agent a core.
pub const CONTROLLER_MESSAGES_PER_SEC: u32 = 100;

/// Longest list of each kind an agent's frame may carry, given what it declared. (A
/// welcome's list is bounded by `MAX_ASSIGNED` alone.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Resvals in one batch: the instances the connection's hello declared.
    pub resvals: u32,
    /// Declared instances in one hello.
    pub declared: u32,
}

impl FrameLimits {
    /// What an agent may send once its hello declared `declared` instances.
    pub fn after_hello(declared: usize) -> Self {
        Self {
            resvals: u32::try_from(declared)
                .unwrap_or(u32::MAX)
                .min(MAX_DECLARED),
            ..Self::default()
        }
    }
}

impl Default for FrameLimits {
    /// The protocol's absolute bounds: no batch longer than a hello may declare.
    fn default() -> Self {
        Self {
            resvals: MAX_DECLARED,
            declared: MAX_DECLARED,
        }
    }
}

/// Why a hello is refused: which field broke which rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("hello host: {0}")]
    Host(InvalidHostName),
    #[error("hello {field} of {len} bytes is longer than {MAX_HELLO_TEXT}")]
    TextTooLong { field: &'static str, len: usize },
    #[error("hello declares {0}")]
    Declared(PairError),
}

/// Why a (resource, instance) pair is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    #[error(transparent)]
    Resource(#[from] NameError),
    #[error(transparent)]
    Instance(#[from] InstanceNameError),
}

/// A hello's names against the resource-name rules (the host by RFC 1123 as in
/// resources.yaml, each resource by LSF's rule, each instance by the location syntax) and its
/// free-text fields against their length bound.
pub fn check_hello(h: &Hello) -> Result<(), HelloError> {
    validate_host_name(&h.host).map_err(HelloError::Host)?;
    for (field, value) in [
        ("agentVersion", &h.agent_version),
        ("bootId", &h.boot_id),
        ("configDigest", &h.config_digest),
    ] {
        if value.len() > MAX_HELLO_TEXT {
            return Err(HelloError::TextTooLong {
                field,
                len: value.len(),
            });
        }
    }
    for d in &h.resources {
        check_names(&d.name, &d.instance).map_err(HelloError::Declared)?;
    }
    Ok(())
}

/// One (resource, instance) pair against the name rules, as resvals and welcomes carry them.
pub fn check_names(name: &str, instance: &str) -> Result<(), PairError> {
    check_resource_name(name)?;
    Ok(check_instance_name(instance)?)
}

/// Per-connection rate limit of repeated warnings: the first warning of each interval is
/// logged in full, the rest are counted by reason and written as one summary line when the
/// interval is over (or the connection ends). A million rejected resvals make two lines.
#[derive(Debug)]
pub struct Warnings {
    interval: Duration,
    window_start: Option<Instant>,
    suppressed: BTreeMap<&'static str, u64>,
}

impl Warnings {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            window_start: None,
            suppressed: BTreeMap::new(),
        }
    }

    /// Record one warning of kind `reason`; true when it should be logged in full now.
    pub fn admit(&mut self, reason: &'static str, now: Instant) -> bool {
        match self.window_start {
            Some(start) if now.duration_since(start) < self.interval => {
                *self.suppressed.entry(reason).or_default() += 1;
                false
            }
            _ => {
                self.window_start = Some(now);
                true
            }
        }
    }

    /// The summary of what was suppressed, once the interval it belongs to is over.
    pub fn summary_due(&mut self, now: Instant) -> Option<String> {
        let start = self.window_start?;
        if now.duration_since(start) < self.interval {
            return None;
        }
        self.window_start = None;
        self.take()
    }

    /// The summary of what was suppressed so far (the connection ended).
    pub fn finish(&mut self) -> Option<String> {
        self.take()
    }

    fn take(&mut self) -> Option<String> {
        if self.suppressed.is_empty() {
            return None;
        }
        let total: u64 = self.suppressed.values().sum();
        let by_reason: Vec<String> = std::mem::take(&mut self.suppressed)
            .into_iter()
            .map(|(reason, n)| format!("{}={n}", escape(reason)))
            .collect();
        Some(format!("{total} more ({})", by_reason.join(", ")))
    }
}

/// A token bucket: `take` waits until a token is free (`rate` per second, at most `rate`
/// saved up), so a reader that takes one per message reads at most `rate` messages a second.
#[derive(Debug)]
pub struct Pace {
    rate: u32,
    tokens: u32,
    refilled: Instant,
}

impl Pace {
    pub fn new(rate: u32) -> Self {
        let rate = rate.max(1);
        Self {
            rate,
            tokens: rate,
            refilled: Instant::now(),
        }
    }

    pub async fn take(&mut self) {
        let step = Duration::from_secs(1) / self.rate;
        loop {
            let now = Instant::now();
            let earned = (now.duration_since(self.refilled).as_nanos() / step.as_nanos().max(1))
                .min(u128::from(self.rate)) as u32;
            if earned > 0 {
                self.tokens = (self.tokens + earned).min(self.rate);
                self.refilled = if self.tokens == self.rate {
                    now
                } else {
                    self.refilled + step * earned
                };
            }
            if self.tokens > 0 {
                self.tokens -= 1;
                return;
            }
            tokio::time::sleep_until(self.refilled + step).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::wire::Declared;
    use crate::value::Valtype;

    fn hello(host: &str, name: &str, instance: &str) -> Hello {
        Hello::new(
            host,
            "boot",
            "digest",
            vec![Declared {
                name: name.into(),
                instance: instance.into(),
                valtype: Valtype::Numeric,
                interval_ms: 1000,
                shared: !instance.is_empty(),
            }],
        )
    }

    #[test]
    fn a_hello_with_names_by_the_rules_passes() {
        assert_eq!(check_hello(&hello("node001.hpc", "gpu_free", "")), Ok(()));
        assert_eq!(
            check_hello(&hello("node001", "lic", "node[001-004],login1")),
            Ok(())
        );
    }

    #[test]
    fn names_that_could_carry_markup_are_refused() {
        let forged = "evil\nnode042 gpu_free ok 8 seq=1 full\nnode042";
        let cases = [
            hello(forged, "gpu", ""),
            hello("node001", "gpu\nfake", ""),
            hello("node001", "9lives", ""),
            hello("node001", &"x".repeat(40), ""),
            hello("node001", "gpu", "all\u{1b}[2J"),
            hello("", "gpu", ""),
        ];
        for h in cases {
            assert!(check_hello(&h).is_err(), "accepted {h:?}");
        }
        let mut h = hello("node001", "gpu", "");
        h.agent_version = "v".repeat(MAX_HELLO_TEXT + 1);
        assert!(check_hello(&h)
            .unwrap_err()
            .to_string()
            .contains("agentVersion"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_warnings_makes_one_line_and_one_summary_per_interval() {
        let mut w = Warnings::new(WARN_INTERVAL);
        let mut lines = 0;
        for i in 0..1_000_000u32 {
            if w.admit(
                if i % 2 == 0 { "undeclared" } else { "bad name" },
                Instant::now(),
            ) {
                lines += 1;
            }
            if w.summary_due(Instant::now()).is_some() {
                lines += 1;
            }
        }
        assert_eq!(lines, 1);
        let summary = w.finish().expect("suppressed warnings are summarised");
        assert_eq!(summary, "999999 more (bad name=500000, undeclared=499999)");
        assert_eq!(w.finish(), None, "a summary is written once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pace_lets_a_burst_through_then_its_rate() {
        let mut pace = Pace::new(100);
        let start = Instant::now();
        for _ in 0..100 {
            pace.take().await;
        }
        assert_eq!(Instant::now(), start, "the burst waits for nothing");
        for _ in 0..1000 {
            pace.take().await;
        }
        let waited = Instant::now().duration_since(start);
        assert!(
            waited >= Duration::from_secs(10) && waited <= Duration::from_millis(10_010),
            "{waited:?} for 1000 beyond the burst at 100/s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_summary_comes_when_the_interval_is_over() {
        let mut w = Warnings::new(WARN_INTERVAL);
        assert!(w.admit("undeclared", Instant::now()));
        assert!(!w.admit("undeclared", Instant::now()));
        assert_eq!(w.summary_due(Instant::now()), None);
        tokio::time::advance(WARN_INTERVAL).await;
        assert_eq!(
            w.summary_due(Instant::now()).as_deref(),
            Some("1 more (undeclared=1)")
        );
        assert!(
            w.admit("undeclared", Instant::now()),
            "a new interval starts"
        );
    }
}
