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
    _charge: Charge,
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
                let old = slot.ev.cost();
                slot._charge.resize(cost).map_err(NotPushed::OverBudget)?;
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
        self.slots.push_back(Slot {
            ev,
            _charge: charge,
        });
        Ok(Pushed::Queued)
    }

    /// The oldest event (its charge given back).
    pub fn pop(&mut self) -> Option<Ev> {
        let slot = self.slots.pop_front()?;
        let at = self.head;
        self.head += 1;
        self.bytes -= slot.ev.cost();
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
