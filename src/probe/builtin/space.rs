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

use procfs::FromRead;

use super::{read_file, Ix, ReadError, Roots, Slots, MIB};

const MEMINFO_INDICES: [Ix; 4] = [Ix::Mem, Ix::Swp, Ix::Maxmem, Ix::Maxswp];

pub(crate) fn sample_memory(roots: &Roots, buf: &mut Vec<u8>, slots: &mut Slots) {
    let path = roots.proc.join("meminfo");
    let info = read_file(&path, buf).and_then(|()| {
        procfs::Meminfo::from_read(&buf[..]).map_err(|e| ReadError::parse(&path, e))
    });
    match info {
        Ok(m) => {
            // procfs gives bytes.
            let available = m.mem_available.unwrap_or(m.mem_free + m.buffers + m.cached);
            slots.ok(Ix::Mem, available as f64 / MIB);
            slots.ok(Ix::Swp, m.swap_free as f64 / MIB);
            slots.ok(Ix::Maxmem, m.mem_total as f64 / MIB);
            slots.ok(Ix::Maxswp, m.swap_total as f64 / MIB);
        }
        Err(e) => slots.fail(&MEMINFO_INDICES, &e.to_string()),
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
            &format!("cannot statvfs {}: {e}", roots.tmp.display()),
        ),
    }
}
