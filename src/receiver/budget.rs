//! The receiver's memory budget, in bytes: what every byte a peer makes the receiver hold is
//! charged to (frames being read, TLS buffers, decoded events in flight, the controller's
//! queue, each host's state), split into a share per host. The models are Envoy's overload
//! manager (one budget for the process, actions when it fills) and NATS' per-client pending
//! limits (one client over its share is cut off, never the server).
//!
//! A charge is a value ([`Charge`]): it is released when dropped, so memory is returned when
//! what it paid for is gone (an event popped by the controller, a frame decoded, a host's
//! value replaced), with no bookkeeping that could drift.
//!
//! The rules, for a host asking for `n` more bytes:
//! 1. a host over its share (`share`, default [`DEFAULT_HOST_SHARE`]) is refused: that host is
//!    cut off (`over_budget`), nobody else notices;
//! 2. while the whole budget (`total`, default [`DEFAULT_TOTAL`]) has room, every host under
//!    its share is served;
//! 3. when the whole budget is spent, a host above its fair part (`total / hosts`) is
//!    refused; a host under it is still served (it is not the cause), and the largest host
//!    above its fair part is told to go (`Budget::take_largest`). Every host under its fair
//!    part together holds at most `total`, so the worst case is `2 x total` for as long as
//!    the largest takes to close (a frame's read), and the budget is back under `total`
//!    after.
//!
//! Bytes before an accepted hello belong to no host: they are charged to the
//! pre-authentication part of the budget ([`PRE_AUTH_PART`]), and bounded per connection by
//! the pre-hello frame limit and per receiver by the cap on unauthenticated connections.
//! A host's state events (accepted, stale, gone: one per transition) are charged to the
//! receiver and never refused: they must reach the controller.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio_util::sync::CancellationToken;

/// The whole receiver's default budget. Sized for 100,000 hosts: a host at rest holds its
/// session ([`SESSION_COST`], 16 KiB), its name, its declared resources and one value each
/// (3-4 KiB for 20 resources): 100,000 hosts hold about 2 GB at rest, so 2 GiB is the
/// cluster at rest with the queue and frames in flight inside the slack of the estimates.
/// A cluster larger than that, or whose hosts declare hundreds of resources, sets it higher
/// (`xce_receiver_config_set_memory_budget`, `listen --memory-budget`); a smaller one may set
/// it lower. What one host, or every unauthenticated peer together, may hold is far less
/// (the share, and [`PRE_AUTH_PART`] of the total).
pub const DEFAULT_TOTAL: usize = 2 << 30;

/// The part of the total that connections without an accepted hello may hold together
/// (their TLS state and the one small frame each may send): 1/8.
pub const PRE_AUTH_PART: usize = 8;

/// One host's default share: enough for the protocol's largest honest traffic (a hello
/// declaring the most resources a hello may, about 1 MiB decoded, its full snapshot, and a
/// copy of each in the queue), nowhere near what would matter to the process.
pub const DEFAULT_HOST_SHARE: usize = 8 << 20;

/// What a session costs at rest beyond its frames: the socket, its task, the TLS state
/// (rustls' buffers are emptied between records). Charged for the connection's life; an
/// estimate, stated as one (BENCHMARKS.md measures the real figure per idle agent).
pub const SESSION_COST: usize = 16 << 10;

/// What an entry costs beyond the bytes it holds (allocator headers, map nodes, the
/// event's own struct): one figure for every kind of entry, erring high.
pub const ENTRY_OVERHEAD: usize = 128;

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error("host holds {used} bytes and asked for {asked} more: over its share of {share}")]
    Share {
        used: usize,
        asked: usize,
        share: usize,
    },
    #[error(
        "the receiver's budget of {total} bytes is spent, and this host holds {used} bytes, \
         more than its fair part ({fair}) of it"
    )]
    Total {
        used: usize,
        total: usize,
        fair: usize,
    },
    #[error(
        "connections without an accepted hello hold {used} bytes, their part ({part}) of the \
         receiver's budget"
    )]
    PreAuth { used: usize, part: usize },
}

/// The receiver's budget: shared by every connection, the dispatcher and the queue.
#[derive(Debug)]
pub struct Budget {
    total: usize,
    share: usize,
    used: AtomicUsize,
    /// Of `used`, what connections without an accepted hello hold.
    pre_auth: AtomicUsize,
    hosts: Mutex<HashMap<String, Weak<HostAccount>>>,
}

/// One host's part of the budget. Every connection of the host, its events and its state
/// hold it; it is dropped from the budget's table with the last of them.
#[derive(Debug)]
pub struct HostAccount {
    key: String,
    used: AtomicUsize,
    /// Cancelled when the host must go (over its share, or the largest when the budget is
    /// spent): its connection ends with `over_budget`.
    cut: CancellationToken,
    /// Why, for the connection's log line and event.
    why: Mutex<Option<OverBudget>>,
}

impl HostAccount {
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Cancelled when this host is to be cut off.
    pub fn cut_token(&self) -> &CancellationToken {
        &self.cut
    }

    /// Why the host was cut off (once it was).
    pub fn why(&self) -> Option<OverBudget> {
        *self.why.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cut_off(&self, why: OverBudget) {
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        w.get_or_insert(why);
        self.cut.cancel();
    }
}

/// Who a charge is billed to.
#[derive(Debug, Clone)]
pub enum Payer {
    /// A host: its share and the whole budget.
    Host(Arc<HostAccount>),
    /// Nobody yet (before an accepted hello): the pre-authentication part of the budget.
    PreAuth,
    /// The receiver itself (state events, which must not be lost): never refused.
    Receiver,
}

/// Bytes held, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    payer: Payer,
    bytes: usize,
}

impl Charge {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A charge of nothing to `payer`, to be resized as what it pays for grows.
    pub fn zero(budget: &Arc<Budget>, payer: Payer) -> Self {
        Charge {
            budget: Arc::clone(budget),
            payer,
            bytes: 0,
        }
    }

    /// Change the charge to `bytes` (more is asked for as a new charge would be; less is
    /// given back). On refusal the charge is unchanged.
    pub fn resize(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes > self.bytes {
            let more = self.budget.take(&self.payer, bytes - self.bytes)?;
            self.bytes += more;
        } else {
            self.budget.give(&self.payer, self.bytes - bytes);
            self.bytes = bytes;
        }
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(&self.payer, self.bytes);
    }
}

impl Budget {
    pub fn new(total: usize, share: usize) -> Arc<Self> {
        Arc::new(Self {
            total: total.max(1),
            share: share.max(1).min(total.max(1)),
            used: AtomicUsize::new(0),
            pre_auth: AtomicUsize::new(0),
            hosts: Mutex::new(HashMap::new()),
        })
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn share(&self) -> usize {
        self.share
    }

    /// Bytes charged now, to hosts and to nobody.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The account of the host with canonical name `key` (made on first use).
    pub fn account(&self, key: &str) -> Arc<HostAccount> {
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = hosts.get(key).and_then(Weak::upgrade) {
            return a;
        }
        // Dead entries go when the table would grow: it stays within the hosts alive.
        if hosts.len() >= 64 && hosts.len().is_power_of_two() {
            hosts.retain(|_, w| w.strong_count() > 0);
        }
        let a = Arc::new(HostAccount {
            key: key.to_owned(),
            used: AtomicUsize::new(0),
            cut: CancellationToken::new(),
            why: Mutex::new(None),
        });
        hosts.insert(key.to_owned(), Arc::downgrade(&a));
        a
    }

    /// Charge `bytes` to `payer`. A host refused is also cut off (its token cancelled).
    pub fn charge(self: &Arc<Self>, payer: &Payer, bytes: usize) -> Result<Charge, OverBudget> {
        let bytes = self.take(payer, bytes)?;
        Ok(Charge {
            budget: Arc::clone(self),
            payer: payer.clone(),
            bytes,
        })
    }

    /// Charge `bytes` to the receiver whatever the budget holds: for what must not be lost
    /// (a host's state events, one per transition, bounded by the hosts).
    pub fn charge_forced(self: &Arc<Self>, bytes: usize) -> Charge {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        Charge {
            budget: Arc::clone(self),
            payer: Payer::Receiver,
            bytes,
        }
    }

    fn take(&self, payer: &Payer, bytes: usize) -> Result<usize, OverBudget> {
        let used = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let refuse = |why: OverBudget| {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            if let Payer::Host(a) = payer {
                a.cut_off(why);
            }
            Err(why)
        };
        let account = match payer {
            Payer::Host(a) => a,
            Payer::Receiver => return Ok(bytes),
            Payer::PreAuth => {
                let part = self.total / PRE_AUTH_PART;
                let mine = self.pre_auth.fetch_add(bytes, Ordering::Relaxed) + bytes;
                if mine > part {
                    self.pre_auth.fetch_sub(bytes, Ordering::Relaxed);
                    return refuse(OverBudget::PreAuth {
                        used: mine - bytes,
                        part,
                    });
                }
                return Ok(bytes);
            }
        };
        let mine = account.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let over = if mine > self.share {
            Some(OverBudget::Share {
                used: mine - bytes,
                asked: bytes,
                share: self.share,
            })
        } else if used > self.total {
            let fair = self.total / self.live_hosts().max(1);
            if mine > fair {
                Some(OverBudget::Total {
                    used: mine - bytes,
                    total: self.total,
                    fair,
                })
            } else {
                // Not the cause: served, and the largest above its fair part goes.
                self.cut_largest(fair);
                None
            }
        } else {
            None
        };
        match over {
            Some(why) => {
                account.used.fetch_sub(bytes, Ordering::Relaxed);
                refuse(why)
            }
            None => Ok(bytes),
        }
    }

    fn give(&self, payer: &Payer, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        match payer {
            Payer::Host(a) => {
                a.used.fetch_sub(bytes, Ordering::Relaxed);
            }
            Payer::PreAuth => {
                self.pre_auth.fetch_sub(bytes, Ordering::Relaxed);
            }
            Payer::Receiver => {}
        }
    }

    fn live_hosts(&self) -> usize {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        hosts.values().filter(|w| w.strong_count() > 0).count()
    }

    /// Cut off the host holding the most, if it holds more than `fair` (a scan of the
    /// hosts: only when the whole budget is spent).
    fn cut_largest(&self, fair: usize) {
        let largest = {
            let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
            hosts
                .values()
                .filter_map(Weak::upgrade)
                .filter(|a| !a.cut.is_cancelled())
                .max_by_key(|a| a.used())
        };
        if let Some(a) = largest {
            let used = a.used();
            if used > fair {
                a.cut_off(OverBudget::Total {
                    used,
                    total: self.total,
                    fair,
                });
            }
        }
    }
}

/// What an owned string costs: its bytes and an entry's overhead.
pub fn text_cost(s: &str) -> usize {
    s.len() + ENTRY_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_given_back_when_dropped() {
        let b = Budget::new(1000, 500);
        let a = Payer::Host(b.account("node001"));
        let c = b.charge(&a, 300).expect("fits");
        let f = b.charge_forced(2000);
        assert_eq!(b.used(), 2300);
        drop(f);
        assert_eq!(b.used(), 300);
        drop(c);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_host_over_its_share_is_refused_and_cut_off_and_nobody_else_is() {
        let b = Budget::new(1000, 500);
        let bad = b.account("bad");
        let good = b.account("good");
        let _held = b.charge(&Payer::Host(Arc::clone(&bad)), 400).expect("fits");
        let e = b.charge(&Payer::Host(Arc::clone(&bad)), 200).unwrap_err();
        assert!(
            matches!(
                e,
                OverBudget::Share {
                    used: 400,
                    asked: 200,
                    share: 500
                }
            ),
            "{e:?}"
        );
        assert!(bad.cut_token().is_cancelled());
        assert_eq!(bad.why(), Some(e));
        assert_eq!(b.used(), 400, "the refused bytes are not held");
        let _g = b
            .charge(&Payer::Host(Arc::clone(&good)), 500)
            .expect("good fits");
        assert!(!good.cut_token().is_cancelled());
    }

    #[test]
    fn when_the_budget_is_spent_the_host_under_its_fair_part_is_served_and_the_largest_goes() {
        let b = Budget::new(1000, 800);
        let big = b.account("big");
        let small = b.account("small");
        let _big = b
            .charge(&Payer::Host(Arc::clone(&big)), 800)
            .expect("fits its share");
        let _s = b
            .charge(&Payer::Host(Arc::clone(&small)), 150)
            .expect("fits");
        // 950 used; 100 more is over the total. small holds 150 < fair 500: served.
        let _more = b
            .charge(&Payer::Host(Arc::clone(&small)), 100)
            .expect("under its fair part");
        assert!(big.cut_token().is_cancelled(), "the largest is told to go");
        assert!(matches!(
            big.why(),
            Some(OverBudget::Total { fair: 500, .. })
        ));
        assert!(!small.cut_token().is_cancelled());
        // And the big one asking more now is refused.
        assert!(b.charge(&Payer::Host(Arc::clone(&big)), 1).is_err());
    }

    #[test]
    fn bytes_before_a_hello_are_bounded_by_their_part_of_the_budget() {
        let b = Budget::new(8000, 500);
        let _c = b.charge(&Payer::PreAuth, 900).expect("fits");
        assert!(matches!(
            b.charge(&Payer::PreAuth, 200),
            Err(OverBudget::PreAuth {
                used: 900,
                part: 1000
            })
        ));
        assert_eq!(b.used(), 900);
        // A host is not affected.
        let _h = b.charge(&Payer::Host(b.account("n")), 500).expect("fits");
    }

    #[test]
    fn resize_asks_for_more_and_gives_back_less() {
        let b = Budget::new(1000, 500);
        let a = Payer::Host(b.account("n"));
        let mut c = b.charge(&a, 100).expect("fits");
        c.resize(400).expect("fits");
        assert_eq!(b.used(), 400);
        assert!(c.resize(600).is_err());
        assert_eq!((c.bytes(), b.used()), (400, 400), "unchanged on refusal");
        c.resize(50).expect("less");
        assert_eq!(b.used(), 50);
    }

    #[test]
    fn a_host_account_is_one_per_name_while_held_and_forgotten_after() {
        let b = Budget::new(1000, 500);
        let a1 = b.account("n");
        let a2 = b.account("n");
        assert!(Arc::ptr_eq(&a1, &a2));
        drop((a1, a2));
        assert_eq!(b.live_hosts(), 0);
    }
}
