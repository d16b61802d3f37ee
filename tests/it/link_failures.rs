//! Link failures named in the admin's words, through the real binary and real TLS: a TLS
//! agent against a plaintext `listen`, a plaintext agent against a TLS one, a controller
//! certificate from another CA, and a controller that goes away and comes back. Each is
//! asserted where the admin looks: the agent's log, `status` (table and JSON), and for the
//! mismatches the listener's log too.

use std::path::Path;

use crate::support::tls::Pki;
use crate::support::{status, wait_status, AgentProc, ListenProc, Site};
use xce_agent::config::agent::TlsPaths;
use xce_agent::status::StatusReport;

const LEVEL: &str = "resources:\n  - name: level\n    valtype: numeric\n    interval: 1\n    \
                     probe: {kind: exec, command: [level.sh]}\n";

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A site reporting `level` (always 7) to `controller`, over TLS with `tls`, else in
/// plaintext (said in words); its status socket is `status.sock` in the site.
fn site(controller: &str, tls: Option<&TlsPaths>) -> Site {
    let site = Site::new(&[], LEVEL);
    site.script("level.sh", "#!/bin/sh\necho 7\n");
    let link = match tls {
        Some(t) => format!(
            "tls:\n  ca: {}\n  cert: {}\n  key: {}\n",
            s(&t.ca),
            s(&t.cert),
            s(&t.key)
        ),
        None => "insecure_plaintext: true\n".to_owned(),
    };
    std::fs::write(
        site.agent_yaml(),
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\nrun_as: root\n\
             controllers: [\"{controller}\"]\nstatus_socket: status.sock\n{link}",
            site.path().display()
        ),
    )
    .expect("write agent.yaml");
    site
}

fn reason_is(r: &StatusReport, reason: &str) -> bool {
    r.link
        .last_error
        .as_ref()
        .is_some_and(|e| e.reason == reason)
}

/// What no admin should have to read: library URLs, capnp's and rustls' own words.
fn assert_no_library_words(log: &str) {
    for bad in [
        "https://",
        "Too many segments",
        "tls handshake eof",
        "Premature end of file",
        "close_notify",
        "InvalidContentType",
    ] {
        assert!(!log.contains(bad), "{bad:?} in the agent log:\n{log}");
    }
}

fn tls_listen(pki: &Pki, ctl: &crate::support::tls::Files, addr: &str) -> ListenProc {
    ListenProc::spawn_at(
        addr,
        &[
            "--tls-ca",
            s(&pki.ca),
            "--tls-cert",
            s(&ctl.cert),
            "--tls-key",
            s(&ctl.key),
        ],
    )
}

#[tokio::test]
async fn a_tls_agent_is_told_that_a_plaintext_controller_does_not_speak_tls() {
    let mut pki = Pki::new("site-ca");
    let node = pki.issue(&["node001"]);
    let mut listen = ListenProc::spawn();
    let controller = listen.addr.to_string();
    let site = site(&controller, Some(&pki.paths(&node)));
    let mut agent: AgentProc = site.spawn_agent();

    let said = format!(
        "the controller at {controller} does not speak TLS (it answered this agent's TLS hello with something else): is it running with --insecure / without tls?"
    );
    agent.wait_log(&said, 1).await;
    listen.next_err_matching("speaks TLS but this listener does not (--insecure)");
    let (report, code) = wait_status(&site, "the mismatch in status", |r| {
        reason_is(r, "controller_not_tls")
    })
    .await;
    assert_eq!(code, 1, "the link is down");
    let e = report.link.last_error.as_ref().expect("last error");
    assert_eq!(e.message, said);
    assert_eq!(e.controller, controller);
    assert!(report.link.down_since_ms.is_some(), "{:?}", report.link);
    assert!(report.link.attempts >= 1, "{:?}", report.link);
    let (_, table, _) = status(&site, &[]);
    assert!(table.contains("LINK  down since "), "{table}");
    assert!(
        table.contains("last error ") && table.contains(&said),
        "{table}"
    );
    assert_no_library_words(&agent.log_text());
}

#[tokio::test]
async fn a_plaintext_agent_is_told_that_the_controller_uses_tls() {
    let mut pki = Pki::new("site-ca");
    let ctl = pki.issue(&["localhost"]);
    let mut listen = tls_listen(&pki, &ctl, "127.0.0.1:0");
    let controller = listen.addr.to_string();
    let site = site(&controller, None);
    let mut agent = site.spawn_agent();

    let said = format!(
        "this agent is not using TLS but the controller at {controller} is (configure tls: in agent.yaml)"
    );
    agent.wait_log(&said, 1).await;
    listen.next_err_matching(
        "is not using TLS but this listener is (configure tls: in its agent.yaml",
    );
    let (report, code) = wait_status(&site, "the mismatch in status", |r| {
        reason_is(r, "agent_not_tls")
    })
    .await;
    assert_eq!(code, 1);
    assert_eq!(
        report.link.last_error.as_ref().expect("error").message,
        said
    );
    assert!(report.link.down_since_ms.is_some(), "{:?}", report.link);
    let (_, table, _) = status(&site, &[]);
    assert!(table.contains(&said), "{table}");
    assert_no_library_words(&agent.log_text());
}

#[tokio::test]
async fn a_controller_certificate_from_another_ca_asks_whether_tls_ca_is_the_right_one() {
    let mut real = Pki::new("site-ca");
    let ctl = real.issue(&["localhost"]);
    // A second CA with the same subject, as a second `tls init` used to make.
    let mut other = Pki::new("site-ca");
    let node = other.issue(&["node001"]);
    let listen = tls_listen(&real, &ctl, "127.0.0.1:0");
    let controller = format!("localhost:{}", listen.addr.port());
    let site = site(&controller, Some(&other.paths(&node)));
    let mut agent = site.spawn_agent();

    let said = format!(
        "the certificate of the controller at {controller} is not signed by the CA in tls.ca ({}): is tls.ca the CA that signed localhost's certificate?",
        other.ca.display()
    );
    agent.wait_log(&said, 1).await;
    let (report, code) = wait_status(&site, "unknown_ca in status", |r| {
        reason_is(r, "unknown_ca")
    })
    .await;
    assert_eq!(code, 1);
    assert_eq!(
        report.link.last_error.as_ref().expect("error").message,
        said
    );
    let (_, table, _) = status(&site, &[]);
    assert!(table.contains(&said), "{table}");
    assert_no_library_words(&agent.log_text());
}

#[tokio::test]
async fn a_controller_that_goes_away_and_comes_back_is_one_outage_not_a_tls_error() {
    let mut pki = Pki::new("site-ca");
    let ctl = pki.issue(&["localhost"]);
    let node = pki.issue(&["node001"]);
    let mut listen = tls_listen(&pki, &ctl, "127.0.0.1:0");
    let port = listen.addr.port();
    let controller = format!("localhost:{port}");
    let site = site(&controller, Some(&pki.paths(&node)));
    let mut agent = site.spawn_agent();
    listen.next_json(|v| v["event"] == "hello" && v["host"] == "node001");
    let (up, code) = wait_status(&site, "the link up", |r| r.link.state == "connected").await;
    assert_eq!(code, 0);
    assert_eq!(up.link.down_since_ms, None);
    assert_eq!(up.link.attempts, 0);

    // The controller stops (it says close_notify): the agent says so, in no TLS words.
    listen.terminate_and_collect();
    drop(listen);
    let closed =
        format!("the controller at {controller} closed the connection (restarted or stopped?)");
    agent.wait_log(&closed, 1).await;

    // Down since the stop, through every retry; the attempts count up; the last error is
    // the retries' own.
    let (first, _) = wait_status(&site, "two attempts", |r| r.link.attempts >= 2).await;
    let since = first.link.down_since_ms.expect("down since");
    let (later, code) = wait_status(&site, "more attempts", |r| {
        r.link.attempts > first.link.attempts
    })
    .await;
    assert_eq!(code, 1);
    assert_eq!(later.link.down_since_ms, Some(since), "reset by a retry");
    let e = later.link.last_error.as_ref().expect("last error");
    assert_eq!(e.reason, "unreachable", "{e:?}");
    assert!(
        e.message.contains(&format!(
            "the controller at {controller} refused the connection: nothing listens there"
        )),
        "{e:?}"
    );
    let (_, table, _) = status(&site, &[]);
    assert!(table.contains("LINK  down since "), "{table}");
    assert!(table.contains(" attempts ("), "{table}");
    assert!(table.contains("refused the connection"), "{table}");

    // Back on its port: one outage ended.
    let mut back = tls_listen(&pki, &ctl, &format!("127.0.0.1:{port}"));
    back.next_json(|v| v["event"] == "hello" && v["host"] == "node001");
    let (up, _) = wait_status(&site, "the link up again", |r| r.link.state == "connected").await;
    assert_eq!(up.link.down_since_ms, None);
    assert_eq!(up.link.attempts, 0);
    assert_eq!(
        up.link.last_error.as_ref().map(|e| e.reason.as_str()),
        Some("unreachable"),
        "the last failure stays visible"
    );
    let log = agent.log_text();
    assert_no_library_words(&log);
    for line in log.lines().filter(|l| l.contains("closed the connection")) {
        assert!(!line.contains("TLS"), "a stop is not a TLS error: {line}");
    }
    assert!(agent.terminate().await.success());
}
