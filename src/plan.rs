//! What this host probes, and why it does not probe the rest. A pure function of the config,
//! the host name and the shared instances the controller assigned to this host.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

pub use crate::config::agent::Spread;
use crate::config::hostlist::same_host;
use crate::config::{fnv1a, Config, Location, ProbeKind, ProbeSpec, Resource, Resources};
use crate::value::Valtype;

/// (resource, instance label): a shared instance the controller asked this host to report.
pub type Assignment = (String, String);

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub host: String,
    pub tasks: Vec<ProbeTask>,
    pub skipped: Vec<Skipped>,
}

/// One probe this host runs. Compared by value: a reload keeps a probe whose task is equal.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeTask {
    /// The resource the probe is declared on; also the probe's name (`probe NAME`).
    pub name: String,
    /// The instance of the probe's first feed (the resource it is declared on, when this
    /// host reports that one): empty for this host's own instance, else a shared instance's
    /// label. Each feed says its own ([`Feed::instance`]).
    pub instance: String,
    pub kind: ProbeKind,
    pub interval: Duration,
    pub timeout: Duration,
    /// Offset within the interval ([`splay`]): from a hash of the host (agent.yaml's
    /// `spread: host`, the default) or of host and name (`spread: probes`); hosts of a
    /// cluster spread out either way.
    pub splay: Duration,
    pub stale_after: Duration,
    /// Every resource this probe's output feeds on this host, the declaring one first when
    /// it is one of them.
    pub feeds: Vec<Feed>,
    /// Resources in the probe's `provides:` that this host does not report (a shared
    /// instance another host reports): the output may name them, and their values are
    /// dropped, neither recorded nor counted as names outside `provides:`.
    pub dropped: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feed {
    pub name: String,
    pub valtype: Valtype,
    /// Which instance of the resource the values go to: empty for this host's own, else the
    /// shared instance's label. One probe may feed both (an ELIM reports host and shared
    /// values together).
    pub instance: String,
}

impl Feed {
    /// Whether the values go to a shared instance: samples for Grid Engine's `global` host
    /// (`host="global"`) feed it, and never a host's own instance.
    pub fn is_shared(&self) -> bool {
        !self.instance.is_empty()
    }
}

impl ProbeTask {
    pub fn feed(&self, name: &str) -> Option<&Feed> {
        self.feeds.iter().find(|f| f.name == name)
    }

    /// The instance the `i`th reading of a run, named `name`, goes to. Readings come in the
    /// feeds' order, so the `i`th feed is looked at first (no scan of the feeds per reading);
    /// a subset (a stream's line) falls back to a look-up.
    pub fn instance_of(&self, i: usize, name: &str) -> &str {
        match self.feeds.get(i) {
            Some(f) if f.name == name => &f.instance,
            _ => self.feed(name).map_or(&self.instance, |f| &f.instance),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub name: String,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// No interval: a static value the controller owns.
    Static,
    /// No instance of the resource covers this host.
    NotHere,
    /// A shared instance whose first listed host reports it.
    ReportedBy { instance: String, host: String },
    /// An `all`/`others` instance nobody assigned to this host.
    Unassigned { instance: String },
    /// Dynamic, but nothing here can measure it.
    NoProbe,
    /// Fed by a probe that runs here for the other resources it feeds, but this host does
    /// not report the resource's instance: the probe's value for it is dropped. `probe` is
    /// the resource the probe is declared on, `None` when that is this one.
    Dropped {
        probe: Option<String>,
        why: Box<SkipReason>,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Static => {
                f.write_str("static (no interval): the controller owns its value")
            }
            SkipReason::NotHere => f.write_str("no instance covers this host"),
            SkipReason::ReportedBy { instance, host } => {
                write!(f, "shared instance [{instance}] is reported by {host}")
            }
            SkipReason::Unassigned { instance } => write!(
                f,
                "shared instance [{instance}] is reported only by the host the controller assigns"
            ),
            SkipReason::NoProbe => f.write_str("dynamic but has no probe"),
            SkipReason::Dropped {
                probe: Some(probe),
                why,
            } => write!(
                f,
                "{why}; the probe of {probe} (provides:) runs here too, and this host drops its value"
            ),
            SkipReason::Dropped { probe: None, why } => write!(
                f,
                "{why}; its probe runs here for the other resources it feeds (provides:), and this host drops its value"
            ),
        }
    }
}

/// Whether `name` is probed here, directly or through the `provides:` of a probe.
pub fn is_probed(plan: &Plan, name: &str) -> bool {
    plan.tasks.iter().any(|t| t.feed(name).is_some())
}

/// The probe that feeds `name` through its `provides:`, if another resource's probe does.
pub fn provided_by<'a>(resources: &'a Resources, name: &str) -> Option<&'a Resource> {
    resources.resources.iter().find(|r| {
        r.name != name
            && r.probe
                .as_ref()
                .is_some_and(|p| p.provides.iter().any(|n| n == name))
    })
}

/// Why `name`, which [`is_probed`] says is not, is not probed on this host (for `--once
/// --only` and `probe NAME`).
pub fn why_not_probed(resources: &Resources, plan: &Plan, name: &str) -> String {
    let skipped = |n: &str| plan.skipped.iter().find(|s| s.name == n);
    if let Some(s) = skipped(name) {
        let hint = match s.reason {
            SkipReason::NotHere => near_hosts_hint(resources, name, &plan.host),
            _ => String::new(),
        };
        return format!("{}{hint}", s.reason);
    }
    match provided_by(resources, name) {
        Some(feeder) => match skipped(&feeder.name) {
            Some(s) => format!(
                "it is fed by the probe of {} (`provides:`), which this host skips: {}",
                feeder.name, s.reason
            ),
            None => format!(
                "it is fed by the probe of {}, which does not run here",
                feeder.name
            ),
        },
        None => {
            let names: Vec<&str> = resources
                .resources
                .iter()
                .flat_map(|r| {
                    let fed = r.probe.iter().flat_map(|p| p.provides.iter());
                    std::iter::once(r.name.as_str()).chain(fed.map(String::as_str))
                })
                .collect();
            match crate::config::near_miss(name, &names) {
                Some(near) => format!("no such resource in resources.yaml; did you mean {near}?"),
                None => "no such resource in resources.yaml".to_owned(),
            }
        }
    }
}

/// For a resource no instance of which covers `host`: the host names its resourcemap lists
/// that look like typos of `host` (`node0001` for `node001`), for `check` and `probe NAME`.
pub fn near_hosts<'a>(resources: &'a Resources, name: &str, host: &str) -> Vec<&'a str> {
    let Some(res) = resources.resources.iter().find(|r| r.name == name) else {
        return Vec::new();
    };
    res.instances
        .iter()
        .filter_map(|i| match &i.location {
            Location::Hosts(hosts) => Some(hosts),
            _ => None,
        })
        .flatten()
        .map(String::as_str)
        .filter(|h| crate::config::hostlist::looks_like_typo_of(h, host))
        .collect()
}

/// ` (resourcemap names node0001: a typo of node001?)` where [`near_hosts`] finds any.
pub fn near_hosts_hint(resources: &Resources, name: &str, host: &str) -> String {
    match near_hosts(resources, name, host)[..] {
        [] => String::new(),
        ref near => format!(
            " (resourcemap names {}: a typo of {host}?)",
            near.join(", ")
        ),
    }
}

/// Which instance of `res` this host belongs to, and whether it reports it.
enum Membership {
    Own,
    Shared {
        label: String,
        reports: Result<(), SkipReason>,
    },
    None,
}

fn membership(res: &Resource, host: &str, assigned: &BTreeSet<Assignment>) -> Membership {
    let is_assigned = |label: &str| assigned.contains(&(res.name.clone(), label.to_owned()));
    let shared = |label: &str, otherwise: SkipReason| Membership::Shared {
        label: label.to_owned(),
        reports: if is_assigned(label) {
            Ok(())
        } else {
            Err(otherwise)
        },
    };
    let named = res.instances.iter().find_map(|i| match &i.location {
        Location::Hosts(hs) if hs.iter().any(|h| same_host(h, host)) => Some((i, hs)),
        _ => None,
    });
    if let Some((inst, hosts)) = named {
        let first = &hosts[0];
        return if same_host(first, host) {
            Membership::Shared {
                label: inst.label.clone(),
                reports: Ok(()),
            }
        } else {
            shared(
                &inst.label,
                SkipReason::ReportedBy {
                    instance: inst.label.clone(),
                    host: first.clone(),
                },
            )
        };
    }
    for inst in &res.instances {
        match inst.location {
            Location::Default => return Membership::Own,
            Location::All | Location::Others => {
                return shared(
                    &inst.label,
                    SkipReason::Unassigned {
                        instance: inst.label.clone(),
                    },
                )
            }
            Location::Hosts(_) => {}
        }
    }
    Membership::None
}

/// The step of a host's run grid: every probe of a host falls due at `phase + k * RUN_GRID`
/// (`phase` from the host's name), so the runs that fall due together start in one wake-up
/// of the agent. A run grid cost a busy agent one timer wake-up per run less: 1.6 context
/// switches a run instead of 2.6 (BENCHMARKS.md section 21d). By default ([`Spread::Host`])
/// a host's probes also share `k`, so that they fall due together, and a node's jobs are
/// interrupted once per interval for them all, not once per probe: 50 exec probes at 1 s
/// cost the agent 80 µs of CPU a run in one slot against 120 µs spread over the second's 10
/// (benches/exec_cpu.rs). Across hosts the offsets differ, so a cluster still spreads.
pub const RUN_GRID: Duration = Duration::from_millis(100);

/// The span a host's offset is drawn from ([`host_offset`]): an hour, so the offset taken
/// modulo an interval that divides an hour (1 s, 15 s, 1 min, 5 min, 1 h) is as uniform over
/// that interval across a cluster's hosts as the hash is.
const HOST_OFFSET_SPAN_MS: u64 = 3_600_000;

/// This host's offset, on its run grid, in `[0, 1 h)`: from a hash of the host's key, so
/// `node001` and `NODE001.cluster` get the same one. Under [`Spread::Host`] each probe runs
/// at this offset modulo its interval.
pub fn host_offset(host: &str) -> Duration {
    let key = crate::config::hostlist::host_key(host);
    Duration::from_millis(offset_ms(fnv1a(&[key.as_bytes()])))
}

/// The host offset, in ms, from the hash of the host's key.
fn offset_ms(host_hash: u64) -> u64 {
    host_hash % HOST_OFFSET_SPAN_MS
}

/// Where in its interval a probe runs on this host, as agent.yaml's `spread` says: always on
/// the host's run grid ([`RUN_GRID`]). [`Spread::Host`]: the host's offset modulo the
/// interval, so probes at 15 s, 30 s and 1 min share their instants (each minute all three
/// run in one wake-up) and probes of one interval share every one. [`Spread::Probes`]: in a
/// slot of the interval chosen by a hash of host and `name`, so they spread.
pub fn splay(spread: Spread, host: &str, name: &str, interval: Duration) -> Duration {
    let ms = u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    // An interval shorter than the grid is its own grid, of one slot.
    let grid = (RUN_GRID.as_millis() as u64).min(ms);
    let slots = ms / grid;
    let key = crate::config::hostlist::host_key(host);
    let host_hash = fnv1a(&[key.as_bytes()]);
    let phase = host_hash % grid;
    let slot = match spread {
        // The host offset's slot of the grid, modulo the interval's: `host_offset % interval`
        // where the interval is a whole number of slots (every interval the config allows).
        Spread::Host => offset_ms(host_hash) / grid % slots,
        Spread::Probes => fnv1a(&[key.as_bytes(), b"\0", name.as_bytes()]) % slots,
    };
    Duration::from_millis(phase + slot * grid)
}

/// The plan of `host` from a loaded config: its resources, placed as its agent.yaml's
/// `spread` says.
pub fn plan_for(config: &Config, host: &str, assigned: &BTreeSet<Assignment>) -> Plan {
    make_plan(&config.resources, host, assigned, config.agent.spread)
}

/// The plan of `host`, its probes placed in their intervals as `spread` says.
pub fn make_plan(
    resources: &Resources,
    host: &str,
    assigned: &BTreeSet<Assignment>,
    spread: Spread,
) -> Plan {
    let mut plan = Plan {
        host: host.to_owned(),
        tasks: Vec::new(),
        skipped: Vec::new(),
    };
    let provided: BTreeSet<&str> = resources
        .resources
        .iter()
        .filter_map(|r| r.probe.as_ref())
        .flat_map(|p| p.provides.iter().skip(1).map(String::as_str))
        .collect();
    // By name: a linear lookup per task made planning 100,000 resources quadratic.
    let by_name: std::collections::HashMap<&str, &Resource> = resources
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r))
        .collect();
    for res in &resources.resources {
        let skip = |reason| Skipped {
            name: res.name.clone(),
            reason,
        };
        let Some(interval) = res.interval else {
            plan.skipped.push(skip(SkipReason::Static));
            continue;
        };
        if provided.contains(res.name.as_str()) {
            // Reported through the probe that provides it, at its own instance (see below).
            continue;
        }
        let here = reported_here(res, host, assigned);
        let Some(probe) = &res.probe else {
            plan.skipped
                .push(skip(here.err().unwrap_or(SkipReason::NoProbe)));
            continue;
        };
        // Each fed resource goes to its own instance here, or is dropped where another host
        // reports it: one probe may feed host and shared resources (an ELIM does).
        let (mut feeds, mut dropped) = (Vec::new(), Vec::new());
        for fed in probe
            .provides
            .iter()
            .filter_map(|n| by_name.get(n.as_str()))
        {
            let reach = if fed.name == res.name {
                here.clone()
            } else {
                reported_here(fed, host, assigned)
            };
            match reach {
                Ok(instance) => feeds.push(Feed {
                    name: fed.name.clone(),
                    valtype: fed.valtype,
                    instance,
                }),
                Err(why) => dropped.push((fed.name.clone(), why)),
            }
        }
        if feeds.is_empty() {
            // Nothing this probe measures is reported here: it does not run.
            if let Err(why) = here {
                plan.skipped.push(skip(why));
            }
            continue;
        }
        for (name, why) in &dropped {
            plan.skipped.push(Skipped {
                name: name.clone(),
                reason: SkipReason::Dropped {
                    probe: (*name != res.name).then(|| res.name.clone()),
                    why: Box::new(why.clone()),
                },
            });
        }
        let dropped = dropped.into_iter().map(|(name, _)| name).collect();
        plan.tasks
            .push(task(res, probe, interval, (feeds, dropped), (host, spread)));
    }
    plan
}

/// Which instance of `res` this host reports (empty: its own), or why it reports none.
fn reported_here(
    res: &Resource,
    host: &str,
    assigned: &BTreeSet<Assignment>,
) -> Result<String, SkipReason> {
    match membership(res, host, assigned) {
        Membership::Own => Ok(String::new()),
        Membership::Shared { label, reports } => reports.map(|()| label),
        Membership::None => Err(SkipReason::NotHere),
    }
}

/// What places a probe in its interval under `spread: probes`: its name, except for builtin
/// probes, which read the shared sampler's last snapshot (no process, nothing to spread):
/// every builtin probe of an interval shares one slot, so six load indices at 15 s wake the
/// agent once per 15 s, not six times (BENCHMARKS.md section 23). (`spread: host` places
/// every probe of an interval in one slot.)
fn slot_key<'a>(res: &'a Resource, probe: &ProbeSpec) -> &'a str {
    match probe.kind {
        ProbeKind::Builtin { .. } => "builtin",
        _ => &res.name,
    }
}

fn task(
    res: &Resource,
    probe: &ProbeSpec,
    interval: Duration,
    (feeds, dropped): (Vec<Feed>, Vec<String>),
    (host, spread): (&str, Spread),
) -> ProbeTask {
    let timeout = probe.timeout_at(interval);
    let stale_after = probe.stale_after_at(interval, timeout);
    ProbeTask {
        name: res.name.clone(),
        instance: feeds
            .first()
            .map_or_else(String::new, |f| f.instance.clone()),
        kind: probe.kind.clone(),
        interval,
        timeout,
        splay: splay(spread, host, slot_key(res, probe), interval),
        stale_after,
        feeds,
        dropped,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    /// Under `spread: host` a probe's phase is the host's offset modulo its interval: the
    /// name does not matter, and the 60 s probe's instants are instants of the 15 s and 30 s
    /// probes too (every minute all three run in one wake-up).
    #[test]
    fn a_hosts_probes_share_their_instants_where_intervals_divide() {
        let at = |name: &str, s: u64| splay(Spread::Host, "node001", name, secs(s));
        let offset = ms(host_offset("node001"));
        assert!(offset < 3_600_000);
        for s in [1, 10, 15, 30, 60, 300, 3600] {
            let interval = u128::from(s) * 1000;
            assert_eq!(ms(at("temp", s)), offset % interval, "{s} s");
            assert_eq!(
                at("temp", s),
                at("gpu_util", s),
                "{s} s: names do not matter"
            );
            assert_eq!(at("temp", s), at("builtin", s), "{s} s");
        }
        let (s15, s30, s60) = (ms(at("a", 15)), ms(at("b", 30)), ms(at("c", 60)));
        assert_eq!(s60 % 15_000, s15);
        assert_eq!(s60 % 30_000, s30);
        assert_eq!(s30 % 15_000, s15);
        // On the host's run grid: one sub-grid phase for all its probes.
        let phases: BTreeSet<u128> = [1, 15, 30, 60, 3600]
            .iter()
            .map(|&s| ms(at("x", s)) % ms(RUN_GRID))
            .collect();
        assert_eq!(phases.len(), 1, "{phases:?}");
        assert_eq!(
            at("x", 60),
            splay(Spread::Host, "NODE001.cluster", "y", secs(60)),
            "the host's key, not its spelling"
        );
    }

    /// Across a cluster the hosts still spread: 1000 hosts' 1 s probes cover the second's 10
    /// grid slots, none with more than 3x its share; at 1 min nearly every host has an
    /// offset of its own. (The hash is fixed, so these counts are too.)
    #[test]
    fn hosts_spread_over_the_interval() {
        let hosts: Vec<String> = (1..=1000).map(|n| format!("node{n:04}")).collect();
        let mut per_slot: BTreeMap<u128, usize> = BTreeMap::new();
        for h in &hosts {
            let s = splay(Spread::Host, h, "load", secs(1));
            assert!(s < secs(1));
            *per_slot.entry(ms(s) / ms(RUN_GRID)).or_default() += 1;
        }
        assert_eq!(per_slot.len(), 10, "{per_slot:?}");
        assert!(per_slot.values().all(|&n| n <= 300), "{per_slot:?}");
        let minute: BTreeSet<Duration> = hosts
            .iter()
            .map(|h| splay(Spread::Host, h, "load", secs(60)))
            .collect();
        assert!(minute.len() > 950, "{} distinct offsets", minute.len());
        assert!(minute.iter().all(|d| *d < secs(60)));
    }

    /// `spread: probes` is the placement before `spread:` existed, value for value (these
    /// are what that code gave), and an interval shorter than the grid stays within it.
    #[test]
    fn spread_probes_gives_the_per_probe_slots_of_before() {
        for (host, name, interval_ms, want_ms) in [
            ("node001", "scratch", 60_000, 10_224),
            ("node001", "temp", 30_000, 19_024),
            ("node002", "scratch", 60_000, 21_957),
            ("gpu17", "builtin", 15_000, 6_097),
            ("login1", "ipmi", 1_000, 5),
            ("node001", "fast", 40, 4),
        ] {
            let got = splay(
                Spread::Probes,
                host,
                name,
                Duration::from_millis(interval_ms),
            );
            assert_eq!(ms(got), want_ms, "{host} {name} {interval_ms} ms");
        }
        let fast = Duration::from_millis(40);
        assert!(splay(Spread::Host, "node001", "fast", fast) < fast);
    }
}
