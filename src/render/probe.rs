//! What `xce-agent probe NAME` prints: everything an admin needs to see why a probe does or
//! does not work: argv, user, environment, cwd, the script check, how it ended, duration,
//! its output, and the values parsed or the exact parse error. [`crate::cmd::probe`]
//! gathers it.

use std::fmt::Write as _;
use std::path::PathBuf;

use nix::unistd::{Gid, Uid};

use crate::config::{ExecSpec, ProbeKind};
use crate::output::Parsed;
use crate::plan::ProbeTask;
use crate::probe::cgroup::Usage;
use crate::probe::child::{Credentials, Ending, Exit, UserError, DEFAULT_STDOUT_CAP};
use crate::probe::exec::ExecDetail;
use crate::probe::security::Verdict;
use crate::probe::ProbeRun;
use crate::text::escape;
use crate::value::Reading;

/// Shown bytes of stdout/stderr at most (the agent's caps are larger; this is a terminal).
const SHOW_MAX: usize = DEFAULT_STDOUT_CAP;

/// One run of one probe, and what was known about it before the run.
pub struct ProbeDebug<'a> {
    pub task: &'a ProbeTask,
    pub host: &'a str,
    /// Exec and stream probes: who runs the program and whether it passes the script check.
    pub exec: Option<ExecFacts<'a>>,
    /// A stream's run ends at its first values.
    pub run: ProbeRun,
    /// Exec and stream probes: where the run was contained.
    pub containment: Option<Containment>,
    /// What the format's parser found, for the formats where `select:` chooses among samples.
    pub parsed: Option<Parsed>,
}

pub struct ExecFacts<'a> {
    pub spec: &'a ExecSpec,
    pub user: Result<RunsAs, UserError>,
    pub verdict: Verdict,
    /// Where a bare program name was found, when not in plugin_dir.
    pub found: Option<String>,
}

/// Who the program runs as.
pub enum RunsAs {
    /// `run_as` (a root agent switches to it).
    User(Credentials),
    /// The agent's own user: it is not root, or `run_as: root`.
    Agent {
        name: String,
        uid: Uid,
        gid: Gid,
        groups: Vec<Gid>,
    },
}

pub enum Containment {
    /// No cgroup tree: the process group only.
    ProcessGroup,
    /// A tree, but the run did not start.
    NotStarted,
    Cgroup {
        path: PathBuf,
        usage: Usage,
    },
}

/// A probe's stdout or stderr as indented lines, each escaped ([`crate::text::escape`]):
/// control characters, terminal escapes (clipboard, title, clear screen) and bidi overrides
/// written out, bytes that are not UTF-8 as `\xNN`. What a probe prints never acts on the
/// terminal that shows it.
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(SHOW_MAX)];
    let cut = cut.strip_suffix(b"\n").unwrap_or(cut);
    let mut out = String::new();
    if !cut.is_empty() {
        for line in cut.split(|&b| b == b'\n') {
            out.push_str("    | ");
            for chunk in line.utf8_chunks() {
                out.push_str(&escape(chunk.valid()));
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out.push('\n');
        }
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

fn user_line(user: &Result<RunsAs, UserError>) -> String {
    let groups = |gs: &[Gid]| {
        gs.iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    match user {
        Err(e) => format!("cannot resolve: {e}"),
        Ok(RunsAs::User(c)) => format!(
            "{} (uid {}, gid {}, groups {})",
            c.user,
            c.uid,
            c.gid,
            groups(&c.groups)
        ),
        Ok(RunsAs::Agent {
            name,
            uid,
            gid,
            groups: gs,
        }) => {
            let why = if uid.is_root() {
                "run_as: root"
            } else {
                "the agent is not root: probes run as the agent's user"
            };
            format!(
                "{name} (uid {uid}, gid {gid}, groups {}) — {why}",
                groups(gs)
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

impl ProbeDebug<'_> {
    /// The probe succeeded (`ProbeRun::succeeded`): `probe NAME` exits by it.
    pub fn ok(&self) -> bool {
        self.run.succeeded()
    }

    /// The report, in the order things happen: the probe, who runs it, the run, the values.
    pub fn text(&self) -> String {
        let task = self.task;
        let run = &self.run;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "probe {} (kind {}) on {}",
            task.name,
            task.kind.name(),
            self.host
        );
        if !task.instance.is_empty() {
            let _ = writeln!(t, "  instance:  {}", escape(&task.instance));
        }
        let feeds: Vec<String> = task
            .feeds
            .iter()
            .map(|f| match f.instance.as_str() {
                // A feed of another instance than the probe's says which.
                i if i != task.instance && !i.is_empty() => {
                    format!("{} ({}) [{}]", f.name, f.valtype.as_str(), escape(i))
                }
                _ => format!("{} ({})", f.name, f.valtype.as_str()),
            })
            .collect();
        let _ = writeln!(t, "  feeds:     {}", feeds.join(", "));
        if !task.dropped.is_empty() {
            // Another host reports their instance (`check` says which).
            let _ = writeln!(
                t,
                "  drops:     {} (reported by another host)",
                task.dropped.join(", ")
            );
        }
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
        if let Some(exec) = &self.exec {
            if exec.spec.shell {
                let _ = writeln!(
                    t,
                    "  shell:     {} -c runs the `shell:` line (as the user below)",
                    crate::config::kind_spec::SHELL
                );
            }
            if let Some(found) = &exec.found {
                let _ = writeln!(t, "  program:   {}", escape(found));
            }
            let _ = writeln!(t, "  user:      {}", user_line(&exec.user));
            let _ = writeln!(t, "  cwd:       /");
            let _ = writeln!(t, "  format:    {}", exec.spec.format.as_str());
            let stdin = match &task.kind {
                ProbeKind::Stream(s) => s.stdin.as_str(),
                _ => "none",
            };
            let _ = writeln!(
                t,
                "  stdout:    {}   stdin: {stdin}",
                exec.spec.stdout.as_str()
            );
            let _ = writeln!(t, "  script check: {}", verdict_text(&exec.verdict));
        }
        if let Some(d) = &run.exec {
            let _ = writeln!(t, "  argv:      {}", escape(&shell_words(&d.argv)));
            let _ = writeln!(t, "  env:");
            for (k, v) in d.env.pairs() {
                let _ = writeln!(t, "    {}={}", escape(k), escape(v));
            }
            let _ = writeln!(t, "  ended:     {}", exit_line(d));
        }
        let _ = writeln!(t, "  duration:  {:.3}s", run.duration.as_secs_f64());
        if let Some(containment) = &self.containment {
            let _ = writeln!(t, "  {}", containment_line(containment));
        }
        if let Some(d) = &run.exec {
            let _ = writeln!(t, "  stdout ({} bytes):", d.stdout.len());
            t.push_str(&shown(&d.stdout));
            let _ = writeln!(t, "  stderr (tail):");
            t.push_str(&shown(d.stderr.as_bytes()));
            if let Some(report) = &d.captured {
                t.push_str(&captured_calls(report));
            }
        }
        if let Some(parsed) = &self.parsed {
            t.push_str(&parsed_samples(parsed));
        }
        for bad in &run.bad_lines {
            let _ = writeln!(t, "  did not parse: {}", escape(bad));
        }
        let _ = writeln!(t, "  values:");
        for (name, r) in &run.readings {
            let line = match r {
                Reading::Ok(v) => v.exact(),
                Reading::Failed(e) => format!("FAILED: {e}"),
                Reading::Stale(e) => format!("STALE: {e}"),
                Reading::Pending(e) => format!("not reported: {e}"),
            };
            let _ = writeln!(t, "    {} = {}", escape(name), escape(&line));
        }
        for name in &run.unexpected {
            let _ = writeln!(
                t,
                "    (ignored: {} is not in this probe's provides)",
                escape(name)
            );
        }
        if run.unexpected_more > 0 {
            let _ = writeln!(
                t,
                "    (ignored: {} more names not in this probe's provides)",
                run.unexpected_more
            );
        }
        let result = if self.ok() {
            "ok".to_owned()
        } else {
            format!(
                "{}: {}",
                run.outcome.as_str(),
                run.error().as_deref().unwrap_or("failed")
            )
        };
        let _ = writeln!(t, "result: {}", escape(&result));
        t
    }
}

fn verdict_text(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Ok => "ok".to_owned(),
        Verdict::Problem(e) => format!("PROBLEM: {e}"),
        Verdict::Refused(e) => format!("REFUSED: {e}"),
        Verdict::Unenforced(e) => format!("not enforced (the agent is not root); as root: {e}"),
    }
}

/// `capture:`'s calls, each with what it did.
fn captured_calls(report: &crate::probe::capture::Report) -> String {
    use crate::probe::capture::Effect;
    let mut t = String::new();
    let all = report.calls.len() + report.more_calls;
    let _ = writeln!(t, "  captured ({all} calls):");
    for (call, effect) in &report.calls {
        let did = match effect {
            Effect::State(s) => format!("ok={} reason={}", s.ok, s.reason),
            Effect::Sample { name, value } => format!("{name}={value}"),
            Effect::Ignored(why) => format!("ignored: {why}"),
        };
        let _ = writeln!(t, "    {}  -> {}", escape(&call.to_string()), escape(&did));
    }
    if report.more_calls > 0 {
        let _ = writeln!(t, "    … ({} more)", report.more_calls);
    }
    if report.malformed {
        let _ = writeln!(
            t,
            "    (the pipe also held bytes that are not a stand-in's record: did the script write on descriptor {}?)",
            crate::probe::child::CAPTURE_FD
        );
    }
    if report.overflowed {
        let _ = writeln!(
            t,
            "    (more than {} bytes: the later calls were lost)",
            crate::probe::child::CAPTURE_CAP
        );
    }
    t
}

/// Most samples listed under `parsed:` (a node_exporter textfile can hold thousands).
const SHOW_SAMPLES: usize = 40;

/// What the format's parser found in the output (perfdata, metrics, fields, attributes).
fn parsed_samples(parsed: &Parsed) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "  parsed ({} samples):", parsed.samples.len());
    for s in parsed.samples.iter().take(SHOW_SAMPLES) {
        let _ = writeln!(t, "    {} = {}", escape(&s.key()), escape(&s.value));
    }
    if parsed.samples.len() > SHOW_SAMPLES {
        let _ = writeln!(t, "    … ({} more)", parsed.samples.len() - SHOW_SAMPLES);
    }
    t
}

/// Where the run was contained and what its cgroup used.
fn containment_line(containment: &Containment) -> String {
    match containment {
        Containment::ProcessGroup => "cgroup:    none (contained by process group only)".to_owned(),
        Containment::NotStarted => "cgroup:    none (the run did not start)".to_owned(),
        Containment::Cgroup { path, usage } => {
            let peak = usage.peak_memory.map_or_else(
                || "peak memory not counted (no memory controller)".to_owned(),
                |b| format!("peak memory {} KiB", b / 1024),
            );
            format!(
                "cgroup:    {} (cpu {:.3}s, {peak})",
                path.display(),
                usage.cpu.as_secs_f64()
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
