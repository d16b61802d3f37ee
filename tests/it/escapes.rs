//! What a probe prints reaches a terminal or the log escaped (issue 26, item 6): its stderr
//! and stdout in `probe NAME`, `--once`'s table and the daemon's log; a bidi override in a
//! value in `status`'s and `--once`'s tables. The JSON outputs keep the bytes as they were.
//! Real probes through the real binary.

use std::io::Write as _;
use std::process::{Command, Stdio};

use xce_agent::status::StatusReport;
use xce_agent::text::is_clean_line;

use crate::support::{agent_bin, resource, wait_until, Setup, Site};

/// What the hostile probes print on stderr: a line that would read as a log line of its own,
/// then clipboard write (OSC 52), window title, clear screen and a right-to-left override.
const STDERR_SH: &str = r"printf 'INFO forged: all probes ok\n\033]52;c;ZWNobyBoaQ==\007\033]0;pwned\007\033[2J\342\200\256evil\n' >&2";
/// The same text, as the JSON outputs must keep it.
const STDERR_RAW: &str =
    "INFO forged: all probes ok\n\u{1b}]52;c;ZWNobyBoaQ==\u{7}\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}evil\n";
/// Its last line as the tables and the log show it.
const LAST_LINE_ESCAPED: &str =
    "\\u{1b}]52;c;ZWNobyBoaQ==\\u{7}\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{202e}evil";

fn assert_clean(what: &str, text: &str) {
    for line in text.lines() {
        assert!(
            is_clean_line(line),
            "{what}: a line reaches the terminal unescaped: {line:?}\nin:\n{text}"
        );
        assert!(
            !line.starts_with("INFO forged"),
            "{what}: the probe's stderr forged a line of its own: {line:?}\nin:\n{text}"
        );
    }
}

/// A numeric probe that prints a value holding a bidi override (it does not parse) and the
/// hostile stderr.
fn hostile_exec() -> Setup {
    let s = Setup::new(&format!(
        "resources:\n{}",
        resource("h", "{kind: exec, command: [h.sh]}")
    ));
    s.script(
        "h.sh",
        &format!("#!/bin/sh\nprintf '4\\342\\200\\2562\\n'\n{STDERR_SH}\n"),
    );
    s
}

fn agent(s: &Site, args: &[&str]) -> (String, String) {
    let out = Command::new(agent_bin())
        .arg("--config")
        .arg(s.agent_yaml())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("XCE_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .output()
        .expect("run xce-agent");
    (
        String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    )
}

#[test]
fn probe_name_shows_stdout_stderr_and_values_escaped() {
    let s = hostile_exec();
    let (out, err) = agent(&s, &["probe", "h"]);
    assert_clean("probe NAME", &out);
    assert_clean("probe NAME's log", &err);
    assert!(out.contains(&format!("| {LAST_LINE_ESCAPED}")), "{out}");
    assert!(out.contains("| INFO forged: all probes ok"), "{out}");
    assert!(out.contains("| 4\\u{202e}2"), "{out}");
}

#[test]
fn once_table_and_log_are_escaped_and_its_json_is_lossless() {
    let s = hostile_exec();
    let (table, log) = agent(&s, &["--once"]);
    assert_clean("--once table", &table);
    assert_clean("--once log", &log);
    assert!(
        table.contains(&format!("[stderr: {LAST_LINE_ESCAPED}]")),
        "{table}"
    );

    let (json, _) = agent(&s, &["--once", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).expect("--once JSON");
    assert_eq!(
        doc["resources"][0]["stderr"],
        STDERR_RAW.trim_end(),
        "{json}"
    );
}

#[tokio::test]
async fn status_table_and_daemon_log_are_escaped_and_status_json_is_lossless() {
    let site = Site::new(
        &[],
        "resources:\n  - name: mode\n    valtype: string\n    interval: 1s\n    resourcemap: [{location: [default]}]\n    probe: {kind: exec, command: [mode.sh]}\n",
    );
    site.script(
        "mode.sh",
        &format!("#!/bin/sh\nprintf 'ok\\342\\200\\256x\\n'\n{STDERR_SH}\n"),
    );
    let mut yaml = std::fs::OpenOptions::new()
        .append(true)
        .open(site.agent_yaml())
        .expect("open agent.yaml");
    writeln!(yaml, "status_socket: status.sock").expect("append to agent.yaml");
    let mut daemon = site.spawn_agent();
    let status = |args: &[&str]| {
        let mut all = vec!["status"];
        all.extend_from_slice(args);
        agent(&site, &all).0
    };
    wait_until("the value in status", || {
        serde_json::from_str::<StatusReport>(&status(&["--format", "json"])).is_ok_and(|r| {
            r.resources
                .iter()
                .any(|x| x.value.to_string() == "ok\u{202e}x")
        })
    })
    .await;
    wait_until("the stderr in the log", || {
        daemon.log_text().contains("probe wrote to stderr")
    })
    .await;
    let table = status(&[]);
    assert_clean("status table", &table);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("mode ") && l.contains("ok\\u{202e}x")),
        "{table}"
    );
    let log = daemon.log_text();
    assert_clean("daemon log", &log);
    assert!(log.contains(LAST_LINE_ESCAPED), "{log}");
    daemon.assert_alive();
}
