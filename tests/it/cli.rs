//! `--once` and `check` end to end through the binary.

use crate::support::Setup;
use assert_cmd::Command;

const RESOURCES: &str = r#"
resources:
  - name: good
    interval: 30
    probe: {kind: exec, command: [good.sh]}
  - name: words
    valtype: string
    interval: 30
    probe: {kind: exec, command: [words.sh], format: kv, provides: [count]}
  - name: count
    interval: 30
  - name: static_one
    resourcemap: [{location: [default], value: 3}]
  - name: theirs
    interval: 30
    resourcemap: [{location: [node002, node001]}]
    probe: {kind: exec, command: [good.sh]}
"#;

fn setup() -> Setup {
    let s = Setup::new(RESOURCES);
    s.script("good.sh", "#!/bin/sh\necho 12\n");
    s.script(
        "words.sh",
        "#!/bin/sh\necho 'words = hello'\necho 'count = 2'\n",
    );
    s
}

fn agent(s: &Setup) -> Command {
    let mut c = Command::cargo_bin("xce-agent").unwrap();
    c.arg("--config").arg(s.agent_yaml()).env_remove("RUST_LOG");
    c
}

#[test]
fn once_prints_every_value_and_exits_0() {
    let s = setup();
    let out = agent(&s).arg("--once").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "HOST node001");
    assert!(
        lines[1].starts_with("RESOURCE  VALUE  STATUS  LAST_REPORT"),
        "{stdout}"
    );
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(row("good").unwrap()[1..3], ["12", "ok"]);
    assert_eq!(row("words").unwrap()[1..3], ["hello", "ok"]);
    assert_eq!(row("count").unwrap()[1..3], ["2", "ok"]);
    assert!(row("static_one").is_none() && row("theirs").is_none());
}

#[test]
fn once_json_and_failure_exit_code() {
    let s = setup();
    s.script("good.sh", "#!/bin/sh\necho 'no disk' >&2\nexit 2\n");
    let out = agent(&s)
        .args(["--once", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["host"], "node001");
    let good = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "good")
        .unwrap();
    assert_eq!(good["status"], "failed");
    assert_eq!(good["value"], serde_json::Value::Null);
    assert_eq!(good["error"], "exited with status 2: no disk");
    assert_eq!(good["stderr"], "no disk");
    let words = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "words")
        .unwrap();
    assert_eq!(words["value"], "hello");
}

#[test]
fn once_only_runs_the_named_probes() {
    let s = setup();
    s.script("good.sh", "#!/bin/sh\nexit 1\n");
    let out = agent(&s)
        .args(["--once", "--only", "count"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("\ncount ") && stdout.contains("\nwords ") && !stdout.contains("\ngood "),
        "{stdout}"
    );
    let out = agent(&s)
        .args(["--once", "--only", "theirs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "xce-agent: theirs is not probed on node001: shared instance [node002,node001] is reported by node002"
    );
}

/// A resource fed through `provides:` of a probe this host skips is not "no such resource":
/// the answer names the probe and why it is skipped, and `check` lists it under that probe.
#[test]
fn a_resource_provided_by_a_skipped_probe_says_which_probe_and_why() {
    let s = Setup::new(
        "resources:
  - name: ib_up
    valtype: boolean
    interval: 60s
    resourcemap: [{location: [gpu01]}]
    probe: {kind: exec, command: [ib.sh], format: kv, provides: [ib_active_ports]}
  - name: ib_active_ports
    interval: 60s
    resourcemap: [{location: [gpu01]}]
",
    );
    let out = agent(&s)
        .args(["--once", "--only", "ib_active_ports"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "xce-agent: ib_active_ports is not probed on node001: it is fed by the probe of ib_up (`provides:`), which this host skips: no instance covers this host"
    );
    let out = agent(&s).arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("(2 resources: 0 probed here, 2 skipped)")
            && stdout.contains(
                "SKIPPED (2)\nib_up              no instance covers this host\n  ib_active_ports  fed by ib_up (provides:), skipped with it\n"
            ),
        "{stdout}"
    );
}

#[test]
fn config_error_exits_2_with_position() {
    let s = Setup::new("resources:\n  - name: a\n    interval: often\n");
    let out = agent(&s).arg("--once").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "{}:3:15: bad interval",
        s.path().join("resources.yaml").display()
    );
    assert!(stderr.starts_with(&want), "{stderr}");
    let out = agent(&s).arg("check").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configuration invalid (1 error)"));
}

#[test]
fn check_prints_plan_and_skip_reasons() {
    let s = setup();
    let out = agent(&s).arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("host            node001"), "{stdout}");
    assert!(
        stdout.contains("(5 resources: 3 probed here, 2 skipped)")
            && stdout.contains("PROBES (2, feeding 3 resources)")
            && stdout.contains("\n  count  ")
            && stdout.contains("fed by words (provides:)\n")
            && stdout.contains("SKIPPED (2)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("good,") || stdout.lines().any(|l| l.starts_with("good ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("words,count") || stdout.contains("words,count "),
        "{stdout}"
    );
    assert!(
        stdout.contains("static_one  static (no interval): the controller owns its value"),
        "{stdout}"
    );
    assert!(
        stdout.contains("theirs      shared instance [node002,node001] is reported by node002"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("configuration OK"));
}

#[test]
fn check_flags_a_missing_script() {
    let s = setup();
    std::fs::remove_file(s.path().join("words.sh")).unwrap();
    let out = agent(&s).arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The files are valid; this host cannot run them as written.
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("PROBLEMS (1)\nwords: "), "{stdout}");
    let wanted = format!(
        "words: {} not found (`words.sh` is not an absolute path, so it is looked up in plugin_dir {}, then on the probes' PATH {}, and is in neither)",
        s.path().join("words.sh").display(),
        s.path().display(),
        xce_agent::probe::path::PROBE_PATH
    );
    assert!(stdout.contains(&wanted), "{stdout}");
}

/// The commonest mistakes each get a message that names the fix, and exit 2 (a file is
/// wrong) or 1 (the files are valid; this host cannot run them as written).
#[test]
fn check_names_the_fix_for_the_commonest_mistakes() {
    let check_exit = |s: &Setup, code: i32| {
        let out = agent(s).arg("check").output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "{text}");
        text
    };
    let check = |s: &Setup| check_exit(s, 2);
    let dedented = Setup::new(
        "resources:\n  - name: a\n    interval: 30\n    probe:\n    kind: exec\n    command: [a.sh]\n",
    );
    assert!(
        check(&dedented).contains(
            ":5:5: `kind` belongs under `probe:` (indent it two more spaces than `probe:`)"
        ),
        "{}",
        check(&dedented)
    );
    let timout = Setup::new(
        "resources:\n  - name: a\n    interval: 30\n    probe:\n      kind: exec\n      command: [a.sh]\n      timout: 5\n",
    );
    assert!(
        check(&timout).contains(":7:7: unknown field `timout`; did you mean `timeout`?"),
        "{}",
        check(&timout)
    );
    let controler = Setup::with_agent("resources: []\n", "controler: [ctl1]\n");
    assert!(
        check(&controler).contains("unknown field `controler`; did you mean `controllers`?"),
        "{}",
        check(&controler)
    );
    let no_exec_bit = setup();
    let script = no_exec_bit.path().join("good.sh");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let wanted = format!(
        "good: {p} is not executable (mode 0644); fix: chmod 755 {p}",
        p = script.display()
    );
    assert!(
        check_exit(&no_exec_bit, 1).contains(&wanted),
        "{}",
        check_exit(&no_exec_bit, 1)
    );
}

#[test]
fn missing_config_file() {
    let out = Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["--once", "--config", "/nonexistent/agent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("/nonexistent/agent.yaml: cannot read: No such file or directory"));
}

#[test]
fn shipped_example_config_is_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["check", "--host", "node001", "--config"])
        .arg(format!("{root}/configs/agent.yaml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ib_up "),
        "node001 is in ib_up's host range: {stdout}"
    );
    // The header's count is what the listing shows: every resource once.
    let counts = regex::Regex::new(r"\((\d+) resources: (\d+) probed here, (\d+) skipped\)")
        .unwrap()
        .captures(&stdout)
        .map(|c| [1, 2, 3].map(|i| c[i].parse::<usize>().unwrap()))
        .expect("counts in the header");
    assert_eq!(counts[0], counts[1] + counts[2], "{stdout}");
    let listed = stdout
        .split("\nPROBES (")
        .nth(1)
        .unwrap()
        // The notes that follow the plan are not rows of it.
        .split("\nNOTES (")
        .next()
        .unwrap()
        .lines()
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("NAME ")
                && !l.starts_with("SPLAY: ")
                && !l.starts_with("SKIPPED (")
                && !l.contains(", feeding ")
                && !l.starts_with("configuration OK")
        })
        .count();
    assert_eq!(listed, counts[0], "{stdout}");
}

/// README's configuration snippet, pasted as resources.yaml with the shipped plugins, passes
/// `check` and `--once` reports both resources it declares.
#[test]
fn readme_configuration_snippet_works_when_pasted() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let section = readme.split("\n## Configuration\n").nth(1).unwrap();
    let snippet = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a yaml block in README's Configuration section");
    let s = Setup::with_agent(snippet, "");
    // The shipped plugin, copied into the site's plugin_dir: the checkout itself may sit under
    // a directory its probe user (nobody) cannot enter.
    let shipped = std::fs::read_to_string(format!("{root}/plugins/scratch_free")).unwrap();
    s.script("scratch_free", &shipped);
    let out = agent(&s).arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = agent(&s)
        .args(["--once", "--format", "json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for name in ["scratch_free_mb", "scratch_inodes_free_pct"] {
        assert!(
            stdout.contains(&format!("\"name\": \"{name}\"")),
            "{stdout}"
        );
    }
}

#[test]
fn listen_help_names_its_own_formats() {
    let out = Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["listen", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("[default: text] [possible values: text, json, table]")
            && !help.contains("[default: table]")
            && !help.contains("instead of text"),
        "{help}"
    );
}

#[test]
fn unknown_builtin_index_is_a_config_error() {
    let s = Setup::new(
        "resources:\n  - name: load\n    interval: 15s\n    probe: {kind: builtin, index: r2m}\n",
    );
    let out = agent(&s).arg("check").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "{}:4:12: unknown builtin index \"r2m\" for \"load\"; known: r15s, r1m",
        s.path().join("resources.yaml").display()
    );
    assert!(stderr.starts_with(&want), "{stderr}");
}

#[test]
fn listen_on_a_port_in_use_names_the_address_and_exits_2() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["listen", "--insecure", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!("xce-agent: cannot listen on {addr}: Address already in use");
    assert!(stderr.contains(&want), "{stderr}");
}

#[test]
fn a_metrics_port_in_use_stops_the_daemon_with_the_address_and_exit_2() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let s = Setup::with_agent(RESOURCES, &format!("metrics: {addr}\n"));
    let out = agent(&s).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!("xce-agent: metrics: cannot listen on {addr}: Address already in use");
    assert!(stderr.contains(&want), "{stderr}");
}

/// `--once` on a terminal says what it is waiting for while a probe hangs (a silent 30 s
/// looked like a hung agent); its stdout, and a pipe, get no progress line.
#[test]
fn once_on_a_terminal_says_which_probe_it_waits_for() {
    use std::io::Read as _;
    let s = Setup::new(&format!(
        "resources:\n{}",
        crate::support::resource("slow", "{kind: exec, command: [slow.sh], timeout: 30s}")
    ));
    let gate = s.path().join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    // Blocks until the test opens the FIFO for writing.
    s.script(
        "slow.sh",
        &format!("#!/bin/sh\nread x < {}\necho 1\n", gate.display()),
    );
    let pty = nix::pty::openpty(None, None).unwrap();
    let once = std::process::Command::new(assert_cmd::cargo::cargo_bin("xce-agent"))
        .arg("--config")
        .arg(s.agent_yaml())
        .arg("--once")
        .stderr(std::fs::File::from(pty.slave.try_clone().unwrap()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let mut seen = String::new();
    let mut buf = [0u8; 1024];
    while !seen.contains("waiting for: slow (") {
        let n = master.read(&mut buf).expect("the terminal");
        assert!(n > 0, "the terminal closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("of its 30s timeout)"), "{seen}");
    std::fs::write(&gate, "go\n").unwrap();
    let out = once.wait_with_output().unwrap();
    assert!(out.status.success(), "{seen}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("slow") && !stdout.contains("waiting for"),
        "{stdout}"
    );
}

/// The long options `xce-agent ARGS --help` lists, in its order.
fn help_flags(args: &[&str]) -> Vec<String> {
    let out = Command::new(crate::support::agent_bin())
        .args(args)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success(), "{args:?} --help: {out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8 help");
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            // `-c, --config`: the short form goes.
            let l = match l.as_bytes() {
                [b'-', short, b',', b' ', ..] if short.is_ascii_alphabetic() => &l[4..],
                _ => l,
            };
            l.starts_with("--")
                .then(|| l.split([' ', '\t']).next().unwrap_or(l).to_owned())
        })
        .collect()
}

#[test]
fn each_commands_help_lists_exactly_the_options_it_reads() {
    let config = ["--config", "--resources", "--host", "--log-level"];
    for (args, own) in [
        (&["check"][..], &config[..]),
        (&["probe"], &config),
        (&["status"], &["--format", "--watch", "--config"]),
        (
            &["listen"],
            &[
                "--format",
                "--ack",
                "--only",
                "--refresh",
                "--tls-ca",
                "--tls-cert",
                "--tls-key",
                "--tls-crl",
                "--domain",
                "--insecure",
                "--memory-budget",
                "--host-share",
                "--unix",
                "--unix-uid",
                "--log-level",
            ],
        ),
        (&["tls", "init"], &["--days"]),
        (&["tls", "issue"], &["--ca", "--out", "--domain", "--days"]),
        (&["generate-assets"], &[]),
    ] {
        let mut want: Vec<String> = own.iter().map(|s| s.to_string()).collect();
        want.push("--help".into());
        let mut got = help_flags(args);
        got.sort();
        want.sort();
        assert_eq!(got, want, "xce-agent {} --help", args.join(" "));
    }
}

#[test]
fn config_options_work_before_and_after_the_command_and_are_refused_where_unread() {
    let s = setup();
    let config = s.agent_yaml();
    let config = config.to_str().expect("utf-8 path");
    let bin = crate::support::agent_bin();
    for args in [
        vec!["-c", config, "probe", "good"],
        vec!["probe", "good", "-c", config],
        vec!["--host", "node001", "check", "-c", config],
        vec!["check", "--host", "node001", "--config", config],
    ] {
        let out = Command::new(&bin).args(&args).output().expect("run");
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    // The subcommand's own option wins over the one before it.
    let out = Command::new(&bin)
        .args(["-c", "/nonexistent/agent.yaml", "check", "-c", config])
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    for args in [
        vec!["-c", config, "listen", "127.0.0.1:0", "--insecure"],
        vec!["--host", "x", "status", "-c", config],
        vec!["--resources", "r.yaml", "tls", "init", "/nonexistent/ca"],
        vec![
            "--log-level",
            "debug",
            "generate-assets",
            "/nonexistent/assets",
        ],
    ] {
        let out = Command::new(&bin).args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("does not read --"), "{args:?}: {err}");
    }
}
