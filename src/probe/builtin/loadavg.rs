//! `r15s r1m r15m`: the run queue, exponentially smoothed as LSF does.
//!
//! Sample `x` = runnable tasks, the `running` half of `/proc/loadavg`'s 4th field (the kernel's
//! `nr_running()`, the same count as `procs_running` in /proc/stat, from a 100-byte file
//! instead of a multi-kilobyte one), minus one: the sampler's own thread is necessarily
//! running while it reads the file, and an idle host must read 0, as `uptime` suggests.
//! Tasks in uninterruptible sleep (state D) are not counted: unlike the kernel's load
//! average, LSF's run queue counts runnable tasks only.
//!
//! Every 5 s: `v = v*f + x*(1-f)` with f = e^-1/3 (r15s), e^-1/12 (r1m), e^-1/180 (r15m); the
//! first sample seeds `v = x`. See `smoothing.rs` for late ticks.

use super::smoothing::{Ewma, TAU_15M, TAU_15S, TAU_1M};
use super::{Ix, ReadError, Tick};

pub(crate) struct RunQueue {
    r15s: Ewma,
    r1m: Ewma,
    r15m: Ewma,
}

impl RunQueue {
    pub(crate) fn new() -> Self {
        Self {
            r15s: Ewma::new(TAU_15S),
            r1m: Ewma::new(TAU_1M),
            r15m: Ewma::new(TAU_15M),
        }
    }

    pub(crate) fn sample(&mut self, tick: &mut Tick<'_>) {
        let tasks = running_tasks(tick);
        let (now, slots) = (tick.now, &mut *tick.slots);
        match tasks {
            Ok(x) => {
                slots.ok(Ix::R15s, self.r15s.update(x, now));
                slots.ok(Ix::R1m, self.r1m.update(x, now));
                slots.ok(Ix::R15m, self.r15m.update(x, now));
            }
            Err(e) => slots.fail(
                &[Ix::R15s, Ix::R1m, Ix::R15m],
                crate::value::Failure::new(e),
            ),
        }
    }
}

fn running_tasks(tick: &mut Tick<'_>) -> Result<f64, ReadError> {
    let load: procfs::LoadAverage = tick.procfs("loadavg")?;
    Ok(f64::from(load.cur.saturating_sub(1)))
}
