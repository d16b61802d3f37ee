//! Both ends of the link in this process, on 127.0.0.1: a store with resources and an agent
//! link task, and the project's own receiver as the fake controller; and the controller's
//! view of what an agent sent.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xce_agent::link::assignment::Assigned;
use xce_agent::link::client::{self, Keepalive, LinkConfig, LinkState, LinkStats};
use xce_agent::link::wire::{Batch, Declared, Hello};
use xce_agent::receiver::session::{self, Event, EventKind, ListenOpts};
use xce_agent::store::{self, Store};
use xce_agent::value::{Reading, Resval, Valtype, Value};

use super::wait::guard;

pub fn store_with(resources: &[(&str, &str, Valtype)]) -> Arc<Store> {
    let store = Arc::new(Store::new());
    store.declare(resources.iter().map(|(n, i, t)| store::Declared {
        name: (*n).into(),
        instance: (*i).into(),
        valtype: *t,
        stale_after: Duration::from_secs(3600),
    }));
    store
}

pub fn hello_for(store: &Store) -> Hello {
    Hello::new(
        "node001",
        "boot-1",
        "digest-1",
        store
            .declared()
            .into_iter()
            .map(|d| Declared {
                shared: !d.instance.is_empty(),
                name: d.name,
                instance: d.instance,
                valtype: d.valtype,
                interval_ms: 60_000,
            })
            .collect(),
    )
}

pub fn record(store: &Store, name: &str, value: Value) {
    assert!(store.record(name, "", Reading::Ok(value), SystemTime::now()));
}

/// Production behaviour with durations shrunk so a test runs in well under a second.
pub fn fast_config(controllers: Vec<String>) -> LinkConfig {
    LinkConfig {
        controllers,
        coalesce: Duration::from_millis(5),
        heartbeat: Duration::from_secs(3600),
        write_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_secs(5),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        keepalive: Some(Keepalive {
            idle: Duration::from_secs(30),
            interval: Duration::from_secs(10),
            count: 3,
        }),
        // Plaintext, said in words: the TLS tests set `tls` themselves.
        tls: None,
        tls_ca: None,
        handshake_timeout: xce_agent::link::tls::HANDSHAKE_TIMEOUT,
    }
}

pub struct Agent {
    pub store: Arc<Store>,
    pub stats: Arc<LinkStats>,
    pub hello: watch::Sender<Arc<Hello>>,
    pub assigned: watch::Receiver<Assigned>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Agent {
    pub fn start(cfg: LinkConfig, store: Arc<Store>) -> Self {
        let (hello_tx, hello_rx) = watch::channel(Arc::new(hello_for(&store)));
        let (assigned_tx, assigned_rx) = watch::channel(BTreeSet::new());
        let stats = Arc::new(LinkStats::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(client::run(
            cfg,
            Arc::clone(&store),
            hello_rx,
            assigned_tx,
            Arc::clone(&stats),
            shutdown.clone(),
        ));
        Self {
            store,
            stats,
            hello: hello_tx,
            assigned: assigned_rx,
            shutdown,
            task,
        }
    }

    pub async fn wait_state(&self, what: &str, pred: impl FnMut(&LinkState) -> bool) {
        let mut rx = self.stats.subscribe();
        guard(what, rx.wait_for(pred))
            .await
            .expect("stats outlive the link");
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        guard("the link to stop", self.task)
            .await
            .expect("link task panicked");
        assert_eq!(self.stats.state(), LinkState::Stopped);
    }
}

pub struct Controller {
    pub addr: SocketAddr,
    pub events: mpsc::Receiver<Event>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Controller {
    pub async fn bind(opts: ListenOpts) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, opts)
    }

    pub fn serve(listener: TcpListener, opts: ListenOpts) -> Self {
        let addr = listener.local_addr().expect("local addr");
        let (tx, events) = mpsc::channel(1024);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(session::serve(listener, opts, tx, shutdown.clone()));
        Self {
            addr,
            events,
            shutdown,
            task,
        }
    }

    pub async fn next(&mut self) -> Event {
        guard("a receiver event", self.events.recv())
            .await
            .expect("receiver stopped")
    }

    /// The next batch, skipping connects, hellos and heartbeats.
    pub async fn next_batch(&mut self) -> Batch {
        loop {
            match self.next().await.kind {
                EventKind::Batch { batch, rejected } => {
                    assert!(rejected.is_empty(), "rejected resvals: {rejected:?}");
                    return batch;
                }
                EventKind::Closed(Some(e)) => panic!("receiver dropped the agent: {e}"),
                _ => {}
            }
        }
    }

    /// The next hello, then the full batch that must follow it.
    pub async fn next_hello_and_snapshot(&mut self) -> (Hello, Batch) {
        let hello = loop {
            match self.next().await.kind {
                EventKind::Hello(h) => break h,
                EventKind::Batch { batch, .. } => panic!("batch before hello: {batch:?}"),
                _ => {}
            }
        };
        let batch = self.next_batch().await;
        assert!(batch.full, "the batch after hello must be full: {batch:?}");
        ((*hello).clone(), batch)
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        guard("the receiver to stop", self.task)
            .await
            .expect("receiver panicked");
    }
}

/// A socket bound to a loopback port but not listening: connects to it are refused until
/// `listen` is called, with no window in which another process could take the port.
pub fn bound_not_listening() -> (TcpSocket, SocketAddr) {
    let s = TcpSocket::new_v4().expect("socket");
    s.set_reuseaddr(true).expect("reuseaddr");
    s.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = s.local_addr().expect("local addr");
    (s, addr)
}

/// Read raw bytes from an agent until they hold two complete frames (hello + full
/// snapshot); returns everything read and how many bytes those two frames take.
pub async fn read_two_frames(s: &mut tokio::net::TcpStream) -> (Vec<u8>, usize) {
    use tokio::io::AsyncReadExt;
    let mut capture = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = guard("agent bytes", s.read(&mut buf)).await.expect("read");
        assert!(n > 0, "agent closed early");
        capture.extend_from_slice(&buf[..n]);
        let mut rest = &capture[..];
        let mut frames = 0;
        while !rest.is_empty()
            && capnp::serialize::read_message_from_flat_slice(
                &mut rest,
                xce_agent::link::wire::reader_options(),
            )
            .is_ok()
        {
            frames += 1;
        }
        if frames >= 2 {
            let complete = capture.len() - rest.len();
            return (capture, complete);
        }
    }
}

/// A listener on a fixed port (a controller coming back on its address). SO_REUSEADDR, so
/// the old connections' TIME_WAIT does not block the bind.
pub fn listen_on(addr: SocketAddr) -> TcpListener {
    let s = TcpSocket::new_v4().expect("socket");
    s.set_reuseaddr(true).expect("reuseaddr");
    s.bind(addr).expect("bind again");
    s.listen(1024).expect("listen")
}

/// The controller's view of one host: the latest resval per name, as batches update it.
#[derive(Debug, Default)]
pub struct View {
    pub values: BTreeMap<String, Resval>,
}

impl View {
    pub fn apply(&mut self, batch: &Batch) {
        if batch.full {
            self.values.clear();
        }
        for r in &batch.resvals {
            self.values.insert(r.name.clone(), r.clone());
        }
    }
}
