//! One full builtin sampler tick (fast + slow) against the raw cost of the same I/O:
//! `std::fs::read` of the same /proc and /sys files, and that plus the directory listings,
//! stats and statvfs the tick does. Run: `cargo bench --bench sampler`.

use std::path::Path;
use std::time::Instant;

use xce_agent::probe::builtin::{Roots, Sampler};

fn main() {
    divan::main();
}

const FILES: [&str; 9] = [
    "/proc/loadavg",
    "/proc/stat",
    "/sys/devices/system/cpu/online",
    "/proc/vmstat",
    "/proc/diskstats",
    "/proc/meminfo",
    "/proc/pressure/cpu",
    "/proc/pressure/memory",
    "/proc/pressure/io",
];

/// The sampler: parse, compare, smooth, for every index.
#[divan::bench]
fn tick(bencher: divan::Bencher) {
    let mut s = Sampler::new(Roots::host());
    bencher.bench_local(|| {
        let now = Instant::now();
        s.fast_tick(now);
        s.slow_tick(now);
    });
}

/// Only reading the same files, nothing parsed.
#[divan::bench]
fn raw_read() -> usize {
    FILES
        .iter()
        .map(|f| std::fs::read(f).map_or(0, |b| b.len()))
        .sum()
}

/// Reading the same files plus the other system calls a tick must make (/tmp statvfs,
/// logind/utmp, a stat per login terminal and per /dev/input entry, uptime when there is
/// none), with no parsing beyond finding the terminal names those stats need.
#[divan::bench]
fn raw_io() -> usize {
    let mut n = raw_read();
    n += nix::sys::statvfs::statvfs("/tmp").map_or(0, |s| s.blocks() as usize);
    let mut ttys: Vec<String> = Vec::new();
    let sessions = Path::new("/run/systemd/sessions");
    if sessions.is_dir() {
        for e in std::fs::read_dir(sessions).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            n += text.len();
            ttys.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("TTY="))
                    .map(str::to_owned),
            );
        }
    } else {
        let utmp = std::fs::read("/var/run/utmp").unwrap_or_default();
        n += utmp.len();
        for rec in utmp.chunks_exact(384).filter(|r| r[0] == 7 && r[1] == 0) {
            let line = &rec[8..40];
            let end = line.iter().position(|&b| b == 0).unwrap_or(line.len());
            ttys.push(String::from_utf8_lossy(&line[..end]).into_owned());
        }
    }
    let mut seen = 0;
    for tty in &ttys {
        if let Ok(m) = std::fs::metadata(Path::new("/dev").join(tty)) {
            seen += 1;
            n += m.len() as usize;
        }
    }
    for e in std::fs::read_dir("/dev/input")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(m) = e.metadata() {
            seen += 1;
            n += m.len() as usize;
        }
    }
    if seen == 0 {
        n += std::fs::read("/proc/uptime").map_or(0, |b| b.len());
    }
    n
}
