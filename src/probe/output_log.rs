//! What a probe's output may cost the log and the agent's memory: one [`OutputLog`] per probe
//! remembers what was already logged, so a probe that misbehaves every interval, or a
//! stream that prints a new malformed line or a new name every millisecond, writes a bounded
//! number of lines per minute and keeps a bounded set of names, whatever it prints.
//!
//! * stderr: logged when its text changes, the same text at most once per
//!   [`STDERR_LOG_EVERY`];
//! * every kind of line (stderr, malformed stream lines, names outside `provides:`) at most
//!   [`LOG_BURST`] per [`STDERR_LOG_EVERY`] ([`Throttle`]); what it holds back is counted
//!   and said in one summary line ("N more ... not logged") when the next minute begins or the
//!   stream child ends;
//! * names outside `provides:`: each logged once, the first [`UNEXPECTED_REMEMBERED`] of them
//!   remembered, each charged to the probe's declared-state budget; past either, new names
//!   are counted, never stored.
//!
//! The probe's [`DeclaredBudget`] lives here, with the names it remembers: a stream's
//! session (Netdata's charts and dimensions) charges it too, and the first refusal is said
//! once ([`OutputLog::say_declared_budget`]).
//!
//! Every text a probe wrote goes to the log through [`crate::text::escape`].

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::output::DeclaredBudget;
use crate::text::escape;

/// How often the same probe's stderr may be logged when its text does not change; also the
/// window of every [`Throttle`].
pub const STDERR_LOG_EVERY: Duration = Duration::from_secs(60);
/// Lines of one kind a probe may cause in the log per [`STDERR_LOG_EVERY`].
pub const LOG_BURST: u32 = 10;
/// Names outside `provides:` remembered per probe (so each is logged once); new names past
/// these are counted and summarised, not stored.
pub const UNEXPECTED_REMEMBERED: usize = 64;

/// At most [`LOG_BURST`] lines per window of [`STDERR_LOG_EVERY`]; the rest counted.
#[derive(Debug, Default)]
pub struct Throttle {
    window: Option<Instant>,
    logged: u32,
    held_back: u64,
}

impl Throttle {
    /// Whether one more line may be logged at `now`; one that may not is counted. When the
    /// first line of a new window is let through, `summary` gets how many the last ones held
    /// back (to be logged before it).
    pub fn admit(&mut self, now: Instant, summary: &mut u64) -> bool {
        if self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= STDERR_LOG_EVERY)
        {
            self.window = Some(now);
            self.logged = 0;
            *summary = std::mem::take(&mut self.held_back);
        }
        if self.logged < LOG_BURST {
            self.logged += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }

    /// Held back and not yet summarised (taken: the caller logs them now).
    pub fn take_held_back(&mut self) -> u64 {
        std::mem::take(&mut self.held_back)
    }
}

/// Per-probe memory of what was already logged (see the module's text).
#[derive(Debug, Default)]
pub struct OutputLog {
    unexpected: BTreeSet<String>,
    /// Names outside `provides:` seen since the last summary that were not remembered.
    unexpected_unlogged: u64,
    unexpected_summary_at: Option<Instant>,
    unexpected_total: u64,
    stderr_last: Option<(Instant, String)>,
    stderr: Throttle,
    /// Stderr lines held back in the window before this one, to be said before the next.
    stderr_summary: u64,
    malformed: Throttle,
    /// What the probe may keep of what it declares (see the module's text).
    declared: DeclaredBudget,
}

impl OutputLog {
    /// With a declared-state budget of `limit` bytes (a stream's `declared_state`).
    pub fn with_declared_limit(limit: usize) -> Self {
        Self {
            declared: DeclaredBudget::new(limit),
            ..Self::default()
        }
    }

    /// Names not yet logged for this probe; returns the ones it logged now. Each is logged
    /// once while fewer than [`UNEXPECTED_REMEMBERED`] are remembered; later new names are
    /// counted, and the count logged at most once per [`STDERR_LOG_EVERY`].
    pub fn unexpected(&mut self, probe: &str, names: &[String]) -> Vec<String> {
        self.unexpected_at(probe, names, Instant::now())
    }

    pub fn unexpected_at(&mut self, probe: &str, names: &[String], now: Instant) -> Vec<String> {
        let mut logged = Vec::new();
        for name in names {
            self.unexpected_total += 1;
            if self.unexpected.contains(name.as_str()) {
                continue;
            }
            if self.unexpected.len() < UNEXPECTED_REMEMBERED && self.declared.charge(name).is_ok() {
                self.unexpected.insert(name.clone());
                tracing::warn!(probe = %probe, name = %escape(name), "output names a resource this probe does not provide (not in provides:); ignored");
                logged.push(name.clone());
            } else {
                self.unexpected_unlogged += 1;
            }
        }
        // The first summary a minute after the set filled, then one a minute (and one when a
        // stream child ends).
        if self.unexpected_unlogged > 0 {
            match self.unexpected_summary_at {
                None => self.unexpected_summary_at = Some(now),
                Some(at) if now.saturating_duration_since(at) >= STDERR_LOG_EVERY => {
                    self.unexpected_summary_at = Some(now);
                    self.summarise_unexpected(probe);
                }
                Some(_) => {}
            }
        }
        logged
    }

    fn summarise_unexpected(&mut self, probe: &str) {
        let n = std::mem::take(&mut self.unexpected_unlogged);
        if n > 0 {
            tracing::warn!(probe = %probe, "{n} more names outside provides: not logged (the first {UNEXPECTED_REMEMBERED} were; a probe printing ever-new names, such as per-job ones, is counted, not remembered)");
        }
    }

    /// The probe's declared-state budget.
    pub fn declared(&mut self) -> &mut DeclaredBudget {
        &mut self.declared
    }

    /// Warn, once per probe, that its declared-state budget refused something, with the
    /// figures. Whether it warned now.
    pub fn say_declared_budget(&mut self, probe: &str) -> bool {
        let first = self.declared.first_refusal();
        if first {
            tracing::warn!(probe = %probe, "{}", self.declared.reached_text());
        }
        first
    }

    /// How many names outside `provides:` are remembered (at most [`UNEXPECTED_REMEMBERED`]).
    pub fn remembered_names(&self) -> usize {
        self.unexpected.len()
    }

    /// Names outside `provides:` the probe has printed, every one counted.
    pub fn unexpected_total(&self) -> u64 {
        self.unexpected_total
    }

    /// Whether `stderr` should be logged now: new text, or the last log of the same text is
    /// old enough; and never more than [`LOG_BURST`] a minute (a summary says how many were
    /// held back).
    pub fn stderr_due(&mut self, stderr: &str, now: Instant) -> bool {
        let stderr = stderr.trim();
        if stderr.is_empty() {
            return false;
        }
        let due = match &self.stderr_last {
            None => true,
            Some((at, text)) => text != stderr || now.duration_since(*at) >= STDERR_LOG_EVERY,
        };
        if !due {
            return false;
        }
        let admitted = self.stderr.admit(now, &mut self.stderr_summary);
        if admitted {
            self.stderr_last = Some((now, stderr.to_owned()));
        }
        admitted
    }

    /// Log `stderr` (a run's, or a stream's line) as `what` if [`Self::stderr_due`] says so,
    /// after the count of the lines held back before it.
    pub fn stderr(&mut self, probe: &str, stderr: &str, what: &str, now: Instant) {
        let due = self.stderr_due(stderr, now);
        let n = std::mem::take(&mut self.stderr_summary);
        if n > 0 {
            tracing::info!(probe = %probe, "{n} more stderr lines not logged (at most {LOG_BURST} a minute)");
        }
        if due {
            tracing::info!(probe = %probe, stderr = %escape(stderr.trim()), "{what}");
        }
    }

    /// Log `msg`, about a malformed line of the probe's output, unless [`LOG_BURST`] were
    /// already logged this minute; whether it was logged.
    pub fn malformed(&mut self, probe: &str, msg: &str, now: Instant) -> bool {
        let mut held_back = 0;
        let admitted = self.malformed.admit(now, &mut held_back);
        if held_back > 0 {
            tracing::warn!(probe = %probe, "{held_back} more malformed lines not logged (at most {LOG_BURST} a minute)");
        }
        if admitted {
            tracing::warn!(probe = %probe, "{}", escape(msg));
        }
        admitted
    }

    /// Say what was held back and not yet summarised: when a stream child ends.
    pub fn flush(&mut self, probe: &str) {
        let n = self.malformed.take_held_back();
        if n > 0 {
            tracing::warn!(probe = %probe, "{n} more malformed lines not logged (at most {LOG_BURST} a minute)");
        }
        let n = self.stderr.take_held_back() + std::mem::take(&mut self.stderr_summary);
        if n > 0 {
            tracing::info!(probe = %probe, "{n} more stderr lines not logged (at most {LOG_BURST} a minute)");
        }
        self.summarise_unexpected(probe);
    }

    /// Log a run's unexpected names and stderr under the limits above.
    pub fn log_run(&mut self, probe: &str, run: &super::ProbeRun) {
        self.unexpected(probe, &run.unexpected);
        // Names past what a run lists are new as far as anyone can tell: counted as such.
        self.unexpected_total += run.unexpected_more as u64;
        self.unexpected_unlogged += run.unexpected_more as u64;
        if let Some(detail) = &run.exec {
            self.stderr(
                probe,
                &detail.stderr,
                "probe wrote to stderr",
                Instant::now(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_names_are_charged_to_the_probes_declared_budget() {
        let mut log = OutputLog::default();
        let limit = log.declared().limit();
        // Names as long as a stream line may be: 64 of them would take 4 MiB.
        let names: Vec<String> = (0..UNEXPECTED_REMEMBERED)
            .map(|i| format!("{i:02}{}", "n".repeat(64 * 1024 - 8)))
            .collect();
        log.unexpected("p", &names);
        let remembered = log.remembered_names();
        assert!(remembered < UNEXPECTED_REMEMBERED, "{remembered}");
        assert_eq!(remembered, limit / DeclaredBudget::cost(&names[0]));
        assert!(log.declared().used() <= limit);
        assert_eq!(log.unexpected_total(), UNEXPECTED_REMEMBERED as u64);
        assert!(log.say_declared_budget("p"), "warned the first time");
        assert!(!log.say_declared_budget("p"), "and only then");
    }

    #[test]
    fn a_throttle_lets_a_burst_through_per_window_and_counts_the_rest() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        let mut summary = 0;
        let admitted = (0..100).filter(|_| t.admit(t0, &mut summary)).count();
        assert_eq!(admitted, LOG_BURST as usize);
        assert_eq!(summary, 0);
        assert!(t.admit(t0 + STDERR_LOG_EVERY, &mut summary));
        assert_eq!(
            summary,
            100 - u64::from(LOG_BURST),
            "summarised at the next window"
        );
        assert_eq!(t.take_held_back(), 0);
    }
}
