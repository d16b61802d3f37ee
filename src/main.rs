//! The xce-agent binary: argument parsing, logging, and the commands.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use xce_agent::checks::plan_checks;
use xce_agent::cli::{Cli, Command, Common, Format, ListenFormat, ListenTls, TlsCommand};
use xce_agent::config::{Config, ProbeKind};
use xce_agent::daemon::{declared, probe_context, uses_builtins, Agent};
use xce_agent::link::client::LinkConfig;
use xce_agent::link::receiver;
use xce_agent::metrics;
use xce_agent::plan::{is_probed, make_plan, why_not_probed};
use xce_agent::probe::builtin;
use xce_agent::probe::BuiltinSource;
use xce_agent::report::{plan_text, OnceReport};
use xce_agent::schedule::run_all_once;
use xce_agent::store::Store;
use xce_agent::value::Reading;

/// Exit codes shared by the commands.
const EXIT_OK: u8 = 0;
const EXIT_PROBE_FAILED: u8 = 1;
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(
        cli.common.log_level.as_deref(),
        cli.once || cli.command.is_some(),
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xce-agent: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Some(Command::Check) => cmd_check(&cli.common).await,
            Some(Command::Probe { name }) => cmd_probe(&cli.common, name).await,
            Some(Command::Listen {
                addr,
                format,
                ack,
                only,
                refresh,
                tls,
            }) => cmd_listen(addr, *format, *ack, only, *refresh, tls).await,
            Some(Command::Status {
                format,
                watch,
                names,
            }) => cmd_status(&cli.common, *format, *watch, names).await,
            Some(Command::Tls { command }) => cmd_tls(command),
            Some(Command::GenerateAssets { dir }) => cmd_generate_assets(dir),
            None if cli.once => cmd_once(&cli.common, cli.format, &cli.only).await,
            None => cmd_daemon(&cli.common).await,
        }
    });
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xce-agent: {e:#}");
            EXIT_CONFIG
        }
    };
    exit_now(code)
}

/// End the process now. Returning from `main` would drop the runtime, and that waits for
/// every blocking task still in flight — a read stuck in a hung mount forever, a builtin
/// sampler tick (GPU queries can take a second) for as long as it runs. Everything the
/// command owes (output, the last batch to the controller) is done by the time it returns.
fn exit_now(code: u8) -> ExitCode {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(i32::from(code))
}

fn init_logging(level: Option<&str>, interactive: bool) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::EnvFilter;
    // Interactive commands print their results on stdout; only warnings belong on stderr.
    let default = if interactive { "warn" } else { "info" };
    let filter = level
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    // Under systemd with stderr going to the journal, log to the journal directly: it keeps
    // the level as the entry's priority and the fields as fields. Anything else (a terminal,
    // a file, the journal socket unavailable) gets plain lines on stderr.
    let journald = (!interactive && stderr_is_journal())
        .then(|| tracing_journald::layer().ok())
        .flatten();
    let fmt = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journald)
        .with(fmt)
        .try_init();
}

/// systemd sets JOURNAL_STREAM=DEV:INODE for the stream it connects to stderr; the variable
/// is inherited, so it only counts when it names our stderr (sd_journal_stream_fd(3)).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd as _;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

use systemd::NotifyState;

fn host_name(common: &Common, config: &Config) -> anyhow::Result<String> {
    if let Some(h) = common.host.clone().or_else(|| config.agent.host.clone()) {
        return Ok(h);
    }
    let h = nix::unistd::gethostname().context("cannot read this machine's host name")?;
    let h = h.to_string_lossy().into_owned();
    // The hello carries it: a name a receiver would refuse is better refused here, with the fix.
    xce_agent::config::hostlist::validate_host_name(&h)
        .map_err(|e| anyhow::anyhow!("this machine's host name: {e}; set `host:` in agent.yaml"))?;
    Ok(h)
}

/// Load both files; on error print every problem with its position and return None.
fn load(common: &Common) -> Option<Config> {
    match xce_agent::daemon::load_config(&common.config, common.resources.as_deref()) {
        Ok(c) => {
            for (res, field, pos) in &c.resources.ignored_fields {
                tracing::debug!(
                    "{}:{}:{}: field `{field}` of {res:?} is not used by the agent",
                    c.resources.path.display(),
                    pos.line,
                    pos.column
                );
            }
            Some(c)
        }
        Err(errors) => {
            eprintln!("{errors}");
            let n = errors.0.len();
            eprintln!(
                "xce-agent: configuration invalid ({n} error{})",
                if n == 1 { "" } else { "s" }
            );
            None
        }
    }
}

/// Orphaned grandchildren of probes are reparented to the agent and reaped by it, instead of
/// piling up under init unseen. Must run inside the runtime (it starts the reaper task).
/// Containment starts here too: each probe's runs go into its own cgroup where one is
/// writable (undone by `xce_agent::probe::cgroup::shut_down`).
fn become_subreaper() {
    if let Err(e) = xce_agent::probe::process::become_subreaper() {
        tracing::debug!("cannot become a child subreaper: {e}");
    }
    xce_agent::probe::cgroup::init();
}

/// For runs without builtin probes: no sampler is started.
struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}

/// `probe NAME`: run the probe of resource NAME (or the probe that provides it) now, verbosely.
async fn cmd_probe(common: &Common, name: &str) -> anyhow::Result<u8> {
    let Some(config) = load(common) else {
        return Ok(EXIT_CONFIG);
    };
    let host = host_name(common, &config)?;
    let plan = make_plan(&config.resources, &host, &BTreeSet::new());
    let task = plan
        .tasks
        .iter()
        .find(|t| t.name == name)
        .or_else(|| plan.tasks.iter().find(|t| t.feed(name).is_some()));
    let Some(task) = task else {
        let why = why_not_probed(&config.resources, &plan, name);
        eprintln!("xce-agent: {name} is not probed on {host}: {why}");
        return Ok(EXIT_CONFIG);
    };
    become_subreaper();
    let builtin: Arc<dyn BuiltinSource> = if matches!(task.kind, ProbeKind::Builtin { .. }) {
        Arc::new(builtin::sample_once(builtin::Roots::host(), Duration::from_secs(1)).await)
    } else {
        Arc::new(NoBuiltins)
    };
    let ctx = probe_context(&config, &host, builtin);
    let report = xce_agent::probe::debug::run(task, &ctx).await;
    xce_agent::probe::cgroup::shut_down();
    print!("{}", report.text);
    Ok(if report.ok {
        EXIT_OK
    } else {
        EXIT_PROBE_FAILED
    })
}

async fn cmd_check(common: &Common) -> anyhow::Result<u8> {
    let Some(config) = load(common) else {
        return Ok(EXIT_CONFIG);
    };
    let host = host_name(common, &config)?;
    let plan = make_plan(&config.resources, &host, &BTreeSet::new());
    let (mut problems, mut notes) = plan_checks(&config, &plan);
    let (file_problems, file_notes) = xce_agent::probe::file::check_notes(
        &plan,
        &config.agent.run_as,
        config.agent.max_stuck_reads,
    );
    problems.extend(file_problems);
    notes.extend(file_notes);
    if uses_builtins(&plan) {
        let snapshot = builtin::sample_once(builtin::Roots::host(), Duration::ZERO).await;
        for t in &plan.tasks {
            if let ProbeKind::Builtin { index } = &t.kind {
                if let Some(why) = snapshot.absent_reason(index) {
                    notes.push((
                        t.name.clone(),
                        format!("builtin index {index} is not available on this host: {why}"),
                    ));
                }
            }
        }
    }
    print!("{}", plan_text(&config, &plan, &problems, &notes));
    let tls_problems = print_tls_check(&config);
    if problems.is_empty() && tls_problems == 0 {
        println!("\nconfiguration OK");
        Ok(EXIT_OK)
    } else {
        println!(
            "\nconfiguration has {} problem(s) on this host",
            problems.len() + tls_problems
        );
        Ok(EXIT_CONFIG)
    }
}

/// `check`'s part about the link: each certificate, what is wrong or close to it, and a
/// warning every time the link is plaintext. Returns the number of problems.
fn print_tls_check(config: &Config) -> usize {
    let agent = &config.agent;
    let Some(paths) = &agent.tls else {
        if agent.insecure_plaintext && !agent.controllers.is_empty() {
            println!("\nWARNING: insecure_plaintext: true: values go to the controllers unauthenticated and readable by anyone on the network; add a tls: section");
        }
        return 0;
    };
    let report = xce_agent::link::tls::check(paths, std::time::SystemTime::now());
    println!("\ntls:");
    for line in &report.lines {
        println!("  {line}");
    }
    for w in &report.warnings {
        println!("  WARNING: {w}");
    }
    for p in &report.problems {
        println!("  PROBLEM: {p}");
    }
    report.problems.len()
}

async fn cmd_once(common: &Common, format: Format, only: &[String]) -> anyhow::Result<u8> {
    let Some(config) = load(common) else {
        return Ok(EXIT_CONFIG);
    };
    become_subreaper();
    let host = host_name(common, &config)?;
    let mut plan = make_plan(&config.resources, &host, &BTreeSet::new());
    if !only.is_empty() {
        for name in only {
            if !is_probed(&plan, name) {
                let why = why_not_probed(&config.resources, &plan, name);
                eprintln!("xce-agent: {name} is not probed on {host}: {why}");
                return Ok(EXIT_CONFIG);
            }
        }
        plan.tasks
            .retain(|t| only.iter().any(|n| n == &t.name || t.feed(n).is_some()));
    }
    let store = Store::new();
    store.declare(declared(&plan));
    let builtin: Arc<dyn BuiltinSource> = if uses_builtins(&plan) {
        // Two samples a second apart, so rates and averages have a first value.
        Arc::new(builtin::sample_once(builtin::Roots::host(), Duration::from_secs(1)).await)
    } else {
        Arc::new(NoBuiltins)
    };
    let ctx = probe_context(&config, &host, builtin);
    let runs = run_all_once(&plan, &ctx, &store, config.agent.max_parallel).await;
    xce_agent::probe::cgroup::shut_down();
    let report = OnceReport::new(&host, &runs, &store);
    match format {
        Format::Table => print!("{}", report.table()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(if report.all_ok() {
        EXIT_OK
    } else {
        EXIT_PROBE_FAILED
    })
}

async fn cmd_daemon(common: &Common) -> anyhow::Result<u8> {
    let Some(config) = load(common) else {
        return Ok(EXIT_CONFIG);
    };
    if let Some(paths) = &config.agent.tls {
        if let Err(e) = xce_agent::link::tls::Material::load(paths) {
            eprintln!("xce-agent: {e}");
            return Ok(EXIT_CONFIG);
        }
    } else if config.agent.insecure_plaintext && !config.agent.controllers.is_empty() {
        tracing::warn!("insecure_plaintext: values go to the controllers unauthenticated and readable by anyone on the network");
    }
    become_subreaper();
    let host = host_name(common, &config)?;
    // Handlers first: a SIGHUP/SIGTERM that arrives while starting is not lost (and does
    // not kill the process with the default action).
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        anyhow::bail!("cannot install signal handlers");
    };
    let metrics_listener = match &config.agent.metrics {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("metrics: cannot listen on {addr}"))?,
        ),
        None => None,
    };
    let status_listener = xce_agent::status::server::open(&config.agent)
        .context("status socket (status_socket: in agent.yaml)")?;
    let started = std::time::SystemTime::now();
    let sampler_stop = CancellationToken::new();
    let sampler = builtin::spawn(builtin::Roots::host(), sampler_stop.clone());
    let mut agent = Agent::start(
        config,
        host,
        Arc::new(builtin::Live(sampler)),
        LinkConfig::default(),
    );
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
        };
        tokio::spawn(metrics::serve(listener, sources, metrics_stop.clone()));
    }
    let status_server = status_listener.map(|listener| {
        let sources = xce_agent::status::Sources {
            store: agent.store.clone(),
            link: agent.link_stats.clone(),
            probes: agent.stats(),
            loaded: agent.loaded(),
            started,
        };
        // Stops with the metrics endpoint, before the agent.
        let stop = metrics_stop.clone();
        tokio::spawn(xce_agent::status::server::serve(listener, sources, stop))
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
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                systemd::reloading();
                reload(common, &mut agent).await;
                systemd::notify(&[NotifyState::Ready, NotifyState::Status(&agent.status_line())]);
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
    xce_agent::probe::cgroup::shut_down();
    sampler_stop.cancel();
    tracing::info!("stopped");
    Ok(EXIT_OK)
}

/// SIGHUP: load both files again and move the agent to them. Any error keeps the running
/// config; every error is logged on its own line with its file:line:column.
async fn reload(common: &Common, agent: &mut Agent) {
    tracing::info!("SIGHUP: reloading the configuration");
    let config = match xce_agent::daemon::load_config(&common.config, common.resources.as_deref()) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            tracing::error!(
                errors = errors.0.len(),
                "reload failed; still running the previous configuration"
            );
            return;
        }
    };
    let host = match host_name(common, &config) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("reload failed: {e:#}; still running the previous configuration");
            return;
        }
    };
    if config.digest == agent.config.digest && !agent.tls_changed(&config) {
        tracing::info!("configuration unchanged");
        return;
    }
    match agent.reload(config, &host).await {
        Ok(r) => tracing::info!(
            kept = r.kept,
            stopped = r.stopped,
            started = r.started,
            probes_restarted = r.probes_restarted,
            link_restarted = r.link_restarted,
            "reloaded"
        ),
        Err(e) => {
            if let xce_agent::daemon::ReloadError::Checks(problems) = &e {
                for (name, text) in problems {
                    tracing::error!("{name}: {text}");
                }
            }
            tracing::error!("reload refused: {e}; still running the previous configuration")
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

fn cmd_generate_assets(dir: &std::path::Path) -> anyhow::Result<u8> {
    let written = xce_agent::cli::generate_assets(dir)
        .with_context(|| format!("cannot write assets into {}", dir.display()))?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(EXIT_OK)
}

async fn cmd_listen(
    addr: &str,
    format: ListenFormat,
    ack: bool,
    only: &[String],
    refresh: Option<Duration>,
    tls: &ListenTls,
) -> anyhow::Result<u8> {
    let tls = match (&tls.tls_ca, &tls.tls_cert, &tls.tls_key) {
        (Some(ca), Some(cert), Some(key)) => {
            let paths = xce_agent::config::agent::TlsPaths {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                crl: tls.tls_crl.clone(),
            };
            let material = xce_agent::link::tls::Material::load(&paths)?;
            Some(material.server_config()?)
        }
        _ if tls.insecure => {
            eprintln!("xce-agent: WARNING: --insecure: accepting plaintext agents; anyone who can reach {addr} can report values for any host");
            None
        }
        _ => {
            eprintln!("xce-agent: refusing to listen in plaintext: give --tls-ca, --tls-cert and --tls-key (agents then need certificates from that CA), or --insecure to accept unauthenticated agents");
            return Ok(EXIT_CONFIG);
        }
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    eprintln!("xce-agent: listening on {}", listener.local_addr()?);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        stop.cancel();
    });
    let opts = receiver::ListenOpts {
        ack,
        assign: Vec::new(),
        tls,
        handshake_timeout: None,
    };
    let format = match format {
        ListenFormat::Json => receiver::Format::Json,
        ListenFormat::Text => receiver::Format::Text,
        ListenFormat::Table => {
            let view = xce_agent::cluster_table::TableView::for_stdout(only, refresh);
            let out = tokio::io::stdout();
            xce_agent::cluster_table::serve_table(listener, opts, view, out, shutdown).await?;
            return Ok(EXIT_OK);
        }
    };
    receiver::serve_lines(listener, opts, format, tokio::io::stdout(), shutdown).await?;
    Ok(EXIT_OK)
}

/// `xce-agent status`: ask the running daemon at agent.yaml's socket. Only agent.yaml is
/// read: a resources.yaml broken since the daemon loaded it must not hide the daemon.
async fn cmd_status(
    common: &Common,
    format: Format,
    watch: bool,
    names: &[String],
) -> anyhow::Result<u8> {
    let agent = match xce_agent::config::load_agent(&common.config) {
        Ok((agent, _)) => agent,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(EXIT_CONFIG);
        }
    };
    let path = agent.status_socket_path();
    let json = format == Format::Json;
    Ok(xce_agent::status::command::run(path, json, watch, names).await)
}

fn cmd_tls(command: &TlsCommand) -> anyhow::Result<u8> {
    let written = match command {
        TlsCommand::Init { dir, days } => xce_agent::tls_ca::init(dir, *days)?,
        TlsCommand::Issue {
            ca,
            out,
            domain,
            days,
            names,
        } => xce_agent::tls_ca::issue(ca, out, names, domain.as_deref(), *days)?,
    };
    for path in written {
        println!("{}", path.display());
    }
    Ok(EXIT_OK)
}
