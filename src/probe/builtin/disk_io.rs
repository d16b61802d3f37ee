//! `io`: disk I/O in KB/s, 1 min average.
//!
//! `x = Σ Δ(sectors read + sectors written) * 512 / 1024 / Δt` over the whole disks of
//! /proc/diskstats (its sector unit is always 512 bytes, whatever the device's block size),
//! Δt the real time between the two samples; smoothed every 15 s with f = e^-1/4; pending
//! until the second sample.
//!
//! Whole disks only, so that nothing is counted twice: a device is counted when
//! `<sys>/block/NAME/device` exists — `/sys/block` lists whole disks (not partitions), and
//! only hardware-backed ones have `device` (loop, ram, zram, dm-*, md* have not: their I/O
//! reaches the real disks and is counted there). Without a readable `<sys>/block` the name
//! decides (no loop/ram/zram/dm-/md/sr/fd/nbd, no partition suffix). A name is classified
//! once and remembered.
//!
//! Counter reset: per disk. A disk whose counter went down, or that is new, restarts its
//! own series and adds nothing to this interval; the other disks still count.

use std::collections::HashMap;
use std::time::Instant;

use super::smoothing::{Ewma, TAU_1M};
use super::{Ix, Roots, Tick};

pub(crate) struct DiskIo {
    last: Option<(HashMap<String, u64>, Instant)>,
    kinds: HashMap<String, bool>,
    io: Ewma,
}

impl DiskIo {
    pub(crate) fn new() -> Self {
        Self {
            last: None,
            kinds: HashMap::new(),
            io: Ewma::new(TAU_1M),
        }
    }

    /// The disk set may differ under other roots.
    pub(crate) fn forget_disk_kinds(&mut self) {
        self.kinds.clear();
    }

    pub(crate) fn sample(&mut self, tick: &mut Tick<'_>) {
        let stats = tick.procfs::<procfs::DiskStats>("diskstats");
        let (roots, now, slots) = (tick.roots, tick.now, &mut *tick.slots);
        let stats = match stats {
            Ok(s) => s,
            Err(e) => return slots.fail(&[Ix::Io], crate::value::Failure::new(e)),
        };
        let mut sectors = HashMap::with_capacity(stats.0.len());
        for d in stats.0 {
            if self.is_whole_disk(roots, &d.name) {
                sectors.insert(d.name, d.sectors_read.saturating_add(d.sectors_written));
            }
        }
        let Some((before, then)) = self.last.replace((sectors, now)) else {
            return slots.pending(Ix::Io, "disk I/O rate needs a second sample");
        };
        let dt = now.saturating_duration_since(then).as_secs_f64();
        if dt == 0.0 {
            return slots.hold(
                Ix::Io,
                self.io.value(),
                "disk I/O rate needs a second sample",
            );
        }
        let Some((after, _)) = &self.last else { return };
        let grown: u64 = after
            .iter()
            .filter_map(|(name, &s)| before.get(name).and_then(|&b| s.checked_sub(b)))
            .sum();
        let kb_per_s = grown as f64 * 512.0 / 1024.0 / dt;
        slots.ok(Ix::Io, self.io.update(kb_per_s, now));
    }

    fn is_whole_disk(&mut self, roots: &Roots, name: &str) -> bool {
        if let Some(&known) = self.kinds.get(name) {
            return known;
        }
        let block = roots.sys.join("block");
        let whole = if block.is_dir() {
            block.join(name).join("device").exists()
        } else {
            whole_disk_by_name(name)
        };
        self.kinds.insert(name.to_owned(), whole);
        whole
    }
}

/// Guess from the name alone (no /sys).
fn whole_disk_by_name(name: &str) -> bool {
    const VIRTUAL: [&str; 8] = ["loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"];
    if VIRTUAL.iter().any(|p| name.starts_with(p)) {
        return false;
    }
    let ends_in_digit = name.ends_with(|c: char| c.is_ascii_digit());
    // nvme0n1p2, mmcblk0p1: partitions carry a `p<digits>` suffix after a digit.
    if name.starts_with("nvme") || name.starts_with("mmcblk") {
        let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
        return !(trimmed.ends_with('p') && ends_in_digit && trimmed.len() < name.len());
    }
    // sda1, vdb2, xvda1, hdc3: a digit after the letters is a partition.
    !ends_in_digit
}

#[cfg(test)]
mod tests {
    use super::whole_disk_by_name;

    #[test]
    fn names() {
        for whole in ["sda", "vdb", "xvda", "nvme0n1", "mmcblk0"] {
            assert!(whole_disk_by_name(whole), "{whole}");
        }
        for part in [
            "sda1",
            "vdb2",
            "nvme0n1p2",
            "mmcblk0p1",
            "loop0",
            "ram1",
            "dm-0",
            "md127",
            "sr0",
        ] {
            assert!(!whole_disk_by_name(part), "{part}");
        }
    }
}
