//! The Prometheus mixin in monitoring/: its rules pass `promtool check rules` and their unit
//! tests (`promtool test rules`), every alert has a test that fires it and one that does not,
//! and the rules and the Grafana dashboard name only metrics a running agent exports (or the
//! mixin records).

use crate::support as common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::tls::Pki;
use crate::support::Setup;
use serde_json::Value;

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every rule of a Prometheus rule file.
fn rules(file: &Value) -> Vec<&Value> {
    file["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .collect()
}

fn alerts() -> Value {
    yaml(&monitoring().join("prometheus/alerts.yaml"))
}

fn recording_rules() -> Value {
    yaml(&monitoring().join("prometheus/rules.yaml"))
}

fn dashboard() -> Value {
    let path = monitoring().join("grafana/xce-agent.json");
    let text = std::fs::read_to_string(&path).expect("dashboard");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The unit-test files `promtool test rules` runs.
fn rule_tests() -> Vec<PathBuf> {
    let dir = monitoring().join("prometheus/tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("monitoring/prometheus/tests")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn promtool(args: &[&str], files: &[PathBuf]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .args(files)
        .current_dir(monitoring().join("prometheus"))
        .output()
        .expect("promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
#[ignore = "needs promtool (Debian's prometheus package); CI runs it with `cargo test -- --ignored`"]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    common::require_tool("promtool", &["--version"], "apt-get install prometheus");
    let dir = monitoring().join("prometheus");
    promtool(
        &["check", "rules"],
        &[dir.join("alerts.yaml"), dir.join("rules.yaml")],
    );
    let tested = promtool(&["test", "rules"], &rule_tests());
    assert!(!tested.contains("FAILED"), "{tested}");
}

/// Each dashboard query, made a recording rule, passes `promtool check rules`: it parses as
/// PromQL (with Grafana's variables given values).
#[test]
#[ignore = "needs promtool (Debian's prometheus package); CI runs it with `cargo test -- --ignored`"]
fn the_dashboards_queries_are_valid_promql() {
    common::require_tool("promtool", &["--version"], "apt-get install prometheus");
    let rules: Vec<Value> = dashboard_queries(&dashboard())
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$job", ".*")
                .replace("$instance", ".*");
            serde_json::json!({"record": format!("dashboard:query{i}:check"), "expr": expr})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().expect("tempdir");
    // JSON is YAML: promtool reads it as a rule file.
    let path = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&path, file.to_string()).expect("write");
    promtool(&["check", "rules"], &[path]);
}

/// Each alert has a unit test in which it fires and one in which it does not: a test that
/// only ever expects silence passes for an alert that can never fire.
#[test]
fn every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() {
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for file in rule_tests() {
        let tests = yaml(&file);
        for test in tests["tests"].as_array().into_iter().flatten() {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = case["alertname"].as_str().expect("alertname").to_owned();
                match case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                    true => fired.insert(name),
                    false => quiet.insert(name),
                };
            }
        }
    }
    let alerts = alerts();
    let names: Vec<&str> = rules(&alerts)
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        assert!(fired.contains(name), "no unit test fires {name}");
        assert!(quiet.contains(name), "no unit test keeps {name} quiet");
    }
    for rule in rules(&alerts) {
        let name = rule["alert"].as_str().expect("an alert");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        assert!(rule["for"].as_str().is_some(), "{name} has no for:");
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation].as_str().is_some(),
                "{name} has no {annotation}"
            );
        }
        let runbook = format!("monitoring/README.md#{}", name.to_lowercase());
        assert!(
            rule["annotations"]["description"]
                .as_str()
                .is_some_and(|d| d.contains(&runbook)),
            "{name}'s description does not point to {runbook}"
        );
    }
}

/// The dashboard is a Grafana dashboard: unique panel ids, every panel queries the data
/// source variable, the grid is 24 wide, and every variable a query uses is defined.
#[test]
fn the_dashboard_is_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "xce-agent");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let defined: BTreeSet<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .map(|v| v["name"].as_str().expect("variable name"))
        .collect();
    assert!(defined.contains("datasource"), "{defined:?}");
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().expect("title");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "{title}: id taken"
        );
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title}: off the grid");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: a refId twice");
    }
    let var = regex::Regex::new(r"\$\{?(\w+)").expect("re");
    for (title, expr) in dashboard_queries(&d) {
        for used in var.captures_iter(&expr) {
            let name = &used[1];
            assert!(
                defined.contains(name) || name.starts_with("__"),
                "{title}: ${name} is not a dashboard variable: {expr}"
            );
        }
    }
}

/// The dashboard's queries (panel title, expression), its variables' included.
fn dashboard_queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target's expr");
            out.push((
                p["title"].as_str().unwrap_or("").to_owned(),
                expr.to_owned(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let Some(query) = v["query"]["query"].as_str() else {
            continue;
        };
        // label_values(METRIC_SELECTOR, LABEL): the selector is the query.
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .map_or(query, |(selector, _)| selector);
        out.push((format!("variable {}", v["name"]), selector.to_owned()));
    }
    out
}

/// The metric names a PromQL expression reads: identifiers that are not functions,
/// aggregations, keywords or label names, outside label matchers, ranges and strings.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const WORDS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
    ];
    const LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let skip_to = |from: usize, close: char| {
        let mut i = from + 1;
        let mut quote = None;
        while i < chars.len() {
            match (quote, chars[i]) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), '\\') => i += 1,
                (None, c @ ('"' | '\'' | '`')) => quote = Some(c),
                (None, c) if c == close => return i,
                _ => {}
            }
            i += 1;
        }
        i
    };
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '"' | '\'' | '`' => i = skip_to(i, c),
            c if (c.is_ascii_alphabetic() || c == '_' || c == ':')
                && (i == 0
                    || !(ident(chars[i - 1]) || chars[i - 1] == '.' || chars[i - 1] == '$')) =>
            {
                let start = i;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let call = chars.get(next) == Some(&'(');
                if LISTS.contains(&word.as_str()) && call {
                    i = skip_to(next, ')');
                } else if !call && !WORDS.contains(&word.as_str()) {
                    names.insert(word);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = metric_names(
        r#"sum by (job, instance) (rate(a_total{x="{b}",y=~"$i"}[$__rate_interval])) / on (job) group_left(z) b:rec:rate5m > 1e9 and bool c offset 5m or vector(0) unless histogram_quantile(0.9, d_bucket) - time()"#,
    );
    let want: BTreeSet<String> = ["a_total", "b:rec:rate5m", "c", "d_bucket"]
        .map(str::to_owned)
        .into();
    assert_eq!(names, want);
}

/// Metrics an agent exports only where the host gives them: a probe's cgroup CPU where
/// probes are contained, its peak memory with the memory controller. docs/metrics.md lists
/// them (`metrics::every_metric_is_documented` keeps that table and the code in step).
const ONLY_WITH_CGROUPS: &[&str] = &["xce_probe_cpu_seconds_total", "xce_probe_memory_peak_bytes"];

/// `up` is Prometheus' own, for every target it scrapes.
const FROM_PROMETHEUS: &[&str] = &["up"];

/// The dashboard's queries and the mixin's rules name only metrics that a running agent's
/// /metrics has (an agent with TLS whose controller is down, so the link's outage series
/// are there too), names the mixin records, or `up`: a renamed metric fails here, not on
/// someone's blank panel.
#[tokio::test]
async fn the_dashboard_and_rules_name_only_metrics_the_agent_exports() {
    let mut pki = Pki::new("site-ca");
    let node = pki.issue(&["node001"]);
    let tls = pki.paths(&node);
    let setup = Setup::with_agent(
        "resources:
  - name: num
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [num]}
",
        &format!(
            "run_as: root\nmetrics: 127.0.0.1:0\ncontrollers: [\"127.0.0.1:1\"]\n\
             tls:\n  ca: {}\n  cert: {}\n  key: {}\n",
            tls.ca.display(),
            tls.cert.display(),
            tls.key.display()
        ),
    );
    setup.script("num", "#!/bin/sh\necho 7\n");
    let (mut daemon, addr) = crate::metrics::start(&setup).await;
    let text = crate::support::poll_until("a scrape with the link's failure and a run", || async {
        let resp = crate::metrics::request(&addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        let text = crate::metrics::body(&resp).to_owned();
        (text.contains("xce_link_last_error_timestamp_seconds ")
            && text.contains("xce_probe_duration_seconds_count{probe=\"num\"} ")
            && !text.contains("xce_probe_duration_seconds_count{probe=\"num\"} 0\n"))
        .then_some(text)
    })
    .await;
    crate::metrics::stop(&mut daemon).await;
    let mut known: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .expect("docs/metrics.md");
    for name in ONLY_WITH_CGROUPS {
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "{name} is not documented"
        );
        known.insert((*name).to_owned());
    }
    known.extend(FROM_PROMETHEUS.iter().map(|n| (*n).to_owned()));
    let recorded = recording_rules();
    let recorded: BTreeSet<String> = rules(&recorded)
        .iter()
        .filter_map(|r| r["record"].as_str())
        .map(str::to_owned)
        .collect();
    let mut queries = dashboard_queries(&dashboard());
    for (file, kind) in [(alerts(), "alert"), (recording_rules(), "record")] {
        for rule in rules(&file) {
            let name = rule[kind].as_str().expect("a rule's name");
            queries.push((
                format!("{kind} {name}"),
                rule["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    let mut unknown = Vec::new();
    for (what, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what}: no metric in {expr}");
        for name in names {
            if !known.contains(&name) && !recorded.contains(&name) {
                unknown.push(format!("{what}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics neither exported nor recorded:\n{}\nexported:\n{known:?}",
        unknown.join("\n")
    );
}
