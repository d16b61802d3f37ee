//! Limits that say their name: every duration, size and count in a config is range-checked
//! with the bound in the message, nothing from parse to plan panics on an extreme number,
//! 100,000 honest resources load, and an alias bomb does not.

use crate::support as common;
use crate::support as e2e_common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use xce_agent::config::limits::Bound;
use xce_agent::config::scalar::{format_duration, format_size};
use xce_agent::config::{self, agent, resources, Config};
use xce_agent::plan::plan_for;

fn errors(yaml: &str) -> String {
    match resources::parse(Path::new("resources.yaml"), yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

fn with_probe(interval: &str, probe: &str) -> String {
    format!(
        "resources:\n  - name: x\n    interval: {interval}\n    probe: {{kind: file, path: /proc/uptime{probe}}}\n"
    )
}

#[test]
fn an_interval_over_a_day_is_refused_with_the_bound_and_the_fix() {
    let e = errors(&with_probe("36500d", ""));
    assert!(
        e.contains("resources.yaml:3:15: interval 36500d is longer than the limit of 1d (agent.yaml's max_interval; raise it there"),
        "{e}"
    );
    for extreme in [
        "300000000000d",
        "18446744073709551615s",
        "18446744073709551615",
    ] {
        let e = errors(&with_probe(extreme, ""));
        assert!(e.contains("resources.yaml:3:15:"), "{extreme}: {e}");
    }
}

/// `coalesce` (issue 40): the link's window, in milliseconds or the duration grammar, 0 for
/// at once, at most 10s; the default 200ms.
#[test]
fn coalesce_takes_milliseconds_or_a_duration_and_zero_sends_at_once() {
    let window = |text: &str| agent::parse(Path::new("agent.yaml"), text).map(|a| a.coalesce);
    assert_eq!(window("").unwrap(), Duration::from_millis(200));
    assert_eq!(window("coalesce: 0\n").unwrap(), Duration::ZERO);
    assert_eq!(
        window("coalesce: 50ms\n").unwrap(),
        Duration::from_millis(50)
    );
    assert_eq!(window("coalesce: 2s\n").unwrap(), Duration::from_secs(2));
    for (bad, says) in [
        (
            "11s",
            "agent.yaml:1:11: coalesce 11s is longer than the limit of 10s",
        ),
        (
            "10001ms",
            "coalesce 10001ms is longer than the limit of 10s",
        ),
        ("1.5ms", "agent.yaml:1:11: expected a duration"),
        ("-5ms", "agent.yaml:1:11: expected a duration"),
        ("ms", "agent.yaml:1:11: expected a duration"),
        ("99999999999999999999ms", "agent.yaml:1:11:"),
    ] {
        let e = window(&format!("coalesce: {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn max_interval_in_agent_yaml_moves_the_bound_up_to_a_year() {
    let site = common::Setup::with_agent(&with_probe("2d", ""), "max_interval: 3d\n");
    let c = config::load(&site.agent_yaml(), None).expect("2d under a 3d bound");
    assert_eq!(
        c.resources.resources[0].interval,
        Some(Duration::from_secs(2 * 86_400))
    );
    let e = agent::parse(Path::new("agent.yaml"), "max_interval: 730d\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("agent.yaml:1:15: max_interval 730d is longer than the limit of 365d"),
        "{e}"
    );
}

/// Every exec and stream probe gets agent.yaml's `probe_pids_max` (128 unless set; 0 for none)
/// as its cgroup's pids.max unless its own `limits:` say otherwise: one probe's fork bomb
/// cannot fill the unit's TasksMax and stop the others from starting.
#[test]
fn probes_get_a_default_pids_limit_from_agent_yaml() {
    let yaml = "resources:\n  - name: own\n    interval: 10s\n    probe: {kind: exec, command: [x], limits: {pids: 8}}\n  - name: plain\n    interval: 10s\n    probe: {kind: stream, command: [x]}\n";
    let pids = |agent_yaml: &str| {
        let site = common::Setup::with_agent(yaml, agent_yaml);
        let c = config::load(&site.agent_yaml(), None).expect("loads");
        c.resources
            .resources
            .iter()
            .map(|r| {
                r.probe
                    .as_ref()
                    .unwrap()
                    .kind
                    .exec_spec()
                    .unwrap()
                    .limits
                    .pids
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(pids(""), [Some(8), Some(128)]);
    assert_eq!(pids("probe_pids_max: 40\n"), [Some(8), Some(40)]);
    assert_eq!(pids("probe_pids_max: 0\n"), [Some(8), None]);
    let e = agent::parse(Path::new("agent.yaml"), "probe_pids_max: 5000000\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("agent.yaml:1:17: probe_pids_max 5000000 is larger than the limit of 4194304 (0 sets no default limit)"),
        "{e}"
    );
}

#[test]
fn every_other_duration_size_and_count_names_its_bound() {
    let cases = [
        (", timeout: 2d", "timeout 2d is longer than the limit of 1d"),
        (", stale_after: 40d", "is longer than the limit of 30d"),
        (
            ", max_age: 1095d",
            "max_age 1095d is longer than the limit of 365d",
        ),
    ];
    for (probe, want) in cases {
        let e = errors(&with_probe("30", probe));
        assert!(e.contains(want), "{probe}: {e}");
    }
    let exec = |limits: &str| {
        format!("resources:\n  - name: x\n    interval: 30\n    probe: {{kind: exec, command: [p], limits: {{{limits}}}}}\n")
    };
    for (limits, want) in [
        ("cpu: 9999999999999s", "cpu limit 9999999999999s"),
        (
            "open_files: 99999999999",
            "open_files 99999999999 is larger than the limit of 1048576",
        ),
        (
            "processes: 18446744073709551615",
            "18446744073709551616 is too large for a count",
        ),
        ("address_space: 99999999TiB", "too large"),
    ] {
        let e = errors(&exec(limits));
        assert!(e.contains(want), "{limits}: {e}");
    }
    for (agent_yaml, want) in [
        (
            "max_stuck_reads: 0\n",
            "max_stuck_reads must be between 1 and 1024, got 0",
        ),
        (
            "max_stuck_reads: 99999999999\n",
            "max_stuck_reads must be between 1 and 1024",
        ),
        (
            "max_parallel: -1\n",
            "max_parallel must be between 1 and 1024",
        ),
    ] {
        let e = agent::parse(Path::new("agent.yaml"), agent_yaml)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{agent_yaml}: {e}");
    }
}

/// The whole path from the files to what the daemon computes from them: plan, store slots,
/// hello, splay and the next slot.
fn parse_to_plan(agent_yaml: &str, resources_yaml: &str) {
    let site = common::Setup::with_agent(resources_yaml, agent_yaml);
    let Ok(config): Result<Config, _> = config::load(&site.agent_yaml(), None) else {
        return;
    };
    let plan = plan_for(&config, "node001", &Default::default());
    let store = xce_agent::store::Store::new();
    store.declare(xce_agent::daemon::declared(&plan));
    let _ = xce_agent::daemon::hello(&config, &plan, "boot");
    for t in &plan.tasks {
        assert!(t.splay < t.interval, "{t:?}");
        let next = xce_agent::schedule::next_slot(SystemTime::now(), t.interval, t.splay);
        assert!(next <= t.interval, "{t:?}");
    }
    store.sweep(SystemTime::now() + Duration::from_secs(400 * 86_400));
}

fn extreme_duration() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("300000000000d".to_owned()),
        Just("18446744073709551615s".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("1e308".to_owned()),
        Just("-1".to_owned()),
        Just("0.0000001".to_owned()),
        (
            any::<u64>(),
            prop::sample::select(vec!["ns", "ms", "s", "m", "h", "d", "w", "years", ""])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        (
            0u64..100_000,
            prop::sample::select(vec!["s", "m", "h", "d"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
    ]
}

fn extreme_count() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (
            any::<u64>(),
            prop::sample::select(vec!["KiB", "MiB", "GiB", "TiB"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
    ]
}

proptest! {
    #![proptest_config(crate::support::proptest_config(64))]

    #[test]
    fn no_extreme_number_panics_from_parse_to_plan(
        interval in extreme_duration(),
        timeout in extreme_duration(),
        stale in extreme_duration(),
        silence in extreme_duration(),
        max_age in extreme_duration(),
        cpu in extreme_duration(),
        max_interval in extreme_duration(),
        count in extreme_count(),
        stuck in extreme_count(),
    ) {
        let agent_yaml = format!("max_interval: {max_interval}\nmax_stuck_reads: {stuck}\n");
        let file = format!(
            "resources:\n  - name: f\n    interval: {interval}\n    probe: {{kind: file, path: /proc/uptime, timeout: {timeout}, stale_after: {stale}, max_age: {max_age}, max_bytes: {count}}}\n\
             \x20 - name: s\n    interval: {interval}\n    probe: {{kind: stream, command: [p], silence: {silence}, limits: {{cpu: {cpu}, open_files: {count}, address_space: {count}}}}}\n"
        );
        parse_to_plan(&agent_yaml, &file);
        parse_to_plan("", &file);
    }
}

/// Valid resources as an admin writes them (name, desc, valtype, interval, resourcemap,
/// probe), `n` of them.
pub fn honest_resources(n: usize) -> String {
    let mut s = String::with_capacity(n * 200);
    s.push_str("resources:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  - name: res_{i}\n    desc: resource number {i}\n    valtype: numeric\n    interval: 60s\n    resourcemap:\n      - location: [default]\n    probe:\n      kind: file\n      path: /sys/class/x/{i}\n"
        ));
    }
    s
}

#[test]
fn a_hundred_thousand_honest_resources_load() {
    let text = honest_resources(100_000);
    let r = resources::parse(Path::new("resources.yaml"), &text).expect("100,000 resources load");
    assert_eq!(r.resources.len(), 100_000);
}

#[test]
fn an_alias_bomb_is_refused_with_the_limit_named() {
    let mut bomb = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        bomb.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    bomb.push_str("resources: []\n");
    let e = errors(&bomb);
    assert!(
        e.starts_with("resources.yaml: the file's aliases (*name) expand to more than 1000000 YAML events, the agent's limit against alias bombs; write the repeated parts out"),
        "{e}"
    );
}

/// `check` (and so `--once` and the daemon) exits 2 on the numbers, never 101.
#[test]
fn check_refuses_the_overflowing_interval_without_a_panic() {
    for extreme in ["300000000000d", "18446744073709551615s"] {
        let site = common::Setup::new(&with_probe(extreme, ""));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_xce-agent"))
            .arg("--config")
            .arg(site.agent_yaml())
            .arg("check")
            .output()
            .expect("run check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("is longer than the limit of 1d"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// SIGHUP with the overflowing interval: the reload is refused with the bound, and the
/// daemon goes on running the old plan (its counter probe keeps counting).
#[tokio::test]
async fn sighup_with_an_overflowing_interval_keeps_the_running_plan() {
    let site = e2e_common::Site::new(
        &[],
        "resources:\n  - name: count\n    valtype: numeric\n    interval: 1\n    probe: {kind: exec, command: [count.sh]}\n",
    );
    site.counter_script("count");
    let mut agent = site.spawn_agent();
    site.wait_runs("count", 1).await;
    std::fs::write(
        site.file("resources.yaml"),
        "resources:\n  - name: count\n    valtype: numeric\n    interval: 300000000000d\n    probe: {kind: exec, command: [count.sh]}\n",
    )
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    agent
        .wait_log(
            "reload failed: 1 error(s) in the configuration; still running the previous configuration",
            1,
        )
        .await;
    assert!(
        agent
            .log_text()
            .contains("interval 300000000000d is longer than the limit of 1d"),
        "{}",
        agent.log_text()
    );
    let runs = site.runs("count");
    site.wait_runs("count", runs + 2).await;
    agent.assert_alive();
    assert!(agent.terminate().await.success());
}

/// A value of `bound`'s kind as YAML writes it (durations in seconds).
fn written(bound: Bound, n: u64) -> String {
    match bound {
        Bound::Duration(_) | Bound::Interval(_) => format!("{n}s"),
        Bound::Count(_) | Bound::Size(_) => n.to_string(),
    }
}

/// `bound`'s ends in the unit `written` takes.
fn ends(bound: Bound) -> (u64, u64) {
    match bound {
        Bound::Duration(b) | Bound::Interval(b) => (b.min.as_secs(), b.max.as_secs()),
        Bound::Count(b) | Bound::Size(b) => (b.min, b.max),
    }
}

/// Parse one file holding `field: value` where the field lives (`place`): the errors' text,
/// empty when it loads.
fn parse_with_field(place: &str, field: &str, value: &str) -> String {
    let agent = |text: String| agent::parse(Path::new("agent.yaml"), &text).err();
    let resource = |probe: String| {
        let text = format!("resources:\n  - name: x\n    interval: 30\n    probe: {probe}\n");
        resources::parse(Path::new("resources.yaml"), &text).err()
    };
    let errors = match place {
        "agent" => agent(format!("{field}: {value}\n")),
        "tls" => agent(format!(
            "tls: {{ca: c, cert: c, key: k, {field}: {value}}}\n"
        )),
        "resource" => resources::parse(
            Path::new("resources.yaml"),
            &format!("resources:\n  - name: x\n    {field}: {value}\n"),
        )
        .err(),
        "limits" => resource(format!(
            "{{kind: exec, command: [p], limits: {{{field}: {value}}}}}"
        )),
        kind => {
            let needs = match kind {
                "exec" | "stream" => ", command: [p]",
                "file" => ", path: /proc/uptime",
                _ => "",
            };
            resource(format!("{{kind: {kind}{needs}, {field}: {value}}}"))
        }
    };
    errors.map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn every_bounded_field_is_checked_at_its_table_bound_and_the_man_page_shows_it() {
    use xce_agent::config::names::Field;
    use xce_agent::config::probe_spec::{self, Takes};
    use xce_agent::render::man;

    // Every field table with a bound, where its fields are written, and its man page.
    let mut rows: Vec<(String, Field, String)> = Vec::new();
    let agent_page = man::agent_yaml();
    let resources_page = man::resources_yaml();
    for f in agent::FIELD_DOCS {
        rows.push(("agent".into(), *f, String::new()));
    }
    for f in agent::TLS_FIELD_DOCS {
        rows.push(("tls".into(), *f, "tls.".into()));
    }
    for f in config::RESOURCE_FIELD_DOCS {
        rows.push(("resource".into(), *f, String::new()));
    }
    for ((_, takes), f) in probe_spec::FIELDS.iter().zip(probe_spec::FIELD_DOCS) {
        let kind = match takes {
            Takes::Every => "builtin",
            Takes::Only(kinds) => kinds[0],
        };
        rows.push((kind.into(), *f, String::new()));
    }
    for f in probe_spec::LIMIT_FIELD_DOCS {
        rows.push(("limits".into(), *f, "limits.".into()));
    }
    let mut checked = 0;
    for (place, f, prefix) in rows {
        let Some(bound) = f.bound else { continue };
        checked += 1;
        let name = f.name;
        let (min, max) = ends(bound);
        let at = |n: u64| parse_with_field(&place, name, &written(bound, n));
        assert_eq!(at(max), "", "{prefix}{name} at its table's largest, {max}");
        assert_eq!(at(min), "", "{prefix}{name} at its table's smallest, {min}");
        // The error names the field (`cpu limit`, `tls.expiry_warning`) and the bound.
        let past = at(max + 1);
        let largest = match bound {
            Bound::Duration(b) | Bound::Interval(b) => vec![format_duration(b.max)],
            Bound::Count(b) => vec![b.max.to_string()],
            Bound::Size(b) => vec![b.max.to_string(), format_size(b.max)],
        };
        assert!(
            past.contains(name.split('_').next().unwrap_or(name))
                && largest.iter().any(|l| past.contains(&format!(" {l}"))),
            "{prefix}{name} past its table's largest, {max}: {past:?}"
        );
        // An interval of 0 is no error but a static resource.
        if min > 0 && !matches!(bound, Bound::Interval(_)) {
            let below = at(min - 1);
            assert!(
                below.contains(name),
                "{prefix}{name} below its table's smallest, {min}: {below:?}"
            );
        }
        let page = if ["agent", "tls"].contains(&place.as_str()) {
            &agent_page
        } else {
            &resources_page
        };
        let entry = format!(".B {prefix}{name}\n");
        let line = page
            .split(&entry)
            .nth(1)
            .and_then(|rest| rest.lines().next())
            .unwrap_or_else(|| panic!("{prefix}{name} is not on its man page"));
        let range = format!("Range: {}.", bound.describe()).replace('-', "\\-");
        assert!(line.contains(&range), "{prefix}{name}: {line}");
    }
    assert_eq!(checked, 20, "the bounded fields");
}

/// A stream's `declared_state` (issue 36): its budget for what it declares, 2 MiB unless
/// the probe says otherwise.
#[test]
fn a_streams_declared_state_budget_defaults_to_two_mib_and_takes_a_size() {
    let budget = |extra: &str| {
        let text = format!(
            "resources:\n  - name: x\n    interval: 30\n    probe: {{kind: stream, command: [p], format: netdata{extra}}}\n"
        );
        let parsed = resources::parse(Path::new("resources.yaml"), &text).expect("loads");
        match &parsed.resources[0].probe.as_ref().expect("a probe").kind {
            config::ProbeKind::Stream(spec) => spec.declared_state,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(budget(""), xce_agent::output::DECLARED_STATE_BYTES);
    assert_eq!(budget(", declared_state: 256KiB"), 256 << 10);
    let refused = parse_with_field("stream", "declared_state", "1GiB");
    assert!(
        refused.contains("declared_state must be between 64KiB and 256MiB"),
        "{refused}"
    );
}
