//! The agent's side of the link: keep one connection to the first reachable controller and
//! keep the controller's copy of this host's resvals true.
//!
//! Per connection: hello, a full snapshot, then deltas (the resvals that changed since the
//! last batch, coalesced over a short window) and heartbeats when idle. A new hello or a new
//! store generation (reload) sends hello + full snapshot again. On any failure the
//! connection is dropped and re-made with jittered exponential backoff, starting from a
//! full snapshot: nothing is replayed, so nothing needs to be queued. The store is the only
//! thing shared with the probes, and it holds one slot per resource: while the controller is
//! away or reads slowly, memory is the store plus the one frame being written.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::compat::TokioAsyncReadCompatExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::assignment::Assigned;
use super::name_rules::check_names;
use super::pace::{Pace, CONTROLLER_MESSAGES_PER_SEC};
use super::tls::{self, LinkStream};
use super::warning_throttle::{Warnings, WARN_INTERVAL};
use super::wire::{self, Batch, ControllerMessage, Envelope, Heartbeat, Hello, WireError};
use crate::config::agent::normalize_controller;
use crate::store::{Store, Versions};
use crate::text::escape;
use crate::value::unix_ms;
use tokio::net::UnixStream;

/// How the link behaves. `Default` gives production values; tests shrink the durations.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// "host:port", "host" (port 6870), "\[v6\]:port"; tried in order each round.
    pub controllers: Vec<String>,
    /// After a change, wait this long for more before sending the delta (agent.yaml's
    /// `coalesce`); zero sends at once.
    pub coalesce: Duration,
    /// Send a heartbeat after this long without any message.
    pub heartbeat: Duration,
    /// A write (one frame) that takes longer than this means the controller is gone or
    /// not reading: drop the connection.
    pub write_timeout: Duration,
    /// Per controller, per round.
    pub connect_timeout: Duration,
    /// Reconnect delay grows from `backoff_min` doubling up to `backoff_max`, each delay
    /// drawn uniformly between `backoff_min` and the current cap (jitter spreads the
    /// reconnects of a whole cluster after a controller restart).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// TCP keepalive, so an idle half-open connection (controller host vanished) is noticed.
    pub keepalive: Option<Keepalive>,
    /// `None` is plaintext, which agent.yaml only allows with `insecure_plaintext: true`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `tls.ca` in agent.yaml, named when the controller's certificate is not from it.
    pub tls_ca: Option<std::path::PathBuf>,
    pub handshake_timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            controllers: Vec::new(),
            coalesce: crate::config::limits::DEFAULT_COALESCE,
            heartbeat: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            keepalive: Some(Keepalive {
                idle: Duration::from_secs(30),
                interval: Duration::from_secs(10),
                count: 3,
            }),
            tls: None,
            tls_ca: None,
            handshake_timeout: tls::HANDSHAKE_TIMEOUT,
        }
    }
}

/// Where the link is; watched by tests and reported by the metrics endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Trying the controller list.
    Connecting,
    /// Hello and the full snapshot went out to this controller.
    Connected { controller: String },
    /// Every controller failed this round; waiting before the next.
    Backoff,
    /// `run` returned (shutdown).
    Stopped,
}

/// Counters for `/metrics`. Monotonic except `in_flight`.
#[derive(Debug)]
pub struct LinkStats {
    /// Connections established (TCP connect succeeded).
    pub connects: AtomicU64,
    /// Connection attempts that failed (refused, timed out, unresolvable).
    pub connect_failures: AtomicU64,
    /// Established connections that ended in an error.
    pub disconnects: AtomicU64,
    pub batches: AtomicU64,
    pub full_batches: AtomicU64,
    pub heartbeats: AtomicU64,
    pub resvals_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub write_timeouts: AtomicU64,
    pub acks: AtomicU64,
    pub last_ack_seq: AtomicU64,
    /// Unix ms of the last ack (0: none yet).
    pub last_ack_ms: AtomicU64,
    /// Store version the controller has everything up to (for `xce-agent status`).
    pub sent_version: AtomicU64,
    /// Unix ms of the last change of `state` (when `Connected`: connected since).
    pub state_since_ms: AtomicU64,
    pub welcomes: AtomicU64,
    /// Welcomes refused because a name broke the resource-name rules (the connection stays).
    pub welcomes_refused: AtomicU64,
    /// Frames being written right now: 0 or 1 by construction (the link never queues).
    pub in_flight: AtomicU64,
    /// Highest `in_flight` ever seen, for the tests' boundedness check.
    pub max_in_flight: AtomicU64,
    /// TLS handshakes that failed, by [`tls::Failure::index`].
    pub tls_failures: [AtomicU64; tls::Failure::ALL.len()],
    /// Unix seconds at which this host's certificate expires; 0 without TLS.
    pub cert_not_after: AtomicI64,
    /// Unix ms since when the link has been down (0 while up): set when it goes down, kept
    /// across retries, cleared when a controller takes the link.
    pub down_since_ms: AtomicU64,
    /// Connection attempts since the link was last up.
    pub attempts: AtomicU64,
    last_error: std::sync::Mutex<Option<LinkError>>,
    state: watch::Sender<LinkState>,
}

/// Why the link last failed, in the admin's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkError {
    pub reason: ErrorReason,
    /// What happened and what to do, naming the controller.
    pub message: String,
    pub controller: String,
    pub at_ms: u64,
}

/// The class of a link failure: a label for `/metrics` and `status --format json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReason {
    /// No TCP connection (refused, timed out, name unknown).
    Unreachable,
    /// This agent speaks TLS, the controller does not.
    ControllerNotTls,
    /// The controller speaks TLS, this agent does not.
    AgentNotTls,
    /// The controller's certificate is not from `tls.ca`.
    UnknownCa,
    /// A certificate (the controller's) is expired or not valid yet.
    Expired,
    Revoked,
    /// The controller's certificate is for another name.
    WrongName,
    /// The controller refused this agent's certificate (a TLS alert).
    CertificateRefused,
    /// The controller turned the connection away before the TLS handshake: too many
    /// connections waiting for theirs.
    Busy,
    /// Another TLS failure (a stalled handshake, ...).
    Tls,
    /// The controller's verdict: `refused`.
    Refused,
    /// The controller closed the connection (a restart, a stop).
    Closed,
    /// The controller stopped reading.
    WriteTimeout,
    /// The connection broke (reset, a failed write).
    Io,
    /// The controller sent what is not the protocol.
    Protocol,
}

impl ErrorReason {
    pub const ALL: [ErrorReason; 15] = [
        ErrorReason::Unreachable,
        ErrorReason::ControllerNotTls,
        ErrorReason::AgentNotTls,
        ErrorReason::UnknownCa,
        ErrorReason::Expired,
        ErrorReason::Revoked,
        ErrorReason::WrongName,
        ErrorReason::CertificateRefused,
        ErrorReason::Busy,
        ErrorReason::Tls,
        ErrorReason::Refused,
        ErrorReason::Closed,
        ErrorReason::WriteTimeout,
        ErrorReason::Io,
        ErrorReason::Protocol,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::Unreachable => "unreachable",
            ErrorReason::ControllerNotTls => "controller_not_tls",
            ErrorReason::AgentNotTls => "agent_not_tls",
            ErrorReason::UnknownCa => "unknown_ca",
            ErrorReason::Expired => "expired",
            ErrorReason::Revoked => "revoked",
            ErrorReason::WrongName => "wrong_name",
            ErrorReason::CertificateRefused => "certificate_refused",
            ErrorReason::Busy => "busy",
            ErrorReason::Tls => "tls",
            ErrorReason::Refused => "refused",
            ErrorReason::Closed => "closed",
            ErrorReason::WriteTimeout => "write_timeout",
            ErrorReason::Io => "io",
            ErrorReason::Protocol => "protocol",
        }
    }
}

impl Default for LinkStats {
    fn default() -> Self {
        Self {
            connects: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            full_batches: AtomicU64::new(0),
            heartbeats: AtomicU64::new(0),
            resvals_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            write_timeouts: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            last_ack_seq: AtomicU64::new(0),
            last_ack_ms: AtomicU64::new(0),
            sent_version: AtomicU64::new(0),
            state_since_ms: AtomicU64::new(unix_ms(SystemTime::now())),
            welcomes: AtomicU64::new(0),
            welcomes_refused: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            tls_failures: Default::default(),
            cert_not_after: AtomicI64::new(0),
            down_since_ms: AtomicU64::new(unix_ms(SystemTime::now())),
            attempts: AtomicU64::new(0),
            last_error: std::sync::Mutex::new(None),
            state: watch::channel(LinkState::Connecting).0,
        }
    }
}

impl LinkStats {
    pub fn state(&self) -> LinkState {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    fn set_state(&self, s: LinkState) {
        let now = unix_ms(SystemTime::now());
        self.state_since_ms.store(now, Ordering::Relaxed);
        if matches!(s, LinkState::Connected { .. }) {
            self.down_since_ms.store(0, Ordering::Relaxed);
            self.attempts.store(0, Ordering::Relaxed);
        } else {
            // Down since the first moment it went down, not since this retry.
            let _ =
                self.down_since_ms
                    .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.state.send_replace(s);
    }

    /// The last failure of the link (kept once it is up again, until the next one).
    pub fn last_error(&self) -> Option<LinkError> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Record a failure, said once in the log at `level` by the caller.
    fn failed(&self, controller: &str, reason: ErrorReason, message: String) {
        let e = LinkError {
            reason,
            message,
            controller: controller.to_owned(),
            at_ms: unix_ms(SystemTime::now()),
        };
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    /// (down since, attempts): what a connection the controller never took must not reset.
    fn outage(&self) -> (u64, u64) {
        (
            self.down_since_ms.load(Ordering::Relaxed),
            self.attempts.load(Ordering::Relaxed),
        )
    }

    fn restore_outage(&self, (down_since, attempts): (u64, u64)) {
        let since = if down_since == 0 {
            unix_ms(SystemTime::now())
        } else {
            down_since
        };
        self.down_since_ms.store(since, Ordering::Relaxed);
        self.attempts.store(attempts, Ordering::Relaxed);
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn tls_failures(&self, why: tls::Failure) -> u64 {
        self.tls_failures[why.index()].load(Ordering::Relaxed)
    }
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("write timed out after {0:?} (controller not reading?)")]
    WriteTimeout(Duration),
    #[error("write failed: {0}")]
    Write(std::io::Error),
    #[error("controller closed the connection")]
    Closed,
    #[error("reading from the controller: {0}")]
    Read(WireError),
    #[error("encoding: {0}")]
    Encode(WireError),
    #[error("TLS: {1}")]
    Tls(tls::Failure, String),
    #[error("shutting down")]
    Shutdown,
    /// The controller's verdict (protocol 2): it will not take this connection.
    #[error("refused by the controller ({reason}): {message}")]
    Refused { reason: String, message: String },
}

/// Run the link until `shutdown` is cancelled. Never returns early: every failure is
/// logged and followed by a reconnect. `assigned` receives the controller's `welcome`
/// assignments (kept across reconnects until the next welcome).
pub async fn run(
    cfg: LinkConfig,
    store: Arc<Store>,
    mut hello: watch::Receiver<Arc<Hello>>,
    assigned: watch::Sender<Assigned>,
    stats: Arc<LinkStats>,
    shutdown: CancellationToken,
) {
    if cfg.controllers.is_empty() {
        // Config validation should have refused this; do not spin on an empty list.
        warn!("no controllers configured; the link stays idle");
        stats.set_state(LinkState::Backoff);
        shutdown.cancelled().await;
        stats.set_state(LinkState::Stopped);
        return;
    }
    let mut backoff = Backoff::new(cfg.backoff_min, cfg.backoff_max);
    let assigned = Arc::new(assigned);
    // The last failure logged at WARN or above: the same one again, retry after retry, is
    // logged at DEBUG only (status and /metrics keep counting it).
    let mut last_said: Option<(ErrorReason, String)> = None;
    'rounds: while !shutdown.is_cancelled() {
        stats.set_state(LinkState::Connecting);
        let mut refused_round = false;
        for addr in &cfg.controllers {
            LinkStats::add(&stats.attempts, 1);
            let stream = tokio::select! {
                _ = shutdown.cancelled() => break 'rounds,
                r = connect(addr, &cfg) => r,
            };
            let (stream, first_bytes) = match stream {
                Ok(s) => s,
                Err(ConnectError::Tcp(e)) => {
                    LinkStats::add(&stats.connect_failures, 1);
                    let words = unreachable_words(addr, &e, &cfg);
                    debug!(controller = %addr, "{words}");
                    stats.failed(addr, ErrorReason::Unreachable, words);
                    continue;
                }
                Err(ConnectError::Tls(why, reason, words)) => {
                    LinkStats::add(&stats.connect_failures, 1);
                    LinkStats::add(&stats.tls_failures[why.index()], 1);
                    say(&mut last_said, addr, reason, &words, "");
                    stats.failed(addr, reason, words);
                    continue;
                }
            };
            LinkStats::add(&stats.connects, 1);
            let started = Instant::now();
            let outage = stats.outage();
            let mut session = Session::new(
                stream,
                addr,
                &cfg,
                &store,
                &stats,
                &assigned,
                &shutdown,
                first_bytes,
            );
            let mut end = session.run(addr, &mut hello).await;
            if !session.accepted.load(Ordering::Relaxed)
                && matches!(end, Err(SessionError::Write(_) | SessionError::Closed))
            {
                // TLS 1.3: a controller that refuses this agent's certificate says so with an
                // alert after the agent's handshake ended; a write may fail on the closed
                // connection first. What the reader saw is the cause, every time.
                if let Ok(Ok(seen)) = tokio::time::timeout(CAUSE_GRACE, &mut session.reader).await {
                    if matches!(seen, SessionError::Tls(..) | SessionError::Refused { .. }) {
                        end = Err(seen);
                    }
                }
            }
            if matches!(end, Err(SessionError::Shutdown)) && session.seq > 0 {
                // Connected and stopping: the controller gets what changed since the last
                // batch, so a clean stop loses no value.
                session.flush(&mut hello).await;
            }
            match &end {
                Err(SessionError::Tls(..) | SessionError::Refused { .. }) => {
                    session.unconfirmed.discard()
                }
                _ => session.unconfirmed.commit(&stats),
            }
            session.reader.abort();
            let accepted = session.accepted.load(Ordering::Relaxed);
            let first = session.first_bytes();
            let mut refused = false;
            match end {
                Err(SessionError::Shutdown) => break 'rounds,
                Err(e) => {
                    LinkStats::add(&stats.disconnects, 1);
                    if let SessionError::Tls(why, _) = &e {
                        LinkStats::add(&stats.tls_failures[why.index()], 1);
                    }
                    refused = matches!(e, SessionError::Refused { .. });
                    let (reason, words) = session_words(addr, &e, first.as_deref());
                    if refused || !matches!(reason, ErrorReason::Closed) {
                        // The connection is ended on purpose here: close TLS properly.
                        session.close().await;
                    }
                    let never_up = !accepted
                        && (refused
                            || matches!(e, SessionError::Tls(..))
                            || reason == ErrorReason::AgentNotTls);
                    if never_up {
                        // The controller never took this link: the outage goes on.
                        stats.restore_outage(outage);
                    } else {
                        last_said = None;
                    }
                    if refused {
                        if last_said.as_ref().map(|(_, w)| w) != Some(&words) {
                            error!(controller = %addr, reason = reason.as_str(),
                                   "{words}; backing off {:?} between tries", cfg.backoff_max);
                            last_said = Some((reason, words.clone()));
                        }
                    } else {
                        let lost = if never_up {
                            ""
                        } else {
                            "link to controller lost: "
                        };
                        say(&mut last_said, addr, reason, &words, lost);
                    }
                    stats.failed(addr, reason, words);
                }
                Ok(()) => {}
            }
            // A connection that held for a while was a success: reconnect quickly. One that
            // failed right away (controller accepts and closes) keeps the backoff growing;
            // a refusal waits at least half the longest backoff (the controller said no:
            // asking again at once would only repeat it).
            refused_round = refused;
            if !refused && started.elapsed() >= cfg.backoff_max {
                backoff.reset();
            }
            break;
        }
        stats.set_state(LinkState::Backoff);
        let delay = if refused_round {
            backoff.after_refusal()
        } else {
            backoff.next_delay()
        };
        debug!(?delay, "waiting before reconnecting");
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    stats.set_state(LinkState::Stopped);
}

/// The address to dial for a `controllers:` entry, the default port added where it gives
/// none (agent.yaml's entries are already in this form; a `LinkConfig` built in code may not be).
fn dial_address(addr: &str) -> std::io::Result<String> {
    normalize_controller(addr)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

enum ConnectError {
    Tcp(std::io::Error),
    /// The handshake's failure label, the class, and what happened in words.
    Tls(tls::Failure, ErrorReason, String),
}

/// A connection, and on plaintext the first bytes the controller sends (a TLS controller
/// answers a plaintext hello with a TLS alert record).
type Connected = (Box<dyn LinkStream>, Option<tls::FirstBytes>);

async fn connect(addr: &str, cfg: &LinkConfig) -> Result<Connected, ConnectError> {
    if let Some(path) = crate::config::agent::unix_path(addr) {
        // The worker's socket on this node: no TLS (the worker knows the agent by its uid).
        let stream = tokio::time::timeout(cfg.connect_timeout, UnixStream::connect(path))
            .await
            .map_err(|_| {
                ConnectError::Tcp(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connect timed out",
                ))
            })?
            .map_err(ConnectError::Tcp)?;
        return Ok((Box::new(stream), None));
    }
    let target = dial_address(addr).map_err(ConnectError::Tcp)?;
    let stream = connect_tcp(&target, cfg).await.map_err(ConnectError::Tcp)?;
    let first = tls::FirstBytes::default();
    let stream = tls::Sniff::new(stream, Arc::clone(&first));
    let Some(tls_cfg) = &cfg.tls else {
        return Ok((Box::new(stream), Some(first)));
    };
    let name = tls::server_name(&target).map_err(|e| {
        ConnectError::Tls(
            tls::Failure::WrongName,
            ErrorReason::WrongName,
            format!("the controller at {addr}: {e}"),
        )
    })?;
    let handshake = tokio_rustls::TlsConnector::from(Arc::clone(tls_cfg)).connect(name, stream);
    match tokio::time::timeout(cfg.handshake_timeout, handshake).await {
        Ok(Ok(s)) => Ok((Box::new(s), None)),
        Ok(Err(e)) => {
            let why = tls::Failure::of(&e);
            let first = first.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let (reason, words) = handshake_words(addr, cfg, why, &e, &first);
            Err(ConnectError::Tls(why, reason, words))
        }
        Err(_) => Err(ConnectError::Tls(
            tls::Failure::Timeout,
            ErrorReason::Tls,
            format!(
                "the controller at {addr} did not finish the TLS handshake within {:?} (stalled, or not a controller)",
                cfg.handshake_timeout
            ),
        )),
    }
}

/// Log a failure at WARN once; the same failure again (every retry of an outage) at DEBUG.
/// `lost`: "link to controller lost: " where a link that was up went down.
fn say(
    last: &mut Option<(ErrorReason, String)>,
    addr: &str,
    reason: ErrorReason,
    words: &str,
    lost: &str,
) {
    if last.as_ref().map(|(_, w)| w.as_str()) == Some(words) {
        debug!(controller = %addr, reason = reason.as_str(), "{lost}{words} (again)");
        return;
    }
    warn!(controller = %addr, reason = reason.as_str(), "{lost}{words}; reconnecting");
    *last = Some((reason, words.to_owned()));
}

/// The host part of a `controllers:` entry, as its certificate should name it.
fn host_part(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((h, port)) if port.parse::<u16>().is_ok() && !h.ends_with(':') => h,
        _ => addr,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

fn unreachable_words(addr: &str, e: &std::io::Error, cfg: &LinkConfig) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => format!(
            "the controller at {addr} refused the connection: nothing listens there (is the controller running, on that port?)"
        ),
        K::TimedOut => format!(
            "no answer from the controller at {addr} within {:?} (host down, or a firewall?)",
            cfg.connect_timeout
        ),
        _ => format!(
            "cannot connect to the controller at {addr}: {}",
            tls::plain(&e.to_string())
        ),
    }
}

/// Why the TLS handshake with the controller at `addr` failed, in the admin's words.
fn handshake_words(
    addr: &str,
    cfg: &LinkConfig,
    why: tls::Failure,
    e: &std::io::Error,
    first: &[u8],
) -> (ErrorReason, String) {
    use rustls::CertificateError as C;
    use tls::Failure as F;
    let host = host_part(addr);
    let human = |t: &rustls::pki_types::UnixTime| tls::human_time(t.as_secs() as i64);
    match why {
        // What was seen, each its own words: an answer that is not TLS; a close with no
        // answer at all (a busy controller that predates the busy alert, one refusing this
        // address, and a plaintext one all look like this: said as such, not guessed); a
        // close after a TLS answer; the controller's own "busy" alert.
        F::NotTls | F::Truncated if !first.is_empty() && !tls::looks_like_tls(first) => (
            ErrorReason::ControllerNotTls,
            format!(
                "the controller at {addr} does not speak TLS (it answered this agent's TLS hello with something else): is it running with --insecure / without tls?"
            ),
        ),
        F::NotTls | F::Truncated if first.is_empty() => (
            ErrorReason::Closed,
            format!(
                "the controller at {addr} closed the connection during the TLS handshake without answering: it may be busy (too many connections waiting) or refusing this address, or not speak TLS (running with --insecure / without tls?); its log says which"
            ),
        ),
        F::Truncated => (
            ErrorReason::Closed,
            format!(
                "the controller at {addr} closed the connection during the TLS handshake, after answering (busy, or it refused this agent without saying why: its log says which)"
            ),
        ),
        F::Busy => (
            ErrorReason::Busy,
            format!(
                "the controller at {addr} is busy: it turned this connection away before the TLS handshake (too many connections waiting for theirs, from all or from this agent's address); retrying"
            ),
        ),
        F::UnknownCa => {
            let ca = cfg
                .tls_ca
                .as_ref()
                .map(|p| format!(" ({})", p.display()))
                .unwrap_or_default();
            (
                ErrorReason::UnknownCa,
                format!(
                    "the certificate of the controller at {addr} is not signed by the CA in tls.ca{ca}: is tls.ca the CA that signed {host}'s certificate?"
                ),
            )
        }
        F::Expired => {
            let words = match tls::certificate_error(e) {
                Some(C::ExpiredContext { time, not_after }) => format!(
                    "the certificate of the controller at {addr} expired on {} (this host's clock says {}): renew {host}'s certificate",
                    human(not_after),
                    human(time)
                ),
                Some(C::NotValidYetContext { time, not_before }) => format!(
                    "the certificate of the controller at {addr} is not valid before {} and this host's clock says {}: is this host's clock right?",
                    human(not_before),
                    human(time)
                ),
                _ => format!(
                    "the certificate of the controller at {addr} is expired or not valid yet: renew {host}'s certificate, or check this host's clock"
                ),
            };
            (ErrorReason::Expired, words)
        }
        F::Revoked => (
            ErrorReason::Revoked,
            format!(
                "the certificate of the controller at {addr} is revoked (tls.crl): {host} needs a new one"
            ),
        ),
        F::WrongName => {
            let names = match tls::certificate_error(e) {
                Some(C::NotValidForNameContext { presented, .. }) => {
                    format!(" (it names {})", presented.join(", "))
                }
                _ => String::new(),
            };
            (
                ErrorReason::WrongName,
                format!(
                    "the certificate of the controller at {addr} is not for {host}{names}: list the controller in controllers: by a name its certificate carries, or issue it one for {host}"
                ),
            )
        }
        F::PeerRefused => {
            let alert = tls::alert_of(e).map(|a| format!("{a:?}")).unwrap_or_default();
            refused_certificate(addr, &alert)
        }
        F::Timeout => (
            ErrorReason::Tls,
            format!("the controller at {addr} did not finish the TLS handshake in time"),
        ),
        _ => (
            ErrorReason::Tls,
            format!(
                "TLS with the controller at {addr} failed: {}",
                tls::describe(e)
            ),
        ),
    }
}

/// The controller ended the TLS session with `alert` (a TLS alert's name): in TLS 1.3 its
/// verdict on this agent's certificate comes after this side's handshake is over.
fn refused_certificate(addr: &str, alert: &str) -> (ErrorReason, String) {
    let alert_name = alert;
    let hint = match alert {
        "UnknownCA" | "BadCertificate" | "DecryptError" | "UnsupportedCertificate" => {
            "is this host's certificate (tls.cert) issued by the CA the controller trusts?"
        }
        "CertificateExpired" => {
            "this host's certificate (tls.cert) is expired or not valid yet: install a renewed one and reload"
        }
        "CertificateRevoked" => "this host's certificate is revoked: issue it a new one",
        "CertificateRequired" => "it wants a client certificate (tls.cert)",
        _ => "the controller's log says why",
    };
    let alert = if alert.is_empty() {
        String::new()
    } else {
        format!(" (TLS alert {alert})")
    };
    let what = match alert_name {
        "UnknownCA" | "BadCertificate" | "DecryptError" | "UnsupportedCertificate" => {
            "does not trust this agent's certificate"
        }
        _ => "refused this agent's certificate",
    };
    (
        ErrorReason::CertificateRefused,
        format!("the controller at {addr} {what}{alert}: {hint}"),
    )
}

/// Why an established connection ended, in the admin's words. `first`: on plaintext, the
/// first bytes the controller sent.
fn session_words(addr: &str, end: &SessionError, first: Option<&[u8]>) -> (ErrorReason, String) {
    use capnp::ErrorKind as K;
    if first.is_some_and(tls::looks_like_tls) {
        return (
            ErrorReason::AgentNotTls,
            format!(
                "this agent is not using TLS but the controller at {addr} is (configure tls: in agent.yaml)"
            ),
        );
    }
    let closed = || {
        (
            ErrorReason::Closed,
            format!("the controller at {addr} closed the connection (restarted or stopped?)"),
        )
    };
    match end {
        SessionError::Closed => closed(),
        SessionError::Read(WireError::Capnp(c)) => match c.kind {
            K::PrematureEndOfFile => closed(),
            K::Disconnected => (
                ErrorReason::Io,
                format!("the connection to the controller at {addr} was reset"),
            ),
            _ => (
                ErrorReason::Protocol,
                format!(
                    "the controller at {addr} sent what this agent cannot read: {}",
                    tls::plain(&end.to_string())
                ),
            ),
        },
        SessionError::Read(e) => (
            ErrorReason::Protocol,
            format!(
                "the controller at {addr} sent what this agent cannot read: {}",
                tls::plain(&e.to_string())
            ),
        ),
        SessionError::Tls(tls::Failure::PeerRefused, text) => {
            refused_certificate(addr, text.rsplit(": ").next().unwrap_or(""))
        }
        SessionError::Tls(_, text) => (
            ErrorReason::Tls,
            format!(
                "TLS with the controller at {addr} failed: {}",
                tls::plain(text)
            ),
        ),
        SessionError::WriteTimeout(d) => (
            ErrorReason::WriteTimeout,
            format!("the controller at {addr} stopped reading (a write waited {d:?})"),
        ),
        SessionError::Write(e) => (
            ErrorReason::Io,
            format!(
                "the connection to the controller at {addr} broke while sending: {}",
                tls::plain(&e.to_string())
            ),
        ),
        SessionError::Encode(e) => (ErrorReason::Protocol, format!("encoding for {addr}: {e}")),
        SessionError::Refused { reason, message } => (
            ErrorReason::Refused,
            format!(
                "the controller refused this agent ({}): {} (controller {addr})",
                escape(reason),
                escape(message)
            ),
        ),
        SessionError::Shutdown => (ErrorReason::Closed, "shutting down".into()),
    }
}

async fn connect_tcp(target: &str, cfg: &LinkConfig) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(target))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    // Batches are already coalesced; waiting for Nagle only adds latency.
    stream.set_nodelay(true)?;
    if let Some(ka) = cfg.keepalive {
        sockopt::keepalive(&stream, &ka, cfg.write_timeout)?;
    }
    Ok(stream)
}

struct Session<'a> {
    cfg: &'a LinkConfig,
    store: &'a Store,
    stats: &'a LinkStats,
    shutdown: &'a CancellationToken,
    writer: WriteHalf<Box<dyn LinkStream>>,
    reader: JoinHandle<SessionError>,
    store_rx: watch::Receiver<Versions>,
    seq: u64,
    /// Store version the controller has everything up to.
    sent_version: u64,
    sent_generation: u64,
    last_write: Instant,
    /// Set during the final flush: writes no longer give way to the shutdown.
    closing: bool,
    /// A write was abandoned for the shutdown, maybe halfway through a frame: nothing more
    /// may go on this connection.
    torn: bool,
    /// The controller said `accepted` on this connection.
    accepted: Arc<std::sync::atomic::AtomicBool>,
    /// Batches sent before the verdict came.
    unconfirmed: Arc<Unconfirmed>,
    /// On plaintext: the first bytes the controller sent.
    first_bytes: Option<tls::FirstBytes>,
}

/// Batches sent on a connection the controller has not accepted yet: counted once it does
/// (protocol 2's verdict), dropped when it refuses (a TLS alert, `refused`), so the counters
/// count only what a controller took; with a controller that never says (protocol 1), they
/// are counted when the connection ends otherwise.
#[derive(Default)]
struct Unconfirmed {
    batches: AtomicU64,
    full_batches: AtomicU64,
    resvals: AtomicU64,
}

impl Unconfirmed {
    fn commit(&self, stats: &LinkStats) {
        LinkStats::add(&stats.batches, self.batches.swap(0, Ordering::Relaxed));
        LinkStats::add(
            &stats.full_batches,
            self.full_batches.swap(0, Ordering::Relaxed),
        );
        LinkStats::add(&stats.resvals_sent, self.resvals.swap(0, Ordering::Relaxed));
    }

    fn discard(&self) {
        self.batches.store(0, Ordering::Relaxed);
        self.full_batches.store(0, Ordering::Relaxed);
        self.resvals.store(0, Ordering::Relaxed);
    }
}

/// After a failed write on a connection not yet accepted, how long the reader may take to
/// say what the controller said (its TLS alert or its verdict is the cause, not the EPIPE
/// that followed it).
const CAUSE_GRACE: Duration = Duration::from_secs(1);

/// The final flush on shutdown is bounded by this (or the write timeout, if shorter), so a
/// controller that stopped reading cannot hold up the agent's exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl<'a> Session<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        stream: Box<dyn LinkStream>,
        addr: &str,
        cfg: &'a LinkConfig,
        store: &'a Store,
        stats: &'a Arc<LinkStats>,
        assigned: &Arc<watch::Sender<Assigned>>,
        shutdown: &'a CancellationToken,
        first_bytes: Option<tls::FirstBytes>,
    ) -> Self {
        let accepted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let unconfirmed = Arc::new(Unconfirmed::default());
        let (rd, writer) = tokio::io::split(stream);
        // Reading runs in its own task so a half-read frame is never cancelled by the
        // write side's select; it ends (with the reason) when the connection does.
        let reader = tokio::spawn(read_controller(
            rd,
            addr.to_owned(),
            Arc::clone(stats),
            Arc::clone(assigned),
            Arc::clone(&accepted),
            Arc::clone(&unconfirmed),
        ));
        Self {
            cfg,
            store,
            stats,
            shutdown,
            writer,
            reader,
            store_rx: store.subscribe(),
            seq: 0,
            sent_version: 0,
            sent_generation: 0,
            last_write: Instant::now(),
            unconfirmed,
            closing: false,
            torn: false,
            accepted,
            first_bytes,
        }
    }

    /// On plaintext, the first bytes the controller sent.
    fn first_bytes(&self) -> Option<Vec<u8>> {
        let first = self.first_bytes.as_ref()?;
        Some(first.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// End a connection this side gives up on: TLS close_notify (a FIN on plaintext), bounded.
    async fn close(&mut self) {
        if !self.torn {
            let _ = tokio::time::timeout(FLUSH_TIMEOUT, self.writer.shutdown()).await;
        }
    }

    /// On shutdown: send what the controller has not seen yet (hello + snapshot after a
    /// reload it missed, else the delta), then close the connection, within a bound.
    async fn flush(&mut self, hello: &mut watch::Receiver<Arc<Hello>>) {
        self.closing = true;
        if self.torn {
            let _ = tokio::time::timeout(FLUSH_TIMEOUT, self.writer.shutdown()).await;
            return;
        }
        let bound = self.cfg.write_timeout.min(FLUSH_TIMEOUT);
        let work = async {
            let reload = hello.has_changed().unwrap_or(false)
                || self.store_rx.borrow().generation != self.sent_generation;
            if reload {
                self.resync(hello).await?;
            } else {
                self.delta().await?;
            }
            self.writer.shutdown().await.map_err(SessionError::Write)
        };
        match tokio::time::timeout(bound, work).await {
            Ok(Ok(())) => debug!("last batch flushed; connection closed"),
            Ok(Err(e)) => warn!(error = %e, "could not flush the last batch"),
            Err(_) => warn!(?bound, "controller did not take the last batch in time"),
        }
    }

    async fn run(
        &mut self,
        addr: &str,
        hello: &mut watch::Receiver<Arc<Hello>>,
    ) -> Result<(), SessionError> {
        self.resync(hello).await?;
        // "accepted by ..." comes with the controller's verdict (read_controller).
        debug!(controller = %addr, "hello and snapshot sent; waiting for the verdict");
        self.stats.set_state(LinkState::Connected {
            controller: addr.to_owned(),
        });
        let mut hello_open = true;
        // `changed()` marks the hello seen, so remember that it fired.
        let mut hello_dirty = false;
        loop {
            let idle_until = tokio::time::Instant::from_std(self.last_write + self.cfg.heartbeat);
            tokio::select! {
                _ = self.shutdown.cancelled() => return Err(SessionError::Shutdown),
                r = &mut self.reader => return Err(r.unwrap_or(SessionError::Closed)),
                // The store lives as long as we hold it, so its sender never closes.
                _ = self.store_rx.changed() => {}
                r = hello.changed(), if hello_open => {
                    // The owner dropped the hello sender: keep the last hello.
                    hello_open = r.is_ok();
                    if !hello_open { continue; }
                    hello_dirty = true;
                }
                _ = tokio::time::sleep_until(idle_until) => {
                    self.heartbeat().await?;
                    continue;
                }
            }
            // Something changed: give related changes a moment to land in the same batch.
            // A zero window sends at once, with no timer (and no wake-up for one).
            if !self.cfg.coalesce.is_zero() {
                tokio::select! {
                    _ = self.shutdown.cancelled() => return Err(SessionError::Shutdown),
                    r = &mut self.reader => return Err(r.unwrap_or(SessionError::Closed)),
                    _ = tokio::time::sleep(self.cfg.coalesce) => {}
                }
            }
            let reload = hello_dirty
                || hello.has_changed().unwrap_or(false)
                || self.store_rx.borrow().generation != self.sent_generation;
            hello_dirty = false;
            if reload {
                self.resync(hello).await?;
            } else {
                self.delta().await?;
            }
        }
    }

    /// Hello, then everything.
    async fn resync(
        &mut self,
        hello: &mut watch::Receiver<Arc<Hello>>,
    ) -> Result<(), SessionError> {
        let h = Arc::clone(&hello.borrow_and_update());
        self.send(&Envelope::Hello((*h).clone())).await?;
        // Mark the store seen before reading it: a change after this wakes us again.
        self.store_rx.borrow_and_update();
        let (versions, resvals) = self.store.snapshot();
        self.send_batch(true, resvals).await?;
        self.sent_version = versions.version;
        self.sent_generation = versions.generation;
        let sent = &self.stats.sent_version;
        sent.store(versions.version, Ordering::Relaxed);
        Ok(())
    }

    async fn delta(&mut self) -> Result<(), SessionError> {
        self.store_rx.borrow_and_update();
        let (versions, resvals) = self.store.changes_since(self.sent_version);
        if versions.generation != self.sent_generation {
            // A reload raced in after the check; the next round resyncs.
            return Ok(());
        }
        if !resvals.is_empty() {
            self.send_batch(false, resvals).await?;
        }
        self.sent_version = versions.version;
        let sent = &self.stats.sent_version;
        sent.store(versions.version, Ordering::Relaxed);
        Ok(())
    }

    async fn heartbeat(&mut self) -> Result<(), SessionError> {
        let hb = Heartbeat {
            seq: self.seq,
            sent_at_ms: unix_ms(SystemTime::now()),
        };
        self.send(&Envelope::Heartbeat(hb)).await?;
        LinkStats::add(&self.stats.heartbeats, 1);
        Ok(())
    }

    async fn send_batch(
        &mut self,
        full: bool,
        resvals: Vec<crate::value::Resval>,
    ) -> Result<(), SessionError> {
        self.seq += 1;
        let n = resvals.len() as u64;
        let batch = Batch {
            seq: self.seq,
            full,
            sent_at_ms: unix_ms(SystemTime::now()),
            resvals,
        };
        self.send(&Envelope::Batch(batch)).await?;
        let u = &self.unconfirmed;
        LinkStats::add(&u.batches, 1);
        LinkStats::add(&u.resvals, n);
        if full {
            LinkStats::add(&u.full_batches, 1);
        }
        // After the verdict: counted now (the reader committed what came before it).
        if self.accepted.load(Ordering::Relaxed) {
            u.commit(self.stats);
        }
        Ok(())
    }

    /// Encode and write one frame, bounded by the write timeout. The frame is the only
    /// thing buffered on our side; the kernel's socket buffer is the rest.
    async fn send(&mut self, env: &Envelope) -> Result<(), SessionError> {
        let frame = wire::encode_envelope(env).map_err(SessionError::Encode)?;
        // What the controller would drop from its segment table, without a verdict (it has
        // no hello to answer), is said here instead.
        if matches!(env, Envelope::Hello(_))
            && frame.len() > super::frame_limits::MAX_HELLO_FRAME_BYTES
        {
            return Err(SessionError::Encode(WireError::HelloTooLarge {
                size: frame.len(),
            }));
        }
        let in_flight = self.stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.stats
            .max_in_flight
            .fetch_max(in_flight, Ordering::Relaxed);
        let closing = self.closing;
        let shutdown = self.shutdown;
        let result = tokio::select! {
            _ = shutdown.cancelled(), if !closing => {
                self.torn = true;
                Err(SessionError::Shutdown)
            }
            r = tokio::time::timeout(self.cfg.write_timeout, write_frame(&mut self.writer, &frame)) => match r {
                Err(_) => {
                    LinkStats::add(&self.stats.write_timeouts, 1);
                    Err(SessionError::WriteTimeout(self.cfg.write_timeout))
                }
                Ok(Err(e)) => Err(SessionError::Write(e)),
                Ok(Ok(())) => Ok(()),
            },
        };
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        result?;
        LinkStats::add(&self.stats.bytes_sent, frame.len() as u64);
        self.last_write = Instant::now();
        Ok(())
    }
}

/// Write one whole frame; TLS holds records until flushed.
async fn write_frame(
    writer: &mut WriteHalf<Box<dyn LinkStream>>,
    frame: &[u8],
) -> std::io::Result<()> {
    writer.write_all(frame).await?;
    writer.flush().await
}

/// Read controller messages until the connection ends; returns why it ended. A controller
/// is held to the limits of a receiver: a welcome longer than `frame_limits::MAX_ASSIGNED`
/// ends the connection from its list header, one with a name that breaks the rules is refused
/// (counted, logged once per interval), the loop yields after every frame and reads at most
/// `CONTROLLER_MESSAGES_PER_SEC` frames a second after a burst. Logging an
/// assignment that took effect is the daemon's (once per change, coalesced).
/// How much of a controller's refusal text the agent logs.
const MAX_REFUSAL_TEXT: usize = 512;

async fn read_controller(
    rd: ReadHalf<Box<dyn LinkStream>>,
    addr: String,
    stats: Arc<LinkStats>,
    assigned: Arc<watch::Sender<Assigned>>,
    accepted: Arc<std::sync::atomic::AtomicBool>,
    unconfirmed: Arc<Unconfirmed>,
) -> SessionError {
    let mut accepted_as: Option<String> = None;
    let failure = tls::FailureSlot::default();
    let mut rd = BufReader::new(tls::WatchFailure::new(rd, Arc::clone(&failure))).compat();
    let mut warnings = Warnings::new(WARN_INTERVAL);
    let mut pace = Pace::new(CONTROLLER_MESSAGES_PER_SEC);
    loop {
        // Beyond the rate, the controller waits on TCP, not the agent on the controller.
        pace.take().await;
        let msg = match wire::read_frame(&mut rd).await {
            Ok(Some(m)) => m,
            Ok(None) => return SessionError::Closed,
            Err(e) => {
                let tls = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
                return match tls {
                    Some((why, text)) => SessionError::Tls(why, text),
                    None => SessionError::Read(e),
                };
            }
        };
        match wire::decode_controller(&msg) {
            Ok(ControllerMessage::Ack(seq)) => {
                LinkStats::add(&stats.acks, 1);
                stats.last_ack_seq.fetch_max(seq, Ordering::Relaxed);
                let now = unix_ms(SystemTime::now());
                stats.last_ack_ms.store(now, Ordering::Relaxed);
            }
            Ok(ControllerMessage::Welcome(list)) => {
                LinkStats::add(&stats.welcomes, 1);
                let now = tokio::time::Instant::now();
                match list.iter().try_for_each(|(n, i)| check_names(n, i)) {
                    Ok(()) => {
                        let set: Assigned = list.into_iter().collect();
                        debug!(assigned = set.len(), "welcome from the controller");
                        assigned.send_if_modified(|cur| {
                            let changed = *cur != set;
                            *cur = set;
                            changed
                        });
                    }
                    Err(e) => {
                        LinkStats::add(&stats.welcomes_refused, 1);
                        if warnings.admit("bad name", now) {
                            warn!(error = %escape(&e.to_string()), "welcome refused (more like it are summarised)");
                        }
                    }
                }
                if let Some(summary) = warnings.summary_due(now) {
                    warn!("welcomes refused: {summary}");
                }
            }
            Ok(ControllerMessage::Accepted { host }) => {
                accepted.store(true, Ordering::Relaxed);
                unconfirmed.commit(&stats);
                // Once per connection (the controller says it again after each hello).
                if accepted_as.as_deref() != Some(host.as_str()) {
                    info!(controller = %addr, "accepted by {addr} as host {}", escape(&host));
                    accepted_as = Some(host);
                }
            }
            Ok(ControllerMessage::Refused { reason, message }) => {
                let cut = |s: String| s.chars().take(MAX_REFUSAL_TEXT).collect::<String>();
                return SessionError::Refused {
                    reason: cut(reason),
                    message: cut(message),
                };
            }
            Err(e) => return SessionError::Read(e),
        }
        drop(msg);
        // A controller whose frames are always ready must not keep this worker busy.
        tokio::task::yield_now().await;
    }
}

/// Jittered exponential backoff: delay in [min, cap], cap doubling from min up to max.
struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
    rng: u64,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        // No need for a crypto RNG: only to keep a cluster's agents from reconnecting in
        // lockstep. Seed from the clock and the pid so hosts differ.
        let seed = unix_ms(SystemTime::now()) ^ (u64::from(std::process::id()) << 32);
        Self {
            min,
            max: max.max(min),
            attempt: 0,
            rng: seed | 1,
        }
    }

    fn reset(&mut self) {
        self.attempt = 0;
    }

    /// After the controller refused us: at least half the longest backoff (jittered up to
    /// all of it), and the backoff stays at its longest until a connection holds.
    fn after_refusal(&mut self) -> Duration {
        self.attempt = 20;
        let d = self.next_delay();
        let half = self.max / 2;
        half + (d.saturating_sub(self.min)) / 2
    }

    fn next_delay(&mut self) -> Duration {
        let cap = self
            .min
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let span = cap.saturating_sub(self.min);
        let frac = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        self.min + span.mul_f64(frac)
    }
}

/// TCP keepalive and user timeout, set on the raw socket: `socket2` is not a dependency
/// and nix's socket features are not enabled in this crate.
mod sockopt {
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use super::Keepalive;

    pub(super) fn keepalive(
        stream: &tokio::net::TcpStream,
        ka: &Keepalive,
        user_timeout: Duration,
    ) -> std::io::Result<()> {
        let fd = stream.as_raw_fd();
        set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(ka.idle))?;
        set(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            secs(ka.interval),
        )?;
        set(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT,
            ka.count.clamp(1, 127) as libc::c_int,
        )?;
        // Unacknowledged data older than this kills the connection in the kernel too,
        // covering a peer that vanished while we had data in flight.
        let ms = user_timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        set(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)
    }

    fn secs(d: Duration) -> libc::c_int {
        d.as_secs().clamp(1, 32767) as libc::c_int
    }

    fn set(
        fd: std::os::fd::RawFd,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> std::io::Result<()> {
        // SAFETY: `fd` is an open socket owned by the caller's TcpStream for the duration
        // of the call; the option value is a c_int we pass by pointer with its exact size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_that_is_no_controller_entry_is_not_dialled() {
        assert_eq!(dial_address("ctl1").ok().as_deref(), Some("ctl1:6870"));
        let err = dial_address("ctl1:99999").expect_err("port out of range");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("ctl1:99999"), "{err}");
    }

    #[test]
    fn backoff_stays_within_floor_and_cap_and_grows() {
        let min = Duration::from_millis(500);
        let max = Duration::from_secs(30);
        let mut b = Backoff::new(min, max);
        let delays: Vec<Duration> = (0..40).map(|_| b.next_delay()).collect();
        assert!(delays.iter().all(|d| *d >= min && *d <= max));
        assert_eq!(delays[0], min, "first cap is the floor itself");
        assert!(delays[20..].iter().any(|d| *d > Duration::from_secs(5)));
        b.reset();
        assert_eq!(b.next_delay(), min);
    }

    #[test]
    fn after_a_refusal_the_agent_waits_at_least_half_the_longest_backoff() {
        let min = Duration::from_millis(500);
        let max = Duration::from_secs(30);
        let mut b = Backoff::new(min, max);
        for _ in 0..100 {
            let d = b.after_refusal();
            assert!(d >= max / 2 && d <= max, "{d:?}");
        }
    }
}
