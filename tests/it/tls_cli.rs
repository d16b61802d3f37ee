//! TLS through the real binary: `xce-agent tls init/issue`, an agent streaming to
//! `xce-agent listen` over TLS and rotating its certificate on SIGHUP, plaintext refused
//! unless said in words, `check` on key material, and the `openssl` CLI as the independent
//! peer (s_server standing in for a C controller, s_client against listen).

use crate::support as link_common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::support::tls::*;
use crate::support::*;
use xce_agent::link::tls::Failure;

fn xce(args: &[&str]) -> std::process::Output {
    Command::new(agent_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run xce-agent")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `tls init` + `tls issue` for node001 and localhost (the controller the agent dials).
fn cluster_ca(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = dir.join("ca");
    let out = dir.join("hosts");
    let o = xce(&["tls", "init", s(&ca)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = xce(&[
        "tls",
        "issue",
        "--ca",
        s(&ca),
        "--out",
        s(&out),
        "node001",
        "localhost",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    (ca, out)
}

fn tls_agent_yaml(site: &Site, controller: &str, ca: &Path, cert: &Path, key: &Path) {
    std::fs::write(
        site.agent_yaml(),
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\nrun_as: root\n\
             controllers: [\"{controller}\"]\ntls:\n  ca: {}\n  cert: {}\n  key: {}\n",
            site.path().display(),
            ca.display(),
            cert.display(),
            key.display()
        ),
    )
    .expect("write agent.yaml");
}

const LEVEL: &str = "resources:\n  - name: level\n    valtype: numeric\n    interval: 1\n    \
                     probe: {kind: exec, command: [level.sh]}\n";

#[test]
fn tls_init_and_issue_make_a_ca_and_host_certificates_that_openssl_accepts() {
    if !openssl_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca");
    let out = dir.path().join("out");
    let o = xce(&["tls", "init", s(&ca)]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(mode(&ca), 0o700);
    assert_eq!(mode(&ca.join("ca.key")), 0o600);
    let again = xce(&["tls", "init", s(&ca)]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again).contains("a CA is already there"),
        "{}",
        text(&again)
    );

    let o = xce(&[
        "tls",
        "issue",
        "--ca",
        s(&ca),
        "--out",
        s(&out),
        "--domain",
        "cluster.example",
        "--days",
        "30",
        "node[001-003]",
        "ctl1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    for host in ["node001", "node002", "node003", "ctl1"] {
        let cert = out.join(format!("{host}.pem"));
        assert_eq!(mode(&out.join(format!("{host}.key"))), 0o600);
        let verify = Command::new("openssl")
            .args(["verify", "-CAfile", s(&ca.join("ca.pem")), s(&cert)])
            .output()
            .expect("openssl verify");
        assert!(verify.status.success(), "{}", text(&verify));
        let sans = Command::new("openssl")
            .args([
                "x509",
                "-noout",
                "-ext",
                "subjectAltName,extendedKeyUsage",
                "-in",
                s(&cert),
            ])
            .output()
            .expect("openssl x509");
        let sans = text(&sans);
        assert!(
            sans.contains(&format!("DNS:{host}, DNS:{host}.cluster.example")),
            "{sans}"
        );
        assert!(sans.contains("TLS Web Server Authentication"), "{sans}");
        assert!(sans.contains("TLS Web Client Authentication"), "{sans}");
    }

    let bad = xce(&[
        "tls",
        "issue",
        "--ca",
        s(&ca),
        "--out",
        s(&out),
        "node[3-1]",
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("node[3-1]"), "{}", text(&bad));
    let no_ca = xce(&["tls", "issue", "--ca", s(&out), "--out", s(&out), "node1"]);
    assert_eq!(no_ca.status.code(), Some(2));
    assert!(text(&no_ca).contains("ca.pem"), "{}", text(&no_ca));
}

#[tokio::test]
async fn an_agent_streams_to_listen_over_tls_and_rotates_its_certificate_on_sighup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, hosts) = cluster_ca(dir.path());
    let ca_pem = ca.join("ca.pem");
    let mut listen = ListenProc::spawn_with(&[
        "--tls-ca",
        s(&ca_pem),
        "--tls-cert",
        s(&hosts.join("localhost.pem")),
        "--tls-key",
        s(&hosts.join("localhost.key")),
    ]);
    let site = Site::new(&[], LEVEL);
    site.script("level.sh", "#!/bin/sh\necho 7\n");
    let controller = format!("localhost:{}", listen.addr.port());
    let cert = hosts.join("node001.pem");
    let key = hosts.join("node001.key");
    tls_agent_yaml(&site, &controller, &ca_pem, &cert, &key);

    let check = xce(&["check", "--config", s(&site.agent_yaml())]);
    let report = text(&check);
    assert!(check.status.success(), "{report}");
    assert!(report.contains("subject \"CN=node001\""), "{report}");
    assert!(report.contains("SANs [node001]"), "{report}");
    assert!(report.contains("issuer \"CN=xce cluster CA "), "{report}");
    assert!(
        report.contains("expires 20") && report.contains(" days)"),
        "{report}"
    );

    let mut agent = site.spawn_agent();
    listen.next_json(|v| v["event"] == "hello" && v["host"] == "node001");
    listen.next_json(|v| v["event"] == "resval" && v["name"] == "level" && v["value"] == 7.0);

    // Rotation: a new certificate and key in place, then SIGHUP.
    let o = xce(&[
        "tls",
        "issue",
        "--ca",
        s(&ca),
        "--out",
        s(&hosts),
        "node001",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    agent.wait_log("TLS key material changed", 1).await;
    listen.next_json(|v| v["event"] == "hello" && v["host"] == "node001");
    listen.next_json(|v| v["event"] == "resval" && v["name"] == "level" && v["full"] == true);

    // Material for another host: the controller would refuse it, so the reload is refused
    // with the reason and the working link keeps going.
    let elsewhere = dir.path().join("elsewhere");
    let o = xce(&[
        "tls",
        "issue",
        "--ca",
        s(&ca),
        "--out",
        s(&elsewhere),
        "node002",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (good_cert, good_key) = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    std::fs::copy(elsewhere.join("node002.pem"), &cert).expect("copy cert");
    std::fs::copy(elsewhere.join("node002.key"), &key).expect("copy key");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    agent.wait_log("not this host \"node001\"", 1).await;
    std::fs::write(&cert, good_cert).expect("restore cert");
    std::fs::write(&key, good_key).expect("restore key");
    agent.assert_alive();

    // A key that became readable by others: the reload is refused, the link keeps going.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    agent.wait_log("chmod 600", 1).await;
    agent.assert_alive();
    assert_eq!(
        agent.log_text().matches("TLS key material changed").count(),
        1
    );
    assert!(agent.terminate().await.success());
    listen.assert_alive();
}

#[test]
fn plaintext_is_refused_unless_said_in_words() {
    let o = xce(&["listen", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("refusing to listen in plaintext"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("--insecure"), "{}", text(&o));

    let site = Site::new(&[], LEVEL);
    std::fs::write(
        site.agent_yaml(),
        "host: node001\nresources: resources.yaml\ncontrollers: [\"ctl1\"]\n",
    )
    .expect("write");
    let o = xce(&["check", "--config", s(&site.agent_yaml())]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("agent.yaml:3:15: controllers are listed but there is no tls: section"),
        "{}",
        text(&o)
    );

    std::fs::write(
        site.agent_yaml(),
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\ncontrollers: [\"ctl1\"]\ninsecure_plaintext: true\n",
            site.path().display()
        ),
    )
    .expect("write");
    site.script("level.sh", "#!/bin/sh\necho 7\n");
    let o = xce(&["check", "--config", s(&site.agent_yaml())]);
    assert!(
        text(&o).contains("WARNING: insecure_plaintext: true"),
        "{}",
        text(&o)
    );

    let o = xce(&["listen", "127.0.0.1:0", "--insecure", "--tls-ca", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[tokio::test]
async fn check_fails_on_an_expired_certificate_or_an_open_key_and_warns_before_expiry() {
    let mut pki = Pki::new("cluster-ca");
    let site = Site::new(&[], LEVEL);
    site.script("level.sh", "#!/bin/sh\necho 7\n");
    let ca = pki.ca.clone();
    let run = |f: &Files| {
        tls_agent_yaml(&site, "ctl1", &ca, &f.cert, &f.key);
        xce(&["check", "--config", s(&site.agent_yaml())])
    };
    let soon = pki.issue_valid(&["node001"], -1, 5);
    let o = run(&soon);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("WARNING:") && text(&o).contains("renew it"),
        "{}",
        text(&o)
    );

    // The warning window is agent.yaml's tls.expiry_warning (30 days unless set).
    let within_default = pki.issue_valid(&["node001"], -1, 20);
    let o = run(&within_default);
    assert!(
        o.status.success() && text(&o).contains("renew it"),
        "{}",
        text(&o)
    );
    let later = pki.issue_valid(&["node001"], -1, 40);
    let o = run(&later);
    assert!(
        o.status.success() && !text(&o).contains("renew it"),
        "{}",
        text(&o)
    );
    let yaml = std::fs::read_to_string(site.agent_yaml()).unwrap();
    std::fs::write(site.agent_yaml(), format!("{yaml}  expiry_warning: 45d\n")).unwrap();
    let o = xce(&["check", "--config", s(&site.agent_yaml())]);
    assert!(
        o.status.success() && text(&o).contains("renew it"),
        "{}",
        text(&o)
    );

    // A certificate for another host: check names both (exit 1), and the daemon refuses to
    // start on it, with the fix (docs/security.md).
    let other_host = pki.issue(&["node002"]);
    let o = run(&other_host);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("names [node002], not this host \"node001\""),
        "{}",
        text(&o)
    );
    let daemon = || {
        Command::new(agent_bin())
            .args(["--config", s(&site.agent_yaml())])
            .stdin(Stdio::null())
            .output()
            .expect("run")
    };

    let o = daemon();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("not this host \"node001\"")
            && text(&o).contains("xce-agent tls issue ... node001"),
        "{}",
        text(&o)
    );

    let expired = pki.issue_valid(&["node001"], -30, -2);
    let o = run(&expired);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // ... and the daemon refuses to start on it, saying so (not a TLS error in a loop).
    let o = daemon();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("this host's certificate expired on"),
        "{}",
        text(&o)
    );
    let o = run(&expired);
    assert!(
        text(&o).contains("PROBLEM:") && text(&o).contains("expired on"),
        "{}",
        text(&o)
    );

    let open = pki.issue(&["node001"]);
    std::fs::set_permissions(&open.key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let o = run(&open);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("chmod 600 {}", open.key.display())),
        "{}",
        text(&o)
    );

    let other = pki.issue(&["node002"]);
    let mismatched = Files {
        cert: soon.cert.clone(),
        key: other.key.clone(),
    };
    let o = run(&mismatched);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("does not match the certificate"),
        "{}",
        text(&o)
    );

    // The daemon refuses to start on the same key material.
    let o = Command::new(agent_bin())
        .args(["--config", s(&site.agent_yaml())])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("does not match the certificate"),
        "{}",
        text(&o)
    );
}

/// Issue 39, item 1, with a site PKI made by openssl: `check` fails (exit 1) on a host
/// certificate from another CA (even one of the same name), on one for another host and on a
/// key that is not the certificate's, each with the fix; the daemon refuses to start on
/// each, as docs/security.md says.
#[test]
fn check_and_the_daemon_refuse_another_cas_certificate_another_hosts_and_a_stranger_key() {
    if !openssl_available() {
        return;
    }
    let site_pki = tempfile::tempdir().expect("tempdir");
    let other_pki = tempfile::tempdir().expect("tempdir");
    openssl_pki(
        site_pki.path(),
        &[("node001", "DNS:node001"), ("node002", "DNS:node002")],
    );
    openssl_pki(other_pki.path(), &[("node001", "DNS:node001")]);
    let site = Site::new(&[], LEVEL);
    site.script("level.sh", "#!/bin/sh\necho 7\n");
    let ours = openssl_paths(site_pki.path(), "node001");
    // Each of these makes the daemon exit at once; a usable one would run until stopped.
    let check_and_start = |cert: &Path, key: &Path| {
        tls_agent_yaml(&site, "ctl1", &ours.ca, cert, key);
        let check = xce(&["check", "--config", s(&site.agent_yaml())]);
        let daemon = Command::new(agent_bin())
            .args(["--config", s(&site.agent_yaml())])
            .stdin(Stdio::null())
            .output()
            .expect("run");
        (check, daemon)
    };

    tls_agent_yaml(&site, "ctl1", &ours.ca, &ours.cert, &ours.key);
    let check = xce(&["check", "--config", s(&site.agent_yaml())]);
    assert!(check.status.success(), "{}", text(&check));
    assert!(!text(&check).contains("PROBLEM"), "{}", text(&check));

    // Another CA's certificate, its issuer named "site CA" as ours is.
    let theirs = openssl_paths(other_pki.path(), "node001");
    let (check, daemon) = check_and_start(&theirs.cert, &theirs.key);
    for o in [&check, &daemon] {
        let t = text(o);
        assert!(
            t.contains(&format!(
                "does not chain to the CA in {}",
                ours.ca.display()
            )) && t.contains("point tls.ca at the CA that issued it"),
            "{t}"
        );
    }
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    assert_eq!(daemon.status.code(), Some(2), "{}", text(&daemon));

    let node002 = openssl_paths(site_pki.path(), "node002");
    let (check, daemon) = check_and_start(&node002.cert, &node002.key);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    assert_eq!(daemon.status.code(), Some(2), "{}", text(&daemon));
    for o in [&check, &daemon] {
        assert!(
            text(o).contains("names [node002], not this host \"node001\""),
            "{}",
            text(o)
        );
    }

    let (check, daemon) = check_and_start(&ours.cert, &node002.key);
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    assert_eq!(daemon.status.code(), Some(2), "{}", text(&daemon));
    for o in [&check, &daemon] {
        assert!(
            text(o).contains("does not match the certificate"),
            "{}",
            text(o)
        );
    }
}

/// `sh -c 'exec openssl ARGS 2>&1'`: both streams as lines on one channel.
struct OpensslProc {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl OpensslProc {
    fn spawn(dir: &Path, args: &[&str], stdin: Stdio) -> Self {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec openssl {} 2>&1", args.join(" ")))
            .current_dir(dir)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn openssl");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).split(b'\n') {
                let Ok(line) = line else { break };
                if tx
                    .send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    fn wait_line(&self, needle: &str) -> String {
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(HANG_GUARD) {
                Ok(l) if l.contains(needle) => return l,
                Ok(l) => seen.push(l),
                Err(e) => panic!("openssl printed no line with {needle:?} ({e}): {seen:#?}"),
            }
        }
    }
}

impl Drop for OpensslProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// Multi-threaded: the test thread blocks on openssl's output while the link task runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_s_server_as_the_controller_verifies_the_agents_certificate() {
    if !openssl_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    openssl_pki(
        dir.path(),
        &[
            ("ctl", "IP:127.0.0.1"),
            ("node001", "DNS:node001.cluster.example"),
        ],
    );
    let server = OpensslProc::spawn(
        dir.path(),
        &[
            "s_server",
            "-accept",
            "127.0.0.1:0",
            "-tls1_3",
            "-Verify",
            "1",
            "-verify_return_error",
            "-CAfile",
            "ca.pem",
            "-cert",
            "ctl.pem",
            "-key",
            "ctl.key",
        ],
        Stdio::piped(),
    );
    let accept = server.wait_line("ACCEPT");
    let addr = accept.rsplit(' ').next().expect("address").to_owned();
    let store = link_common::store_with(&[("scratch", "", xce_agent::value::Valtype::Numeric)]);
    let material = material(&openssl_paths(dir.path(), "node001"));
    let cfg = xce_agent::link::client::LinkConfig {
        tls: Some(material.client_config().expect("client config")),
        ..link_common::fast_config(vec![addr])
    };
    let agent = link_common::Agent::start(cfg, Arc::clone(&store));
    server.wait_line("CN = node001");
    // What s_server prints after the handshake is what the agent sent, decrypted.
    server.wait_line("scratch");
    assert_eq!(agent.stats.tls_failures(Failure::UnknownCa), 0);
    agent.stop().await;
}

#[test]
fn openssl_s_client_against_listen_needs_a_client_certificate() {
    if !openssl_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    openssl_pki(
        dir.path(),
        &[("ctl", "IP:127.0.0.1"), ("node001", "DNS:node001")],
    );
    let p = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
    let mut listen = ListenProc::spawn_with(&[
        "--tls-ca",
        &p("ca.pem"),
        "--tls-cert",
        &p("ctl.pem"),
        "--tls-key",
        &p("ctl.key"),
    ]);
    let target = listen.addr.to_string();

    let with_cert = OpensslProc::spawn(
        dir.path(),
        &[
            "s_client",
            "-connect",
            &target,
            "-tls1_3",
            "-CAfile",
            "ca.pem",
            "-verify_return_error",
            "-cert",
            "node001.pem",
            "-key",
            "node001.key",
        ],
        Stdio::null(),
    );
    with_cert.wait_line("Verify return code: 0 (ok)");
    listen.next_json(|v| v["event"] == "connect");
    drop(with_cert);

    let without = OpensslProc::spawn(
        dir.path(),
        &[
            "s_client", "-connect", &target, "-tls1_3", "-CAfile", "ca.pem",
        ],
        Stdio::piped(),
    );
    let line = listen.next_err_matching("TLS handshake failed");
    assert!(line.contains("no_certificate"), "{line}");
    drop(without);
    listen.assert_alive();
}

/// Two CAs made by `tls init` never share a subject (a certificate from the wrong one then
/// names another issuer instead of failing as a bad signature from "the same" CA), and a
/// certificate valid for 0 days is refused before anything is written.
#[test]
fn each_ca_has_its_own_subject_and_zero_days_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let subject = |name: &str| {
        let ca = dir.path().join(name);
        let o = xce(&["tls", "init", s(&ca)]);
        assert!(o.status.success(), "{}", text(&o));
        let pem = std::fs::read(ca.join("ca.pem")).expect("ca.pem");
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("pem");
        let cert = pem.parse_x509().expect("x509");
        cert.subject().to_string()
    };
    let (one, two) = (subject("one"), subject("two"));
    assert!(one.starts_with("CN=xce cluster CA "), "{one}");
    assert_ne!(one, two);
    for args in [
        vec!["tls", "init", "--days", "0"],
        vec![
            "tls", "issue", "--ca", "x", "--out", "y", "--days", "0", "node001",
        ],
    ] {
        let zero = dir.path().join("zero");
        let mut args = args;
        if args[1] == "init" {
            args.push(s(&zero));
        }
        let o = xce(&args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("--days"), "{}", text(&o));
        assert!(!zero.exists());
    }
}
