//! When the controller's assignment of shared instances takes effect. A controller flapping
//! between two welcomes as fast as it can must cost the agent little: changes are coalesced
//! (applied at most once per `MIN_GAP`, the last one wins), a flap that ends where it began is
//! no change at all, and the caller logs one line per change that did take effect.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::plan::Assignment;

/// The (name, instance) pairs of shared instances the controller assigned to this host: what
/// the link receives in a welcome and `make_plan` is given once the gate lets it through.
pub type Assigned = BTreeSet<Assignment>;

/// Least time between two applied assignment changes.
pub const MIN_GAP: Duration = Duration::from_secs(1);

/// The link's latest assignment (a watch: last one wins, nothing queues) and the one the plan
/// was last made with.
#[derive(Debug)]
pub struct AssignmentGate {
    latest: watch::Receiver<Assigned>,
    applied: Assigned,
    applied_at: Option<Instant>,
}

impl AssignmentGate {
    pub fn new(latest: watch::Receiver<Assigned>) -> Self {
        Self {
            latest,
            applied: Assigned::new(),
            applied_at: None,
        }
    }

    /// Follow a new link's assignments (it starts empty; the controller re-sends its welcome).
    pub fn follow(&mut self, latest: watch::Receiver<Assigned>) {
        self.latest = latest;
    }

    /// Resolves when the latest assignment differs from the applied one, no sooner than
    /// `MIN_GAP` after the last `take`. Cancel-safe: its state is the watch and `self`.
    pub async fn changed(&mut self) {
        loop {
            if *self.latest.borrow() == self.applied {
                if self.latest.changed().await.is_err() {
                    // The link is gone (no controllers): no assignment will ever come.
                    std::future::pending::<()>().await;
                }
                continue;
            }
            if let Some(at) = self.applied_at {
                tokio::time::sleep_until(at + MIN_GAP).await;
            }
            if *self.latest.borrow_and_update() != self.applied {
                return;
            }
        }
    }

    /// The assignment the current plan was made with.
    pub fn applied(&self) -> &Assigned {
        &self.applied
    }

    /// The assignment to plan with now, recorded as applied.
    pub fn take(&mut self) -> Assigned {
        self.applied = self.latest.borrow_and_update().clone();
        self.applied_at = Some(Instant::now());
        self.applied.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Assigned {
        names
            .iter()
            .map(|n| ((*n).to_owned(), "all".to_owned()))
            .collect()
    }

    /// A controller alternating two welcomes every millisecond for ten seconds (virtual
    /// time) gets at most one applied change per second, and the last welcome wins.
    #[tokio::test(start_paused = true)]
    async fn a_flapping_controller_is_applied_at_most_once_per_second() {
        let (tx, rx) = watch::channel(Assigned::new());
        let mut gate = AssignmentGate::new(rx);
        let start = Instant::now();
        let flood = tokio::spawn(async move {
            for i in 0..10_000u32 {
                let next = if i % 2 == 0 { set(&["a"]) } else { set(&["b"]) };
                tx.send_if_modified(|cur| std::mem::replace(cur, next) != *cur);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tx.send_replace(set(&["final"]));
            tx
        });
        let mut applied = Vec::new();
        loop {
            gate.changed().await;
            let a = gate.take();
            let done = a == set(&["final"]);
            applied.push(a);
            if done {
                break;
            }
        }
        let _tx = flood.await.unwrap();
        let secs = Instant::now().duration_since(start).as_secs() as usize;
        assert!(secs >= 10, "the flood took {secs} s of virtual time");
        assert!(
            applied.len() <= secs + 1,
            "{} changes applied in {secs} s",
            applied.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flap_back_to_the_applied_assignment_is_no_change() {
        let (tx, rx) = watch::channel(Assigned::new());
        let mut gate = AssignmentGate::new(rx);
        tx.send_replace(set(&["a"]));
        gate.changed().await;
        assert_eq!(gate.take(), set(&["a"]));
        // Within the gap: away and back again.
        tx.send_replace(set(&["b"]));
        tx.send_replace(set(&["a"]));
        let waited = tokio::time::timeout(Duration::from_secs(3600), gate.changed()).await;
        assert!(
            waited.is_err(),
            "a welcome that ends where it began changed something"
        );
        // A welcome equal to the applied one changes nothing either.
        tx.send_replace(set(&["a"]));
        let waited = tokio::time::timeout(Duration::from_secs(3600), gate.changed()).await;
        assert!(waited.is_err());
        // A real change still comes through.
        tx.send_replace(set(&["c"]));
        gate.changed().await;
        assert_eq!(gate.take(), set(&["c"]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_link_that_is_gone_never_resolves() {
        let (tx, rx) = watch::channel(Assigned::new());
        drop(tx);
        let mut gate = AssignmentGate::new(rx);
        let waited = tokio::time::timeout(Duration::from_secs(3600), gate.changed()).await;
        assert!(waited.is_err());
    }
}
