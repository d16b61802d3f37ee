//! The file probe: a bounded read of one file (sysfs, or a file a cron job writes), an
//! optional regex capture, and `max_age` on its mtime so a dead writer shows up as stale.
//! The read itself runs in `file_reader` (a thread of its own, with the probe user's rights
//! when the agent is root, under a timeout, and bounded when the filesystem hangs).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::failure::FileFailure;
use super::file_reader::{ReadOutcome, ReadRequest};
use super::read_error::ReadError;
use super::{Outcome, ProbeContext, ProbeRun, RunFailure};
use crate::config::{FileSpec, ProbeKind};
use crate::plan::ProbeTask;
use crate::value::Reading;

/// The value's text: the regex's first group (or whole match), else the first non-blank line.
fn extract(spec: &FileSpec, text: &str) -> Result<String, FileFailure> {
    match &spec.regex {
        Some(re) => {
            let caps = re.captures(text).ok_or_else(|| FileFailure::NoMatch {
                regex: re.as_str().to_owned(),
                path: spec.path.clone(),
            })?;
            let m = caps
                .get(1)
                .or_else(|| caps.get(0))
                .map(|m| m.as_str())
                .unwrap_or("");
            Ok(m.trim().to_owned())
        }
        None => crate::output::parse_value(text).map_err(|_| FileFailure::Empty {
            path: spec.path.clone(),
        }),
    }
}

/// Who a file probe reads as: the probe's `run_as`, else the agent's, when the agent is
/// root; `root` (or a non-root agent) reads with the agent's own rights.
pub fn reader_credentials(
    spec: &FileSpec,
    ctx: &ProbeContext,
) -> Result<Option<std::sync::Arc<super::child::Credentials>>, super::child::UserError> {
    ctx.supervisor
        .users
        .credentials_for(spec.run_as.as_deref(), &ctx.run_as)
}

pub async fn run(
    task: &ProbeTask,
    spec: &FileSpec,
    ctx: &ProbeContext,
    started: SystemTime,
) -> ProbeRun {
    let t0 = std::time::Instant::now();
    let fail =
        |why: RunFailure, outcome| ProbeRun::all_failed(task, started, t0.elapsed(), outcome, why);
    let creds = match reader_credentials(spec, ctx) {
        Ok(c) => c,
        Err(e) => return fail(RunFailure::RunAs(e), Outcome::Failed),
    };
    let request = ReadRequest {
        path: spec.path.clone(),
        max_bytes: spec.max_bytes,
        max_age: spec.max_age,
        timeout: task.timeout,
        creds,
        // A probe output format reads a node_exporter textfile directory's `*.prom` files.
        textfiles: spec.format.is_some(),
    };
    let result = match ctx.files.read(request).await {
        Err(e @ ReadError::TimedOut { .. }) => {
            return fail(RunFailure::Read(e.into()), Outcome::TimedOut)
        }
        Err(e @ ReadError::Refused(_)) => return fail(RunFailure::Read(e.into()), Outcome::Failed),
        other => other,
    };
    let elapsed = t0.elapsed();
    let small = match &result {
        Ok(ReadOutcome::Text(text)) => text.len() <= super::INLINE_PARSE_BYTES,
        _ => true,
    };
    if small {
        let (mut run, cpu) = super::in_place(|| interpret(task, spec, result, started, elapsed));
        run.agent_cpu = cpu;
        return run;
    }
    // A larger read is parsed off the runtime's threads (a file may hold megabytes).
    let (t, sp) = (task.clone(), spec.clone());
    match super::off_runtime(task.timeout, move || {
        interpret(&t, &sp, result, started, elapsed)
    })
    .await
    {
        Ok((mut run, cpu)) => {
            run.agent_cpu = cpu;
            run
        }
        Err(why) => fail(why, Outcome::TimedOut),
    }
}

/// What was read, as the probe's readings.
fn interpret(
    task: &ProbeTask,
    spec: &FileSpec,
    result: Result<ReadOutcome, ReadError>,
    started: SystemTime,
    elapsed: Duration,
) -> ProbeRun {
    if let Some(format) = spec.format {
        return in_format(task, spec, format, result, started, elapsed);
    }
    let fail = |why: FileFailure| {
        ProbeRun::all_failed(
            task,
            started,
            elapsed,
            Outcome::Failed,
            RunFailure::Read(why),
        )
    };
    let text = match result {
        Err(e) => return fail(e.into()),
        Ok(ReadOutcome::TooOld(path, age)) => {
            let stale = Reading::Stale(too_old(path, age, spec).to_string());
            return ProbeRun::single(task, started, elapsed, stale);
        }
        Ok(ReadOutcome::Text(text)) => text,
    };
    let reading = match extract(spec, &text) {
        Err(e) => return fail(e),
        Ok(raw) => match task.feeds[0].valtype.parse(&raw) {
            Ok(v) => Reading::Ok(v),
            Err(e) => return fail(e.into()),
        },
    };
    ProbeRun::single(task, started, elapsed, reading)
}

fn too_old(path: PathBuf, age: Duration, spec: &FileSpec) -> FileFailure {
    FileFailure::TooOld {
        path,
        age,
        max_age: spec.max_age.unwrap_or_default(),
    }
}

/// A file in a probe output format: every fed resource from its samples, as an exec probe's.
fn in_format(
    task: &ProbeTask,
    spec: &FileSpec,
    format: crate::output::Format,
    read: Result<ReadOutcome, ReadError>,
    started: SystemTime,
    elapsed: Duration,
) -> ProbeRun {
    let text = match read {
        Err(e) => {
            let why = RunFailure::Read(e.into());
            return ProbeRun::all_failed(task, started, elapsed, Outcome::Failed, why);
        }
        Ok(ReadOutcome::TooOld(path, age)) => {
            let why = RunFailure::Read(too_old(path, age, spec));
            let mut run = ProbeRun::all_failed(task, started, elapsed, Outcome::Failed, why);
            for (_, r) in &mut run.readings {
                if let Reading::Failed(why) = r {
                    *r = Reading::Stale(why.to_string());
                }
            }
            return run;
        }
        Ok(ReadOutcome::Text(t)) => t,
    };
    match crate::output::parse(format, text.as_bytes(), None, &task.name) {
        Err(error) => ProbeRun::all_failed(
            task,
            started,
            elapsed,
            Outcome::Failed,
            RunFailure::FileOutput {
                format,
                path: spec.path.clone(),
                error,
            },
        ),
        Ok(parsed) => ProbeRun::from_output(
            task,
            started,
            elapsed,
            (format, &spec.select),
            &parsed,
            &text,
        ),
    }
}

/// (resource, text) lines for `check`.
pub type Findings = Vec<(String, String)>;

/// What `check` says about file probes: who each one reads as, and the stuck-read bound.
/// Problems (the probe cannot run here) and notes.
pub fn check_notes(
    plan: &crate::plan::Plan,
    default_run_as: &str,
    max_stuck_reads: usize,
) -> (Findings, Findings) {
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    let root = nix::unistd::geteuid().is_root();
    for t in &plan.tasks {
        let ProbeKind::File(spec) = &t.kind else {
            continue;
        };
        let user = spec.run_as.as_deref().unwrap_or(default_run_as);
        let who = match super::exec::credentials_for(spec.run_as.as_deref(), default_run_as) {
            Err(e) => {
                problems.push((t.name.clone(), format!("run_as: {e}")));
                continue;
            }
            Ok(Some(c)) => format!("reads {} as {} (run_as)", spec.path.display(), c.user),
            Ok(None) if root => format!(
                "reads {} as root (`run_as: {user}`): root's rights, every file readable",
                spec.path.display()
            ),
            Ok(None) => format!(
                "reads {} as {} (the agent is not root)",
                spec.path.display(),
                super::exec::current_user_name()
            ),
        };
        notes.push((t.name.clone(), who));
    }
    if notes.iter().chain(&problems).next().is_some() {
        notes.push((
            "-".to_owned(),
            format!("file reads: at most {max_stuck_reads} may be stuck in the kernel (max_stuck_reads) before reads of paths that never answered fail at once; reads on the mount of a stuck read fail at once until it returns"),
        ));
    }
    (problems, notes)
}
