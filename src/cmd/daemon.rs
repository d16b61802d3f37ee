//! The node daemon (`xce-agent` without a command): start the agent, serve `/metrics` and
//! the status socket, tell systemd, and run until SIGTERM; SIGHUP reloads both files.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::{exit, host_name, load, CmdError};
use crate::cli::Common;
use crate::daemon::Agent;
use crate::link::client::LinkConfig;
use crate::metrics;
use crate::probe::builtin;
use crate::probe::supervisor::Supervisor;
use systemd::NotifyState;

pub async fn run(common: &Common) -> Result<u8, CmdError> {
    let Some(config) = load(common) else {
        return Ok(exit::CONFIG);
    };
    let host = host_name(common, &config)?;
    if let Some(paths) = &config.agent.tls {
        // A certificate no controller accepts (expired, not yet valid, naming another host,
        // from another CA) stops the start here, said plainly with the fix, instead of a TLS
        // error in a reconnect loop. A name only a controller with the certificate's domain
        // accepts is a warning (`usable_for`).
        let usable = crate::link::tls::Material::load(paths).and_then(|m| {
            m.usable_for(
                &host,
                std::time::SystemTime::now(),
                config.agent.tls_expiry_warning,
            )
        });
        match usable {
            Ok(warning) => {
                if let Some(w) = warning {
                    tracing::warn!("{w}");
                }
            }
            Err(e) => {
                eprintln!("xce-agent: {e}");
                return Ok(exit::CONFIG);
            }
        }
    } else if config.agent.insecure_plaintext && !config.agent.controllers.is_empty() {
        tracing::warn!("insecure_plaintext: values go to the controllers unauthenticated and readable by anyone on the network");
    }
    // One kernel timer for the probes' long waits: fewer wake-ups than tokio's wheel.
    if let Err(e) = crate::timer::use_kernel_timer() {
        tracing::warn!("no timerfd ({e}): waits use tokio's timer, which wakes more often");
    }
    let supervisor = Supervisor::start();
    // Handlers first: a SIGHUP/SIGTERM that arrives while starting is not lost (and does
    // not kill the process with the default action).
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        return Err(CmdError::Signals);
    };
    let metrics_listener = match &config.agent.metrics {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| CmdError::MetricsBind {
                    addr: addr.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let status_listener =
        crate::status::server::open(&config.agent).map_err(CmdError::StatusSocket)?;
    let started = std::time::SystemTime::now();
    let sampler_stop = CancellationToken::new();
    let sampler = builtin::spawn(builtin::Roots::host(), sampler_stop.clone());
    let link = LinkConfig {
        coalesce: config.agent.coalesce,
        ..LinkConfig::default()
    };
    let mut agent = Agent::start(
        config,
        host,
        Arc::new(builtin::Live(sampler)),
        supervisor.clone(),
        link,
    );
    if let Some(text) = crate::checks::root_probes_text(&agent.config, agent.plan()) {
        tracing::warn!("{text}");
    }
    let metrics_stop = CancellationToken::new();
    if let Some(listener) = metrics_listener {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "metrics endpoint listening");
        }
        let sources = metrics::Sources {
            store: agent.store.clone(),
            link: agent.link_stats.clone(),
            probes: agent.stats(),
            files: agent.scheduler.context().files.clone(),
            loaded: agent.loaded(),
            supervisor: supervisor.clone(),
        };
        tokio::spawn(metrics::serve(listener, sources, metrics_stop.clone()));
    }
    let status_server = status_listener.map(|listener| {
        let sources = crate::status::Sources {
            store: agent.store.clone(),
            link: agent.link_stats.clone(),
            probes: agent.stats(),
            loaded: agent.loaded(),
            started,
        };
        // Stops with the metrics endpoint, before the agent.
        let stop = metrics_stop.clone();
        tokio::spawn(crate::status::server::serve(listener, sources, stop))
    });
    systemd::notify(&[
        NotifyState::Ready,
        NotifyState::Status(&agent.status_line()),
    ]);
    // systemd wants a ping at least every WATCHDOG_USEC; half of it leaves room for a slow
    // tick. The ping comes from this loop, so a wedged loop stops the pings.
    let mut watchdog = sd_notify::watchdog_enabled().map(|period| {
        let mut t = tokio::time::interval((period / 2).max(Duration::from_millis(10)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut link_state = agent.link_stats.subscribe();
    let mut release_code = release_deadline(&agent.config);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                systemd::reloading();
                reload(common, &mut agent).await;
                systemd::notify(&[NotifyState::Ready, NotifyState::Status(&agent.status_line())]);
                // The reload ran the YAML parser and the checks again.
                release_code = release_deadline(&agent.config);
            }
            _ = agent.assignment_changed() => {
                agent.apply_assignment();
                systemd::notify(&[NotifyState::Status(&agent.status_line())]);
            }
            Ok(()) = link_state.changed() => {
                systemd::notify(&[NotifyState::Status(&agent.status_line())]);
            }
            _ = async {
                match watchdog.as_mut() {
                    Some(t) => { t.tick().await; }
                    None => std::future::pending().await,
                }
            } => {
                if agent.healthy() {
                    systemd::notify(&[NotifyState::Watchdog]);
                } else {
                    tracing::error!("the controller link task died; withholding the watchdog ping");
                }
            }
            _ = async {
                match release_code {
                    Some(at) => crate::timer::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                release_code = None;
                release_own_code();
            }
        }
    }
    tracing::info!("stopping");
    systemd::notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    metrics_stop.cancel();
    if let Some(server) = status_server {
        // It removes its socket file: a stopped agent leaves none behind.
        let _ = server.await;
    }
    agent.stop(Duration::from_secs(3)).await;
    supervisor.containment.shut_down();
    sampler_stop.cancel();
    tracing::info!("stopped");
    Ok(exit::OK)
}

/// When the start-up's code is paged out (`release_code_after`; none when 0).
fn release_deadline(config: &crate::config::Config) -> Option<tokio::time::Instant> {
    let after = config.agent.release_code_after;
    (!after.is_zero()).then(|| tokio::time::Instant::now() + after)
}

/// Hand back the start-up's pages (`own_pages::release`: the binary paged out, every clean
/// file mapping dropped, the libraries' included), saying what it gave back: an idle agent's
/// RSS is mostly code, and most of that ran once, at the start (BENCHMARKS.md 23c).
fn release_own_code() {
    let before = crate::own_pages::rss_file_kib();
    match crate::own_pages::release() {
        Ok(released) => tracing::info!(
            rss_file_kib_before = before,
            rss_file_kib_after = crate::own_pages::rss_file_kib(),
            mappings_paged_out = released.paged_out,
            mappings_dropped = released.dropped,
            "released the start-up code"
        ),
        Err(e) => tracing::warn!("cannot release the start-up code: {e}"),
    }
}

/// SIGHUP: load both files again and move the agent to them. Any error keeps the running
/// config; every error is logged on its own line with its file:line:column, and the result
/// is kept for `status` and `/metrics` (`xce_config_last_reload_successful`).
async fn reload(common: &Common, agent: &mut Agent) {
    tracing::info!("SIGHUP: reloading the configuration");
    match try_reload(common, agent).await {
        Ok(()) => agent.note_reload(true, None),
        Err((verdict, lines)) => {
            let (summary, details) = lines.split_last().expect("a reason");
            for line in details {
                tracing::error!("{line}");
            }
            tracing::error!(
                "reload {verdict}: {summary}; still running the previous configuration"
            );
            agent.note_reload(false, Some(lines.join("\n")));
        }
    }
}

/// A reload, or why not: "failed" (the files could not be loaded) or "refused" (they
/// loaded, but this host cannot run them), with every line of the reason, its summary last.
async fn try_reload(common: &Common, agent: &mut Agent) -> Result<(), (&'static str, Vec<String>)> {
    let config = crate::daemon::load_config(&common.config, common.resources.as_deref()).map_err(
        |errors| {
            let mut lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
            lines.push(format!("{} error(s) in the configuration", errors.0.len()));
            ("failed", lines)
        },
    )?;
    let host = host_name(common, &config).map_err(|e| ("failed", vec![e.to_string()]))?;
    for w in crate::trust::waived(&config.agent) {
        tracing::warn!("{w}");
    }
    if config.digest == agent.config.digest && !agent.tls_changed(&config) {
        tracing::info!("configuration unchanged");
        return Ok(());
    }
    match agent.reload(config, &host).await {
        Ok(r) => {
            tracing::info!(
                kept = r.kept,
                stopped = r.stopped,
                started = r.started,
                restarted = r.restarted,
                all_probes_restarted = r.all_probes_restarted,
                link_restarted = r.link_restarted,
                "reloaded"
            );
            if let Some(text) = crate::checks::root_probes_text(&agent.config, agent.plan()) {
                tracing::warn!("{text}");
            }
            Ok(())
        }
        Err(e) => {
            let mut lines = Vec::new();
            if let crate::daemon::ReloadError::Checks(problems) = &e {
                lines.extend(
                    problems
                        .iter()
                        .map(|(name, text)| format!("{name}: {text}")),
                );
            }
            lines.push(e.to_string());
            Err(("refused", lines))
        }
    }
}

/// systemd notifications. Without NOTIFY_SOCKET (not under systemd) they are no-ops; a
/// failed send is logged, never fatal.
mod systemd {
    pub use sd_notify::NotifyState;

    pub fn notify(states: &[NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!(error = %e, "cannot notify systemd");
        }
    }

    /// RELOADING=1 with the MONOTONIC_USEC that systemd >= 253 requires next to it.
    pub fn reloading() {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => notify(&[NotifyState::Reloading, now]),
            Err(_) => notify(&[NotifyState::Reloading]),
        }
    }
}
