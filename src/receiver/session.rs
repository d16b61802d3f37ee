//! The reference receiver (`xce-agent listen ADDR`): accepts many agents, decodes and
//! validates what they send, and reports one event per message. It shows a controller
//! implementer what to check, lets an admin see whether a node reports, and is what the
//! tests talk to.
//!
//! Protocol violations (no hello first, wrong protocol version, seq not increasing, a delta
//! before the first full batch, a malformed, truncated or oversized frame) drop that one
//! connection with a logged error. A resval that does not fit its hello (undeclared, wrong
//! type, empty name, non-finite number) is reported as rejected and the connection goes on,
//! as a controller should do: one bad value must not blind it to the host's other values.
//!
//! What a hostile peer may cost is bounded (see `limits`): a hello whose names break the
//! resource-name rules is refused, a batch longer than its hello declared is refused from its
//! list header, repeated warnings make one summary line per interval, and the output waiting
//! for a slow stdout is bounded in bytes. The text format escapes control characters, so one
//! resval is always exactly one line.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::admission::{self, Stage, Ticket};
use crate::link::frame_limits::{FrameLimits, MAX_HELLO_FRAME_BYTES};
use crate::link::name_rules::{check_hello, check_names, HelloError};
use crate::link::tls::{self, LinkStream};
use crate::link::warning_throttle::{Warnings, WARN_INTERVAL};
use crate::link::wire::{
    self, Batch, ControllerMessage, Envelope, Heartbeat, Hello, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION, VERDICT_VERSION,
};
use crate::receiver::budget::{
    Budget, HostAccount, Payer, DEFAULT_HOST_SHARE, DEFAULT_TOTAL, SESSION_COST,
};
use crate::receiver::frame::{self, FrameError};
use crate::receiver::identity::{canonical_host, Displaced, Live, Peer};
use crate::text::escape;
use crate::value::{Resval, Valtype, Value, MAX_STRING_VALUE};

/// How `listen` writes each event: a line of text or a JSON line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LineFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Default)]
pub struct ListenOpts {
    /// Send `ack(seq)` after each batch.
    pub ack: bool,
    /// When non-empty, send `welcome` with these (name, instance) pairs after each hello.
    pub assign: Vec<(String, String)>,
    /// Require TLS with a client certificate whose DNS SANs name the hello's host.
    /// `None` accepts plaintext: the CLI allows it only with `--insecure`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Bound on a TLS handshake; `None` is [`admission::HANDSHAKE_TIMEOUT`].
    pub handshake_timeout: Option<Duration>,
    /// The cluster's DNS domains: a hello's short host name is named by a certificate SAN
    /// `HOST.DOMAIN` only for these (a SAN equal to the host always names it).
    pub domains: Vec<String>,
    /// A connection whose hello has not been accepted by then is closed (OpenSSH's
    /// LoginGraceTime); `None` is [`HELLO_TIMEOUT`].
    pub hello_timeout: Option<Duration>,
    /// Connections not yet accepted (TLS handshake or hello pending) at once: the `full` of
    /// the admission policy ([`admission::Policy::with_full`]), whose other numbers scale with
    /// it. Beyond it a new connection evicts the weakest, oldest pending one (never itself),
    /// so held sockets cannot lock real agents out; `None` is [`MAX_UNAUTHENTICATED`].
    pub max_unauthenticated: Option<usize>,
    /// The memory budget every connection charges (see `receiver::budget`); `None` is one of
    /// the defaults' size for this receiver alone.
    pub budget: Option<Arc<Budget>>,
    /// A session with an accepted hello from which nothing arrived for this long is closed
    /// (`timeout`); `None` is [`IDLE_TIMEOUT`].
    pub idle_timeout: Option<Duration>,
}

/// How long a connection may take from accept to an accepted hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A session silent this long is closed: three of the agent's 10 s heartbeats.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest frame before an accepted hello: the largest hello the protocol allows
/// ([`MAX_HELLO_FRAME_BYTES`]). A batch of up to `wire::MAX_FRAME_BYTES` comes only from a
/// host whose hello was accepted, and is charged to its share.
pub const PRE_HELLO_FRAME_BYTES: usize = MAX_HELLO_FRAME_BYTES;

/// Connections at once that have not yet sent an accepted hello (see [`admission`]).
pub const MAX_UNAUTHENTICATED: usize = admission::FULL;

/// What happened on one agent connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub peer: Peer,
    /// The host from the connection's hello, canonical (see `receiver::identity`; None
    /// before it).
    pub host: Option<String>,
    /// Which session of this receiver: a host's events count only from the session that
    /// speaks for it now.
    pub session: u64,
    pub kind: EventKind,
    /// Who the client certificate says the peer is (`None` on a plaintext connection or
    /// before the handshake finished).
    pub identity: Option<Arc<Identity>>,
    /// Why the connection ended, as a class: set on `Closed(Some(_))` only.
    pub reason: Option<Reason>,
}

/// Why a connection was dropped or refused: the classes a controller counts and the C
/// library reports (`xce_reason`). The text beside it (in `EventKind::Closed`) says more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The peer does not speak TLS (a plaintext agent against a TLS receiver).
    NotTls,
    /// The client certificate is not from the receiver's CA.
    UnknownCa,
    /// The client certificate has expired or is not valid yet.
    Expired,
    /// The client certificate is revoked by the CRL.
    Revoked,
    /// The peer sent no client certificate.
    NoCertificate,
    /// The TLS handshake failed otherwise (stalled, cut short, the peer's alert).
    Handshake,
    /// The hello names a host the certificate does not name.
    Identity,
    /// A message out of order, malformed or not by the protocol's rules.
    Protocol,
    /// A frame or list larger than the limits (docs/protocol.md).
    Limit,
    /// Reading from or writing to the peer failed (reset, write timeout).
    Io,
    /// A newer session for the same host, or with the same certificate, took its place.
    Displaced,
    /// The receiver is stopping.
    Stopped,
    /// The peer ended the stream (with or without TLS close_notify: a power cut, kill -9
    /// and a cable look alike).
    Closed,
    /// Nothing from the peer for longer than its heartbeat allows.
    Timeout,
    /// The host held more than its share of the receiver's memory budget.
    OverBudget,
}

impl Reason {
    pub const ALL: [Reason; 15] = [
        Reason::Closed,
        Reason::NotTls,
        Reason::UnknownCa,
        Reason::Expired,
        Reason::Revoked,
        Reason::NoCertificate,
        Reason::Handshake,
        Reason::Identity,
        Reason::Protocol,
        Reason::Limit,
        Reason::Io,
        Reason::Displaced,
        Reason::Stopped,
        Reason::Timeout,
        Reason::OverBudget,
    ];

    /// A short label for lines and counters.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotTls => "not_tls",
            Reason::UnknownCa => "unknown_ca",
            Reason::Expired => "expired",
            Reason::Revoked => "revoked",
            Reason::NoCertificate => "no_certificate",
            Reason::Handshake => "handshake",
            Reason::Identity => "identity",
            Reason::Protocol => "protocol",
            Reason::Limit => "limit",
            Reason::Io => "io",
            Reason::Displaced => "displaced",
            Reason::Stopped => "stopped",
            Reason::Closed => "closed",
            Reason::Timeout => "timeout",
            Reason::OverBudget => "over_budget",
        }
    }

    fn of_tls(f: tls::Failure) -> Self {
        use tls::Failure as F;
        match f {
            F::UnknownCa => Reason::UnknownCa,
            F::Expired => Reason::Expired,
            F::Revoked => Reason::Revoked,
            F::NoCertificate => Reason::NoCertificate,
            F::NotTls => Reason::NotTls,
            F::WrongName | F::PeerRefused | F::Busy | F::Truncated | F::Timeout | F::Other => {
                Reason::Handshake
            }
        }
    }

    /// How a frame read ended.
    fn of_frame(e: &FrameError) -> Self {
        match e {
            FrameError::Closed { .. } => Reason::Closed,
            FrameError::Io(_) => Reason::Io,
            FrameError::TooLarge { .. } => Reason::Limit,
            FrameError::Malformed(_) => Reason::Protocol,
            FrameError::OverBudget(_) => Reason::OverBudget,
        }
    }

    /// A frame reader's or decoder's error: a bound exceeded, a read that failed, or bytes
    /// that are not the protocol.
    fn of_wire(e: &wire::WireError) -> Self {
        use capnp::ErrorKind as K;
        match e {
            wire::WireError::TooLarge { .. } | wire::WireError::TooMany { .. } => Reason::Limit,
            wire::WireError::Capnp(c) => match c.kind {
                K::MessageTooLarge(_)
                | K::MessageSizeOverflow
                | K::ReadLimitExceeded
                | K::NestingLimitExceeded => Reason::Limit,
                K::Disconnected | K::Overloaded => Reason::Io,
                // capnp-futures refuses a segment table announcing more than the traversal
                // limit (`read_frame_within`'s bound) with a plain failure that says so.
                K::Failed if c.extra.contains("which is too large") => Reason::Limit,
                _ => Reason::Protocol,
            },
            _ => Reason::Protocol,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    Connected,
    Hello(Arc<Hello>),
    /// A batch; `rejected` lists the resvals that did not fit the hello, with the reason
    /// (they are not in `batch.resvals`).
    Batch {
        batch: Batch,
        rejected: Vec<(Resval, String)>,
    },
    Heartbeat(Heartbeat),
    /// The connection ended: `None` at a clean end of stream, otherwise why it was dropped.
    Closed(Option<String>),
}

/// Accept agents until `shutdown`, reporting events to `events`. Each connection runs in
/// its own task; a bad one never affects the others. Returns when `shutdown` is cancelled
/// (open connections are closed) or `events` is closed.
pub async fn serve(
    listener: TcpListener,
    opts: ListenOpts,
    events: mpsc::Sender<Event>,
    shutdown: CancellationToken,
) {
    let control = Arc::new(Control::new(opts.domains.clone()));
    serve_all(vec![listener], opts, events, control, shutdown).await;
}

/// `serve` on several listeners at once, one receiver behind them all (newest-wins per host
/// across them), with `control` to assign shared instances to hosts while it runs: what the
/// C library (`capi/`) runs.
pub async fn serve_all(
    listeners: Vec<TcpListener>,
    opts: ListenOpts,
    events: mpsc::Sender<Event>,
    control: Arc<Control>,
    shutdown: CancellationToken,
) {
    serve_doors(listeners, Vec::new(), opts, events, control, shutdown).await;
}

/// `serve_all` with the worker's doors too (unix sockets, see [`UnixDoor`]).
pub async fn serve_doors(
    listeners: Vec<TcpListener>,
    unix: Vec<UnixDoor>,
    opts: ListenOpts,
    events: mpsc::Sender<Event>,
    control: Arc<Control>,
    shutdown: CancellationToken,
) {
    serve_into(
        listeners,
        unix,
        opts,
        Sink::Events(events),
        control,
        shutdown,
    )
    .await;
}

/// The worker's door: the same protocol on a unix socket of this node, without TLS. A peer
/// is known by its credentials (SO_PEERCRED): only `allowed_uids` may feed it, and every
/// session on it speaks for `host`, this receiver's own host, whatever its hello names.
pub struct UnixDoor {
    pub listener: tokio::net::UnixListener,
    pub allowed_uids: Vec<u32>,
    pub host: String,
}

/// How a connection came in.
enum Door {
    /// The controller's door: TCP, TLS unless the listener is plaintext.
    Tcp(TcpStream),
    /// The worker's door: a local process the socket vouched for; its host is `host`.
    Unix {
        stream: tokio::net::UnixStream,
        host: String,
    },
}

/// What the controller tells hosts while the receiver runs: the shared instances assigned
/// to each (sent as `welcome` after each hello, and at once to a connected host when its
/// assignment changes).
#[derive(Default)]
pub struct Control {
    /// By canonical host name. `None`: nothing assigned, no welcome is sent.
    assigned: Mutex<HashMap<String, AssignedTx>>,
    /// The cluster's domains, to make the names the controller gives canonical.
    domains: Vec<String>,
    /// The live session of each host and certificate.
    live: Arc<Live>,
    /// The TLS configuration new connections get, once reloaded (`ListenOpts::tls` before).
    tls: Mutex<Option<Arc<rustls::ServerConfig>>>,
}

type Assignment = Option<Vec<(String, String)>>;
type AssignedTx = tokio::sync::watch::Sender<Assignment>;

impl Control {
    /// Assign `instances` to `host` (replacing what it had; empty withdraws them all). A
    /// connected host is sent a welcome now; a host that connects later, after its hello.
    /// `host` in any spelling of it (case, the cluster's domain).
    pub fn new(domains: Vec<String>) -> Self {
        Self {
            domains,
            ..Self::default()
        }
    }

    /// New key material for the connections to come (certificate, key, CA, CRL), without
    /// dropping live sessions; a live session whose certificate `material`'s CRL revokes is
    /// ended (`revoked`). Returns how many were.
    pub fn reload_tls(&self, material: &tls::Material) -> Result<usize, tls::TlsError> {
        let cfg = material.server_config()?;
        *self.tls.lock().unwrap_or_else(|p| p.into_inner()) = Some(cfg);
        Ok(self.live.revoke(&material.revoked_keys()))
    }

    /// The TLS configuration for a new connection.
    fn tls_config(
        &self,
        initial: &Option<Arc<rustls::ServerConfig>>,
    ) -> Option<Arc<rustls::ServerConfig>> {
        let reloaded = self.tls.lock().unwrap_or_else(|p| p.into_inner()).clone();
        reloaded.or_else(|| initial.clone())
    }

    pub fn assign(&self, host: &str, instances: Vec<(String, String)>) {
        let key = canonical_host(host, &self.domains);
        let mut map = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key)
            .or_insert_with(|| tokio::sync::watch::channel(None).0)
            .send_replace(Some(instances));
    }

    /// The assignment of `host` to watch; `default` (listen's `--assign`-style list for
    /// every host) where the controller never assigned anything to it.
    fn watch(
        &self,
        host: &str,
        default: &[(String, String)],
    ) -> tokio::sync::watch::Receiver<Assignment> {
        let key = canonical_host(host, &self.domains);
        let mut map = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key)
            .or_insert_with(|| {
                let initial = (!default.is_empty()).then(|| default.to_vec());
                tokio::sync::watch::channel(initial).0
            })
            .subscribe()
    }
}

/// Where a connection's events go: to the caller's channel (its capacity bounds the events
/// waiting, each at most one frame), or rendered as lines into a buffer bounded in bytes.
#[derive(Clone)]
enum Sink {
    Events(mpsc::Sender<Event>),
    Lines(LineSink),
}

#[derive(Clone)]
struct LineSink {
    format: LineFormat,
    /// Unbounded in count, bounded in bytes: every entry holds permits for its size.
    tx: mpsc::UnboundedSender<(String, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
}

/// Bytes of printed output `listen` holds for a slow stdout before its connections stop
/// reading (and TCP pushes back on the agents).
pub const LISTEN_BUFFER_BYTES: usize = 1 << 20;

/// What an entry costs beyond its text (the String and the channel node).
const ENTRY_OVERHEAD: usize = 64;

impl Sink {
    /// Hand one event on, waiting while the output buffer is full (the connection stops
    /// reading meanwhile, so TCP pushes back on the agent). Err: the consumer is gone.
    async fn deliver(&self, ev: Event) -> Result<(), ()> {
        match self {
            Sink::Events(tx) => tx.send(ev).await.map_err(|_| ()),
            Sink::Lines(sink) => {
                let mut text = String::new();
                for line in ev.lines(sink.format) {
                    text.push_str(&line);
                    text.push('\n');
                }
                // Only the text waits for the buffer, not the decoded batch.
                drop(ev);
                // One event larger than the whole buffer still goes, alone.
                let cost = (text.len() + ENTRY_OVERHEAD).min(LISTEN_BUFFER_BYTES);
                let permit = Arc::clone(&sink.budget)
                    .acquire_many_owned(cost as u32)
                    .await
                    .map_err(|_| ())?;
                sink.tx.send((text, permit)).map_err(|_| ())
            }
        }
    }

    async fn closed(&self) {
        match self {
            Sink::Events(tx) => tx.closed().await,
            Sink::Lines(sink) => sink.tx.closed().await,
        }
    }
}

/// How long stopping waits for connections to say close_notify before it cuts them.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// After a failed `accept` (EMFILE and the like) the loop waits this long, doubling up to
/// `ACCEPT_BACKOFF_MAX`; a successful accept resets it.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(100);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Raise this process's open-file soft limit to its hard limit: a receiver holds a
/// descriptor per agent (10,000 agents need more than the usual soft 1024) and one per
/// connection waiting for its handshake (the agent's own, `probe::open_files`: the first
/// caller raises it). Returns the limit now in force. A limit that stays below what the
/// pending pool alone needs is said once, with how to raise it (accept failing on it later
/// says so again, see [`admission::accept_error_words`]).
pub fn raise_fd_limit() -> u64 {
    let limit = crate::probe::open_files::raise();
    let (now, hard) = (limit.soft, limit.hard);
    if now < FD_LIMIT_WANTED {
        warn!(
            limit = now,
            "the open-file limit (RLIMIT_NOFILE, hard limit {hard}) is {now}: with \
             {MAX_UNAUTHENTICATED} connections waiting for their handshake there is room for \
             few agents; raise it (systemd LimitNOFILE=, limits.conf nofile, or ulimit -Hn)"
        );
    }
    now
}

/// Descriptors a receiver should be able to open: the pending pool, and as many agents.
const FD_LIMIT_WANTED: u64 = 2 * MAX_UNAUTHENTICATED as u64 + 64;

async fn serve_into(
    listeners: Vec<TcpListener>,
    unix: Vec<UnixDoor>,
    opts: ListenOpts,
    sink: Sink,
    control: Arc<Control>,
    shutdown: CancellationToken,
) {
    let mut conns = JoinSet::new();
    let live = Arc::clone(&control.live);
    let budget = opts
        .budget
        .clone()
        .unwrap_or_else(|| Budget::new(DEFAULT_TOTAL, DEFAULT_HOST_SHARE));
    let stopping = shutdown.child_token();
    let policy =
        admission::Policy::with_full(opts.max_unauthenticated.unwrap_or(MAX_UNAUTHENTICATED));
    let pending: admission::SharedPool = Arc::new(Mutex::new(admission::Pool::new(
        policy,
        admission::random_seed(),
    )));
    let mut turned_away = Warnings::new(WARN_INTERVAL);
    let mut accept_errors = Warnings::new(WARN_INTERVAL);
    let mut accept_backoff = ACCEPT_BACKOFF_MIN;
    for door in unix {
        let ctx = Shared {
            live: Arc::clone(&live),
            control: Arc::clone(&control),
            budget: Arc::clone(&budget),
            stopping: stopping.clone(),
        };
        conns.spawn(accept_unix(door, opts.clone(), sink.clone(), ctx));
    }
    loop {
        // `accept` is cancel-safe: the futures of the listeners that lost are dropped.
        let accept_any = async {
            if listeners.is_empty() {
                return std::future::pending().await;
            }
            let accepts = listeners.iter().map(|l| Box::pin(l.accept()));
            futures::future::select_all(accepts).await.0
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sink.closed() => break,
            // Reap finished connection tasks so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = accept_any => match r {
                Ok((stream, peer)) => {
                    accept_backoff = ACCEPT_BACKOFF_MIN;
                    let now = tokio::time::Instant::now();
                    // Admission before authentication (see `admission`): the new connection
                    // always gets in; what it evicts is counted in one line per interval,
                    // not one per connection.
                    let (ticket, evicted) = Ticket::admit(&pending, peer.ip(), now.into_std());
                    for why in evicted {
                        if turned_away.admit(why.as_str(), now) {
                            warn!(%peer, "too many connections waiting for their handshake or \
                                   hello ({}): closing the weakest, oldest ones (more like it \
                                   are summarised)", why.as_str());
                        }
                    }
                    if let Some(summary) = turned_away.summary_due(now) {
                        warn!("connections evicted while waiting for their handshake or hello: {summary}");
                    }
                    let ctx = Shared {
                        live: Arc::clone(&live),
                        budget: Arc::clone(&budget),
                        control: Arc::clone(&control),
                        stopping: stopping.clone(),
                    };
                    conns.spawn(connection(
                        Door::Tcp(stream),
                        Peer::Tcp(peer),
                        opts.clone(),
                        sink.clone(),
                        ctx,
                        Some(ticket),
                    ));
                    // Let the new connection read its ClientHello before the next accepts:
                    // once read, it is past the silent sockets a flood holds.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off (100 ms doubling to 5 s)
                    // instead of spinning, and say so once per interval.
                    let now = tokio::time::Instant::now();
                    let words = admission::accept_error_words(&e);
                    if accept_errors.admit("accept failed", now) {
                        error!(?accept_backoff,
                               "{words}; backing off (more like it are summarised)");
                    } else if let Some(summary) = accept_errors.summary_due(now) {
                        error!("{words}; accept failures: {summary}");
                    }
                    tokio::time::sleep(accept_backoff).await;
                    accept_backoff = (accept_backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
            },
        }
    }
    // Each connection ends itself (close_notify on TLS); one stuck in a write is cut.
    stopping.cancel();
    let drained = tokio::time::timeout(STOP_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        conns.shutdown().await;
    }
}

/// `serve`, printing one line per event (per resval for batches) to `out`, for the CLI.
/// The lines waiting for `out` are bounded by `LISTEN_BUFFER_BYTES`, however slow it is.
pub async fn serve_lines<W: AsyncWrite + Unpin>(
    listeners: Vec<TcpListener>,
    unix: Vec<UnixDoor>,
    opts: ListenOpts,
    format: LineFormat,
    mut out: W,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink = Sink::Lines(LineSink {
        format,
        tx,
        budget: Arc::new(Semaphore::new(LISTEN_BUFFER_BYTES)),
    });
    let control = Arc::new(Control::new(opts.domains.clone()));
    let server = tokio::spawn(serve_into(
        listeners,
        unix,
        opts,
        sink,
        control,
        shutdown.clone(),
    ));
    let mut result = Ok(());
    // The permit is released once the text is written.
    while let Some((text, _permit)) = rx.recv().await {
        if let Err(e) = async {
            out.write_all(text.as_bytes()).await?;
            out.flush().await
        }
        .await
        {
            // stdout gone (e.g. `listen | head`): stop serving.
            result = Err(e);
            shutdown.cancel();
            break;
        }
    }
    drop(rx);
    let _ = server.await;
    result
}

/// Largest time a write of an ack/welcome may take before the agent is considered stuck.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who the client certificate says the peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub subject: String,
    /// DNS names, then IP addresses.
    pub sans: Vec<String>,
    pub dns_names: Vec<String>,
    /// Issuer and serial number: this one certificate (at most one live host speaks with it).
    pub certificate: String,
}

/// TLS accept, bounded by `bound`, given up when a newer connection evicts this one
/// (`Ok(None)`: nothing to report, the accept loop counts it); the peer's identity from its
/// certificate.
async fn handshake(
    cfg: &Arc<rustls::ServerConfig>,
    bound: Duration,
    stream: TcpStream,
    ticket: &Ticket,
) -> Result<Option<(Box<dyn LinkStream>, Identity)>, (tls::Failure, String)> {
    let Some(s) = admission::tls_accept(cfg, bound, stream, ticket).await? else {
        return Ok(None);
    };
    let info = s
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(tls::cert_info);
    let Some(info) = info else {
        return Err((tls::Failure::NoCertificate, "no client certificate".into()));
    };
    ticket.advance(Stage::Certified);
    let identity = Identity {
        subject: info.subject,
        sans: info.sans,
        dns_names: info.dns_names,
        certificate: tls::certificate_key(&info.issuer, &info.serial),
    };
    Ok(Some((Box::new(s), identity)))
}

/// What every connection of one receiver shares.
struct Shared {
    live: Arc<Live>,
    control: Arc<Control>,
    budget: Arc<Budget>,
    /// Cancelled when the receiver stops: each connection ends itself.
    stopping: CancellationToken,
}

/// How a session ended: the class and the words.
type End = Option<(Reason, String)>;

/// Accept on the worker's door until the receiver stops: a peer whose uid is not allowed is
/// refused (`identity`) before a byte is read.
async fn accept_unix(door: UnixDoor, opts: ListenOpts, sink: Sink, shared: Shared) {
    let mut conns = JoinSet::new();
    let stopping = shared.stopping.clone();
    let mut accept_errors = Warnings::new(WARN_INTERVAL);
    loop {
        let (stream, _) = tokio::select! {
            _ = stopping.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = door.listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    let now = tokio::time::Instant::now();
                    if accept_errors.admit("accept failed", now) {
                        error!(error = %e, "accept on the worker's socket failed; backing off");
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF_MIN).await;
                    continue;
                }
            },
        };
        let Ok(cred) = stream.peer_cred() else {
            continue;
        };
        let peer = Peer::Unix {
            uid: cred.uid(),
            pid: cred.pid().unwrap_or(0),
        };
        if !door.allowed_uids.contains(&cred.uid()) {
            let text = format!(
                "uid {} may not feed this socket (allowed: {:?})",
                cred.uid(),
                door.allowed_uids
            );
            error!(%peer, "{text}; refused");
            let _ = sink
                .deliver(Event {
                    peer,
                    host: None,
                    session: 0,
                    kind: EventKind::Closed(Some(text)),
                    identity: None,
                    reason: Some(Reason::Identity),
                })
                .await;
            continue;
        }
        let ctx = Shared {
            live: Arc::clone(&shared.live),
            control: Arc::clone(&shared.control),
            budget: Arc::clone(&shared.budget),
            stopping: stopping.clone(),
        };
        let door = Door::Unix {
            stream,
            host: door.host.clone(),
        };
        conns.spawn(connection(
            door,
            peer,
            opts.clone(),
            sink.clone(),
            ctx,
            None,
        ));
    }
    let _ = tokio::time::timeout(STOP_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
}

async fn connection(
    door: Door,
    peer: Peer,
    opts: ListenOpts,
    sink: Sink,
    shared: Shared,
    unauthenticated: Option<Ticket>,
) {
    let Shared {
        live,
        control,
        budget,
        stopping,
    } = shared;
    // LoginGraceTime: from accept to an accepted hello, handshake included.
    let hello_deadline = tokio::time::Instant::now() + opts.hello_timeout.unwrap_or(HELLO_TIMEOUT);
    let idle_timeout = opts.idle_timeout.unwrap_or(IDLE_TIMEOUT);
    // Held until the hello is accepted: its place among the connections not yet
    // authenticated (see `admission`; the worker's door has none: its peers are known).
    let mut unauthenticated = unauthenticated;
    // What the session costs at rest, before its hello: the pre-authentication part.
    let Ok(mut session_charge) = budget.charge(&Payer::PreAuth, SESSION_COST) else {
        let _ = sink
            .deliver(Event {
                peer,
                host: None,
                session: 0,
                kind: EventKind::Closed(Some(
                    "refused: connections without an accepted hello hold their whole part of \
                     the memory budget"
                        .into(),
                )),
                identity: None,
                reason: Some(Reason::OverBudget),
            })
            .await;
        return;
    };
    // On plaintext, the agent's first bytes: a TLS ClientHello there is an agent that
    // speaks TLS to a listener that does not, said as such instead of a parse error.
    let first_bytes = tls::FirstBytes::default();
    let (stream, identity, forced_host): (Box<dyn LinkStream>, _, _) = match door {
        Door::Unix { stream, host } => (Box::new(stream), None, Some(host)),
        Door::Tcp(stream) => match control.tls_config(&opts.tls) {
            None => (
                Box::new(tls::Sniff::new(stream, Arc::clone(&first_bytes))),
                None,
                None,
            ),
            Some(cfg) => match match &unauthenticated {
                Some(ticket) => {
                    let bound = opts
                        .handshake_timeout
                        .unwrap_or(admission::HANDSHAKE_TIMEOUT);
                    handshake(&cfg, bound, stream, ticket).await
                }
                None => Ok(None),
            } {
                Ok(Some((s, id))) => (s, Some(Arc::new(id)), None),
                // Evicted for a newer connection: counted by the accept loop, not one line
                // each.
                Ok(None) => return,
                Err((why, e)) => {
                    let e = if why == tls::Failure::NotTls {
                        format!("the agent at {peer} is not using TLS but this listener is (configure tls: in its agent.yaml, or run listen with --insecure)")
                    } else {
                        e
                    };
                    error!(%peer, reason = why.as_str(), error = %e, "TLS handshake failed; agent refused");
                    let end = format!("TLS handshake failed ({}): {e}", why.as_str());
                    let kind = EventKind::Closed(Some(end));
                    let _ = sink
                        .deliver(Event {
                            peer,
                            host: None,
                            session: 0,
                            kind,
                            identity: None,
                            reason: Some(Reason::of_tls(why)),
                        })
                        .await;
                    return;
                }
            },
        },
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let claim = live.session();
    let mut conn = Conn {
        peer,
        hello: None,
        host: None,
        declared: Vec::new(),
        last_seq: 0,
        need_full: true,
        warnings: Warnings::new(WARN_INTERVAL),
        identity,
        peer_version: None,
        session: claim.id,
        forced_host,
    };
    // The host's budget account, once its hello is in.
    let mut account: Option<Arc<HostAccount>> = None;
    // The host's assignment, once its hello is in: a change is sent as a welcome at once.
    let mut assigned: Option<tokio::sync::watch::Receiver<Assignment>> = None;
    info!(%peer, "agent connected");
    let _ = sink.deliver(conn.event(EventKind::Connected)).await;
    let end: End = 'conn: loop {
        let payer = match &account {
            Some(a) => Payer::Host(Arc::clone(a)),
            None => Payer::PreAuth,
        };
        let read = {
            // The read stays pinned while welcomes go out: a frame is never cut in half.
            let before_hello = conn.hello.is_none();
            let frame = frame::read_frame(&mut rd, conn.frame_bytes(), before_hello, |n| {
                budget.charge(&payer, n)
            });
            tokio::pin!(frame);
            let idle = tokio::time::sleep(idle_timeout);
            tokio::pin!(idle);
            loop {
                tokio::select! {
                    _ = claim.token.cancelled() => {
                        break 'conn Some(match claim.displaced() {
                            Some(Displaced::Revoked) => (Reason::Revoked,
                                "its certificate is revoked by the CRL the receiver reloaded".into()),
                            Some(Displaced::SameCertificate { host }) => (Reason::Displaced, format!(
                                "a newer connection with the same certificate, for host {host}, took its place")),
                            _ => (Reason::Displaced,
                                "a newer connection for this host took its place".into()),
                        });
                    }
                    _ = async {
                        match &account {
                            Some(a) => a.cut_token().cancelled().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let why = account.as_ref().and_then(|a| a.why())
                            .map_or_else(|| "over its memory budget".into(), |w| w.to_string());
                        break 'conn Some((Reason::OverBudget, why));
                    }
                    _ = stopping.cancelled() => {
                        break 'conn Some((Reason::Stopped, "the receiver is stopping".into()));
                    }
                    _ = async {
                        match &unauthenticated {
                            Some(ticket) => ticket.evicted().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        break 'conn Some((Reason::Limit, "evicted before its hello: too many \
                            connections waiting for their handshake or hello".into()));
                    }
                    _ = tokio::time::sleep_until(hello_deadline), if conn.hello.is_none() => {
                        let grace = opts.hello_timeout.unwrap_or(HELLO_TIMEOUT);
                        break 'conn Some((Reason::Limit,
                            format!("no hello within {grace:?} of connecting")));
                    }
                    _ = &mut idle, if conn.hello.is_some() => {
                        break 'conn Some((Reason::Timeout, format!(
                            "nothing from the agent for {idle_timeout:?} (it sends a heartbeat at least every 10 s)")));
                    }
                    Ok(()) = async {
                        match assigned.as_mut() {
                            Some(rx) => rx.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let now = assigned.as_mut().and_then(|rx| rx.borrow_and_update().clone());
                        if let Some(list) = now {
                            if let Err(e) = send(&mut wr, &ControllerMessage::Welcome(list)).await {
                                break 'conn Some((Reason::Io, e));
                            }
                        }
                    }
                    r = &mut frame => break r,
                }
            }
        };
        let msg = match read {
            Ok(Some(m)) => m,
            // A clean end: TLS close_notify (or a FIN on plaintext) between frames.
            Ok(None) => break None,
            Err(_) if conn.hello.is_none() && speaks_tls(&first_bytes) => {
                break Some((
                    Reason::NotTls,
                    format!("the agent at {peer} speaks TLS but this listener does not (--insecure): give listen --tls-ca/--tls-cert/--tls-key, or remove tls: from the agent's agent.yaml"),
                ));
            }
            Err(e) => break Some((Reason::of_frame(&e), tls::plain(&e.to_string()))),
        };
        let env = match msg.decode(conn.limits()) {
            Ok(env) => env,
            Err(e) => break Some((Reason::of_wire(&e), e.to_string())),
        };
        drop(msg);
        let (kind, reply) = match conn.accept(env, &opts) {
            Ok(x) => x,
            Err(e) => break Some(e),
        };
        let mut replies: Vec<ControllerMessage> = reply.into_iter().collect();
        if let EventKind::Hello(h) = &kind {
            let host = conn.host.clone().unwrap_or_default();
            // Accepted: it no longer counts against the cap on unauthenticated connections,
            // and what it holds is its host's.
            unauthenticated.take();
            let a = budget.account(&host);
            match budget.charge(&Payer::Host(Arc::clone(&a)), SESSION_COST) {
                Ok(c) => session_charge = c,
                Err(e) => break Some((Reason::OverBudget, e.to_string())),
            }
            account = Some(a);
            let certificate = conn.identity.as_ref().map(|i| i.certificate.as_bytes());
            if live.claim(&claim, &host, certificate) > 0 {
                warn!(%peer, %host, "host connected again: closing its older session");
            }
            // The verdict first (protocol 2), then the host's assignment.
            if h.protocol_version >= VERDICT_VERSION {
                replies.push(ControllerMessage::Accepted {
                    host: h.host.clone(),
                });
            }
            let rx = assigned.get_or_insert_with(|| control.watch(&host, &opts.assign));
            replies.extend(
                rx.borrow_and_update()
                    .clone()
                    .map(ControllerMessage::Welcome),
            );
        }
        if sink.deliver(conn.event(kind)).await.is_err() {
            live.release(&claim);
            return;
        }
        // A peer whose frames are always ready must not keep this worker from the others.
        tokio::task::yield_now().await;
        for reply in &replies {
            if let Err(e) = send(&mut wr, reply).await {
                break 'conn Some((Reason::Io, e));
            }
        }
    };
    drop(session_charge);
    // The verdict on a refusal, to a peer whose hello said it speaks protocol 2 or later:
    // the agent logs why instead of only seeing the connection close. (Bytes that never made
    // a hello get no answer: they may not be our protocol at all, e.g. a TLS ClientHello.)
    // Bounded: a peer that does not read is not waited for.
    if let Some((
        reason @ (Reason::Identity | Reason::Protocol | Reason::Limit | Reason::OverBudget),
        text,
    )) = &end
    {
        if conn.peer_version.is_some_and(|v| v >= VERDICT_VERSION) {
            let refused = ControllerMessage::Refused {
                reason: reason.as_str().to_owned(),
                message: text.clone(),
            };
            let _ = tokio::time::timeout(STOP_GRACE, send(&mut wr, &refused)).await;
        }
    }
    // A TLS agent at this plaintext listener: answer its ClientHello with bytes that are not
    // TLS (a `refused` frame, readable in a capture), so the agent says "does not speak TLS"
    // from what it saw, rather than guessing from a silent close (which is also what a busy
    // controller's turning away looked like).
    let not_tls = matches!(&end, Some((Reason::NotTls, _))) && opts.tls.is_none();
    if let (true, Some((reason, text))) = (not_tls, &end) {
        let refused = ControllerMessage::Refused {
            reason: reason.as_str().to_owned(),
            message: text.clone(),
        };
        let _ = tokio::time::timeout(STOP_GRACE, send(&mut wr, &refused)).await;
    }
    if let Some(summary) = conn.warnings.finish() {
        warn!(%peer, host = conn.host_or_dash(), "rejected resvals: {summary}");
    }
    live.release(&claim);
    match &end {
        None => info!(%peer, host = conn.host_or_dash(), "agent disconnected"),
        // Not a clean close: worth a warning (a killed agent, a host or network down).
        Some((Reason::Closed, how)) => {
            warn!(%peer, host = conn.host_or_dash(), how = %how, "agent disconnected")
        }
        Some((Reason::Stopped | Reason::Displaced, e)) => {
            info!(%peer, host = conn.host_or_dash(), "closing agent connection: {e}")
        }
        Some((Reason::OverBudget, e)) => {
            error!(%peer, host = conn.host_or_dash(), used = budget.used(), total = budget.total(),
                   share = budget.share(), error = %escape(e),
                   "dropping agent connection: over its memory budget")
        }
        Some((_, e)) => {
            error!(%peer, host = conn.host_or_dash(), error = %escape(e), "dropping agent connection")
        }
    }
    // TLS close_notify (a FIN on plaintext), bounded: a peer that does not read is cut.
    let _ = tokio::time::timeout(WRITE_TIMEOUT.min(STOP_GRACE), wr.shutdown()).await;
    if not_tls {
        // Read what is left of its ClientHello (bounded) before closing: closing with unread
        // bytes sends a reset, which may reach the agent before the answer above.
        let drain = async {
            use tokio::io::AsyncReadExt as _;
            let mut buf = [0u8; 4096];
            let mut left: usize = 64 * 1024;
            while left > 0 {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(STOP_GRACE, drain).await;
    }
    let (reason, text) = match end {
        Some((r, t)) => (Some(r), Some(t)),
        None => (Some(Reason::Closed), None),
    };
    let mut ev = conn.event(EventKind::Closed(text));
    ev.reason = reason;
    let _ = sink.deliver(ev).await;
}

/// Whether a plaintext connection's first bytes were a TLS record.
fn speaks_tls(first: &tls::FirstBytes) -> bool {
    tls::looks_like_tls(&first.lock().unwrap_or_else(|p| p.into_inner()))
}

async fn send<W: AsyncWrite + Unpin>(wr: &mut W, msg: &ControllerMessage) -> Result<(), String> {
    let frame = wire::encode_controller(msg).map_err(|e| e.to_string())?;
    let write = async {
        wr.write_all(&frame).await?;
        wr.flush().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("write failed: {e}")),
        Err(_) => Err("write timed out (agent not reading)".into()),
    }
}

/// Per-connection protocol state.
struct Conn {
    peer: Peer,
    hello: Option<Arc<Hello>>,
    /// The hello's host, canonical.
    host: Option<String>,
    session: u64,
    /// On the worker's door: the host every hello speaks for (the receiver's own).
    forced_host: Option<String>,
    /// Indices into the hello's resources, sorted by (name, instance).
    declared: Vec<u32>,
    last_seq: u64,
    /// After a hello the next batch must be a full snapshot.
    need_full: bool,
    warnings: Warnings,
    /// From the client certificate; `None` on a plaintext connection.
    identity: Option<Arc<Identity>>,
    /// The protocol version of the last hello decoded (accepted or not).
    peer_version: Option<u16>,
}

impl Conn {
    fn host_or_dash(&self) -> &str {
        self.host.as_deref().unwrap_or("-")
    }

    /// What the next frame may hold: no more resvals than the hello declared. Before the
    /// hello, the protocol's bounds (a batch then is refused as out of order).
    fn limits(&self) -> FrameLimits {
        match self.hello {
            None => FrameLimits::default(),
            Some(_) => FrameLimits::after_hello(self.declared.len()),
        }
    }

    /// The largest next frame: before an accepted hello, what the largest hello may take
    /// (a connection not yet authenticated cannot make the receiver hold 8 MiB).
    fn frame_bytes(&self) -> usize {
        match self.hello {
            None => MAX_HELLO_FRAME_BYTES,
            Some(_) => wire::MAX_FRAME_BYTES,
        }
    }

    fn event(&self, kind: EventKind) -> Event {
        Event {
            peer: self.peer,
            host: self.host.clone(),
            session: self.session,
            kind,
            identity: self.identity.clone(),
            reason: None,
        }
    }

    /// Validate one message; the event to report and the reply to send, or why the
    /// connection must be dropped. (The welcome after a hello is the caller's: it knows the
    /// host's assignment.)
    fn accept(
        &mut self,
        env: Envelope,
        opts: &ListenOpts,
    ) -> Result<(EventKind, Option<ControllerMessage>), (Reason, String)> {
        let protocol = |e: String| (Reason::Protocol, e);
        match env {
            Envelope::Hello(h) => {
                self.peer_version = Some(h.protocol_version);
                if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&h.protocol_version) {
                    return Err(protocol(format!(
                        "protocol version {} not supported (this receiver speaks \
                         {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION})",
                        h.protocol_version
                    )));
                }
                if h.host.is_empty() {
                    return Err(protocol("hello without a host name".into()));
                }
                check_hello(&h).map_err(|e| {
                    let reason = match e {
                        HelloError::TextTooLong { .. } => Reason::Limit,
                        _ => Reason::Protocol,
                    };
                    (reason, format!("hello refused: {e}"))
                })?;
                if let Some(id) = &self.identity {
                    if !tls::cert_names_host(&id.dns_names, &h.host, &opts.domains) {
                        return Err((Reason::Identity, format!(
                            "certificate {:?} (DNS SANs: [{}]) claimed host {:?}, which it does not name; refused",
                            id.subject,
                            id.dns_names.join(", "),
                            h.host
                        )));
                    }
                }
                let host = match &self.forced_host {
                    Some(own) => own.clone(),
                    None => canonical_host(&h.host, &opts.domains),
                };
                if let Some(old) = &self.host {
                    if *old != host {
                        return Err(protocol(format!(
                            "host changed from {old} to {host} on one connection"
                        )));
                    }
                }
                if h.resources.iter().any(|d| d.name.is_empty()) {
                    return Err(protocol("hello declares a resource without a name".into()));
                }
                // The declared set as indices into the hello, sorted by (name, instance):
                // the names are kept once, in the hello the host table shares.
                let key = |i: &u32| {
                    let d = &h.resources[*i as usize];
                    (d.name.as_str(), d.instance.as_str())
                };
                let mut declared: Vec<u32> = (0..h.resources.len() as u32).collect();
                declared.sort_unstable_by(|a, b| key(a).cmp(&key(b)));
                if let Some(w) = declared.windows(2).find(|w| key(&w[0]) == key(&w[1])) {
                    let (name, instance) = key(&w[0]);
                    return Err(protocol(format!(
                        "hello declares {name}@{instance:?} twice"
                    )));
                }
                let h = Arc::new(h);
                self.declared = declared;
                self.need_full = true;
                self.hello = Some(Arc::clone(&h));
                self.host = Some(host);
                Ok((EventKind::Hello(h), None))
            }
            Envelope::Batch(mut batch) => {
                if self.hello.is_none() {
                    return Err(protocol("batch before hello".into()));
                }
                if batch.seq <= self.last_seq {
                    return Err(protocol(format!(
                        "batch seq {} does not increase (last {})",
                        batch.seq, self.last_seq
                    )));
                }
                if self.need_full && !batch.full {
                    return Err(protocol(format!(
                        "delta (seq {}) before the full snapshot that must follow hello",
                        batch.seq
                    )));
                }
                self.last_seq = batch.seq;
                if batch.full {
                    self.need_full = false;
                }
                let mut rejected = Vec::new();
                let mut seen = BTreeSet::new();
                let mut kept = Vec::with_capacity(batch.resvals.len());
                let now = tokio::time::Instant::now();
                for r in batch.resvals.drain(..) {
                    match self.check(&r, &mut seen) {
                        Ok(()) => kept.push(r),
                        Err((kind, why)) => {
                            if self.warnings.admit(kind, now) {
                                warn!(host = self.host_or_dash(), name = %escape(&r.name),
                                      instance = %escape(&r.instance), reason = %escape(&why),
                                      "rejected resval (more like it are summarised)");
                            }
                            rejected.push((r, why));
                        }
                    }
                }
                if let Some(summary) = self.warnings.summary_due(now) {
                    warn!(host = self.host_or_dash(), "rejected resvals: {summary}");
                }
                batch.resvals = kept;
                let reply = opts.ack.then_some(ControllerMessage::Ack(batch.seq));
                Ok((EventKind::Batch { batch, rejected }, reply))
            }
            Envelope::Heartbeat(hb) => {
                if self.hello.is_none() {
                    return Err(protocol("heartbeat before hello".into()));
                }
                if hb.seq != self.last_seq {
                    return Err(protocol(format!(
                        "heartbeat names seq {} but the last batch was {}",
                        hb.seq, self.last_seq
                    )));
                }
                Ok((EventKind::Heartbeat(hb), None))
            }
        }
    }

    /// Why a resval does not fit: its kind (what the warning summary counts) and the text.
    fn check(&self, r: &Resval, seen: &mut BTreeSet<u32>) -> Result<(), (&'static str, String)> {
        if r.name.is_empty() {
            return Err(("empty name", "empty name".into()));
        }
        check_names(&r.name, &r.instance).map_err(|e| ("bad name", e.to_string()))?;
        let resources = self.hello.as_ref().map_or(&[][..], |h| &h.resources[..]);
        let found = self.declared.binary_search_by(|i| {
            let d = &resources[*i as usize];
            (d.name.as_str(), d.instance.as_str()).cmp(&(r.name.as_str(), r.instance.as_str()))
        });
        let Ok(at) = found else {
            return Err(("undeclared", "not declared in hello".into()));
        };
        let index = self.declared[at];
        let valtype = &resources[index as usize].valtype;
        if !seen.insert(index) {
            return Err(("twice in one batch", "appears twice in one batch".into()));
        }
        let fits = match (&r.value, valtype) {
            (Value::Unknown, _) => true,
            (Value::Numeric(x), Valtype::Numeric) => x.is_finite(),
            (Value::String(s), Valtype::String) if s.len() > MAX_STRING_VALUE => {
                return Err((
                    "string too long",
                    format!(
                        "string value of {} bytes, over the protocol's {MAX_STRING_VALUE}-byte cap",
                        s.len()
                    ),
                ))
            }
            (Value::String(_), Valtype::String) => true,
            (Value::Boolean(_), Valtype::Boolean) => true,
            _ => false,
        };
        if fits {
            Ok(())
        } else {
            Err((
                "wrong type",
                format!("value {} does not fit valtype {valtype}", r.value),
            ))
        }
    }
}

impl Event {
    /// The printed form: one line per resval for a batch (rejected ones marked), one line
    /// for everything else.
    pub fn lines(&self, format: LineFormat) -> Vec<String> {
        let host = self.host.as_deref().unwrap_or("-");
        match format {
            LineFormat::Text => self.text_lines(host),
            LineFormat::Json => self
                .json_values(host)
                .into_iter()
                .map(|v| v.to_string())
                .collect(),
        }
    }

    /// Every peer-supplied text is escaped (see `crate::text`): each line printed here is
    /// exactly one event or resval, whatever the agent sent.
    fn text_lines(&self, host: &str) -> Vec<String> {
        let peer = self.peer;
        let host = escape(host);
        match &self.kind {
            EventKind::Connected => vec![format!("{host} connect peer={peer}")],
            EventKind::Hello(h) => vec![format!(
                "{host} hello protocol={} agent={} boot_id={} digest={} resources={} peer={peer}",
                h.protocol_version,
                escape(&h.agent_version),
                escape(&h.boot_id),
                escape(&h.config_digest),
                h.resources.len()
            )],
            EventKind::Heartbeat(hb) => vec![format!("{host} heartbeat seq={}", hb.seq)],
            EventKind::Closed(None) => vec![format!("{host} closed peer={peer}")],
            // An end of stream without close_notify is a close too (a power cut, kill -9).
            EventKind::Closed(Some(e)) if self.reason == Some(Reason::Closed) => {
                vec![format!("{host} closed peer={peer} how={e:?}")]
            }
            EventKind::Closed(Some(e)) => {
                let reason = self.reason.map_or("-", Reason::as_str);
                vec![format!(
                    "{host} dropped peer={peer} reason={reason} error={e:?}"
                )]
            }
            EventKind::Batch { batch, rejected } => {
                let kind = if batch.full { "full" } else { "delta" };
                let mut out: Vec<String> = batch
                    .resvals
                    .iter()
                    .map(|r| {
                        let mut line = format!(
                            "{host} {} {} {} last_report={} seq={} {kind}",
                            display_name(r),
                            r.status,
                            escape(&r.value.exact()),
                            r.last_report_ms.map_or("never".into(), rfc3339),
                            batch.seq
                        );
                        if let Some(e) = &r.error {
                            line.push_str(&format!(" error={:?}", e.to_string()));
                        }
                        line
                    })
                    .collect();
                out.extend(rejected.iter().map(|(r, why)| {
                    format!(
                        "{host} {} REJECTED {why:?} seq={} {kind}",
                        display_name(r),
                        batch.seq
                    )
                }));
                if out.is_empty() {
                    out.push(format!("{host} batch seq={} {kind} (empty)", batch.seq));
                }
                out
            }
        }
    }

    fn json_values(&self, host: &str) -> Vec<serde_json::Value> {
        let peer = self.peer.to_string();
        match &self.kind {
            EventKind::Connected => vec![json!({"event": "connect", "host": host, "peer": peer})],
            EventKind::Hello(h) => vec![json!({
                "event": "hello", "host": host, "peer": peer,
                "protocol_version": h.protocol_version, "agent_version": h.agent_version,
                "boot_id": h.boot_id, "config_digest": h.config_digest,
                "resources": h.resources.iter().map(|d| json!({
                    "name": d.name, "instance": d.instance, "valtype": d.valtype,
                    "interval_ms": d.interval_ms, "shared": d.shared,
                })).collect::<Vec<_>>(),
            })],
            EventKind::Heartbeat(hb) => vec![json!({
                "event": "heartbeat", "host": host, "seq": hb.seq, "sent_at_ms": hb.sent_at_ms,
            })],
            EventKind::Closed(e) => vec![json!({
                "event": if e.is_none() || self.reason == Some(Reason::Closed) { "closed" } else { "dropped" },
                "host": host, "peer": peer, "error": e,
                "reason": self.reason.map(Reason::as_str),
            })],
            EventKind::Batch { batch, rejected } => {
                let one = |r: &Resval, rejected: Option<&str>| {
                    let mut v = json!({
                        "event": "resval", "host": host, "name": r.name, "instance": r.instance,
                        "value": r.value, "status": r.status, "last_report_ms": r.last_report_ms,
                        "error": r.error, "seq": batch.seq, "full": batch.full,
                        "sent_at_ms": batch.sent_at_ms,
                    });
                    if let (Some(why), Some(obj)) = (rejected, v.as_object_mut()) {
                        obj.insert("rejected".into(), why.into());
                    }
                    v
                };
                let mut out: Vec<_> = batch.resvals.iter().map(|r| one(r, None)).collect();
                out.extend(rejected.iter().map(|(r, why)| one(r, Some(why))));
                if out.is_empty() {
                    out.push(json!({
                        "event": "batch", "host": host, "seq": batch.seq, "full": batch.full,
                        "sent_at_ms": batch.sent_at_ms, "resvals": 0,
                    }));
                }
                out
            }
        }
    }
}

/// `name` or `name@instance`, escaped.
fn display_name(r: &Resval) -> String {
    if r.instance.is_empty() {
        escape(&r.name).into_owned()
    } else {
        format!("{}@{}", escape(&r.name), escape(&r.instance))
    }
}

fn rfc3339(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}
