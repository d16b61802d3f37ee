//! What one `xce-agent status` answer costs the daemon, for N resources (default 10,000,
//! the size the daemon is sized for), against a floor measured in the same run: the store's
//! snapshot serialized to JSON on its own (the least any answer carrying the values costs).
//! CPU is the measuring thread's utime+stime (getrusage RUSAGE_THREAD), per answer. Then the
//! real socket: the status server on a unix socket in a temp dir and `status::client::query`
//! against it, wall time per answer (client and server on one current-thread runtime).
//!
//! Run: `cargo bench --bench status` (env N=10000 ROUNDS=50).

mod support {
    pub mod env;
    pub mod rusage;
}

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use support::env::env_or;
use support::rusage::{self, UsageWho};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xce_agent::link::client::LinkStats;
use xce_agent::stats::Stats;
use xce_agent::status::{self, Loaded, Sources};
use xce_agent::store::Store;
use xce_agent::value::{Reading, Value};

/// CPU per call of `f`, over `rounds` calls.
fn cpu_per(rounds: u32, mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut bytes = 0;
    let before = rusage::cpu(UsageWho::RUSAGE_THREAD);
    for _ in 0..rounds {
        bytes = std::hint::black_box(f());
    }
    (
        (rusage::cpu(UsageWho::RUSAGE_THREAD) - before) / rounds,
        bytes,
    )
}

fn main() {
    let n: usize = env_or("N", 10_000);
    let rounds: u32 = env_or("ROUNDS", 50);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut yaml = String::from("resources:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - name: res{i}\n    valtype: numeric\n    interval: 60s\n    \
             resourcemap: [{{location: [default]}}]\n    probe: {{kind: exec, command: [probe.sh]}}\n"
        ));
    }
    std::fs::write(dir.path().join("resources.yaml"), yaml).expect("write resources");
    std::fs::write(
        dir.path().join("agent.yaml"),
        "host: node001\nrun_as: root\n",
    )
    .expect("write");
    let config =
        xce_agent::daemon::load_config(&dir.path().join("agent.yaml"), None).expect("valid config");
    let plan = xce_agent::plan::plan_for(&config, "node001", &BTreeSet::new());
    let store = Arc::new(Store::new());
    store.declare(xce_agent::daemon::declared(&plan));
    let now = SystemTime::now();
    for (i, t) in plan.tasks.iter().enumerate() {
        let reading = Reading::Ok(Value::Numeric(i as f64 * 1.5));
        store.record(&t.name, &t.instance, reading, now);
    }
    let stats = Arc::new(Stats::default());
    let (_probes_tx, probes) = watch::channel(stats);
    let (_loaded_tx, loaded) = watch::channel(Arc::new(Loaded::new(&config, &plan, 1)));
    let src = Sources {
        store: store.clone(),
        link: Arc::new(LinkStats::default()),
        probes,
        loaded,
        started: now,
    };

    let (floor, floor_bytes) = cpu_per(rounds, || {
        let (_, resvals) = store.snapshot();
        serde_json::to_vec(&resvals).expect("json").len()
    });
    let (answer, answer_bytes) = cpu_per(rounds, || {
        let report = status::snapshot(&src, &[]);
        serde_json::to_vec(&report).expect("json").len()
    });
    println!("resources: {n}, rounds: {rounds}");
    println!(
        "floor   (store snapshot -> JSON):   {:>8.2} ms CPU, {floor_bytes} bytes",
        floor.as_secs_f64() * 1e3
    );
    println!(
        "answer  (status::snapshot -> JSON): {:>8.2} ms CPU, {answer_bytes} bytes, {:.2}x the floor",
        answer.as_secs_f64() * 1e3,
        answer.as_secs_f64() / floor.as_secs_f64()
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let path = dir.path().join("status.sock");
        let listener = status::server::bind(&path, None).expect("bind");
        let stop = CancellationToken::new();
        let server = tokio::spawn(status::server::serve(listener, src.clone(), stop.clone()));
        let started = Instant::now();
        for _ in 0..rounds {
            let report = status::client::query(&path, &[]).await.expect("answer");
            assert_eq!(report.resources.len(), n);
        }
        let per = started.elapsed() / rounds;
        println!(
            "socket  (query over the unix socket, parse included): {:>8.2} ms wall per answer",
            per.as_secs_f64() * 1e3
        );
        stop.cancel();
        let _ = server.await;
    });
}
