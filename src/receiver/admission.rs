//! Admission before authentication: which connections the receiver keeps while they have not
//! yet proved who they are (TLS handshake with a client certificate, then an accepted hello).
//!
//! The model is sshd's MaxStartups and PerSourcePenalties, turned so that held sockets cannot
//! lock real agents out. sshd refuses *new* connections when too many are pending; a peer that
//! holds 1,024 idle sockets and re-opens each one it loses then owns every slot, and every
//! agent's connection is the one refused. Here a new connection is never refused: it is
//! always admitted, and when room is needed the connection that has shown the least and waited
//! longest goes instead. A real agent sends its whole TLS ClientHello at once and finishes its
//! handshake and hello in milliseconds; a held socket is silent and old. So:
//!
//! - Each pending connection is at a [`Stage`]: `Silent` (no complete ClientHello yet),
//!   `Handshaking` (ClientHello read, handshake under way) or `Certified` (the handshake is done
//!   with a certificate from the site CA; the hello is not in yet). Eviction takes the lowest
//!   stage first and, within it, the oldest: an agent whose ClientHello is in is never pushed
//!   out while any silent socket is held, and one with a valid certificate never while any
//!   connection without one is.
//! - **Per source** (an IPv4 address, an IPv6 /64): at most [`Policy::per_source`] pending.
//!   A new connection from a source at its cap evicts that source's own weakest connection,
//!   never another source's: one flooding address cannot push out the handshakes of others.
//!   Agents behind one NAT or login node share the address with a flood from it, so the cap
//!   cannot be the only guard, and it is not a refusal: the agent's new connection gets in,
//!   the flood's oldest silent one goes.
//! - **In all**: at most [`Policy::full`] pending. At the cap a new connection evicts the
//!   weakest one of all.
//! - **Random early drop**, as MaxStartups' `start:rate:full`, applied to the *old* end: from
//!   [`Policy::early_start`] pending, each admission also evicts, with a probability rising
//!   linearly from [`Policy::early_rate_percent`] to 100 % at `full`, the weakest connection,
//!   if it is still silent after [`Policy::early_min_age`]. Held sockets are shed before the
//!   pool is full, so a flood's sockets live shorter as it grows. Dropping the *new* one, as
//!   sshd does, is what locks agents out: a flood that re-opens what it loses keeps the pool
//!   in the drop band, and then each try of an agent is refused with a probability near 1.
//!
//! An agent's connection can be evicted only when `per_source` newer connections from its
//! address (or `full` newer ones in all) arrive while it is still silent, that is between
//! its accept and the first read of its ClientHello (the accept loop yields after each
//! accept, so that read comes before the next accepts), or while its handshake runs and every
//! other pending one of its address has shown as much. A flood must then complete TLS
//! handshakes, which costs the receiver's CPU a signature each and bounds its rate.
//!
//! The pool is plain data, tested without sockets: the caller passes the time and the pool
//! draws from its own seeded generator.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::link::tls;

/// How the receiver admits connections before authentication (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Pending connections in all: sshd's MaxStartups `full`.
    pub full: usize,
    /// Pending connections per source (an IPv4 address, an IPv6 /64).
    pub per_source: usize,
    /// From this many pending, admissions shed old silent connections at random.
    pub early_start: usize,
    /// The probability of that at `early_start`, in percent; it rises to 100 at `full`.
    pub early_rate_percent: u32,
    /// A connection silent for less than this is never shed early: a real agent's ClientHello
    /// follows its connect within a round trip.
    pub early_min_age: Duration,
}

/// Pending connections in all (MaxStartups 512:30:1024, sshd's own numbers doubled: a
/// controller serves thousands of nodes that reconnect together after it restarts).
pub const FULL: usize = 1024;

/// Pending connections per source: an eighth of the pool. A NAT or login node in front of a
/// few hundred agents that reconnect at once still fits (each holds its slot for the
/// milliseconds of its handshake); one address cannot hold more than an eighth of the pool.
pub const PER_SOURCE: usize = 128;

impl Default for Policy {
    fn default() -> Self {
        Self::with_full(FULL)
    }
}

impl Policy {
    /// The default shape scaled to `full` pending connections: early drop from half of it at
    /// 30 %, an eighth of it per source (at least one).
    pub fn with_full(full: usize) -> Self {
        let full = full.max(1);
        Self {
            full,
            per_source: (full * PER_SOURCE / FULL).clamp(1, full),
            early_start: full / 2,
            early_rate_percent: 30,
            early_min_age: Duration::from_secs(1),
        }
    }
}

/// How far a pending connection has come: eviction takes the lowest stage first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Accepted; no complete TLS ClientHello yet (on plaintext: no accepted hello yet).
    Silent,
    /// The ClientHello is read; the TLS handshake is under way.
    Handshaking,
    /// The handshake is done with a certificate of the site CA; the hello is not in yet.
    Certified,
}

/// Why a pending connection was evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Eviction {
    /// A new connection came from its source, which was at its cap.
    SourceFull,
    /// A new connection came while the pool was full.
    PoolFull,
    /// Shed at random as the pool filled, silent past `early_min_age`.
    Early,
}

impl Eviction {
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::SourceFull => "too many from one address",
            Eviction::PoolFull => "too many in all",
            Eviction::Early => "silent while the pool filled",
        }
    }
}

/// The source a connection counts against: an IPv4 address (an IPv4-mapped IPv6 address is
/// one), or the /64 of an IPv6 address (what one site or host is usually given).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(a) & !u128::from(u64::MAX))),
        },
    }
}

#[derive(Debug)]
struct Entry {
    source: IpAddr,
    stage: Stage,
    since: Instant,
    evict: CancellationToken,
}

/// The pending connections, ordered for eviction.
#[derive(Debug)]
pub struct Pool {
    policy: Policy,
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// (stage, id): ids grow with accept time, so the first is the weakest and oldest.
    order: BTreeSet<(Stage, u64)>,
    by_source: HashMap<IpAddr, BTreeSet<(Stage, u64)>>,
    rng: SplitMix64,
}

/// One admitted connection: its id in the pool, and the token cancelled when it is evicted.
#[derive(Debug)]
pub struct Admitted {
    pub id: u64,
    pub evict: CancellationToken,
    /// The connections evicted to admit it (their tokens are already cancelled).
    pub evicted: Vec<Eviction>,
}

impl Pool {
    /// A pool with `policy`, its random early drop drawn from `seed`.
    pub fn new(policy: Policy, seed: u64) -> Self {
        Self {
            policy,
            next_id: 0,
            entries: HashMap::new(),
            order: BTreeSet::new(),
            by_source: HashMap::new(),
            rng: SplitMix64(seed),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Pending connections from `ip`'s source.
    pub fn from_source(&self, ip: IpAddr) -> usize {
        self.by_source.get(&source_of(ip)).map_or(0, BTreeSet::len)
    }

    /// The stage of a pending connection; `None` once it left (released or evicted).
    pub fn stage(&self, id: u64) -> Option<Stage> {
        self.entries.get(&id).map(|e| e.stage)
    }

    /// Admit a new connection from `ip` at `now`, evicting what the policy says must go.
    /// Never refuses: the newest connection is the one most likely to be a real agent.
    pub fn admit(&mut self, ip: IpAddr, now: Instant) -> Admitted {
        let source = source_of(ip);
        let mut evicted = Vec::new();
        let weakest_of_source = self
            .by_source
            .get(&source)
            .filter(|s| s.len() >= self.policy.per_source)
            .and_then(|s| s.first().copied());
        if let Some((_, id)) = weakest_of_source {
            self.evict(id);
            evicted.push(Eviction::SourceFull);
        } else if self.entries.len() >= self.policy.full {
            if let Some(&(_, id)) = self.order.first() {
                self.evict(id);
                evicted.push(Eviction::PoolFull);
            }
        } else if self.early_drop_due() {
            let old_and_silent = self.order.first().copied().filter(|&(stage, id)| {
                stage == Stage::Silent
                    && self.entries.get(&id).is_some_and(|e| {
                        now.saturating_duration_since(e.since) >= self.policy.early_min_age
                    })
            });
            if let Some((_, id)) = old_and_silent {
                self.evict(id);
                evicted.push(Eviction::Early);
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let evict = CancellationToken::new();
        self.entries.insert(
            id,
            Entry {
                source,
                stage: Stage::Silent,
                since: now,
                evict: evict.clone(),
            },
        );
        self.order.insert((Stage::Silent, id));
        self.by_source
            .entry(source)
            .or_default()
            .insert((Stage::Silent, id));
        Admitted { id, evict, evicted }
    }

    /// Whether this admission sheds an old connection early: MaxStartups' drop probability,
    /// `rate` % at `early_start` rising linearly to 100 % at `full`.
    fn early_drop_due(&mut self) -> bool {
        let Policy {
            full,
            early_start,
            early_rate_percent: rate,
            ..
        } = self.policy;
        let n = self.entries.len();
        if n < early_start || full <= early_start {
            return false;
        }
        let rate = u64::from(rate.min(100));
        let span = (full - early_start) as u64;
        let into = (n - early_start) as u64;
        // In parts per (100 * span), to stay in integers.
        let chance = rate * span + (100 - rate) * into;
        self.rng.next() % (100 * span) < chance
    }

    /// A pending connection has come further.
    pub fn advance(&mut self, id: u64, stage: Stage) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.stage >= stage {
            return;
        }
        let old = (e.stage, id);
        e.stage = stage;
        self.order.remove(&old);
        self.order.insert((stage, id));
        if let Some(s) = self.by_source.get_mut(&e.source) {
            s.remove(&old);
            s.insert((stage, id));
        }
    }

    /// A pending connection left: authenticated (its hello accepted), failed or closed.
    pub fn release(&mut self, id: u64) {
        let Some(e) = self.entries.remove(&id) else {
            return;
        };
        self.order.remove(&(e.stage, id));
        if let Some(s) = self.by_source.get_mut(&e.source) {
            s.remove(&(e.stage, id));
            if s.is_empty() {
                self.by_source.remove(&e.source);
            }
        }
    }

    fn evict(&mut self, id: u64) {
        if let Some(e) = self.entries.get(&id) {
            e.evict.cancel();
        }
        self.release(id);
    }
}

/// A small fast generator (SplitMix64) for the early drop: its draws need to be spread, not
/// secret (a peer cannot see them), and the tests seed it.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A seed that differs between runs (std's per-process hash keys, and the time).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The pool as the receiver shares it between its accept loop and its connections.
pub type SharedPool = Arc<Mutex<Pool>>;

fn lock(pool: &SharedPool) -> std::sync::MutexGuard<'_, Pool> {
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection's place in the pool: advanced as it comes further, released when dropped
/// (once its hello is accepted, or when it ends).
#[derive(Debug)]
pub struct Ticket {
    pool: SharedPool,
    id: u64,
    evict: CancellationToken,
}

impl Ticket {
    /// Admit a connection from `ip` now; also the evictions it caused.
    pub fn admit(pool: &SharedPool, ip: IpAddr, now: Instant) -> (Self, Vec<Eviction>) {
        let Admitted { id, evict, evicted } = lock(pool).admit(ip, now);
        let ticket = Self {
            pool: Arc::clone(pool),
            id,
            evict,
        };
        (ticket, evicted)
    }

    pub fn advance(&self, stage: Stage) {
        lock(&self.pool).advance(self.id, stage);
    }

    /// Resolves when a newer connection evicted this one.
    pub async fn evicted(&self) {
        self.evict.cancelled().await
    }

    pub fn is_evicted(&self) -> bool {
        self.evict.is_cancelled()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.pool).release(self.id);
    }
}

/// How long the receiver waits for a TLS handshake to finish from accept: half the agent's
/// own bound ([`tls::HANDSHAKE_TIMEOUT`]). A real agent's handshake takes milliseconds; a
/// socket held open without one gives its slot back this soon even when nothing evicts it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The receiver's side of a TLS handshake, in two halves that `ticket` follows: reading the
/// ClientHello (the connection is `Silent`), then the rest (`Handshaking`). Bounded by
/// `bound` from now; `Ok(None)` when a newer connection evicted this one first (a connection
/// evicted before its ClientHello was complete is sent [`BUSY_ALERT`]: the agent then says
/// the controller was busy, not that it does not speak TLS).
pub async fn tls_accept(
    cfg: &Arc<rustls::ServerConfig>,
    bound: Duration,
    stream: tokio::net::TcpStream,
    ticket: &Ticket,
) -> Result<Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>, (tls::Failure, String)>
{
    let deadline = tokio::time::Instant::now() + bound;
    let stalled = || {
        (
            tls::Failure::Timeout,
            format!("no handshake within {bound:?} (peer stalled)"),
        )
    };
    let failed = |e: std::io::Error| (tls::Failure::of(&e), tls::describe_accept(&e));
    let hello = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    tokio::pin!(hello);
    // Eviction first: a connection evicted before its task first ran is not served.
    let start = tokio::select! {
        biased;
        _ = ticket.evicted() => {
            if let Some(io) = hello.take_io() {
                // Best effort and never waited for: a peer that does not read gets nothing.
                let _ = io.try_write(&BUSY_ALERT);
            }
            return Ok(None);
        }
        r = hello.as_mut() => r.map_err(failed)?,
        _ = tokio::time::sleep_until(deadline) => return Err(stalled()),
    };
    ticket.advance(Stage::Handshaking);
    let rest = start.into_stream(Arc::clone(cfg));
    tokio::select! {
        biased;
        _ = ticket.evicted() => Ok(None),
        r = rest => r.map(Some).map_err(failed),
        _ = tokio::time::sleep_until(deadline) => Err(stalled()),
    }
}

/// What the receiver sends a connection it evicts before the connection's TLS ClientHello is
/// complete (nothing of TLS has been said yet, so a plaintext record is the protocol): a
/// fatal TLS alert `user_canceled`, "canceling the handshake for some reason unrelated to a
/// protocol failure" (RFC 8446, 6.1). TLS has no "busy" alert; the agent reads this one, at
/// that point, as "turned away: too many connections waiting" instead of a silent close.
pub const BUSY_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 90];

/// Why `accept` failed, in the admin's words: out of descriptors names the limit and how to
/// raise it.
pub fn accept_error_words(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EMFILE) => {
            let limit = nofile_limit().map_or("its limit".to_owned(), |n| format!("{n}"));
            format!(
                "accept failed: this process is out of file descriptors (RLIMIT_NOFILE {limit}; \
                 one per agent and per connection waiting for its handshake): raise it \
                 (systemd LimitNOFILE=, limits.conf nofile, or ulimit -n before starting)"
            )
        }
        Some(libc::ENFILE) => "accept failed: the system is out of file descriptors \
             (fs.file-max reached): raise sysctl fs.file-max or find the process holding them"
            .to_owned(),
        _ => format!("accept failed: {e}"),
    }
}

/// This process's open-file soft limit.
pub fn nofile_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn policy(full: usize, per_source: usize) -> Policy {
        Policy {
            full,
            per_source,
            early_start: full,
            early_rate_percent: 30,
            early_min_age: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_source_at_its_cap_loses_its_own_oldest_connection_not_another_sources() {
        let mut pool = Pool::new(policy(100, 3), 1);
        let t0 = Instant::now();
        let other = pool.admit(ip(2), t0);
        let mine: Vec<_> = (0..3).map(|_| pool.admit(ip(1), t0)).collect();
        let next = pool.admit(ip(1), t0);
        assert_eq!(next.evicted, [Eviction::SourceFull]);
        assert!(mine[0].evict.is_cancelled(), "the source's oldest went");
        assert!(!mine[1].evict.is_cancelled() && !mine[2].evict.is_cancelled());
        assert!(!other.evict.is_cancelled(), "another source is untouched");
        assert_eq!(pool.from_source(ip(1)), 3);
        assert_eq!(pool.len(), 4);
        assert_eq!(pool.stage(mine[0].id), None);
    }

    #[test]
    fn a_full_pool_evicts_the_weakest_then_oldest_and_always_admits_the_new_one() {
        let mut pool = Pool::new(policy(4, 4), 1);
        let t0 = Instant::now();
        let a: Vec<_> = (0..4).map(|i| pool.admit(ip(i), t0)).collect();
        // The oldest has read its ClientHello, the second is certified: the third goes first.
        pool.advance(a[0].id, Stage::Handshaking);
        pool.advance(a[1].id, Stage::Certified);
        let b = pool.admit(ip(9), t0);
        assert_eq!(b.evicted, [Eviction::PoolFull]);
        assert!(a[2].evict.is_cancelled());
        let c = pool.admit(ip(9), t0);
        assert!(a[3].evict.is_cancelled());
        // Now the silent ones are the new b and c: b, the older, goes.
        let d = pool.admit(ip(9), t0);
        assert!(b.evict.is_cancelled() && !c.evict.is_cancelled());
        // Only when nothing is silent does a handshaking one go, before the certified one.
        pool.advance(c.id, Stage::Certified);
        pool.advance(d.id, Stage::Certified);
        let _e = pool.admit(ip(9), t0);
        assert!(a[0].evict.is_cancelled(), "the handshaking one");
        assert!(
            !a[1].evict.is_cancelled(),
            "certified ones stay while others are weaker"
        );
        assert_eq!(pool.len(), 4);
    }

    #[test]
    fn a_flood_from_an_agents_own_address_never_evicts_the_agent_past_its_client_hello() {
        // 1,100 held sockets from 127.0.0.1 re-opened as they close, and an agent there too.
        let mut pool = Pool::new(Policy::default(), 7);
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let t0 = Instant::now();
        for _ in 0..1_100 {
            pool.admit(lo, t0);
        }
        let agent = pool.admit(lo, t0);
        pool.advance(agent.id, Stage::Handshaking);
        for i in 0..10_000u64 {
            pool.admit(lo, t0 + Duration::from_millis(i));
        }
        assert!(!agent.evict.is_cancelled());
        assert_eq!(pool.stage(agent.id), Some(Stage::Handshaking));
        assert!(pool.from_source(lo) <= PER_SOURCE);
    }

    #[test]
    fn early_drop_rises_from_its_rate_at_start_to_certain_at_full_and_sheds_only_old_silence() {
        let p = Policy {
            early_start: 50,
            ..policy(100, 100)
        };
        let chance_at = |n: usize, seed: u64| {
            let mut pool = Pool::new(p, seed);
            let t0 = Instant::now();
            for i in 0..n {
                pool.admit(ip(i as u8), t0);
            }
            let hits = (0..10_000).filter(|_| pool.early_drop_due()).count();
            hits as f64 / 10_000.0
        };
        assert_eq!(chance_at(49, 3), 0.0, "below the start nothing is shed");
        let at_start = chance_at(50, 3);
        assert!((0.28..0.32).contains(&at_start), "{at_start}");
        let half_way = chance_at(75, 4);
        assert!((0.62..0.68).contains(&half_way), "{half_way}");
        let near_full = chance_at(99, 5);
        assert!(near_full > 0.97, "{near_full}");

        // In the band, an admission that draws the drop sheds the oldest silent connection
        // once it is old enough; young silence and any progress are never shed early.
        let p = Policy {
            early_start: 1,
            early_rate_percent: 100,
            ..policy(100, 100)
        };
        let mut pool = Pool::new(p, 1);
        let t0 = Instant::now();
        let young = pool.admit(ip(1), t0);
        let b = pool.admit(ip(2), t0 + Duration::from_millis(500));
        assert!(b.evicted.is_empty() && !young.evict.is_cancelled());
        let c = pool.admit(ip(3), t0 + Duration::from_secs(2));
        assert_eq!(c.evicted, [Eviction::Early]);
        assert!(young.evict.is_cancelled());
        pool.advance(b.id, Stage::Handshaking);
        pool.advance(c.id, Stage::Handshaking);
        let d = pool.admit(ip(4), t0 + Duration::from_secs(60));
        assert!(
            d.evicted.is_empty(),
            "a handshaking connection is not silent"
        );
    }

    #[test]
    fn a_released_or_evicted_connection_leaves_no_trace() {
        let mut pool = Pool::new(policy(2, 2), 1);
        let t0 = Instant::now();
        let a = pool.admit(ip(1), t0);
        pool.advance(a.id, Stage::Certified);
        pool.release(a.id);
        pool.release(a.id);
        pool.advance(a.id, Stage::Handshaking);
        assert!(pool.is_empty() && pool.from_source(ip(1)) == 0);
        let shared: SharedPool = Arc::new(Mutex::new(pool));
        let (t, evicted) = Ticket::admit(&shared, ip(1), t0);
        assert!(evicted.is_empty());
        t.advance(Stage::Handshaking);
        assert_eq!(lock(&shared).stage(t.id), Some(Stage::Handshaking));
        drop(t);
        assert!(lock(&shared).is_empty());
    }

    #[test]
    fn sources_are_ipv4_addresses_and_ipv6_slash_64s() {
        let v6 = |s: &str| s.parse::<IpAddr>().expect("addr");
        assert_eq!(
            source_of(v6("2001:db8:1:2:aaaa::1")),
            source_of(v6("2001:db8:1:2:bbbb::9"))
        );
        assert_ne!(
            source_of(v6("2001:db8:1:2::1")),
            source_of(v6("2001:db8:1:3::1"))
        );
        assert_eq!(source_of(v6("::ffff:10.0.0.1")), ip(1));
        assert_ne!(source_of(ip(1)), source_of(ip(2)));
    }

    #[test]
    fn the_default_policy_is_maxstartups_512_30_1024_with_128_per_source() {
        let p = Policy::default();
        assert_eq!(
            (p.early_start, p.early_rate_percent, p.full, p.per_source),
            (512, 30, 1024, 128)
        );
        assert_eq!(Policy::with_full(8).per_source, 1);
        assert_eq!(Policy::with_full(0).full, 1);
    }

    #[test]
    fn out_of_descriptors_names_the_limit_and_how_to_raise_it() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let words = accept_error_words(&emfile);
        assert!(
            words.contains("RLIMIT_NOFILE") && words.contains("LimitNOFILE="),
            "{words}"
        );
        let enfile = std::io::Error::from_raw_os_error(libc::ENFILE);
        assert!(accept_error_words(&enfile).contains("fs.file-max"));
    }
}
