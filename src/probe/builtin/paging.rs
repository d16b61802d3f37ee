//! `pg`: pages swapped in + out per second, 1 min average.
//!
//! `x = Δ(pswpin + pswpout) / Δt` from /proc/vmstat, Δt the real time between the two
//! samples (per second, not per sample), smoothed every 15 s with f = e^-1/4; pending until
//! the second sample. A counter that went down restarts the series (that interval is
//! skipped, the average stands).
//!
//! /proc/vmstat has ~180 lines of which we need two: a scan for them costs a fraction of
//! building procfs's `VmStat` map of all of them.

use std::path::Path;

use super::smoothing::{Counter, Delta, Ewma, TAU_1M};
use super::{Ix, ReadError, Tick};

pub(crate) struct Paging {
    swapped: Counter,
    pg: Ewma,
}

impl Paging {
    pub(crate) fn new() -> Self {
        Self {
            swapped: Counter::default(),
            pg: Ewma::new(TAU_1M),
        }
    }

    pub(crate) fn sample(&mut self, tick: &mut Tick<'_>) {
        let total = tick.proc("vmstat", swapped_pages);
        let (now, slots) = (tick.now, &mut *tick.slots);
        match total {
            Err(e) => slots.fail(&[Ix::Pg], crate::value::Failure::new(e)),
            Ok(total) => match self.swapped.observe(total, now) {
                Delta::First => slots.pending(Ix::Pg, "paging rate needs a second sample"),
                Delta::Restarted => slots.hold(
                    Ix::Pg,
                    self.pg.value(),
                    "swap counters went backwards; waiting for a second sample",
                ),
                Delta::Grew(_, dt) if dt.is_zero() => {
                    slots.hold(Ix::Pg, self.pg.value(), "paging rate needs a second sample")
                }
                Delta::Grew(d, dt) => {
                    slots.ok(Ix::Pg, self.pg.update(d as f64 / dt.as_secs_f64(), now))
                }
            },
        }
    }
}

fn swapped_pages(path: &Path, data: &[u8]) -> Result<u64, ReadError> {
    let (mut pswpin, mut pswpout) = (None, None);
    for line in data.split(|&b| b == b'\n') {
        let slot = if let Some(rest) = line.strip_prefix(b"pswpin ") {
            (&mut pswpin, rest)
        } else if let Some(rest) = line.strip_prefix(b"pswpout ") {
            (&mut pswpout, rest)
        } else {
            continue;
        };
        let text = std::str::from_utf8(slot.1).map_err(|e| ReadError::parse(path, e))?;
        *slot.0 = Some(
            text.trim()
                .parse::<u64>()
                .map_err(|e| ReadError::parse(path, format!("{:?}: {e}", text.trim())))?,
        );
        if pswpin.is_some() && pswpout.is_some() {
            break;
        }
    }
    match (pswpin, pswpout) {
        (Some(i), Some(o)) => Ok(i.saturating_add(o)),
        _ => Err(ReadError::parse(path, "no pswpin/pswpout lines")),
    }
}
