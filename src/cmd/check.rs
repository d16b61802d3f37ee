//! `xce-agent check`: validate both files, the scripts' permissions and the link's
//! certificates, and print this host's plan with what it skips and why.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use super::{exit, host_name, load_files, CmdError};
use crate::checks::plan_checks;
use crate::cli::Common;
use crate::config::ProbeKind;
use crate::daemon::uses_builtins;
use crate::plan::plan_for;
use crate::probe::builtin;
use crate::render::plan::{plan_text, tls_text};

pub async fn run(common: &Common) -> Result<u8, CmdError> {
    let Some(config) = load_files(common) else {
        return Ok(exit::CONFIG);
    };
    let host = host_name(common, &config)?;
    let plan = plan_for(&config, &host, &BTreeSet::new());
    let (mut problems, mut notes) = plan_checks(&config, &plan);
    let (file_problems, file_notes) =
        crate::probe::file::check_notes(&plan, &config.agent.run_as, config.agent.max_stuck_reads);
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
    let tls = config.agent.tls.as_ref().map(|paths| {
        crate::link::tls::check(
            paths,
            SystemTime::now(),
            &host,
            config.agent.tls_expiry_warning,
        )
    });
    print!("{}", tls_text(&config, tls.as_ref()));
    if !config.agent.controllers.is_empty() {
        print!("{}", crate::render::plan::controller_name_text(&host));
    }
    for w in crate::trust::waived(&config.agent) {
        println!("\nWARNING: {w}");
    }
    let total = problems.len() + tls.map_or(0, |r| r.problems.len());
    if total == 0 {
        println!("\nconfiguration OK");
        Ok(exit::OK)
    } else {
        println!("\nconfiguration has {total} problem(s) on this host");
        Ok(exit::HOST_PROBLEMS)
    }
}
