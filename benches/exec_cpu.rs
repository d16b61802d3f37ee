//! The agent's own CPU per exec probe run, in the shipped configuration, against the physical
//! floor measured in the same run by a separate minimal process (issue 29 item 5).
//!
//! The agent: the real `xce-agent` daemon as root, `run_as: nobody`, containment on (where
//! this host has a writable cgroup v2), PROBES (50) exec probes of a trivial `#!/bin/sh`
//! script at interval 1 s: 50 runs a second. Its figure is the daemon process's own utime +
//! stime (all its threads, children excluded: `/proc/PID/stat`) over SECS (60) seconds,
//! divided by the runs it made in that window (`xce_probe_runs_total` from `/metrics`, read
//! just before and just after the window, outside it).
//!
//! The floor: `benches/floor/spawn_floor.c`, compiled here with `cc -O2`, a process of its
//! own with nothing in it but the loop, run during the same window at the same rate (paced
//! on absolute deadlines, as the daemon's timers are): posix_spawn + pipe + read to EOF +
//! waitpid of the same script as root; fork + setuid(nobody) + exec; and, where a cgroup v2
//! mount is writable, the same with the kernel work the agent's design asks for (clone3
//! into a cgroup, a pidfd, setsid, a stderr pipe): what containment costs, without the
//! agent; and (d), the daemon's own system calls for a run (as strace shows them) replayed
//! in the daemon's order by a C loop with the daemon's descriptor count, up to 8 runs in
//! flight (`max_parallel`), the second's runs released together (`spread: host`): what is
//! left between (d) and the daemon is its runtime; and (e), (d) with the clone sharing the
//! descriptor table (CLONE_FILES) and the child unsharing only its low descriptors: what a
//! run would cost the daemon with that spawn. (d) and (e) run after the window only
//! (batched, they cost the same paced). Each its own getrusage(RUSAGE_SELF), user time shown apart.
//! Then the same loops back to back (no sleeps: warm caches, the lowest figures there
//! are), after the window.
//!
//! The window starts once every probe has run twice, and the daemon's one-off hand-back of
//! its start-up pages (`release_code_after`, set to 1s here) is behind it.
//!
//! Beside it, idle wake-ups: context switches (voluntary + involuntary, summed over
//! `/proc/PID/task/*/status`) per second of the daemon over IDLE_SECS (60), with PROBES
//! probes at interval 1h after their first runs, and with no resource configured.
//!
//! No controller link: the figure is the cost of a run, not of sending its value.
//!
//! Run (as root): `cargo bench --bench exec_cpu` (env PROBES=50 SECS=60 IDLE_SECS=60, and
//! SPREAD=probes for agent.yaml's `spread: probes`, the probes spread over the second's grid
//! slots instead of all in one; the measured binary is this build's `xce-agent`, or
//! `XCE_AGENT_BIN`).

mod support {
    pub mod daemon;
    pub mod env;
    pub mod proc_stats;
}

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::daemon::{agent_bin, exec_resources, tiny_script, Daemon};
use support::env::env_or;
use support::proc_stats::{proc_cpu, proc_rss_kib, proc_user_cpu};

/// The floor program, compiled for this run.
fn build_floor(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/floor/spawn_floor.c");
    let bin = dir.join("spawn_floor");
    let st = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc {} failed", src.display());
    bin
}

/// One of the floor's loops.
struct Variant {
    label: &'static str,
    /// spawn_floor's MODE [USER [CGROUP_DIR [FDS]]].
    args: Vec<String>,
    /// Also run paced, in the daemon's window. Not the replays: they batch a second's runs
    /// as the daemon does, so paced they cost what they do back to back (50 and 50 µs in
    /// 23i), and a fourth loop of `sh` at 500/s in the window overloaded a 2-core host and
    /// made the daemon's runs late.
    in_window: bool,
}

/// The floor's loops. `daemon_fds`: how many descriptors the daemon holds (the replays hold
/// as many: each clone copies the table).
fn floor_variants(cgroup: Option<&FloorCgroup>, daemon_fds: usize) -> Vec<Variant> {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut v = vec![
        Variant {
            label: "posix_spawn + pipe + read + waitpid",
            args: words(&["spawn"]),
            in_window: true,
        },
        Variant {
            label: "fork + setuid(nobody) + exec + pipe + read + waitpid",
            args: words(&["fork"]),
            in_window: true,
        },
    ];
    if let Some(cg) = cgroup {
        let dir = cg.0.display().to_string();
        v.push(Variant {
            label: "the same + clone3 CLONE_INTO_CGROUP + pidfd + setsid + stderr pipe",
            args: words(&["contained", "nobody", &dir]),
            in_window: true,
        });
        for (label, mode) in [
            (
                "(d) the daemon's own system calls for a run, replayed without its runtime",
                "replay",
            ),
            (
                "(e) (d) with the descriptor table shared at the clone, the child unsharing its low descriptors only",
                "replay-files",
            ),
        ] {
            v.push(Variant {
                label,
                args: words(&[mode, "nobody", &dir, &daemon_fds.to_string()]),
                in_window: false,
            });
        }
    }
    v
}

/// A cgroup of the floor's own under the cgroup v2 mount (for the `contained` loop); removed
/// when dropped. `None` where there is no writable v2 mount.
struct FloorCgroup(PathBuf);

impl FloorCgroup {
    fn make() -> Option<Self> {
        let mount = xce_agent::probe::cgroup::detect().ok()?.mount;
        let dir = mount.join(format!("xce-bench-floor-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Self(dir))
    }
}

impl Drop for FloorCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// One floor loop: CPU per run (µs) and context switches per run.
struct FloorRun {
    cpu_us: f64,
    /// Of which in user space (utime).
    user_us: f64,
    switches: f64,
}

fn floor_start(bin: &Path, args: &[String], script: &Path, runs: u64, rate: u64) -> Child {
    Command::new(bin)
        .arg(&args[0])
        .arg(script)
        .arg(runs.to_string())
        .arg(rate.to_string())
        .args(&args[1..])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start spawn_floor")
}

fn floor_finish(child: Child) -> FloorRun {
    let out = child.wait_with_output().expect("spawn_floor");
    assert!(out.status.success(), "spawn_floor failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> f64 {
        let mut words = text.split_whitespace();
        words.find(|w| *w == name);
        words.next().and_then(|v| v.parse().ok()).unwrap_or(0.0)
    };
    let runs = field("runs").max(1.0);
    FloorRun {
        cpu_us: field("cpu_us") / runs,
        user_us: field("user_us") / runs,
        switches: (field("nvcsw") + field("nivcsw")) / runs,
    }
}

/// The daemon's context switches per second and CPU (ms per second) over `secs`, and its
/// thread count at the end.
fn idle_wakeups(daemon: &Daemon, secs: u64) -> (f64, f64, usize) {
    let (s0, _) = daemon.switches();
    let c0 = proc_cpu(daemon.pid());
    std::thread::sleep(Duration::from_secs(secs));
    let (s1, threads) = daemon.switches();
    let c1 = proc_cpu(daemon.pid());
    (
        (s1.saturating_sub(s0)) as f64 / secs as f64,
        (c1 - c0) * 1e3 / secs as f64,
        threads,
    )
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("exec_cpu: skipped: the shipped configuration needs a root agent (run as root)");
        return;
    }
    let probes: usize = env_or("PROBES", 50);
    let secs: u64 = env_or("SECS", 60);
    let idle_secs: u64 = env_or("IDLE_SECS", 60);
    let dir = tempfile::tempdir().expect("tempdir");
    let script = tiny_script(dir.path());
    let floor = build_floor(dir.path());
    let rate = probes as u64;

    println!("## exec probe run: the daemon's own CPU against a C floor in a process of its own");
    println!(
        "agent: `{}` as root, run_as: nobody, {probes} exec probes at interval 1s, \
         script `#!/bin/sh\\necho 1`, window {secs} s",
        agent_bin()
    );
    // SPREAD=probes: each probe at a slot of its own (agent.yaml's `spread: probes`), spread
    // over the second's 10 grid slots; by default (`spread: host`) all run in one.
    let spread: String = env_or("SPREAD", "host".to_owned());
    println!("agent.yaml: spread: {spread}");
    // `release_code_after: 1s`: the daemon's one-off hand-back of its start-up pages (30 s
    // after the start by default) falls before the window, not inside it.
    let daemon = Daemon::start(
        dir.path(),
        &exec_resources(probes, "1s", &script),
        &format!("spread: {spread}\nrelease_code_after: 1s\n"),
    );
    // Past the startup spread and the first runs (each probe's cgroup made, its launch
    // resolved, the released code faulted back): every probe has run twice.
    daemon.wait_for_runs(2 * probes as u64);
    let daemon_fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .map(|d| d.count())
        .unwrap_or(0);
    let floor_runs = rate * secs;
    let cgroup = FloorCgroup::make();
    let variants = floor_variants(cgroup.as_ref(), daemon_fds);
    let in_window: Vec<&Variant> = variants.iter().filter(|v| v.in_window).collect();
    let paced: Vec<Child> = in_window
        .iter()
        .map(|v| floor_start(&floor, &v.args, &script, floor_runs, rate))
        .collect();
    let (r0, bad0) = daemon.runs();
    let (sw0, _) = daemon.switches();
    let c0 = proc_cpu(daemon.pid());
    let u0 = proc_user_cpu(daemon.pid());
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let c1 = proc_cpu(daemon.pid());
    let u1 = proc_user_cpu(daemon.pid());
    let wall = t0.elapsed().as_secs_f64();
    let (sw1, threads) = daemon.switches();
    let (r1, bad1) = daemon.runs();
    let paced: Vec<FloorRun> = paced.into_iter().map(floor_finish).collect();
    let contained = dir_has_cgroup(daemon.pid());
    let rss_mib = proc_rss_kib(daemon.pid(), "VmRSS:") as f64 / 1024.0;
    drop(daemon);
    let runs = r1 - r0;
    assert!(runs > 0, "the daemon made no run in the window");
    assert_eq!(bad1 - bad0, 0, "runs failed in the window");
    let agent_us = (c1 - c0) * 1e6 / runs as f64;
    let agent_user_us = (u1 - u0) * 1e6 / runs as f64;
    let agent_sw = (sw1 - sw0) as f64 / runs as f64;
    println!(
        "{runs} runs in {wall:.1} s ({:.1}/s); containment {}; {threads} threads; VmRSS {rss_mib:.1} MiB",
        runs as f64 / wall,
        if contained {
            "on (a cgroup per probe)"
        } else {
            "OFF: no writable cgroup v2 here"
        },
    );
    println!();
    println!(
        "| measured | CPU per run (µs) | of which user (µs) | agent / this | context switches per run |"
    );
    println!("|---|---|---|---|---|");
    println!("| **daemon** (utime+stime of the process, children excluded) | **{agent_us:.0}** | {agent_user_us:.0} | | {agent_sw:.1} |");
    for (v, f) in in_window.iter().zip(&paced) {
        println!(
            "| floor: {}, {rate}/s in the same window | {:.0} | {:.0} | **{:.2}x** | {:.1} |",
            v.label,
            f.cpu_us,
            f.user_us,
            agent_us / f.cpu_us,
            f.switches
        );
    }
    for v in &variants {
        let f = floor_finish(floor_start(&floor, &v.args, &script, floor_runs, 0));
        println!(
            "| floor: {}, back to back (after the window) | {:.0} | {:.0} | {:.2}x | {:.1} |",
            v.label,
            f.cpu_us,
            f.user_us,
            agent_us / f.cpu_us,
            f.switches
        );
    }
    drop(cgroup);

    if idle_secs == 0 {
        return;
    }
    println!();
    println!("## idle wake-ups of the daemon, over {idle_secs} s");
    println!("| configuration | context switches / s | CPU (ms/s) | threads |");
    println!("|---|---|---|---|");
    let daemon = Daemon::start(dir.path(), &exec_resources(probes, "1h", &script), "");
    // Every probe's first run falls in the startup spread (at most 15 s).
    daemon.wait_for_runs(probes as u64);
    std::thread::sleep(Duration::from_secs(1));
    let (per_s, cpu_ms, threads) = idle_wakeups(&daemon, idle_secs);
    println!("| {probes} exec probes at interval 1h, between runs | {per_s:.2} | {cpu_ms:.3} | {threads} |");
    drop(daemon);
    let daemon = Daemon::start(dir.path(), "resources: []\n", "");
    std::thread::sleep(Duration::from_secs(2));
    let (per_s, cpu_ms, threads) = idle_wakeups(&daemon, idle_secs);
    println!("| no resource configured | {per_s:.2} | {cpu_ms:.3} | {threads} |");
}

/// Whether the daemon made its cgroup subtree (containment on): its own cgroup moved.
fn dir_has_cgroup(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|c| c.lines().any(|l| l.starts_with("0::") && l.len() > 4))
}
