//! Scheduling lateness: N exec probes of interval 1 s (N per second) run by the real
//! `Scheduler` on the daemon's runtime (2 worker threads). Each probe's program is this bench
//! binary itself in `stamp` mode, which appends the wall-clock time at which it started to a
//! file; lateness = start - intended slot, where slots are wall-clock aligned:
//! (t - splay) % interval == 0 (`schedule::next_slot`). It therefore covers timer wake-up,
//! the parallelism budget, fork + exec: everything between the slot and the probe's first
//! instruction. The first 2 s (startup spread) are not counted.
//!
//! Run: `cargo bench --bench lateness` (env RATES=100,500 SECS=20 MAX_PARALLEL=8). As root
//! it runs the configuration nodes run: probes as `RUN_AS` (default nobody) and, where a
//! cgroup v2 hierarchy is writable, each probe contained in its own cgroup.

mod support {
    pub mod env;
    pub mod rusage;
}

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::env::env_or;
use support::rusage::{self, UsageWho};
use tokio_util::sync::CancellationToken;
use xce_agent::plan::Spread;
use xce_agent::probe::{BuiltinSource, ProbeContext};
use xce_agent::schedule::Scheduler;
use xce_agent::store::Store;
use xce_agent::value::Reading;

struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Probe mode: record "<resource> <start ns>" and print a value.
fn stamp(file: &str) {
    let t = now_ns();
    let name = std::env::var("XCE_RESOURCE").unwrap_or_default();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(file)
    {
        // One write() of a short line: appends from concurrent probes do not interleave.
        let _ = f.write_all(format!("{name} {t}\n").as_bytes());
    }
    println!("1");
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn one_rate(
    n: usize,
    secs: u64,
    max_parallel: usize,
    supervisor: Arc<xce_agent::probe::supervisor::Supervisor>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Writable by the probes' user, and outside plugin_dir (whose files must not be).
    let stamp_dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(stamp_dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let stamps = stamp_dir.path().join("stamps");
    let exe = std::env::current_exe().expect("current_exe");
    let mut yaml = String::from("resources:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - name: p{i}\n    interval: 1s\n    probe: {{kind: exec, command: [{}, stamp, {}], format: value, timeout: 5s}}\n",
            exe.display(),
            stamps.display()
        ));
    }
    let res = xce_agent::config::resources::parse(std::path::Path::new("resources.yaml"), &yaml)
        .expect("resources parse");
    let plan = xce_agent::plan::make_plan(&res, "node001", &Default::default(), Spread::Host);
    let splay: HashMap<String, u128> = plan
        .tasks
        .iter()
        .map(|t| (t.name.clone(), t.splay.as_nanos()))
        .collect();
    let store = Arc::new(Store::new());
    store.declare(xce_agent::daemon::declared(&plan));
    let ctx = ProbeContext {
        host: "node001".into(),
        plugin_dir: dir.path().to_owned(),
        run_as: env_or("RUN_AS", "nobody".to_owned()),
        builtin: Arc::new(NoBuiltins),
        files: xce_agent::probe::file_reader::FileReads::new(32),
        supervisor,
    };
    let cpu0 = rusage::cpu(UsageWho::RUSAGE_SELF);
    let t0 = now_ns();
    let mut sched = Scheduler::new(store.clone(), ctx, max_parallel, CancellationToken::new());
    sched.start(&plan);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let stats = sched.stats.clone();
    sched.stop().await;
    let cpu = rusage::cpu(UsageWho::RUSAGE_SELF) - cpu0;
    let skipped: u64 = stats
        .all()
        .iter()
        .map(|(_, s)| s.skipped_overlap.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let text = std::fs::read_to_string(&stamps).unwrap_or_default();
    let warm = t0 + 2_000_000_000;
    let end = t0 + u128::from(secs) * 1_000_000_000;
    let interval = 1_000_000_000u128;
    let mut late_ms: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let (name, t) = l.split_once(' ')?;
            let t: u128 = t.parse().ok()?;
            let s = *splay.get(name)?;
            (t >= warm && t < end).then(|| ((t + interval - s % interval) % interval) as f64 / 1e6)
        })
        .collect();
    late_ms.sort_by(f64::total_cmp);
    if late_ms.is_empty() {
        if let Some(r) = store.get("p0", "") {
            println!("no run counted; p0: {:?}", r.error);
        }
    }
    let expected = n as u64 * (secs - 2);
    println!(
        "| {n}/s | {max_parallel} | {} of {expected} | {skipped} | {:.2} | {:.2} | {:.2} | {:.0} |",
        late_ms.len(),
        pct(&late_ms, 0.5),
        pct(&late_ms, 0.99),
        late_ms.last().copied().unwrap_or(f64::NAN),
        cpu.as_secs_f64() * 1e6 / late_ms.len().max(1) as f64,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("stamp") {
        stamp(args.get(2).map_or("/dev/null", String::as_str));
        return;
    }
    let rates: Vec<usize> = std::env::var("RATES")
        .unwrap_or_else(|_| "100,500".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let secs: u64 = env_or("SECS", 20u64).max(4);
    let max_parallel: usize = env_or("MAX_PARALLEL", 8);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let supervisor = rt.block_on(async { xce_agent::probe::supervisor::Supervisor::start() });
    let contained = supervisor.containment.tree().is_some();
    println!(
        "scheduling lateness, {secs} s per rate, first 2 s not counted; agent {}, probes as {}, containment {}",
        if nix::unistd::geteuid().is_root() { "root" } else { "not root" },
        env_or("RUN_AS", "nobody".to_owned()),
        if contained { "on" } else { "off" }
    );
    println!("| rate | max_parallel | runs counted | skipped (overlap) | p50 ms | p99 ms | max ms | agent CPU/run µs |\n|---|---|---|---|---|---|---|---|");
    for n in rates {
        rt.block_on(one_rate(n, secs, max_parallel, supervisor.clone()));
    }
    supervisor.containment.shut_down();
}
