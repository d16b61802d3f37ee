//! `capture:`: scripts that report by calling a command. A Slurm health check drains its
//! node with `scontrol update NodeName=... State=DRAIN Reason=...` and exits 0; a PBS one
//! calls `pbsnodes -o -C reason`; a Ganglia one calls `gmetric -n NAME -v VALUE`. The agent
//! puts stand-ins of those commands first on the probe's PATH ([`stand_ins`]); each call the
//! stand-ins capture is a record on the run's capture pipe (`child::capture`), never a call
//! of the real command, and becomes samples of the run here:
//!
//! - `node_state`: the last state call of the run decides `ok` (a drain, down, fail or
//!   offline: `false`; a resume, idle, undrain or clear: `true`) and `reason` (the call's
//!   reason, or what the call was). The format's own `ok` (a Nagios exit status) gives way:
//!   the script's word on its node is the verdict, the exit status still says whether the
//!   run itself worked. A run without a state call left its node as it was, which for a
//!   health check means up (NHC and Slurm's HealthCheckProgram call only to change it): `ok`
//!   is the format's own, else `true`; `reason` the format's `text` where that `ok` is
//!   `false`, else `no state change`. So every run gives both, and `--once` never reads a
//!   healthy run as one that left `reason` out.
//! - `gmetric`: each call a sample named by `-n`, the last of a name winning.
//!
//! Calls the agent does not understand, or that name another node, are listed by
//! `probe NAME` and change nothing.

pub mod stand_ins;

use std::fmt;

use crate::config::Capturer;
use crate::output::{Parsed, Sample};

/// One captured call: the command and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub command: String,
    pub args: Vec<String>,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.command)?;
        for a in &self.args {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_=.,:/@%+[]".contains(c));
            if plain {
                write!(f, " {a}")?;
            } else {
                write!(f, " {a:?}")?;
            }
        }
        Ok(())
    }
}

/// The node's state as the run's last state call set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub ok: bool,
    pub reason: String,
}

/// What the agent made of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    State(NodeState),
    Sample {
        name: String,
        value: String,
    },
    /// Changes nothing: why.
    Ignored(String),
}

/// A run's captured calls, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The first [`CALLS_LISTED`] calls and what each did.
    pub calls: Vec<(Call, Effect)>,
    /// Calls past those (counted; their effects still apply).
    pub more_calls: usize,
    pub state: Option<NodeState>,
    /// gmetric samples, one per name (the last call of a name), in first-call order.
    pub samples: Vec<(String, String)>,
    /// The pipe held something that is not a record (a script wrote on the descriptor).
    pub malformed: bool,
    /// More than the cap came; later calls were lost.
    pub overflowed: bool,
    /// The probe captures `node_state`: every run gives `ok` and `reason`.
    pub node_state: bool,
}

/// `reason` after a run that made no state call.
pub const NO_STATE_CHANGE: &str = "no state change";

/// Calls `probe NAME` lists; a run may make thousands (one gmetric per metric).
pub const CALLS_LISTED: usize = 100;

/// The names of this node a call may use: the agent's `host:`, the machine's name, and
/// their short forms (a health check writes `NodeName=$(hostname -s)` or `$HOSTNAME`).
#[derive(Debug, Clone)]
pub struct ThisNode {
    names: Vec<String>,
}

impl ThisNode {
    pub fn new(host: &str) -> Self {
        let mut names = Vec::new();
        let mut add = |n: &str| {
            for form in [n, n.split('.').next().unwrap_or(n)] {
                let form = form.to_ascii_lowercase();
                if !form.is_empty() && !names.contains(&form) {
                    names.push(form);
                }
            }
        };
        add(host);
        if let Ok(h) = nix::unistd::gethostname() {
            add(&h.to_string_lossy());
        }
        Self { names }
    }

    fn is(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        self.names.contains(&name) || self.names.iter().any(|n| name.split('.').next() == Some(n))
    }
}

/// Read the records the stand-ins wrote: `command NUL argc NUL arg NUL ...`.
pub fn decode(bytes: &[u8]) -> (Vec<Call>, bool) {
    let mut fields = bytes.split(|b| *b == 0);
    let mut calls = Vec::new();
    let text = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
    while let Some(command) = fields.next() {
        // The split's last piece: what follows the last NUL (nothing, for whole records).
        if command.is_empty() && fields.clone().next().is_none() {
            return (calls, false);
        }
        let argc = fields
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok());
        let Some(argc) = argc.filter(|n| *n <= bytes.len()) else {
            return (calls, true);
        };
        let mut args = Vec::with_capacity(argc.min(64));
        for _ in 0..argc {
            match fields.next() {
                Some(a) => args.push(text(a)),
                None => return (calls, true),
            }
        }
        if !matches!(command, b"scontrol" | b"pbsnodes" | b"gmetric") {
            return (calls, true);
        }
        calls.push(Call {
            command: text(command),
            args,
        });
    }
    (calls, false)
}

impl Report {
    /// What the calls in `bytes` (the capture pipe's) mean for a probe on `node` that
    /// captures `capture`.
    pub fn read(bytes: &[u8], overflowed: bool, node: &ThisNode, capture: &[Capturer]) -> Self {
        let (calls, malformed) = decode(bytes);
        let mut report = Report {
            malformed,
            overflowed,
            node_state: capture.contains(&Capturer::NodeState),
            ..Report::default()
        };
        // A name's place in `samples`: thousands of gmetric calls fit in the cap, and each
        // is one look-up, not a scan.
        let mut place: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for call in calls {
            let effect = match call.command.as_str() {
                "scontrol" => scontrol(&call.args, node),
                "pbsnodes" => pbsnodes(&call.args, node),
                _ => gmetric(&call.args),
            };
            match &effect {
                Effect::State(s) => report.state = Some(s.clone()),
                Effect::Sample { name, value } => match place.get(name) {
                    Some(&i) => report.samples[i].1.clone_from(value),
                    None => {
                        place.insert(name.clone(), report.samples.len());
                        report.samples.push((name.clone(), value.clone()));
                    }
                },
                Effect::Ignored(_) => {}
            }
            if report.calls.len() < CALLS_LISTED {
                report.calls.push((call, effect));
            } else {
                report.more_calls += 1;
            }
        }
        report
    }

    /// The samples the calls give: `ok` and `reason` from the state, gmetric's by name.
    pub fn samples(&self) -> Vec<Sample> {
        let mut out = Vec::new();
        if let Some(state) = &self.state {
            out.push(Sample::plain("ok", if state.ok { "true" } else { "false" }));
            out.push(Sample::plain("reason", &state.reason));
        }
        for (name, value) in &self.samples {
            out.push(Sample::plain(name, value));
        }
        out
    }

    /// The run's samples: the format's, less those the captured calls name, then theirs.
    pub fn merge_into(&self, parsed: &mut Parsed) {
        let mut mine = self.samples();
        if self.node_state && self.state.is_none() {
            let own = |name: &str| {
                parsed
                    .samples
                    .iter()
                    .find(|s| s.name == name && s.labels.is_empty())
                    .map(|s| s.value.clone())
            };
            let ok = own("ok").unwrap_or_else(|| "true".to_owned());
            let reason = match own("text") {
                Some(text) if ok == "false" && !text.trim().is_empty() => text,
                _ => NO_STATE_CHANGE.to_owned(),
            };
            mine.push(Sample::plain("ok", &ok));
            mine.push(Sample::plain("reason", &reason));
        }
        parsed
            .samples
            .retain(|s| !mine.iter().any(|m| m.name == s.name && s.labels.is_empty()));
        parsed.samples.extend(mine);
    }

    /// Whether the run has values from its calls (then an empty output is no failure).
    pub fn gives_values(&self) -> bool {
        self.node_state || !self.samples.is_empty()
    }
}

/// `key=value` words, keys case-insensitive (`NodeName=`, `nodename=`, `State=`...).
fn assignments(args: &[String]) -> Vec<(String, &str)> {
    args.iter()
        .filter_map(|a| a.split_once('='))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// `scontrol [options] update NodeName=... State=... Reason=...`.
fn scontrol(args: &[String], node: &ThisNode) -> Effect {
    let Some(at) = args.iter().position(|a| a.eq_ignore_ascii_case("update")) else {
        return Effect::Ignored("only `scontrol update` is read".into());
    };
    let pairs = assignments(&args[at + 1..]);
    let get = |keys: &[&str]| {
        pairs
            .iter()
            .find(|(k, _)| keys.contains(&k.as_str()))
            .map(|(_, v)| *v)
    };
    let Some(state) = get(&["state"]) else {
        return Effect::Ignored("an update without State= leaves the node's state".into());
    };
    if let Some(names) = get(&["nodename", "nodenames", "node"]) {
        // A list (`a,b`) counts when it holds this node.
        if !names.split(',').any(|n| node.is(n)) {
            return Effect::Ignored(format!("NodeName={names} is not this node"));
        }
    }
    let upper = state.to_ascii_uppercase();
    let ok = match upper.as_str() {
        "DRAIN" | "DOWN" | "FAIL" | "FAILING" => false,
        "RESUME" | "IDLE" | "UNDRAIN" => true,
        _ => {
            return Effect::Ignored(format!(
                "State={state} is not read (drain, down, fail; resume, idle, undrain are)"
            ))
        }
    };
    let reason = match get(&["reason"]).map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) => r.to_owned(),
        None if ok => format!("scontrol update State={upper}"),
        None => format!("scontrol update State={upper} (no reason given)"),
    };
    Effect::State(NodeState { ok, reason })
}

/// `pbsnodes -o [-C comment | -N note] [node...]`, `pbsnodes -c|-r [node...]`.
fn pbsnodes(args: &[String], node: &ThisNode) -> Effect {
    let (mut offline, mut clear, mut note, mut nodes) = (false, None, None, Vec::new());
    let mut words = args.iter();
    while let Some(a) = words.next() {
        let Some(flags) = a
            .strip_prefix('-')
            .filter(|f| !f.is_empty() && !f.starts_with('-'))
        else {
            nodes.push(a.as_str());
            continue;
        };
        for (i, c) in flags.char_indices() {
            match c {
                'o' => offline = true,
                'c' | 'r' => clear = Some(c),
                // Options with a value: the rest of the word, or the next word.
                'C' | 'N' | 'A' | 's' | 'F' => {
                    let attached = &flags[i + 1..];
                    let value = if attached.is_empty() {
                        words.next().map(String::as_str).unwrap_or("")
                    } else {
                        attached
                    };
                    if matches!(c, 'C' | 'N' | 'A') {
                        note = Some(value.to_owned());
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    if !nodes.is_empty() && !nodes.iter().any(|n| node.is(n)) {
        return Effect::Ignored(format!("{} is not this node", nodes.join(" ")));
    }
    let note = note.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty());
    match (offline, clear) {
        (true, None) => Effect::State(NodeState {
            ok: false,
            reason: note.unwrap_or_else(|| "pbsnodes -o (no note given)".into()),
        }),
        (false, Some(flag)) => Effect::State(NodeState {
            ok: true,
            reason: note.unwrap_or_else(|| format!("pbsnodes -{flag}")),
        }),
        (true, Some(_)) => Effect::Ignored("both offline and clear".into()),
        (false, None) => Effect::Ignored("a note alone leaves the node's state".into()),
    }
}

/// gmetric's options that take a value, short and long.
const GMETRIC_VALUED: &[(char, &str)] = &[
    ('n', "name"),
    ('v', "value"),
    ('t', "type"),
    ('u', "units"),
    ('s', "slope"),
    ('x', "tmax"),
    ('d', "dmax"),
    ('g', "group"),
    ('C', "cluster"),
    ('D', "desc"),
    ('T', "title"),
    ('S', "spoof"),
    ('c', "conf"),
];

/// `gmetric -n NAME -v VALUE [-t TYPE] [-u UNITS]` (also `-nNAME`, `--name=NAME`,
/// `--name NAME`).
fn gmetric(args: &[String]) -> Effect {
    let mut given: Vec<(char, String)> = Vec::new();
    let mut words = args.iter();
    while let Some(a) = words.next() {
        let (opt, attached) = if let Some(long) = a.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            match GMETRIC_VALUED.iter().find(|(_, l)| *l == name) {
                Some((c, _)) => (*c, value),
                None => continue,
            }
        } else if let Some(short) = a.strip_prefix('-') {
            let mut chars = short.chars();
            match chars.next() {
                Some(c) if GMETRIC_VALUED.iter().any(|(s, _)| *s == c) => {
                    let rest = chars.as_str();
                    (c, (!rest.is_empty()).then_some(rest))
                }
                _ => continue,
            }
        } else {
            continue;
        };
        let value = match attached {
            Some(v) => v.to_owned(),
            None => words.next().cloned().unwrap_or_default(),
        };
        given.push((opt, value));
    }
    let get = |c: char| {
        given
            .iter()
            .rev()
            .find(|(o, _)| *o == c)
            .map(|(_, v)| v.as_str())
    };
    let (Some(name), Some(value)) = (get('n').filter(|n| !n.is_empty()), get('v')) else {
        return Effect::Ignored("gmetric needs -n NAME and -v VALUE".into());
    };
    let kind = get('t').unwrap_or("string");
    let numeric = matches!(
        kind,
        "int8" | "uint8" | "int16" | "uint16" | "int32" | "uint32" | "float" | "double"
    );
    if numeric && value.trim().parse::<f64>().is_err() {
        return Effect::Ignored(format!("{name}: {value:?} is not a {kind}"));
    }
    if !numeric && kind != "string" {
        return Effect::Ignored(format!("{name}: unknown type {kind:?}"));
    }
    Effect::Sample {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

#[cfg(test)]
mod tests;
