//! The latest resval of every resource instance this host reports. Probes write readings in;
//! the `--once` printer, the metrics endpoint and the controller link read snapshots or the
//! changes since a version out. Memory is one slot per declared resource, whatever the
//! controller does: nothing here queues.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::value::{unix_ms, Reading, Resval, Status, Valtype, Value};

/// One resource instance the store keeps a slot for.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    pub name: String,
    pub instance: String,
    pub valtype: Valtype,
    /// After this long without a good reading the value is no longer vouched for.
    pub stale_after: Duration,
}

/// (name, instance): instance is empty for this host's own value.
pub type Key = (String, String);

#[derive(Debug)]
struct Slot {
    declared: Declared,
    resval: Resval,
    last_good: Option<SystemTime>,
    /// When the current run of pending readings began (the output keeps leaving it out).
    pending_since: Option<SystemTime>,
    /// Store version at which `resval` last changed in a way the controller must hear.
    changed_at: u64,
}

#[derive(Debug, Default)]
struct State {
    slots: BTreeMap<Key, Slot>,
    version: u64,
    /// Bumped when the set of declared resources changes (reload): readers resend everything.
    generation: u64,
}

impl State {
    fn versions(&self) -> Versions {
        Versions {
            version: self.version,
            generation: self.generation,
        }
    }
}

/// Versions that readers watch: `version` moves on every material change, `generation` on
/// every change of the declared set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Versions {
    pub version: u64,
    pub generation: u64,
}

pub struct Store {
    state: Mutex<State>,
    notify: watch::Sender<Versions>,
    /// Woken by [`Store::declare`]: what can go stale, and when, may have changed.
    declared_anew: tokio::sync::Notify,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            notify: watch::channel(Versions::default()).0,
            declared_anew: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind, still consistent per slot.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wake the readers with the versions of `st`, once its lock is released (a woken reader
    /// takes the lock at once).
    fn publish(&self, st: MutexGuard<'_, State>) {
        let versions = st.versions();
        drop(st);
        self.notify.send_replace(versions);
    }

    /// Set the declared resources. Slots that survive keep their value (a reload must not
    /// turn every value pending); new ones start pending; gone ones are dropped.
    pub fn declare(&self, decls: impl IntoIterator<Item = Declared>) {
        // A permit is kept if the sweeper is not waiting yet: it cannot miss this.
        self.declared_anew.notify_one();
        let mut st = self.lock();
        st.version += 1;
        st.generation += 1;
        let version = st.version;
        let mut old = std::mem::take(&mut st.slots);
        for d in decls {
            let key = (d.name.clone(), d.instance.clone());
            let slot = match old.remove(&key) {
                Some(mut s) if s.declared.valtype == d.valtype => {
                    s.declared = d;
                    s
                }
                _ => Slot {
                    resval: Resval {
                        name: d.name.clone(),
                        instance: d.instance.clone(),
                        value: Value::Unknown,
                        status: Status::Pending,
                        last_report_ms: None,
                        error: None,
                    },
                    declared: d,
                    last_good: None,
                    pending_since: None,
                    changed_at: version,
                },
            };
            st.slots.insert(key, slot);
        }
        self.publish(st);
    }

    /// Apply one reading taken at `at`. Readings for undeclared resources are ignored
    /// (a probe that outlived a reload); returns whether the slot exists.
    pub fn record(&self, name: &str, instance: &str, reading: Reading, at: SystemTime) -> bool {
        let mut st = self.lock();
        let next = st.version + 1;
        let Some(slot) = st.slots.get_mut(&(name.to_owned(), instance.to_owned())) else {
            return false;
        };
        let before = (
            slot.resval.value.clone(),
            slot.resval.status,
            slot.resval.error.clone(),
        );
        match reading {
            Reading::Ok(value) => {
                slot.resval.value = value;
                slot.resval.status = Status::Ok;
                slot.resval.error = None;
                slot.resval.last_report_ms = Some(unix_ms(at));
                slot.last_good = Some(at);
                slot.pending_since = None;
            }
            Reading::Failed(err) => {
                slot.resval.status = Status::Failed;
                slot.resval.error = Some(err);
                if !slot.is_fresh(at) {
                    slot.resval.value = Value::Unknown;
                }
            }
            Reading::Stale(err) => {
                slot.resval.status = Status::Stale;
                slot.resval.error = Some(err.into());
                slot.resval.value = Value::Unknown;
            }
            Reading::Pending(why) => {
                // A pending reading never hides a fresh good value, and is not an error
                // (docs/protocol.md): it carries no error text. But a resource the output
                // keeps leaving out must not wait forever: past its stale time (since the
                // last good value, or since it first went missing) it fails, with the reason.
                let since = slot
                    .last_good
                    .unwrap_or(*slot.pending_since.get_or_insert(at));
                let waited = at.duration_since(since).unwrap_or_default();
                if waited >= slot.declared.stale_after {
                    slot.resval.status = Status::Failed;
                    slot.resval.error = Some(why.into());
                    slot.resval.value = Value::Unknown;
                } else if slot.last_good.is_none() {
                    slot.resval.status = Status::Pending;
                    slot.resval.error = None;
                }
            }
        }
        let changed = before
            != (
                slot.resval.value.clone(),
                slot.resval.status,
                slot.resval.error.clone(),
            );
        if changed {
            slot.changed_at = next;
            st.version = next;
            self.publish(st);
        }
        true
    }

    /// Age every slot against `now`: an ok value without a good reading for `stale_after`
    /// turns stale, a failed one loses its value. Returns how many slots changed.
    pub fn sweep(&self, now: SystemTime) -> usize {
        let mut st = self.lock();
        let next = st.version + 1;
        let mut changed = 0;
        for slot in st.slots.values_mut() {
            if slot.last_good.is_none() || slot.is_fresh(now) || slot.resval.value.is_unknown() {
                continue;
            }
            let age = slot
                .last_good
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default();
            slot.resval.value = Value::Unknown;
            if slot.resval.status == Status::Ok {
                slot.resval.status = Status::Stale;
                slot.resval.error = Some(
                    format!(
                        "no good reading for {} (stale after {})",
                        humantime::format_duration(Duration::from_secs(age.as_secs())),
                        humantime::format_duration(slot.declared.stale_after)
                    )
                    .into(),
                );
            }
            slot.changed_at = next;
            changed += 1;
        }
        if changed > 0 {
            st.version = next;
            self.publish(st);
        }
        changed
    }

    /// When [`Store::sweep`] can next have something to do, seen at `now`: the earliest a
    /// good value goes stale, or a value recorded from now on could (`now` plus the
    /// shortest stale time); `None` while nothing is declared. A later [`Store::declare`]
    /// wakes [`Store::redeclared`].
    pub fn next_stale_at(&self, now: SystemTime) -> Option<SystemTime> {
        let st = self.lock();
        st.slots
            .values()
            .filter_map(|slot| {
                let from = match slot.last_good {
                    Some(t) if !slot.resval.value.is_unknown() => t.min(now),
                    _ => now,
                };
                from.checked_add(slot.declared.stale_after)
            })
            .min()
    }

    /// Resolves after the next [`Store::declare`] (at once if one came since the last wait).
    pub async fn redeclared(&self) {
        self.declared_anew.notified().await;
    }

    /// Every resval, in name order, and the version it is current as of.
    pub fn snapshot(&self) -> (Versions, Vec<Resval>) {
        self.changes_since(0)
    }

    /// Resvals that changed after `version` (0 = all).
    pub fn changes_since(&self, version: u64) -> (Versions, Vec<Resval>) {
        let st = self.lock();
        let out = st
            .slots
            .values()
            .filter(|s| version == 0 || s.changed_at > version)
            .map(|s| s.resval.clone())
            .collect();
        (st.versions(), out)
    }

    pub fn get(&self, name: &str, instance: &str) -> Option<Resval> {
        self.lock()
            .slots
            .get(&(name.to_owned(), instance.to_owned()))
            .map(|s| s.resval.clone())
    }

    pub fn declared(&self) -> Vec<Declared> {
        self.lock()
            .slots
            .values()
            .map(|s| s.declared.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes on every version or generation change.
    pub fn subscribe(&self) -> watch::Receiver<Versions> {
        self.notify.subscribe()
    }
}

impl Slot {
    fn is_fresh(&self, now: SystemTime) -> bool {
        match self.last_good {
            Some(t) => now
                .duration_since(t)
                .map(|age| age <= self.declared.stale_after)
                .unwrap_or(true),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(name: &str, stale_secs: u64) -> Store {
        let s = Store::new();
        s.declare([Declared {
            name: name.into(),
            instance: String::new(),
            valtype: Valtype::Numeric,
            stale_after: Duration::from_secs(stale_secs),
        }]);
        s
    }

    #[test]
    fn the_next_sweep_is_when_a_value_can_first_go_stale() {
        let s = Store::new();
        assert_eq!(s.next_stale_at(SystemTime::now()), None, "nothing declared");
        let declared = |name: &str, secs| Declared {
            name: name.into(),
            instance: String::new(),
            valtype: Valtype::Numeric,
            stale_after: Duration::from_secs(secs),
        };
        s.declare([declared("a", 10), declared("b", 100)]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let at = |secs| t0 + Duration::from_secs(secs);
        // No value yet: one recorded now could go stale after the shortest stale time.
        assert_eq!(s.next_stale_at(t0), Some(at(10)));
        s.record("a", "", Reading::Ok(Value::Numeric(1.0)), t0);
        assert_eq!(s.next_stale_at(at(5)), Some(at(10)), "a's value");
        s.sweep(at(11));
        assert_eq!(
            s.next_stale_at(at(11)),
            Some(at(21)),
            "a went stale: the next is a value recorded from now on"
        );
    }

    #[tokio::test]
    async fn a_declare_wakes_the_sweeper_even_before_it_waits() {
        let s = store_with("a", 60);
        // The declare came before the wait: its permit is kept.
        tokio::time::timeout(Duration::from_secs(60), s.redeclared())
            .await
            .expect("woken");
    }

    #[test]
    fn starts_pending_then_ok() {
        let s = store_with("scratch", 60);
        assert_eq!(s.get("scratch", "").unwrap().status, Status::Pending);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        s.record("scratch", "", Reading::Ok(Value::Numeric(5.0)), t);
        let r = s.get("scratch", "").unwrap();
        assert_eq!(
            (r.status, r.value, r.last_report_ms),
            (Status::Ok, Value::Numeric(5.0), Some(1_000_000))
        );
    }

    #[test]
    fn left_out_of_the_output_fails_past_stale_after() {
        let s = store_with("varlog_bytes", 60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let missing = || Reading::Pending("\"varlog_bytes\" is not in the probe's output".into());
        s.record("varlog_bytes", "", missing(), t0);
        assert_eq!(s.get("varlog_bytes", "").unwrap().status, Status::Pending);
        s.record("varlog_bytes", "", missing(), t0 + Duration::from_secs(59));
        assert_eq!(s.get("varlog_bytes", "").unwrap().status, Status::Pending);
        s.record("varlog_bytes", "", missing(), t0 + Duration::from_secs(60));
        let r = s.get("varlog_bytes", "").unwrap();
        assert_eq!(r.status, Status::Failed);
        assert!(r
            .error
            .unwrap()
            .to_string()
            .contains("not in the probe's output"));
        // A good value, then left out: the value stands until its stale time, then fails.
        let t1 = t0 + Duration::from_secs(100);
        s.record("varlog_bytes", "", Reading::Ok(Value::Numeric(1.0)), t1);
        s.record("varlog_bytes", "", missing(), t1 + Duration::from_secs(30));
        let r = s.get("varlog_bytes", "").unwrap();
        assert_eq!((r.status, r.value), (Status::Ok, Value::Numeric(1.0)));
        s.record("varlog_bytes", "", missing(), t1 + Duration::from_secs(61));
        let r = s.get("varlog_bytes", "").unwrap();
        assert_eq!((r.status, r.value), (Status::Failed, Value::Unknown));
    }

    #[test]
    fn failure_keeps_last_good_until_stale() {
        let s = store_with("x", 60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        s.record("x", "", Reading::Ok(Value::Numeric(7.0)), t0);
        s.record(
            "x",
            "",
            Reading::Failed("boom".into()),
            t0 + Duration::from_secs(30),
        );
        let r = s.get("x", "").unwrap();
        assert_eq!(
            (r.status, r.value.clone()),
            (Status::Failed, Value::Numeric(7.0))
        );
        assert_eq!(
            r.last_report_ms,
            Some(1_000_000),
            "last_report is the last good reading"
        );
        s.sweep(t0 + Duration::from_secs(61));
        let r = s.get("x", "").unwrap();
        assert_eq!((r.status, r.value), (Status::Failed, Value::Unknown));
    }

    #[test]
    fn ok_value_goes_stale_without_readings() {
        let s = store_with("x", 60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        s.record("x", "", Reading::Ok(Value::Numeric(1.0)), t0);
        assert_eq!(s.sweep(t0 + Duration::from_secs(60)), 0);
        assert_eq!(s.sweep(t0 + Duration::from_secs(61)), 1);
        let r = s.get("x", "").unwrap();
        assert_eq!((r.status, r.value), (Status::Stale, Value::Unknown));
        assert!(r.error.unwrap().to_string().contains("stale after 1m"));
        assert_eq!(
            s.sweep(t0 + Duration::from_secs(62)),
            0,
            "sweeping twice changes nothing"
        );
    }

    #[test]
    fn only_material_changes_bump_the_version() {
        let s = store_with("x", 60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        s.record("x", "", Reading::Ok(Value::Numeric(1.0)), t0);
        let (v1, _) = s.snapshot();
        s.record(
            "x",
            "",
            Reading::Ok(Value::Numeric(1.0)),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(s.snapshot().0, v1);
        assert!(s.changes_since(v1.version).1.is_empty());
        s.record(
            "x",
            "",
            Reading::Ok(Value::Numeric(2.0)),
            t0 + Duration::from_secs(2),
        );
        let (v2, changed) = s.changes_since(v1.version);
        assert!(v2.version > v1.version);
        assert_eq!(changed.len(), 1);
    }

    #[test]
    fn redeclare_keeps_values_and_drops_removed() {
        let s = store_with("x", 60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        s.record("x", "", Reading::Ok(Value::Numeric(1.0)), t0);
        let gen = s.snapshot().0.generation;
        s.declare([
            Declared {
                name: "x".into(),
                instance: String::new(),
                valtype: Valtype::Numeric,
                stale_after: Duration::from_secs(60),
            },
            Declared {
                name: "y".into(),
                instance: String::new(),
                valtype: Valtype::Numeric,
                stale_after: Duration::from_secs(60),
            },
        ]);
        assert_eq!(s.get("x", "").unwrap().value, Value::Numeric(1.0));
        assert_eq!(s.get("y", "").unwrap().status, Status::Pending);
        assert!(s.snapshot().0.generation > gen);
        assert!(!s.record("gone", "", Reading::Ok(Value::Numeric(1.0)), t0));
    }
}
