//! The probe kinds, declared once: `probe_kinds!` lists each kind (its variant, the name
//! `kind:` says, the function that builds it) and `probe_fields!` lists each `probe:` field
//! with the kinds that take it. `ProbeKind`, `ProbeKind::name`, `RawProbe` and every error
//! text about kinds and fields (unknown kind, near misses, a field another kind owns) are
//! derived from these two tables. The recipe for a new kind is in CONTRIBUTING.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::error::{Errors, Pos};
use super::kind_spec::{Capturer, ExecSpec, FileSpec, Limits, StreamSpec, DEFAULT_FILE_MAX_BYTES};
use super::limits::{
    check_duration, Between, Bound, DECLARED_STATE, FEW_INTERVALS, MAX_AGE, MAX_BYTES, MEMORY,
    OPEN_FILES, PROCESSES, RUN_TIME,
};
use super::names::{field_names, near_miss, Field};
use super::pattern::Pattern;
use super::probe_output::{self, RawCommand, RawSelect};
use super::scalar::{format_size, Scalar};
use super::stdio::{self, StdinMode, StdoutMode};
use crate::output::{Format, Selection};

/// A resource's `probe:`, validated.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    pub pos: Pos,
    pub kind: ProbeKind,
    /// Resources this probe feeds: always includes the resource it is declared on.
    pub provides: Vec<String>,
    pub timeout: Option<Duration>,
    pub stale_after: Option<Duration>,
}

impl ProbeSpec {
    /// Its `timeout:`, else its kind's default at `interval`.
    pub fn timeout_at(&self, interval: Duration) -> Duration {
        self.timeout.unwrap_or_else(|| match self.kind {
            ProbeKind::Stream(_) => default_stream_timeout(interval),
            _ => default_timeout(interval),
        })
    }

    /// Its `stale_after:`, else its kind's default at `interval` and `timeout`: a stream's
    /// is its `silence:` (three intervals without one).
    pub fn stale_after_at(&self, interval: Duration, timeout: Duration) -> Duration {
        match (&self.kind, self.stale_after) {
            (_, Some(s)) => s,
            (ProbeKind::Stream(s), None) => s.silence.unwrap_or(interval.saturating_mul(3)),
            _ => default_stale_after(interval, timeout),
        }
    }
}

/// Longest default timeout: a probe slower than this should say so with `timeout:`.
pub const DEFAULT_TIMEOUT_CAP: Duration = Duration::from_secs(30);

pub fn default_timeout(interval: Duration) -> Duration {
    interval.min(DEFAULT_TIMEOUT_CAP)
}

/// A stream probe's `timeout` is how long `--once` and `probe NAME` wait for its first
/// values. An elim may report only once per interval (IBM's elim.css prints `0` first and
/// its value after 60 s), so the default waits one interval plus an exec probe's default
/// timeout as grace: 60 s -> 90 s, 10 s -> 20 s, 5 m -> 5 m 30 s.
pub fn default_stream_timeout(interval: Duration) -> Duration {
    interval.saturating_add(default_timeout(interval))
}

/// Values of a failed or silent probe are trusted for two intervals plus one timeout.
pub fn default_stale_after(interval: Duration, timeout: Duration) -> Duration {
    interval.saturating_mul(2).saturating_add(timeout)
}

/// Which kinds a `probe:` field belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    Every,
    Only(&'static [&'static str]),
}

impl Takes {
    fn includes(self, kind: &str) -> bool {
        match self {
            Takes::Every => true,
            Takes::Only(kinds) => kinds.contains(&kind),
        }
    }
}

/// `Some` of the expression given, `None` without one.
macro_rules! optional {
    () => {
        None
    };
    ($e:expr) => {
        Some($e)
    };
}

/// Declares `probe:`'s fields: `name: type => the kinds that take it, "doc"` and, for a
/// number, `, its Bound` (the constant its validation checks against). Generates `RawProbe`
/// (every field optional and positioned) and [`FIELDS`], from which "not a field of X probes"
/// is checked. Adding a field to a kind is one line here plus its use in the kind's builder.
macro_rules! probe_fields {
    ($($field:ident: $ty:ty => $takes:expr, $doc:literal $(, $bound:expr)?;)*) => {
        /// `probe:` as written. It is the agent's own field, so it is strict: an unknown key
        /// is an error (with a near miss, from serde's field list).
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawProbe {
            $(pub $field: Option<Spanned<$ty>>,)*
        }

        /// Every `probe:` field and the kinds that take it, in declaration order.
        pub const FIELDS: &[(&str, Takes)] = &[$((stringify!($field), $takes),)*];

        /// Every `probe:` field with one line saying what it is (the man page's) and, for a
        /// number, its bound.
        pub const FIELD_DOCS: &[Field] = &[$(
            Field { name: stringify!($field), doc: $doc, bound: optional!($($bound)?) },
        )*];

        impl RawProbe {
            /// The fields given, each with the kinds that take it and where its value is.
            fn given(&self) -> Vec<(&'static str, Takes, Pos)> {
                let mut out = Vec::new();
                $(
                    if let Some(v) = &self.$field {
                        out.push((stringify!($field), $takes, Pos::of(v)));
                    }
                )*
                out
            }
        }
    };
}

const EXEC_STREAM: Takes = Takes::Only(&["exec", "stream"]);
const EXEC_FILE_STREAM: Takes = Takes::Only(&["exec", "file", "stream"]);

probe_fields! {
    kind: String => Takes::Every, "builtin, exec, file or stream.";
    index: String => Takes::Only(&["builtin"]), "The built-in index to report (default: the resource's name).";
    command: RawCommand => EXEC_STREAM, "The program and its arguments, a list (no shell); a relative program is under plugin_dir, a bare name not there on the probes' PATH.";
    shell: super::shell::RawShell => EXEC_STREAM, "A command line run by /bin/sh -c (pipes, variables), instead of `command`.";
    format: String => EXEC_FILE_STREAM, "How the output is read: value, kv, elim, nagios, prometheus, influx, classad, json, munin, checkmk, collectd, netdata or sge.";
    select: RawSelect => EXEC_FILE_STREAM, "Which sample of a multi-sample output each resource takes.";
    aggregate: String => EXEC_FILE_STREAM, "How several matching samples become one value.";
    env: BTreeMap<String, String> => EXEC_STREAM, "Environment variables for the program (the environment is otherwise cleared).";
    run_as: String => EXEC_FILE_STREAM, "The user to run or read as, instead of agent.yaml's run_as.";
    limits: RawLimits => EXEC_STREAM, "Resource limits of each run (fields below).";
    no_new_privs: bool => EXEC_STREAM, "false: allow setuid helpers (PR_SET_NO_NEW_PRIVS is set by default).";
    stdout: String => EXEC_STREAM, "pipe (default) or pty: how the program's standard output is connected.";
    capture: Vec<Spanned<String>> => Takes::Only(&["exec"]), "Commands whose calls become values instead of reaching the real command: node_state (scontrol update State=..., pbsnodes -o/-c/-r: the `ok` and `reason` samples), gmetric (a sample per gmetric -n NAME -v VALUE).";
    trusted: String => EXEC_STREAM, "Why this probe's program text (a `shell:` line; `sh -c`, `env -S`, awk, sed, `find -exec`, xargs in `command:`) may run as root: the script rule cannot prove text safe by reading it, and refuses it as root without this reason.";
    timeout: Scalar => Takes::Every, "How long a run may take, a duration (default: min(interval, 30s)).", Bound::Duration(RUN_TIME);
    provides: Vec<Spanned<String>> => EXEC_FILE_STREAM, "Other resources this probe's output feeds, each declared with its own resourcemap: a shared one is reported only by the host its resourcemap designates (the others drop its value).";
    path: String => Takes::Only(&["file"]), "The absolute path of the file to read.";
    regex: String => Takes::Only(&["file"]), "A regular expression whose first group is the value.";
    max_age: Scalar => Takes::Only(&["file"]), "A file not modified for this long is a failure, a duration.", Bound::Duration(MAX_AGE);
    max_bytes: Scalar => Takes::Only(&["file"]), "How much of the file is read at most, a size.", Bound::Size(MAX_BYTES);
    silence: Scalar => Takes::Only(&["stream"]), "A stream silent this long has stale values, a duration.", Bound::Duration(FEW_INTERVALS);
    restart_on_silence: bool => Takes::Only(&["stream"]), "true: restart a stream that stays silent past `silence`.";
    stdin: String => Takes::Only(&["stream"]), "none (default; signal for format: sge) or signal: what the stream's standard input is.";
    declared_state: Scalar => Takes::Only(&["stream"]), "What the agent may keep of what the stream declares (Netdata charts and dimensions, names), a size (default 2MiB); past it new declarations are dropped, with one warning.", Bound::Size(DECLARED_STATE);
    stale_after: Scalar => Takes::Every, "How long a failed probe keeps its last good value, a duration (default: 2 intervals + timeout).", Bound::Duration(FEW_INTERVALS);
}

/// `limits:`'s fields, in [`RawLimits`]'s order.
pub const LIMIT_FIELD_DOCS: &[Field] = &[
    Field::new("cpu", "CPU time of one run, a duration (RLIMIT_CPU).")
        .bounded(Bound::Duration(RUN_TIME)),
    Field::new(
        "address_space",
        "Virtual memory of each process, a size (RLIMIT_AS).",
    )
    .bounded(Bound::Size(MEMORY)),
    Field::new("open_files", "Open files of each process (RLIMIT_NOFILE).")
        .bounded(Bound::Count(OPEN_FILES)),
    Field::new("processes", "Processes of the run's user (RLIMIT_NPROC).")
        .bounded(Bound::Count(PROCESSES)),
    Field::new("memory", "memory.max of the probe's cgroup, a size.").bounded(Bound::Size(MEMORY)),
    Field::new(
        "pids",
        "pids.max of the probe's cgroup (default agent.yaml's probe_pids_max).",
    )
    .bounded(Bound::Count(PROCESSES)),
];

/// The fields serde reads from `limits:`.
pub fn parsed_limit_fields() -> &'static [&'static str] {
    field_names::<RawLimits>()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub cpu: Option<Spanned<Scalar>>,
    pub address_space: Option<Spanned<Scalar>>,
    pub open_files: Option<Spanned<Scalar>>,
    pub processes: Option<Spanned<Scalar>>,
    pub memory: Option<Spanned<Scalar>>,
    pub pids: Option<Spanned<Scalar>>,
}

/// What a kind's builder is given besides the raw fields.
pub struct KindInput<'a> {
    /// Where `probe:` is: for errors about a missing field.
    pub pos: Pos,
    /// The resource the probe is declared on.
    pub resource: &'a str,
    /// Every resource the probe feeds, its own first.
    pub provides: &'a [String],
}

/// One kind's entry in the table.
pub struct KindDef {
    pub name: &'static str,
    build: fn(&mut Errors, &RawProbe, &KindInput) -> Option<ProbeKind>,
}

/// Declares the kinds: `Variant(what it carries) => "name", builder;`. Generates the
/// `ProbeKind` enum, `ProbeKind::name` and [`KINDS`].
macro_rules! probe_kinds {
    ($($(#[$doc:meta])* $variant:ident $body:tt => $name:literal, $build:path;)*) => {
        /// How a probe gets its value(s). Compared by value: a reload restarts a probe only
        /// when its task changed.
        #[derive(Debug, Clone, PartialEq)]
        pub enum ProbeKind {
            $($(#[$doc])* $variant $body,)*
        }

        impl ProbeKind {
            pub fn name(&self) -> &'static str {
                match self {
                    $(ProbeKind::$variant { .. } => $name,)*
                }
            }
        }

        /// Every kind, in the order the errors list them.
        pub const KINDS: &[KindDef] = &[$(KindDef { name: $name, build: $build },)*];
    };
}

probe_kinds! {
    /// One of the shared sampler's indices (`index:`, default the resource's name).
    Builtin { index: String } => "builtin", builtin;
    /// A program run on every interval.
    Exec(ExecSpec) => "exec", exec;
    /// A bounded read of a file.
    File(FileSpec) => "file", file;
    /// A long-running program (an LSF elim) read line by line.
    Stream(StreamSpec) => "stream", stream;
}

/// How a probe's failed runs are logged (`probe::sink`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureLog {
    /// Each bad update, under the malformed lines' rate limit: a stream may print a new bad
    /// value every millisecond.
    RateLimited,
    /// A run's failure when it is not the one the resource already has: a broken probe
    /// does not write the same line every interval.
    WhenChanged,
}

impl ProbeKind {
    /// How this kind's failed runs are logged.
    pub fn failure_log(&self) -> FailureLog {
        match self {
            ProbeKind::Stream(_) => FailureLog::RateLimited,
            _ => FailureLog::WhenChanged,
        }
    }

    /// The bytes of state the probe may declare (a stream's `declared_state:`; the default
    /// for the others).
    pub fn declared_state_budget(&self) -> usize {
        match self {
            ProbeKind::Stream(spec) => spec.declared_state,
            _ => crate::output::DECLARED_STATE_BYTES,
        }
    }

    /// The program and how its output is read, for the kinds that run one.
    pub fn exec_spec(&self) -> Option<&ExecSpec> {
        match self {
            ProbeKind::Exec(e) => Some(e),
            ProbeKind::Stream(s) => Some(&s.exec),
            _ => None,
        }
    }

    pub fn exec_spec_mut(&mut self) -> Option<&mut ExecSpec> {
        match self {
            ProbeKind::Exec(e) => Some(e),
            ProbeKind::Stream(s) => Some(&mut s.exec),
            _ => None,
        }
    }

    /// One line saying what the probe reads, for `check`'s plan.
    pub fn summary(&self) -> String {
        match self {
            ProbeKind::Builtin { index } => format!("builtin {index}"),
            ProbeKind::Exec(e) => format!("exec {}", describe_exec(e)),
            ProbeKind::File(f) => match f.format {
                Some(format) => format!("file {} ({})", f.path.display(), format.as_str()),
                None => format!("file {}", f.path.display()),
            },
            ProbeKind::Stream(s) => {
                let mut out = format!("stream {}", describe_exec(&s.exec));
                if s.stdin != StdinMode::None {
                    out.push_str(&format!(" stdin {}", s.stdin.as_str()));
                }
                out
            }
        }
    }

    /// `probe NAME`'s lines about what the kind reads (a program's are written by the
    /// program's own section).
    pub fn details(&self) -> Vec<(&'static str, String)> {
        match self {
            ProbeKind::Builtin { index } => vec![(
                "index",
                format!("{index} (from the agent's shared sampler)"),
            )],
            ProbeKind::File(f) => {
                let mut out = vec![("path", f.path.display().to_string())];
                if let Some(format) = f.format {
                    out.push(("format", format.as_str().to_owned()));
                }
                if let Some(re) = &f.regex {
                    out.push(("regex", re.as_str().to_owned()));
                }
                out
            }
            ProbeKind::Exec(_) | ProbeKind::Stream(_) => Vec::new(),
        }
    }
}

/// The argv as the child gets it (a string `command:` after splitting), the format and
/// what `select:` picks.
fn describe_exec(e: &ExecSpec) -> String {
    let mut out = match e.shell {
        true => format!(
            "shell {} -c {:?} ({})",
            super::kind_spec::SHELL,
            e.command.get(2).map_or("", String::as_str),
            e.format.as_str()
        ),
        false => format!("argv {:?} ({})", e.command, e.format.as_str()),
    };
    if e.stdout != StdoutMode::Pipe {
        out.push_str(&format!(" stdout {}", e.stdout.as_str()));
    }
    for (resource, pick) in &e.select.picks {
        if let Some(sel) = &pick.selector {
            out.push_str(&format!(" {resource}<-{sel}"));
        }
    }
    if !e.capture.is_empty() {
        let names: Vec<&str> = e.capture.iter().map(|c| c.name()).collect();
        out.push_str(&format!(" capture {}", names.join(",")));
    }
    out
}

/// `a, b or c`.
fn or_list(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Every kind's name, as `kind:` takes them.
pub fn kind_names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

/// The fields a kind takes, in declaration order (for docs and completions).
pub fn fields_of(kind: &str) -> Vec<&'static str> {
    FIELDS
        .iter()
        .filter(|(_, takes)| takes.includes(kind))
        .map(|(name, _)| *name)
        .collect()
}

/// `probe:` validated: its kind known, every field one its kind takes, the kind's own
/// fields built. Errors go to `errs`; `None` when there was any.
pub fn probe(errs: &mut Errors, p: &Spanned<RawProbe>, resource: &str) -> Option<ProbeSpec> {
    let raw = &p.value;
    let pos = Pos::of(p);
    let expected = || format!("expected one of {}", kind_names().join(", "));
    let Some(kind) = &raw.kind else {
        errs.at(pos, format!("probe has no `kind`; {}", expected()));
        return None;
    };
    let Some(def) = KINDS.iter().find(|k| k.name == kind.value) else {
        let mut message = format!("unknown probe kind {:?}; {}", kind.value, expected());
        if let Some(known) = near_miss(&kind.value, &kind_names()) {
            message.push_str(&format!("; did you mean `{known}`?"));
        }
        errs.at(Pos::of(kind), message);
        return None;
    };
    let before = errs.list.len();
    for (field, takes, at) in raw.given() {
        if !takes.includes(def.name) {
            errs.at(
                at,
                format!("`{field}` is not a field of {} probes", def.name),
            );
        }
    }
    let timeout = duration_field(errs, &raw.timeout, "timeout", RUN_TIME);
    let stale_after = duration_field(errs, &raw.stale_after, "stale_after", FEW_INTERVALS);
    let mut provides = vec![resource.to_owned()];
    if let Some(list) = &raw.provides {
        for p in &list.value {
            if !provides.contains(&p.value) {
                provides.push(p.value.clone());
            }
        }
    }
    let input = KindInput {
        pos,
        resource,
        provides: &provides,
    };
    let kind = (def.build)(errs, raw, &input)?;
    if errs.list.len() > before {
        return None;
    }
    Some(ProbeSpec {
        pos,
        kind,
        provides,
        timeout,
        stale_after,
    })
}

fn builtin(_: &mut Errors, raw: &RawProbe, input: &KindInput) -> Option<ProbeKind> {
    let index = raw.index.as_ref().map_or(input.resource, |i| &i.value);
    Some(ProbeKind::Builtin {
        index: index.to_owned(),
    })
}

fn exec(errs: &mut Errors, raw: &RawProbe, input: &KindInput) -> Option<ProbeKind> {
    exec_spec(errs, raw, input).map(ProbeKind::Exec)
}

/// A stream probe reads its output as it comes: only the formats the table says stream.
fn stream(errs: &mut Errors, raw: &RawProbe, input: &KindInput) -> Option<ProbeKind> {
    let exec = exec_spec(errs, raw, input)?;
    if !exec.format.def().stream.reads() {
        errs.at(
            raw.format.as_ref().map_or(input.pos, Pos::of),
            format!(
                "format {} is read from a finished run: use it with `kind: exec`; stream probes read {}",
                exec.format.as_str(),
                or_list(&Format::stream_names())
            ),
        );
    }
    Some(ProbeKind::Stream(StreamSpec {
        silence: duration_field(errs, &raw.silence, "silence", FEW_INTERVALS),
        restart_on_silence: raw.restart_on_silence.as_ref().is_some_and(|b| b.value),
        declared_state: declared_state(errs, &raw.declared_state),
        // A Grid Engine load sensor waits for its newline: `format: sge` needs nothing else.
        stdin: match &raw.stdin {
            None if exec.format.def().stream.asked_on_stdin() => StdinMode::Signal,
            given => stdio::stdin(errs, given.as_ref()),
        },
        exec,
    }))
}

fn exec_spec(errs: &mut Errors, raw: &RawProbe, input: &KindInput) -> Option<ExecSpec> {
    let pos = input.pos;
    let command = super::shell::argv(errs, (&raw.command, &raw.shell), pos)?;
    let format = probe_output::format(errs, raw.format.as_ref());
    let select = probe_output::selection(
        errs,
        format,
        raw.select.as_ref(),
        raw.aggregate.as_ref(),
        input.provides,
    );
    let env = raw
        .env
        .as_ref()
        .map(|e| e.value.clone())
        .unwrap_or_default();
    for key in env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            errs.at(
                raw.env.as_ref().map(Pos::of).unwrap_or(pos),
                format!("bad environment variable name {key:?}"),
            );
        }
    }
    Some(ExecSpec {
        shell: raw.shell.is_some(),
        command,
        format,
        select,
        env,
        run_as: raw.run_as.as_ref().map(|r| r.value.clone()),
        limits: limits(errs, raw.limits.as_ref()),
        no_new_privs: raw.no_new_privs.as_ref().is_none_or(|b| b.value),
        stdout: stdio::stdout(errs, raw.stdout.as_ref()),
        trusted: trusted(errs, raw.trusted.as_ref()),
        capture: capture(errs, raw.capture.as_ref(), format, input.provides),
    })
}

/// `capture:`, a list of [`Capturer`] names; an unknown one is an error at its position,
/// with the near miss. `node_state` gives the samples `ok` and `reason`: a format without
/// `select:` feeds them only to resources of those names, so it needs one.
fn capture(
    errs: &mut Errors,
    given: Option<&Spanned<Vec<Spanned<String>>>>,
    format: Format,
    provides: &[String],
) -> Vec<Capturer> {
    let mut out = Vec::new();
    for name in given.map_or(&[][..], |g| &g.value[..]) {
        match Capturer::from_name(&name.value) {
            Some(c) if !out.contains(&c) => out.push(c),
            Some(_) => {}
            None => {
                let known = Capturer::names();
                let mut message = format!(
                    "unknown capture {:?}; expected {}",
                    name.value,
                    or_list(&known)
                );
                if let Some(near) = near_miss(&name.value, &known) {
                    message.push_str(&format!("; did you mean `{near}`?"));
                }
                errs.at(Pos::of(name), message);
            }
        }
    }
    out.sort();
    let by_name = ["ok", "reason"]
        .iter()
        .any(|n| provides.iter().any(|p| p == n));
    if let (Some(given), true) = (given, out.contains(&Capturer::NodeState)) {
        if !format.selectable() && !by_name {
            errs.at(
                Pos::of(given),
                format!(
                    "capture node_state gives the samples `ok` and `reason`, which format {} feeds only to resources of those names: use a format that takes `select:` (a health check that exits 0 when well: format: nagios, select: {{RESOURCE: ok}})",
                    format.as_str()
                ),
            );
        }
    }
    out
}

/// `trusted:`, the admin's reason for running program text as root: a reason is required,
/// since `check` prints it beside every trusted line.
fn trusted(errs: &mut Errors, given: Option<&Spanned<String>>) -> Option<String> {
    let given = given?;
    let reason = given.value.trim();
    if reason.is_empty() {
        errs.at(
            Pos::of(given),
            "`trusted` is empty: write why this probe's program text may run as root (e.g. trusted: \"root-only pipeline, reviewed\"); `check` prints it beside the line",
        );
        return None;
    }
    Some(reason.to_owned())
}

fn file(errs: &mut Errors, raw: &RawProbe, input: &KindInput) -> Option<ProbeKind> {
    let Some(path) = &raw.path else {
        errs.at(input.pos, "file probes need `path`");
        return None;
    };
    if !path.value.starts_with('/') {
        errs.at(
            Pos::of(path),
            format!("file probe path {:?} must be absolute", path.value),
        );
    }
    let regex = raw
        .regex
        .as_ref()
        .and_then(|r| match compile_shared(&r.value) {
            Ok(re) => Some(re),
            Err(e) => {
                errs.at(
                    Pos::of(r),
                    format!("bad regex: {}", e.to_string().replace('\n', " ")),
                );
                None
            }
        });
    let max_bytes = match &raw.max_bytes {
        None => DEFAULT_FILE_MAX_BYTES,
        Some(m) => match m.value.to_bytes() {
            Ok(b) if MAX_BYTES.contains(&b) => b,
            Ok(_) => {
                errs.at(
                    Pos::of(m),
                    format!(
                        "max_bytes must be between {} and {}",
                        format_size(MAX_BYTES.min),
                        format_size(MAX_BYTES.max)
                    ),
                );
                DEFAULT_FILE_MAX_BYTES
            }
            Err(e) => {
                errs.at(Pos::of(m), e);
                DEFAULT_FILE_MAX_BYTES
            }
        },
    };
    let (format, select) = file_format(errs, raw, input.provides);
    Some(ProbeKind::File(FileSpec {
        path: PathBuf::from(&path.value),
        regex,
        format,
        select,
        max_age: duration_field(errs, &raw.max_age, "max_age", MAX_AGE),
        max_bytes,
        run_as: raw.run_as.as_ref().map(|r| r.value.clone()),
    }))
}

/// A file probe's `format:` (optional: without it the file is one value) and `select:`.
/// Several resources (`provides:`) need a format to tell them apart.
fn file_format(
    errs: &mut Errors,
    raw: &RawProbe,
    provides: &[String],
) -> (Option<Format>, Selection) {
    let Some(field) = &raw.format else {
        if let Some(p) = &raw.provides {
            // Every format but `value` gives several values; those that read an exit status
            // do not apply to a file.
            let several: Vec<&str> = Format::ALL
                .iter()
                .filter(|f| **f != Format::Value && !f.def().exits.needs_a_status())
                .map(|f| f.as_str())
                .collect();
            errs.at(
                Pos::of(p),
                format!(
                    "a file probe feeds several resources only with a `format:` ({})",
                    several.join(", ")
                ),
            );
        }
        let select = probe_output::selection(
            errs,
            Format::Value,
            raw.select.as_ref(),
            raw.aggregate.as_ref(),
            provides,
        );
        return (None, select);
    };
    let f = probe_output::format(errs, Some(field));
    if f.def().exits.needs_a_status() {
        errs.at(
            Pos::of(field),
            format!(
                "format {} reads an exit status; a file has none",
                f.as_str()
            ),
        );
    }
    if let Some(r) = &raw.regex {
        errs.at(
            Pos::of(r),
            "`regex` and `format` do not go together: the format already says where the values are",
        );
    }
    let select = probe_output::selection(
        errs,
        f,
        raw.select.as_ref(),
        raw.aggregate.as_ref(),
        provides,
    );
    (Some(f), select)
}

/// A duration within `bound`; every probe duration's is above 0 (whole seconds).
fn duration_field(
    errs: &mut Errors,
    f: &Option<Spanned<Scalar>>,
    what: &str,
    bound: Between<Duration>,
) -> Option<Duration> {
    let f = f.as_ref()?;
    match f.value.to_duration() {
        Ok(d) if d < bound.min => {
            errs.at(Pos::of(f), format!("{what} must be greater than 0"));
            None
        }
        Ok(d) => check_duration(what, d, bound.max)
            .map_err(|e| errs.at(Pos::of(f), e))
            .ok(),
        Err(e) => {
            errs.at(Pos::of(f), format!("bad {what}: {e}"));
            None
        }
    }
}

/// A stream's `declared_state`, within [`DECLARED_STATE`]; the default when absent (or
/// wrong: the error is said).
fn declared_state(errs: &mut Errors, f: &Option<Spanned<Scalar>>) -> usize {
    let default = crate::output::DECLARED_STATE_BYTES;
    let Some(f) = f else {
        return default;
    };
    match f.value.to_bytes() {
        Ok(b) if DECLARED_STATE.contains(&b) => usize::try_from(b).unwrap_or(default),
        Ok(_) => {
            errs.at(
                Pos::of(f),
                format!(
                    "declared_state must be between {} and {}",
                    format_size(DECLARED_STATE.min),
                    format_size(DECLARED_STATE.max)
                ),
            );
            default
        }
        Err(e) => {
            errs.at(Pos::of(f), e);
            default
        }
    }
}

fn limits(errs: &mut Errors, raw: Option<&Spanned<RawLimits>>) -> Limits {
    let Some(raw) = raw else {
        return Limits::default();
    };
    let l = &raw.value;
    // Sizes and counts: the field's bound says which it is.
    let mut count = |f: &Option<Spanned<Scalar>>, field: &str, bound: Bound| {
        let f = f.as_ref()?;
        let (r, bound) = match bound {
            Bound::Size(b) => (f.value.to_bytes(), b),
            Bound::Count(b) => (f.value.to_count(), b),
            // `cpu`, the one duration here, is read by duration_field.
            Bound::Duration(_) | Bound::Interval(_) => return None,
        };
        let r = r.map_err(|e| e.to_string());
        r.and_then(|n| {
            bound
                .contains(&n)
                .then_some(n)
                .ok_or_else(|| format!("{field} {n} is larger than the limit of {}", bound.max))
        })
        .map_err(|e| errs.at(Pos::of(f), e))
        .ok()
    };
    let address_space = count(&l.address_space, "address_space", Bound::Size(MEMORY));
    let open_files = count(&l.open_files, "open_files", Bound::Count(OPEN_FILES));
    let processes = count(&l.processes, "processes", Bound::Count(PROCESSES));
    let memory = count(&l.memory, "memory", Bound::Size(MEMORY));
    let pids = count(&l.pids, "pids", Bound::Count(PROCESSES));
    Limits {
        cpu: duration_field(errs, &l.cpu, "cpu limit", RUN_TIME),
        address_space,
        open_files,
        processes,
        memory,
        pids,
    }
}

thread_local! {
    /// Patterns compiled during one `parse`: a compiled regex with its match cache costs
    /// tens of KiB, and a file with thousands of resources often repeats one pattern.
    static REGEXES: std::cell::RefCell<BTreeMap<String, Pattern>> = Default::default();
}

fn compile_shared(pattern: &str) -> Result<Pattern, regex::Error> {
    REGEXES.with(|cache| {
        if let Some(re) = cache.borrow().get(pattern) {
            return Ok(re.clone());
        }
        let re = Pattern::new(pattern)?;
        cache.borrow_mut().insert(pattern.to_owned(), re.clone());
        Ok(re)
    })
}

/// Drop the patterns of the `parse` that just ended: the next file shares nothing with it.
pub fn forget_compiled_patterns() {
    REGEXES.with(|cache| cache.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::config::names::names_of;

    #[test]
    fn every_kind_a_field_names_is_declared_once() {
        let names = kind_names();
        let unique: BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for (field, takes) in FIELDS {
            if let Takes::Only(kinds) = takes {
                for kind in *kinds {
                    assert!(names.contains(kind), "`{field}` names unknown kind {kind}");
                }
            }
        }
    }

    #[test]
    fn the_limit_docs_are_the_struct_serde_reads() {
        assert_eq!(names_of(LIMIT_FIELD_DOCS), parsed_limit_fields());
    }

    #[test]
    fn the_field_table_is_the_struct_serde_reads() {
        let from_serde = field_names::<RawProbe>();
        let from_table: Vec<&str> = FIELDS.iter().map(|(f, _)| *f).collect();
        assert_eq!(from_serde, from_table.as_slice());
    }

    #[test]
    fn each_kind_takes_its_own_fields_and_the_common_ones() {
        assert_eq!(
            fields_of("builtin"),
            ["kind", "index", "timeout", "stale_after"]
        );
        assert_eq!(
            fields_of("stream"),
            [
                "kind",
                "command",
                "shell",
                "format",
                "select",
                "aggregate",
                "env",
                "run_as",
                "limits",
                "no_new_privs",
                "stdout",
                "trusted",
                "timeout",
                "provides",
                "silence",
                "restart_on_silence",
                "stdin",
                "declared_state",
                "stale_after"
            ]
        );
        assert!(fields_of("file").contains(&"max_age"));
        assert!(!fields_of("file").contains(&"command"));
    }
}
