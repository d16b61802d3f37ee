//! `xce-agent probe NAME`: run the probe of resource NAME (or the probe that provides it)
//! now, and show everything about the run ([`crate::render::probe`]).

use std::collections::BTreeSet;

use super::{exit, host_name, load, one_shot_builtins, refuse_unprobed, CmdError};
use crate::cli::Common;
use crate::config::ProbeKind;
use crate::daemon::probe_context;
use crate::output;
use crate::plan::{plan_for, ProbeTask};
use crate::probe::child::Exit;
use crate::probe::supervisor::Supervisor;
use crate::probe::{exec, resolve, ProbeContext};
use crate::render::probe::{Containment, ExecFacts, ProbeDebug, RunsAs};

pub async fn run(common: &Common, name: &str) -> Result<u8, CmdError> {
    let Some(config) = load(common) else {
        return Ok(exit::CONFIG);
    };
    let host = host_name(common, &config)?;
    let plan = plan_for(&config, &host, &BTreeSet::new());
    let task = plan
        .tasks
        .iter()
        .find(|t| t.name == name)
        .or_else(|| plan.tasks.iter().find(|t| t.feed(name).is_some()));
    let Some(task) = task else {
        return Ok(refuse_unprobed(&config, &plan, name));
    };
    let supervisor = Supervisor::start();
    let builtin = one_shot_builtins(matches!(task.kind, ProbeKind::Builtin { .. })).await;
    let ctx = probe_context(&config, &host, builtin, supervisor.clone());
    let debug = examine(task, &ctx).await;
    supervisor.containment.shut_down();
    print!("{}", debug.text());
    Ok(if debug.ok() {
        exit::OK
    } else {
        exit::PROBE_FAILED
    })
}

/// Run `task` once (a stream: until its first values) and gather what the report shows.
async fn examine<'a>(task: &'a ProbeTask, ctx: &'a ProbeContext) -> ProbeDebug<'a> {
    let spec = task.kind.exec_spec();
    let exec = spec.map(|spec| {
        let user = exec::credentials_for(spec.run_as.as_deref(), &ctx.run_as).map(|c| match c {
            Some(c) => RunsAs::User(c),
            None => RunsAs::Agent {
                name: ctx.supervisor.users.agent_name().to_owned(),
                uid: nix::unistd::geteuid(),
                gid: nix::unistd::getegid(),
                groups: nix::unistd::getgroups().unwrap_or_default(),
            },
        });
        let uid = match &user {
            Ok(RunsAs::User(c)) => Some(c.uid),
            _ => None,
        };
        let verdict = resolve::verdict(
            &spec.command,
            &spec.env,
            &ctx.plugin_dir,
            uid,
            spec.trusted.as_deref(),
        );
        let found = resolve::command(&ctx.plugin_dir, &spec.command)
            .ok()
            .and_then(|r| r.note(&spec.command[0], &ctx.plugin_dir));
        ExecFacts {
            spec,
            user,
            verdict,
            found,
        }
    });
    let mut run = crate::probe::run_once(task, ctx).await;
    super::strict::unreported_fails(task, &mut run);
    super::strict::explain_failure(task, &mut run, &ctx.plugin_dir);
    let contained = &ctx.supervisor.containment;
    let containment = spec.map(|_| match contained.tree() {
        None => Containment::ProcessGroup,
        Some(_) => match contained.usage_of(&task.name) {
            None => Containment::NotStarted,
            Some((path, usage)) => Containment::Cgroup { path, usage },
        },
    });
    // The samples the format's parser found, where `select:` chooses among them.
    let parsed = match (spec, &run.exec) {
        (Some(spec), Some(d)) if spec.format.selectable() && d.exit.is_some() => {
            let code = match d.exit {
                Some(Exit::Code(c)) => Some(c),
                _ => None,
            };
            output::parse(spec.format, &d.stdout, code, &task.name)
                .ok()
                .map(|mut parsed| {
                    if let Some(report) = &d.captured {
                        report.merge_into(&mut parsed);
                    }
                    parsed
                })
        }
        _ => None,
    };
    ProbeDebug {
        task,
        host: &ctx.host,
        exec,
        run,
        containment,
        parsed,
    }
}
