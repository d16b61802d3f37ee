//! Agent-side CPU per exec probe run, children excluded: `probe::run_once` (process group,
//! cleared environment, pipes drained on the runtime, deadline timers, output parsed and
//! typed) against a bare blocking `std::process::Command::output()` loop of the same script
//! (std uses posix_spawn + pipes + waitpid for it). CPU is getrusage(RUSAGE_SELF) — every
//! thread of this process, the runtime's included — so it does not depend on how busy the
//! shared machine is; RUSAGE_CHILDREN shows the children cost the same on both sides.
//!
//! Run: `cargo bench --bench exec_cpu` (env RUNS, default 2000 per side).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xce_agent::probe::{self, BuiltinSource, ProbeContext};
use xce_agent::value::Reading;

struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}

fn cpu(who: i32) -> Duration {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[derive(Default)]
struct Side {
    runs: u32,
    self_cpu: Duration,
    child_cpu: Duration,
    wall: Duration,
}

impl Side {
    fn measure(&mut self, runs: u32, f: impl FnOnce()) {
        let (s0, c0, w0) = (
            cpu(libc::RUSAGE_SELF),
            cpu(libc::RUSAGE_CHILDREN),
            Instant::now(),
        );
        f();
        self.wall += w0.elapsed();
        self.self_cpu += cpu(libc::RUSAGE_SELF) - s0;
        self.child_cpu += cpu(libc::RUSAGE_CHILDREN) - c0;
        self.runs += runs;
    }

    fn per_run(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / f64::from(self.runs.max(1))
    }
}

fn main() {
    let runs: u32 = std::env::var("RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = dir.path().join("tiny.sh");
    std::fs::write(&script, "#!/bin/sh\necho 1\n").expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let yaml = format!(
        "resources:\n  - name: tiny\n    interval: 1s\n    probe: {{kind: exec, command: [{}], format: value}}\n",
        script.display()
    );
    let res = xce_agent::config::resources::parse(std::path::Path::new("resources.yaml"), &yaml)
        .expect("resources parse");
    let plan = xce_agent::plan::make_plan(&res, "node001", &Default::default());
    let task = plan.tasks[0].clone();
    let ctx = ProbeContext {
        host: "node001".into(),
        plugin_dir: dir.path().to_owned(),
        // As root, run probes as root so the comparison has no setuid in one side only.
        run_as: "root".into(),
        builtin: std::sync::Arc::new(NoBuiltins),
        files: xce_agent::probe::file_reader::FileReads::new(32),
    };
    // The daemon's runtime: multi-thread, 2 workers.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let bare_once = || {
        let out = Command::new(&script)
            .env_clear()
            .env("PATH", probe::process::PROBE_PATH)
            .stdin(Stdio::null())
            .output()
            .expect("spawn");
        assert!(out.status.success() && out.stdout == b"1\n");
    };
    // The same, with a no-op pre_exec hook and its own process group, as process.rs sets
    // them: a pre_exec hook makes std fork() instead of posix_spawn (vfork-like).
    let forked_once = || {
        let mut cmd = Command::new(&script);
        cmd.env_clear()
            .env("PATH", probe::process::PROBE_PATH)
            .stdin(Stdio::null())
            .process_group(0);
        // SAFETY: the hook does nothing.
        unsafe { cmd.pre_exec(|| Ok(())) };
        let out = cmd.output().expect("spawn");
        assert!(out.status.success() && out.stdout == b"1\n");
    };
    let agent_once = || {
        rt.block_on(async {
            let r = probe::run_once(&task, &ctx).await;
            assert_eq!(r.outcome, probe::Outcome::Ok, "{:?}", r.error());
        })
    };
    // Warm up both paths (page cache, runtime threads, allocator).
    for _ in 0..50 {
        bare_once();
        forked_once();
        agent_once();
    }
    let (mut bare, mut forked, mut agent) = (Side::default(), Side::default(), Side::default());
    // Interleave blocks so background load on the shared machine hits both sides alike.
    let block = 100.min(runs);
    let mut done = 0;
    while done < runs {
        bare.measure(block, || (0..block).for_each(|_| bare_once()));
        forked.measure(block, || (0..block).for_each(|_| forked_once()));
        agent.measure(block, || (0..block).for_each(|_| agent_once()));
        done += block;
    }
    println!(
        "exec probe run, {} runs per side, script `#!/bin/sh\\necho 1`",
        bare.runs
    );
    println!(
        "| side | parent CPU/run (µs) | children CPU/run (µs) | wall/run (µs) |\n|---|---|---|---|"
    );
    for (name, s) in [
        ("bare std Command::output() (posix_spawn)", &bare),
        ("same + process_group(0) + no-op pre_exec (fork)", &forked),
        ("xce_agent::probe::run_once", &agent),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            s.per_run(s.self_cpu),
            s.per_run(s.child_cpu),
            s.per_run(s.wall)
        );
    }
    let ratio = |a: &Side, b: &Side| a.self_cpu.as_secs_f64() / b.self_cpu.as_secs_f64().max(1e-9);
    println!(
        "ratio parent CPU agent/bare = {:.2}x (target <= 1.5x); agent/fork = {:.2}x; fork/bare = {:.2}x",
        ratio(&agent, &bare),
        ratio(&agent, &forked),
        ratio(&forked, &bare)
    );
}
