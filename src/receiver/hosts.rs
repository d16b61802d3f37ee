//! The host table: the one fold of connection events into per-host state, and the
//! controller's events that follow from it. The C library and `listen --format table` both
//! read the cluster through it, so they cannot disagree about what a host holds.
//!
//! The rules:
//! - a hello makes the host accepted; what it no longer declares is dropped, the full
//!   batch that must follow says the rest;
//! - a full batch replaces the host's values, a delta updates them;
//! - only the session that speaks for the host now counts: the last words of a session
//!   that was displaced (a reconnect, the same certificate again) change nothing;
//! - a host from which nothing arrived for `grace` is stale (one event; its values read as
//!   unknown until it reports again, when it is accepted again and its values come again);
//! - a host whose session ended is gone (with the reason), and goes stale by the same
//!   grace unless it comes back first.
//!
//! The host's state (its hello, its values) is charged to its budget account: a host that
//! declares or sends more than its share is cut off, and what it sent beyond is not kept.

use super::identity::Peer;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::{text_cost, Budget, Charge, Payer, ENTRY_OVERHEAD};
use super::events::{Accepted, Ev};
use crate::receiver::session::{Event, EventKind, Reason};
use crate::value::{Resval, Status, Value};

/// The agents' heartbeat interval unless the controller says otherwise (the agent's own
/// default, `LinkConfig::heartbeat`).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Beyond two heartbeats: the coalescing window and scheduling delays.
const GRACE_MARGIN: Duration = Duration::from_secs(1);

/// The grace after which a silent host is stale: two heartbeats and a second. The hello's
/// probe intervals do not shorten it (an unchanged value is not resent, so a silent
/// interval is healthy) and cannot lengthen it (the heartbeat bounds the silence).
pub fn grace(heartbeat: Duration) -> Duration {
    heartbeat.saturating_mul(2).saturating_add(GRACE_MARGIN)
}

/// One host as the receiver knows it.
pub struct HostState {
    /// The canonical name.
    pub host: Arc<str>,
    /// The session that speaks for it now; `None` once gone.
    pub peer: Option<Peer>,
    session: Option<u64>,
    pub accepted: Arc<Accepted>,
    /// The hello's resources by (name, instance): indices into `accepted.hello.resources`.
    index: Vec<u32>,
    /// The last value of each declared resource, in the hello's order (the names are the
    /// hello's, held once).
    slots: Vec<Option<Slot>>,
    /// When anything last arrived from it.
    pub last_heard: Instant,
    deadline: Instant,
    pub stale: bool,
    /// What its hello and values hold.
    charge: Charge,
    /// [`Self::cost`] of the hello and the tables, made at each hello.
    declared_cost: usize,
    /// [`slot_cost`] summed over the values held, kept as each one changes: a batch costs
    /// its own values' accounting, not the host's (a one-value delta from a host of 4000
    /// resources formats one error, not every one it holds).
    values_cost: usize,
}

/// One value without its names (they are the hello's).
#[derive(Clone)]
struct Slot {
    value: Value,
    status: Status,
    last_report_ms: Option<u64>,
    error: Option<crate::value::Failure>,
}

impl HostState {
    /// Its values, in the hello's order (those reported so far).
    pub fn values(&self) -> impl Iterator<Item = Resval> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let s = s.as_ref()?;
            let d = &self.accepted.hello.resources[i];
            Some(Resval {
                name: d.name.clone(),
                instance: d.instance.clone(),
                value: s.value.clone(),
                status: s.status,
                last_report_ms: s.last_report_ms,
                error: s.error.clone(),
            })
        })
    }

    /// Where (name, instance) is in the hello.
    fn position(&self, name: &str, instance: &str) -> Option<usize> {
        let resources = &self.accepted.hello.resources;
        self.index
            .binary_search_by(|i| {
                let d = &resources[*i as usize];
                (d.name.as_str(), d.instance.as_str()).cmp(&(name, instance))
            })
            .ok()
            .map(|at| self.index[at] as usize)
    }

    /// A new hello: the values of what it still declares are kept, at their new places.
    fn redeclare(&mut self, accepted: Arc<Accepted>) {
        let old: Vec<(String, String, Slot)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let d = &self.accepted.hello.resources[i];
                Some((d.name.clone(), d.instance.clone(), s.clone()?))
            })
            .collect();
        let resources = &accepted.hello.resources;
        let mut index: Vec<u32> = (0..resources.len() as u32).collect();
        index.sort_unstable_by(|a, b| {
            let (a, b) = (&resources[*a as usize], &resources[*b as usize]);
            (a.name.as_str(), a.instance.as_str()).cmp(&(b.name.as_str(), b.instance.as_str()))
        });
        self.index = index;
        self.slots = vec![None; resources.len()];
        self.accepted = accepted;
        self.values_cost = 0;
        for (name, instance, slot) in old {
            if let Some(i) = self.position(&name, &instance) {
                self.values_cost += slot_cost(&slot);
                self.slots[i] = Some(slot);
            }
        }
        self.declared_cost = self.count_declared();
    }

    /// What its name, its hello's names and its tables hold (they change only at a hello).
    fn count_declared(&self) -> usize {
        let hello: usize = self
            .accepted
            .hello
            .resources
            .iter()
            .map(|d| text_cost(&d.name) + d.instance.len())
            .sum();
        let tables =
            self.slots.capacity() * std::mem::size_of::<Option<Slot>>() + self.index.capacity() * 4;
        ENTRY_OVERHEAD + self.host.len() + hello + tables
    }

    /// Every value dropped (a full batch, or a host over its share).
    fn clear_values(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.values_cost = 0;
    }

    /// Record `r` (a value the session checked against the hello); false if undeclared.
    fn record(&mut self, r: &Resval) -> bool {
        let Some(i) = self.position(&r.name, &r.instance) else {
            return false;
        };
        let slot = Slot {
            value: r.value.clone(),
            status: r.status,
            last_report_ms: r.last_report_ms,
            error: r.error.clone(),
        };
        self.values_cost += slot_cost(&slot);
        if let Some(old) = self.slots[i].replace(slot) {
            self.values_cost -= slot_cost(&old);
        }
        true
    }

    /// Whether a session speaks for it now.
    pub fn connected(&self) -> bool {
        self.session.is_some()
    }

    /// What it holds, in the budget's bytes: kept up to date as values change (see
    /// `values_cost`), so reading it is O(1).
    fn cost(&self) -> usize {
        self.declared_cost + self.values_cost
    }

    /// [`Self::cost`] counted again from nothing: what the kept figure must equal.
    #[cfg(test)]
    fn cost_from_scratch(&self) -> usize {
        self.count_declared() + self.slots.iter().flatten().map(slot_cost).sum::<usize>()
    }
}

/// A value's own allocations beyond its slot (a string's header and the allocator's).
const SLOT_COST: usize = 16;

/// What one value holds beyond its names (they are the hello's).
fn slot_cost(s: &Slot) -> usize {
    let text = match &s.value {
        Value::String(v) => v.len(),
        _ => 0,
    };
    SLOT_COST + text + s.error.as_ref().map_or(0, |e| e.to_string().len())
}

/// Every host heard from.
pub struct HostTable {
    by_key: HashMap<Arc<str>, HostState>,
    /// (deadline, host) of every host not yet stale, earliest first.
    deadlines: BTreeSet<(Instant, Arc<str>)>,
    grace: Duration,
    budget: Arc<Budget>,
}

impl HostTable {
    pub fn new(grace: Duration, budget: Arc<Budget>) -> Self {
        Self {
            by_key: HashMap::new(),
            deadlines: BTreeSet::new(),
            grace,
            budget,
        }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    pub fn get(&self, host: &str) -> Option<&HostState> {
        self.by_key.get(host)
    }

    /// Every host, in no order.
    pub fn hosts(&self) -> impl Iterator<Item = &HostState> {
        self.by_key.values()
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// When the next host goes stale.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    fn touch(&mut self, key: &Arc<str>, now: Instant) {
        let Some(st) = self.by_key.get_mut(key) else {
            return;
        };
        self.deadlines.remove(&(st.deadline, Arc::clone(key)));
        st.deadline = now + self.grace;
        st.last_heard = now;
        self.deadlines.insert((st.deadline, Arc::clone(key)));
    }

    /// Hosts whose grace has passed: stale.
    pub fn expire(&mut self, now: Instant) -> Vec<Ev> {
        let mut out = Vec::new();
        while let Some((t, key)) = self.deadlines.first().cloned() {
            if t > now {
                break;
            }
            self.deadlines.remove(&(t, Arc::clone(&key)));
            if let Some(st) = self.by_key.get_mut(&key) {
                if !st.stale {
                    st.stale = true;
                    out.push(Ev::Stale {
                        host: Arc::clone(&st.host),
                        grace: self.grace,
                    });
                }
            }
        }
        out
    }

    /// One connection event folded in; the controller's events that follow.
    pub fn apply(&mut self, ev: Event, now: Instant) -> Vec<Ev> {
        let Some(host) = ev.host.as_deref() else {
            // Before an accepted hello: only its end matters, as a refusal.
            return match ev.kind {
                EventKind::Closed(text) => vec![Ev::Refused {
                    peer: ev.peer,
                    reason: ev.reason.unwrap_or(Reason::Closed),
                    text: text.unwrap_or_else(|| "connection closed before hello".into()),
                }],
                _ => Vec::new(),
            };
        };
        let key: Arc<str> = Arc::from(host);
        match ev.kind {
            EventKind::Connected => Vec::new(),
            EventKind::Hello(hello) => {
                let accepted = Arc::new(Accepted {
                    host: host.to_owned(),
                    identity: ev.identity.clone(),
                    hello,
                });
                let budget = &self.budget;
                let st = self.by_key.entry(Arc::clone(&key)).or_insert_with(|| {
                    let payer = Payer::Host(budget.account(host));
                    HostState {
                        host: Arc::clone(&key),
                        peer: None,
                        session: None,
                        accepted: Arc::clone(&accepted),
                        index: Vec::new(),
                        slots: Vec::new(),
                        last_heard: now,
                        deadline: now,
                        stale: false,
                        charge: Charge::zero(budget, payer),
                        declared_cost: 0,
                        values_cost: 0,
                    }
                });
                st.peer = Some(ev.peer);
                st.session = Some(ev.session);
                st.redeclare(Arc::clone(&accepted));
                st.stale = false;
                settle(st);
                self.touch(&key, now);
                vec![Ev::Accepted {
                    peer: Some(ev.peer),
                    accepted,
                }]
            }
            EventKind::Batch { batch, .. } => {
                let Some(st) = self.current(&key, ev.session) else {
                    return Vec::new(); // a displaced session's last words
                };
                let mut out = revive(st);
                if batch.full {
                    st.clear_values();
                }
                for r in batch.resvals {
                    if st.record(&r) {
                        out.push(Ev::Resval {
                            host: Arc::clone(&st.host),
                            resval: r,
                        });
                    }
                }
                if !settle(st) {
                    // Over its share: the host is cut off; none of this batch is passed on.
                    out.retain(|e| !matches!(e, Ev::Resval { .. }));
                }
                self.touch(&key, now);
                out
            }
            EventKind::Heartbeat(_) => {
                let Some(st) = self.current(&key, ev.session) else {
                    return Vec::new();
                };
                let out = revive(st);
                self.touch(&key, now);
                out
            }
            EventKind::Closed(text) => {
                let Some(st) = self.current(&key, ev.session) else {
                    return Vec::new(); // displaced by a newer session: the host is not gone
                };
                let peer = st.peer.take();
                st.session = None;
                vec![Ev::Gone {
                    host: Arc::clone(&st.host),
                    peer,
                    reason: ev.reason.unwrap_or(Reason::Closed),
                    text: text.unwrap_or_else(|| "the agent closed the connection".into()),
                }]
            }
        }
    }

    /// The host's state if `session` speaks for it now.
    fn current(&mut self, key: &str, session: u64) -> Option<&mut HostState> {
        self.by_key
            .get_mut(key)
            .filter(|st| st.session == Some(session))
    }

    /// The state of one host (`Some(name)`, canonical) or of all, as events: per host its
    /// state (accepted, stale or gone) then one resval per value (unknown while stale).
    /// `None` when the named host is not known.
    pub fn snapshot(&self, host: Option<&str>) -> Option<Vec<Ev>> {
        let mut states: Vec<&HostState> = match host {
            Some(h) => vec![self.by_key.get(h)?],
            None => self.by_key.values().collect(),
        };
        states.sort_by(|a, b| a.host.cmp(&b.host));
        let mut out = Vec::new();
        for st in states {
            out.push(if st.stale {
                Ev::Stale {
                    host: Arc::clone(&st.host),
                    grace: self.grace,
                }
            } else if !st.connected() {
                Ev::Gone {
                    host: Arc::clone(&st.host),
                    peer: None,
                    reason: Reason::Closed,
                    text: "not connected".into(),
                }
            } else {
                Ev::Accepted {
                    peer: st.peer,
                    accepted: Arc::clone(&st.accepted),
                }
            });
            for r in st.values() {
                out.push(Ev::Resval {
                    host: Arc::clone(&st.host),
                    resval: if st.stale { unknown(&r, self.grace) } else { r },
                });
            }
        }
        Some(out)
    }
}

/// The host's charge brought to what it holds. Over its share: its values are dropped
/// (the refusal cut the host off: its connection ends `over_budget`), and false.
fn settle(st: &mut HostState) -> bool {
    if st.charge.resize(st.cost()).is_ok() {
        return true;
    }
    st.clear_values();
    let cost = st.cost().min(st.charge.bytes());
    let _ = st.charge.resize(cost);
    false
}

/// A stale host that reports again: it is fresh, and every value it held is current again
/// (a heartbeat or delta says so), so they are delivered again.
fn revive(st: &mut HostState) -> Vec<Ev> {
    if !st.stale {
        return Vec::new();
    }
    st.stale = false;
    let mut out = vec![Ev::Accepted {
        peer: st.peer,
        accepted: Arc::clone(&st.accepted),
    }];
    let host = Arc::clone(&st.host);
    out.extend(st.values().map(|r| Ev::Resval {
        host: Arc::clone(&host),
        resval: r,
    }));
    out
}

/// A value the receiver no longer vouches for (its host is stale).
pub fn unknown(r: &Resval, grace: Duration) -> Resval {
    Resval {
        value: Value::Unknown,
        status: Status::Stale,
        error: Some(format!("host stale: nothing from it for {} ms", grace.as_millis()).into()),
        ..r.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::wire::{Batch, Declared, Hello};
    use crate::value::Valtype;
    use std::net::SocketAddr;

    fn event(session: u64, host: &str, kind: EventKind) -> Event {
        Event {
            peer: SocketAddr::from(([127, 0, 0, 1], session as u16)).into(),
            host: Some(host.to_owned()),
            session,
            kind,
            identity: None,
            reason: None,
        }
    }

    fn hello(names: &[&str]) -> EventKind {
        let resources = names
            .iter()
            .map(|n| Declared {
                name: (*n).to_owned(),
                instance: String::new(),
                valtype: Valtype::Numeric,
                interval_ms: 1000,
                shared: false,
            })
            .collect();
        EventKind::Hello(Arc::new(Hello::new("h", "boot", "digest", resources)))
    }

    fn batch(full: bool, values: &[(&str, f64)]) -> EventKind {
        EventKind::Batch {
            batch: Batch {
                seq: 1,
                full,
                sent_at_ms: 0,
                resvals: values
                    .iter()
                    .map(|(n, x)| Resval {
                        name: (*n).to_owned(),
                        instance: String::new(),
                        value: Value::Numeric(*x),
                        status: Status::Ok,
                        last_report_ms: Some(1),
                        error: None,
                    })
                    .collect(),
            },
            rejected: Vec::new(),
        }
    }

    fn values(t: &HostTable, host: &str) -> Vec<(String, String)> {
        t.get(host)
            .map(|st| st.values().map(|r| (r.name, r.value.to_string())).collect())
            .unwrap_or_default()
    }

    fn table() -> (HostTable, Arc<Budget>) {
        let budget = Budget::new(1 << 20, 1 << 20);
        (
            HostTable::new(Duration::from_secs(21), Arc::clone(&budget)),
            budget,
        )
    }

    #[test]
    fn a_full_batch_replaces_the_values_and_a_delta_updates_them() {
        let (mut t, _) = table();
        let now = Instant::now();
        t.apply(event(1, "n", hello(&["a", "b"])), now);
        t.apply(event(1, "n", batch(true, &[("a", 1.0), ("b", 2.0)])), now);
        t.apply(event(1, "n", batch(false, &[("b", 3.0)])), now);
        assert_eq!(
            values(&t, "n"),
            [("a".into(), "1".into()), ("b".into(), "3".into())]
        );
        t.apply(event(1, "n", batch(true, &[("b", 4.0)])), now);
        assert_eq!(values(&t, "n"), [("b".into(), "4".into())]);
        // A new hello keeps what it still declares.
        t.apply(event(1, "n", hello(&["c", "b"])), now);
        assert_eq!(values(&t, "n"), [("b".into(), "4".into())]);
    }

    #[test]
    fn a_displaced_sessions_last_words_change_nothing() {
        let (mut t, _) = table();
        let now = Instant::now();
        t.apply(event(1, "n", hello(&["a"])), now);
        t.apply(event(2, "n", hello(&["a"])), now);
        assert!(t
            .apply(event(1, "n", batch(true, &[("a", 9.0)])), now)
            .is_empty());
        let closed = event(1, "n", EventKind::Closed(None));
        assert!(t.apply(closed, now).is_empty(), "the host is not gone");
        assert!(t.get("n").is_some_and(HostState::connected));
        let gone = t.apply(event(2, "n", EventKind::Closed(None)), now);
        assert!(matches!(
            &gone[..],
            [Ev::Gone {
                reason: Reason::Closed,
                ..
            }]
        ));
    }

    #[test]
    fn a_silent_host_goes_stale_once_and_comes_back_with_its_values() {
        let (mut t, _) = table();
        let now = Instant::now();
        t.apply(event(1, "n", hello(&["a"])), now);
        t.apply(event(1, "n", batch(true, &[("a", 1.0)])), now);
        assert!(t.expire(now + Duration::from_secs(20)).is_empty());
        let stale = t.expire(now + Duration::from_secs(22));
        assert!(matches!(&stale[..], [Ev::Stale { .. }]));
        assert!(t.expire(now + Duration::from_secs(60)).is_empty(), "once");
        let snap = t.snapshot(Some("n")).expect("known");
        assert!(matches!(&snap[1], Ev::Resval { resval, .. } if resval.value == Value::Unknown));
        let back = t.apply(
            event(
                1,
                "n",
                EventKind::Heartbeat(crate::link::wire::Heartbeat {
                    seq: 1,
                    sent_at_ms: 0,
                }),
            ),
            now + Duration::from_secs(61),
        );
        assert!(
            matches!(&back[..], [Ev::Accepted { .. }, Ev::Resval { .. }]),
            "{back:?}"
        );
    }

    #[test]
    fn a_host_whose_state_is_over_its_share_keeps_none_of_it_and_is_cut_off() {
        let budget = Budget::new(1 << 20, 2048);
        let mut t = HostTable::new(Duration::from_secs(21), Arc::clone(&budget));
        let now = Instant::now();
        t.apply(event(1, "n", hello(&["a"])), now);
        let names: Vec<String> = (0..100).map(|i| format!("r{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let evs = t.apply(event(1, "n", hello(&refs)), now);
        assert!(matches!(&evs[..], [Ev::Accepted { .. }]));
        let evs = t.apply(
            event(
                1,
                "n",
                batch(true, &refs.iter().map(|n| (*n, 1.0)).collect::<Vec<_>>()),
            ),
            now,
        );
        assert!(evs.is_empty(), "nothing passed on: {} events", evs.len());
        assert!(budget.account("n").cut_token().is_cancelled());
        assert!(budget.used() <= 2048, "{}", budget.used());
    }

    /// The cost a host is charged is kept as its values change, and always equals the cost
    /// counted again from its state: after a hello, deltas that replace numbers with strings
    /// and errors and back, a new hello that keeps some values, and a full batch.
    #[test]
    fn the_kept_cost_is_the_cost_counted_from_scratch() {
        let (mut t, _budget) = table();
        let now = Instant::now();
        let check = |t: &HostTable, step: &str| {
            let st = &t.by_key["n"];
            assert_eq!(st.cost(), st.cost_from_scratch(), "after {step}");
        };
        t.apply(event(1, "n", hello(&["a", "b", "c"])), now);
        check(&t, "the hello");
        t.apply(event(1, "n", batch(true, &[("a", 1.0), ("b", 2.0)])), now);
        check(&t, "a full batch");
        let text = |name: &str, value: &str, error: Option<&str>| Resval {
            name: name.to_owned(),
            instance: String::new(),
            value: Value::String(value.into()),
            status: if error.is_some() {
                Status::Failed
            } else {
                Status::Ok
            },
            last_report_ms: Some(2),
            error: error.map(|e| crate::value::Failure::new(std::io::Error::other(e.to_owned()))),
        };
        let delta = |resvals: Vec<Resval>| EventKind::Batch {
            batch: Batch {
                seq: 2,
                full: false,
                sent_at_ms: 0,
                resvals,
            },
            rejected: Vec::new(),
        };
        t.apply(
            event(
                1,
                "n",
                delta(vec![
                    text(
                        "a",
                        "a longer text value",
                        Some("the probe timed out after 10s"),
                    ),
                    text("c", "x", None),
                ]),
            ),
            now,
        );
        check(&t, "a delta of texts and an error");
        let before = t.by_key["n"].cost();
        t.apply(event(1, "n", delta(vec![text("a", "y", None)])), now);
        check(&t, "a delta replacing a value");
        assert!(
            t.by_key["n"].cost() < before,
            "the replaced value's cost went"
        );
        t.apply(event(1, "n", hello(&["a", "d"])), now);
        check(&t, "a new hello keeping one value");
        t.apply(event(1, "n", batch(true, &[("d", 4.0)])), now);
        check(&t, "a full batch after it");
    }
}
