//! `mem swp maxmem maxswp` from /proc/meminfo and `tmp maxtmp` from statvfs, in MB (MiB,
//! as LSF), unrounded.
//!
//! - `mem` = MemAvailable (what `free` shows as "available": memory new work can get without
//!   swapping). Kernels before 3.14 have no MemAvailable: MemFree + Buffers + Cached there.
//! - `swp` = SwapFree, `maxswp` = SwapTotal, `maxmem` = MemTotal.
//! - `tmp` = f_bavail * f_frsize of the file system holding `<tmp>` (space an unprivileged
//!   user can still write, as `df` shows), `maxtmp` = f_blocks * f_frsize.
//!
//! Instantaneous values, no smoothing (LSF does not smooth them either).

use super::{Ix, Roots, Slots, Tick, MEMINFO, MIB};

/// `mem`: MemAvailable, or where the kernel has none (before 3.14) its old approximation.
pub(super) fn available(m: &procfs::Meminfo) -> u64 {
    m.mem_available.unwrap_or(m.mem_free + m.buffers + m.cached)
}

/// Every index of the table's `meminfo:` column, from one read of /proc/meminfo.
pub(crate) fn sample_memory(tick: &mut Tick<'_>) {
    let info = tick.procfs::<procfs::Meminfo>("meminfo");
    let slots = &mut *tick.slots;
    match info {
        Ok(m) => {
            for (ix, field) in MEMINFO {
                // procfs gives bytes.
                slots.ok(*ix, field(&m) as f64 / MIB);
            }
        }
        Err(e) => {
            let indices: Vec<Ix> = MEMINFO.iter().map(|(ix, _)| *ix).collect();
            slots.fail(&indices, crate::value::Failure::new(e));
        }
    }
}

pub(crate) fn sample_tmp(roots: &Roots, slots: &mut Slots) {
    match nix::sys::statvfs::statvfs(&roots.tmp) {
        Ok(st) => {
            let frsize = st.fragment_size() as f64;
            slots.ok(Ix::Tmp, st.blocks_available() as f64 * frsize / MIB);
            slots.ok(Ix::Maxtmp, st.blocks() as f64 * frsize / MIB);
        }
        Err(e) => slots.fail(
            &[Ix::Tmp, Ix::Maxtmp],
            format!("cannot statvfs {}: {e}", roots.tmp.display()),
        ),
    }
}
