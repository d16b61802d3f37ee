//! `xce-agent status`: what the running daemon holds and sends, read from its unix socket.
//!
//! - this module: the request/response of protocol version [`PROTOCOL_VERSION`] (JSON,
//!   one object each way; written down in docs/status.md) and [`snapshot`], which builds a
//!   response from the daemon's live state;
//! - [`server`]: the socket (permissions, stale files, bounds);
//! - [`client`]: the command's side, with the errors an admin can act on;
//! - [`crate::render::status`]: the lsload-like rendering;
//! - `xce-agent status` itself (`--watch`, the exit code) is [`crate::cmd::status`].

pub mod client;
pub mod server;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::{Config, ProbeKind};
use crate::link::client::{LinkState, LinkStats};
use crate::plan::{Plan, ProbeTask};
use crate::stats::Stats;
use crate::store::Store;
use crate::value::{unix_ms, Status, Value};

/// Bumped on any change a version-1 client could misread; additions of fields are not.
pub const PROTOCOL_VERSION: u32 = 1;

/// What the client asks. Every field is optional: an empty request (or none at all: the
/// client closes its side without writing) is `{"version": 1}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The protocol version the client speaks (default: this one).
    #[serde(default)]
    pub version: Option<u32>,
    /// Only these resources (and their probes); empty = all.
    #[serde(default)]
    pub names: Vec<String>,
}

/// One answer: the state, or an error (never both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Response {
    Status(Box<StatusReport>),
    Error(ErrorReply),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub version: u32,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub version: u32,
    /// The daemon's clock when it answered: ages are relative to it.
    pub now_ms: u64,
    pub agent: AgentInfo,
    pub config: ConfigInfo,
    pub link: LinkInfo,
    pub resources: Vec<ResourceInfo>,
    pub probes: Vec<ProbeInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub version: String,
    pub host: String,
    pub pid: u32,
    pub started_ms: u64,
    pub uptime_s: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigInfo {
    /// 1 for the configuration the daemon started with, +1 for each reload applied.
    pub generation: u64,
    pub loaded_ms: u64,
    pub digest: String,
    pub agent_file: PathBuf,
    pub resources_file: PathBuf,
    pub probes: usize,
    pub skipped: usize,
    /// The last reload (SIGHUP) and how it went; `None` before the first.
    #[serde(default)]
    pub last_reload: Option<ReloadResult>,
}

/// How a reload went: a refused one keeps the running configuration, and says why here as
/// well as in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadResult {
    pub at_ms: u64,
    pub ok: bool,
    /// Why it was refused (every line of it).
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkInfo {
    pub controllers: Vec<String>,
    /// `none` (no controllers configured), `connecting`, `connected`, `backoff`, `stopped`.
    pub state: String,
    /// The controller connected to, when `connected`.
    pub controller: Option<String>,
    /// When the link entered `state` (for `connected`: connected since).
    pub since_ms: u64,
    pub last_ack_ms: Option<u64>,
    pub last_ack_seq: u64,
    /// Resvals changed in the store that the controller has not been sent yet (when not
    /// connected: all of them, as the next connection starts with a full snapshot).
    pub resvals_waiting: usize,
    pub connects: u64,
    pub disconnects: u64,
    pub connect_failures: u64,
    pub batches: u64,
    /// While the link is not up: since when it has been down (kept across retries).
    #[serde(default)]
    pub down_since_ms: Option<u64>,
    /// Connection attempts since the link was last up.
    #[serde(default)]
    pub attempts: u64,
    /// The link's last failure (kept once it is up again, until the next one).
    #[serde(default)]
    pub last_error: Option<LinkErrorInfo>,
}

/// A failure of the link, in the admin's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkErrorInfo {
    /// A class: `unreachable`, `controller_not_tls`, `agent_not_tls`, `unknown_ca`, ...
    /// (docs/status.md).
    pub reason: String,
    pub message: String,
    pub controller: String,
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceInfo {
    pub name: String,
    /// Empty for this host's own instance.
    #[serde(default)]
    pub instance: String,
    pub value: Value,
    pub status: Status,
    pub last_report_ms: Option<u64>,
    pub error: Option<String>,
    /// The probe that feeds it (the resource it is declared on).
    pub probe: String,
    pub kind: String,
    pub interval_ms: u64,
    /// When its probe runs next (`None`: a stream, or not scheduled yet).
    pub next_run_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeInfo {
    pub name: String,
    pub kind: String,
    pub runs_ok: u64,
    pub runs_failed: u64,
    pub runs_timeout: u64,
    /// A stream's updates that did not parse (`xce_probe_runs_total{outcome="rejected"}`).
    #[serde(default)]
    pub runs_rejected: u64,
    pub skipped_overlap: u64,
    pub restarts: u64,
    /// Agent CPU (ms) spent on the probe's output (`xce_probe_agent_cpu_seconds`).
    #[serde(default)]
    pub agent_cpu_ms: f64,
    /// Names its output gave outside `provides:` (`xce_probe_unexpected_names`).
    #[serde(default)]
    pub unexpected_names: u64,
    pub last_duration_ms: Option<f64>,
    pub last_success_ms: Option<u64>,
    pub next_run_ms: Option<u64>,
}

/// The configuration the daemon runs, as published by it at start and on every re-plan.
/// (`Default`: nothing loaded, for readers built without a daemon.)
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub generation: u64,
    pub loaded_ms: u64,
    pub digest: String,
    pub agent_file: PathBuf,
    pub resources_file: PathBuf,
    pub controllers: Vec<String>,
    pub plan: Plan,
    pub last_reload: Option<ReloadResult>,
    /// When the running configuration was last loaded or reloaded successfully (a reload
    /// that found nothing changed counts).
    pub last_success_ms: u64,
}

impl Loaded {
    pub fn new(config: &Config, plan: &Plan, generation: u64) -> Self {
        Self {
            generation,
            loaded_ms: unix_ms(SystemTime::now()),
            digest: config.digest.clone(),
            agent_file: std::path::absolute(&config.agent.path)
                .unwrap_or_else(|_| config.agent.path.clone()),
            resources_file: config.resources.path.clone(),
            controllers: config.agent.controllers.clone(),
            plan: plan.clone(),
            last_reload: None,
            last_success_ms: unix_ms(SystemTime::now()),
        }
    }

    /// The same configuration, with a reload's result recorded.
    pub fn reloaded(&self, ok: bool, error: Option<String>) -> Self {
        let at_ms = unix_ms(SystemTime::now());
        Self {
            last_reload: Some(ReloadResult { at_ms, ok, error }),
            last_success_ms: if ok { at_ms } else { self.last_success_ms },
            ..self.clone()
        }
    }

    /// After a re-plan: a new generation when the configuration changed, the same one
    /// when only the plan did (the controller's assignment).
    pub fn next(&self, config: &Config, plan: &Plan) -> Self {
        if config.digest == self.digest {
            Self {
                plan: plan.clone(),
                ..self.clone()
            }
        } else {
            Self {
                last_reload: self.last_reload.clone(),
                ..Self::new(config, plan, self.generation + 1)
            }
        }
    }
}

/// What a status answer is built from: shared with the daemon, never locked for long.
#[derive(Clone)]
pub struct Sources {
    pub store: Arc<Store>,
    pub link: Arc<LinkStats>,
    /// Follows a scheduler rebuilt by a reload.
    pub probes: watch::Receiver<Arc<Stats>>,
    pub loaded: watch::Receiver<Arc<Loaded>>,
    pub started: SystemTime,
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// The daemon's state now, limited to `names` when not empty.
pub fn snapshot(src: &Sources, names: &[String]) -> StatusReport {
    let now = SystemTime::now();
    let loaded = src.loaded.borrow().clone();
    let stats = src.probes.borrow().clone();
    let wanted = |n: &str| names.is_empty() || names.iter().any(|w| w == n);
    let (_, resvals) = src.store.snapshot();
    // (resource, instance) -> the task feeding it: one pass, not a search per resource
    // (10,000 resources would make that 10^8 comparisons per answer).
    let feeding: BTreeMap<(&str, &str), &ProbeTask> = loaded
        .plan
        .tasks
        .iter()
        .flat_map(|t| {
            t.feeds
                .iter()
                .map(move |f| ((f.name.as_str(), f.instance.as_str()), t))
        })
        .collect();
    let mut resources = Vec::new();
    for rv in resvals.into_iter().filter(|r| wanted(&r.name)) {
        let task = feeding.get(&(rv.name.as_str(), rv.instance.as_str()));
        let (probe, kind, interval_ms, next_run_ms) = match task {
            Some(t) => (
                t.name.clone(),
                t.kind.name().to_owned(),
                t.interval.as_millis() as u64,
                next_run(&stats, &t.name, &t.kind),
            ),
            None => (String::new(), String::new(), 0, None),
        };
        resources.push(ResourceInfo {
            name: rv.name,
            instance: rv.instance,
            value: rv.value,
            status: rv.status,
            last_report_ms: rv.last_report_ms,
            error: rv.error.as_ref().map(ToString::to_string),
            probe,
            kind,
            interval_ms,
            next_run_ms,
        });
    }
    let probes = loaded
        .plan
        .tasks
        .iter()
        .filter(|t| wanted(&t.name) || t.feeds.iter().any(|f| wanted(&f.name)))
        .map(|t| {
            let s = stats.get(&t.name).unwrap_or_default();
            let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            let runs = load(&s.ok) + load(&s.failed) + load(&s.timeout) + load(&s.rejected);
            ProbeInfo {
                name: t.name.clone(),
                kind: t.kind.name().to_owned(),
                runs_ok: load(&s.ok),
                runs_failed: load(&s.failed),
                runs_timeout: load(&s.timeout),
                runs_rejected: load(&s.rejected),
                skipped_overlap: load(&s.skipped_overlap),
                restarts: load(&s.restarts),
                agent_cpu_ms: load(&s.agent_cpu_ns) as f64 / 1e6,
                unexpected_names: load(&s.unexpected_names),
                last_duration_ms: (runs > 0).then(|| load(&s.last_duration_us) as f64 / 1000.0),
                last_success_ms: nonzero(load(&s.last_success_ms)),
                next_run_ms: next_run(&stats, &t.name, &t.kind),
            }
        })
        .collect();
    let started_ms = unix_ms(src.started);
    StatusReport {
        version: PROTOCOL_VERSION,
        now_ms: unix_ms(now),
        agent: AgentInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            host: loaded.plan.host.clone(),
            pid: std::process::id(),
            started_ms,
            uptime_s: now
                .duration_since(src.started)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        },
        config: ConfigInfo {
            generation: loaded.generation,
            loaded_ms: loaded.loaded_ms,
            digest: loaded.digest.clone(),
            agent_file: loaded.agent_file.clone(),
            resources_file: loaded.resources_file.clone(),
            probes: loaded.plan.tasks.len(),
            skipped: loaded.plan.skipped.len(),
            last_reload: loaded.last_reload.clone(),
        },
        link: link_info(src, &loaded.controllers),
        resources,
        probes,
    }
}

fn next_run(stats: &Stats, name: &str, kind: &ProbeKind) -> Option<u64> {
    if matches!(kind, ProbeKind::Stream(_)) {
        return None;
    }
    let due = stats.get(name)?.next_due_ms.load(Ordering::Relaxed);
    nonzero(due)
}

fn link_info(src: &Sources, controllers: &[String]) -> LinkInfo {
    let l = &src.link;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let (state, controller) = match l.state() {
        _ if controllers.is_empty() => ("none", None),
        LinkState::Connecting => ("connecting", None),
        LinkState::Connected { controller } => ("connected", Some(controller)),
        LinkState::Backoff => ("backoff", None),
        LinkState::Stopped => ("stopped", None),
    };
    let resvals_waiting = if controller.is_some() {
        let sent = load(&l.sent_version);
        src.store.changes_since(sent.max(1)).1.len()
    } else {
        src.store.len()
    };
    LinkInfo {
        controllers: controllers.to_vec(),
        state: state.to_owned(),
        controller,
        since_ms: load(&l.state_since_ms),
        last_ack_ms: nonzero(load(&l.last_ack_ms)),
        last_ack_seq: load(&l.last_ack_seq),
        resvals_waiting,
        connects: load(&l.connects),
        disconnects: load(&l.disconnects),
        connect_failures: load(&l.connect_failures),
        batches: load(&l.batches),
        down_since_ms: if controllers.is_empty() {
            None
        } else {
            nonzero(load(&l.down_since_ms))
        },
        attempts: load(&l.attempts),
        last_error: l.last_error().map(|e| LinkErrorInfo {
            reason: e.reason.as_str().to_owned(),
            message: e.message,
            controller: e.controller,
            at_ms: e.at_ms,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_value_and_an_error_answer_survive_the_round_trip() {
        let r = ResourceInfo {
            name: "mem".into(),
            instance: String::new(),
            value: Value::Unknown,
            status: Status::Pending,
            last_report_ms: None,
            error: None,
            probe: "mem".into(),
            kind: "builtin".into(),
            interval_ms: 15_000,
            next_run_ms: None,
        };
        let text = serde_json::to_string(&r).expect("serialize");
        assert!(text.contains("\"value\":null"), "{text}");
        assert_eq!(
            serde_json::from_str::<ResourceInfo>(&text).expect("parse"),
            r
        );
        let e: Response = serde_json::from_str(r#"{"version":1,"error":"permission denied"}"#)
            .expect("parse error answer");
        assert!(
            matches!(e, Response::Error(ErrorReply { error, .. }) if error == "permission denied")
        );
    }

    #[test]
    fn a_request_may_be_empty_and_refuses_unknown_fields() {
        assert_eq!(
            serde_json::from_str::<Request>("{}").expect("empty"),
            Request::default()
        );
        assert!(serde_json::from_str::<Request>(r#"{"nmes": ["x"]}"#).is_err());
    }
}
