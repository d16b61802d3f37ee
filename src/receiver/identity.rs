//! One canonical name per host, and one live host per certificate.
//!
//! DNS names ignore case, and a host inside the cluster's domain is the same host with or
//! without it: `NODE001`, `node001` and `node001.cluster.example` (with `cluster.example`
//! configured) are one host to the controller, reported as `node001`. Without a configured
//! domain, a fully qualified hello stays fully qualified (lower case): the receiver cannot
//! know which domain is the cluster's.
//!
//! A certificate may name a host twice (SANs `node001` and `node001.cluster.example`) or
//! several hosts: whichever name its hello claims, one certificate speaks for at most one
//! live host at a time. A second session with the same certificate displaces the first, as
//! a reconnect does, so one key can never be two hosts at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

/// Who is at the other end of a session: a TCP peer (controller's door), or a local process
/// on the worker's unix socket (known by its credentials, SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Tcp(std::net::SocketAddr),
    Unix { uid: u32, pid: i32 },
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Tcp(a) => write!(f, "{a}"),
            Peer::Unix { uid, pid } => write!(f, "unix:uid={uid},pid={pid}"),
        }
    }
}

impl From<std::net::SocketAddr> for Peer {
    fn from(a: std::net::SocketAddr) -> Self {
        Peer::Tcp(a)
    }
}

/// The name the controller sees for the host a hello names: lower case, the first of
/// `domains` it ends in removed (`node001.cluster.example` -> `node001`).
pub fn canonical_host(host: &str, domains: &[String]) -> String {
    let lower = host.to_ascii_lowercase();
    for d in domains {
        let d = d.trim_matches('.').to_ascii_lowercase();
        if d.is_empty() {
            continue;
        }
        if let Some(short) = lower.strip_suffix(d.as_str()) {
            if let Some(short) = short.strip_suffix('.') {
                if !short.is_empty() {
                    return short.to_owned();
                }
            }
        }
    }
    lower
}

/// Who a session is, for displacement: its canonical host and (on TLS) its certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Host(String),
    Certificate(Vec<u8>),
}

/// Why a session was told to end from outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Displaced {
    /// A newer session for the same host.
    SameHost,
    /// A newer session with the same certificate, for `host`.
    SameCertificate { host: String },
    /// Its certificate is revoked by a CRL loaded since it connected.
    Revoked,
}

/// The live session of each host and of each certificate.
#[derive(Default)]
pub struct Live {
    next_id: AtomicU64,
    by_key: Mutex<HashMap<Key, Session>>,
}

struct Session {
    id: u64,
    token: CancellationToken,
    why: std::sync::Arc<Mutex<Option<Displaced>>>,
}

/// A session's claim handle: its id and how it learns it was displaced.
#[derive(Debug, Clone)]
pub struct Claim {
    pub id: u64,
    pub token: CancellationToken,
    why: std::sync::Arc<Mutex<Option<Displaced>>>,
}

impl Claim {
    /// Why this session was displaced (once its token is cancelled).
    pub fn displaced(&self) -> Option<Displaced> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Live {
    /// A claim handle for a new session (claims nothing yet).
    pub fn session(&self) -> Claim {
        Claim {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            token: CancellationToken::new(),
            why: Default::default(),
        }
    }

    /// The session `claim` now speaks for `host` (canonical) with `certificate` (its DER,
    /// on TLS): older sessions for either are told to go. Returns how many were.
    pub fn claim(&self, claim: &Claim, host: &str, certificate: Option<&[u8]>) -> usize {
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let mut displaced = 0;
        let mut keys = vec![(Key::Host(host.to_owned()), Displaced::SameHost)];
        if let Some(der) = certificate {
            keys.push((
                Key::Certificate(der.to_vec()),
                Displaced::SameCertificate {
                    host: host.to_owned(),
                },
            ));
        }
        for (key, why) in keys {
            let mine = Session {
                id: claim.id,
                token: claim.token.clone(),
                why: std::sync::Arc::clone(&claim.why),
            };
            if let Some(old) = map.insert(key, mine) {
                if old.id != claim.id && !old.token.is_cancelled() {
                    old.why
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(why);
                    old.token.cancel();
                    displaced += 1;
                }
            }
        }
        displaced
    }

    /// End every live session whose certificate is one of `certificates` (keys as
    /// `link::tls::certificate_key` makes them). Returns how many were.
    pub fn revoke(&self, certificates: &[String]) -> usize {
        let map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let mut ended = 0;
        for (key, s) in map.iter() {
            let Key::Certificate(der) = key else { continue };
            if certificates.iter().any(|c| c.as_bytes() == der.as_slice())
                && !s.token.is_cancelled()
            {
                s.why
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(Displaced::Revoked);
                s.token.cancel();
                ended += 1;
            }
        }
        ended
    }

    /// The session ended: its keys are free (unless a newer session holds them already).
    pub fn release(&self, claim: &Claim) {
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| s.id != claim.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_is_lower_case_with_the_clusters_domain_folded() {
        let d = vec!["Cluster.Example".to_owned()];
        assert_eq!(canonical_host("NODE001", &d), "node001");
        assert_eq!(canonical_host("node001.cluster.example", &d), "node001");
        assert_eq!(
            canonical_host("Node001.CLUSTER.example.", &d),
            "node001.cluster.example."
        );
        assert_eq!(canonical_host("node001.evil", &d), "node001.evil");
        assert_eq!(
            canonical_host("node001.xcluster.example", &d),
            "node001.xcluster.example"
        );
        assert_eq!(canonical_host("cluster.example", &d), "cluster.example");
        assert_eq!(
            canonical_host("node001.cluster.example", &[]),
            "node001.cluster.example"
        );
    }

    #[test]
    fn a_second_session_for_a_host_or_a_certificate_displaces_the_first() {
        let live = Live::default();
        let a = live.session();
        assert_eq!(live.claim(&a, "node001", Some(b"cert")), 0);
        let b = live.session();
        // Same certificate, another name it carries: still one live host.
        assert_eq!(live.claim(&b, "node001.cluster.example", Some(b"cert")), 1);
        assert!(a.token.is_cancelled());
        assert_eq!(
            a.displaced(),
            Some(Displaced::SameCertificate {
                host: "node001.cluster.example".into()
            })
        );
        let c = live.session();
        assert_eq!(live.claim(&c, "node001.cluster.example", None), 1);
        assert_eq!(b.displaced(), Some(Displaced::SameHost));
        // An ended session frees only its own keys.
        live.release(&b);
        let d = live.session();
        assert_eq!(
            live.claim(&d, "node001.cluster.example", None),
            1,
            "c still held it"
        );
        assert!(!d.token.is_cancelled());
    }
}
