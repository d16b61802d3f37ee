//! `capture:`: scripts that report by calling scontrol, pbsnodes or gmetric run unmodified;
//! their calls become the probe's values and never reach the real command. Each script
//! calls the command the way its kind of check does in the field (NHC's node-mark-offline,
//! a PBS health check, a Ganglia metric script).

use std::path::PathBuf;

use serde_json::Value as Json;

use crate::formats::{number, ok_value, once, probe, row};
use crate::support::{pids_dir, Setup, HANG_GUARD};

/// One resource on every host whose probe is `probe`, as a whole resources.yaml.
fn resource(name: &str, probe: &str) -> String {
    format!("resources:\n{}", crate::support::resource(name, probe))
}

/// A health check's resources: `healthy` (the `ok` sample) and `why` (the `reason`).
fn health_check(script: &str, format: &str, extra: &str) -> String {
    format!(
        r#"
resources:
  - name: healthy
    valtype: boolean
    interval: 60
    probe:
      kind: exec
      command: [{script}]
      format: {format}
      capture: [node_state]
      provides: [why]
      select: {{healthy: ok, why: reason}}
{extra}
  - name: why
    valtype: string
    interval: 60
"#
    )
}

/// A "real" scontrol/pbsnodes/gmetric in `bin/` of the site, first on the probe's own
/// PATH (`env:`, under the stand-ins): each call it gets is appended to `calls/real.log`,
/// and `scontrol show node` answers as Slurm does.
fn real_tools(s: &Setup) -> (String, PathBuf) {
    let bin = s.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = pids_dir(s).join("real.log");
    for tool in ["scontrol", "pbsnodes", "gmetric"] {
        crate::support::script(
            &bin,
            tool,
            &format!(
                "#!/bin/sh\necho \"{tool} $*\" >> {log}\n\
                 case \"$*\" in *'show node'*) echo 'NodeName=node001 Arch=x86_64 CoresPerSocket=16 State=IDLE' ;; esac\n",
                log = log.display()
            ),
        );
    }
    let env = format!("      env: {{PATH: \"{}:/usr/bin:/bin\"}}", bin.display());
    (env, log)
}

/// A site with [`real_tools`] whose resources.yaml is `resources` with `{env}` replaced by
/// the probe's `env:` line; and the real tools' log.
fn site(resources: &str) -> (Setup, PathBuf) {
    let s = Setup::new("");
    let (env, log) = real_tools(&s);
    s.write_atomic("resources.yaml", &resources.replace("{env}", &env));
    (s, log)
}

/// Every line of `want` is in `text`.
fn says(text: &str, want: &[&str]) {
    for w in want {
        assert!(text.contains(w), "no {w:?} in:\n{text}");
    }
}

fn real_calls(log: &std::path::Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

#[test]
fn an_nhc_drain_that_exits_0_is_not_ok_with_its_reason_and_never_reaches_scontrol() {
    let (s, log) = site(&health_check("nhc.sh", "nagios", "{env}"));
    // NHC's node-mark-offline, as it drains a node when a check fails; NHC then exits 0.
    s.script(
        "nhc.sh",
        "#!/bin/sh\nscontrol update State=DRAIN NodeName=$(hostname) Reason=\"NHC: check_fs_mount:  /scratch not mounted\"\nexit 0\n",
    );
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(ok_value(&json, "healthy"), Json::Bool(false), "{json:#}");
    assert_eq!(
        ok_value(&json, "why"),
        "NHC: check_fs_mount:  /scratch not mounted"
    );
    assert_eq!(real_calls(&log), "", "the real scontrol was called");
}

#[test]
fn a_resume_after_a_drain_is_ok() {
    let (s, log) = site(&health_check("nhc.sh", "nagios", "{env}"));
    s.script(
        "nhc.sh",
        "#!/bin/sh\nscontrol update NodeName=node001 State=DRAIN Reason='NHC: ib0 down'\n\
         scontrol update NodeName=node001 State=RESUME\nexit 0\n",
    );
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(ok_value(&json, "healthy"), Json::Bool(true), "{json:#}");
    assert_eq!(ok_value(&json, "why"), "scontrol update State=RESUME");
    assert_eq!(real_calls(&log), "");
}

/// NHC on a healthy node calls nothing and exits 0: up, and `reason` says nothing changed
/// (so `--once`, strict about resources left out, passes).
#[test]
fn a_run_that_calls_nothing_left_its_node_up() {
    let (s, log) = site(&health_check("nhc.sh", "nagios", "{env}"));
    s.script(
        "nhc.sh",
        "#!/bin/sh
exit 0
",
    );
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(ok_value(&json, "healthy"), Json::Bool(true), "{json:#}");
    assert_eq!(ok_value(&json, "why"), "no state change");
    assert_eq!(real_calls(&log), "");
}

#[test]
fn pbsnodes_offline_with_a_comment_is_not_ok() {
    let (s, log) = site(&health_check("pbs_check.sh", "nagios", "{env}"));
    // A PBS Pro mom health check: offline its own node with a comment, exit 0.
    s.script(
        "pbs_check.sh",
        "#!/bin/sh\npbsnodes -o -C \"disk /tmp full\" $(hostname -s)\n",
    );
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(ok_value(&json, "healthy"), Json::Bool(false), "{json:#}");
    assert_eq!(ok_value(&json, "why"), "disk /tmp full");
    // Listing nodes only reads: that reaches pbsnodes.
    s.script(
        "pbs_check.sh",
        "#!/bin/sh\npbsnodes -l >/dev/null\npbsnodes -c $(hostname -s)\n",
    );
    let (_, json) = once(&s);
    assert_eq!(ok_value(&json, "healthy"), Json::Bool(true), "{json:#}");
    assert_eq!(real_calls(&log), "pbsnodes -l\n");
}

#[test]
fn gmetric_calls_are_samples_named_by_their_name_from_a_script_that_prints_nothing() {
    let (s, log) = site(
        r#"
resources:
  - name: gpfs_read
    interval: 60
    probe:
      kind: exec
      command: [ganglia.sh]
      capture: [gmetric]
      provides: [fs_state, jobs]
{env}
  - {name: fs_state, valtype: string, interval: 60}
  - {name: jobs, interval: 60}
"#,
    );
    s.script(
        "ganglia.sh",
        "#!/bin/sh\ngmetric -n gpfs_read -v 12.5 -t double -u MB/s\n\
         gmetric --name=fs_state --value=degraded --type=string\n\
         gmetric --name jobs --value 3 --type uint32 --units jobs\n",
    );
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(number(&json, "gpfs_read"), 12.5);
    assert_eq!(ok_value(&json, "fs_state"), "degraded");
    assert_eq!(number(&json, "jobs"), 3.0);
    assert_eq!(real_calls(&log), "");
}

#[test]
fn scontrol_show_node_reaches_the_real_scontrol_and_update_does_not() {
    let (s, log) = site(
        r#"
resources:
  - name: cores
    interval: 60
    probe:
      kind: exec
      command: [cores.sh]
      format: nagios
      capture: [node_state]
{env}
"#,
    );
    // The shape of the site scripts that read their node's line before deciding.
    s.script(
        "cores.sh",
        "#!/bin/sh\nline=$(scontrol -o show node node001)\n\
         scontrol update NodeName=node001 State=RESUME\n\
         echo \"OK | cores=$(echo \"$line\" | tr ' ' '\\n' | sed -n 's/^CoresPerSocket=//p')\"\n",
    );
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(number(&json, "cores"), 16.0);
    assert_eq!(real_calls(&log), "scontrol -o show node node001\n");
}

#[test]
fn a_read_only_call_without_the_real_command_fails_with_a_clear_message() {
    let s = Setup::new(&resource(
        "cores",
        "{kind: exec, command: [cores.sh], format: nagios, capture: [node_state], env: {PATH: /nonexistent}}",
    ));
    s.script("cores.sh", "#!/bin/sh\nscontrol show node node001\n");
    let (code, json) = once(&s);
    assert_eq!(code, Some(1), "{json:#}");
    let error = row(&json, "cores")["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains(
            "scontrol: not found on PATH (xce-agent's capture passes only calls that read to it)"
        ),
        "{error}"
    );
}

#[test]
fn probe_name_lists_the_captured_calls_and_what_each_did() {
    let s = Setup::new("");
    s.write_atomic(
        "resources.yaml",
        &health_check("nhc.sh", "nagios", "      env: {PATH: /usr/bin:/bin}"),
    );
    s.script(
        "nhc.sh",
        "#!/bin/sh\nscontrol update NodeName=node999 State=DRAIN Reason=elsewhere\n\
         scontrol update NodeName=node001 State=DRAIN Reason='NHC: fan'\nexit 0\n",
    );
    let (code, text) = probe(&s, "healthy");
    assert_eq!(code, Some(0), "{text}");
    says(
        &text,
        &[
        "XCE_CAPTURE_FD=7",
        "capture/node_state:/usr/bin:/bin",
        "captured (2 calls):",
        "scontrol update NodeName=node999 State=DRAIN Reason=elsewhere  -> ignored: NodeName=node999 is not this node",
        "scontrol update NodeName=node001 State=DRAIN \"Reason=NHC: fan\"  -> ok=false reason=NHC: fan",
        "healthy = false",
        "why = NHC: fan",
    ],
    );
}

/// A probe that writes without end on the capture descriptor costs the agent its cap and
/// no more: the pipe is closed on it, and the run fails saying so (what the script last
/// said of its node is lost with the rest).
#[test]
fn a_probe_writing_without_end_on_the_capture_pipe_is_cut_off_at_the_cap() {
    let s = Setup::new(&resource(
        "flood",
        "{kind: exec, command: [flood.sh], capture: [gmetric], timeout: 60s}",
    ));
    // A subshell, so the writer that meets the closed pipe dies alone and the script exits 0.
    s.script("flood.sh", "#!/bin/sh\n(yes gmetric >&7)\necho 1\n");
    let started = std::time::Instant::now();
    let (code, json) = once(&s);
    assert_eq!(code, Some(1), "{json:#}");
    assert_eq!(
        row(&json, "flood")["error"],
        "the captured calls exceed 65536 bytes; the pipe was closed on the later ones, so the node's state is not known"
    );
    assert!(started.elapsed() < HANG_GUARD);
}

#[test]
fn unknown_capture_names_are_config_errors_at_their_position() {
    let s = Setup::new(
        r#"
resources:
  - name: a
    interval: 60
    probe: {kind: exec, command: [a.sh], capture: [node_stat, gmetric]}
  - name: b
    interval: 60
    probe: {kind: file, path: /x, capture: [gmetric]}
  - name: c
    interval: 60
    probe: {kind: exec, command: [c.sh], capture: [node_state]}
"#,
    );
    let (code, text) = crate::support::agent_output(&s.agent_yaml(), &["check"]);
    assert_eq!(code, Some(2), "{text}");
    says(
        &text,
        &[
        "resources.yaml:5:52: unknown capture \"node_stat\"; expected node_state or gmetric; did you mean `node_state`?",
        "resources.yaml:8:",
        "`capture` is not a field of file probes",
    ],
    );
}

#[test]
fn check_shows_what_a_probe_captures() {
    let s = Setup::new(&resource(
        "a",
        "{kind: exec, command: [a.sh], format: nagios, capture: [gmetric, node_state]}",
    ));
    s.script("a.sh", "#!/bin/sh\necho 1\n");
    let (code, text) = crate::support::agent_output(&s.agent_yaml(), &["check"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("capture node_state,gmetric"), "{text}");
}

/// End to end: the daemon runs the health check on its interval and the controller (the
/// project's `listen`) sees the drained node's verdict and reason.
#[test]
fn a_drain_reaches_listen_through_the_daemon() {
    let mut listen = crate::support::ListenProc::spawn_format("text");
    let site = crate::support::Site::new(
        &[listen.addr.to_string()],
        &health_check("nhc.sh", "nagios", "").replace("interval: 60", "interval: 1"),
    );
    site.script(
        "nhc.sh",
        "#!/bin/sh\nscontrol update State=DRAIN NodeName=$(hostname) Reason=NHC:mcelog\nexit 0\n",
    );
    let mut agent = site.spawn_agent();
    let mut want = vec!["node001 healthy ok false ", "node001 why ok NHC:mcelog "];
    let mut seen = Vec::new();
    while !want.is_empty() {
        let line = listen
            .stdout
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|e| panic!("listen printed no more lines ({e}); saw {seen:#?}"));
        want.retain(|w| !line.starts_with(w));
        seen.push(line);
    }
    agent.assert_alive();
    listen.assert_alive();
}

/// A script that took descriptor 7 for itself: the stand-in says so and fails (the script
/// sees its scontrol fail), rather than write the record into the script's file.
#[test]
fn a_stand_in_refuses_a_descriptor_7_the_script_redirected() {
    let (s, log) = site(&health_check("nhc.sh", "nagios", "{env}"));
    s.script(
        "nhc.sh",
        "#!/bin/sh\nexec 7>/dev/null\nscontrol update NodeName=node001 State=DRAIN Reason=x || echo 'CRITICAL - cannot drain'\nexit 2\n",
    );
    let (code, text) = probe(&s, "healthy");
    assert_eq!(code, Some(0), "{text}");
    says(
        &text,
        &[
            "scontrol: descriptor 7 is not xce-agent's capture pipe (did the script redirect it?); nothing was reported",
            "captured (0 calls):",
            "healthy = false",
            "why = CRITICAL - cannot drain",
        ],
    );
    assert_eq!(real_calls(&log), "");
}

/// The plugin guide's `capture:` example is valid config, as pasted.
#[test]
fn the_plugin_guides_capture_example_is_valid_config() {
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/README.md"),
    )
    .unwrap();
    let block = guide
        .split("## Scripts that report by calling a command")
        .nth(1)
        .and_then(|section| section.split("```yaml\n").nth(1))
        .and_then(|b| b.split("```").next())
        .expect("a yaml block in the guide's capture section");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resources.yaml");
    std::fs::write(&path, format!("resources:\n{block}")).unwrap();
    let (resources, _) = xce_agent::config::load_resources(&path).unwrap_or_else(|e| panic!("{e}"));
    let probe = format!("{:?}", resources.resources[0].probe);
    assert!(probe.contains("NodeState"), "{probe}");
}

/// Thousands of calls within the cap are read, each name once; `probe NAME` lists the first
/// hundred and counts the rest.
#[test]
fn thousands_of_calls_are_read_and_listed_up_to_a_hundred() {
    let s = Setup::new(&resource(
        "m1999",
        "{kind: exec, command: [many.sh], capture: [gmetric]}",
    ));
    s.script(
        "many.sh",
        "#!/bin/sh\ni=0\nwhile [ $i -lt 2000 ]; do printf '%s\\0' gmetric 4 -n m$i -v $i >&7; i=$((i+1)); done\n",
    );
    let (code, text) = probe(&s, "m1999");
    assert_eq!(code, Some(0), "{text}");
    says(
        &text,
        &[
            "captured (2000 calls):",
            "gmetric -n m99 -v 99  -> m99=99",
            "… (1900 more)",
            "m1999 = 1999",
        ],
    );
    assert!(!text.contains("-> m100="), "{text}");
}

/// `scontrol` with no command reads its commands from stdin, where an update would reach the
/// real scontrol unseen: refused. `--version` alone still reaches it.
#[test]
fn scontrol_reading_commands_from_stdin_is_refused() {
    let (s, log) = site(&health_check("nhc.sh", "nagios", "{env}"));
    s.script(
        "nhc.sh",
        "#!/bin/sh\nscontrol --version\necho 'update NodeName=node001 State=DRAIN Reason=x' | scontrol -o || echo 'CRITICAL - refused'\nexit 2\n",
    );
    let (code, text) = probe(&s, "healthy");
    assert_eq!(code, Some(0), "{text}");
    says(
        &text,
        &[
            "scontrol: not passed on by xce-agent's capture: without a command scontrol reads commands from stdin",
            "why = CRITICAL - refused",
        ],
    );
    assert_eq!(real_calls(&log), "scontrol --version\n");
}
