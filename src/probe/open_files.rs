//! The open-file limit (RLIMIT_NOFILE): the agent's raised, its probes' as it was.
//!
//! A contained probe holds two descriptors for as long as it is configured (its leaf
//! cgroup's directory, for CLONE_INTO_CGROUP, and the leaf's `cgroup.events`), and each run
//! in flight a few more. systemd starts a service with a soft limit of 1024 (its hard limit
//! is 524288 since v240), so an agent with about 500 exec probes ran out: every run then
//! failed to start with EMFILE. As systemd's documentation advises a program that needs
//! many descriptors, the agent raises its soft limit to the hard one at start, and gives
//! each probe the soft limit it was started with, the one the admin set (a probe that uses
//! select(2) breaks on a descriptor above 1024), unless the probe's `limits: open_files`
//! says otherwise. Where even the hard limit leaves no room for the configured probes, the
//! agent says so at start and at each reload that outgrows it ([`shortfall`]).

use std::sync::OnceLock;

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The limit the agent was started with, and the one in force once [`raise`] ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit this process was started with: what probes get.
    pub started_soft: u64,
    /// The soft limit now (the hard limit, where raising it succeeded).
    pub soft: u64,
    pub hard: u64,
}

static LIMIT: OnceLock<OpenFiles> = OnceLock::new();

/// Raise this process's soft limit to its hard limit, once (later calls return the first
/// answer). Call it before the first probe runs: [`for_children`] and [`started_soft`] read
/// what it recorded.
pub fn raise() -> OpenFiles {
    *LIMIT.get_or_init(|| {
        let now = read();
        if now.soft < now.hard && setrlimit(Resource::RLIMIT_NOFILE, now.hard, now.hard).is_ok() {
            OpenFiles {
                soft: now.hard,
                ..now
            }
        } else {
            now
        }
    })
}

/// The limit in force: as [`raise`] left it, or as this process was started with where
/// it has not run (nothing is changed here).
pub fn current() -> OpenFiles {
    LIMIT.get().copied().unwrap_or_else(read)
}

/// The limit as it is now, as if this process had just started with it.
fn read() -> OpenFiles {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    OpenFiles {
        started_soft: soft,
        soft,
        hard,
    }
}

/// `(soft, hard)` for a probe's child: the soft limit the agent was started with, where
/// [`raise`] changed it; `None` where the child's inherited limit is already that one.
pub fn for_children() -> Option<(u64, u64)> {
    LIMIT
        .get()
        .filter(|l| l.soft != l.started_soft)
        .map(|l| (l.started_soft, l.hard))
}

/// The soft limit this process was started with: the bound of a child's descriptor loop on
/// kernels without `close_range`, which must not grow to a raised limit (524288 fcntl calls
/// a run).
pub fn started_soft() -> u64 {
    current().started_soft
}

/// Descriptors a contained probe holds while configured (its leaf's directory and
/// `cgroup.events`).
pub const HELD_PER_PROBE: u64 = 2;

/// Descriptors the agent needs besides its probes': its runtime, logs, sockets, and the
/// runs in flight (three or four each, `max_parallel` of them).
pub const BASE: u64 = 64;

/// Why `probes` contained probes (and `in_flight` runs at once) will not fit `limit`, in
/// words for the log; `None` where they fit.
pub fn shortfall(limit: OpenFiles, probes: usize, in_flight: usize) -> Option<String> {
    let needed = BASE + HELD_PER_PROBE * probes as u64 + 4 * in_flight as u64;
    (needed > limit.soft).then(|| {
        format!(
            "the open-file limit (RLIMIT_NOFILE) is {soft} (hard limit {hard}), and {probes} \
             contained probes need about {needed} descriptors (two each while configured, \
             and four per run in flight): runs will fail to start with \"Too many open \
             files\"; raise the hard limit (systemd LimitNOFILE=, limits.conf nofile, or \
             ulimit -Hn before starting)",
            soft = limit.soft,
            hard = limit.hard,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(soft: u64, hard: u64) -> OpenFiles {
        OpenFiles {
            started_soft: soft,
            soft,
            hard,
        }
    }

    #[test]
    fn probes_that_fit_are_not_a_shortfall() {
        assert_eq!(shortfall(limit(1024, 1024), 400, 8), None);
        assert_eq!(shortfall(limit(524_288, 524_288), 10_000, 8), None);
    }

    #[test]
    fn probes_past_the_limit_are_said_with_the_numbers_and_the_way_out() {
        let words = shortfall(limit(1024, 1024), 500, 8).expect("500 probes need 1096");
        for needle in [
            "is 1024 (hard limit 1024)",
            "500 contained probes",
            "about 1096 descriptors",
            "LimitNOFILE=",
        ] {
            assert!(words.contains(needle), "{needle:?} not in {words:?}");
        }
    }

    #[test]
    fn the_bound_is_the_soft_limit_in_force() {
        let raised = OpenFiles {
            started_soft: 1024,
            soft: 524_288,
            hard: 524_288,
        };
        assert_eq!(shortfall(raised, 5_000, 8), None);
    }
}
