//! The node daemon: the plan's probes on their timers, the store, and the link to the
//! controller, until SIGTERM. The controller's `welcome` (shared instances assigned to this
//! host) re-plans; values flow store -> link without the probes ever waiting on the network.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProbeKind};
use crate::link::client::{self, Assigned, LinkConfig, LinkStats};
use crate::link::wire;
use crate::plan::{make_plan, Plan};
use crate::probe::{BuiltinSource, ProbeContext};
use crate::schedule::Scheduler;
use crate::store::{Declared, Store};

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
    hello_tx: watch::Sender<Arc<wire::Hello>>,
    assigned_rx: watch::Receiver<Assigned>,
    boot_id: String,
    plan: Plan,
    shutdown: CancellationToken,
    link: Option<tokio::task::JoinHandle<()>>,
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
        let (hello_tx, hello_rx) = watch::channel(Arc::new(hello(&config, &plan, &boot_id)));
        let (assigned_tx, assigned_rx) = watch::channel(Assigned::new());
        store.declare(declared(&plan));
        let ctx = probe_context(&config, &host, builtin);
        let mut scheduler = Scheduler::new(
            store.clone(),
            ctx,
            config.agent.max_parallel,
            shutdown.clone(),
        );
        scheduler.apply(&plan);
        let link_stats = Arc::new(LinkStats::default());
        let link = (!config.agent.controllers.is_empty()).then(|| {
            let cfg = LinkConfig {
                controllers: config.agent.controllers.clone(),
                ..link_cfg
            };
            tokio::spawn(client::run(
                cfg,
                store.clone(),
                hello_rx,
                assigned_tx,
                link_stats.clone(),
                shutdown.child_token(),
            ))
        });
        tracing::info!(host = %host, probes = plan.tasks.len(), skipped = plan.skipped.len(), controllers = ?config.agent.controllers, "started");
        Self {
            config,
            host,
            store,
            scheduler,
            link_stats,
            hello_tx,
            assigned_rx,
            boot_id,
            plan,
            shutdown,
            link,
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Move to a new config and/or assignment: the hello first, then the store's slots (the
    /// link sends hello + full snapshot on the generation change, both of the new set), then
    /// the probes (unchanged ones keep running).
    pub fn replan(&mut self, config: Config) {
        let assigned = self.assigned_rx.borrow().clone();
        let plan = make_plan(&config.resources, &self.host, &assigned);
        self.hello_tx
            .send_replace(Arc::new(hello(&config, &plan, &self.boot_id)));
        self.store.declare(declared(&plan));
        let (kept, stopped, started) = self.scheduler.apply(&plan);
        tracing::info!(kept, stopped, started, digest = %config.digest, "plan applied");
        self.config = config;
        self.plan = plan;
    }

    /// Resolves when the controller changes this host's shared-instance assignment.
    pub async fn assignment_changed(&mut self) {
        if self.assigned_rx.changed().await.is_err() {
            // The link is gone (no controllers): no assignment will ever come.
            std::future::pending::<()>().await;
        }
    }

    /// Stop probing (killing running probe groups), then the link, waiting at most `grace`.
    pub async fn stop(self, grace: Duration) {
        self.scheduler.stop().await;
        self.shutdown.cancel();
        if let Some(link) = self.link {
            let _ = tokio::time::timeout(grace, link).await;
        }
    }
}
