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

/// Reading the same files plus the other system calls a tick must make (terminal atimes,
/// /tmp statvfs, logind/utmp, uptime when there is no terminal), with no parsing.
#[divan::bench]
fn raw_io() -> usize {
    let mut n = raw_read();
    n += nix::sys::statvfs::statvfs("/tmp").map_or(0, |s| s.blocks() as usize);
    let sessions = Path::new("/run/systemd/sessions");
    if sessions.is_dir() {
        for e in std::fs::read_dir(sessions).into_iter().flatten().flatten() {
            n += std::fs::read(e.path()).map_or(0, |b| b.len());
        }
    } else {
        n += std::fs::read("/var/run/utmp").map_or(0, |b| b.len());
    }
    let mut ttys = 0;
    for dir in ["/dev/pts", "/dev", "/dev/input"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let keep = match dir {
                "/dev" => name
                    .strip_prefix("tty")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())),
                "/dev/pts" => name != "ptmx",
                _ => true,
            };
            if keep {
                ttys += 1;
                n += e.metadata().map_or(0, |m| m.len() as usize);
            }
        }
    }
    if ttys == 0 {
        n += std::fs::read("/proc/uptime").map_or(0, |b| b.len());
    }
    n
}
