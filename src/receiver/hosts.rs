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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::{text_cost, Budget, Charge, Payer, ENTRY_OVERHEAD};
use super::events::{resval_cost, Accepted, Ev};
use crate::link::receiver::{Event, EventKind, Reason};
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
    pub peer: Option<SocketAddr>,
    session: Option<u64>,
    pub accepted: Arc<Accepted>,
    /// By (name, instance).
    pub values: BTreeMap<(String, String), Resval>,
    /// When anything last arrived from it.
    pub last_heard: Instant,
    deadline: Instant,
    pub stale: bool,
    /// What its hello and values hold.
    charge: Charge,
}

impl HostState {
    /// Whether a session speaks for it now.
    pub fn connected(&self) -> bool {
        self.session.is_some()
    }

    fn cost(&self) -> usize {
        let hello: usize = self
            .accepted
            .hello
            .resources
            .iter()
            .map(|d| text_cost(&d.name) + d.instance.len())
            .sum();
        let values: usize = self.values.values().map(resval_cost).sum();
        ENTRY_OVERHEAD + self.host.len() + hello + values
    }
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
                        values: BTreeMap::new(),
                        last_heard: now,
                        deadline: now,
                        stale: false,
                        charge: Charge::zero(budget, payer),
                    }
                });
                st.peer = Some(ev.peer);
                st.session = Some(ev.session);
                st.accepted = Arc::clone(&accepted);
                st.stale = false;
                let declared: BTreeSet<(&str, &str)> = accepted
                    .hello
                    .resources
                    .iter()
                    .map(|d| (d.name.as_str(), d.instance.as_str()))
                    .collect();
                st.values
                    .retain(|(n, i), _| declared.contains(&(n.as_str(), i.as_str())));
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
                    st.values.clear();
                }
                for r in batch.resvals {
                    st.values
                        .insert((r.name.clone(), r.instance.clone()), r.clone());
                    out.push(Ev::Resval {
                        host: Arc::clone(&st.host),
                        resval: r,
                    });
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
            for r in st.values.values() {
                out.push(Ev::Resval {
                    host: Arc::clone(&st.host),
                    resval: if st.stale {
                        unknown(r, self.grace)
                    } else {
                        r.clone()
                    },
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
    st.values.clear();
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
    out.extend(st.values.values().map(|r| Ev::Resval {
        host: Arc::clone(&st.host),
        resval: r.clone(),
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
