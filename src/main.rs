//! The xce-agent binary: argument parsing, logging, and the commands.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use xce_agent::cli::{Cli, Command, Common, Format};
use xce_agent::config::{self, Config, ProbeKind};
use xce_agent::plan::{make_plan, Plan};
use xce_agent::probe::{BuiltinSource, ProbeContext};
use xce_agent::report::{plan_text, OnceReport};
use xce_agent::schedule::{run_all_once, Scheduler};
use xce_agent::store::{Declared, Store};
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
            Some(Command::Check) => cmd_check(&cli.common),
            Some(Command::Probe { name }) => cmd_probe(&cli.common, name).await,
            Some(Command::Listen { .. }) => anyhow::bail!("listen is not available in this build"),
            None if cli.once => cmd_once(&cli.common, cli.format, &cli.only).await,
            None => cmd_daemon(&cli.common).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xce-agent: {e:#}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn init_logging(level: Option<&str>, interactive: bool) {
    use tracing_subscriber::EnvFilter;
    // Interactive commands print their results on stdout; only warnings belong on stderr.
    let default = if interactive { "warn" } else { "info" };
    let filter = level
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn host_name(common: &Common, config: &Config) -> anyhow::Result<String> {
    if let Some(h) = common.host.clone().or_else(|| config.agent.host.clone()) {
        return Ok(h);
    }
    let h = nix::unistd::gethostname().context("cannot read this machine's host name")?;
    Ok(h.to_string_lossy().into_owned())
}

/// Load both files; on error print every problem with its position and return None.
fn load(common: &Common) -> Option<Config> {
    match config::load(&common.config, common.resources.as_deref()) {
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

fn declared(plan: &Plan) -> Vec<Declared> {
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

/// Placeholder until the shared sampler is wired: no builtin index is available.
struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}

fn context(config: &Config, host: &str, builtin: Arc<dyn BuiltinSource>) -> ProbeContext {
    ProbeContext {
        host: host.to_owned(),
        plugin_dir: config.agent.plugin_dir.clone(),
        run_as: config.agent.run_as.clone(),
        builtin,
    }
}

/// Problems that make a planned probe unable to run here, and notes worth knowing.
/// (resource, text) lines for `check`.
type Findings = Vec<(String, String)>;

fn plan_checks(config: &Config, plan: &Plan) -> (Findings, Findings) {
    use xce_agent::probe::{exec, security};
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let root = nix::unistd::geteuid().is_root();
    let mut unenforced = 0;
    for t in &plan.tasks {
        let spec = match &t.kind {
            ProbeKind::Exec(e) => e,
            ProbeKind::Stream(s) => &s.exec,
            _ => continue,
        };
        let program = exec::resolve_program(&config.agent.plugin_dir, &spec.command[0]);
        match std::fs::metadata(&program) {
            Err(e) => {
                problems.push((t.name.clone(), format!("{}: {e}", program.display())));
                continue;
            }
            Ok(m) => {
                use std::os::unix::fs::PermissionsExt;
                if !m.is_file() || m.permissions().mode() & 0o111 == 0 {
                    problems.push((
                        t.name.clone(),
                        format!("{} is not an executable file", program.display()),
                    ));
                }
            }
        }
        let uid = match exec::credentials_for(spec.run_as.as_deref(), &config.agent.run_as) {
            Ok(c) => c.map(|c| c.uid),
            Err(e) => {
                problems.push((t.name.clone(), format!("run_as: {e}")));
                continue;
            }
        };
        if let Err(e) = security::check_program(&program, uid) {
            if root {
                problems.push((t.name.clone(), e.to_string()));
            } else {
                unenforced += 1;
                notes.push((t.name.clone(), format!("would be refused as root: {e}")));
            }
        }
        if !root {
            if let Some(u) = &spec.run_as {
                notes.push((
                    t.name.clone(),
                    format!("agent is not root: runs as itself, not as {u:?}"),
                ));
            }
        }
    }
    if !root
        && plan
            .tasks
            .iter()
            .any(|t| matches!(t.kind, ProbeKind::Exec(_) | ProbeKind::Stream(_)))
    {
        notes.push((
            "-".to_owned(),
            format!(
                "agent is not root: script permission checks are not enforced (a developer running their own scripts){}",
                if unenforced > 0 { "; see the notes above for what a root agent would refuse" } else { "" }
            ),
        ));
    }
    (problems, notes)
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
        let why = plan.skipped.iter().find(|s| s.name == name).map_or_else(
            || "no such resource in resources.yaml".to_owned(),
            |s| s.reason.to_string(),
        );
        eprintln!("xce-agent: {name} is not probed on {host}: {why}");
        return Ok(EXIT_CONFIG);
    };
    if let Err(e) = xce_agent::probe::process::become_subreaper() {
        tracing::debug!("cannot become a child subreaper: {e}");
    }
    let ctx = context(&config, &host, Arc::new(NoBuiltins));
    let report = xce_agent::probe::debug::run(task, &ctx).await;
    print!("{}", report.text);
    Ok(if report.ok {
        EXIT_OK
    } else {
        EXIT_PROBE_FAILED
    })
}

fn cmd_check(common: &Common) -> anyhow::Result<u8> {
    let Some(config) = load(common) else {
        return Ok(EXIT_CONFIG);
    };
    let host = host_name(common, &config)?;
    let plan = make_plan(&config.resources, &host, &BTreeSet::new());
    let (problems, notes) = plan_checks(&config, &plan);
    print!("{}", plan_text(&config, &plan, &problems, &notes));
    if problems.is_empty() {
        println!("\nconfiguration OK");
        Ok(EXIT_OK)
    } else {
        println!(
            "\nconfiguration has {} problem(s) on this host",
            problems.len()
        );
        Ok(EXIT_CONFIG)
    }
}

async fn cmd_once(common: &Common, format: Format, only: &[String]) -> anyhow::Result<u8> {
    let Some(config) = load(common) else {
        return Ok(EXIT_CONFIG);
    };
    let host = host_name(common, &config)?;
    let mut plan = make_plan(&config.resources, &host, &BTreeSet::new());
    if !only.is_empty() {
        for name in only {
            let known = plan
                .tasks
                .iter()
                .any(|t| &t.name == name || t.feed(name).is_some());
            if !known {
                let why = plan.skipped.iter().find(|s| &s.name == name).map_or_else(
                    || "no such resource in resources.yaml".to_owned(),
                    |s| s.reason.to_string(),
                );
                eprintln!("xce-agent: {name} is not probed on {host}: {why}");
                return Ok(EXIT_CONFIG);
            }
        }
        plan.tasks
            .retain(|t| only.iter().any(|n| n == &t.name || t.feed(n).is_some()));
    }
    let store = Store::new();
    store.declare(declared(&plan));
    let ctx = context(&config, &host, Arc::new(NoBuiltins));
    let runs = run_all_once(&plan, &ctx, &store, config.agent.max_parallel).await;
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
    let host = host_name(common, &config)?;
    let plan = make_plan(&config.resources, &host, &BTreeSet::new());
    tracing::info!(host = %host, probes = plan.tasks.len(), skipped = plan.skipped.len(), "starting");
    let store = Arc::new(Store::new());
    store.declare(declared(&plan));
    let shutdown = CancellationToken::new();
    let ctx = context(&config, &host, Arc::new(NoBuiltins));
    let mut scheduler = Scheduler::new(
        store.clone(),
        ctx,
        config.agent.max_parallel,
        shutdown.clone(),
    );
    scheduler.apply(&plan);
    wait_for_termination().await;
    tracing::info!("stopping");
    scheduler.stop().await;
    Ok(EXIT_OK)
}

async fn wait_for_termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
