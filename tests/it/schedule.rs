//! The scheduler: no overlapping runs, a global budget, readings into the store. Tokio's
//! clock is paused, so the scheduler's ticks cost no real time; the probes are real processes
//! blocked on a FIFO until the test releases them, so no assertion depends on how fast
//! anything runs.

use crate::support as common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{script, Setup};
use tokio_util::sync::CancellationToken;
use xce_agent::config::resources;
use xce_agent::plan::{make_plan, Spread};
use xce_agent::schedule::Scheduler;
use xce_agent::store::Store;
use xce_agent::value::{Status, Value};

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Advance the paused clock a second at a time, giving the real probe processes a few real
/// milliseconds between steps (the paused clock does not wait for process I/O), until `done`.
/// The real-time limit is a hang guard, not a timing assertion.
async fn advance_until(mut done: impl FnMut() -> bool) -> bool {
    let guard = std::time::Instant::now() + common::HANG_GUARD;
    while std::time::Instant::now() < guard {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}

fn blocking_setup(probes: &[&str]) -> (Setup, std::path::PathBuf, std::path::PathBuf) {
    let mut yaml = String::from("resources:\n");
    for p in probes {
        yaml.push_str(&format!(
            "  - name: {p}\n    interval: 1s\n    probe: {{kind: exec, command: [block.sh], timeout: 1h}}\n"
        ));
    }
    let s = Setup::new(&yaml);
    let fifo = s.path().join("gate");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let runs = s.path().join("runs");
    script(
        s.path(),
        "block.sh",
        &format!(
            "#!/bin/sh\necho \"$XCE_RESOURCE\" >> {}\nread x < {}\necho 1\n",
            runs.display(),
            fifo.display()
        ),
    );
    (s, fifo, runs)
}

fn start(s: &Setup, max_parallel: usize) -> (Scheduler, Arc<Store>) {
    let text = std::fs::read_to_string(s.path().join("resources.yaml")).unwrap();
    let r = resources::parse(&s.path().join("resources.yaml"), &text).unwrap();
    let plan = make_plan(&r, "node001", &Default::default(), Spread::Host);
    let store = Arc::new(Store::new());
    store.declare(xce_agent::daemon::declared(&plan));
    let (_, ctx) = common::task_from_yaml(&text, &plan.tasks[0].name, s.path());
    let mut sched = Scheduler::new(store.clone(), ctx, max_parallel, CancellationToken::new());
    sched.start(&plan);
    (sched, store)
}

#[tokio::test(start_paused = true)]
async fn a_probe_still_running_is_skipped_not_overlapped() {
    let (s, fifo, runs) = blocking_setup(&["slow"]);
    let (sched, store) = start(&s, 8);
    let stats = sched.stats.probe("slow");
    assert!(advance_until(|| lines(&runs) == 1).await);
    assert!(advance_until(|| stats.skipped_overlap.load(Ordering::Relaxed) >= 3).await);
    assert_eq!(
        lines(&runs),
        1,
        "a second copy was started while the first ran"
    );
    // Release the run: its value lands and the next tick runs again.
    let mut versions = store.subscribe();
    std::fs::write(&fifo, "go\n").unwrap();
    tokio::time::timeout(Duration::from_secs(3600), async {
        while store.get("slow", "").unwrap().status != Status::Ok {
            versions.changed().await.unwrap();
        }
    })
    .await
    .unwrap();
    assert_eq!(store.get("slow", "").unwrap().value, Value::Numeric(1.0));
    assert!(advance_until(|| lines(&runs) >= 2).await);
    sched.stop().await;
}

/// The three probes (1 s, `spread: host`) fall due at the same instants: a burst, of which
/// `max_parallel` run and the rest wait their turn.
#[tokio::test(start_paused = true)]
async fn max_parallel_bounds_running_probes() {
    let (s, fifo, runs) = blocking_setup(&["a", "b", "c"]);
    let (sched, _store) = start(&s, 2);
    assert!(advance_until(|| lines(&runs) >= 2).await);
    // Plenty of ticks later, the third probe still waits for a slot.
    let mut ticks = 0;
    advance_until(|| {
        ticks += 1;
        ticks > 30
    })
    .await;
    assert_eq!(lines(&runs), 2);
    // One finishes: the waiting one gets its slot.
    std::fs::write(&fifo, "go\n").unwrap();
    assert!(advance_until(|| lines(&runs) >= 3).await);
    sched.stop().await;
}

/// A rate's first sample (`ut` before its second /proc/stat read) is pending, and pending is
/// not an error: the run has no error (so the scheduler logs no WARN, which it does only for
/// `run.error()`), and the store's resval carries no error text on the wire.
#[tokio::test]
async fn a_first_sample_that_is_pending_is_no_error() {
    struct FirstSample;
    impl xce_agent::probe::BuiltinSource for FirstSample {
        fn reading(&self, _index: &str) -> Option<xce_agent::value::Reading> {
            Some(xce_agent::value::Reading::Pending(
                "CPU utilisation needs a second sample".into(),
            ))
        }
    }
    let yaml = "resources:\n  - {name: ut, interval: 15s, probe: {kind: builtin}}\n";
    let r = resources::parse(std::path::Path::new("r.yaml"), yaml).unwrap();
    let plan = make_plan(&r, "node001", &Default::default(), Spread::Host);
    let (_, mut ctx) = common::task_from_yaml(yaml, "ut", std::path::Path::new("/"));
    ctx.builtin = Arc::new(FirstSample);
    let store = Store::new();
    store.declare(xce_agent::daemon::declared(&plan));
    let runs = xce_agent::schedule::run_all_once(&plan, &ctx, &store, 1, &Default::default()).await;
    assert_eq!(runs[0].1.error(), None);
    let resval = store.get("ut", "").unwrap();
    assert_eq!((resval.status, resval.error), (Status::Pending, None));
}

/// A value whose probe stops reporting (its next run is stuck, with an hour's timeout)
/// goes stale at its stale time by the store's sweeper alone, which wakes when a value
/// can go stale rather than on a fixed tick.
#[tokio::test]
async fn a_value_nobody_refreshes_is_swept_stale() {
    let (s, fifo, _runs) = blocking_setup(&["slow"]);
    let resources = s.path().join("resources.yaml");
    let yaml = std::fs::read_to_string(&resources).unwrap();
    std::fs::write(
        &resources,
        yaml.replace("timeout: 1h}", "timeout: 1h, stale_after: 2s}"),
    )
    .unwrap();
    let (sched, store) = start(&s, 8);
    // The first run waits on the FIFO; opening it for writing waits for that run.
    tokio::task::spawn_blocking(move || std::fs::write(&fifo, "go\n").unwrap());
    let versions = store.subscribe();
    let status = |want: Status| {
        let store = store.clone();
        let mut versions = versions.clone();
        async move {
            while store.get("slow", "").unwrap().status != want {
                versions.changed().await.unwrap();
            }
        }
    };
    common::guard("the first value", status(Status::Ok)).await;
    common::guard("the value going stale", status(Status::Stale)).await;
    let slow = store.get("slow", "").unwrap();
    assert_eq!(slow.value, Value::Unknown);
    assert!(
        slow.error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("stale after 2s")),
        "{slow:?}"
    );
    sched.stop().await;
}

/// A run that panics (a bug) costs that run, not the probe: its loop runs it again at the
/// next tick.
#[tokio::test(start_paused = true)]
async fn a_run_that_panics_is_run_again_at_the_next_tick() {
    use std::sync::atomic::AtomicBool;
    struct PanicsOnce(AtomicBool);
    impl xce_agent::probe::BuiltinSource for PanicsOnce {
        fn reading(&self, _index: &str) -> Option<xce_agent::value::Reading> {
            assert!(self.0.swap(true, Ordering::Relaxed), "a bug in a run");
            Some(xce_agent::value::Reading::Ok(Value::Numeric(3.0)))
        }
    }
    let yaml = "resources:\n  - {name: ut, interval: 1s, probe: {kind: builtin}}\n";
    let r = resources::parse(std::path::Path::new("r.yaml"), yaml).unwrap();
    let plan = make_plan(&r, "node001", &Default::default(), Spread::Host);
    let (_, mut ctx) = common::task_from_yaml(yaml, "ut", std::path::Path::new("/"));
    ctx.builtin = Arc::new(PanicsOnce(AtomicBool::new(false)));
    let store = Arc::new(Store::new());
    store.declare(xce_agent::daemon::declared(&plan));
    let mut sched = Scheduler::new(store.clone(), ctx, 4, CancellationToken::new());
    sched.start(&plan);
    assert!(advance_until(|| store.get("ut", "").unwrap().status == Status::Ok).await);
    sched.stop().await;
}
