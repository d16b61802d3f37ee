//! Waits with one hang guard. Every wait ends as soon as its condition holds (an event where
//! there is one, a short poll where there is none); the guard only turns a broken agent into
//! a failed test instead of a hung CI job.

use std::path::Path;
use std::time::{Duration, Instant};

use xce_agent::store::Store;
use xce_agent::value::Resval;

/// Bounds every wait. Not a timing assertion: a healthy run needs a small fraction of it.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Poll step where there is no event to wait on: short, so a wait ends soon after its
/// condition holds.
const POLL: Duration = Duration::from_millis(50);

/// `f`, or a panic naming `what` once the hang guard has passed.
pub async fn guard<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(HANG_GUARD, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Poll `cond` with short waits until it holds (a file another process writes: there is no
/// event to wait on).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    poll_until(what, || std::future::ready(cond().then_some(()))).await
}

/// Poll `check` (a request to another process: there is no event to wait on) with short
/// waits until it answers `Some`; returns that answer.
pub async fn poll_until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    guard(what, async {
        loop {
            if let Some(answer) = check().await {
                return answer;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// Wait (on the store's watch, no polling) until `pred` holds for resource `name`.
pub async fn wait_for(store: &Store, name: &str, pred: impl Fn(&Resval) -> bool) -> Resval {
    let mut rx = store.subscribe();
    let wait = async {
        loop {
            if let Some(r) = store.get(name, "") {
                if pred(&r) {
                    return r;
                }
            }
            rx.changed().await.expect("store dropped");
        }
    };
    tokio::time::timeout(HANG_GUARD, wait)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name} never reached the expected state: {:?}",
                store.get(name, "")
            )
        })
}

/// Block until `path` exists (a file a probe writes: there is no event to wait on).
pub fn wait_for_file(path: &Path) {
    let give_up = Instant::now() + HANG_GUARD;
    while !path.exists() {
        assert!(
            Instant::now() < give_up,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(POLL);
    }
}
