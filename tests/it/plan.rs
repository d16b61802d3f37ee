//! The plan: which probes this host runs, and why it skips the rest, for every location form.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use xce_agent::config::resources;
use xce_agent::plan::{make_plan, splay, Assignment, Plan, SkipReason, Spread};

const RESOURCES: &str = r#"
resources:
  - name: own
    interval: 30
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [x]}
  - name: implicit_default
    interval: 30
    probe: {kind: exec, command: [x]}
  - name: pool_all
    interval: 30
    resourcemap: [{location: [all]}]
    probe: {kind: exec, command: [x]}
  - name: split
    interval: 30
    resourcemap:
      - location: ["node[001-004]"]
      - location: [others]
    probe: {kind: exec, command: [x]}
  - name: pair
    interval: 30
    resourcemap:
      - location: [node002, node001]
    probe: {kind: exec, command: [x]}
  - name: static_one
    resourcemap: [{location: [default], value: 4}]
  - name: no_probe
    interval: 30
  - name: multi
    interval: 30
    probe: {kind: exec, command: [x], format: kv, provides: [multi_b]}
  - name: multi_b
    valtype: string
    interval: 30
  - name: elsewhere
    interval: 30
    resourcemap: [{location: [gpu01]}]
    probe: {kind: exec, command: [x]}
"#;

fn plan(host: &str, assigned: &[(&str, &str)]) -> Plan {
    plan_of(RESOURCES, host, assigned)
}

fn plan_of(yaml: &str, host: &str, assigned: &[(&str, &str)]) -> Plan {
    let r = resources::parse(Path::new("resources.yaml"), yaml).unwrap();
    let assigned: BTreeSet<Assignment> = assigned
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    make_plan(&r, host, &assigned, Spread::Host)
}

fn task<'a>(p: &'a Plan, name: &str) -> Option<&'a xce_agent::plan::ProbeTask> {
    p.tasks.iter().find(|t| t.name == name)
}

fn skip(p: &Plan, name: &str) -> Option<SkipReason> {
    p.skipped
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.reason.clone())
}

#[test]
fn default_gives_every_host_its_own_instance() {
    for host in ["node001", "login1", "gpu01"] {
        let p = plan(host, &[]);
        assert_eq!(task(&p, "own").unwrap().instance, "");
        assert_eq!(task(&p, "implicit_default").unwrap().instance, "");
    }
}

#[test]
fn all_is_reported_only_where_assigned() {
    let p = plan("node001", &[]);
    assert_eq!(
        skip(&p, "pool_all"),
        Some(SkipReason::Unassigned {
            instance: "all".into()
        })
    );
    let p = plan("node001", &[("pool_all", "all")]);
    assert_eq!(task(&p, "pool_all").unwrap().instance, "all");
}

#[test]
fn host_list_is_reported_by_its_first_host() {
    let p = plan("node001", &[]);
    assert_eq!(task(&p, "split").unwrap().instance, "node[001-004]");
    let p = plan("node003", &[]);
    assert_eq!(
        skip(&p, "split"),
        Some(SkipReason::ReportedBy {
            instance: "node[001-004]".into(),
            host: "node001".into()
        })
    );
    // Written order decides, not sort order: node002 is first in `pair`.
    assert_eq!(
        task(&plan("node002", &[]), "pair").unwrap().instance,
        "node002,node001"
    );
    assert!(skip(&plan("node001", &[]), "pair").is_some());
}

#[test]
fn controller_assignment_moves_a_shared_instance() {
    let p = plan("node003", &[("split", "node[001-004]")]);
    assert_eq!(task(&p, "split").unwrap().instance, "node[001-004]");
}

#[test]
fn others_covers_hosts_no_entry_names() {
    let p = plan("login1", &[]);
    assert_eq!(
        skip(&p, "split"),
        Some(SkipReason::Unassigned {
            instance: "others".into()
        })
    );
    let p = plan("login1", &[("split", "others")]);
    assert_eq!(task(&p, "split").unwrap().instance, "others");
    // A named host is never in `others`, even when assigned it.
    let p = plan("node002", &[("split", "others")]);
    assert!(task(&p, "split").is_none());
}

#[test]
fn host_names_match_ignoring_case_and_domain() {
    for host in [
        "NODE001",
        "node001.cluster.example",
        "Node001.Cluster.Example",
    ] {
        let p = plan(host, &[]);
        assert_eq!(
            task(&p, "split").unwrap().instance,
            "node[001-004]",
            "{host}"
        );
    }
    assert_eq!(
        skip(&plan("node0011", &[]), "elsewhere"),
        Some(SkipReason::NotHere)
    );
}

#[test]
fn static_unprobed_and_absent_resources_say_why() {
    let p = plan("node001", &[]);
    assert_eq!(skip(&p, "static_one"), Some(SkipReason::Static));
    assert_eq!(skip(&p, "no_probe"), Some(SkipReason::NoProbe));
    assert_eq!(skip(&p, "elsewhere"), Some(SkipReason::NotHere));
    let text = SkipReason::ReportedBy {
        instance: "a,b".into(),
        host: "a".into(),
    }
    .to_string();
    assert_eq!(text, "shared instance [a,b] is reported by a");
}

#[test]
fn provided_resources_are_fed_by_their_provider() {
    let p = plan("node001", &[]);
    let t = task(&p, "multi").unwrap();
    let names: Vec<&str> = t.feeds.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["multi", "multi_b"]);
    assert_eq!(t.feeds[1].valtype, xce_agent::value::Valtype::String);
    assert!(task(&p, "multi_b").is_none());
    assert!(skip(&p, "multi_b").is_none());
}

/// An ELIM on every host reports a host value and two shared ones (LSF's master ELIM
/// decides which): each goes to its own instance where this host reports it, and is dropped
/// (with the reason, for `check`) where another host does.
const MIXED: &str = r#"
resources:
  - name: scratch_io
    interval: 30
    probe: {kind: stream, command: [elim], format: elim, provides: [lic_free, lic_pool]}
  - name: lic_free
    interval: 30
    resourcemap: [{location: ["node[001-004]"]}]
  - name: lic_pool
    interval: 30
    resourcemap: [{location: [all]}]
  - name: pool_probe
    interval: 30
    resourcemap: [{location: [all]}]
    probe: {kind: exec, command: [x], format: kv, provides: [pool_host]}
  - name: pool_host
    interval: 30
"#;

fn mixed(host: &str, assigned: &[(&str, &str)]) -> Plan {
    plan_of(MIXED, host, assigned)
}

fn feeds(t: &xce_agent::plan::ProbeTask) -> Vec<(&str, &str)> {
    t.feeds
        .iter()
        .map(|f| (f.name.as_str(), f.instance.as_str()))
        .collect()
}

#[test]
fn one_probe_feeds_host_and_shared_instances_each_where_reported() {
    // node001 is the first host of lic_free's instance; lic_pool is assigned to it.
    let p = mixed("node001", &[("lic_pool", "all")]);
    let t = task(&p, "scratch_io").unwrap();
    assert_eq!(
        feeds(t),
        [
            ("scratch_io", ""),
            ("lic_free", "node[001-004]"),
            ("lic_pool", "all")
        ]
    );
    assert!(t.dropped.is_empty());
    assert_eq!(t.instance, "");
    // node002 shares lic_free's instance but does not report it; nobody assigned lic_pool.
    let p = mixed("node002", &[]);
    let t = task(&p, "scratch_io").unwrap();
    assert_eq!(feeds(t), [("scratch_io", "")]);
    assert_eq!(t.dropped, ["lic_free", "lic_pool"]);
    let Some(SkipReason::Dropped { probe, why }) = skip(&p, "lic_free") else {
        panic!("{:?}", p.skipped)
    };
    assert_eq!(probe.as_deref(), Some("scratch_io"));
    assert_eq!(
        *why,
        SkipReason::ReportedBy {
            instance: "node[001-004]".into(),
            host: "node001".into()
        }
    );
    let text = skip(&p, "lic_free").unwrap().to_string();
    assert_eq!(
        text,
        "shared instance [node[001-004]] is reported by node001; the probe of scratch_io (provides:) runs here too, and this host drops its value"
    );
    assert!(!xce_agent::plan::is_probed(&p, "lic_free"));
    assert!(xce_agent::plan::is_probed(&p, "scratch_io"));
}

#[test]
fn a_probe_declared_on_a_shared_resource_runs_for_the_host_ones_it_feeds() {
    let p = mixed("node009", &[]);
    let t = task(&p, "pool_probe").unwrap();
    assert_eq!(feeds(t), [("pool_host", "")]);
    assert_eq!(t.dropped, ["pool_probe"]);
    assert!(!xce_agent::plan::is_probed(&p, "pool_probe"));
    let text = skip(&p, "pool_probe").unwrap().to_string();
    assert_eq!(
        text,
        "shared instance [all] is reported only by the host the controller assigns; its probe runs here for the other resources it feeds (provides:), and this host drops its value"
    );
    let p = mixed("node009", &[("pool_probe", "all")]);
    let t = task(&p, "pool_probe").unwrap();
    assert_eq!(feeds(t), [("pool_probe", "all"), ("pool_host", "")]);
    assert_eq!(t.instance, "all");
}

#[test]
fn defaults_for_timeout_and_staleness() {
    let p = plan("node001", &[]);
    let t = task(&p, "own").unwrap();
    assert_eq!(t.interval, Duration::from_secs(30));
    assert_eq!(t.timeout, Duration::from_secs(30));
    assert_eq!(t.stale_after, Duration::from_secs(90));
}

#[test]
fn splay_is_deterministic_within_the_interval_and_spreads_hosts() {
    let i = Duration::from_secs(60);
    for spread in [Spread::Host, Spread::Probes] {
        assert_eq!(
            splay(spread, "node001", "scratch", i),
            splay(spread, "NODE001.cluster", "scratch", i)
        );
        let offsets: BTreeSet<Duration> = (1..=100)
            .map(|n| splay(spread, &format!("node{n:03}"), "scratch", i))
            .collect();
        assert!(offsets.iter().all(|d| *d < i));
        // 100 hosts over 60 000 possible offsets: nearly all distinct, none piled on one second.
        assert!(offsets.len() > 90, "{} distinct offsets", offsets.len());
        let seconds: BTreeSet<u64> = offsets.iter().map(|d| d.as_secs()).collect();
        assert!(seconds.len() > 40, "{} distinct seconds", seconds.len());
    }
}

/// One host's probes fall due on its run grid (one phase, 100 ms apart): with `spread:
/// probes` spread over the interval's slots, with `spread: host` (the default) all in one;
/// another host's grid has another phase.
#[test]
fn a_hosts_probes_share_its_run_grid_and_spread_over_the_interval_only_if_asked() {
    let i = Duration::from_secs(10);
    let grid = xce_agent::plan::RUN_GRID;
    let of = |spread: Spread, host: &str| -> Vec<Duration> {
        (0..200)
            .map(|n| splay(spread, host, &format!("r{n:03}"), i))
            .collect()
    };
    let phase = |d: &Duration| d.as_millis() % grid.as_millis();
    let slots = |splays: &[Duration]| -> BTreeSet<u128> {
        splays
            .iter()
            .map(|d| d.as_millis() / grid.as_millis())
            .collect()
    };
    let mine = of(Spread::Probes, "node001");
    assert!(mine.iter().all(|d| *d < i));
    let phases: BTreeSet<u128> = mine.iter().map(phase).collect();
    assert_eq!(phases.len(), 1, "one phase per host: {phases:?}");
    // 200 probes over the 100 slots of a 10 s interval: most slots taken.
    assert!(slots(&mine).len() > 70, "{} slots used", slots(&mine).len());
    let together = of(Spread::Host, "node001");
    assert_eq!(slots(&together).len(), 1, "spread: host: one slot");
    assert_eq!(phase(&together[0]), phase(&mine[0]), "the same run grid");
    for spread in [Spread::Host, Spread::Probes] {
        let hosts: BTreeSet<u128> = (1..=50)
            .map(|n| phase(&splay(spread, &format!("node{n:03}"), "r000", i)))
            .collect();
        assert!(
            hosts.len() > 30,
            "{} distinct phases for 50 hosts",
            hosts.len()
        );
        // An interval shorter than the grid: still within it.
        let fast = Duration::from_millis(40);
        assert!(splay(spread, "node001", "fast", fast) < fast);
    }
}

/// Builtin probes read the sampler's snapshot: nothing to spread, so even with `spread:
/// probes` every builtin probe of an interval shares one slot of the host's run grid (one
/// wake-up, issue 40); exec probes of the same interval spread. With `spread: host` (the
/// default) all twelve share one.
#[test]
fn builtin_probes_of_one_interval_share_a_slot_and_exec_probes_spread_if_asked() {
    let mut text = String::from("resources:\n");
    for name in ["r1m", "r15m", "ut", "mem", "swp", "tmp"] {
        text.push_str(&format!(
            "  - name: {name}\n    interval: 15s\n    probe: {{kind: builtin}}\n"
        ));
    }
    for n in 0..6 {
        text.push_str(&format!(
            "  - name: e{n}\n    interval: 15s\n    probe: {{kind: exec, command: [x]}}\n"
        ));
    }
    let r = resources::parse(Path::new("resources.yaml"), &text).unwrap();
    let splays = |spread: Spread, exec: bool| {
        make_plan(&r, "node001", &BTreeSet::new(), spread)
            .tasks
            .iter()
            .filter(|t| t.name.starts_with('e') == exec)
            .map(|t| t.splay)
            .collect::<BTreeSet<_>>()
    };
    let builtins = splays(Spread::Probes, false);
    assert_eq!(builtins.len(), 1, "builtins: {builtins:?}");
    let execs = splays(Spread::Probes, true);
    assert!(execs.len() > 1, "exec probes: {execs:?}");
    let together = splays(Spread::Host, true);
    assert_eq!(together.len(), 1, "spread: host: {together:?}");
    assert_eq!(splays(Spread::Host, false), together);
}
