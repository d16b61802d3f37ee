//! The calls as health checks and metric scripts make them.

use super::*;
use crate::config::Capturer;

fn record(command: &str, args: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in [command.to_owned(), args.len().to_string()]
        .into_iter()
        .chain(args.iter().map(|a| (*a).to_owned()))
    {
        out.extend_from_slice(field.as_bytes());
        out.push(0);
    }
    out
}

fn node() -> ThisNode {
    ThisNode::new("node001.cluster.example")
}

fn read(records: &[Vec<u8>]) -> Report {
    Report::read(&records.concat(), false, &node(), Capturer::ALL)
}

fn state(ok: bool, reason: &str) -> Option<NodeState> {
    Some(NodeState {
        ok,
        reason: reason.to_owned(),
    })
}

#[test]
fn an_nhc_drain_is_not_ok_with_its_reason() {
    // NHC's node-mark-offline: `scontrol update State=DRAIN NodeName=$HOSTNAME Reason="NHC: ..."`.
    let r = read(&[record(
        "scontrol",
        &[
            "update",
            "State=DRAIN",
            "NodeName=node001",
            "Reason=NHC: check_fs_mount:  /scratch not mounted",
        ],
    )]);
    assert_eq!(
        r.state,
        state(false, "NHC: check_fs_mount:  /scratch not mounted")
    );
    assert!(!r.malformed);
    let samples = r.samples();
    assert_eq!(samples[0].name, "ok");
    assert_eq!(samples[0].value, "false");
    assert_eq!(samples[1].name, "reason");
}

#[test]
fn the_last_state_call_wins_and_keys_are_case_insensitive() {
    let r = read(&[
        record(
            "scontrol",
            &["update", "nodename=node001", "state=down", "reason=maint"],
        ),
        record(
            "scontrol",
            &[
                "-o",
                "update",
                "NodeName=node001.cluster.example",
                "State=RESUME",
            ],
        ),
    ]);
    assert_eq!(r.state, state(true, "scontrol update State=RESUME"));
    let drain_then_idle = read(&[record("scontrol", &["update", "State=IDLE"])]);
    assert_eq!(
        drain_then_idle.state,
        state(true, "scontrol update State=IDLE")
    );
}

#[test]
fn another_nodes_state_and_other_updates_change_nothing() {
    let r = read(&[
        record(
            "scontrol",
            &["update", "NodeName=node999", "State=DRAIN", "Reason=x"],
        ),
        record("scontrol", &["update", "NodeName=node001", "Weight=5"]),
        record(
            "scontrol",
            &["update", "NodeName=node001", "State=POWER_DOWN"],
        ),
    ]);
    assert_eq!(r.state, None);
    assert!(
        r.calls.iter().all(|(_, e)| matches!(e, Effect::Ignored(_))),
        "{r:?}"
    );
    // A list that holds this node counts.
    let listed = read(&[record(
        "scontrol",
        &[
            "update",
            "NodeName=node000,node001",
            "State=FAIL",
            "Reason=ib",
        ],
    )]);
    assert_eq!(listed.state, state(false, "ib"));
}

#[test]
fn pbsnodes_offline_with_a_comment_or_note_and_clear() {
    let pbs_pro = read(&[record(
        "pbsnodes",
        &["-o", "-C", "disk /tmp full", "node001"],
    )]);
    assert_eq!(pbs_pro.state, state(false, "disk /tmp full"));
    let torque = read(&[record(
        "pbsnodes",
        &["-o", "-N", "NHC: ib0 down", "node001"],
    )]);
    assert_eq!(torque.state, state(false, "NHC: ib0 down"));
    let attached = read(&[record("pbsnodes", &["-oNbad fan"])]);
    assert_eq!(attached.state, state(false, "bad fan"));
    let bare = read(&[record("pbsnodes", &["-o", "node001"])]);
    assert_eq!(bare.state, state(false, "pbsnodes -o (no note given)"));
    let cleared = read(&[
        record("pbsnodes", &["-o", "-N", "x", "node001"]),
        record("pbsnodes", &["-c", "node001"]),
    ]);
    assert_eq!(cleared.state, state(true, "pbsnodes -c"));
    let reset = read(&[record("pbsnodes", &["-r", "node001"])]);
    assert_eq!(reset.state, state(true, "pbsnodes -r"));
    let elsewhere = read(&[record("pbsnodes", &["-o", "node002"])]);
    assert_eq!(elsewhere.state, None);
}

#[test]
fn gmetric_calls_are_samples_named_by_their_name() {
    let r = read(&[
        record(
            "gmetric",
            &[
                "-n",
                "gpfs_read",
                "-v",
                "12.5",
                "-t",
                "double",
                "-u",
                "MB/s",
            ],
        ),
        record(
            "gmetric",
            &["--name=fs_state", "--value=degraded", "--type=string"],
        ),
        record(
            "gmetric",
            &["--name", "jobs", "--value", "3", "--type", "uint32"],
        ),
        record("gmetric", &["-ngpfs_read", "-v13", "-tfloat"]),
    ]);
    assert_eq!(
        r.samples,
        [
            ("gpfs_read".to_owned(), "13".to_owned()),
            ("fs_state".to_owned(), "degraded".to_owned()),
            ("jobs".to_owned(), "3".to_owned()),
        ]
    );
    assert_eq!(r.state, None);
}

#[test]
fn a_gmetric_value_that_is_not_its_type_is_no_sample() {
    let r = read(&[
        record("gmetric", &["-n", "temp", "-v", "hot", "-t", "int32"]),
        record("gmetric", &["-n", "temp2"]),
        record("gmetric", &["-n", "x", "-v", "1", "-t", "bignum"]),
    ]);
    assert!(r.samples.is_empty(), "{r:?}");
    assert_eq!(r.calls.len(), 3);
}

#[test]
fn samples_from_calls_replace_the_formats_own() {
    let r = read(&[record("scontrol", &["update", "State=DRAIN", "Reason=r"])]);
    let mut parsed = crate::output::Parsed::of(vec![
        Sample::plain("exit", "0"),
        Sample::plain("ok", "true"),
    ]);
    r.merge_into(&mut parsed);
    let names: Vec<(&str, &str)> = parsed
        .samples
        .iter()
        .map(|s| (s.name.as_str(), s.value.as_str()))
        .collect();
    assert_eq!(names, [("exit", "0"), ("ok", "false"), ("reason", "r")]);
}

#[test]
fn bytes_that_are_not_records_are_said_malformed_and_stop_the_reading() {
    let mut bytes = record("gmetric", &["-n", "a", "-v", "1"]);
    bytes.extend_from_slice(b"garbage\0not a number\0");
    let r = Report::read(&bytes, false, &node(), Capturer::ALL);
    assert!(r.malformed);
    assert_eq!(r.samples.len(), 1);
    // A record cut short (the cap) is malformed too; an empty pipe is not.
    let cut = &record("gmetric", &["-n", "a", "-v", "1"])[..10];
    assert!(Report::read(cut, true, &node(), Capturer::ALL).malformed);
    assert!(!Report::read(b"", false, &node(), Capturer::ALL).malformed);
    // A huge argument count does not allocate for it.
    let huge = [&b"gmetric\0"[..], b"18446744073709551615\0"].concat();
    assert!(Report::read(&huge, false, &node(), Capturer::ALL).malformed);
}

#[test]
fn a_call_is_shown_as_a_shell_would_take_it() {
    let call = Call {
        command: "scontrol".into(),
        args: vec!["update".into(), "Reason=NHC: disk full".into()],
    };
    assert_eq!(
        call.to_string(),
        "scontrol update \"Reason=NHC: disk full\""
    );
}

#[test]
fn a_run_without_a_state_call_left_its_node_up_or_as_the_format_says() {
    let quiet = read(&[]);
    let merged = |parsed: Vec<Sample>| {
        let mut parsed = crate::output::Parsed::of(parsed);
        quiet.merge_into(&mut parsed);
        parsed
            .samples
            .into_iter()
            .map(|s| (s.name, s.value))
            .collect::<Vec<_>>()
    };
    let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
    assert_eq!(
        merged(Vec::new()),
        [pair("ok", "true"), pair("reason", NO_STATE_CHANGE)]
    );
    // A Nagios CRITICAL that called nothing: not ok, and its text says why.
    assert_eq!(
        merged(vec![
            Sample::plain("ok", "false"),
            Sample::plain("text", "CRITICAL - /scratch")
        ]),
        [
            pair("text", "CRITICAL - /scratch"),
            pair("ok", "false"),
            pair("reason", "CRITICAL - /scratch")
        ]
    );
    // Without node_state, a run gives only what its calls do.
    let gmetric_only = Report::read(b"", false, &node(), &[Capturer::Gmetric]);
    assert!(gmetric_only.samples().is_empty() && !gmetric_only.gives_values());
}
