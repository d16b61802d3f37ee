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

use std::collections::BTreeSet;
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

use super::limits::{self, Pace, Warnings, WARN_INTERVAL};
use super::tls::{self, LinkStream};
use super::wire::{self, Batch, ControllerMessage, Envelope, Heartbeat, Hello, WireError};
use crate::config::agent::normalize_controller;
use crate::store::{Store, Versions};
use crate::text::escape;
use crate::value::unix_ms;

/// The (name, instance) pairs of shared instances the controller assigned to this host.
pub type Assigned = BTreeSet<(String, String)>;

/// How the link behaves. `Default` gives production values; tests shrink the durations.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// "host:port", "host" (port 6870), "[v6]:port"; tried in order each round.
    pub controllers: Vec<String>,
    /// After a change, wait this long for more before sending the delta.
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
            coalesce: Duration::from_millis(200),
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
    state: watch::Sender<LinkState>,
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
        self.state_since_ms
            .store(unix_ms(SystemTime::now()), Ordering::Relaxed);
        self.state.send_replace(s);
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
    // The controller's last refusal, logged once: the same one again is not logged again.
    let mut last_refusal: Option<String> = None;
    'rounds: while !shutdown.is_cancelled() {
        stats.set_state(LinkState::Connecting);
        let mut refused_round = false;
        for addr in &cfg.controllers {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => break 'rounds,
                r = connect(addr, &cfg) => r,
            };
            let stream = match stream {
                Ok(s) => s,
                Err(ConnectError::Tcp(e)) => {
                    LinkStats::add(&stats.connect_failures, 1);
                    debug!(controller = %addr, error = %e, "controller unreachable");
                    continue;
                }
                Err(ConnectError::Tls(why, e)) => {
                    LinkStats::add(&stats.connect_failures, 1);
                    LinkStats::add(&stats.tls_failures[why.index()], 1);
                    warn!(controller = %addr, reason = why.as_str(), error = %e,
                          "TLS handshake with the controller failed");
                    continue;
                }
            };
            LinkStats::add(&stats.connects, 1);
            let started = Instant::now();
            let mut session =
                Session::new(stream, addr, &cfg, &store, &stats, &assigned, &shutdown);
            let end = session.run(addr, &mut hello).await;
            if matches!(end, Err(SessionError::Shutdown)) && session.seq > 0 {
                // Connected and stopping: the controller gets what changed since the last
                // batch, so a clean stop loses no value.
                session.flush(&mut hello).await;
            }
            session.reader.abort();
            let mut refused = false;
            match end {
                Err(SessionError::Shutdown) => break 'rounds,
                Err(SessionError::Refused { reason, message }) => {
                    LinkStats::add(&stats.disconnects, 1);
                    let said = format!("{reason}: {message}");
                    if last_refusal.as_deref() != Some(said.as_str()) {
                        error!(controller = %addr, reason = %escape(&reason),
                               "the controller refused this agent: {}; backing off {:?} between tries",
                               escape(&message), cfg.backoff_max);
                        last_refusal = Some(said);
                    }
                    refused = true;
                }
                Err(SessionError::Tls(why, e)) => {
                    LinkStats::add(&stats.disconnects, 1);
                    LinkStats::add(&stats.tls_failures[why.index()], 1);
                    warn!(controller = %addr, reason = why.as_str(), error = %e,
                          "the controller ended the TLS session (did it refuse our certificate?)");
                }
                Err(e) => {
                    LinkStats::add(&stats.disconnects, 1);
                    warn!(controller = %addr, error = %e, "link to controller lost; reconnecting");
                }
                Ok(()) => {}
            }
            if !refused {
                last_refusal = None;
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
    Tls(tls::Failure, String),
}

async fn connect(addr: &str, cfg: &LinkConfig) -> Result<Box<dyn LinkStream>, ConnectError> {
    let target = dial_address(addr).map_err(ConnectError::Tcp)?;
    let stream = connect_tcp(&target, cfg).await.map_err(ConnectError::Tcp)?;
    let Some(tls_cfg) = &cfg.tls else {
        return Ok(Box::new(stream));
    };
    let name = tls::server_name(&target)
        .map_err(|e| ConnectError::Tls(tls::Failure::WrongName, e.to_string()))?;
    let handshake = tokio_rustls::TlsConnector::from(Arc::clone(tls_cfg)).connect(name, stream);
    match tokio::time::timeout(cfg.handshake_timeout, handshake).await {
        Ok(Ok(s)) => Ok(Box::new(s)),
        Ok(Err(e)) => Err(ConnectError::Tls(tls::Failure::of(&e), tls::describe(&e))),
        Err(_) => Err(ConnectError::Tls(
            tls::Failure::Timeout,
            format!(
                "no handshake within {:?} (controller stalled)",
                cfg.handshake_timeout
            ),
        )),
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
}

/// The final flush on shutdown is bounded by this (or the write timeout, if shorter), so a
/// controller that stopped reading cannot hold up the agent's exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

impl<'a> Session<'a> {
    fn new(
        stream: Box<dyn LinkStream>,
        addr: &str,
        cfg: &'a LinkConfig,
        store: &'a Store,
        stats: &'a Arc<LinkStats>,
        assigned: &Arc<watch::Sender<Assigned>>,
        shutdown: &'a CancellationToken,
    ) -> Self {
        let (rd, writer) = tokio::io::split(stream);
        // Reading runs in its own task so a half-read frame is never cancelled by the
        // write side's select; it ends (with the reason) when the connection does.
        let reader = tokio::spawn(read_controller(
            rd,
            addr.to_owned(),
            Arc::clone(stats),
            Arc::clone(assigned),
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
            closing: false,
            torn: false,
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
            tokio::select! {
                _ = self.shutdown.cancelled() => return Err(SessionError::Shutdown),
                r = &mut self.reader => return Err(r.unwrap_or(SessionError::Closed)),
                _ = tokio::time::sleep(self.cfg.coalesce) => {}
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
        LinkStats::add(&self.stats.batches, 1);
        LinkStats::add(&self.stats.resvals_sent, n);
        if full {
            LinkStats::add(&self.stats.full_batches, 1);
        }
        Ok(())
    }

    /// Encode and write one frame, bounded by the write timeout. The frame is the only
    /// thing buffered on our side; the kernel's socket buffer is the rest.
    async fn send(&mut self, env: &Envelope) -> Result<(), SessionError> {
        let frame = wire::encode_envelope(env).map_err(SessionError::Encode)?;
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
/// is held to the limits of a receiver: a welcome longer than `limits::MAX_ASSIGNED` ends the
/// connection from its list header, one with a name that breaks the rules is refused
/// (counted, logged once per interval), the loop yields after every frame and reads at most
/// `limits::CONTROLLER_MESSAGES_PER_SEC` frames a second after a burst. Logging an
/// assignment that took effect is the daemon's (once per change, coalesced).
/// How much of a controller's refusal text the agent logs.
const MAX_REFUSAL_TEXT: usize = 512;

async fn read_controller(
    rd: ReadHalf<Box<dyn LinkStream>>,
    addr: String,
    stats: Arc<LinkStats>,
    assigned: Arc<watch::Sender<Assigned>>,
) -> SessionError {
    let mut accepted_as: Option<String> = None;
    let failure = tls::FailureSlot::default();
    let mut rd = BufReader::new(tls::WatchFailure::new(rd, Arc::clone(&failure))).compat();
    let mut warnings = Warnings::new(WARN_INTERVAL);
    let mut pace = Pace::new(limits::CONTROLLER_MESSAGES_PER_SEC);
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
                match list.iter().try_for_each(|(n, i)| limits::check_names(n, i)) {
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
