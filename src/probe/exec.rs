//! The exec probe: run an admin's script (argv, no shell) under `child::run`, parse its
//! stdout in the probe's format, type each value by its resource's valtype.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::capture::{Report, ThisNode};
use super::child::{self, ChildSpec, Credentials, Ending, Exit, UserError};
use super::failure::{last_line, CaptureFailure, ChildEnded, ElimHint, SpawnRefused};
use super::{Outcome, ProbeContext, ProbeRun, RunFailure};
use crate::config::ExecSpec;
use crate::output;
use crate::plan::ProbeTask;

/// What the child did, for `--once`, `probe NAME` and the logs.
#[derive(Debug, Clone)]
pub struct ExecDetail {
    /// Shared with the probe's later runs (made once per probe: [`Launch`]).
    pub argv: Arc<[String]>,
    pub user: Arc<str>,
    pub env: child::Env,
    pub exit: Option<Exit>,
    pub ending: Option<Ending>,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// With `capture:`: the calls its stand-ins captured and what they did.
    pub captured: Option<super::capture::Report>,
}

/// The user a probe runs as: only a root agent can switch, and it never runs a probe as root
/// unless the config says `run_as: root`. Looked up afresh (`check`, `probe NAME`); runs use
/// the agent's cached lookups ([`super::supervisor::Users::credentials_for`]).
pub fn credentials_for(
    spec_run_as: Option<&str>,
    default: &str,
) -> Result<Option<Credentials>, UserError> {
    switched_to(spec_run_as, default)
        .map(Credentials::resolve)
        .transpose()
}

/// The user a root agent switches to for a probe; `None`: it runs with the agent's rights.
pub fn switched_to<'a>(spec_run_as: Option<&'a str>, default: &'a str) -> Option<&'a str> {
    if !super::security::agent_is_root() {
        return None;
    }
    Some(spec_run_as.unwrap_or(default)).filter(|user| *user != "root")
}

/// The agent's own user name (runs take it from `Supervisor::users`, looked up once).
pub fn current_user_name() -> String {
    let uid = nix::unistd::geteuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

/// The child's whole environment: fixed PATH, the XCE_* variables, then the probe's `env:`;
/// with `capture:`, the stand-ins' directories first on PATH (whichever PATH that is) and
/// `XCE_CAPTURE_FD`, the descriptor they report on.
pub fn probe_env(
    task: &ProbeTask,
    host: &str,
    extra: &std::collections::BTreeMap<String, String>,
    stand_ins: &[PathBuf],
) -> child::Env {
    let names: Vec<&str> = task.feeds.iter().map(|f| f.name.as_str()).collect();
    let mut env = vec![
        ("PATH".to_owned(), super::path::PROBE_PATH.to_owned()),
        ("XCE_HOST".to_owned(), host.to_owned()),
        ("XCE_RESOURCE".to_owned(), task.name.clone()),
        ("XCE_RESOURCES".to_owned(), names.join(" ")),
        (
            "XCE_INTERVAL".to_owned(),
            task.interval.as_secs().to_string(),
        ),
        (
            "XCE_TIMEOUT".to_owned(),
            task.timeout.as_secs().max(1).to_string(),
        ),
    ];
    if !task.instance.is_empty() {
        env.push(("XCE_INSTANCE".to_owned(), task.instance.clone()));
    }
    // What the format's own system sets (MUNIN_*, COLLECTD_*), under the probe's `env:`.
    if let Some(spec) = task.kind.exec_spec() {
        env.extend((spec.format.def().peer.env)(&peer_run(task, host)));
    }
    for (k, v) in extra {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), v.clone()));
    }
    if !stand_ins.is_empty() {
        let mut dirs: Vec<String> = stand_ins.iter().map(|d| d.display().to_string()).collect();
        match env.iter_mut().find(|(name, _)| name == "PATH") {
            Some((_, path)) => {
                dirs.push(std::mem::take(path));
                *path = dirs.join(":");
            }
            None => env.push(("PATH".to_owned(), dirs.join(":"))),
        }
        env.push(("XCE_CAPTURE_FD".to_owned(), child::CAPTURE_FD.to_string()));
    }
    child::Env::new(env)
}

/// What a format's peer arguments and environment are made of, for this probe.
fn peer_run<'a>(task: &'a ProbeTask, host: &'a str) -> output::PeerRun<'a> {
    let gives_state = task
        .kind
        .exec_spec()
        .is_some_and(|s| s.format.def().peer.state_dir);
    output::PeerRun {
        probe: &task.name,
        host,
        interval: task.interval,
        state_dir: gives_state
            .then(|| super::plugin_state::probe_dir(&task.name))
            .flatten(),
    }
}

/// Build the child spec for an exec or stream probe (afresh: a stream's start, `--once`).
pub fn child_spec(
    task: &ProbeTask,
    spec: &ExecSpec,
    ctx: &ProbeContext,
    env: child::Env,
) -> Result<(ChildSpec, Arc<str>), SpawnRefused> {
    // An exec run's path with nothing kept: the launch is made, used once and dropped.
    let (child, launch) = child_spec_reusing(task, spec, ctx, &env, &Mutex::new(None))?;
    Ok((child, launch.user.clone()))
}

/// What an exec probe's runs start from, made at its first run and kept by its loop
/// ([`super::RunCache`]; a reload starts a new loop, which makes a new one): the resolved
/// command, the child's spec with its argv and environment prepared as the exec takes
/// them, and what the run's record shows. Each run still resolves what the file system
/// decides (a bare name's lookup, an interpreter's relative script), checks the program is
/// there and runnable, and runs the script rule (`Launch::for_run`); only the strings and
/// arrays built from the same answer are not built again.
#[derive(Debug)]
pub struct Launch {
    resolved: super::resolve::Resolved,
    /// `resolved` depends on nothing but the config: an absolute program, or one under
    /// plugin_dir by a path with a `/`, without an interpreter's relative script (whose
    /// presence under plugin_dir is looked up at each run).
    fixed: bool,
    /// Without the per-run parts (the checked program, credentials, the cgroup); prepared.
    child: ChildSpec,
    argv: Arc<[String]>,
    user: Arc<str>,
}

impl Launch {
    fn new(
        task: &ProbeTask,
        spec: &ExecSpec,
        ctx: &ProbeContext,
        env: child::Env,
        resolved: super::resolve::Resolved,
        creds: Option<&Credentials>,
    ) -> Self {
        let user: Arc<str> = match creds {
            Some(c) => c.user.as_str().into(),
            None => ctx.supervisor.users.agent_name().into(),
        };
        let mut child = ChildSpec::new(&resolved.program, task.timeout);
        // The arguments the format's own system passes (netdata's update-every) come first;
        // a `shell:` line gets them as its positional parameters (`sh -c LINE sh ARGS`:
        // "$1"...), never in front of `-c`.
        let peer_args = (spec.format.def().peer.args)(&peer_run(task, &ctx.host));
        child.args = if spec.shell && !peer_args.is_empty() {
            resolved
                .args
                .iter()
                .chain(std::iter::once(&crate::config::kind_spec::SHELL.to_owned()))
                .chain(&peer_args)
                .map(OsString::from)
                .collect()
        } else {
            peer_args
                .iter()
                .chain(&resolved.args)
                .map(OsString::from)
                .collect()
        };
        child.env = env;
        child.limits = spec.limits.clone();
        child.no_new_privs = spec.no_new_privs;
        child.stdout = spec.stdout;
        child.capture = !spec.capture.is_empty();
        // A NUL byte in an argument or the environment: the start says so, at each run.
        let _ = child.prepare();
        let fixed = resolved.script.is_none()
            && spec
                .command
                .first()
                .is_some_and(|name| Path::new(name).is_absolute() || name.contains('/'));
        Self {
            argv: argv_of(&child),
            resolved,
            fixed,
            child,
            user,
        }
    }

    /// The child spec of one run: the script rule's checks (at every run: they see the file
    /// system as it is now), the program's state directory, the probe's cgroup. `seen`: the
    /// program's stat, taken by this run a moment before (by `check_runnable`).
    fn for_run(
        &self,
        task: &ProbeTask,
        spec: &ExecSpec,
        ctx: &ProbeContext,
        creds: Option<Arc<Credentials>>,
        seen: Option<&std::fs::Metadata>,
    ) -> Result<ChildSpec, SpawnRefused> {
        let supervisor = &ctx.supervisor;
        let program = &self.resolved.program;
        let args = &self.resolved.args;
        let mut checked = None;
        if super::security::enforced() {
            checked = supervisor
                .verdicts
                .check_and_open_seen(
                    program,
                    seen,
                    args,
                    &spec.env,
                    creds.as_ref().map(|c| c.uid),
                )
                // The rule cannot check an interpreter that is not there: say that plainly
                // (read only on this failure path, never per good run).
                .map(Some)
                .map_err(|e| match super::security::script_problem(program, false) {
                    Some(why) => SpawnRefused::NotRunnable(why),
                    None => e.into(),
                })?;
            // Program text as root (or as a user whose uid is 0) runs only where the admin
            // said why (`trusted:`).
            if creds.as_ref().is_none_or(|c| c.uid.is_root()) {
                super::security::check_text(program, args, &spec.env, spec.trusted.as_deref())?;
            }
        }
        if spec.format.def().peer.state_dir {
            // Made at the first run that needs it, for the user the probe runs as; checked
            // at every run (a few system calls, on a format whose plugins run every few
            // minutes).
            super::plugin_state::ensure(&task.name, creds.as_ref().map(|c| (c.uid, c.gid)))?;
        }
        let mut child = self.child.clone();
        child.checked = checked;
        child.credentials = creds;
        if let Some(tree) = supervisor.containment.tree() {
            let cg = tree
                .probe(&task.name, &spec.limits)
                .map_err(SpawnRefused::Cgroup)?;
            child.cgroup = Some(cg);
        }
        Ok(child)
    }
}

/// The child spec of one run of an exec probe, and the launch it was made from: the
/// probe's launch reused while the command resolves as it did (see [`Launch`]).
fn child_spec_reusing(
    task: &ProbeTask,
    spec: &ExecSpec,
    ctx: &ProbeContext,
    env: &child::Env,
    cache: &Mutex<Option<Arc<Launch>>>,
) -> Result<(ChildSpec, Arc<Launch>), SpawnRefused> {
    let creds = ctx
        .supervisor
        .users
        .credentials_for(spec.run_as.as_deref(), &ctx.run_as)?;
    let kept = cache.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (launch, seen) = match kept {
        // Resolved from the config alone: only whether the program is there and runnable
        // is asked again (`resolve::command` asks the same); the script rule takes the
        // program's identity from that answer.
        Some(launch) if launch.fixed => {
            let name = spec.command.first().map_or("", String::as_str);
            let program = &launch.resolved.program;
            let seen = super::security::check_runnable(program, name, &ctx.plugin_dir)?;
            (launch, Some(seen))
        }
        kept => {
            let resolved = super::resolve::command(&ctx.plugin_dir, &spec.command)?;
            log_path_fallback(task, &resolved, &spec.command, ctx);
            let launch = match kept {
                Some(launch) if launch.resolved == resolved => launch,
                _ => {
                    let made =
                        Launch::new(task, spec, ctx, env.clone(), resolved, creds.as_deref());
                    let made = Arc::new(made);
                    *cache.lock().unwrap_or_else(|p| p.into_inner()) = Some(made.clone());
                    made
                }
            };
            (launch, None)
        }
    };
    let child = launch.for_run(task, spec, ctx, creds, seen.as_ref())?;
    Ok((child, launch))
}

/// The argv a child gets: its program and arguments as resolved, for `probe NAME`.
pub fn argv_of(child: &ChildSpec) -> Arc<[String]> {
    std::iter::once(child.program.display().to_string())
        .chain(child.args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect()
}

impl ExecDetail {
    /// Before the child starts: what it will be run with, nothing it did yet.
    pub fn new(argv: Arc<[String]>, user: Arc<str>, env: &child::Env) -> Self {
        Self {
            argv,
            user,
            env: env.clone(),
            exit: None,
            ending: None,
            stdout: Vec::new(),
            stderr: String::new(),
            captured: None,
        }
    }
}

/// The stand-ins' directories of a probe's `capture:`, written on first use (by any probe).
fn stand_in_dirs(spec: &ExecSpec, ctx: &ProbeContext) -> Result<Vec<PathBuf>, CaptureFailure> {
    spec.capture
        .iter()
        .map(|c| ctx.supervisor.stand_ins.dir_for(*c).map_err(Into::into))
        .collect()
}

pub async fn run(
    task: &ProbeTask,
    spec: &ExecSpec,
    ctx: &ProbeContext,
    cache: &super::RunCache,
    started: SystemTime,
) -> ProbeRun {
    let env = &cache.env;
    let t0 = std::time::Instant::now();
    // The environment is made at the first run (the stand-ins' directories with it: once
    // written they stay, so a later run has nothing to ask).
    let env = match env.get() {
        Some(env) => env,
        None => match stand_in_dirs(spec, ctx) {
            Ok(dirs) => env.get_or_init(|| probe_env(task, &ctx.host, &spec.env, &dirs)),
            Err(why) => {
                let why = RunFailure::Capture(why);
                return ProbeRun::all_failed(task, started, t0.elapsed(), Outcome::Failed, why);
            }
        },
    };
    let (child, launch) = match child_spec_reusing(task, spec, ctx, env, &cache.launch) {
        Ok(c) => c,
        Err(e) => {
            let why = RunFailure::Refused(e.into());
            let mut run = ProbeRun::all_failed(task, started, t0.elapsed(), Outcome::Failed, why);
            // Not known: the run was refused before its user was.
            run.exec = Some(ExecDetail::new(
                spec.command.as_slice().into(),
                "".into(),
                env,
            ));
            return run;
        }
    };
    let mut detail = ExecDetail::new(launch.argv.clone(), launch.user.clone(), env);
    let result = child::run(&child).await;
    let mut run = match result {
        Err(e) => {
            let why = RunFailure::Spawn(e.into());
            ProbeRun::all_failed(task, started, t0.elapsed(), Outcome::Failed, why)
        }
        Ok(mut o) => {
            detail.exit = Some(o.exit);
            detail.ending = Some(o.ending.clone());
            detail.stderr = o.stderr_text();
            let captured = o.captured.take().map(|c| {
                let node = ThisNode::new(&ctx.host);
                Report::read(&c.bytes, c.overflowed, &node, &spec.capture)
            });
            let failure = child_ended(&o, spec.format.def().exits).map(|(outcome, mut why)| {
                why.hint = elim_hint(spec, &o);
                (outcome, RunFailure::Ended(why))
            });
            // Calls lost past the cap: the script's last word on its node is not known.
            let failure = failure.or_else(|| {
                captured.as_ref().filter(|c| c.overflowed).map(|_| {
                    let why = CaptureFailure::Overflow(child::CAPTURE_CAP);
                    (Outcome::Failed, RunFailure::Capture(why))
                })
            });
            detail.captured.clone_from(&captured);
            let exit = match o.exit {
                Exit::Code(c) => Some(c),
                _ => None,
            };
            let mut run = match failure {
                Some((outcome, why)) => {
                    ProbeRun::all_failed(task, started, o.duration, outcome, why)
                }
                // A small output is parsed here: the pool's hop would cost more.
                None if o.stdout.len() <= super::INLINE_PARSE_BYTES => {
                    let (mut run, cpu) = super::in_place(|| {
                        let how = (o.duration, exit, captured.as_ref());
                        parse_output(task, spec, started, how, &o.stdout)
                    });
                    run.agent_cpu = cpu;
                    run
                }
                None => {
                    // Large output is parsed off the runtime's threads: megabytes never hold
                    // up the status socket, the link or the other probes.
                    let (t, sp, duration) = (task.clone(), spec.clone(), o.duration);
                    let stdout = std::mem::take(&mut o.stdout);
                    let parsed = super::off_runtime(task.timeout, move || {
                        let how = (duration, exit, captured.as_ref());
                        let run = parse_output(&t, &sp, started, how, &stdout);
                        (run, stdout)
                    })
                    .await;
                    match parsed {
                        Ok(((mut run, stdout), cpu)) => {
                            o.stdout = stdout;
                            run.agent_cpu = cpu;
                            run
                        }
                        Err(why) => {
                            ProbeRun::all_failed(task, started, o.duration, Outcome::TimedOut, why)
                        }
                    }
                }
            };
            detail.stdout = o.stdout;
            run.duration = o.duration;
            run
        }
    };
    run.exec = Some(detail);
    run
}

/// The hook from a finished child to its format's parser: stdout, exit status, what
/// `capture:` captured, and the probe's `select:` give one reading per fed resource.
fn parse_output(
    task: &ProbeTask,
    spec: &ExecSpec,
    started: SystemTime,
    (duration, exit, captured): (Duration, Option<i32>, Option<&Report>),
    stdout: &[u8],
) -> ProbeRun {
    let parsed = match (
        output::parse(spec.format, stdout, exit, &task.name),
        captured,
    ) {
        (Ok(mut parsed), Some(report)) => {
            report.merge_into(&mut parsed);
            Ok(parsed)
        }
        // A script that reports only by its calls (a gmetric script) prints nothing.
        (Err(_), Some(report))
            if report.gives_values() && stdout.iter().all(u8::is_ascii_whitespace) =>
        {
            let mut parsed = output::Parsed::default();
            report.merge_into(&mut parsed);
            Ok(parsed)
        }
        (parsed, _) => parsed,
    };
    match parsed {
        Err(error) => ProbeRun::all_failed(
            task,
            started,
            duration,
            Outcome::Failed,
            RunFailure::Output {
                format: spec.format,
                error,
            },
        ),
        Ok(parsed) => ProbeRun::from_output(
            task,
            started,
            duration,
            (spec.format, &spec.select),
            &parsed,
            &String::from_utf8_lossy(stdout),
        ),
    }
}

/// Why a finished child is a failed run, or `None` when its output should be parsed.
fn child_ended(o: &child::ChildOutcome, exits: output::Exits) -> Option<(Outcome, ChildEnded)> {
    // An exit code the format reads as an answer (a Nagios WARNING, a health check's verdict
    // in ClassAd) is not a failure.
    if let (Ending::Finished, Exit::Code(c)) = (&o.ending, o.exit) {
        if exits.reads(c, &o.stdout) {
            return None;
        }
    }
    if o.succeeded() {
        return None;
    }
    let outcome = if o.ending.is_timeout() {
        Outcome::TimedOut
    } else {
        Outcome::Failed
    };
    let stderr = o.stderr_text();
    let last_stderr = || Some(last_line(&stderr).to_owned());
    let (meaning, said) = match (&o.ending, o.exit) {
        (Ending::Finished, Exit::Code(c)) => {
            // A script that exits non-zero explaining itself on stdout (a Nagios plugin's
            // status line) is heard too.
            let first_stdout = || {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .map(|l| l.chars().take(200).collect::<String>())
            };
            let said = if stderr.is_empty() {
                first_stdout()
            } else {
                last_stderr()
            };
            (exits.meaning(c), said)
        }
        // The cap message stands alone: what the probe wrote to stderr is not why.
        (Ending::OutputOverflow { .. }, _) => (None, None),
        _ if o.exit == Exit::Unreaped => (None, None),
        _ if stderr.is_empty() => (None, None),
        _ => (None, last_stderr()),
    };
    let ended = ChildEnded {
        ending: o.ending.clone(),
        exit: o.exit,
        meaning,
        said,
        hint: None,
    };
    Some((outcome, ended))
}

/// A bare name not in plugin_dir runs what the probes' PATH has under that name: said in the
/// log, once per probe and program, so the program a run used is on record (`check` and
/// `probe NAME` say it too). A run whose program was noted before pays one lookup.
fn log_path_fallback(
    task: &ProbeTask,
    resolved: &super::resolve::Resolved,
    command: &[String],
    ctx: &ProbeContext,
) {
    if resolved.found != super::resolve::Found::ProbePath
        || !ctx
            .supervisor
            .path_notes
            .first(&task.name, &resolved.program)
    {
        return;
    }
    if let Some(note) = command
        .first()
        .and_then(|name| resolved.note(name, &ctx.plugin_dir))
    {
        tracing::info!(probe = %task.name, "{note}");
    }
}

fn elim_hint(spec: &ExecSpec, o: &child::ChildOutcome) -> Option<ElimHint> {
    (spec.format == output::Format::Elim && o.ending.is_timeout()).then(|| ElimHint {
        printed_lines: o.stdout.contains(&b'\n'),
        on_a_pipe: matches!(spec.stdout, crate::config::StdoutMode::Pipe),
    })
}
