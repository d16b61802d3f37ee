//! The controller's queue: newest-wins per (host, resource), bounded in events and bytes.
//!
//! Resvals are gauges: a controller that pops slowly wants the present, not a backlog. A
//! value still waiting for (host, name, instance) is replaced where it stands by a newer
//! one (the slot keeps its place, so a busy resource is not pushed back forever). A host's
//! state events (accepted, stale, gone) keep their order relative to its values: a value
//! queued before a state event is never replaced by one that came after it (that one
//! queues behind the state event).
//!
//! Every queued event holds a charge on the budget (see [`super::budget`]): a resval's to
//! its host's share, a state event's to the receiver (they are one per host transition,
//! and must not be lost to a host's own overspending).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::budget::{Budget, Charge, OverBudget, Payer};
use super::events::Ev;

/// Events held for the controller before the receiver stops reading sockets.
pub const DEFAULT_QUEUE_EVENTS: usize = 4096;
/// Bytes held in the queue before the receiver stops reading sockets (within the budget).
pub const DEFAULT_QUEUE_BYTES: usize = 64 << 20;

struct Slot {
    ev: Ev,
    /// What the event costs, charged: its `bytes()` is the event's cost, so it is not
    /// computed again (a resval's error text is rendered to measure it).
    charge: Charge,
}

/// What a push did.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// A waiting value of the same (host, resource) was replaced.
    Replaced,
}

/// Why a push did not happen.
#[derive(Debug, PartialEq, Eq)]
pub enum NotPushed {
    /// The queue is full (in events or bytes): wait for the controller to pop.
    Full,
    /// The host is over its share: its value is dropped and the host cut off.
    OverBudget(OverBudget),
}

/// The queue.
pub struct EventQueue {
    slots: VecDeque<Slot>,
    /// The absolute position of `slots[0]`.
    head: u64,
    /// Per host, each waiting value's absolute position: a state event of the host clears
    /// it (nothing before it may be replaced by what comes after).
    waiting: HashMap<Arc<str>, HashMap<(String, String), u64>>,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
    replaced: u64,
    budget: Arc<Budget>,
}

impl EventQueue {
    pub fn new(budget: Arc<Budget>, max_events: usize, max_bytes: usize) -> Self {
        Self {
            slots: VecDeque::new(),
            head: 0,
            waiting: HashMap::new(),
            bytes: 0,
            max_events: max_events.max(1),
            max_bytes: max_bytes.max(1),
            replaced: 0,
            budget,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Values replaced by newer ones before the controller popped them.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// Queue `ev`, or replace the waiting value it supersedes. `account` is the host's
    /// budget account (resvals are charged to it).
    pub fn push(&mut self, ev: Ev, payer: &Payer) -> Result<Pushed, NotPushed> {
        let cost = ev.cost();
        if let Ev::Resval { host, resval } = &ev {
            let key = (resval.name.clone(), resval.instance.clone());
            if let Some(&at) = self.waiting.get(host).and_then(|w| w.get(&key)) {
                let slot = &mut self.slots[(at - self.head) as usize];
                let old = slot.charge.bytes();
                slot.charge.resize(cost).map_err(NotPushed::OverBudget)?;
                self.bytes = self.bytes - old + cost;
                slot.ev = ev;
                self.replaced += 1;
                return Ok(Pushed::Replaced);
            }
        }
        if !self.slots.is_empty()
            && (self.slots.len() >= self.max_events || self.bytes + cost > self.max_bytes)
        {
            return Err(NotPushed::Full);
        }
        let charge = match &ev {
            Ev::Resval { .. } => self.budget.charge(payer, cost),
            _ => Ok(self.budget.charge_forced(cost)),
        }
        .map_err(NotPushed::OverBudget)?;
        let at = self.head + self.slots.len() as u64;
        match &ev {
            Ev::Resval { host, resval } => {
                self.waiting
                    .entry(Arc::clone(host))
                    .or_default()
                    .insert((resval.name.clone(), resval.instance.clone()), at);
            }
            other => {
                if let Some(h) = other.host() {
                    self.waiting.remove(h);
                }
            }
        }
        self.bytes += cost;
        self.slots.push_back(Slot { ev, charge });
        Ok(Pushed::Queued)
    }

    /// The oldest event (its charge given back).
    pub fn pop(&mut self) -> Option<Ev> {
        let slot = self.slots.pop_front()?;
        let at = self.head;
        self.head += 1;
        self.bytes -= slot.charge.bytes();
        if let Ev::Resval { host, resval } = &slot.ev {
            if let Some(w) = self.waiting.get_mut(host) {
                let key = (resval.name.clone(), resval.instance.clone());
                if w.get(&key) == Some(&at) {
                    w.remove(&key);
                }
                if w.is_empty() {
                    self.waiting.remove(host);
                }
            }
        }
        Some(slot.ev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receiver::session::Reason;
    use crate::value::{Resval, Status, Value};

    fn value(host: &str, name: &str, x: f64) -> Ev {
        Ev::Resval {
            host: Arc::from(host),
            resval: Resval {
                name: name.into(),
                instance: String::new(),
                value: Value::Numeric(x),
                status: Status::Ok,
                last_report_ms: Some(1),
                error: None,
            },
        }
    }

    fn gone(host: &str) -> Ev {
        Ev::Gone {
            host: Arc::from(host),
            peer: None,
            reason: Reason::Closed,
            text: String::new(),
        }
    }

    fn numbers(q: &mut EventQueue) -> Vec<String> {
        std::iter::from_fn(|| q.pop())
            .map(|e| match e {
                Ev::Resval { host, resval } => format!("{host}.{}={}", resval.name, resval.value),
                Ev::Gone { host, .. } => format!("{host} gone"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn queue(budget: &Arc<Budget>) -> EventQueue {
        EventQueue::new(Arc::clone(budget), 100, 1 << 20)
    }

    #[test]
    fn a_newer_value_replaces_the_waiting_one_where_it_stands() {
        let budget = Budget::new(1 << 20, 1 << 20);
        let payer = |h: &str| Payer::Host(budget.account(h));
        let mut q = queue(&budget);
        for (h, n, x) in [
            ("a", "x", 1.0),
            ("b", "x", 1.0),
            ("a", "y", 1.0),
            ("a", "x", 2.0),
        ] {
            q.push(value(h, n, x), &payer(h)).expect("pushed");
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.replaced(), 1);
        assert_eq!(numbers(&mut q), ["a.x=2", "b.x=1", "a.y=1"]);
        assert_eq!(budget.used(), 0, "every charge given back");
    }

    #[test]
    fn a_value_after_a_state_event_queues_behind_it() {
        let budget = Budget::new(1 << 20, 1 << 20);
        let payer = Payer::Host(budget.account("a"));
        let mut q = queue(&budget);
        q.push(value("a", "x", 1.0), &payer).expect("pushed");
        q.push(gone("a"), &Payer::Receiver).expect("pushed");
        assert_eq!(q.push(value("a", "x", 2.0), &payer), Ok(Pushed::Queued));
        assert_eq!(q.push(value("a", "x", 3.0), &payer), Ok(Pushed::Replaced));
        assert_eq!(numbers(&mut q), ["a.x=1", "a gone", "a.x=3"]);
    }

    #[test]
    fn a_full_queue_still_takes_replacements_and_says_full_otherwise() {
        let budget = Budget::new(1 << 20, 1 << 20);
        let payer = Payer::Host(budget.account("a"));
        let mut q = EventQueue::new(Arc::clone(&budget), 2, 1 << 20);
        q.push(value("a", "x", 1.0), &payer).expect("pushed");
        q.push(value("a", "y", 1.0), &payer).expect("pushed");
        assert_eq!(q.push(value("a", "z", 1.0), &payer), Err(NotPushed::Full));
        assert_eq!(q.push(value("a", "x", 5.0), &payer), Ok(Pushed::Replaced));
        // Bounded in bytes too: a queue of one event's bytes holds one.
        let mut small = EventQueue::new(Arc::clone(&budget), 100, 1);
        small
            .push(value("a", "x", 1.0), &payer)
            .expect("one always fits");
        assert_eq!(
            small.push(value("a", "y", 1.0), &payer),
            Err(NotPushed::Full)
        );
    }

    #[test]
    fn a_host_over_its_share_has_its_value_refused_and_is_cut_off() {
        let budget = Budget::new(1 << 20, 200);
        let account = budget.account("a");
        let payer = Payer::Host(Arc::clone(&account));
        let mut q = queue(&budget);
        q.push(value("a", "x", 1.0), &payer).expect("fits");
        assert!(matches!(
            q.push(value("a", "y", 1.0), &payer),
            Err(NotPushed::OverBudget(_))
        ));
        assert!(account.cut_token().is_cancelled());
        // Its state events still go (they must reach the controller).
        q.push(gone("a"), &Payer::Receiver)
            .expect("a state event is never refused");
    }
}
