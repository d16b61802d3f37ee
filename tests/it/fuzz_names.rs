//! Names are data, never markup: arbitrary bytes in every string field of a hello and of a
//! batch, sent to the reference receiver, never forge an output line. Every text line is free
//! of control characters, each resval is exactly one line that starts with its own host, and
//! a hello whose names break the resource-name rules is refused.

use std::collections::BTreeSet;

use crate::support::*;
use proptest::prelude::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use xce_agent::link::name_rules::check_hello;
use xce_agent::link::wire::{self, Batch, Declared, Envelope, Hello};
use xce_agent::receiver::session::{EventKind, LineFormat, ListenOpts};
use xce_agent::text::{escape, is_clean_line};
use xce_agent::value::{Resval, Status, Valtype, Value};

/// Arbitrary bytes made into text (the decoder refuses non-UTF-8 anyway), arbitrary Unicode,
/// and the shapes that forged lines in issue 18.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        any::<String>(),
        Just("evil\nnode042 gpu_free ok 8 last_report=never seq=1 full\nnode042".to_owned()),
        Just("\u{1b}[2J\u{1b}[H".to_owned()),
        Just("a\r\u{2028}b\u{202e}".to_owned()),
        "[a-z][a-z0-9_]{0,10}",
    ]
}

#[derive(Debug, Clone)]
struct Case {
    host: String,
    agent_version: String,
    boot_id: String,
    digest: String,
    /// (name, instance, value, error) per declared instance; the batch carries them all.
    entries: Vec<(String, String, String, String)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![1 => hostile_text(), 2 => Just("node001".to_owned())],
        hostile_text(),
        hostile_text(),
        hostile_text(),
        // Mostly good names, so that accepted hellos (and their hostile values and errors)
        // are well covered too.
        proptest::collection::vec(
            (
                prop_oneof![3 => "[a-z_][a-z0-9_]{0,12}", 1 => hostile_text()],
                prop_oneof![2 => Just(String::new()), 1 => "[a-z0-9,-]{1,12}", 1 => hostile_text()],
                hostile_text(),
                hostile_text(),
            ),
            1..5,
        ),
    )
        .prop_map(|(host, agent_version, boot_id, digest, entries)| Case {
            host,
            agent_version,
            boot_id,
            digest,
            entries,
        })
}

fn hello_of(c: &Case) -> Hello {
    let mut hello = Hello::new(
        c.host.clone(),
        c.boot_id.clone(),
        c.digest.clone(),
        c.entries
            .iter()
            .map(|(name, instance, _, _)| Declared {
                name: name.clone(),
                instance: instance.clone(),
                valtype: Valtype::String,
                interval_ms: 1000,
                shared: !instance.is_empty(),
            })
            .collect(),
    );
    hello.agent_version = c.agent_version.clone();
    hello
}

/// Whether the receiver must accept the case's hello: names by the rules, no pair twice.
fn acceptable(c: &Case) -> bool {
    let pairs: BTreeSet<(&str, &str)> = c
        .entries
        .iter()
        .map(|(n, i, _, _)| (n.as_str(), i.as_str()))
        .collect();
    check_hello(&hello_of(c)).is_ok() && pairs.len() == c.entries.len()
}

fn frames(c: &Case) -> Vec<u8> {
    let hello = hello_of(c);
    let batch = Batch {
        seq: 1,
        full: true,
        sent_at_ms: 1,
        resvals: c
            .entries
            .iter()
            .map(|(name, instance, value, error)| Resval {
                name: name.clone(),
                instance: instance.clone(),
                value: Value::String(value.clone()),
                status: Status::Failed,
                last_report_ms: Some(1),
                error: Some(error.clone().into()),
            })
            .collect(),
    };
    [Envelope::Hello(hello), Envelope::Batch(batch)]
        .iter()
        .flat_map(|e| wire::encode_envelope(e).expect("encode"))
        .collect()
}

/// Send the case to an in-process receiver; every text line it prints, per event.
fn printed(c: &Case) -> Vec<(EventKind, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut ctl = Controller::bind(ListenOpts::default()).await;
        let mut s = TcpStream::connect(ctl.addr).await.expect("connect");
        s.write_all(&frames(c)).await.expect("write");
        s.shutdown().await.expect("shutdown");
        let mut out = Vec::new();
        loop {
            let ev = ctl.next().await;
            let lines = ev.lines(LineFormat::Text);
            let closed = matches!(ev.kind, EventKind::Closed(_));
            out.push((ev.kind, lines));
            if closed {
                break;
            }
        }
        ctl.stop().await;
        out
    })
}

proptest! {
    #![proptest_config(crate::support::proptest_config(128))]

    #[test]
    fn no_output_line_can_be_forged(c in case()) {
        let hello_ok = acceptable(&c);
        let events = printed(&c);
        let mut resval_lines = 0;
        for (kind, lines) in &events {
            for line in lines {
                prop_assert!(is_clean_line(line), "unescaped line {line:?}");
                // Each line starts with the connection's host, canonical (lower case): "-"
                // before an accepted hello.
                let first = line.split(' ').next().unwrap_or_default();
                let host = c.host.to_ascii_lowercase();
                prop_assert!(first == "-" || first == escape(&host), "line {line:?}");
            }
            if let EventKind::Batch { batch, rejected } = kind {
                prop_assert_eq!(lines.len(), (batch.resvals.len() + rejected.len()).max(1));
                resval_lines += batch.resvals.len() + rejected.len();
            }
        }
        // A hello that breaks the name rules is refused before any resval is printed.
        if hello_ok {
            prop_assert_eq!(resval_lines, c.entries.len());
        } else {
            prop_assert_eq!(resval_lines, 0);
            let last = &events.last().expect("closed").0;
            prop_assert!(
                matches!(last, EventKind::Closed(Some(e)) if e.contains("hello")),
                "{last:?}"
            );
        }
    }
}

#[test]
fn the_forged_hello_of_issue_18_is_refused_and_hostile_values_print_escaped() {
    let forged = Case {
        host: "evil\nnode042 gpu_free ok 8 last_report=never seq=1 full\nnode042".into(),
        agent_version: "1".into(),
        boot_id: "b".into(),
        digest: "d".into(),
        entries: vec![("gpu_free".into(), String::new(), "8".into(), "e".into())],
    };
    let events = printed(&forged);
    assert!(
        matches!(&events.last().unwrap().0, EventKind::Closed(Some(e)) if e.contains("hello refused")),
        "{events:?}"
    );
    assert!(events
        .iter()
        .all(|(k, _)| !matches!(k, EventKind::Batch { .. })));

    let hostile_values = Case {
        host: "node001".into(),
        agent_version: "\u{1b}[2J".into(),
        boot_id: "b".into(),
        digest: "d".into(),
        entries: vec![(
            "gpu_free".into(),
            String::new(),
            "8\nnode042 gpu_free ok 9".into(),
            "x\ry".into(),
        )],
    };
    let events = printed(&hostile_values);
    let lines: Vec<&String> = events.iter().flat_map(|(_, l)| l).collect();
    assert!(lines.iter().all(|l| is_clean_line(l)), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("agent=\\u{1b}[2J")),
        "{lines:?}"
    );
    let resval_lines: Vec<&&String> = lines.iter().filter(|l| l.contains("gpu_free")).collect();
    assert_eq!(resval_lines.len(), 1, "{lines:?}");
    assert!(
        resval_lines[0].starts_with("node001 gpu_free failed 8\\nnode042"),
        "{lines:?}"
    );
}
