//! `ut` (CPU utilisation, %) and `ncpus` (online CPUs).
//!
//! `ut`: from the aggregate `cpu` line of /proc/stat, between two samples,
//! `x = 100 * Δbusy / (Δbusy + Δidle)` with
//! busy = user + nice + system + irq + softirq + steal and idle = idle + iowait.
//! iowait counts as idle: the CPU was free to run another task (this is what `vmstat`'s
//! `id + wa` and `top` show as not busy), and the kernel's iowait may even go backwards.
//! steal counts as busy: that time was not available to this host's tasks.
//! guest and guest_nice are left out: the kernel already counts them in user and nice.
//! Smoothed every 15 s with f = e^-1/4 (1 min average); pending until the second sample.
//! A counter that went down (reset) restarts the series: that interval is skipped and the
//! average keeps its previous value.
//!
//! CPU hot-unplug: the per-CPU lines of the unplugged CPUs disappear but the aggregate line
//! remains, so `ut` goes on from it; `ncpus` follows.
//!
//! `ncpus`: the CPUs listed in `<sys>/devices/system/cpu/online` (`0-3,6`), or, where that
//! file cannot be read, the number of `cpuN` lines in /proc/stat (online CPUs only).

use std::path::Path;
use std::time::Instant;

use procfs::FromReadSI;

use super::smoothing::{Ewma, TAU_1M};
use super::{read_file, Ix, ReadError, Slots, Tick};

pub(crate) struct Cpu {
    last: Option<(u64, u64)>,
    ut: Ewma,
}

/// Only ticks are used (never converted to time), so the system info is a formality.
const SYSTEM_INFO: procfs::ExplicitSystemInfo = procfs::ExplicitSystemInfo {
    boot_time_secs: 0,
    ticks_per_second: 100,
    page_size: 4096,
    is_little_endian: cfg!(target_endian = "little"),
};

impl Cpu {
    pub(crate) fn new() -> Self {
        Self {
            last: None,
            ut: Ewma::new(TAU_1M),
        }
    }

    pub(crate) fn sample(&mut self, tick: &mut Tick<'_>) {
        let stat = tick.proc("stat", |path, bytes| {
            procfs::KernelStats::from_read(bytes, &SYSTEM_INFO)
                .map_err(|e| ReadError::parse(path, e))
        });
        let slots = &mut *tick.slots;
        match &stat {
            Ok(stat) => self.update_ut(&stat.total, tick.now, slots),
            Err(e) => slots.fail(&[Ix::Ut], e.to_string()),
        }
        let online_path = tick.roots.sys.join("devices/system/cpu/online");
        match online_cpus(&online_path, tick.buf) {
            Ok(n) => slots.ok(Ix::Ncpus, n as f64),
            Err(online_err) => match &stat {
                Ok(stat) => slots.ok(Ix::Ncpus, stat.cpu_time.len() as f64),
                Err(stat_err) => slots.fail(&[Ix::Ncpus], format!("{online_err}; {stat_err}")),
            },
        }
    }

    fn update_ut(&mut self, t: &procfs::CpuTime, now: Instant, slots: &mut Slots) {
        let opt = |v: Option<u64>| v.unwrap_or(0);
        let busy = t.user + t.nice + t.system + opt(t.irq) + opt(t.softirq) + opt(t.steal);
        let idle = t.idle + opt(t.iowait);
        match self.last.replace((busy, idle)) {
            None => slots.pending(Ix::Ut, "CPU utilisation needs a second sample"),
            Some((b0, i0)) if busy < b0 || idle < i0 => {
                // Counters reset: skip this interval; the average (if any) stands.
                slots.hold(
                    Ix::Ut,
                    self.ut.value(),
                    "CPU counters went backwards; waiting for a second sample",
                );
            }
            Some((b0, i0)) => {
                let (db, di) = (busy - b0, idle - i0);
                if db + di == 0 {
                    // No tick elapsed: nothing to learn; keep the older baseline.
                    self.last = Some((b0, i0));
                    slots.hold(
                        Ix::Ut,
                        self.ut.value(),
                        "CPU utilisation needs a second sample",
                    );
                    return;
                }
                let x = 100.0 * db as f64 / (db + di) as f64;
                slots.ok(Ix::Ut, self.ut.update(x, now));
            }
        }
    }
}

fn online_cpus(path: &Path, buf: &mut Vec<u8>) -> Result<usize, ReadError> {
    read_file(path, buf)?;
    let text = std::str::from_utf8(buf).map_err(|e| ReadError::parse(path, e))?;
    count_cpu_list(text.trim())
        .ok_or_else(|| ReadError::parse(path, format!("not a CPU list: {:?}", text.trim())))
}

/// Counts a kernel CPU list such as `0-3,6,8-9`.
fn count_cpu_list(list: &str) -> Option<usize> {
    if list.is_empty() {
        return None;
    }
    let mut n = 0;
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let one = part.parse::<usize>().ok()?;
                (one, one)
            }
        };
        n += hi.checked_sub(lo)? + 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::count_cpu_list;

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("a"), None);
    }
}
