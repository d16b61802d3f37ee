//! One agent's supervision of its probes, carried in its [`ProbeContext`](super::ProbeContext)
//! and made once by whoever runs probes (the daemon, `--once`, `probe NAME`; a test makes
//! its own): where runs are contained ([`Containment`]), the users it looked up, the scripts
//! that passed the rule. Nothing here is a process-wide global, so two agents (two tests) in
//! one process never share a cgroup tree or a cache.
//!
//! What stays process-wide is so by nature, each said where it lives: being the child
//! subreaper and the registry of spawned pids its orphan reaper must not reap (`reaper.rs`:
//! the kernel reparents to a process, and `waitpid` reaps any child of the process);
//! what the kernel lacks (`child/spawn.rs`: clone3, `CLONE_PIDFD`); the clone stack of
//! each thread (`child/spawn.rs`); the `/dev/null` a child without stdin gets
//! (`child/mod.rs`: one read-only descriptor, never changed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::capture::stand_ins::StandIns;
use super::cgroup::{Containment, SetUpError};
use super::child::{Credentials, UserError};
use super::resolve::PathNotes;
use super::security::Verdicts;

/// See the module's doc.
#[derive(Debug)]
pub struct Supervisor {
    pub containment: Containment,
    pub users: Users,
    /// Passed verdicts of the script rule, reused while the files keep their identity.
    pub verdicts: Verdicts,
    /// Where `capture:`'s stand-ins are, written on first use.
    pub stand_ins: StandIns,
    /// Which programs found on the probes' PATH the log has named.
    pub path_notes: PathNotes,
}

impl Supervisor {
    /// For an agent that runs probes (daemon, `--once`, `probe NAME`): the process becomes
    /// the child subreaper (with its orphan reaper; inside the runtime), and its probes'
    /// runs are contained in cgroups where a v2 hierarchy is writable (undone by
    /// [`Containment::shut_down`]).
    pub fn start() -> Arc<Self> {
        if let Err(e) = super::reaper::become_subreaper() {
            tracing::debug!("cannot become a child subreaper: {e}");
        }
        Self::new(Containment::for_this_process())
    }

    pub fn new(containment: Containment) -> Arc<Self> {
        Arc::new(Self {
            containment,
            users: Users::default(),
            verdicts: Verdicts::default(),
            stand_ins: StandIns::for_this_process(),
            path_notes: PathNotes::default(),
        })
    }

    /// No cgroups: runs are contained by their process group (tests, benchmarks).
    pub fn uncontained() -> Arc<Self> {
        Self::new(Containment::ProcessGroups(SetUpError::NotAsked))
    }
}

/// How long a looked-up user (uid, gid, groups) is reused: a run every second must not read
/// /etc/passwd and /etc/group every second, and a change of groups still applies within
/// a minute.
const CREDENTIALS_TTL: Duration = Duration::from_secs(60);

/// The users probes run as, looked up at most once per `CREDENTIALS_TTL`, and the agent's
/// own name (its uid does not change).
#[derive(Debug)]
pub struct Users {
    agent: String,
    /// Shared with each run that uses them: a run takes no copy.
    cache: Mutex<HashMap<String, (Instant, Arc<Credentials>)>>,
}

impl Default for Users {
    fn default() -> Self {
        Self {
            agent: super::exec::current_user_name(),
            cache: Mutex::default(),
        }
    }
}

impl Users {
    /// The agent's own user name.
    pub fn agent_name(&self) -> &str {
        &self.agent
    }

    /// [`super::exec::credentials_for`], with lookups reused.
    pub fn credentials_for(
        &self,
        spec_run_as: Option<&str>,
        default: &str,
    ) -> Result<Option<Arc<Credentials>>, UserError> {
        super::exec::switched_to(spec_run_as, default)
            .map(|user| self.resolve(user))
            .transpose()
    }

    fn resolve(&self, user: &str) -> Result<Arc<Credentials>, UserError> {
        let cache = || self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if let Some((at, c)) = cache().get(user) {
            if now.duration_since(*at) < CREDENTIALS_TTL {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(Credentials::resolve(user)?);
        cache().insert(user.to_owned(), (now, c.clone()));
        Ok(c)
    }
}
