//! Repeated warnings of one connection, throttled: a peer that sends a million bad resvals
//! costs two log lines per interval, not a million.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::text::escape;

/// A connection's repeated warnings are summarised once per this interval.
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);

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

#[cfg(test)]
mod tests {
    use super::*;

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
