//! How fast the agent reads a controller's messages: a token bucket, so a controller that
//! floods the link is slowed down by TCP instead of costing the agent a core.

use std::time::Duration;

use tokio::time::Instant;

/// Controller messages the agent reads per second, after a burst of as many: a controller
/// acks each batch (a few per second) and welcomes rarely; one that sends faster is slowed
/// down by TCP instead of costing the agent a core.
pub const CONTROLLER_MESSAGES_PER_SEC: u32 = 100;

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
}
