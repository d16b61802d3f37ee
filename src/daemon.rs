//! The node daemon: the plan's probes on their timers, the store, and the link to the
//! controller, until SIGTERM. The controller's `welcome` (shared instances assigned to this
//! host) re-plans; values flow store -> link without the probes ever waiting on the network.
//! A controller flapping between welcomes costs at most one replan per second (see
//! `link::assignment`), and an unchanged plan sends no new hello or snapshot.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProbeKind};
use crate::link::assignment::AssignmentGate;
use crate::link::client::{self, Assigned, LinkConfig, LinkState, LinkStats};
use crate::link::tls::Material;
use crate::link::wire;
use crate::plan::{make_plan, Plan};
use crate::probe::{BuiltinSource, ProbeContext};
use crate::schedule::Scheduler;
use crate::stats::Stats;
use crate::status::Loaded;
use crate::store::{Declared, Store};

/// Load both files and check what only the layers above config know (the builtin catalogue).
pub fn load_config(
    agent_path: &std::path::Path,
    resources_override: Option<&std::path::Path>,
) -> Result<Config, crate::config::ConfigErrors> {
    let config = crate::config::load(agent_path, resources_override)?;
    config
        .resources
        .check_builtin_indices(&crate::probe::builtin::index_names())?;
    Ok(config)
}

/// The store's slots for a plan: one per fed resource and instance.
pub fn declared(plan: &Plan) -> Vec<Declared> {
    plan.tasks
        .iter()
        .flat_map(|t| {
            t.feeds.iter().map(move |f| Declared {
                name: f.name.clone(),
                instance: t.instance.clone(),
                valtype: f.valtype,
                stale_after: t.stale_after,
            })
        })
        .collect()
}

/// What the controller is told this host reports.
pub fn hello(config: &Config, plan: &Plan, boot_id: &str) -> wire::Hello {
    let resources = plan
        .tasks
        .iter()
        .flat_map(|t| {
            t.feeds.iter().map(move |f| wire::Declared {
                name: f.name.clone(),
                instance: t.instance.clone(),
                valtype: f.valtype,
                interval_ms: t.interval.as_millis() as u64,
                shared: !t.instance.is_empty(),
            })
        })
        .collect();
    wire::Hello::new(plan.host.clone(), boot_id, config.digest.clone(), resources)
}

pub fn probe_context(config: &Config, host: &str, builtin: Arc<dyn BuiltinSource>) -> ProbeContext {
    ProbeContext {
        host: host.to_owned(),
        plugin_dir: config.agent.plugin_dir.clone(),
        run_as: config.agent.run_as.clone(),
        builtin,
        files: crate::probe::file_reader::FileReads::new(config.agent.max_stuck_reads),
    }
}

pub fn uses_builtins(plan: &Plan) -> bool {
    plan.tasks
        .iter()
        .any(|t| matches!(t.kind, ProbeKind::Builtin { .. }))
}

/// A running agent: everything a reload or a welcome needs to change.
pub struct Agent {
    pub config: Config,
    pub host: String,
    pub store: Arc<Store>,
    pub scheduler: Scheduler,
    pub link_stats: Arc<LinkStats>,
    /// The scheduler's counters; replaced when a reload rebuilds the scheduler.
    stats_tx: watch::Sender<Arc<Stats>>,
    hello_tx: watch::Sender<Arc<wire::Hello>>,
    /// What `xce-agent status` reports of the configuration and plan.
    loaded_tx: watch::Sender<Arc<Loaded>>,
    assignment: AssignmentGate,
    /// The link's welcome count at the last applied change, to count those coalesced since.
    welcomes_applied: u64,
    boot_id: String,
    plan: Plan,
    /// Parent of the scheduler's and the link's tokens.
    shutdown: CancellationToken,
    link_cfg: LinkConfig,
    link: Option<Link>,
    /// The link's key material as last loaded (`tls:` in agent.yaml).
    tls: Option<Material>,
}

struct Link {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Link {
    /// Stop the link (it flushes a last batch if connected), waiting at most `grace`.
    async fn stop(self, grace: Duration) {
        self.stop.cancel();
        let _ = tokio::time::timeout(grace, self.handle).await;
    }
}

/// What a reload changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reloaded {
    pub kept: usize,
    pub stopped: usize,
    pub started: usize,
    /// plugin_dir, run_as or max_parallel changed: every probe was restarted.
    pub probes_restarted: bool,
    /// The controller list changed: the link was re-made.
    pub link_restarted: bool,
}

/// Why a reload was refused (the running config stays).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    #[error("host name changed from {old:?} to {new:?}; restart the agent to change it")]
    HostChanged { old: String, new: String },
    /// What `check` calls a problem (unknown run_as user, missing program, refused
    /// permissions), as (resource, text) lines.
    #[error("{} problem(s) that `xce-agent check` reports", .0.len())]
    Checks(crate::checks::Findings),
    #[error("{0}")]
    Tls(String),
    #[error("the new configuration could not be planned (a bug: please report it)")]
    Unplannable,
}

impl Agent {
    /// Start probing `config` as `host`, and stream to its controllers if it lists any.
    pub fn start(
        config: Config,
        host: String,
        builtin: Arc<dyn BuiltinSource>,
        link_cfg: LinkConfig,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let store = Arc::new(Store::new());
        let boot_id = wire::boot_id();
        let plan = make_plan(&config.resources, &host, &BTreeSet::new());
        let (hello_tx, _) = watch::channel(Arc::new(hello(&config, &plan, &boot_id)));
        store.declare(declared(&plan));
        let ctx = probe_context(&config, &host, builtin);
        // A child token: stopping the scheduler must not stop the link before its last flush.
        let mut scheduler = Scheduler::new(
            store.clone(),
            ctx,
            config.agent.max_parallel,
            shutdown.child_token(),
        );
        scheduler.apply(&plan);
        let (stats_tx, _) = watch::channel(scheduler.stats.clone());
        let link_stats = Arc::new(LinkStats::default());
        let (_, assigned_rx) = watch::channel(Assigned::new());
        let (loaded_tx, _) = watch::channel(Arc::new(Loaded::new(&config, &plan, 1)));
        tracing::info!(host = %host, probes = plan.tasks.len(), skipped = plan.skipped.len(), controllers = ?config.agent.controllers, "started");
        // `main` loaded the same files a moment ago and refused to start on an error.
        let tls = config.agent.tls.as_ref().and_then(|p| {
            Material::load(p)
                .inspect_err(|e| tracing::error!("{e}; not connecting to any controller"))
                .ok()
        });
        let mut agent = Self {
            config,
            host,
            store,
            scheduler,
            link_stats,
            stats_tx,
            hello_tx,
            loaded_tx,
            assignment: AssignmentGate::new(assigned_rx),
            welcomes_applied: 0,
            boot_id,
            plan,
            shutdown,
            link_cfg,
            link: None,
            tls,
        };
        agent.start_link();
        agent
    }

    /// (Re)start the link to the configured controllers, if any. The assignment starts
    /// empty: the controller re-sends it in its welcome.
    fn start_link(&mut self) {
        let (assigned_tx, assigned_rx) = watch::channel(Assigned::new());
        self.assignment.follow(assigned_rx);
        if self.config.agent.controllers.is_empty() {
            return;
        }
        let tls = match (&self.config.agent.tls, &self.tls) {
            (None, _) => None,
            (Some(_), None) => return,
            (Some(_), Some(m)) => match m.client_config() {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!("{e}; not connecting to any controller");
                    return;
                }
            },
        };
        let not_after = self.tls.as_ref().and_then(Material::leaf_not_after);
        self.link_stats
            .cert_not_after
            .store(not_after.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
        let cfg = LinkConfig {
            controllers: self.config.agent.controllers.clone(),
            tls,
            ..self.link_cfg.clone()
        };
        let stop = self.shutdown.child_token();
        let handle = tokio::spawn(client::run(
            cfg,
            self.store.clone(),
            self.hello_tx.subscribe(),
            assigned_tx,
            self.link_stats.clone(),
            stop.clone(),
        ));
        self.link = Some(Link { stop, handle });
    }

    async fn stop_link(&mut self, grace: Duration) {
        if let Some(link) = self.link.take() {
            link.stop(grace).await;
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The scheduler's counters, following scheduler rebuilds (for `/metrics`).
    pub fn stats(&self) -> watch::Receiver<Arc<Stats>> {
        self.stats_tx.subscribe()
    }

    /// The configuration and plan as they change (for `xce-agent status`).
    pub fn loaded(&self) -> watch::Receiver<Arc<Loaded>> {
        self.loaded_tx.subscribe()
    }

    /// Move to a new config and/or assignment: the hello first, then the store's slots (the
    /// link sends hello + full snapshot on the generation change, both of the new set), then
    /// the probes (unchanged ones keep running).
    pub fn replan(&mut self, config: Config) -> (usize, usize, usize) {
        let digest = config.digest.clone();
        let (kept, stopped, started) = self.apply_plan(config);
        tracing::info!(kept, stopped, started, %digest, "plan applied");
        (kept, stopped, started)
    }

    /// `replan` without its log line. A plan whose hello is the one already sent (the same
    /// config and declared set) sends nothing: no hello, no new store generation, no snapshot.
    fn apply_plan(&mut self, config: Config) -> (usize, usize, usize) {
        let assigned = self.assignment.take();
        self.welcomes_applied = self.link_stats.welcomes.load(Ordering::Relaxed);
        let plan = make_plan(&config.resources, &self.host, &assigned);
        let new_hello = hello(&config, &plan, &self.boot_id);
        if **self.hello_tx.borrow() != new_hello {
            self.hello_tx.send_replace(Arc::new(new_hello));
            self.store.declare(declared(&plan));
        }
        let (kept, stopped, started) = self.scheduler.apply(&plan);
        let names: Vec<&str> = plan.tasks.iter().map(|t| t.name.as_str()).collect();
        crate::probe::cgroup::retain(&names);
        self.loaded_tx
            .send_modify(|l| *l = Arc::new(l.next(&config, &plan)));
        self.config = config;
        self.plan = plan;
        (kept, stopped, started)
    }

    /// Move the plan to the controller's latest assignment (after `assignment_changed`),
    /// with one log line that also counts the welcomes coalesced into this change.
    pub fn apply_assignment(&mut self) -> (usize, usize, usize) {
        let welcomes_before = self.welcomes_applied;
        let config = self.config.clone();
        let (kept, stopped, started) = self.apply_plan(config);
        let coalesced = self.welcomes_applied.saturating_sub(welcomes_before);
        tracing::info!(
            shared = self
                .plan
                .tasks
                .iter()
                .filter(|t| !t.instance.is_empty())
                .count(),
            kept,
            stopped,
            started,
            welcomes_since_last_change = coalesced,
            "controller changed this host's shared-instance assignment; plan applied"
        );
        (kept, stopped, started)
    }

    /// SIGHUP: move to a freshly loaded config (already validated) resolved for `host`.
    /// Probe changes are a diff (see `replan`); a change of plugin_dir, run_as or
    /// max_parallel restarts every probe (they are part of how each one runs); a change of
    /// the controller list re-makes the link. A different host is refused.
    pub async fn reload(&mut self, config: Config, host: &str) -> Result<Reloaded, ReloadError> {
        if host != self.host {
            return Err(ReloadError::HostChanged {
                old: self.host.clone(),
                new: host.to_owned(),
            });
        }
        // Planned first, before anything is stopped: a plan that cannot be made leaves the
        // running one untouched (a panic here must not end the daemon).
        let assigned = self.assignment.applied().clone();
        let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            make_plan(&config.resources, host, &assigned)
        }))
        .map_err(|_| ReloadError::Unplannable)?;
        let (problems, _) = crate::checks::plan_checks(&config, &plan);
        if !problems.is_empty() {
            return Err(ReloadError::Checks(problems));
        }
        let old = &self.config.agent;
        let new = &config.agent;
        let probes_restarted = old.plugin_dir != new.plugin_dir
            || old.run_as != new.run_as
            || old.max_parallel != new.max_parallel;
        let tls = match new.tls.as_ref().map(Material::load).transpose() {
            Ok(m) => m,
            Err(e) => return Err(ReloadError::Tls(e.to_string())),
        };
        // New key material is used from the next handshake: reconnect once to get there.
        let tls_rotated = tls != self.tls;
        let link_restarted = old.controllers != new.controllers || tls_rotated;
        if old.status_socket != new.status_socket || old.status_group != new.status_group {
            tracing::warn!("the status socket changes at the next restart");
        }
        if old.metrics != new.metrics {
            tracing::warn!(old = ?old.metrics, new = ?new.metrics, "the metrics address changes at the next restart");
        }
        if probes_restarted {
            tracing::info!("plugin_dir, run_as or max_parallel changed: restarting every probe");
            let mut ctx = self.scheduler.context().clone();
            ctx.plugin_dir = new.plugin_dir.clone();
            ctx.run_as = new.run_as.clone();
            let fresh = Scheduler::new(
                self.store.clone(),
                ctx,
                new.max_parallel,
                self.shutdown.child_token(),
            );
            std::mem::replace(&mut self.scheduler, fresh).stop().await;
            self.stats_tx.send_replace(self.scheduler.stats.clone());
        }
        if link_restarted {
            if tls_rotated {
                tracing::info!("TLS key material changed: reconnecting with it");
            } else {
                tracing::info!(controllers = ?new.controllers, "controller list changed: reconnecting");
            }
            self.stop_link(Duration::from_secs(3)).await;
            self.config.agent.controllers = new.controllers.clone();
            self.config.agent.tls = new.tls.clone();
            self.tls = tls;
            self.start_link();
        }
        let (kept, stopped, started) = self.replan(config);
        Ok(Reloaded {
            kept,
            stopped,
            started,
            probes_restarted,
            link_restarted,
        })
    }

    /// Whether the key material on disk differs from what the link uses (a rotation, or a
    /// file that no longer loads): a reload must happen even if agent.yaml did not change.
    pub fn tls_changed(&self, config: &Config) -> bool {
        let on_disk = config.agent.tls.as_ref().map(Material::load);
        match (on_disk, &self.tls) {
            (None, None) => false,
            (Some(Ok(m)), Some(cur)) => m != *cur,
            _ => true,
        }
    }

    /// Resolves when the controller's assignment differs from the one the plan was made
    /// with, at most once per second (then call `apply_assignment`); see `AssignmentGate`.
    pub async fn assignment_changed(&mut self) {
        self.assignment.changed().await;
    }

    /// For the watchdog: the link task has not died under us (it only ends on shutdown).
    pub fn healthy(&self) -> bool {
        self.link.as_ref().is_none_or(|l| !l.handle.is_finished())
    }

    /// One line for systemd's STATUS=.
    pub fn status_line(&self) -> String {
        let link = match self.link_stats.state() {
            LinkState::Connected { controller } => format!("connected to {controller}"),
            LinkState::Connecting => "connecting".to_owned(),
            LinkState::Backoff if self.link.is_none() => "no controllers".to_owned(),
            LinkState::Backoff => "controller unreachable, retrying".to_owned(),
            LinkState::Stopped => "stopped".to_owned(),
        };
        format!(
            "{} probes, {} skipped; config {}; {link}",
            self.plan.tasks.len(),
            self.plan.skipped.len(),
            self.config.digest
        )
    }

    /// Stop probing (killing running probe groups and waiting for them), then the link
    /// (which flushes a last batch if connected), waiting at most `grace` for it.
    pub async fn stop(mut self, grace: Duration) {
        let link = self.link.take();
        // Bounded: the last values go out even if a probe will not stop.
        if tokio::time::timeout(PROBES_STOP_DEADLINE, self.scheduler.stop())
            .await
            .is_err()
        {
            tracing::warn!("probes did not stop within {PROBES_STOP_DEADLINE:?}; sending the last values anyway");
        }
        if let Some(link) = link {
            link.stop(grace).await;
        }
        self.shutdown.cancel();
        // The process exits right after this, without destructors: let the probe trees
        // just killed finish dying, so none outlives the agent (bounded: a child stuck in
        // the kernel does not hold the exit).
        let deadline = tokio::time::Instant::now() + CHILDREN_EXIT_DEADLINE;
        while live_children() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A stop waits this long for the probes (their kill grace is 2 s) before it sends the last
/// values anyway.
const PROBES_STOP_DEADLINE: Duration = Duration::from_secs(10);
/// How long a stop waits for killed children to be gone.
const CHILDREN_EXIT_DEADLINE: Duration = Duration::from_secs(2);

/// Children of the agent that are still running (zombies count as gone).
fn live_children() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let state = stat
                    .rsplit(')')
                    .next()
                    .and_then(|s| s.split_whitespace().next());
                !matches!(state, Some("Z" | "X"))
            })
        })
        .count()
}
