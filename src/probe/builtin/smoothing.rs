//! LSF's exponential smoothing, `v = v*f + x*(1-f)`, and the counter-to-rate step the
//! rate indices share.
//!
//! LSF applies a fixed factor per sample: e^-1/3, e^-1/12, e^-1/180 per 5 s sample (time
//! constants 15 s, 60 s, 900 s) and e^-1/4 per 15 s sample (60 s). We write the factor as
//! `f = e^(-dt/tau)` with `dt` the real time since the previous sample: at the nominal tick it
//! is exactly LSF's factor (5/15 and 1/3 round to the same double), and a late tick (a busy
//! runtime, a suspended VM) weighs its sample by the time it really covers instead of
//! pretending 5 s passed.
//!
//! The first sample seeds the average (`v = x`), as LSF does on its first reading.
//!
//! An interval that gave no sample (a failed read, a counter reset) is not an update: the
//! next sample's `dt` runs from the last update, so that sample stands for the whole gap
//! (after one skipped 15 s interval, f = e^(-30/60) = e^-1/2).

use std::time::{Duration, Instant};

/// Time constants, in seconds, of LSF's averages.
pub const TAU_15S: f64 = 15.0;
pub const TAU_1M: f64 = 60.0;
pub const TAU_15M: f64 = 900.0;

/// One exponentially smoothed series.
#[derive(Debug, Clone)]
pub struct Ewma {
    tau: f64,
    state: Option<(f64, Instant)>,
}

impl Ewma {
    pub fn new(tau_secs: f64) -> Self {
        Self {
            tau: tau_secs,
            state: None,
        }
    }

    /// Fold in sample `x` taken at `now`; returns the new average.
    pub fn update(&mut self, x: f64, now: Instant) -> f64 {
        let v = match self.state {
            None => x,
            Some((v, then)) => {
                let dt = now.saturating_duration_since(then).as_secs_f64();
                let f = (-dt / self.tau).exp();
                v * f + x * (1.0 - f)
            }
        };
        self.state = Some((v, now));
        v
    }

    pub fn value(&self) -> Option<f64> {
        self.state.map(|(v, _)| v)
    }

    pub fn reset(&mut self) {
        self.state = None;
    }
}

/// What a counter sample gives once compared with the previous good one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delta {
    /// First sample of the series: nothing to compare with yet.
    First,
    /// The counter went down (wrap, reset, device replaced): the series restarts from this
    /// sample and this interval gives no rate.
    Restarted,
    /// Increase and the real time it took.
    Grew(u64, Duration),
}

/// The previous good sample of a monotonic counter.
#[derive(Debug, Clone, Default)]
pub struct Counter {
    last: Option<(u64, Instant)>,
}

impl Counter {
    pub fn observe(&mut self, value: u64, now: Instant) -> Delta {
        let previous = self.last.replace((value, now));
        match previous {
            None => Delta::First,
            Some((old, _)) if value < old => Delta::Restarted,
            Some((old, then)) => Delta::Grew(value - old, now.saturating_duration_since(then)),
        }
    }

    pub fn reset(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nominal_tick_uses_lsf_factor_exactly() {
        let t0 = Instant::now();
        let mut e = Ewma::new(TAU_15S);
        assert_eq!(e.update(2.0, t0), 2.0);
        let f = (-1.0f64 / 3.0).exp();
        assert_eq!(
            e.update(5.0, t0 + Duration::from_secs(5)),
            2.0 * f + 5.0 * (1.0 - f)
        );
        let mut m = Ewma::new(TAU_15M);
        m.update(1.0, t0);
        let f = (-1.0f64 / 180.0).exp();
        assert_eq!(m.update(0.0, t0 + Duration::from_secs(5)), f);
    }

    #[test]
    fn counter_restart_and_growth() {
        let t0 = Instant::now();
        let mut c = Counter::default();
        assert_eq!(c.observe(10, t0), Delta::First);
        assert_eq!(
            c.observe(25, t0 + Duration::from_secs(15)),
            Delta::Grew(15, Duration::from_secs(15))
        );
        assert_eq!(c.observe(3, t0 + Duration::from_secs(30)), Delta::Restarted);
        assert_eq!(
            c.observe(4, t0 + Duration::from_secs(45)),
            Delta::Grew(1, Duration::from_secs(15))
        );
    }
}
