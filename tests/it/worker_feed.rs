//! The worker's door (issue #37): the same protocol on a unix socket of the node, without
//! TLS. The receiver knows the peer by its uid (SO_PEERCRED), takes the host from its own
//! name, not from the hello, and refuses a process of another uid.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::sync::Arc;

use crate::support::*;
use tokio::net::UnixListener;
use xce_agent::receiver::session::{serve_doors, Control, EventKind, ListenOpts, Reason, UnixDoor};
use xce_agent::value::{Valtype, Value};

/// A receiver with `door` and nothing else; its events, and the token that stops it.
fn serve(
    door: UnixDoor,
) -> (
    tokio::sync::mpsc::Receiver<xce_agent::receiver::session::Event>,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let (tx, events) = tokio::sync::mpsc::channel(64);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(serve_doors(
        Vec::new(),
        vec![door],
        ListenOpts::default(),
        tx,
        Arc::new(Control::default()),
        shutdown.clone(),
    ));
    (events, shutdown, server)
}

fn door(dir: &std::path::Path) -> (std::path::PathBuf, UnixDoor) {
    let path = dir.join("worker.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let uid = nix::unistd::geteuid().as_raw();
    (
        path,
        UnixDoor {
            listener,
            allowed_uids: vec![uid],
            host: "worker-host".into(),
        },
    )
}

#[tokio::test]
async fn an_agent_feeds_the_worker_over_its_socket_as_the_workers_own_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, door) = door(dir.path());
    let (mut events, shutdown, server) = serve(door);
    let store = store_with(&[("scratch", "", Valtype::Numeric)]);
    record(&store, "scratch", Value::Numeric(5.0));
    // No TLS in the agent's config: the socket needs none.
    let agent = Agent::start(
        fast_config(vec![format!("unix:{}", path.display())]),
        Arc::clone(&store),
    );
    let (host, peer) = loop {
        let ev = guard("the hello", events.recv()).await.expect("event");
        if let EventKind::Hello(h) = &ev.kind {
            assert_eq!(h.host, "node001", "what the hello says");
            break (ev.host.clone(), ev.peer.to_string());
        }
    };
    assert_eq!(
        host.as_deref(),
        Some("worker-host"),
        "the worker's own host"
    );
    assert!(peer.starts_with("unix:uid="), "{peer}");
    loop {
        let ev = guard("the snapshot", events.recv()).await.expect("event");
        if let EventKind::Batch { batch, .. } = ev.kind {
            assert_eq!(batch.resvals[0].value, Value::Numeric(5.0));
            break;
        }
    }
    agent.stop().await;
    shutdown.cancel();
    server.await.expect("server");
}

#[tokio::test]
async fn a_process_of_another_uid_is_refused_before_a_byte_is_read() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a process as another uid");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (path, mut door) = door(dir.path());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    door.allowed_uids = vec![0];
    let (mut events, shutdown, server) = serve(door);
    // As nobody: connect, then wait for the receiver to close the connection.
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)",
        ])
        .arg(&path)
        .uid(65534)
        .gid(65534)
        .spawn()
        .expect("python3");
    let ev = loop {
        let ev = guard("the refusal", events.recv()).await.expect("event");
        if matches!(ev.kind, EventKind::Closed(_)) {
            break ev;
        }
    };
    assert_eq!(ev.reason, Some(Reason::Identity));
    assert!(ev.host.is_none());
    match &ev.kind {
        EventKind::Closed(Some(e)) => assert!(e.contains("uid 65534 may not feed"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(
        child.wait().expect("wait").success(),
        "the refused peer saw its end"
    );
    shutdown.cancel();
    server.await.expect("server");
}

/// `xce-agent listen --unix PATH`: the same door from the command line; the agent's hello
/// names node001 but listen reports it as this host.
#[tokio::test]
async fn listen_on_a_unix_socket_prints_what_the_agent_sends_as_this_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("worker.sock");
    let uid = nix::unistd::geteuid().as_raw().to_string();
    let mut listen = ListenProc::spawn_with(&[
        "--unix",
        sock.to_str().expect("utf-8 path"),
        "--unix-uid",
        &uid,
    ]);
    listen.next_err_matching("for uids");
    let site = Site::reporting_to_unix(
        &sock,
        "resources:\n  - name: level\n    valtype: numeric\n    interval: 1\n    \
         probe: {kind: exec, command: [level.sh]}\n",
    );
    site.counter_script("level");
    let _agent = site.spawn_agent();
    let own = nix::unistd::gethostname()
        .expect("hostname")
        .to_string_lossy()
        .to_ascii_lowercase();
    let hello = listen.next_json(|v| v["event"] == "hello");
    assert_eq!(hello["host"], own.as_str(), "{hello}");
    assert!(
        hello["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("unix:uid=")),
        "{hello}"
    );
    let value = listen.next_json(|v| v["event"] == "resval" && v["name"] == "level");
    assert_eq!(value["host"], own.as_str());
}
