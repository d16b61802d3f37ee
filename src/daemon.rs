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
use crate::link::assignment::{Assigned, AssignmentGate};
use crate::link::client::{self, LinkConfig, LinkState, LinkStats};
use crate::link::tls::Material;
use crate::link::wire;
use crate::plan::{plan_for, Plan};
use crate::probe::supervisor::Supervisor;
use crate::probe::{BuiltinSource, ProbeContext};
use crate::reload::{self, Changes, Effect, State};
use crate::schedule::Scheduler;
use crate::stats::Stats;
use crate::status::Loaded;
use crate::store::{Declared, Store};

/// Load both files and check what only the layers above config know (the builtin catalogue).
pub fn load_config(
    agent_path: &std::path::Path,
    resources_override: Option<&std::path::Path>,
) -> Result<Config, crate::config::ConfigErrors> {
    // agent.yaml is believed (its opt-out included) only once it passes.
    crate::trust::check_agent_file(agent_path)?;
    let config = crate::config::load(agent_path, resources_override)?;
    crate::trust::check_named_files(&config.agent)?;
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
                instance: f.instance.clone(),
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
                instance: f.instance.clone(),
                valtype: f.valtype,
                interval_ms: t.interval.as_millis() as u64,
                shared: f.is_shared(),
            })
        })
        .collect();
    wire::Hello::new(plan.host.clone(), boot_id, config.digest.clone(), resources)
}

pub fn probe_context(
    config: &Config,
    host: &str,
    builtin: Arc<dyn BuiltinSource>,
    supervisor: Arc<Supervisor>,
) -> ProbeContext {
    ProbeContext {
        host: host.to_owned(),
        plugin_dir: config.agent.plugin_dir.clone(),
        run_as: config.agent.run_as.clone(),
        builtin,
        files: crate::probe::file_reader::FileReads::new(config.agent.max_stuck_reads),
        supervisor,
    }
}

pub fn uses_builtins(plan: &Plan) -> bool {
    plan.tasks
        .iter()
        .any(|t| matches!(t.kind, ProbeKind::Builtin { .. }))
}

/// Probes that run in a cgroup of their own, holding its descriptors while configured.
fn contained_probes(plan: &Plan, supervisor: &Supervisor) -> usize {
    if supervisor.containment.tree().is_none() {
        return 0;
    }
    plan.tasks
        .iter()
        .filter(|t| matches!(t.kind, ProbeKind::Exec(_) | ProbeKind::Stream(_)))
        .count()
}

/// Warn where the plan's contained probes will not fit the open-file limit (at start, and at
/// a replan that outgrows it: once, not at every replan while it stays short).
fn warn_if_short_of_descriptors(was: Option<usize>, now: usize, max_parallel: usize) {
    use crate::probe::open_files::{current, shortfall};
    let limit = current();
    let was_short = was.is_some_and(|n| shortfall(limit, n, max_parallel).is_some());
    if let Some(words) = shortfall(limit, now, max_parallel).filter(|_| !was_short) {
        tracing::warn!("{words}");
    }
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

/// What a reload changed, counted (the whole of it is logged by the reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reloaded {
    pub kept: usize,
    /// Removed from the plan.
    pub stopped: usize,
    /// New in the plan.
    pub started: usize,
    /// In both plans, stopped and started again.
    pub restarted: usize,
    /// plugin_dir, run_as or max_parallel changed: every probe was restarted.
    pub all_probes_restarted: bool,
    /// The controller list or the key material changed: the link was re-made.
    pub link_restarted: bool,
}

impl Reloaded {
    fn of(changes: &Changes) -> Self {
        Self {
            kept: changes.keep.len(),
            stopped: changes.stop.len(),
            started: changes.start.len(),
            restarted: changes.restart.len(),
            all_probes_restarted: changes.restarts_every_probe(),
            link_restarted: changes.reconnects(),
        }
    }
}

/// The agent settings and key material a plan change moves from.
struct Was {
    agent: crate::config::AgentConfig,
    keys: Option<Material>,
}

/// Per-probe lines a change logs at info; the rest go to the debug log.
const PROBE_LINES: usize = 10;

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
        supervisor: Arc<Supervisor>,
        link_cfg: LinkConfig,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let store = Arc::new(Store::new());
        let boot_id = wire::boot_id();
        let plan = plan_for(&config, &host, &BTreeSet::new());
        let (hello_tx, _) = watch::channel(Arc::new(hello(&config, &plan, &boot_id)));
        store.declare(declared(&plan));
        warn_if_short_of_descriptors(
            None,
            contained_probes(&plan, &supervisor),
            config.agent.max_parallel,
        );
        let ctx = probe_context(&config, &host, builtin, supervisor);
        // A child token: stopping the scheduler must not stop the link before its last flush.
        let mut scheduler = Scheduler::new(
            store.clone(),
            ctx,
            config.agent.max_parallel,
            shutdown.child_token(),
        );
        scheduler.start(&plan);
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
            tls_ca: self.config.agent.tls.as_ref().map(|p| p.ca.clone()),
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

    /// Record how a reload went (after its plan, if any, was applied), for `status` and
    /// `/metrics`.
    pub fn note_reload(&self, ok: bool, error: Option<String>) {
        self.loaded_tx
            .send_modify(|l| *l = Arc::new(l.reloaded(ok, error)));
    }

    fn was(&self) -> Was {
        Was {
            agent: self.config.agent.clone(),
            keys: self.tls.clone(),
        }
    }

    /// Move to a new config (the agent settings unchanged, or already acted on): the diff's
    /// probe changes, one line per probe change and a summary.
    pub fn replan(&mut self, config: Config) -> Changes {
        let was = self.was();
        self.replan_from(config, &was)
    }

    fn replan_from(&mut self, config: Config, was: &Was) -> Changes {
        let digest = config.digest.clone();
        let changes = self.apply_plan(config, was);
        log_probe_changes(&changes, true);
        tracing::info!(
            kept = changes.keep.len(),
            stopped = changes.stop.len(),
            started = changes.start.len(),
            restarted = changes.restart.len(),
            %digest,
            "plan applied"
        );
        changes
    }

    /// Plan `config` with the controller's latest assignment and move to it from `was` and
    /// the current plan: the hello first, then the store's slots (the link sends hello + full
    /// snapshot on the generation change, both of the new set), then the probes (unchanged
    /// ones keep running). A plan whose hello is the one already sent (the same config and
    /// declared set) sends nothing: no hello, no new store generation, no snapshot.
    fn apply_plan(&mut self, config: Config, was: &Was) -> Changes {
        let assigned = self.assignment.take();
        self.welcomes_applied = self.link_stats.welcomes.load(Ordering::Relaxed);
        let plan = plan_for(&config, &self.host, &assigned);
        let changes = reload::diff(
            &State {
                agent: &was.agent,
                plan: &self.plan,
                keys: was.keys.as_ref(),
            },
            &State {
                agent: &config.agent,
                plan: &plan,
                keys: self.tls.as_ref(),
            },
        );
        let new_hello = hello(&config, &plan, &self.boot_id);
        if **self.hello_tx.borrow() != new_hello {
            self.hello_tx.send_replace(Arc::new(new_hello));
            self.store.declare(declared(&plan));
        }
        self.scheduler.apply(&changes, &plan);
        let supervisor = &self.scheduler.context().supervisor;
        warn_if_short_of_descriptors(
            Some(contained_probes(&self.plan, supervisor)),
            contained_probes(&plan, supervisor),
            config.agent.max_parallel,
        );
        let names: Vec<&str> = plan.tasks.iter().map(|t| t.name.as_str()).collect();
        self.scheduler
            .context()
            .supervisor
            .containment
            .retain(&names);
        self.loaded_tx
            .send_modify(|l| *l = Arc::new(l.next(&config, &plan)));
        self.config = config;
        self.plan = plan;
        changes
    }

    /// Move the plan to the controller's latest assignment (after `assignment_changed`),
    /// with one log line that also counts the welcomes coalesced into this change (the
    /// probes it started and stopped go to the debug log: a flapping controller must not
    /// fill the journal).
    pub fn apply_assignment(&mut self) -> Changes {
        let welcomes_before = self.welcomes_applied;
        let config = self.config.clone();
        let was = self.was();
        let changes = self.apply_plan(config, &was);
        log_probe_changes(&changes, false);
        let coalesced = self.welcomes_applied.saturating_sub(welcomes_before);
        tracing::info!(
            shared = self
                .plan
                .tasks
                .iter()
                .flat_map(|t| &t.feeds)
                .filter(|f| f.is_shared())
                .count(),
            kept = changes.keep.len(),
            stopped = changes.stop.len(),
            started = changes.start.len(),
            welcomes_since_last_change = coalesced,
            "controller changed this host's shared-instance assignment; plan applied"
        );
        changes
    }

    /// SIGHUP: move to a freshly loaded config (already validated) resolved for `host`, as
    /// `reload::diff` says: probes start, stop, restart or keep running by what changed in
    /// their task; a change of plugin_dir, run_as or max_parallel restarts every probe (they
    /// are part of how each one runs); a change of the controllers or the key material
    /// re-makes the link; the listeners change only at the next restart, and the log says
    /// so. A different host is refused.
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
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            plan_for(&config, host, &assigned)
        }))
        .map_err(|_| ReloadError::Unplannable)?;
        let (problems, _) = crate::checks::plan_checks(&config, &checked);
        if !problems.is_empty() {
            return Err(ReloadError::Checks(problems));
        }
        // New material the controller would refuse is refused here: the working link stays.
        let tls = match config.agent.tls.as_ref().map(Material::load).transpose() {
            Ok(Some(m)) => {
                match m.usable_for(
                    host,
                    std::time::SystemTime::now(),
                    config.agent.tls_expiry_warning,
                ) {
                    Ok(warning) => {
                        if let Some(w) = warning {
                            tracing::warn!("{w}");
                        }
                    }
                    Err(e) => return Err(ReloadError::Tls(e.to_string())),
                }
                Some(m)
            }
            Ok(None) => None,
            Err(e) => return Err(ReloadError::Tls(e.to_string())),
        };
        // The settings are acted on first: the link's restart forgets the controller's
        // assignment, and the plan (so the probes' part of the diff) is made after it.
        let settings = Changes {
            settings: reload::changed_settings(
                &State {
                    agent: &self.config.agent,
                    plan: &self.plan,
                    keys: self.tls.as_ref(),
                },
                &State {
                    agent: &config.agent,
                    plan: &checked,
                    keys: tls.as_ref(),
                },
            ),
            ..Changes::default()
        };
        log_settings(&settings, &self.config.agent, &config.agent);
        let was = self.was();
        if settings.restarts_every_probe() {
            let mut ctx = self.scheduler.context().clone();
            ctx.plugin_dir = config.agent.plugin_dir.clone();
            ctx.run_as = config.agent.run_as.clone();
            let fresh = Scheduler::new(
                self.store.clone(),
                ctx,
                config.agent.max_parallel,
                self.shutdown.child_token(),
            );
            std::mem::replace(&mut self.scheduler, fresh).stop().await;
            self.stats_tx.send_replace(self.scheduler.stats.clone());
        }
        if settings.reconnects() {
            self.stop_link(Duration::from_secs(3)).await;
            self.config.agent.controllers = config.agent.controllers.clone();
            self.config.agent.tls = config.agent.tls.clone();
            if self.config.agent.coalesce != config.agent.coalesce {
                self.link_cfg.coalesce = config.agent.coalesce;
            }
            self.tls = tls;
            self.start_link();
        }
        let changes = self.replan_from(config, &was);
        Ok(Reloaded::of(&changes))
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

/// What a reload does about each changed setting, one line each: a setting that changes
/// only at the next restart is a warning, since the admin expects it to apply now.
fn log_settings(
    changes: &Changes,
    old: &crate::config::AgentConfig,
    new: &crate::config::AgentConfig,
) {
    let names = |effect| {
        changes
            .with_effect(effect)
            .map(reload::Setting::name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if changes.restarts_every_probe() {
        tracing::info!(
            "{} changed: restarting every probe",
            names(Effect::RestartProbes)
        );
    }
    if changes.settings.contains(&reload::Setting::Tls) {
        tracing::info!("TLS key material changed: reconnecting with it");
    } else if changes.reconnects() {
        tracing::info!(controllers = ?new.controllers, "{} changed: reconnecting to the controller", names(Effect::Reconnect));
    }
    for setting in changes.with_effect(Effect::AgentRestart) {
        let name = setting.name();
        match setting {
            reload::Setting::Metrics => {
                tracing::warn!(old = ?old.metrics, new = ?new.metrics, "{name} changed: it takes effect at the next restart of the agent")
            }
            _ => tracing::warn!("{name} changed: it takes effect at the next restart of the agent"),
        }
    }
    let loaded = names(Effect::Loaded);
    if !loaded.is_empty() {
        tracing::debug!("{loaded} changed: in effect since the files were loaded");
    }
}

/// One line per probe started, stopped or restarted (with what changed in it); the first
/// [`PROBE_LINES`] at info when `at_info`, the rest at debug.
fn log_probe_changes(changes: &Changes, at_info: bool) {
    let every = changes.restarts_every_probe();
    let lines = changes
        .start
        .iter()
        .map(|p| format!("probe {p} started (new in the plan)"))
        .chain(
            changes
                .stop
                .iter()
                .map(|p| format!("probe {p} stopped (gone from the plan)")),
        )
        .chain(
            changes
                .restart
                .iter()
                .filter(|r| !(every && r.fields.is_empty()))
                .map(|r| {
                    let fields: Vec<&str> = r.fields.iter().map(|f| f.as_str()).collect();
                    format!("probe {} restarted: {} changed", r.probe, fields.join(", "))
                }),
        );
    let mut hidden = 0usize;
    for (n, line) in lines.enumerate() {
        if at_info && n < PROBE_LINES {
            tracing::info!("{line}");
        } else {
            hidden += usize::from(at_info);
            tracing::debug!("{line}");
        }
    }
    if hidden > 0 {
        tracing::info!("{hidden} more probe change(s) in the debug log");
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
