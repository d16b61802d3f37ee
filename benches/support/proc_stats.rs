//! Another process's CPU (utime + stime) and memory figures from /proc, for the benches.

/// utime + stime of `pid`, in seconds.
#[allow(dead_code)] // not benches/exec_ab.rs
pub fn proc_cpu(pid: u32) -> f64 {
    stat_cpu(&format!("/proc/{pid}/stat"))
}

/// utime + stime of thread `tid` of `pid` (its main thread: `tid` = `pid`), in seconds.
#[allow(dead_code)] // benches/controller.rs (through receiver.rs); not every includer
pub fn thread_cpu(pid: u32, tid: u32) -> f64 {
    stat_cpu(&format!("/proc/{pid}/task/{tid}/stat"))
}

/// utime of `pid` alone (user space), in seconds.
#[allow(dead_code)] // benches/exec_cpu.rs; not every includer
pub fn proc_user_cpu(pid: u32) -> f64 {
    stat_fields(&format!("/proc/{pid}/stat"), false)
}

fn stat_cpu(path: &str) -> f64 {
    stat_fields(path, true)
}

/// utime (+ stime with `system`) from a stat file, in seconds.
fn stat_fields(path: &str, system: bool) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // Fields 14 and 15 of stat; `rest` starts at field 3.
    let stime = if system {
        f.get(12).copied().unwrap_or(0)
    } else {
        0
    };
    let ticks = f.get(11).copied().unwrap_or(0) + stime;
    ticks as f64 / procfs::ticks_per_second() as f64
}

/// Time on a CPU of every thread of `pid` now (user and system, the scheduler's own count
/// in `/proc/PID/task/*/schedstat`), in seconds: nanoseconds, where `/proc/PID/stat` counts
/// 10 ms ticks. Threads that have exited are not in it.
#[allow(dead_code)] // benches/exec_ab.rs; not every includer
pub fn proc_sched_cpu(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// CPU of the probes a contained agent `pid` ran (their `probes` cgroup's `cpu.stat`
/// `usage_usec`: every child, exited ones included), in seconds; `None` where the agent is
/// not in a cgroup v2 subtree of its own (containment off).
#[allow(dead_code)] // benches/exec_ab.rs; not every includer
pub fn probes_cgroup_cpu(pid: u32) -> Option<f64> {
    let agent = xce_agent::probe::cgroup::dir_of(pid)?;
    let stat = std::fs::read_to_string(agent.parent()?.join("probes/cpu.stat")).ok()?;
    let usec: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))?
        .parse()
        .ok()?;
    Some(usec as f64 / 1e6)
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`).
#[allow(dead_code)] // not benches/exec_ab.rs
pub fn proc_rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
