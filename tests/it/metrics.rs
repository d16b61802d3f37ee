//! The Prometheus endpoint through the real binary: a real HTTP scrape over 127.0.0.1,
//! the values and counters it must show, the text checked by a Prometheus parser, and the
//! answers to requests that are not a scrape.

use crate::support as common;

use std::process::Stdio;
use std::time::Duration;

use crate::support::{guard, poll_until, AgentProc, Setup};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const RESOURCES: &str = "resources:
  - name: num
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [num]}
  - name: broken
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [broken]}
  - name: label
    valtype: string
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [label]}
";

/// One request, the whole answer (the server closes after it).
pub(crate) async fn request(addr: &str, raw: &[u8]) -> String {
    guard("an HTTP answer", async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(raw).await.expect("write request");
        let mut out = Vec::new();
        // The server may close before reading all of an oversized request: a reset
        // then ends the read, and what arrived before it is the answer.
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
}

pub(crate) fn body(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// Scrape with `raw` until the exposition satisfies `done` (values appear once the probes
/// have run, within their first interval); every answer must be a 200 of `content_type`.
async fn scrape_until(
    addr: &str,
    raw: &[u8],
    content_type: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let what = format!("the expected values in a {content_type} scrape");
    poll_until(&what, || async {
        let resp = request(addr, raw).await;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        let header = format!("content-type: {content_type}");
        assert!(resp.to_ascii_lowercase().contains(&header), "{resp}");
        let text = body(&resp);
        done(text).then(|| text.to_owned())
    })
    .await
}

#[tokio::test]
async fn scrape_shows_values_probe_and_link_counters_in_valid_text_format() {
    let setup = Setup::with_agent(
        RESOURCES,
        // A controller that refuses connections: the link counters move.
        "run_as: root\nmetrics: 127.0.0.1:0\ncontrollers: [\"127.0.0.1:1\"]\n",
    );
    setup.script("num", "#!/bin/sh\necho 7\n");
    setup.script("broken", "#!/bin/sh\necho oops >&2\nexit 3\n");
    setup.script("label", "#!/bin/sh\necho \"a \\\"quoted\\\" label\"\n");
    let (mut daemon, addr) = start(&setup).await;

    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    let scrape = || request(&addr, GET);
    let want = [
        "xce_resource_value{name=\"num\",resource_instance=\"\"} 7.0\n",
        "xce_resource_status{name=\"broken\",resource_instance=\"\",status=\"failed\"} 1\n",
        "xce_probe_runs_total{probe=\"broken\",outcome=\"failed\"} ",
        "xce_probe_duration_seconds_bucket{probe=\"num\",le=\"+Inf\"} ",
        "xce_probe_last_success_timestamp_seconds{probe=\"num\"} ",
        "xce_link_connect_failures_total ",
        "xce_link_state{state=\"",
        "xce_resource_status{name=\"label\",resource_instance=\"\",status=\"ok\"} 1\n",
    ];
    let text = scrape_until(&addr, GET, "text/plain; version=0.0.4", |text| {
        want.iter().all(|w| text.contains(w))
    })
    .await;
    // A string value has a status but no numeric sample.
    assert!(
        !text.contains("xce_resource_value{name=\"label\""),
        "{text}"
    );
    assert!(text.contains("xce_probe_runs_total{probe=\"num\",outcome=\"ok\"} "));
    assert!(text.contains("xce_link_bytes_sent_total 0\n"), "{text}");
    // Prometheus' conventions: no label named `instance` (it collides with the target's and
    // becomes `exported_instance`), unix times named `_timestamp_seconds`, a build_info, the
    // standard process metrics, and the configuration's health.
    assert!(
        !text.contains("{instance=\"") && !text.contains(",instance=\""),
        "{text}"
    );
    for want in [
        format!(
            "xce_build_info{{version=\"{}\",protocol=\"",
            env!("CARGO_PKG_VERSION")
        ),
        "process_cpu_seconds_total ".to_owned(),
        "process_resident_memory_bytes ".to_owned(),
        "process_open_fds ".to_owned(),
        "process_max_fds ".to_owned(),
        "process_start_time_seconds ".to_owned(),
        "process_threads ".to_owned(),
        "xce_config_last_reload_successful 1\n".to_owned(),
        "xce_config_last_reload_success_timestamp_seconds ".to_owned(),
        "xce_config_controllers 1\n".to_owned(),
        "xce_link_down_since_timestamp_seconds ".to_owned(),
    ] {
        assert!(text.contains(&want), "{want:?} not in\n{text}");
    }
    // The containment the daemon logged, and the controllers its probes' cgroups have: the
    // three exec probes have the default pids limit and no memory limit.
    let log = daemon.log_text();
    let contained = log.contains("probes are contained: each in its own cgroup");
    let want = format!("xce_containment_enforced {}\n", u8::from(contained));
    assert!(text.contains(&want), "{want:?} not in\n{text}\nlog:\n{log}");
    let pids_here = contained
        && regex::Regex::new(r"probes are contained: .* controllers=(.*)")
            .expect("re")
            .captures(&log)
            .is_some_and(|c| c[1].split(' ').any(|c| c == "pids"));
    for want in [
        "xce_probe_limits_unenforced{controller=\"memory\"} 0\n".to_owned(),
        format!(
            "xce_probe_limits_unenforced{{controller=\"pids\"}} {}\n",
            if pids_here { 0 } else { 3 }
        ),
    ] {
        assert!(text.contains(&want), "{want:?} not in\n{text}\nlog:\n{log}");
    }
    // A reload that fails keeps the running configuration, and says so here too.
    std::fs::write(setup.path().join("resources.yaml"), "resources: [\n").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    daemon.wait_log("reload failed", 1).await;
    scrape_until(&addr, GET, "text/plain; version=0.0.4", |text| {
        text.contains("xce_config_last_reload_successful 0\n")
    })
    .await;

    // Not a scrape.
    let r = request(&addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
    let r = request(&addr, b"POST /metrics HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    let r = request(&addr, b"\x00\x01garbage\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
    huge.extend_from_slice(b"\r\n\r\n");
    let r = request(&addr, &huge).await;
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
    // HEAD: headers only.
    let r = request(&addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 ") && body(&r).is_empty(), "{r}");
    // The endpoint still serves after all that.
    assert!(scrape().await.starts_with("HTTP/1.1 200 OK"));

    stop(&mut daemon).await;
}

/// Start the daemon of `setup`; returns it and the metrics address it logged.
pub(crate) async fn start(setup: &Setup) -> (AgentProc, String) {
    let daemon = setup.spawn_agent();
    // The port was 0: the daemon logs the one it got.
    let listening = regex::Regex::new(r"metrics endpoint listening addr=(\S+)").expect("re");
    let addr = poll_until("the metrics address in the log", || {
        let log = daemon.log_text();
        std::future::ready(listening.captures(&log).map(|c| c[1].to_owned()))
    })
    .await;
    (daemon, addr)
}

/// A stream's lines are its runs in `xce_probe_runs_total`, and one whose every line is
/// rejected shows it there, not only in the log (issue 27, items 9 and 10).
#[tokio::test]
async fn a_streams_lines_are_counted_and_rejected_ones_shown() {
    let setup = Setup::with_agent(
        crate::status::STREAMS,
        "run_as: root\nmetrics: 127.0.0.1:0\n",
    );
    crate::status::stream_scripts(|name, body| setup.script(name, body));
    let (mut daemon, addr) = start(&setup).await;
    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    let want = [
        "xce_probe_runs_total{probe=\"good\",outcome=\"ok\"} 2\n",
        "xce_probe_runs_total{probe=\"garbage\",outcome=\"rejected\"} 2\n",
    ];
    let text = scrape_until(&addr, GET, "text/plain; version=0.0.4", |text| {
        want.iter().all(|w| text.contains(w))
    })
    .await;
    assert!(text.contains("xce_probe_runs_total{probe=\"garbage\",outcome=\"ok\"} 0\n"));
    assert!(text.contains("xce_probe_last_success_timestamp_seconds{probe=\"good\"} "));
    assert!(
        !text.contains("xce_probe_last_success_timestamp_seconds{probe=\"garbage\"}"),
        "{text}"
    );
    stop(&mut daemon).await;
}

/// Runs that wait for a place under `max_parallel` are the run queue: counted while they
/// wait, and how late they started is in the start-delay histogram.
#[tokio::test]
async fn runs_waiting_for_max_parallel_are_counted_and_their_delay_measured() {
    let setup = Setup::with_agent(
        "resources:
  - name: hold
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [hold], timeout: 60s}
  - name: num
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [num]}
",
        "run_as: root\nmetrics: 127.0.0.1:0\nmax_parallel: 1\n",
    );
    let (holding, release) = (setup.file("holding"), setup.file("release"));
    // `hold` takes the only place until the test releases it; `num` then waits.
    setup.script(
        "hold",
        &format!(
            "#!/bin/sh\ntouch {}\nuntil [ -e {} ]; do sleep 0.05; done\necho 1\n",
            holding.display(),
            release.display()
        ),
    );
    setup.script("num", "#!/bin/sh\necho 7\n");
    let (mut daemon, addr) = start(&setup).await;
    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    crate::support::wait_until("hold to take the only place", || holding.exists()).await;
    // With `hold` running (its own ticks are skipped, not queued), the run waiting is
    // `num`'s: due before this scrape, started only after the release. So its delay is at
    // least the time from here to the release.
    scrape_until(&addr, GET, "text/plain; version=0.0.4", |text| {
        text.contains("xce_schedule_runs_waiting 1\n")
    })
    .await;
    let seen = std::time::Instant::now();
    // Still waiting a scrape later.
    scrape_until(&addr, GET, "text/plain; version=0.0.4", |text| {
        text.contains("xce_schedule_runs_waiting 1\n")
    })
    .await;
    let at_least = seen.elapsed().as_secs_f64();
    std::fs::write(&release, "").expect("release hold");
    let sum = regex::Regex::new(r"(?m)^xce_schedule_start_delay_seconds_sum (\S+)$").expect("re");
    let text = scrape_until(&addr, GET, "text/plain; version=0.0.4", |text| {
        text.contains("xce_resource_value{name=\"num\",resource_instance=\"\"} 7.0\n")
    })
    .await;
    let delayed: f64 = sum.captures(&text).expect("a delay sum")[1]
        .parse()
        .expect("a number");
    assert!(delayed >= at_least, "{delayed} < {at_least}\n{text}");
    assert!(
        text.contains("xce_schedule_start_delay_seconds_bucket{le=\"+Inf\"} "),
        "{text}"
    );
    stop(&mut daemon).await;
}

/// Without cgroups (process groups only) the exposition says so; no probe has limits here.
#[test]
fn an_uncontained_agent_says_so() {
    let text = exposition_of_every_kind(xce_agent::metrics::ExpositionFormat::PrometheusText);
    for want in [
        "xce_containment_enforced 0\n",
        "xce_probe_limits_unenforced{controller=\"memory\"} 0\n",
        "xce_probe_limits_unenforced{controller=\"pids\"} 0\n",
        "xce_config_controllers 0\n",
        "xce_schedule_runs_waiting 0\n",
        "xce_schedule_start_delay_seconds_count 0\n",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
}

/// SIGTERM, and the daemon exits cleanly.
pub(crate) async fn stop(daemon: &mut AgentProc) {
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.log_text());
}

/// Hundreds of connections that never send a request (a local user's, or a broken scraper's)
/// do not delay a real scrape: it is answered while every one of them is still open, i.e.
/// before the server has timed any of them out.
#[tokio::test]
async fn idle_connections_do_not_delay_a_scrape() {
    let setup = Setup::with_agent(RESOURCES, "run_as: root\nmetrics: 127.0.0.1:0\n");
    for name in ["num", "broken", "label"] {
        setup.script(name, "#!/bin/sh\necho 1\n");
    }
    let (mut daemon, addr) = start(&setup).await;
    let mut idle = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect(&addr).await.expect("idle connect");
        // Half a request head: the server must wait for the rest.
        s.write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .expect("half head");
        idle.push(s);
    }
    let resp = request(&addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    for (i, s) in idle.iter().enumerate() {
        let mut buf = [0u8; 1];
        match s.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => {
                panic!("idle connection {i} was closed before the scrape was answered: {other:?}")
            }
        }
    }
    drop(idle);
    stop(&mut daemon).await;
}

/// A scraper that asks for OpenMetrics gets it, `# EOF` and all; one that does not ask gets
/// the Prometheus text format. (The reference parsers read both below.)
#[tokio::test]
async fn openmetrics_is_served_when_the_scraper_asks_for_it() {
    let setup = Setup::with_agent(RESOURCES, "run_as: root\nmetrics: 127.0.0.1:0\n");
    setup.script("num", "#!/bin/sh\necho 7\n");
    setup.script("broken", "#!/bin/sh\nexit 3\n");
    setup.script("label", "#!/bin/sh\necho x\n");
    let (mut daemon, addr) = start(&setup).await;
    let ask = b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
    let openmetrics = "application/openmetrics-text; version=1.0.0";
    let text = scrape_until(&addr, ask, openmetrics, |text| {
        text.contains("xce_resource_value{name=\"num\",resource_instance=\"\"} 7.0\n")
    })
    .await;
    assert!(text.ends_with("# EOF\n"), "{text}");
    // OpenMetrics names the counter family without `_total`; the sample keeps it.
    assert!(text.contains("# TYPE xce_probe_runs counter\n"), "{text}");
    assert!(text.contains("xce_probe_runs_total{probe=\"num\",outcome=\"ok\"} "));
    let plain = request(&addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert!(!body(&plain).contains("# EOF"), "{plain}");
    assert!(body(&plain).contains("# TYPE xce_probe_runs_total counter\n"));
    stop(&mut daemon).await;
}

/// Which of the reference client's parsers reads the text.
#[derive(Clone, Copy)]
enum Parser {
    Prometheus,
    OpenMetrics,
}

/// The exposition, rendered as a scrape renders it, for values of every kind: ok, failed,
/// a string with quotes, probe counters with a duration, the link counters.
fn exposition_of_every_kind(format: xce_agent::metrics::ExpositionFormat) -> String {
    use std::sync::Arc;
    use std::time::SystemTime;
    use xce_agent::store::{Declared, Store};
    use xce_agent::value::{Reading, Valtype, Value};
    let store = Arc::new(Store::new());
    let declare = |name: &str, valtype| Declared {
        name: name.into(),
        instance: String::new(),
        valtype,
        stale_after: Duration::from_secs(60),
    };
    store.declare([
        declare("num", Valtype::Numeric),
        declare("broken", Valtype::Numeric),
        declare("label", Valtype::String),
    ]);
    let now = SystemTime::now();
    store.record("num", "", Reading::Ok(Value::Numeric(7.0)), now);
    store.record("broken", "", Reading::Failed("exit 3".into()), now);
    let label = Value::String("a \"quoted\" label\\".into());
    store.record("label", "", Reading::Ok(label), now);
    let stats = Arc::new(xce_agent::stats::Stats::default());
    let num = stats.probe("num");
    num.ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    num.duration.observe(Duration::from_millis(3));
    let (_, probes) = tokio::sync::watch::channel(stats);
    let registry = xce_agent::metrics::registry(xce_agent::metrics::Sources {
        store,
        link: Default::default(),
        probes,
        files: xce_agent::probe::file_reader::FileReads::new(32),
        loaded: tokio::sync::watch::channel(Default::default()).1,
        supervisor: xce_agent::probe::supervisor::Supervisor::uncontained(),
    });
    xce_agent::metrics::render(&registry, format)
}

#[test]
#[ignore = "needs python3 with prometheus_client; CI runs it with `cargo test -- --ignored`"]
fn the_exposition_parses_with_the_reference_python_parser() {
    common::require_tool(
        "python3",
        &["-c", "import prometheus_client"],
        "pip install prometheus-client",
    );
    let text = exposition_of_every_kind(xce_agent::metrics::ExpositionFormat::PrometheusText);
    check_with_python_parser(&text, Parser::Prometheus);
}

#[test]
#[ignore = "needs python3 with prometheus_client; CI runs it with `cargo test -- --ignored`"]
fn the_openmetrics_exposition_parses_with_the_reference_openmetrics_parser() {
    common::require_tool(
        "python3",
        &["-c", "import prometheus_client"],
        "pip install prometheus-client",
    );
    let text = exposition_of_every_kind(xce_agent::metrics::ExpositionFormat::OpenMetrics);
    assert!(text.ends_with("# EOF\n"), "{text}");
    check_with_python_parser(&text, Parser::OpenMetrics);
}

/// Parse the exposition with the reference Python client's parser (Prometheus text or
/// OpenMetrics), which rejects malformed lines, bad escapes and inconsistent histograms.
fn check_with_python_parser(text: &str, parser: Parser) {
    const SCRIPT: &str = r#"
import sys
if sys.argv[1] == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
for f in fams.values():
    if f.type == "histogram":
        for s in f.samples:
            if s.name.endswith("_bucket") and s.value < 0:
                raise SystemExit("negative bucket")
need = ["xce_resource_value", "xce_resource_status", "xce_probe_runs", "xce_probe_duration_seconds", "xce_link_bytes_sent", "xce_link_state"]
missing = [n for n in need if n not in fams]
if missing:
    raise SystemExit("missing families: %s" % missing)
print(len(fams))
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(match parser {
            Parser::Prometheus => "prometheus",
            Parser::OpenMetrics => "openmetrics",
        })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("write to python");
    }
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "prometheus_client rejected the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// docs/metrics.md's table and the exposition name the same metrics: a metric added without
/// its row, or a row left after its metric went, fails here.
#[test]
fn every_metric_is_documented() {
    let text = exposition_of_every_kind(xce_agent::metrics::ExpositionFormat::PrometheusText);
    let exposed: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("docs/metrics.md");
    let documented: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    let undocumented: Vec<&String> = exposed.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
    // The ones this exposition has no source for (no cgroup, no TLS): documented all the same.
    let only_sometimes = [
        "xce_probe_cpu_seconds_total",
        "xce_probe_memory_peak_bytes",
        "xce_tls_cert_not_after_timestamp_seconds",
        "xce_link_down_since_timestamp_seconds",
        "xce_link_last_error_timestamp_seconds",
    ];
    let stale: Vec<&String> = documented
        .difference(&exposed)
        .filter(|n| !only_sometimes.contains(&n.as_str()))
        .collect();
    assert!(stale.is_empty(), "documented but not exposed: {stale:?}");
}
