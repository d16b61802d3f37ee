//! Mutual TLS on the link, through the library: the agent's link task and the reference
//! receiver on 127.0.0.1, with certificates from a test CA. Each bad input is refused with
//! its reason counted (agent) or reported (receiver), and nothing crashes.

use std::sync::Arc;
use std::time::Duration;

use crate::support::tls::*;
use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xce_agent::link::client::LinkConfig;
use xce_agent::link::tls::{self, Failure};
use xce_agent::receiver::session::{EventKind, ListenOpts, Reason};
use xce_agent::value::{Valtype, Value};

fn tls_config(controller: String, client: Arc<rustls::ClientConfig>) -> LinkConfig {
    LinkConfig {
        tls: Some(client),
        ..fast_config(vec![controller])
    }
}

fn tls_listen(server: Arc<rustls::ServerConfig>) -> ListenOpts {
    ListenOpts {
        tls: Some(server),
        ..ListenOpts::default()
    }
}

/// A CA, a controller certificate for 127.0.0.1 and a node001 certificate.
struct Site {
    pki: Pki,
    ctl: Files,
    node: Files,
}

impl Site {
    fn new() -> Self {
        let mut pki = Pki::new("cluster-ca");
        let ctl = pki.issue(&["127.0.0.1", "ctl1"]);
        let node = pki.issue(&["node001", "node001.cluster.example"]);
        Self { pki, ctl, node }
    }

    fn server(&self) -> Arc<rustls::ServerConfig> {
        server(&self.pki.paths(&self.ctl))
    }

    fn client(&self) -> Arc<rustls::ClientConfig> {
        client(&self.pki.paths(&self.node))
    }
}

/// The next `Closed(Some(..))` the receiver reports; its reason.
async fn next_refusal(ctl: &mut Controller) -> String {
    loop {
        match ctl.next().await.kind {
            EventKind::Closed(Some(e)) => return e,
            EventKind::Batch { batch, .. } => panic!("accepted a batch: {batch:?}"),
            _ => {}
        }
    }
}

/// Wait until the agent has counted `why` at least twice: refused, backed off, retried.
async fn wait_failures(agent: &Agent, why: Failure) {
    wait_until(&format!("two {} failures", why.as_str()), || {
        agent.stats.tls_failures(why) >= 2
    })
    .await;
    assert!(!agent.task.is_finished(), "the link task ended");
}

#[tokio::test]
async fn an_agent_with_its_own_certificate_streams_and_no_name_is_readable_on_the_wire() {
    let site = Site::new();
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    // A relay in between records what crosses the wire.
    let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let relay_addr = relay.local_addr().expect("addr");
    let upstream = ctl.addr;
    let wire = tokio::spawn(async move {
        let (mut agent_side, _) = relay.accept().await.expect("accept");
        let mut ctl_side = TcpStream::connect(upstream).await.expect("connect");
        let mut seen = Vec::new();
        let (mut up, mut down) = ([0u8; 4096], [0u8; 4096]);
        loop {
            tokio::select! {
                r = agent_side.read(&mut up) => {
                    let n = r.unwrap_or(0);
                    if n == 0 { break; }
                    seen.extend_from_slice(&up[..n]);
                    if ctl_side.write_all(&up[..n]).await.is_err() { break; }
                }
                r = ctl_side.read(&mut down) => {
                    let n = r.unwrap_or(0);
                    if n == 0 || agent_side.write_all(&down[..n]).await.is_err() { break; }
                }
            }
        }
        seen
    });
    let store = store_with(&[("scratch_free_gb", "", Valtype::Numeric)]);
    record(&store, "scratch_free_gb", Value::Numeric(41.0));
    let cfg = tls_config(format!("127.0.0.1:{}", relay_addr.port()), site.client());
    let agent = Agent::start(cfg, Arc::clone(&store));
    let (hello, snapshot) = ctl.next_hello_and_snapshot().await;
    assert_eq!(hello.host, "node001");
    assert_eq!(snapshot.resvals[0].value, Value::Numeric(41.0));
    record(&store, "scratch_free_gb", Value::Numeric(40.0));
    assert_eq!(
        ctl.next_batch().await.resvals[0].value,
        Value::Numeric(40.0)
    );
    agent.stop().await;
    let seen = guard("the relay to finish", wire).await.expect("relay");
    assert!(seen.len() > 200, "too few bytes relayed: {}", seen.len());
    for needle in [&b"scratch_free_gb"[..], b"node001", b"boot-1"] {
        assert!(
            !seen.windows(needle.len()).any(|w| w == needle),
            "{:?} readable on the wire",
            String::from_utf8_lossy(needle)
        );
    }
    ctl.stop().await;
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused_before_any_value() {
    let mut site = Site::new();
    let other = site.pki.issue(&["node002"]);
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let store = store_with(&[("x", "", Valtype::Numeric)]);
    let cfg = tls_config(ctl.addr.to_string(), client(&site.pki.paths(&other)));
    // The hello says node001 (link_common's hello); the certificate says node002.
    let agent = Agent::start(cfg, store);
    let why = next_refusal(&mut ctl).await;
    assert!(
        why.contains("node002") && why.contains("\"node001\""),
        "{why}"
    );
    assert!(why.contains("does not name"), "{why}");
    agent.stop().await;
    ctl.stop().await;
}

/// Identity is exact (issue 25, item 4): a SAN in another domain names no short host, and a
/// certificate naming only the FQDN speaks for the short name only inside a configured
/// cluster domain.
#[tokio::test]
async fn a_san_names_a_host_exactly_or_by_its_short_form_in_the_clusters_domain() {
    let mut site = Site::new();
    let cluster = |server| ListenOpts {
        domains: vec!["cluster.example".into()],
        ..tls_listen(server)
    };
    // The red team's certificates, the hello saying node001 (link_common's hello).
    for san in ["node001.evil", "node001.other.example"] {
        let evil = site.pki.issue(&[san]);
        let mut ctl = Controller::bind(cluster(site.server())).await;
        let cfg = tls_config(ctl.addr.to_string(), client(&site.pki.paths(&evil)));
        let agent = Agent::start(cfg, store_with(&[]));
        let why = next_refusal(&mut ctl).await;
        assert!(why.contains("does not name") && why.contains(san), "{why}");
        agent.stop().await;
        ctl.stop().await;
    }
    let fqdn = site.pki.issue(&["node001.cluster.example"]);
    // Without the domain configured, the FQDN does not name the short host...
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let cfg = tls_config(ctl.addr.to_string(), client(&site.pki.paths(&fqdn)));
    let agent = Agent::start(cfg, store_with(&[]));
    assert!(next_refusal(&mut ctl).await.contains("does not name"));
    agent.stop().await;
    ctl.stop().await;
    // ...with it, it does.
    let mut ctl = Controller::bind(cluster(site.server())).await;
    let cfg = tls_config(ctl.addr.to_string(), client(&site.pki.paths(&fqdn)));
    let agent = Agent::start(cfg, store_with(&[("x", "", Valtype::Numeric)]));
    let (hello, _) = ctl.next_hello_and_snapshot().await;
    assert_eq!(hello.host, "node001");
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn the_receiver_refuses_a_client_certificate_from_another_ca() {
    let site = Site::new();
    let mut rogue = Pki::new("rogue-ca");
    let node = rogue.issue(&["node001"]);
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    // The rogue trusts the real CA, so it gets as far as presenting its certificate.
    let mut paths = rogue.paths(&node);
    paths.ca = site.pki.ca.clone();
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), client(&paths)),
        store_with(&[]),
    );
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("unknown_ca"), "{why}");
    wait_failures(&agent, Failure::PeerRefused).await;
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn the_agent_refuses_a_controller_from_another_ca() {
    let site = Site::new();
    let mut rogue = Pki::new("rogue-ca");
    let fake = rogue.issue(&["127.0.0.1"]);
    let mut paths = rogue.paths(&fake);
    paths.ca = site.pki.ca.clone();
    let ctl = Controller::bind(tls_listen(server(&paths))).await;
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[]),
    );
    wait_failures(&agent, Failure::UnknownCa).await;
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn the_agent_refuses_a_controller_certificate_for_another_name() {
    let mut site = Site::new();
    let elsewhere = site.pki.issue(&["ctl9.example", "10.9.9.9"]);
    let ctl = Controller::bind(tls_listen(server(&site.pki.paths(&elsewhere)))).await;
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[]),
    );
    wait_failures(&agent, Failure::WrongName).await;
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn expired_certificates_are_refused_on_both_ends() {
    let mut site = Site::new();
    let old_ctl = site.pki.issue_valid(&["127.0.0.1"], -60, -1);
    let ctl = Controller::bind(tls_listen(server(&site.pki.paths(&old_ctl)))).await;
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[]),
    );
    wait_failures(&agent, Failure::Expired).await;
    agent.stop().await;
    ctl.stop().await;

    let old_node = site.pki.issue_valid(&["node001"], -60, -1);
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let cfg = tls_config(ctl.addr.to_string(), client(&site.pki.paths(&old_node)));
    let agent = Agent::start(cfg, store_with(&[]));
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("expired"), "{why}");
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn revoked_certificates_are_refused_on_both_ends() {
    let mut site = Site::new();
    let revoked_node = site.pki.issue(&["node001"]);
    let revoked_ctl = site.pki.issue(&["127.0.0.1"]);
    let crl = site
        .pki
        .crl(&[site.pki.next_serial() - 2, site.pki.next_serial() - 1]);

    let mut ctl_paths = site.pki.paths(&site.ctl);
    ctl_paths.crl = Some(crl.clone());
    let mut ctl = Controller::bind(tls_listen(server(&ctl_paths))).await;
    let cfg = tls_config(ctl.addr.to_string(), client(&site.pki.paths(&revoked_node)));
    let agent = Agent::start(cfg, store_with(&[]));
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("revoked"), "{why}");
    agent.stop().await;
    ctl.stop().await;

    let ctl = Controller::bind(tls_listen(server(&site.pki.paths(&revoked_ctl)))).await;
    let mut node_paths = site.pki.paths(&site.node);
    node_paths.crl = Some(crl);
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), client(&node_paths)),
        store_with(&[]),
    );
    wait_failures(&agent, Failure::Revoked).await;
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn a_plaintext_agent_is_refused_by_a_tls_receiver() {
    let site = Site::new();
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let agent = Agent::start(fast_config(vec![ctl.addr.to_string()]), store_with(&[]));
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("TLS handshake failed (not_tls)"), "{why}");
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn a_tls_agent_is_refused_by_a_plaintext_receiver_and_says_why() {
    let site = Site::new();
    let mut ctl = Controller::bind(ListenOpts::default()).await;
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[]),
    );
    // The receiver reads the ClientHello as a frame, answers bytes that are not TLS (so the
    // agent sees "not TLS", not a silent close) and drops it.
    next_refusal(&mut ctl).await;
    wait_failures(&agent, Failure::NotTls).await;
    let said = agent.stats.last_error().expect("an error").message;
    assert!(said.contains("does not speak TLS"), "{said}");
    agent.stop().await;
    ctl.stop().await;
}

/// A fake controller: accepts, lets `serve` do something to the connection, repeats.
async fn fake_controller<F, Fut>(serve: F) -> std::net::SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            serve(s).await;
        }
    });
    addr
}

#[tokio::test]
async fn the_agent_counts_garbage_truncated_and_stalled_handshakes_and_keeps_trying() {
    let site = Site::new();
    let garbage = fake_controller(|mut s| async move {
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
    })
    .await;
    let agent = Agent::start(
        tls_config(garbage.to_string(), site.client()),
        store_with(&[]),
    );
    wait_failures(&agent, Failure::NotTls).await;
    agent.stop().await;

    // Reads the ClientHello, answers half of a real ServerHello record header, and closes.
    let truncated = fake_controller(|mut s| async move {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(&[0x16, 0x03, 0x03, 0x00, 0x7a, 0x02]).await;
    })
    .await;
    let agent = Agent::start(
        tls_config(truncated.to_string(), site.client()),
        store_with(&[]),
    );
    wait_failures(&agent, Failure::Truncated).await;
    agent.stop().await;

    // Accepts and never answers: the handshake bound ends each attempt.
    let (hold_tx, hold_rx) = tokio::sync::mpsc::unbounded_channel::<TcpStream>();
    let stalled = fake_controller(move |s| {
        let hold = hold_tx.clone();
        async move {
            let _ = hold.send(s);
        }
    })
    .await;
    let cfg = LinkConfig {
        handshake_timeout: Duration::from_millis(50),
        ..tls_config(stalled.to_string(), site.client())
    };
    let agent = Agent::start(cfg, store_with(&[]));
    wait_failures(&agent, Failure::Timeout).await;
    agent.stop().await;
    drop(hold_rx);
}

#[tokio::test]
async fn the_receiver_drops_garbage_truncated_and_stalled_handshakes_and_serves_others() {
    let site = Site::new();
    let opts = ListenOpts {
        handshake_timeout: Some(Duration::from_millis(50)),
        ..tls_listen(site.server())
    };
    let mut ctl = Controller::bind(opts).await;

    let mut s = TcpStream::connect(ctl.addr).await.expect("connect");
    s.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64))
        .await
        .expect("write");
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("(not_tls)"), "{why}");

    // The first bytes of a TLS record header, then the end of the connection.
    let mut s = TcpStream::connect(ctl.addr).await.expect("connect");
    s.write_all(&[0x16, 0x03, 0x01, 0x01]).await.expect("write");
    s.shutdown().await.expect("shutdown");
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("(truncated)"), "{why}");

    let stalled = TcpStream::connect(ctl.addr).await.expect("connect");
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("(timeout)"), "{why}");
    drop(stalled);

    // A good agent is served after all of that.
    let store = store_with(&[("x", "", Valtype::Numeric)]);
    let agent = Agent::start(tls_config(ctl.addr.to_string(), site.client()), store);
    let (hello, _) = ctl.next_hello_and_snapshot().await;
    assert_eq!(hello.host, "node001");
    agent.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn a_second_connection_for_the_same_host_replaces_the_first() {
    let site = Site::new();
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let first = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[("x", "", Valtype::Numeric)]),
    );
    ctl.next_hello_and_snapshot().await;
    let second = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[("x", "", Valtype::Numeric)]),
    );
    let mut replaced = false;
    let mut second_hello = false;
    while !(replaced && second_hello) {
        match ctl.next().await.kind {
            EventKind::Closed(Some(e)) => {
                assert!(e.contains("newer connection"), "{e}");
                replaced = true;
            }
            EventKind::Hello(_) => second_hello = true,
            _ => {}
        }
    }
    first.stop().await;
    second.stop().await;
    ctl.stop().await;
}

#[test]
fn key_material_problems_are_named_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let mut site = Site::new();
    let paths = site.pki.paths(&site.node);

    std::fs::set_permissions(&paths.key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = tls::Material::load(&paths).unwrap_err().to_string();
    assert!(
        e.contains(&format!("chmod 600 {}", paths.key.display())),
        "{e}"
    );
    std::fs::set_permissions(&paths.key, std::fs::Permissions::from_mode(0o600)).unwrap();

    let other = site.pki.issue(&["node002"]);
    let mismatched = xce_agent::config::agent::TlsPaths {
        key: other.key.clone(),
        ..paths.clone()
    };
    let e = tls::Material::load(&mismatched).unwrap_err().to_string();
    assert!(e.contains("does not match the certificate"), "{e}");

    let not_pem = xce_agent::config::agent::TlsPaths {
        cert: site.pki.dir.path().join("not.pem"),
        ..paths.clone()
    };
    std::fs::write(&not_pem.cert, "hello\n").unwrap();
    let e = tls::Material::load(&not_pem).unwrap_err().to_string();
    assert!(e.contains("no certificate"), "{e}");

    let missing = xce_agent::config::agent::TlsPaths {
        ca: site.pki.dir.path().join("absent.pem"),
        ..paths.clone()
    };
    let e = tls::Material::load(&missing).unwrap_err().to_string();
    assert!(
        e.contains("absent.pem") && e.contains("No such file"),
        "{e}"
    );

    let bad_crl = xce_agent::config::agent::TlsPaths {
        crl: Some(site.pki.dir.path().join("bad.crl")),
        ..paths.clone()
    };
    std::fs::write(
        bad_crl.crl.as_ref().unwrap(),
        "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
    )
    .unwrap();
    let e = tls::Material::load(&bad_crl).unwrap_err().to_string();
    assert!(e.contains("bad.crl"), "{e}");
}

#[test]
fn metrics_show_tls_failures_by_reason_and_seconds_until_the_certificate_expires() {
    use std::sync::atomic::Ordering;
    let site = Site::new();
    let link = Arc::new(xce_agent::link::client::LinkStats::default());
    let not_after = material(&site.pki.paths(&site.node))
        .leaf_not_after()
        .expect("not_after");
    link.cert_not_after.store(not_after, Ordering::Relaxed);
    link.tls_failures[Failure::Revoked.index()].fetch_add(3, Ordering::Relaxed);
    let (_tx, probes) = tokio::sync::watch::channel(Arc::new(xce_agent::stats::Stats::default()));
    let registry = xce_agent::metrics::registry(xce_agent::metrics::Sources {
        store: Arc::new(xce_agent::store::Store::new()),
        link,
        probes,
        files: xce_agent::probe::file_reader::FileReads::new(32),
        loaded: tokio::sync::watch::channel(Default::default()).1,
        supervisor: xce_agent::probe::supervisor::Supervisor::uncontained(),
    });
    let text = xce_agent::metrics::render(
        &registry,
        xce_agent::metrics::ExpositionFormat::PrometheusText,
    );
    assert!(
        text.contains("xce_link_tls_failures_total{reason=\"revoked\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("xce_link_tls_failures_total{reason=\"unknown_ca\"} 0\n"),
        "{text}"
    );
    // A timestamp (alert on it minus time()), not a countdown frozen at the scrape.
    let expiry: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("xce_tls_cert_not_after_timestamp_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no expiry gauge in {text}"));
    assert_eq!(expiry, not_after, "{text}");
}

/// Issue 25, item 4: a CRL signed by another CA is refused when the key material is loaded
/// (it would revoke nothing), and revocation covers the whole chain: a certificate under a
/// revoked intermediate CA is refused.
#[tokio::test]
async fn a_crl_of_another_ca_is_refused_at_load_and_a_revoked_intermediate_is_refused() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
        ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
        RevocationReason, RevokedCertParams, SerialNumber,
    };
    use std::os::unix::fs::PermissionsExt;

    let site = Site::new();
    let mut other = Pki::new("other-ca");
    let mut paths = site.pki.paths(&site.ctl);
    paths.crl = Some(other.crl(&[1]));
    let err = xce_agent::link::tls::Material::load(&paths)
        .expect_err("another CA's CRL")
        .to_string();
    assert!(err.contains("is not signed by a CA in"), "{err}");

    // root -> intermediate (serial 2) -> node001; the root's CRL revokes the intermediate.
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, pem: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, pem).expect("write");
        if name.ends_with(".key") {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        p
    };
    let ca_params = |cn: &str, serial: u64| {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.serial_number = Some(SerialNumber::from(serial));
        p
    };
    let leaf_params = |sans: &[&str], serial: u64| {
        let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("params");
        p.distinguished_name.push(DnType::CommonName, sans[0]);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.serial_number = Some(SerialNumber::from(serial));
        p
    };
    let root_key = KeyPair::generate().expect("key");
    let root_params = ca_params("root-ca", 1);
    let root = root_params.self_signed(&root_key).expect("root");
    let root_issuer = Issuer::new(root_params, root_key);
    let mid_key = KeyPair::generate().expect("key");
    let mid_params = ca_params("intermediate-ca", 2);
    let mid = mid_params.signed_by(&mid_key, &root_issuer).expect("mid");
    let mid_issuer = Issuer::new(mid_params, mid_key);
    let ctl_key = KeyPair::generate().expect("key");
    let ctl = leaf_params(&["127.0.0.1"], 3)
        .signed_by(&ctl_key, &root_issuer)
        .expect("ctl");
    let node_key = KeyPair::generate().expect("key");
    let node = leaf_params(&["node001"], 4)
        .signed_by(&node_key, &mid_issuer)
        .expect("node");
    let now = time::OffsetDateTime::now_utc();
    let crl = CertificateRevocationListParams {
        this_update: now - time::Duration::hours(1),
        next_update: now + time::Duration::days(7),
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: vec![RevokedCertParams {
            serial_number: SerialNumber::from(2u64),
            revocation_time: now - time::Duration::minutes(5),
            reason_code: Some(RevocationReason::CaCompromise),
            invalidity_date: None,
        }],
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(&root_issuer)
    .expect("crl");
    let ca = write("root.pem", &root.pem());
    let server_paths = xce_agent::config::agent::TlsPaths {
        ca: ca.clone(),
        cert: write("ctl.pem", &ctl.pem()),
        key: write("ctl.key", &ctl_key.serialize_pem()),
        crl: Some(write("root.crl", &crl.pem().expect("pem"))),
    };
    let client_paths = xce_agent::config::agent::TlsPaths {
        ca,
        cert: write("node001.pem", &format!("{}{}", node.pem(), mid.pem())),
        key: write("node001.key", &node_key.serialize_pem()),
        crl: None,
    };
    let mut ctl = Controller::bind(tls_listen(server(&server_paths))).await;
    let cfg = tls_config(ctl.addr.to_string(), client(&client_paths));
    let agent = Agent::start(cfg, store_with(&[]));
    let why = next_refusal(&mut ctl).await;
    assert!(why.contains("revoked"), "{why}");
    agent.stop().await;
    ctl.stop().await;
}

/// The agent whose hello names `host` (its certificate is the site's node001 one).
fn agent_as(site: &Site, ctl: &Controller, host: &str) -> Agent {
    let agent = Agent::start(
        tls_config(ctl.addr.to_string(), site.client()),
        store_with(&[("x", "", Valtype::Numeric)]),
    );
    let mut hello = (**agent.hello.borrow()).clone();
    hello.host = host.to_owned();
    agent.hello.send_replace(Arc::new(hello));
    agent
}

#[tokio::test]
async fn one_certificate_is_at_most_one_live_host_whichever_name_its_hello_claims() {
    // No domain configured: node001 and node001.cluster.example are two names, but the
    // certificate naming both is one key, so its second session displaces the first.
    let site = Site::new();
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let first = agent_as(&site, &ctl, "node001");
    let (h, _) = ctl.next_hello_and_snapshot().await;
    assert_eq!(h.host, "node001");
    let second = agent_as(&site, &ctl, "node001.cluster.example");
    let mut displaced = None;
    let mut second_host = None;
    while displaced.is_none() || second_host.is_none() {
        let ev = ctl.next().await;
        match ev.kind {
            EventKind::Closed(Some(e)) => {
                assert_eq!(ev.host.as_deref(), Some("node001"));
                assert_eq!(ev.reason, Some(Reason::Displaced));
                displaced = Some(e);
            }
            EventKind::Hello(_) => second_host = ev.host.clone(),
            _ => {}
        }
    }
    let e = displaced.unwrap();
    assert!(e.contains("same certificate"), "{e}");
    assert_eq!(second_host.as_deref(), Some("node001.cluster.example"));
    first.stop().await;
    second.stop().await;
    ctl.stop().await;
}

#[tokio::test]
async fn a_host_has_one_canonical_name_lower_case_with_the_clusters_domain_folded() {
    let site = Site::new();
    let mut ctl = Controller::bind(ListenOpts {
        domains: vec!["cluster.example".into()],
        ..tls_listen(site.server())
    })
    .await;
    for spelling in ["NODE001", "Node001.Cluster.Example", "node001"] {
        let agent = agent_as(&site, &ctl, spelling);
        let host = loop {
            let ev = ctl.next().await;
            if let EventKind::Hello(_) = ev.kind {
                break ev.host;
            }
        };
        assert_eq!(host.as_deref(), Some("node001"), "{spelling}");
        agent.stop().await;
        while !matches!(ctl.next().await.kind, EventKind::Closed(_)) {}
    }
    ctl.stop().await;
}

#[tokio::test]
async fn an_agent_gone_without_close_notify_is_closed_not_a_protocol_error() {
    let site = Site::new();
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let tcp = TcpStream::connect(ctl.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(site.client())
        .connect(name, tcp)
        .await
        .expect("handshake");
    let store = store_with(&[("x", "", Valtype::Numeric)]);
    let hello = xce_agent::link::wire::Envelope::Hello(hello_for(&store));
    s.write_all(&xce_agent::link::wire::encode_envelope(&hello).unwrap())
        .await
        .unwrap();
    s.flush().await.unwrap();
    while !matches!(ctl.next().await.kind, EventKind::Hello(_)) {}
    // The verdict read (unread bytes would make the close a reset).
    let mut verdict = [0u8; 512];
    assert!(s.read(&mut verdict).await.unwrap() > 0);
    // As kill -9 or a power cut: the TCP stream ends without TLS close_notify.
    let (tcp, _) = s.into_inner();
    drop(tcp);
    let ev = loop {
        let ev = ctl.next().await;
        if matches!(ev.kind, EventKind::Closed(_)) {
            break ev;
        }
    };
    assert_eq!(ev.reason, Some(Reason::Closed), "{ev:?}");
    match ev.kind {
        EventKind::Closed(Some(how)) => assert!(how.contains("close_notify"), "{how}"),
        other => panic!("{other:?}"),
    }
    ctl.stop().await;
}

#[tokio::test]
async fn reloaded_tls_keeps_live_sessions_and_ends_the_one_its_crl_revokes() {
    use xce_agent::receiver::session::{serve_all, Control};
    let mut site = Site::new();
    let first = site.pki.next_serial();
    let n1 = site.pki.issue(&["node001"]);
    let n2 = site.pki.issue(&["node002"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut events) = tokio::sync::mpsc::channel(64);
    let control = Arc::new(Control::new(Vec::new()));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(serve_all(
        vec![listener],
        tls_listen(site.server()),
        tx,
        Arc::clone(&control),
        shutdown.clone(),
    ));
    let start = |files: &Files, host: &str| {
        let agent = Agent::start(
            tls_config(addr.to_string(), client(&site.pki.paths(files))),
            store_with(&[("x", "", Valtype::Numeric)]),
        );
        let mut hello = (**agent.hello.borrow()).clone();
        hello.host = host.to_owned();
        agent.hello.send_replace(Arc::new(hello));
        agent
    };
    let a = start(&n1, "node001");
    let b = start(&n2, "node002");
    let mut hellos = 0;
    while hellos < 2 {
        if let EventKind::Hello(_) = guard("hellos", events.recv()).await.unwrap().kind {
            hellos += 1;
        }
    }
    // A new CRL revoking node001's certificate, loaded while both are connected.
    let crl = site.pki.crl(&[first]);
    let mut paths = site.pki.paths(&site.ctl);
    paths.crl = Some(crl);
    let material = xce_agent::link::tls::Material::load(&paths).expect("material");
    assert_eq!(control.reload_tls(&material).expect("reload"), 1);
    let ended = loop {
        let ev = guard("the revoked session's end", events.recv())
            .await
            .unwrap();
        if matches!(ev.kind, EventKind::Closed(_)) {
            break ev;
        }
    };
    assert_eq!(ended.host.as_deref(), Some("node001"));
    assert_eq!(ended.reason, Some(Reason::Revoked), "{ended:?}");
    // node002's session goes on: its next value arrives on the same connection.
    record(&b.store, "x", Value::Numeric(7.0));
    loop {
        let ev = guard("node002's value", events.recv()).await.unwrap();
        assert!(
            !(matches!(ev.kind, EventKind::Closed(_)) && ev.host.as_deref() == Some("node002")),
            "node002 was dropped: {ev:?}"
        );
        if let EventKind::Batch { batch, .. } = &ev.kind {
            if ev.host.as_deref() == Some("node002")
                && batch.resvals.iter().any(|r| r.value == Value::Numeric(7.0))
            {
                break;
            }
        }
    }
    // And node001 reconnecting is refused at the handshake now.
    loop {
        let ev = guard("node001's refusal", events.recv()).await.unwrap();
        if ev.host.is_none() && matches!(ev.kind, EventKind::Closed(_)) {
            assert_eq!(ev.reason, Some(Reason::Revoked), "{ev:?}");
            break;
        }
    }
    a.stop().await;
    b.stop().await;
    shutdown.cancel();
    server.await.unwrap();
}

#[tokio::test]
async fn a_certificate_from_another_ca_gives_one_cause_every_time_and_counts_nothing_sent() {
    let site = Site::new();
    let mut rogue = Pki::new("rogue-ca");
    let node = rogue.issue(&["node001"]);
    let mut ctl = Controller::bind(tls_listen(site.server())).await;
    let mut paths = rogue.paths(&node);
    paths.ca = site.pki.ca.clone();
    let store = store_with(&[("x", "", Valtype::Numeric)]);
    record(&store, "x", Value::Numeric(1.0));
    let agent = Agent::start(tls_config(ctl.addr.to_string(), client(&paths)), store);
    // Five refusals in a row, each read from the agent's own record of its last failure.
    let mut causes = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let why = next_refusal(&mut ctl).await;
        assert!(why.contains("unknown_ca"), "{why}");
        let n = agent.stats.tls_failures(Failure::PeerRefused);
        wait_until("the agent to record the failure", || {
            agent.stats.tls_failures(Failure::PeerRefused) > n
                || agent
                    .stats
                    .last_error()
                    .is_some_and(|e| !causes.contains(&e.message))
        })
        .await;
        if let Some(e) = agent.stats.last_error() {
            causes.insert(e.message);
        }
    }
    assert_eq!(causes.len(), 1, "one cause: {causes:?}");
    let cause = causes.into_iter().next().unwrap();
    assert!(
        cause.contains("does not trust this agent's certificate"),
        "{cause}"
    );
    use std::sync::atomic::Ordering;
    assert_eq!(
        agent.stats.batches.load(Ordering::Relaxed),
        0,
        "nothing was accepted"
    );
    assert_eq!(agent.stats.resvals_sent.load(Ordering::Relaxed), 0);
    agent.stop().await;
    ctl.stop().await;
}

/// Issue 39, item 3: when the agent refuses the controller's certificate (another CA's,
/// another name's, an expired one), the receiver says so and why (the alert the agent
/// sent), not "tls handshake eof".
#[tokio::test]
async fn the_receiver_says_the_agent_refused_its_certificate_and_why() {
    let mut site = Site::new();
    let mut rogue = Pki::new("rogue-ca");
    let fake = rogue.issue(&["127.0.0.1"]);
    let mut from_another_ca = rogue.paths(&fake);
    from_another_ca.ca = site.pki.ca.clone();
    let elsewhere = site.pki.issue(&["ctl9.example"]);
    let expired = site.pki.issue_valid(&["127.0.0.1"], -30, -1);
    for (paths, alert, why) in [
        (from_another_ca, "UnknownCA", Failure::UnknownCa),
        (
            site.pki.paths(&elsewhere),
            "BadCertificate",
            Failure::WrongName,
        ),
        (
            site.pki.paths(&expired),
            "CertificateExpired",
            Failure::Expired,
        ),
    ] {
        let mut ctl = Controller::bind(tls_listen(server(&paths))).await;
        let agent = Agent::start(
            tls_config(ctl.addr.to_string(), site.client()),
            store_with(&[]),
        );
        let end = next_refusal(&mut ctl).await;
        assert!(
            end.contains("the agent refused this controller's certificate")
                && end.contains(alert)
                && !end.contains("eof"),
            "{end}"
        );
        wait_failures(&agent, why).await;
        agent.stop().await;
        ctl.stop().await;
    }
}
