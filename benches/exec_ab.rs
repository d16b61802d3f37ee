//! Two agent builds (or two settings) side by side: the daemon's own CPU per exec run of
//! each, both running at once, in the same windows.
//!
//! On a VM the daemon's CPU per run moves by a third between consecutive windows while C
//! loops stay put (BENCHMARKS.md 23k), so a build measured in one window and its rival in
//! the next compare the host's moods as much as the builds. Here both daemons run
//! together, each with its own PROBES exec probes of a trivial `#!/bin/sh` script at 1 s (as
//! root, `run_as: nobody`, containment on where this host has a writable cgroup v2, as
//! `exec_cpu`), so whatever the host does in a window it does to both. CPU is each daemon's
//! threads' time on a CPU from `/proc/PID/task/*/schedstat` (nanoseconds; `/proc/PID/stat`
//! counts 10 ms ticks, 6.7 µs a run in a 30 s window at 50/s), over runs counted from each
//! one's `/metrics`. ROUNDS windows of SECS seconds, the daemons started afresh for each,
//! which one starts first alternating. Two runs of the same binary differ by about 5 %
//! (23k), the method's own noise. Beside each, its probes' own CPU per run (their `probes`
//! cgroup's `cpu.stat`, where containment is on): the children's part, which the daemon's
//! figure leaves out (what a spawn moves from the agent to its children shows there).
//!
//! Run (as root): `B=/path/to/other/xce-agent cargo bench --bench exec_ab` (env A: the first
//! binary, this build's `xce-agent` by default; B: the second, A by default; EXTRA_A /
//! EXTRA_B: more agent.yaml lines for each, `;` between lines, e.g. `max_parallel: 64`;
//! PROBES=50 SECS=30 ROUNDS=3).

mod support {
    pub mod daemon;
    pub mod env;
    pub mod proc_stats;
}

use std::time::Duration;

use support::daemon::{agent_bin, exec_resources, tiny_script, Daemon};
use support::env::env_or;
use support::proc_stats::{probes_cgroup_cpu, proc_sched_cpu};

/// One side: a binary and its agent.yaml additions.
struct Side {
    label: &'static str,
    bin: String,
    extra: String,
}

impl Side {
    fn from_env(label: &'static str, default_bin: &str) -> Self {
        let bin: String = env_or(label, default_bin.to_owned());
        let extra: String = env_or(&format!("EXTRA_{label}"), String::new());
        let extra: String = extra
            .split(';')
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("{}\n", l.trim()))
            .collect();
        Self { label, bin, extra }
    }

    fn describe(&self) -> String {
        let extra = self.extra.trim_end().replace('\n', "; ");
        match extra.is_empty() {
            true => format!("{}: `{}`", self.label, self.bin),
            false => format!("{}: `{}` with `{extra}`", self.label, self.bin),
        }
    }
}

/// A daemon of `side` on PROBES probes in a directory of its own.
fn start(side: &Side, probes: usize) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = tiny_script(dir.path());
    let extra = format!("spread: host\nrelease_code_after: 1s\n{}", side.extra);
    let daemon = Daemon::start_bin(
        &side.bin,
        dir.path(),
        &exec_resources(probes, "1s", &script),
        &extra,
    );
    (daemon, dir)
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("exec_ab: skipped: the shipped configuration needs a root agent (run as root)");
        return;
    }
    let probes: usize = env_or("PROBES", 50);
    let secs: u64 = env_or("SECS", 30);
    let rounds: usize = env_or("ROUNDS", 3);
    let a = Side::from_env("A", &agent_bin());
    let b = Side::from_env("B", &a.bin);
    println!("## exec probe run: two daemons at once, CPU per run of each");
    println!(
        "{}; {}; {probes} exec probes each at interval 1s, script `#!/bin/sh\\necho 1`, \
         {rounds} windows of {secs} s",
        a.describe(),
        b.describe()
    );
    println!();
    println!(
        "| window | A µs/run (runs) | B µs/run (runs) | B / A | A's probes µs/run | B's probes µs/run |"
    );
    println!("|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for round in 0..rounds {
        // Which one starts first alternates: neither always gets the quieter start.
        let order: [&Side; 2] = if round % 2 == 0 { [&a, &b] } else { [&b, &a] };
        let started: Vec<(Daemon, tempfile::TempDir)> =
            order.iter().map(|s| start(s, probes)).collect();
        // Past the start: every probe has run twice (its cgroup made, its launch
        // resolved, the start-up pages handed back).
        for (d, _) in &started {
            d.wait_for_runs(2 * probes as u64);
        }
        let read = |d: &Daemon| {
            let cpu = proc_sched_cpu(d.pid());
            let (runs, failed) = d.runs();
            (runs, failed, cpu, probes_cgroup_cpu(d.pid()))
        };
        let before: Vec<_> = started.iter().map(|(d, _)| read(d)).collect();
        std::thread::sleep(Duration::from_secs(secs));
        let after: Vec<_> = started.iter().map(|(d, _)| read(d)).collect();
        drop(started);
        let per_run: Vec<(f64, u64, Option<f64>)> = before
            .iter()
            .zip(&after)
            .map(|((r0, f0, c0, p0), (r1, f1, c1, p1))| {
                assert!(r1 > r0, "a daemon made no run in the window");
                assert_eq!(f1, f0, "runs failed in the window");
                let runs = (r1 - r0) as f64;
                let probes = p0.zip(*p1).map(|(p0, p1)| (p1 - p0) * 1e6 / runs);
                ((c1 - c0) * 1e6 / runs, r1 - r0, probes)
            })
            .collect();
        // Back to A, B order.
        let (fa, fb) = if round % 2 == 0 {
            (per_run[0], per_run[1])
        } else {
            (per_run[1], per_run[0])
        };
        let ratio = fb.0 / fa.0;
        ratios.push(ratio);
        let child = |c: Option<f64>| c.map_or("-".to_owned(), |c| format!("{c:.0}"));
        println!(
            "| {} | {:.0} ({}) | {:.0} ({}) | {ratio:.2} | {} | {} |",
            round + 1,
            fa.0,
            fa.1,
            fb.0,
            fb.1,
            child(fa.2),
            child(fb.2)
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!();
    println!(
        "B / A: median {:.2}, from {:.2} to {:.2}",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}
