//! Config errors name file:line:column and what was expected.

use std::path::Path;

use xce_agent::config::{self, resources};

fn errors(yaml: &str) -> Vec<String> {
    match resources::parse(Path::new("resources.yaml"), yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
    }
}

fn one_error(yaml: &str) -> String {
    let e = errors(yaml);
    assert_eq!(e.len(), 1, "{e:#?}");
    e.into_iter().next().unwrap()
}

#[test]
fn misspelt_field_is_an_error_with_a_suggestion() {
    let e = one_error("resources:\n  - name: a\n    intreval: 30\n");
    assert_eq!(
        e,
        "resources.yaml:3:5: unknown field `intreval` in resource \"a\"; did you mean `interval`?"
    );
}

#[test]
fn controller_only_fields_are_tolerated() {
    let r = resources::parse(
        Path::new("r.yaml"),
        "resources:\n  - name: a\n    hostBased: 5\n    distributions: []\n    interval: 30\n",
    )
    .unwrap();
    let fields: Vec<&str> = r
        .ignored_fields
        .iter()
        .map(|(_, f, _)| f.as_str())
        .collect();
    assert_eq!(fields, ["hostBased", "distributions"]);
}

#[test]
fn unknown_probe_field_is_strict() {
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe:\n      kind: exec\n      comand: [x]\n");
    assert!(
        e.starts_with("resources.yaml:6:7: unknown field `comand`"),
        "{e}"
    );
}

#[test]
fn every_mapping_gets_the_near_miss_rule() {
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe:\n      kind: exec\n      command: [x]\n      provide: [b]\n");
    assert_eq!(
        e,
        "resources.yaml:7:7: unknown field `provide`; did you mean `provides`?"
    );
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe:\n      kind: exec\n      command: [x]\n      limits: {open_file: 5}\n");
    assert!(
        e.ends_with("unknown field `open_file`; did you mean `open_files`?"),
        "{e}"
    );
    let e = config::agent::parse(Path::new("agent.yaml"), "controler: [ctl1]\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "agent.yaml:1:1: unknown field `controler`; did you mean `controllers`?"
    );
    let e = errors("resources:\n  - name: a\n    resourcemap:\n      - locaton: [default]\n");
    assert_eq!(
        e[0],
        "resources.yaml:4:9: unknown field `locaton`; did you mean `location`?"
    );
    // No near miss: the fields that are allowed, once, not serde's long sentence.
    let e = config::agent::parse(Path::new("agent.yaml"), "colour: blue\n").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("agent.yaml:1:1: unknown field `colour`; the fields here are: host, "),
        "{e}"
    );
}

#[test]
fn a_misspelt_resources_section_is_an_error_not_an_empty_file() {
    let e = one_error("hosts: []\nresource:\n  - name: a\n");
    assert_eq!(
        e,
        "resources.yaml:2:1: unknown section `resource`; did you mean `resources`?"
    );
    // The controller's own sections are tolerated; an empty file has no resources.
    let r = resources::parse(Path::new("r.yaml"), "hosts: []\nresources:\n").unwrap();
    assert!(r.resources.is_empty());
}

#[test]
fn probe_fields_dedented_onto_the_resource_are_an_error() {
    let e = errors("resources:\n  - name: a\n    interval: 30\n    probe:\n    kind: exec\n    command: [x]\n    hostBased: 5\n");
    assert_eq!(
        e,
        [
            "resources.yaml:5:5: `kind` belongs under `probe:` (indent it two more spaces than `probe:`)",
            "resources.yaml:6:5: `command` belongs under `probe:` (indent it two more spaces than `probe:`)",
        ]
    );
}

#[test]
fn yaml_parser_messages_say_what_usually_causes_them() {
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe:\n      kind: exec\n     command: [x]\n");
    assert_eq!(
        e,
        "resources.yaml:6:6: while parsing a block mapping, did not find expected key; line 6 starts in column 6, line 5 above it in column 7: keys of one mapping start in the same column (check the indentation)"
    );
    // The parser stops on line 6; the mistake is line 5 (or 6): point at 5.
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe:\n    kind: exec\n      command: [x]\n");
    assert_eq!(
        e,
        "resources.yaml:5:5: mapping values are not allowed in this context; line 5 already has a value, so line 6, indented deeper, cannot be nested under it: one of the two lines has the wrong indentation"
    );
    let e = one_error("resources:\n  - name: a\n    desc: load: 1 min\n");
    assert!(
        e.starts_with("resources.yaml:3:15: mapping values are not allowed")
            && e.ends_with("a value containing `: ` must be quoted (desc: \"a: b\")"),
        "{e}"
    );
    let e = one_error("resources:\n  - name: a\n    interval: 30\n  -name: b\n");
    assert!(
        e.starts_with("resources.yaml:4:3: while parsing a block collection, did not find expected '-' indicator; a list item needs a space after `-`"),
        "{e}"
    );
    let e = one_error("resources:\n  - name: a\n    interval: 30\n   probe:\n      kind: exec\n");
    assert!(
        e.ends_with("line 4 is indented differently from the list's items above it: every `- ` of one list, and every key of an item, starts in the same column"),
        "{e}"
    );
    let e = one_error("resources:\n  - name: a\n    interval:30\n");
    assert!(
        e.ends_with("a space is needed after `:` (`interval: 30`)"),
        "{e}"
    );
    let e = one_error("resources:\n  - name: a\n\tinterval: 30\n");
    assert!(
        e.starts_with("resources.yaml:3:1: ")
            && e.ends_with("line 3 is indented with a tab: YAML indentation must be spaces"),
        "{e}"
    );
}

#[test]
fn bad_duration() {
    let e = one_error("resources:\n  - name: a\n    interval: 3 fortnights\n");
    assert!(
        e.starts_with("resources.yaml:3:15: bad interval: expected a duration"),
        "{e}"
    );
    for (written, fix) in [
        ("5m30", "write 330s"),
        ("5 minutes", "no space"),
        ("1e3", "no fractions or exponents"),
    ] {
        let e = one_error(&format!(
            "resources:\n  - name: a\n    interval: {written}\n"
        ));
        assert!(
            e.starts_with("resources.yaml:3:15: bad interval: expected a duration: a whole number of seconds (30) or a whole number with one unit s, m, h or d (30s, 5m, 1h, 1d)"),
            "{written}: {e}"
        );
        assert!(e.contains(fix), "{written}: {e}");
    }
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {kind: exec, command: [x], timeout: soon}\n");
    assert!(e.starts_with("resources.yaml:4:48: bad timeout"), "{e}");
}

#[test]
fn bad_valtype_and_ordtype() {
    let e = errors("resources:\n  - name: a\n    valtype: float\n  - name: b\n    valtype: string\n    ordtype: increasing\n");
    assert_eq!(
        e[0],
        "resources.yaml:3:14: unknown valtype \"float\"; expected one of numeric, string, boolean"
    );
    assert_eq!(
        e[1],
        "resources.yaml:6:14: ordtype applies only to numeric resources, not string"
    );
}

#[test]
fn duplicate_name() {
    let e = one_error("resources:\n  - name: a\n  - name: b\n  - name: a\n");
    assert_eq!(
        e,
        "resources.yaml:4:11: duplicate resource \"a\": already defined at line 2"
    );
}

#[test]
fn host_in_two_instances() {
    let e = one_error(
        "resources:\n  - name: a\n    interval: 30\n    resourcemap:\n      - location: [\"node[001-004]\"]\n      - location: [node009, node003]\n",
    );
    assert_eq!(
        e,
        "resources.yaml:6:29: host \"node003\" is in two instances of \"a\" (also at line 5)"
    );
}

#[test]
fn host_range_in_flow_list_must_be_quoted() {
    let e = one_error("resources:\n  - name: a\n    resourcemap:\n      - location: [node[1-2]]\n");
    assert!(e.contains("must be quoted"), "{e}");
    assert!(e.starts_with("resources.yaml:4:"), "{e}");
}

#[test]
fn bad_names_and_probe_shapes() {
    let e = errors(
        "resources:
  - name: 9lives
  - name: a
    interval: 30
    probe: {kind: magic}
  - name: b
    interval: 30
    probe: {kind: exec}
  - name: c
    interval: 30
    probe: {kind: file, path: relative/path, command: [x]}
  - name: d
    probe: {kind: builtin}
  - name: e
    interval: 30
    probe: {kind: file, path: /x, regex: '(unclosed'}
",
    );
    let want = [
        "resources.yaml:2:11: resource name \"9lives\" must start with a letter",
        "resources.yaml:5:19: unknown probe kind \"magic\"",
        "resources.yaml:8:12: exec and stream probes need `command`",
        "resources.yaml:11:31: file probe path \"relative/path\" must be absolute",
        "resources.yaml:11:55: `command` is not a field of file probes",
        "resources.yaml:13:12: resource \"d\" has a probe but no interval",
        "resources.yaml:16:42: bad regex",
    ];
    assert_eq!(e.len(), want.len(), "{e:#?}");
    for (got, want) in e.iter().zip(want) {
        assert!(got.starts_with(want), "got {got:?}, want {want:?}");
    }
}

#[test]
fn provides_must_name_declared_dynamic_resources() {
    let e = errors(
        "resources:
  - name: a
    interval: 30
    probe: {kind: exec, command: [x], format: kv, provides: [b, c, d]}
  - name: b
    interval: 30
  - name: c
  - name: e
    interval: 30
    probe: {kind: exec, command: [y], format: kv, provides: [b]}
",
    );
    assert!(
        e.iter().any(|m| m.contains("\"c\", which is static")),
        "{e:#?}"
    );
    assert!(
        e.iter().any(|m| m.contains("\"d\", which is not declared")),
        "{e:#?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("resources.yaml:10:")
            && m.contains("already provided by the probe of \"a\"")),
        "{e:#?}"
    );
}

/// An LSF ELIM reports host and shared values in one line: one probe's `provides:` may
/// hold resources with different resourcemaps (the plan sends each to its own instance).
#[test]
fn a_provided_resource_may_have_another_resourcemap() {
    let r = resources::parse(
        Path::new("resources.yaml"),
        "resources:
  - name: a
    interval: 30
    resourcemap: [{location: [node1]}]
    probe: {kind: exec, command: [x], format: kv, provides: [b, c]}
  - name: b
    interval: 30
  - name: c
    interval: 30
    resourcemap: [{location: [all]}]
",
    )
    .unwrap();
    assert_eq!(r.resources.len(), 3);
}

#[test]
fn yaml_syntax_error_has_position() {
    let e = one_error("resources:\n  - name: a\n   bad: indent\n");
    assert!(e.starts_with("resources.yaml:3:"), "{e}");
}

#[test]
fn agent_yaml_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent.yaml");
    std::fs::write(
        &p,
        "controllers: [\"ctl1:99999\"]\nmax_parallel: 0\nrun_az: x\n",
    )
    .unwrap();
    let e = config::load_agent(&p).unwrap_err().to_string();
    assert!(e.contains("agent.yaml:3:1: unknown field `run_az`"), "{e}");
    std::fs::write(&p, "controllers: [\"ctl1:99999\"]\nmax_parallel: 0\n").unwrap();
    let e = config::load_agent(&p).unwrap_err().0;
    assert!(
        e[0].to_string().ends_with(
            "agent.yaml:1:15: controller \"ctl1:99999\" is not host[:port] or unix:/absolute/path"
        ),
        "{e:?}"
    );
    assert!(
        e[1].to_string()
            .ends_with("agent.yaml:2:15: max_parallel must be between 1 and 1024, got 0"),
        "{e:?}"
    );
}

#[test]
fn unreadable_and_non_utf8_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let e = config::load_resources(&missing).unwrap_err().to_string();
    assert!(e.contains("nope.yaml: cannot read"), "{e}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, b"resources:\n  - name: \xff\n").unwrap();
    let e = config::load_resources(&bad).unwrap_err().to_string();
    assert!(e.ends_with("bad.yaml:2:11: file is not valid UTF-8"), "{e}");
}

#[test]
fn valid_example_parses() {
    let r = resources::parse(
        Path::new("r.yaml"),
        "resources:
  - name: scratch
    desc: free scratch
    valtype: numeric
    ordtype: decreasing
    interval: 1m
    flags: [release]
    resourcemap:
      - location: [default]
    probe:
      kind: exec
      command: [scratch_free, /scratch]
      format: kv
      timeout: 10s
      env: {MIN: \"1\"}
      limits: {cpu: 5s, address_space: 256MiB, open_files: 64, processes: 16}
",
    )
    .unwrap();
    let s = &r.resources[0];
    assert_eq!(s.interval, Some(std::time::Duration::from_secs(60)));
    let p = s.probe.as_ref().unwrap();
    assert_eq!(p.timeout, Some(std::time::Duration::from_secs(10)));
    match &p.kind {
        config::ProbeKind::Exec(e) => {
            assert_eq!(e.limits.address_space, Some(256 << 20));
            assert_eq!(e.format, config::Format::Kv);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_location_that_is_no_wire_instance_name_is_an_error() {
    // The label is the instance's name on the wire: a receiver applies the same rule.
    let e = one_error(
        "resources:\n  - name: a\n    interval: 30\n    resourcemap: [{location: [\"gpu[1, 3]\"]}]\n",
    );
    assert!(e.starts_with("resources.yaml:4:"), "{e}");
    assert!(
        e.contains("instance name \"gpu[1, 3]\" may hold only"),
        "{e}"
    );
}

#[test]
fn stdout_and_stdin_take_their_names_and_stdin_is_for_streams() {
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {kind: stream, command: [x], stdout: tty}\n");
    assert_eq!(
        e,
        "resources.yaml:4:49: unknown stdout \"tty\"; expected one of pipe, pty"
    );
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {kind: exec, command: [x], stdin: signal}\n");
    assert!(e.contains("`stdin` is not a field of exec probes"), "{e}");
}

#[test]
fn a_misspelt_probe_kind_gets_the_nearest_kind_from_the_table() {
    let e = one_error(
        "resources:\n  - name: a\n    interval: 30\n    probe: {kind: strem, command: [x]}\n",
    );
    assert_eq!(
        e,
        "resources.yaml:4:19: unknown probe kind \"strem\"; expected one of builtin, exec, file, stream; did you mean `stream`?"
    );
    let e = one_error(
        "resources:\n  - name: a\n    interval: 30\n    probe: {kind: Exec, command: [x]}\n",
    );
    assert!(e.ends_with("did you mean `exec`?"), "{e}");
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {kind: magic}\n");
    assert_eq!(
        e,
        "resources.yaml:4:19: unknown probe kind \"magic\"; expected one of builtin, exec, file, stream"
    );
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {command: [x]}\n");
    assert_eq!(
        e,
        "resources.yaml:4:12: probe has no `kind`; expected one of builtin, exec, file, stream"
    );
}

#[test]
fn a_field_of_another_kind_is_named_for_the_kind_given() {
    let e = one_error("resources:\n  - name: load\n    interval: 30\n    probe: {kind: builtin, index: r1m, provides: [x]}\n");
    assert_eq!(
        e,
        "resources.yaml:4:50: `provides` is not a field of builtin probes"
    );
    let e = one_error("resources:\n  - name: s\n    interval: 30\n    probe: {kind: stream, command: [x], restart_on_silence: true, regex: a}\n");
    assert_eq!(
        e,
        "resources.yaml:4:74: `regex` is not a field of stream probes"
    );
}

#[test]
fn format_lists_in_errors_come_from_the_formats_table() {
    let e = one_error("resources:\n  - name: s\n    interval: 30\n    probe: {kind: stream, command: [x], format: json}\n");
    assert_eq!(
        e,
        "resources.yaml:4:49: format json is read from a finished run: use it with `kind: exec`; stream probes read value, kv, elim, classad, collectd, netdata or sge"
    );
    let e = one_error("resources:\n  - name: f\n    interval: 30\n    probe: {kind: file, path: /x, provides: [g]}\n  - {name: g, interval: 30}\n");
    assert_eq!(
        e,
        "resources.yaml:4:45: a file probe feeds several resources only with a `format:` (kv, elim, prometheus, influx, classad, json, munin, checkmk, collectd, netdata, sge)"
    );
    let e = one_error("resources:\n  - name: f\n    interval: 30\n    probe: {kind: exec, command: [x], format: yaml}\n");
    assert!(
        e.ends_with("unknown format \"yaml\"; expected one of value, kv, elim, nagios, prometheus, influx, classad, json, munin, checkmk, collectd, netdata, sge"),
        "{e}"
    );
}

#[test]
fn a_stream_reads_the_formats_that_stream_and_classad_takes_a_select() {
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {kind: stream, command: [x], format: prometheus}\n");
    assert_eq!(
        e,
        "resources.yaml:4:49: format prometheus is read from a finished run: use it with `kind: exec`; stream probes read value, kv, elim, classad, collectd, netdata or sge"
    );
    let ok = "resources:\n  - name: a\n    interval: 30\n    probe: {kind: stream, command: [x], format: classad, select: {a: 'Requests{ad=\"SQUID0\"}'}}\n";
    assert!(resources::parse(Path::new("resources.yaml"), ok).is_ok());
    let e = one_error("resources:\n  - name: a\n    interval: 30\n    probe: {kind: stream, command: [x], format: kv, select: {a: b}}\n");
    assert!(
        e.contains("`select` and `aggregate` apply to the formats"),
        "{e}"
    );
}

/// Three mistakes in one file are three errors in one pass, whether serde stops at them (a
/// string where a list belongs, a list where one value belongs) or validation finds them, in
/// file order; and the entries around them are still checked.
#[test]
fn every_error_of_a_file_comes_in_one_pass_even_the_ones_serde_stops_at() {
    let e = errors(
        "resources:
  - name: a
    interval: 5m
    resourcemap: [{location: vm, node002}]
  - name: b
    valtype: numerc
  - name: c
    interval: 5m
    probe: {kind: exec, command: [x], timeout: [1]}
  - name: d
    intervall: 5m
",
    );
    assert_eq!(e.len(), 4, "{e:#?}");
    assert!(e[0].starts_with("resources.yaml:4:"), "{e:#?}");
    assert!(
        e[0].contains("this field takes a list: write it as [a, b]"),
        "{e:#?}"
    );
    assert!(
        e[1].starts_with("resources.yaml:6:14: unknown valtype"),
        "{e:#?}"
    );
    assert!(e[2].starts_with("resources.yaml:9:"), "{e:#?}");
    assert!(
        e[2].contains("this field takes one value, not a list"),
        "{e:#?}"
    );
    assert!(e[3].contains("did you mean `interval`?"), "{e:#?}");
    // agent.yaml the same way: a word where a number belongs, a list where a name does.
    let e = config::agent::parse(
        Path::new("agent.yaml"),
        "host: node001\nmax_parallel: many\nrun_as: [a]\nmax_stuck_reads: 0\n",
    )
    .unwrap_err()
    .to_string();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "{e}");
    assert!(
        lines[0].starts_with("agent.yaml:2:15: ") && lines[0].contains("whole number"),
        "{e}"
    );
    assert!(lines[1].starts_with("agent.yaml:3:9: "), "{e}");
    assert!(lines[2].starts_with("agent.yaml:4:"), "{e}");
}

/// A broken agent.yaml does not hide resources.yaml's errors: one `check` shows both files'.
#[test]
fn every_error_of_both_files_comes_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.yaml"),
        "host: node001\nmax_parallel: many\nresources: res.yaml\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("res.yaml"),
        "resources:\n  - name: a\n    intervall: 5m\n",
    )
    .unwrap();
    let out = assert_cmd::Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["check", "--config"])
        .arg(dir.path().join("agent.yaml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("agent.yaml:2:15: "), "{err}");
    assert!(
        err.contains("res.yaml:3:5: unknown field `intervall`"),
        "{err}"
    );
    assert!(err.contains("(2 errors)"), "{err}");
}
