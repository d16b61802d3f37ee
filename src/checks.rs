//! What `check` verifies about this host's plan beyond the files themselves: that each probe's
//! program and user exist and would be allowed to run. `check`, `probe NAME` and a reload
//! share these checks, so a reload refuses what `check` calls a problem.

use crate::config::{Config, ProbeKind};
use crate::plan::Plan;
use crate::probe::{exec, security};

/// (resource, text) lines, as `check` prints them.
pub type Findings = Vec<(String, String)>;

/// Problems (a probe cannot run here, or a root agent refuses it) and notes worth knowing.
pub fn plan_checks(config: &Config, plan: &Plan) -> (Findings, Findings) {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let root = security::enforced();
    let mut unenforced = 0;
    for t in &plan.tasks {
        let spec = match &t.kind {
            ProbeKind::Exec(e) => e,
            ProbeKind::Stream(s) => &s.exec,
            _ => continue,
        };
        let uid = match exec::credentials_for(spec.run_as.as_deref(), &config.agent.run_as) {
            Ok(c) => c.map(|c| c.uid),
            Err(e) => {
                problems.push((t.name.clone(), format!("run_as: {e}")));
                continue;
            }
        };
        let plugin_dir = &config.agent.plugin_dir;
        let program = exec::resolve_program(plugin_dir, &spec.command[0]);
        match security::verdict(&program, &spec.command, plugin_dir, uid) {
            security::Verdict::Ok => {}
            security::Verdict::Problem(e) | security::Verdict::Refused(e) => {
                problems.push((t.name.clone(), e))
            }
            security::Verdict::Unenforced(e) => {
                unenforced += 1;
                notes.push((t.name.clone(), format!("would be refused as root: {e}")));
            }
        }
        if !spec.no_new_privs {
            notes.push((
                t.name.clone(),
                "no_new_privs: false: setuid programs it runs can raise its privileges".to_owned(),
            ));
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
    let runs_programs = plan
        .tasks
        .iter()
        .any(|t| matches!(t.kind, ProbeKind::Exec(_) | ProbeKind::Stream(_)));
    if runs_programs {
        notes.push(("-".to_owned(), crate::probe::cgroup::check_text()));
    }
    if !root && runs_programs {
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
