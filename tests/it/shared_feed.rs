//! Shared values from a feed (#38 item 5): one probe's `provides:` holds host and shared
//! resources, as an LSF ELIM reports both in one line. Each value goes to its instance on the
//! host the shared resource's resourcemap designates, and the other hosts drop it (`check`
//! says so); a Grid Engine `global:` line and a sample labelled `host="global"` go to the
//! shared instance. End to end through `--once`, `check`, the daemon and `listen`, with
//! fixtures in the shapes their ecosystems publish (tests/fixtures/formats).

use std::path::Path;

use crate::formats::{number, once, row};
use crate::support::{agent_output, ListenProc, Setup, Site, HANG_GUARD};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name),
    )
    .expect("fixture")
}

/// The instance both hosts of the test share; node001, written first, reports it.
const INSTANCE: &str = "node[001-002]";

/// `scratch_io` on every host, fed with the shared `matlab_lic` by one probe (`probe`, a
/// YAML flow mapping), at `interval` seconds.
fn resources(probe: &str, interval: u32) -> String {
    format!(
        r#"
resources:
  - name: scratch_io
    interval: {interval}
    probe: {probe}
  - name: matlab_lic
    interval: {interval}
    resourcemap: [{{location: ["{INSTANCE}"]}}]
"#
    )
}

fn elim_probe(interval: u32) -> String {
    format!(
        "{{kind: stream, command: [elim-shared.sh], format: elim, provides: [matlab_lic], env: {{ELIM_INTERVAL: \"{interval}\"}}}}"
    )
}

/// The site's agent.yaml names `host` instead of node001.
fn as_host(site: &Site, host: &str) {
    let yaml = std::fs::read_to_string(site.agent_yaml()).expect("read agent.yaml");
    std::fs::write(
        site.agent_yaml(),
        yaml.replace("host: node001", &format!("host: {host}")),
    )
    .expect("write agent.yaml");
}

fn elim_site(host: &str) -> Setup {
    let s = Setup::new(&resources(&elim_probe(60), 60));
    s.script("elim-shared.sh", &fixture("elim-shared.sh"));
    as_host(&s, host);
    s
}

#[test]
fn an_elim_line_feeds_the_host_and_the_shared_instance_where_it_is_reported() {
    let s = elim_site("node001");
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(number(&json, "scratch_io"), 512.0);
    assert_eq!(number(&json, "matlab_lic"), 12.0);
    assert!(
        row(&json, "scratch_io").get("instance").is_none(),
        "{json:#}"
    );
    assert_eq!(row(&json, "matlab_lic")["instance"], INSTANCE, "{json:#}");
}

#[test]
fn another_host_of_the_instance_drops_the_shared_value_and_check_says_so() {
    let s = elim_site("node002");
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(number(&json, "scratch_io"), 512.0);
    let rows = json["resources"].as_array().expect("rows");
    assert!(
        rows.iter().all(|r| r["name"] != "matlab_lic"),
        "node002 reported the shared value: {json:#}"
    );
    let (code, text) = agent_output(&s.agent_yaml(), &["check"]);
    assert_eq!(code, Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("matlab_lic "))
        .unwrap_or_else(|| panic!("check says nothing of matlab_lic: {text}"));
    assert!(
        line.contains(&format!(
            "shared instance [{INSTANCE}] is reported by node001"
        )) && line.contains(
            "the probe of scratch_io (provides:) runs here too, and this host drops its value"
        ),
        "{line}"
    );
    // Asked for by name, `--once` says why, and fails (nothing of it was measured here).
    let (code, text) = agent_output(&s.agent_yaml(), &["--once", "--only", "matlab_lic"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("this host drops its value"), "{text}");
    // The ELIM is not told to report it (LSF_RESOURCES lists what this host reports).
    let (_, text) = agent_output(&s.agent_yaml(), &["probe", "scratch_io"]);
    assert!(text.contains("LSF_RESOURCES=scratch_io\n"), "{text}");
    assert!(
        text.contains("drops:     matlab_lic (reported by another host)"),
        "{text}"
    );
    assert!(
        !text.contains("outside"),
        "a dropped name was taken as unknown: {text}"
    );
}

#[test]
fn sge_global_lines_go_to_the_shared_instance_and_host_lines_to_the_host() {
    let s = Setup::new(&resources(
        "{kind: stream, command: [sge-global-sensor.sh], format: sge, provides: [matlab_lic]}",
        60,
    ));
    s.script("sge-global-sensor.sh", &fixture("sge-global-sensor.sh"));
    let (code, json) = once(&s);
    assert_eq!(code, Some(0), "{json:#}");
    assert_eq!(number(&json, "scratch_io"), 512.0);
    // The sensor reports matlab_lic for this host (3) and for `global` (12): the shared
    // instance takes the global one.
    assert_eq!(number(&json, "matlab_lic"), 12.0);
    assert_eq!(row(&json, "matlab_lic")["instance"], INSTANCE);
}

/// A host's own resource never takes the global host's value: the sensor's `global:` line
/// does not feed it, and `--once` says what would.
#[test]
fn a_global_value_does_not_feed_a_hosts_own_instance() {
    let s = Setup::new(
        r#"
resources:
  - name: scratch_io
    interval: 60
    probe: {kind: exec, command: [global.sh], format: sge, provides: [matlab_lic]}
  - name: matlab_lic
    interval: 60
"#,
    );
    s.script(
        "global.sh",
        "#!/bin/sh\nprintf 'begin\\n%s:scratch_io:512\\nglobal:matlab_lic:12\\nend\\n' \"$(uname -n)\"\n",
    );
    let (code, json) = once(&s);
    assert_ne!(code, Some(0), "{json:#}");
    assert_eq!(number(&json, "scratch_io"), 512.0);
    let lic = row(&json, "matlab_lic");
    let error = lic["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("only for the global host") && error.contains("location: [all]"),
        "{lic:#}"
    );
}

/// Prometheus text and influx line protocol (Telegraf tags every point with its host) with
/// the same name for this host and for `host="global"`: the shared instance takes the
/// global one. Influx names a sample `measurement.field`: `matlab.lic` is `matlab_lic`.
#[test]
fn samples_labelled_host_global_go_to_the_shared_instance() {
    for (file, format) in [("global.prom", "prometheus"), ("global.influx", "influx")] {
        let s = Setup::new(&resources(
            &format!(
                "{{kind: exec, command: [print.sh], format: {format}, provides: [matlab_lic]}}"
            ),
            60,
        ));
        s.script(
            "print.sh",
            &format!("#!/bin/sh\ncat <<'END'\n{}END\n", fixture(file)),
        );
        let (code, json) = once(&s);
        assert_eq!(code, Some(0), "{format}: {json:#}");
        assert_eq!(number(&json, "scratch_io"), 512.0, "{format}");
        assert_eq!(number(&json, "matlab_lic"), 12.0, "{format}");
        assert_eq!(row(&json, "matlab_lic")["instance"], INSTANCE, "{format}");
    }
}

/// The daemon on both hosts of the instance feeds `listen --format table`: the shared
/// instance's column has node001's value, and node002 (which drops it) shows none.
#[tokio::test]
async fn the_daemons_of_two_hosts_feed_listen_the_shared_instance_once() {
    let only = format!("scratch_io,matlab_lic@{INSTANCE}");
    let mut listen =
        ListenProc::spawn_with(&["--format", "table", "--refresh", "100ms", "--only", &only]);
    let controller = listen.addr.to_string();
    let sites: Vec<Site> = ["node001", "node002"]
        .iter()
        .map(|host| {
            let site = Site::new(
                std::slice::from_ref(&controller),
                &resources(&elim_probe(1), 1),
            );
            site.script("elim-shared.sh", &fixture("elim-shared.sh"));
            as_host(&site, host);
            site
        })
        .collect();
    let mut agents: Vec<_> = sites.iter().map(Site::spawn_agent).collect();
    let mut frame: Vec<Vec<String>> = Vec::new();
    let rows = loop {
        let line = listen
            .stdout
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|e| panic!("listen printed no more lines ({e}); last frame {frame:?}"));
        if !line.starts_with("--- ") {
            frame.push(line.split_whitespace().map(str::to_owned).collect());
            continue;
        }
        let up = |host: &str| {
            frame
                .iter()
                .find(|r| r.len() == 5 && r[0] == host && r[1] == "up" && r[3] == "512")
                .cloned()
        };
        if let (Some(one), Some(two)) = (up("node001"), up("node002")) {
            if one[4] == "12" {
                break [frame[0].clone(), one, two];
            }
        }
        frame.clear();
    };
    assert_eq!(
        rows[0],
        [
            "HOST",
            "LINK",
            "AGE",
            "scratch_io",
            &format!("matlab_lic@{INSTANCE}")
        ]
    );
    assert_eq!(
        rows[2][4], "-",
        "node002 reported the shared instance: {rows:?}"
    );
    for agent in &mut agents {
        agent.assert_alive();
    }
    listen.assert_alive();
}
