//! Porting scripts from other systems (#27): one-liners as `shell:`, bare program names on
//! the probes' PATH, an interpreter's relative script under plugin_dir, and a port that
//! reports nothing failing `--once` and `probe NAME` loudly, through the binary.

use std::path::Path;

use crate::support::{agent_output, resource, Setup};

/// `xce-agent -c agent.yaml ARGS`: exit code and stdout (stderr appended).
fn agent(s: &Setup, args: &[&str]) -> (i32, String) {
    let (code, text) = agent_output(&s.agent_yaml(), args);
    (code.unwrap_or(-1), text)
}

fn setup(resources: &str) -> Setup {
    Setup::new(&format!("resources:\n{resources}"))
}

/// A second numeric resource, fed by another's `provides:`.
fn fed(name: &str) -> String {
    format!("  - {{name: {name}, valtype: numeric, interval: 60s, resourcemap: [{{location: [default]}}]}}\n")
}

fn assert_has(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

/// `check` and `--once` both fail, and both say `wants`.
fn check_and_once_fail_saying(s: &Setup, wants: &[&str]) {
    for args in [&["check"][..], &["--once"]] {
        let (code, out) = agent(s, args);
        assert_eq!(code, 1, "{args:?}:\n{out}");
        assert_has(&out, wants);
    }
}

/// `--once` and `probe NAME` both fail, and both say `wants`.
fn both_fail_saying(s: &Setup, name: &str, wants: &[&str]) {
    let (code, out) = agent(s, &["--once"]);
    assert_eq!(code, 1, "--once:\n{out}");
    assert_has(&out, wants);
    let (code, out) = agent(s, &["probe", name]);
    assert_eq!(code, 1, "probe {name}:\n{out}");
    assert_has(&out, wants);
    assert_has(&out, &["result: failed: "]);
}

// Item 9: a port that reports nothing fails the one-shot commands.

/// A Grid Engine load sensor run as an exec probe: it waits for a line on stdin, which is
/// closed, so it prints nothing. Prometheus calls an empty output an answer.
#[test]
fn an_empty_output_fails_once_and_probe_name() {
    let s = setup(&resource(
        "r",
        "{kind: exec, command: [sensor], format: prometheus}",
    ));
    s.script(
        "sensor",
        "#!/bin/sh\nwhile read -r line; do echo \"node001:r:1\"; done\n",
    );
    both_fail_saying(
        &s,
        "r",
        &[
            "\"r\" is not in the probe's output",
            "the probe printed nothing",
        ],
    );
}

#[test]
fn a_selector_that_matches_nothing_fails_and_lists_the_nearest() {
    let s = setup(&format!(
        "{}{}",
        resource(
            "r",
            "{kind: exec, command: [metrics], format: prometheus, provides: [r, free], select: {free: 'disk_free{path=\"/tnp\"}'}}"
        ),
        fed("free")
    ));
    s.script(
        "metrics",
        "#!/bin/sh\necho 'r 1'\necho 'disk_free{path=\"/\"} 10'\necho 'disk_free{path=\"/tmp\"} 5'\n",
    );
    both_fail_saying(
        &s,
        "free",
        &[
            "free: no sample matches `disk_free{path=\"/tnp\"}` in the output",
            "the output held 3 sample(s); the nearest selectors: `disk_free{path=\"/tmp\"}`, `disk_free{path=\"/\"}`, `r`",
            "did you mean `disk_free{path=\"/tmp\"}`?",
        ],
    );
}

/// Munin's `field.value N` is no Prometheus line: the resource it was for gets nothing
/// while the other one does.
#[test]
fn a_protocol_the_format_does_not_read_fails() {
    let s = setup(&format!(
        "{}{}",
        resource(
            "load",
            "{kind: exec, command: [munin], format: prometheus, provides: [load, memory]}"
        ),
        fed("memory")
    ));
    s.script(
        "munin",
        "#!/bin/sh\necho 'load 0.5'\necho 'memory.value 1024'\n",
    );
    both_fail_saying(
        &s,
        "memory",
        &[
            "\"memory\" is not in the probe's output; 1 line(s) did not parse, the first: line 2",
            "the nearest selectors: `load`",
        ],
    );
}

/// An ELIM line may carry a subset in the daemon; a one-shot run that never names a
/// resource fails it, listing the names it did give.
#[test]
fn an_elim_line_without_a_resource_fails_the_one_shot_run() {
    let s = setup(&format!(
        "{}{}",
        resource(
            "a",
            "{kind: exec, command: [elim], format: elim, provides: [a, bee]}"
        ),
        fed("bee")
    ));
    s.script("elim", "#!/bin/sh\necho '2 a 5 be 6'\n");
    both_fail_saying(
        &s,
        "bee",
        &[
            "\"bee\" is not in the probe's output",
            "the nearest names: `be`, `a`",
            "did you mean `be`?",
        ],
    );
}

// Item 7: one-liners as `shell:`; bare names on the probes' PATH.

fn shell_resource(name: &str, line: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    valtype: numeric\n    interval: 60s\n    resourcemap: [{{location: [default]}}]\n    probe:\n      kind: exec\n      shell: {line}\n{extra}"
    )
}

#[test]
fn a_shell_line_runs_under_sh_with_the_probes_user_and_environment() {
    let s = setup(&shell_resource(
        "double",
        r#""echo $XCE_INTERVAL $FACTOR | awk '{print $1 * $2}'""#,
        "      env: {FACTOR: '4'}\n",
    ));
    let (code, out) = agent(&s, &["--once"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["double    240"]);
    let (code, out) = agent(&s, &["probe", "double"]);
    assert_eq!(code, 0, "{out}");
    assert_has(
        &out,
        &[
            "shell:     /bin/sh -c runs the `shell:` line",
            "argv:      /bin/sh -c 'echo $XCE_INTERVAL $FACTOR | awk ",
            "FACTOR=4",
            "double = 240",
        ],
    );
    if nix::unistd::geteuid().is_root() {
        assert_has(&out, &["user:      nobody (uid ", "script check: ok"]);
    }
    let (code, out) = agent(&s, &["check"]);
    assert_eq!(code, 0, "{out}");
    assert_has(
        &out,
        &[r#"exec shell /bin/sh -c "echo $XCE_INTERVAL $FACTOR | awk '{print $1 * $2}'" (value)"#],
    );
}

/// A stream probe takes `shell:` too: an ELIM written as one line.
#[test]
fn a_stream_probe_runs_a_shell_line() {
    let s = setup(&format!(
        "  - name: s\n    valtype: numeric\n    interval: 60s\n    resourcemap: [{{location: [default]}}]\n    probe: {{kind: stream, format: elim, provides: [s, t], shell: 'echo \"2 s 5 t $XCE_INTERVAL\"; exec sleep 1000'}}\n{}",
        fed("t")
    ));
    let (code, out) = agent(&s, &["probe", "t"]);
    assert_eq!(code, 0, "{out}");
    assert_has(
        &out,
        &["kind stream", "shell:     /bin/sh -c", "s = 5", "t = 60"],
    );
}

#[test]
fn a_shell_line_has_the_probes_timeout() {
    let s = setup(&shell_resource(
        "slow",
        "'sleep 30; echo 1'",
        "      timeout: 1s\n",
    ));
    let (code, out) = agent(&s, &["--once"]);
    assert_eq!(code, 1, "{out}");
    assert_has(&out, &["slow", "timed out after 1s"]);
}

/// What the shell line names is checked by the script rule as `sh -c CODE` always was: a
/// file another user may change is refused by a root agent.
#[test]
fn a_file_a_shell_line_sources_gets_the_script_rule() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the script rule is enforced by a root agent only");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let s = Setup::new("resources: []\n");
    let lib = s.script("lib.sh", "N=3\n");
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::write(
        s.path().join("resources.yaml"),
        format!(
            "resources:\n{}",
            shell_resource("sourced", &format!("'. {}; echo $N'", lib.display()), "")
        ),
    )
    .unwrap();
    check_and_once_fail_saying(&s, &[&format!("chmod go-w {}", lib.display())]);
}

#[test]
fn shell_and_command_errors_name_the_place_and_the_other_field() {
    let parse = |yaml: &str| {
        xce_agent::config::resources::parse(Path::new("resources.yaml"), yaml)
            .err()
            .map(|e| e.0.iter().map(|e| e.to_string()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let probe = |fields: &str| {
        format!("resources:\n  - name: a\n    interval: 30\n    probe:\n      kind: exec\n{fields}")
    };
    assert_eq!(
        parse(&probe("      command: [x]\n      shell: 'x | y'\n")),
        ["resources.yaml:7:14: `command` and `shell` do not go together: `command` is an argument list run without a shell, `shell` a command line run by /bin/sh -c; keep one"]
    );
    assert_eq!(
        parse(&probe("      shell: ' '\n")),
        ["resources.yaml:6:14: `shell` is empty: expected a command line"]
    );
    let e = parse(&probe("      command: \"df -P / | tail -1\"\n"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("resources.yaml:6:16: `command` contains a pipe, which needs a shell: `command` runs without one. Write the line as `shell:` instead of `command:`"),
        "{e:?}"
    );
    let e = parse(
        &probe("      kind: file\n      path: /x\n      shell: 'x'\n")
            .replace("      kind: exec\n", ""),
    );
    assert_has(
        &e.join("\n"),
        &["resources.yaml:7:14: `shell` is not a field of file probes"],
    );
    assert_eq!(
        parse(&probe("      shell: [df, -P]\n")),
        ["resources.yaml:6:14: `shell` is one command line, a string run by /bin/sh -c; an argument list is `command:`"]
    );
    let e = parse(&probe("      timeout: 5s\n"));
    assert_has(
        &e.join("\n"),
        &["or `shell` (a command line run by /bin/sh -c)"],
    );
}

#[test]
fn a_bare_name_not_in_plugin_dir_is_found_on_the_probes_path() {
    let s = setup(&resource(
        "seven",
        "{kind: exec, command: [awk, 'BEGIN { print 7 }']}",
    ));
    let (code, out) = agent(&s, &["--once"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["seven     7"]);
    let plugin_dir = s.path().display().to_string();
    let found =
        format!("(not in plugin_dir {plugin_dir}: found on the probes' PATH /usr/local/sbin:");
    let (code, out) = agent(&s, &["check"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["seven: `awk` is /", &found]);
    let (code, out) = agent(&s, &["probe", "seven"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["program:   `awk` is /", &found, "seven = 7"]);
}

#[test]
fn a_name_found_nowhere_says_where_it_looked() {
    let s = setup(&resource(
        "gone",
        "{kind: exec, command: [no-such-tool-xce]}",
    ));
    let want = format!(
        "{}/no-such-tool-xce not found (`no-such-tool-xce` is not an absolute path, so it is looked up in plugin_dir {}, then on the probes' PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, and is in neither)",
        s.path().display(),
        s.path().display()
    );
    check_and_once_fail_saying(&s, &[&want]);
}

// Item 11: interpreters and their arguments.

fn telegraf_dir(s: &Setup) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = s.path().join("telegraf");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn an_interpreters_relative_script_is_under_plugin_dir_and_checked() {
    crate::support::require_tool("/usr/bin/python3", &["-V"], "apt-get install python3");
    let s = setup(&resource(
        "py",
        "{kind: exec, command: [/usr/bin/python3, telegraf/x.py]}",
    ));
    let script = crate::support::script(&telegraf_dir(&s), "x.py", "print(6 * 7)\n");
    // A bare interpreter name is found on the PATH, and its script still under plugin_dir.
    let bare = setup(&resource("py", "{kind: exec, command: [python3, x.py]}"));
    crate::support::script(bare.path(), "x.py", "print(6 * 7)\n");
    let (code, out) = agent(&bare, &["--once"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["py        42"]);
    let (code, out) = agent(&s, &["--once"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["py        42"]);
    let (code, out) = agent(&s, &["probe", "py"]);
    assert_eq!(code, 0, "{out}");
    assert_has(&out, &["py = 42"]);
    assert_has(
        &out,
        &[&format!("argv:      /usr/bin/python3 {}", script.display())],
    );
    let (code, out) = agent(&s, &["check"]);
    assert_eq!(code, 0, "{out}");
    if nix::unistd::geteuid().is_root() {
        // The script is checked where it is: a group-writable one is refused.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o775)).unwrap();
        let (code, out) = agent(&s, &["check"]);
        assert_eq!(code, 1, "{out}");
        assert_has(&out, &[&format!("chmod go-w {}", script.display())]);
    }
}

#[test]
fn a_missing_relative_script_says_where_it_was_looked_for() {
    let s = setup(&resource(
        "py",
        "{kind: exec, command: [/bin/sh, telegraf/gone.sh]}",
    ));
    telegraf_dir(&s);
    let want = format!(
        "sh's script telegraf/gone.sh not found: a relative script is looked up in plugin_dir, and {}/telegraf/gone.sh does not exist",
        s.path().display()
    );
    check_and_once_fail_saying(&s, &[&want]);
}

#[test]
fn a_crlf_script_and_a_missing_interpreter_are_named_by_check_and_once() {
    let s = setup(&format!(
        "{}{}",
        resource("crlf", "{kind: exec, command: [crlf.sh]}"),
        resource("interp", "{kind: exec, command: [interp.sh]}")
    ));
    s.script("crlf.sh", "#!/bin/sh\r\necho 1\r\n");
    s.script("interp.sh", "#!/usr/bin/no-such-interpreter-xce\necho 1\n");
    let wants = [
        "has Windows (CRLF) line endings: its #! line names interpreter /bin/sh followed by a carriage return",
        "interpreter /usr/bin/no-such-interpreter-xce (from its #! line) not found",
    ];
    check_and_once_fail_saying(&s, &wants);
}

/// A shell's script saved with CRLF line endings, run as `[/bin/sh, x.sh]`: no `#!` to
/// point at, and the shell's own error (a syntax error at `fi`) does not name the cause.
#[test]
fn a_shells_crlf_script_is_named_by_check_and_once() {
    let s = setup(&resource("dos", "{kind: exec, command: [/bin/sh, dos.sh]}"));
    let script = s.script("dos.sh", "if true; then\r\n  echo 1\r\nfi\r\n");
    check_and_once_fail_saying(
        &s,
        &[&format!(
            "{} has Windows (CRLF) line endings: sh reads the carriage return at the end of each line as part of its last word",
            script.display()
        )],
    );
}
