//! `xce-agent --once`: run every probe of this host (or those `--only` names) once, print
//! the values, and exit non-zero if a probe failed: the admin's debugging tool.

use std::collections::BTreeSet;
use std::io::IsTerminal as _;
use std::time::Duration;

use super::{exit, host_name, load, one_shot_builtins, refuse_unprobed, CmdError};
use crate::cli::{Common, OnceFormat};
use crate::daemon::{declared, probe_context, uses_builtins};
use crate::plan::{is_probed, plan_for};
use crate::probe::supervisor::Supervisor;
use crate::render::once::OnceReport;
use crate::schedule::{record_run, run_all_once, InFlight};
use crate::store::Store;

pub async fn run(common: &Common, format: OnceFormat, only: &[String]) -> Result<u8, CmdError> {
    let Some(config) = load(common) else {
        return Ok(exit::CONFIG);
    };
    let host = host_name(common, &config)?;
    let mut plan = plan_for(&config, &host, &BTreeSet::new());
    if !only.is_empty() {
        if let Some(name) = only.iter().find(|name| !is_probed(&plan, name)) {
            return Ok(refuse_unprobed(&config, &plan, name));
        }
        plan.tasks
            .retain(|t| only.iter().any(|n| n == &t.name || t.feed(n).is_some()));
    }
    // Only once there is something to run: a refused name touches no cgroup.
    let supervisor = Supervisor::start();
    let store = Store::new();
    store.declare(declared(&plan));
    let builtin = one_shot_builtins(uses_builtins(&plan)).await;
    let ctx = probe_context(&config, &host, builtin, supervisor.clone());
    let running = InFlight::default();
    // On a terminal, a pass that takes a while says what it is waiting for (a hanging script
    // would otherwise look like a hung agent for its whole timeout); a pipe gets nothing.
    let progress = std::io::stderr()
        .is_terminal()
        .then(|| tokio::spawn(say_what_it_waits_for(running.clone())));
    let mut runs = run_all_once(&plan, &ctx, &store, config.agent.max_parallel, &running).await;
    // Strict, unlike the daemon: a resource left unreported fails, and the store shows it.
    for (task, run) in &mut runs {
        super::strict::unreported_fails(task, run);
        super::strict::explain_failure(task, run, &ctx.plugin_dir);
        record_run(&store, task, run);
    }
    if let Some(progress) = progress {
        progress.abort();
        eprint!("\r\x1b[2K");
    }
    supervisor.containment.shut_down();
    let report = OnceReport::new(&host, &runs, &store);
    match format {
        OnceFormat::Table => print!("{}", report.table()),
        OnceFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(if report.all_ok() {
        exit::OK
    } else {
        exit::PROBE_FAILED
    })
}

/// Every second after the first: `waiting for: slow (12s of its 30s timeout), ...`, redrawn
/// in place on the terminal's last line.
async fn say_what_it_waits_for(running: InFlight) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let waiting = running.describe();
        if !waiting.is_empty() {
            eprint!(
                "\r\x1b[2Kwaiting for: {}",
                crate::text::escape(&waiting.join(", "))
            );
        }
    }
}
