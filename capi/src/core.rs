//! The receiver behind the C handle, in safe Rust: the project's receiver core
//! (`xce_agent::receiver::session::serve_all`, the code `xce-agent listen` runs) on a runtime of
//! its own, and a dispatcher that turns the core's per-connection events into the
//! controller's events (accepted, resval, stale, gone, refused), keeps every host's state for
//! snapshots, and queues the events for the C side.
//!
//! Memory is bounded in bytes: every connection, frame, queued event and host state is
//! charged to one budget (`Config::memory_budget`, a share per host: see
//! `xce_agent::receiver::budget`); a host over its share is cut off (GONE `over_budget`).
//! The queue is newest-wins per (host, resource) and bounded in events and bytes; while it
//! is full the dispatcher waits, the core's channel fills, and each connection stops
//! reading its socket (TCP pushes back on the agent), as `listen` does with a slow stdout.
//!
//! Staleness: an agent sends a batch or a heartbeat at least every heartbeat interval (10 s,
//! not in the hello; `Config::heartbeat`). A host from which nothing arrived for
//! `grace = 2 x heartbeat + 1 s` is stale: one event, and its values read as unknown until it
//! reports again. A host whose connection ended (gone) goes stale by the same rule unless it
//! connects again first. The fold is the receiver core's (`xce_agent::receiver::hosts`),
//! the same `listen --format table` shows.

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use xce_agent::config::agent::TlsPaths;
use xce_agent::link::frame_limits::MAX_ASSIGNED;
use xce_agent::link::name_rules::check_names;
pub use xce_agent::receiver::budget::{Budget, Payer, DEFAULT_HOST_SHARE, DEFAULT_TOTAL};
pub use xce_agent::receiver::events::{Accepted, Ev};
use xce_agent::receiver::hosts::HostTable;
pub use xce_agent::receiver::hosts::{grace, DEFAULT_HEARTBEAT};
use xce_agent::receiver::identity::canonical_host;
use xce_agent::receiver::queue::{EventQueue, NotPushed, Pushed, DEFAULT_QUEUE_BYTES};
use xce_agent::receiver::session::{self, Control, Event, ListenOpts};

use crate::log::{LogConfig, ReceiverLog};

/// Events held for the controller before the library stops reading sockets.
pub const DEFAULT_QUEUE_CAPACITY: usize = xce_agent::receiver::queue::DEFAULT_QUEUE_EVENTS;
/// Core events in flight between the connections and the dispatcher (each at most a frame).
const CORE_CHANNEL: usize = 16;

/// What `xce_receiver_start` is given.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: Vec<String>,
    pub tls: Option<TlsPaths>,
    pub insecure_plaintext: bool,
    pub queue_capacity: usize,
    pub heartbeat: Duration,
    pub ack: bool,
    /// The cluster's DNS domains (see `ListenOpts::domains`).
    pub domains: Vec<String>,
    /// The whole receiver's memory budget and one host's share of it, in bytes.
    pub memory_budget: usize,
    pub host_share: usize,
    /// The worker's doors: unix sockets and the uids allowed on each.
    pub unix: Vec<UnixConfig>,
    /// Where the receiver's log lines go (none: to the process's tracing default, if any).
    pub log: Option<LogConfig>,
}

/// One unix socket of the worker's door.
#[derive(Debug, Clone)]
pub struct UnixConfig {
    pub path: std::path::PathBuf,
    pub uids: Vec<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: Vec::new(),
            tls: None,
            insecure_plaintext: false,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            heartbeat: DEFAULT_HEARTBEAT,
            ack: false,
            domains: Vec::new(),
            memory_budget: DEFAULT_TOTAL,
            host_share: DEFAULT_HOST_SHARE,
            unix: Vec::new(),
            log: None,
        }
    }
}

/// Why a receiver did not start; the text is for `xce_last_error`.
#[derive(Debug)]
pub enum StartError {
    /// The configuration is incomplete or contradictory.
    Config(String),
    Tls(String),
    Bind(String),
    Runtime(String),
}

impl StartError {
    pub fn text(&self) -> &str {
        match self {
            StartError::Config(t)
            | StartError::Tls(t)
            | StartError::Bind(t)
            | StartError::Runtime(t) => t,
        }
    }
}

/// The wake-up pipe: its read end is readable exactly while events are queued.
struct Wake {
    rd: OwnedFd,
    wr: OwnedFd,
}

impl Wake {
    fn new() -> std::io::Result<Self> {
        use nix::fcntl::OFlag;
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        Ok(Self { rd, wr })
    }

    /// One byte in the pipe (called with the queue locked, when it stops being empty).
    fn raise(&self) {
        let _ = nix::unistd::write(self.wr.as_fd(), &[1]);
    }

    /// The byte out again (called with the queue locked, when it becomes empty).
    fn lower(&self) {
        let mut b = [0u8; 8];
        let _ = nix::unistd::read(self.rd.as_fd(), &mut b);
    }
}

/// What the dispatcher and the C side share.
struct Shared {
    queue: Mutex<EventQueue>,
    /// Notified when the C side pops (there is room again).
    space: Notify,
    wake: Wake,
    hosts: Mutex<HostTable>,
    budget: Arc<Budget>,
    domains: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Queue one event (or replace the value it supersedes), waiting while the queue is
    /// full. A resval of a host over its share is dropped (the host is cut off).
    async fn push(&self, ev: Ev) {
        let payer = match ev.host() {
            Some(h) => Payer::Host(self.budget.account(h)),
            None => Payer::Receiver,
        };
        loop {
            {
                let mut q = lock(&self.queue);
                let was_empty = q.is_empty();
                match q.push(ev.clone(), &payer) {
                    Ok(Pushed::Queued) => {
                        if was_empty {
                            self.wake.raise();
                        }
                        return;
                    }
                    Ok(Pushed::Replaced) | Err(NotPushed::OverBudget(_)) => return,
                    Err(NotPushed::Full) => {}
                }
            }
            // notify_one keeps a permit: a pop between the check and this wait is not lost.
            self.space.notified().await;
        }
    }

    fn pop(&self) -> Option<Ev> {
        let ev = {
            let mut q = lock(&self.queue);
            let ev = q.pop();
            if ev.is_some() && q.is_empty() {
                self.wake.lower();
            }
            ev
        };
        if ev.is_some() {
            self.space.notify_one();
        }
        ev
    }
}

/// What the library counts (`xce_receiver_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub queued_events: usize,
    pub queued_bytes: usize,
    /// Values replaced in the queue by newer ones before the controller popped them.
    pub replaced: u64,
    pub budget_used: usize,
    pub budget_total: usize,
    pub hosts: usize,
}

/// A running receiver.
pub struct Receiver {
    runtime: Option<tokio::runtime::Runtime>,
    /// Started with TLS (it can be reloaded).
    tls: bool,
    shared: Arc<Shared>,
    control: Arc<Control>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    addrs: Vec<SocketAddr>,
    log: Option<Arc<ReceiverLog>>,
}

impl Receiver {
    /// Start receiving; what the core logs while starting (a low open-file limit) goes to
    /// the receiver's log too.
    pub fn start(cfg: &Config) -> Result<Self, StartError> {
        let log = cfg.log.as_ref().map(|l| Arc::new(ReceiverLog::new(l)));
        let started = crate::log::with_log(log.as_deref(), || Self::start_logged(cfg, &log));
        if started.is_err() {
            if let Some(l) = &log {
                l.close();
            }
        }
        started
    }

    fn start_logged(cfg: &Config, log: &Option<Arc<ReceiverLog>>) -> Result<Self, StartError> {
        if cfg.listen.is_empty() && cfg.unix.is_empty() {
            return Err(StartError::Config(
                "no listen address (xce_receiver_config_add_listen) and no unix socket \
                 (xce_receiver_config_add_unix)"
                    .into(),
            ));
        }
        let tls = match (&cfg.tls, cfg.insecure_plaintext) {
            // The worker's door alone needs no TLS: its peers are known by their uid.
            (None, false) if cfg.listen.is_empty() => None,
            (Some(_), true) => {
                return Err(StartError::Config(
                    "both TLS key material and insecure plaintext are set: choose one".into(),
                ))
            }
            (None, false) => {
                return Err(StartError::Config(
                    "no TLS key material (xce_receiver_config_set_tls); plaintext only with \
                     xce_receiver_config_set_insecure_plaintext"
                        .into(),
                ))
            }
            (None, true) => None,
            (Some(paths), false) => {
                let material = xce_agent::link::tls::Material::load(paths)
                    .map_err(|e| StartError::Tls(e.to_string()))?;
                Some(
                    material
                        .server_config()
                        .map_err(|e| StartError::Tls(e.to_string()))?,
                )
            }
        };
        // A descriptor per agent: this process's soft limit up to its hard one (documented in
        // xce_receiver_start: the one process-wide change the library makes).
        session::raise_fd_limit();
        let thread_log = log.as_ref().map(|l| l.dispatch().clone());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("xce-receiver")
            // A write to an agent that is gone must be EPIPE, not a SIGPIPE that kills the
            // C program (a Rust binary ignores SIGPIPE; a C one that links us need not). The
            // signal is blocked on the library's threads only, where all socket I/O runs.
            // The thread's events go to this receiver's log (tracing's global default is
            // the process's, set once at most: not ours to take).
            .on_thread_start(move || {
                let mut pipe = nix::sys::signal::SigSet::empty();
                pipe.add(nix::sys::signal::Signal::SIGPIPE);
                let _ = pipe.thread_block();
                if let Some(d) = &thread_log {
                    crate::log::enter_thread(d);
                }
            })
            .on_thread_stop(crate::log::leave_thread)
            .enable_all()
            .build()
            .map_err(|e| StartError::Runtime(format!("cannot start the runtime: {e}")))?;
        let mut listeners = Vec::new();
        for addr in &cfg.listen {
            let l = runtime
                .block_on(tokio::net::TcpListener::bind(addr.as_str()))
                .map_err(|e| StartError::Bind(format!("cannot listen on {addr}: {e}")))?;
            listeners.push(l);
        }
        let mut doors = Vec::new();
        let own = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        for u in &cfg.unix {
            let _in_runtime = runtime.enter();
            // Anyone may connect; SO_PEERCRED decides who may speak.
            let listener = xce_agent::status::server::bind_socket(&u.path, None, 0o666)
                .map_err(|e| StartError::Bind(format!("unix socket: {e}")))?;
            doors.push(session::UnixDoor {
                listener,
                allowed_uids: u.uids.clone(),
                host: canonical_host(&own, &cfg.domains),
            });
        }
        let addrs = listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StartError::Bind(e.to_string()))?;
        let wake = Wake::new()
            .map_err(|e| StartError::Runtime(format!("cannot make the event pipe: {e}")))?;
        let budget = Budget::new(cfg.memory_budget, cfg.host_share);
        let shared = Arc::new(Shared {
            queue: Mutex::new(EventQueue::new(
                Arc::clone(&budget),
                cfg.queue_capacity,
                DEFAULT_QUEUE_BYTES.min(cfg.memory_budget / 4),
            )),
            space: Notify::new(),
            wake,
            hosts: Mutex::new(HostTable::new(grace(cfg.heartbeat), Arc::clone(&budget))),
            budget: Arc::clone(&budget),
            domains: cfg.domains.clone(),
        });
        let control = Arc::new(Control::new(cfg.domains.clone()));
        let shutdown = CancellationToken::new();
        let (tx, rx) = mpsc::channel(CORE_CHANNEL);
        let opts = ListenOpts {
            ack: cfg.ack,
            assign: Vec::new(),
            tls,
            handshake_timeout: None,
            domains: cfg.domains.clone(),
            hello_timeout: None,
            max_unauthenticated: None,
            budget: Some(budget),
            // Three heartbeats: the agent sends one at least every heartbeat.
            idle_timeout: Some(cfg.heartbeat.saturating_mul(3)),
        };
        let server = runtime.spawn(session::serve_doors(
            listeners,
            doors,
            opts,
            tx,
            Arc::clone(&control),
            shutdown.clone(),
        ));
        let dispatcher = runtime.spawn(dispatch(rx, Arc::clone(&shared), shutdown.clone()));
        Ok(Self {
            runtime: Some(runtime),
            tls: cfg.tls.is_some(),
            shared,
            control,
            shutdown,
            tasks: vec![server, dispatcher],
            addrs,
            log: log.clone(),
        })
    }

    /// Readable while events are queued.
    pub fn fd(&self) -> RawFd {
        self.shared.wake.rd.as_raw_fd()
    }

    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn pop(&self) -> Option<Ev> {
        self.shared.pop()
    }

    /// Whether `stop` ran.
    pub fn is_stopped(&self) -> bool {
        self.runtime.is_none()
    }

    /// Assign shared instances to `host`; Err: why the list is refused.
    pub fn assign(&self, host: &str, instances: Vec<(String, String)>) -> Result<(), String> {
        xce_agent::config::hostlist::validate_host_name(host)
            .map_err(|e| format!("host {host:?}: {e}"))?;
        if instances.len() > MAX_ASSIGNED as usize {
            return Err(format!(
                "{} instances, more than the {MAX_ASSIGNED} one welcome may carry",
                instances.len()
            ));
        }
        for (name, instance) in &instances {
            check_names(name, instance).map_err(|e| e.to_string())?;
        }
        self.control.assign(host, instances);
        Ok(())
    }

    /// The state of one host (`Some(name)`, in any spelling of it) or of all, as events:
    /// per host its state (accepted, stale or gone) then one resval per value (unknown while
    /// stale). `None` when the named host is not known.
    pub fn snapshot(&self, host: Option<&str>) -> Option<Vec<Ev>> {
        let key = host.map(|h| canonical_host(h, &self.shared.domains));
        lock(&self.shared.hosts).snapshot(key.as_deref())
    }

    /// New TLS key material (certificate, key, CA, CRL) for the connections to come; live
    /// sessions stay, except those whose certificate the new CRL revokes (GONE `revoked`).
    /// Err (and nothing changed): why the files were refused. Ok: the sessions ended.
    pub fn reload_tls(&self, paths: &TlsPaths) -> Result<usize, StartError> {
        if !self.tls {
            return Err(StartError::Config(
                "the receiver was started in plaintext: TLS cannot be reloaded into it".into(),
            ));
        }
        crate::log::with_log(self.log.as_deref(), || {
            let material = xce_agent::link::tls::Material::load(paths)
                .map_err(|e| StartError::Tls(e.to_string()))?;
            self.control
                .reload_tls(&material)
                .map_err(|e| StartError::Tls(e.to_string()))
        })
    }

    /// What the library counts now.
    pub fn stats(&self) -> Stats {
        let (queued_events, queued_bytes, replaced) = {
            let q = lock(&self.shared.queue);
            (q.len(), q.bytes(), q.replaced())
        };
        Stats {
            queued_events,
            queued_bytes,
            replaced,
            budget_used: self.shared.budget.used(),
            budget_total: self.shared.budget.total(),
            hosts: lock(&self.shared.hosts).len(),
        }
    }

    /// Close every connection (TLS close_notify), stop the runtime. Events already queued
    /// stay poppable. Idempotent.
    pub fn stop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        self.shutdown.cancel();
        let tasks = std::mem::take(&mut self.tasks);
        runtime.block_on(async {
            // The server waits for its connections (bounded by the core's stop grace).
            for t in tasks {
                let _ = t.await;
            }
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
        // A thread the timeout left behind logs nothing more: the callback's userdata may be
        // freed once stop returns.
        if let Some(l) = &self.log {
            l.close();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The dispatcher: core events in, controller events out, and the stale timers.
async fn dispatch(mut rx: mpsc::Receiver<Event>, shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let next_deadline = lock(&shared.hosts).next_deadline();
        let evs = tokio::select! {
            _ = shutdown.cancelled() => break,
            ev = rx.recv() => match ev {
                Some(ev) => lock(&shared.hosts).apply(ev, Instant::now()),
                None => break,
            },
            _ = async {
                match next_deadline {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => lock(&shared.hosts).expire(Instant::now()),
        };
        for ev in evs {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = shared.push(ev) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use xce_agent::value::{Resval, Status, Value};

    /// Whether the wake-up pipe's read end is readable now (poll with no wait).
    fn pipe_has_byte(shared: &Shared) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(shared.wake.rd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).expect("poll") == 1
    }

    /// When the controller stops popping, the library stops reading: an agent's writes
    /// block once the queue, the channel and the socket buffers are full; popping resumes.
    #[test]
    fn a_full_queue_stops_reading_the_agents_socket_until_the_controller_pops() {
        use std::io::{ErrorKind, Write as _};
        use xce_agent::link::wire::{self, Batch, Declared, Envelope, Hello};
        use xce_agent::value::Valtype;

        let cfg = Config {
            listen: vec!["127.0.0.1:0".into()],
            insecure_plaintext: true,
            queue_capacity: 4,
            ..Config::default()
        };
        let rx = Receiver::start(&cfg).expect("start");
        let mut agent = std::net::TcpStream::connect(rx.local_addrs()[0]).expect("connect");
        let hello = Hello::new(
            "node001",
            "boot",
            "digest",
            vec![Declared {
                name: "level".into(),
                instance: String::new(),
                valtype: Valtype::Numeric,
                interval_ms: 1000,
                shared: false,
            }],
        );
        agent
            .write_all(&wire::encode_envelope(&Envelope::Hello(hello)).expect("encode"))
            .expect("write hello");
        agent.set_nonblocking(true).expect("nonblocking");
        let batch = |seq: u64| {
            let r = Resval {
                name: "level".into(),
                instance: String::new(),
                value: Value::Numeric(seq as f64),
                status: Status::Ok,
                last_report_ms: Some(1),
                error: None,
            };
            wire::encode_envelope(&Envelope::Batch(Batch {
                seq,
                full: seq == 1,
                sent_at_ms: 1,
                resvals: vec![r],
            }))
            .expect("encode")
        };
        // Write until the kernel says the receiver is not reading any more. A receiver that
        // kept reading would take all of it: 256 MiB is far beyond every buffer on the way.
        let mut written = 0usize;
        let mut seq = 1;
        let mut pending: Vec<u8> = Vec::new();
        loop {
            if pending.is_empty() {
                pending = batch(seq);
                seq += 1;
            }
            match agent.write(&pending) {
                Ok(n) => {
                    written += n;
                    pending.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("write: {e}"),
            }
            assert!(
                written < 256 << 20,
                "the receiver kept reading {written} bytes"
            );
        }
        // Popping makes room, and the receiver reads again: the socket becomes writable.
        // Waits are on descriptors only: the event fd (pop what came) and the socket.
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut popped = 0;
        let wake = rx.shared.wake.rd.as_fd();
        loop {
            let mut fds = [
                PollFd::new(agent.as_fd(), PollFlags::POLLOUT),
                PollFd::new(wake, PollFlags::POLLIN),
            ];
            let n = poll(&mut fds, PollTimeout::from(60_000u16)).expect("poll");
            assert!(
                n > 0,
                "neither an event nor room to write within the hang guard"
            );
            if fds[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLOUT))
            {
                break;
            }
            while rx.pop().is_some() {
                popped += 1;
            }
        }
        assert!(popped >= 4, "popped {popped}");
    }

    /// A plaintext receiver whose log (warnings and errors) comes out on a channel.
    fn logging_receiver() -> (Receiver, std::sync::mpsc::Receiver<String>) {
        use crate::log::xce_log_level;
        let (tx, lines) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        let cfg = Config {
            listen: vec!["127.0.0.1:0".into()],
            insecure_plaintext: true,
            log: Some(LogConfig {
                sink: Arc::new(move |level, line: &std::ffi::CStr| {
                    let _ = lock(&tx).send(format!("{level:?} {}", line.to_string_lossy()));
                }),
                min_level: xce_log_level::XCE_LOG_WARN,
            }),
            ..Config::default()
        };
        (Receiver::start(&cfg).expect("start"), lines)
    }

    /// A peer that sends an HTTP request instead of a hello, and waits for the receiver to
    /// hang up (the receiver logs before it closes).
    fn garbage_peer(addr: SocketAddr) {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(HANG_GUARD)).expect("timeout");
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut sink = Vec::new();
        // EOF or a reset: either way the receiver is done with it.
        if let Err(e) = s.read_to_end(&mut sink) {
            assert_ne!(
                e.kind(),
                std::io::ErrorKind::WouldBlock,
                "no hang-up within the guard"
            );
        }
    }

    const HANG_GUARD: Duration = Duration::from_secs(60);

    #[test]
    fn a_peer_sending_garbage_reaches_the_controllers_log_callback_as_one_line() {
        let (mut rx, lines) = logging_receiver();
        garbage_peer(rx.local_addrs()[0]);
        let line = lines.recv_timeout(HANG_GUARD).expect("a log line");
        assert!(
            line.starts_with("XCE_LOG_ERROR dropping agent connection")
                && line.contains(" peer=127.0.0.1:"),
            "{line}"
        );
        rx.stop();
    }

    /// A flood of bad peers costs the controller at most the limiter's lines; every line
    /// dropped is counted in the next line that passes.
    #[test]
    fn a_flood_of_bad_peers_is_rate_limited_and_the_dropped_lines_are_counted() {
        use crate::log::{BURST, PER_SECOND};
        let (rx, lines) = logging_receiver();
        // What starting said (a low open-file limit here) took tokens too.
        let at_start = lines.try_iter().count();
        let addr = rx.local_addrs()[0];
        let flood = BURST as usize + 50;
        let began = std::time::Instant::now();
        for _ in 0..flood {
            garbage_peer(addr);
        }
        let elapsed = began.elapsed();
        let during: Vec<String> = lines.try_iter().collect();
        let earned = (elapsed.as_millis() as usize * PER_SECOND as usize).div_ceil(1000);
        assert!(
            at_start + during.len() <= BURST as usize + earned,
            "{} lines in {elapsed:?} from {flood} peers",
            during.len()
        );
        // Every one of them logs one line: a peer more at a time until the bucket has a
        // token again, whose line reports the lines dropped before it.
        let mut peers = flood;
        let last = loop {
            garbage_peer(addr);
            peers += 1;
            if let Ok(l) = lines.try_recv() {
                break l;
            }
        };
        let suppressed: usize = during
            .iter()
            .chain([&last])
            .filter_map(|l| l.rsplit_once(" suppressed="))
            .map(|(_, n)| n.parse::<usize>().expect("a count"))
            .sum();
        let all_lines = || during.iter().chain([&last]);
        assert!(
            all_lines().all(|l| l.contains("dropping agent connection")),
            "{during:?}"
        );
        assert_eq!(during.len() + 1 + suppressed, peers, "{last}");
        if elapsed < Duration::from_secs(50 / u64::from(PER_SECOND)) {
            assert!(
                suppressed > 0,
                "nothing dropped from {flood} peers in {elapsed:?}"
            );
        }
    }

    #[test]
    fn grace_is_two_heartbeats_and_a_second() {
        assert_eq!(grace(Duration::from_secs(10)), Duration::from_secs(21));
        assert_eq!(grace(Duration::from_millis(500)), Duration::from_secs(2));
        assert_eq!(grace(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn a_receiver_without_tls_or_plaintext_said_in_words_does_not_start() {
        let cfg = Config {
            listen: vec!["127.0.0.1:0".into()],
            ..Config::default()
        };
        let e = Receiver::start(&cfg).err().expect("refused");
        assert!(e.text().contains("insecure_plaintext"), "{}", e.text());
        let none = Receiver::start(&Config::default()).err().expect("refused");
        assert!(none.text().contains("no listen address"), "{}", none.text());
    }

    #[test]
    fn the_fd_is_readable_exactly_while_events_are_queued() {
        let cfg = Config {
            listen: vec!["127.0.0.1:0".into()],
            insecure_plaintext: true,
            queue_capacity: 2,
            ..Config::default()
        };
        let mut rx = Receiver::start(&cfg).expect("start");
        let shared = Arc::clone(&rx.shared);
        let rt = tokio::runtime::Runtime::new().expect("rt");
        let refused = |i: u16| Ev::Refused {
            peer: SocketAddr::from(([127, 0, 0, 1], i)).into(),
            reason: xce_agent::receiver::session::Reason::Closed,
            text: String::new(),
        };
        assert!(!pipe_has_byte(&shared));
        rt.block_on(shared.push(refused(1)));
        assert!(pipe_has_byte(&shared));
        rt.block_on(shared.push(refused(2)));
        // Full: a third push waits (stays pending) until one is popped.
        let third = shared.push(refused(3)).now_or_never();
        assert!(third.is_none(), "a push into a full queue returned");
        assert!(
            matches!(rx.pop(), Some(Ev::Refused { peer, .. }) if peer.to_string().ends_with(":1"))
        );
        assert!(pipe_has_byte(&shared));
        assert!(
            matches!(rx.pop(), Some(Ev::Refused { peer, .. }) if peer.to_string().ends_with(":2"))
        );
        assert!(!pipe_has_byte(&shared));
        assert!(rx.pop().is_none());
        rx.stop();
        rx.stop();
    }
}
