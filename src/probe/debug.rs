//! `xce-agent probe NAME`: run one probe now and show everything an admin needs to see why
//! it does or does not work: argv, user, environment, cwd, the script check, how it ended,
//! duration, its output, and the values parsed or the exact parse error.

use std::fmt::Write as _;

use super::exec::{self, ExecDetail};
use super::process::{Ending, Exit, DEFAULT_STDOUT_CAP};
use super::{security, ProbeContext, ProbeRun};
use crate::config::{ExecSpec, ProbeKind};
use crate::plan::ProbeTask;
use crate::value::Reading;

/// Shown bytes of stdout/stderr at most (the agent's caps are larger; this is a terminal).
const SHOW_MAX: usize = DEFAULT_STDOUT_CAP;

/// The report and whether the probe succeeded.
pub struct Report {
    pub text: String,
    pub ok: bool,
}

/// Text, escaped where it is not UTF-8 or holds control characters, indented.
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(SHOW_MAX)];
    let mut out = String::new();
    let text = match std::str::from_utf8(cut) {
        Ok(t) => t
            .chars()
            .map(|c| {
                if c.is_control() && c != '\n' && c != '\t' {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>(),
        Err(_) => cut.escape_ascii().to_string().replace("\\n", "\n"),
    };
    for line in text.lines() {
        let _ = writeln!(out, "    | {line}");
    }
    if bytes.len() > SHOW_MAX {
        let _ = writeln!(
            out,
            "    … ({} more bytes not shown)",
            bytes.len() - SHOW_MAX
        );
    }
    out
}

fn user_line(spec: &ExecSpec, ctx: &ProbeContext) -> (String, Option<nix::unistd::Uid>) {
    match exec::credentials_for(spec.run_as.as_deref(), &ctx.run_as) {
        Err(e) => (format!("cannot resolve: {e}"), None),
        Ok(Some(c)) => {
            let groups: Vec<String> = c.groups.iter().map(|g| g.to_string()).collect();
            (
                format!(
                    "{} (uid {}, gid {}, groups {})",
                    c.user,
                    c.uid,
                    c.gid,
                    groups.join(",")
                ),
                Some(c.uid),
            )
        }
        Ok(None) => {
            let uid = nix::unistd::geteuid();
            let groups: Vec<String> = nix::unistd::getgroups()
                .map(|gs| gs.iter().map(|g| g.to_string()).collect())
                .unwrap_or_default();
            let why = if uid.is_root() {
                "run_as: root"
            } else {
                "the agent is not root: probes run as the agent's user"
            };
            (
                format!(
                    "{} (uid {uid}, gid {}, groups {}) — {why}",
                    exec::current_user_name(),
                    nix::unistd::getegid(),
                    groups.join(",")
                ),
                None,
            )
        }
    }
}

/// How the child ended, in the engine's one wording (`Exit` and `Ending` display).
fn exit_line(detail: &ExecDetail) -> String {
    let exit = match detail.exit {
        None => "not started".to_owned(),
        Some(Exit::Unreaped) => "did not exit (still in the kernel after SIGKILL)".to_owned(),
        Some(e) => e.to_string(),
    };
    match &detail.ending {
        Some(ending @ (Ending::TimedOut { .. } | Ending::OutputOverflow { .. })) => {
            format!("{exit}; {ending}")
        }
        _ => exit,
    }
}

/// Run `task` once (a stream: until its first values) and describe it.
pub async fn run(task: &ProbeTask, ctx: &ProbeContext) -> Report {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "probe {} (kind {}) on {}",
        task.name,
        task.kind.name(),
        ctx.host
    );
    if !task.instance.is_empty() {
        let _ = writeln!(t, "  instance:  {}", task.instance);
    }
    let feeds: Vec<String> = task
        .feeds
        .iter()
        .map(|f| format!("{} ({})", f.name, f.valtype.as_str()))
        .collect();
    let _ = writeln!(t, "  feeds:     {}", feeds.join(", "));
    let timeout_is = match task.kind {
        ProbeKind::Stream(_) => "first values within",
        _ => "timeout",
    };
    let _ = writeln!(
        t,
        "  interval:  {}   {timeout_is}: {}   stale after: {}",
        humantime::format_duration(task.interval),
        humantime::format_duration(task.timeout),
        humantime::format_duration(task.stale_after)
    );
    for (label, value) in task.kind.details() {
        let _ = writeln!(t, "  {:<11}{value}", format!("{label}:"));
    }
    let exec_spec = task.kind.exec_spec();
    if let Some(spec) = exec_spec {
        let program = exec::resolve_program(&ctx.plugin_dir, &spec.command[0]);
        let (user, uid) = user_line(spec, ctx);
        let _ = writeln!(t, "  user:      {user}");
        let _ = writeln!(t, "  cwd:       /");
        let _ = writeln!(t, "  format:    {}", spec.format.as_str());
        let stdin = match &task.kind {
            ProbeKind::Stream(s) => s.stdin.as_str(),
            _ => "none",
        };
        let _ = writeln!(t, "  stdout:    {}   stdin: {stdin}", spec.stdout.as_str());
        let verdict = match security::verdict(&program, &spec.command, &ctx.plugin_dir, uid) {
            security::Verdict::Ok => "ok".to_owned(),
            security::Verdict::Problem(e) => format!("PROBLEM: {e}"),
            security::Verdict::Refused(e) => format!("REFUSED: {e}"),
            security::Verdict::Unenforced(e) => {
                format!("not enforced (the agent is not root); as root: {e}")
            }
        };
        let _ = writeln!(t, "  script check: {verdict}");
    }
    let run: ProbeRun = match &task.kind {
        ProbeKind::Stream(_) => super::stream::first_values(task, ctx).await,
        _ => super::run_once(task, ctx).await,
    };
    if let Some(d) = &run.exec {
        let _ = writeln!(t, "  argv:      {}", shell_words(&d.argv));
        let _ = writeln!(t, "  env:");
        for (k, v) in &d.env {
            let _ = writeln!(t, "    {k}={v}");
        }
        let _ = writeln!(t, "  ended:     {}", exit_line(d));
    }
    let _ = writeln!(t, "  duration:  {:.3}s", run.duration.as_secs_f64());
    if exec_spec.is_some() {
        let _ = writeln!(t, "  {}", containment_line(task));
    }
    if let Some(d) = &run.exec {
        let _ = writeln!(t, "  stdout ({} bytes):", d.stdout.len());
        t.push_str(&shown(&d.stdout));
        let _ = writeln!(t, "  stderr (tail):");
        t.push_str(&shown(d.stderr.as_bytes()));
    }
    if let (Some(d), Some(spec)) = (&run.exec, exec_spec) {
        t.push_str(&parsed_samples(spec, d, &task.name));
    }
    for bad in &run.bad_lines {
        let _ = writeln!(t, "  did not parse: {bad}");
    }
    let _ = writeln!(t, "  values:");
    for (name, r) in &run.readings {
        let line = match r {
            Reading::Ok(v) => format!("{v}"),
            Reading::Failed(e) => format!("FAILED: {e}"),
            Reading::Stale(e) => format!("STALE: {e}"),
            Reading::Pending(e) => format!("not reported: {e}"),
        };
        let _ = writeln!(t, "    {name} = {line}");
    }
    for name in &run.unexpected {
        let _ = writeln!(t, "    (ignored: {name} is not in this probe's provides)");
    }
    let ok = run.succeeded();
    let _ = writeln!(
        t,
        "result: {}",
        if ok {
            "ok".to_owned()
        } else {
            format!(
                "{}: {}",
                run.outcome.as_str(),
                run.error().unwrap_or("failed")
            )
        }
    );
    Report { text: t, ok }
}

/// Most samples listed under `parsed:` (a node_exporter textfile can hold thousands).
const SHOW_SAMPLES: usize = 40;

/// What the format's parser found in the output (perfdata, metrics, fields, attributes),
/// for the formats where `select:` chooses among them.
fn parsed_samples(spec: &ExecSpec, d: &ExecDetail, own: &str) -> String {
    let mut t = String::new();
    if !spec.format.selectable() || d.exit.is_none() {
        return t;
    }
    let exit = match d.exit {
        Some(Exit::Code(c)) => Some(c),
        _ => None,
    };
    let Ok(parsed) = super::output::parse(spec.format, &d.stdout, exit, own) else {
        return t;
    };
    let _ = writeln!(t, "  parsed ({} samples):", parsed.samples.len());
    for s in parsed.samples.iter().take(SHOW_SAMPLES) {
        let _ = writeln!(t, "    {} = {}", s.key(), s.value);
    }
    if parsed.samples.len() > SHOW_SAMPLES {
        let _ = writeln!(t, "    … ({} more)", parsed.samples.len() - SHOW_SAMPLES);
    }
    t
}

/// Where the run was contained and what its cgroup used.
fn containment_line(task: &ProbeTask) -> String {
    if super::cgroup::active().is_none() {
        return "cgroup:    none (contained by process group only)".to_owned();
    }
    match super::cgroup::usage_of(&task.name) {
        None => "cgroup:    none (the run did not start)".to_owned(),
        Some((path, u)) => {
            let peak = u.peak_memory.map_or_else(
                || "peak memory not counted (no memory controller)".to_owned(),
                |b| format!("peak memory {} KiB", b / 1024),
            );
            format!(
                "cgroup:    {} (cpu {:.3}s, {peak})",
                path.display(),
                u.cpu.as_secs_f64()
            )
        }
    }
}

/// argv as a shell would need it quoted, for copy-paste.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,@+".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
