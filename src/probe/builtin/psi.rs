//! `cpu_psi mem_psi io_psi`: pressure stall information, the `some avg10` field (%) of
//! `<proc>/pressure/{cpu,memory,io}` — the share of the last 10 s in which at least one task
//! waited for that resource. The kernel already averages it: no smoothing here.
//!
//! Absent (not failed) on kernels without PSI (before 4.20, or built without CONFIG_PSI:
//! no `<proc>/pressure`) and where it is switched off (`psi=0`: reads fail with
//! EOPNOTSUPP). Parsed by hand rather than with procfs's `CpuPressure`: before Linux 5.13 the
//! cpu file has no `full` line, which it requires, and it keeps avg10 as an f32 (1.23 would
//! read 1.2300000190734863).

use super::{Ix, ReadError, Roots, Slots, Tick};

const FILES: [(Ix, &str); 3] = [
    (Ix::CpuPsi, "cpu"),
    (Ix::MemPsi, "memory"),
    (Ix::IoPsi, "io"),
];
const ALL: [Ix; 3] = [Ix::CpuPsi, Ix::MemPsi, Ix::IoPsi];

pub(crate) struct Psi {
    available: bool,
}

impl Psi {
    pub(crate) fn new(roots: &Roots, slots: &mut Slots) -> Self {
        let dir = roots.proc.join("pressure");
        let available = dir.is_dir();
        if available {
            slots.present(&ALL);
        } else {
            slots.absent(
                &ALL,
                &format!("kernel has no pressure stall information ({} missing; needs Linux >= 4.20 with CONFIG_PSI)", dir.display()),
            );
        }
        Self { available }
    }

    pub(crate) fn sample(&mut self, tick: &mut Tick<'_>) {
        if !self.available {
            return;
        }
        for (ix, file) in FILES {
            let read = tick.proc(&format!("pressure/{file}"), some_avg10);
            let slots = &mut *tick.slots;
            match read {
                Ok(v) => slots.ok(ix, v),
                Err(ReadError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::EOPNOTSUPP) =>
                {
                    self.available = false;
                    return slots.absent(&ALL, "pressure stall information is switched off (psi=0 on the kernel command line)");
                }
                Err(e) => slots.fail(&[ix], crate::value::Failure::new(e)),
            }
        }
    }
}

fn some_avg10(path: &std::path::Path, data: &[u8]) -> Result<f64, ReadError> {
    let text = std::str::from_utf8(data).map_err(|e| ReadError::parse(path, e))?;
    let some = text
        .lines()
        .find_map(|l| l.strip_prefix("some "))
        .ok_or_else(|| ReadError::parse(path, "no `some` line"))?;
    let avg10 = some
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))
        .ok_or_else(|| ReadError::parse(path, "no avg10 field"))?;
    avg10
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| ReadError::parse(path, format!("avg10={avg10:?} is not a percentage")))
}
