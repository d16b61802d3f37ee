//! Parsers for what probes print, one file per format, listed once in `formats!` below: a
//! new format is its file plus one line there. A parser turns text into [`Sample`]s (a name,
//! labels and a raw value); `select.rs` picks each fed resource's sample; typing against the
//! resource's valtype happens in one place (`value::Valtype::parse`).

pub mod declared;
pub mod select;
pub mod stream;

use std::collections::HashMap;

pub use classad::{merge_ads, AdLine, AdStream, MergedAds, AD_LABEL, MAX_AD_BYTES};
pub use declared::{DeclaredBudget, DECLARED_STATE_BYTES};
pub use elim::{parse_elim, parse_elim_line, ELIM_ABORT_VALUE};
pub use kv::parse_kv;
pub use select::{parse_selector, Aggregate, Pick, Selection, Selector};
pub use stream::Streaming;
pub use value::parse_value;

/// One `name -> raw text` pair a probe reported.
pub type Pair = (String, String);

/// Declares the formats: `Variant => module` (the module holds `DEF`, whose `name` is what
/// `format:` says). Everything else (the `mod` line, the enum, the name list, dispatch, the
/// config's error texts) follows from it.
macro_rules! formats {
    ($($variant:ident => $module:ident),* $(,)?) => {
        $(mod $module;)*

        /// What a probe's output is written in.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Format { $($variant),* }

        impl Format {
            pub const ALL: &'static [Format] = &[$(Format::$variant),*];

            pub fn def(self) -> &'static FormatDef {
                match self { $(Format::$variant => &$module::DEF),* }
            }
        }
    };
}

formats! {
    Value => value,
    Kv => kv,
    Elim => elim,
    Nagios => nagios,
    Prometheus => prometheus,
    Influx => influx,
    Classad => classad,
    Json => json,
    Munin => munin,
    Checkmk => checkmk,
    Collectd => collectd,
    Netdata => netdata,
    Sge => sge,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        self.def().name
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.as_str() == name)
    }

    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|f| f.as_str()).collect()
    }

    /// Whether `select:`/`aggregate:` apply (the formats whose samples carry labels).
    pub fn selectable(self) -> bool {
        self.def().selectable
    }

    /// The formats a stream probe reads as its output comes, for the config's error text.
    pub fn stream_names() -> Vec<&'static str> {
        Self::ALL
            .iter()
            .filter(|f| f.def().stream.reads())
            .map(|f| f.as_str())
            .collect()
    }
}

/// One format's entry in the table.
pub struct FormatDef {
    pub name: &'static str,
    /// What output in this format is called, for hints ("looked like Prometheus text").
    pub title: &'static str,
    parse: fn(&Input) -> Result<Parsed, OutputError>,
    /// Which exit statuses still mean "read the output".
    pub exits: Exits,
    /// `select:` and `aggregate:` apply; names match case-insensitively after sanitising.
    pub selectable: bool,
    /// Empty output is a normal answer (Prometheus collectors print nothing when all is well).
    pub empty_is_an_answer: bool,
    /// Selector names match case-insensitively (ClassAd attribute names).
    pub fold_case: bool,
    /// Whether and how a stream probe reads it as it comes: each line an update (value,
    /// kv, elim), or lines gathered into blocks a terminator line ends (ClassAd's `-`).
    pub stream: Streaming,
    /// What the format's home system does when it runs a script (its arguments and
    /// environment) and how it names values, so the agent does the same.
    pub peer: &'static Peer,
}

impl FormatDef {
    /// A format other systems' scripts print (Munin, Checkmk, collectd, Netdata, Grid
    /// Engine): read from a run that exited 0, `select:` applies, empty output is no answer,
    /// names keep their case; a stream reads it only where its entry says how
    /// (`stream: ..., ..FormatDef::of_a_peer(...)`).
    pub const fn of_a_peer(
        name: &'static str,
        title: &'static str,
        parse: fn(&Input) -> Result<Parsed, OutputError>,
        peer: &'static Peer,
    ) -> Self {
        Self {
            name,
            title,
            parse,
            exits: Exits::Zero,
            selectable: true,
            empty_is_an_answer: false,
            fold_case: false,
            stream: Streaming::No,
            peer,
        }
    }
}

/// How a format's home system runs its scripts and names their values: munin-node runs a
/// plugin with no argument and `MUNIN_*` set, netdata passes its update-every, collectd sets
/// `COLLECTD_HOSTNAME` and `COLLECTD_INTERVAL`. A probe's own `env:` still wins.
pub struct Peer {
    /// Arguments before the command's own (netdata's update-every).
    pub args: fn(&PeerRun) -> Vec<String>,
    /// Environment set under the probe's `env:`.
    pub env: fn(&PeerRun) -> Vec<(String, String)>,
    /// Labels whose value also names a sample for a resource without `select:`, the first
    /// one present (a Netdata dimension id, a collectd type instance): `provides: [load1]`
    /// finds `system.load.load1`.
    pub short_names: &'static [&'static str],
    /// The system gives each plugin a directory for its state between runs (munin-node's
    /// `MUNIN_PLUGSTATE`): the agent makes the probe's own ([`PeerRun::state_dir`]).
    pub state_dir: bool,
}

/// What a peer's arguments and environment are made of.
pub struct PeerRun<'a> {
    /// The probe's name (`MUNIN_STATEFILE` is per plugin).
    pub probe: &'a str,
    pub host: &'a str,
    pub interval: std::time::Duration,
    /// The probe's state directory, for a system that gives one ([`Peer::state_dir`]);
    /// `None` where the agent has none (a user's agent without `$HOME`).
    pub state_dir: Option<std::path::PathBuf>,
}

/// A format that no other system runs scripts for in its own way.
pub const NO_PEER: Peer = Peer {
    args: |_| Vec::new(),
    env: |_| Vec::new(),
    short_names: &[],
    state_dir: false,
};

impl Peer {
    /// A system that sets an environment but passes no arguments (munin-node, collectd).
    pub const fn environment(
        env: fn(&PeerRun) -> Vec<(String, String)>,
        short_names: &'static [&'static str],
    ) -> Self {
        Self {
            args: |_| Vec::new(),
            env,
            short_names,
            state_dir: false,
        }
    }

    /// The label value that also names `sample` (see [`Peer::short_names`]).
    pub fn short_name<'s>(&self, sample: &'s Sample) -> Option<&'s str> {
        self.short_names.iter().find_map(|want| {
            sample
                .labels
                .iter()
                .find(|(k, _)| k == want)
                .map(|(_, v)| v.as_str())
        })
    }
}

/// Exit statuses whose output is read; any other is a failed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exits {
    /// Only 0 (value, kv, elim, Prometheus, influx).
    Zero,
    /// The Nagios plugin API: 0 OK, 1 WARNING, 2 CRITICAL; 3 UNKNOWN and others fail.
    Nagios,
    /// Any: HTCondor startd cron reads a script's ClassAd whatever it exits with (a
    /// non-zero exit that printed nothing has no ClassAd, and fails).
    Any,
}

impl Exits {
    /// Whether a run that exited with `code` and printed `out` is an answer to parse.
    /// (A startd-cron script that fails and prints nothing has no verdict to publish.)
    pub fn reads(self, code: i32, out: &[u8]) -> bool {
        match self {
            Exits::Zero => code == 0,
            Exits::Nagios => (0..=2).contains(&code),
            Exits::Any => code == 0 || out.iter().any(|b| !b.is_ascii_whitespace()),
        }
    }

    /// Whether the exit status is part of the answer (so a file, which has none, cannot be
    /// read in this format).
    pub fn needs_a_status(self) -> bool {
        matches!(self, Exits::Nagios)
    }

    /// What the status means in this format, for the failure message.
    pub fn meaning(self, code: i32) -> Option<&'static str> {
        match (self, code) {
            (Exits::Nagios, 3) => Some("UNKNOWN"),
            (Exits::Nagios, _) => Some("not a Nagios status (0-3)"),
            _ => None,
        }
    }
}

/// What a parser reads: the output, how the child exited, the probe's own resource name.
pub struct Input<'a> {
    pub text: &'a str,
    pub exit: Option<i32>,
    pub own: &'a str,
}

/// One value found in the output, before typing.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, perfdata label, `measurement.field` or ClassAd attribute.
    pub name: String,
    /// Prometheus labels, influx tags, the ClassAd's `- NAME` tag as `ad`.
    pub labels: Vec<(String, String)>,
    pub value: String,
    /// The output line it came from (1-based); 0 for values from the exit status.
    pub line: usize,
}

impl Sample {
    pub fn plain(name: &str, value: &str) -> Self {
        Self {
            name: name.to_owned(),
            labels: Vec::new(),
            value: value.to_owned(),
            line: 0,
        }
    }

    /// `name{a="1",b="2"}` as a selector would write it.
    pub fn key(&self) -> String {
        if self.labels.is_empty() {
            return self.name.clone();
        }
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }
}

/// A run's output, parsed: its samples, and the lines that did not parse (the rest of the
/// output still counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub samples: Vec<Sample>,
    /// The first [`MAX_BAD_LINES`] lines that did not parse.
    pub bad_lines: Vec<OutputError>,
    /// Lines that did not parse after those (counted, not kept: 16 MiB of garbage would
    /// otherwise cost an error text per line).
    pub bad_lines_more: usize,
}

/// Malformed lines of one output kept with their reasons; the rest are counted.
pub const MAX_BAD_LINES: usize = 100;

impl Parsed {
    pub fn of(samples: Vec<Sample>) -> Self {
        Self {
            samples,
            bad_lines: Vec::new(),
            bad_lines_more: 0,
        }
    }

    /// Add the next part of the same output (a stream's next ClassAd).
    pub fn append(&mut self, mut other: Parsed) {
        self.samples.append(&mut other.samples);
        self.bad_lines_more += other.bad_lines_more;
        for e in other.bad_lines {
            self.keep_bad(e);
        }
    }

    /// Lines that did not parse, kept or counted.
    pub fn bad_count(&self) -> usize {
        self.bad_lines.len() + self.bad_lines_more
    }

    fn bad(&mut self, line: usize, reason: impl Into<String>) {
        if self.bad_lines.len() >= MAX_BAD_LINES {
            self.bad_lines_more += 1;
            return;
        }
        self.keep_bad(OutputError::Line {
            line,
            reason: reason.into(),
        });
    }

    fn keep_bad(&mut self, e: OutputError) {
        if self.bad_lines.len() < MAX_BAD_LINES {
            self.bad_lines.push(e);
        } else {
            self.bad_lines_more += 1;
        }
    }

    /// The samples as `name -> value` pairs (labels dropped), for the formats without them.
    pub fn pairs(&self) -> Vec<Pair> {
        self.samples
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error("empty output")]
    Empty,
    #[error("output is not valid UTF-8 (at byte {0})")]
    NotUtf8(usize),
    #[error("output contains a NUL byte")]
    Nul,
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

fn text(out: &[u8]) -> Result<&str, OutputError> {
    if out.contains(&0) {
        return Err(OutputError::Nul);
    }
    std::str::from_utf8(out).map_err(|e| OutputError::NotUtf8(e.valid_up_to()))
}

/// Parse `out` in `format`. `exit` is the child's exit status when it has one (Nagios reads
/// it); `own` names the value of `format: value`.
pub fn parse(
    format: Format,
    out: &[u8],
    exit: Option<i32>,
    own: &str,
) -> Result<Parsed, OutputError> {
    let text = text(out)?;
    (format.def().parse)(&Input { text, exit, own })
}

/// The format `text` looks written in, for the hint when a probe's output does not give
/// what was asked: Prometheus text fed to `kv` "works" and reports nothing.
pub fn looks_like(text: &str) -> Option<Format> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(20)
        .collect();
    let first = *lines.first()?;
    if let Some(peer) = looks_like_a_peer(&lines) {
        return Some(peer);
    }
    if lines
        .iter()
        .any(|l| l.starts_with("# TYPE ") || l.starts_with("# HELP "))
        || lines.iter().any(|l| prometheus::looks_like_sample(l))
    {
        return Some(Format::Prometheus);
    }
    if lines
        .iter()
        .all(|l| l.starts_with('#') || influx::looks_like_line(l))
    {
        return Some(Format::Influx);
    }
    if nagios::looks_like(first) {
        return Some(Format::Nagios);
    }
    if lines
        .iter()
        .all(|l| parse_elim_line(l).is_ok_and(|p| !p.is_empty()))
    {
        return Some(Format::Elim);
    }
    if lines
        .iter()
        .all(|l| l.starts_with('-') || l.starts_with('#') || l.contains('='))
    {
        // A nested record (`GPU_5368a050=[ DieTempC=28; ]`) is ClassAd whatever separates
        // the ads: kv would read it as one word.
        let nested = |l: &&str| {
            l.split_once('=')
                .is_some_and(|(_, v)| v.trim_start().starts_with('['))
        };
        return Some(
            if lines.iter().any(|l| *l == "-" || l.starts_with("- ")) || lines.iter().any(nested) {
                Format::Classad
            } else {
                Format::Kv
            },
        );
    }
    None
}

/// The protocols whose keywords give them away: collectd's PUTVAL, netdata's CHART/BEGIN,
/// a load sensor's `begin`, Munin's `field.value`, a Checkmk local check's state and metrics.
fn looks_like_a_peer(lines: &[&str]) -> Option<Format> {
    let all = |f: fn(&str) -> bool| lines.iter().all(|l| f(l));
    let first_word = |l: &str| l.split_whitespace().next().unwrap_or("").to_owned();
    if all(|l| l.starts_with("PUTVAL ") || l.starts_with("PUTNOTIF ")) {
        return Some(Format::Collectd);
    }
    if lines.iter().any(|l| first_word(l) == "CHART")
        && lines.iter().any(|l| first_word(l) == "BEGIN")
    {
        return Some(Format::Netdata);
    }
    if lines.first() == Some(&sge::BEGIN) {
        return Some(Format::Sge);
    }
    if all(|l| {
        l.starts_with("multigraph ")
            || l.split_whitespace()
                .next()
                .is_some_and(|w| w.ends_with(".value"))
    }) {
        return Some(Format::Munin);
    }
    if all(checkmk::looks_like) {
        return Some(Format::Checkmk);
    }
    None
}

/// `name -> value` pairs in the order each name first came, a later value for a name
/// replacing the earlier one (an ELIM's or a kv file's "the last line wins"). Indexed by
/// name, so n pairs cost O(n) time, never a scan per pair: 2 MB of distinct kv names took
/// seconds on a runtime thread with the scan.
#[derive(Debug, Default, Clone)]
pub struct PairSet {
    pairs: Vec<Pair>,
    index: HashMap<String, usize>,
}

impl PairSet {
    pub fn upsert(&mut self, k: &str, v: &str) {
        match self.index.get(k) {
            Some(&i) => v.clone_into(&mut self.pairs[i].1),
            None => {
                self.index.insert(k.to_owned(), self.pairs.len());
                self.pairs.push((k.to_owned(), v.to_owned()));
            }
        }
    }

    /// [`Self::upsert`], a new name charged to `declared` (twice: the index holds a copy)
    /// and dropped past it; a name already kept still takes its later value.
    pub fn upsert_within(&mut self, k: &str, v: &str, declared: &mut DeclaredBudget) {
        if self.index.contains_key(k) || declared.charge_len(2 * k.len() + v.len()).is_ok() {
            self.upsert(k, v);
        }
    }

    pub fn contains(&self, k: &str) -> bool {
        self.index.contains_key(k)
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    pub fn into_vec(self) -> Vec<Pair> {
        self.pairs
    }
}

/// Samples without labels, one per name, in the order each name first came, a later value
/// replacing the earlier one: what kv and ELIM output means. Indexed by name borrowed from
/// the output, so n lines cost O(n) time and one sample each, never a scan per line.
pub(crate) struct LastWins<'a> {
    samples: Vec<Sample>,
    index: HashMap<&'a str, usize>,
}

impl<'a> LastWins<'a> {
    pub fn new() -> Self {
        Self {
            samples: Vec::new(),
            index: HashMap::new(),
        }
    }

    pub fn set(&mut self, name: &'a str, value: &str) {
        match self.index.get(name) {
            Some(&i) => value.clone_into(&mut self.samples[i].value),
            None => {
                self.index.insert(name, self.samples.len());
                self.samples.push(Sample {
                    name: name.to_owned(),
                    labels: Vec::new(),
                    value: value.to_owned(),
                    line: 0,
                });
            }
        }
    }

    pub fn into_parsed(self) -> Result<Parsed, OutputError> {
        if self.samples.is_empty() {
            return Err(OutputError::Empty);
        }
        Ok(Parsed::of(self.samples))
    }

    /// The batch parse of a line format (kv, ELIM), derived from its line parser `pairs`
    /// (what its stream reads a line with): the pairs of each line in turn, a bad line an
    /// error that names it; no pair at all is empty output.
    pub fn of_lines<P>(
        text: &'a str,
        pairs: impl Fn(&'a str) -> Result<P, String>,
    ) -> Result<Parsed, OutputError>
    where
        P: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut out = Self::new();
        for (i, line) in text.lines().enumerate() {
            let line_pairs = pairs(line).map_err(|reason| OutputError::Line {
                line: i + 1,
                reason,
            })?;
            for (name, value) in line_pairs {
                out.set(name, value);
            }
        }
        out.into_parsed()
    }
}

/// Samples where a later one with the same name and labels replaces the earlier one in its
/// place (a collectd identifier printed again, a Netdata chart's next update, a load
/// sensor's next report). Indexed by key: n samples cost O(n), never a scan per sample.
#[derive(Debug, Default)]
pub(crate) struct Latest {
    index: HashMap<String, usize>,
}

impl Latest {
    pub fn put(&mut self, out: &mut Parsed, sample: Sample) {
        let key = sample.key();
        match self.index.get(&key) {
            Some(&at) => out.samples[at] = sample,
            None => {
                self.index.insert(key, out.samples.len());
                out.samples.push(sample);
            }
        }
    }
}

/// What the samples of one parse may hold, against the output's size: a format that
/// repeats text per sample (a JSON path per leaf, an influx line's measurement and tags per
/// field) would otherwise turn a 16 MiB output into gigabytes. Each sample costs its struct,
/// its name, labels and value; a parse may spend [`SAMPLE_BYTES_PER_OUTPUT_BYTE`] times the
/// output's size plus [`SAMPLE_BYTES_FREE`], and output that would take more is refused.
/// (The line formats, kv, elim, value, Prometheus, Nagios and ClassAd, take each sample's
/// text from its own line, so they stay within a like factor without counting.)
#[derive(Debug)]
pub struct Budget {
    left: usize,
    spent: bool,
}

/// See [`Budget`].
pub const SAMPLE_BYTES_PER_OUTPUT_BYTE: usize = 8;
/// See [`Budget`]: what any output may spend, however short.
pub const SAMPLE_BYTES_FREE: usize = 4 << 20;

impl Budget {
    pub fn for_output(len: usize) -> Self {
        Self {
            left: len
                .saturating_mul(SAMPLE_BYTES_PER_OUTPUT_BYTE)
                .saturating_add(SAMPLE_BYTES_FREE),
            spent: false,
        }
    }

    /// A charge failed: the parse is refused as a whole.
    pub fn spent(&self) -> bool {
        self.spent
    }

    /// Spend what `sample` costs, once it is built; `Err` once the budget is gone.
    pub fn charge_sample(&mut self, sample: &Sample) -> Result<(), String> {
        let labels = sample.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.charge(sample.name.len(), labels, sample.value.len())
    }

    /// Spend what one sample with these parts costs; `Err` once the budget is gone.
    pub fn charge(&mut self, name: usize, labels: usize, value: usize) -> Result<(), String> {
        let cost = std::mem::size_of::<Sample>() + name + labels + value;
        match self.left.checked_sub(cost) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.spent = true;
                Err(format!(
                "its samples would take more than {SAMPLE_BYTES_PER_OUTPUT_BYTE} times the output's size (the names repeat too much text); refused"
                ))
            }
        }
    }
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// What the parsers' own tests share: a run of one parser on text that exited 0, and the
/// numbers of the lines it named as malformed.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{Input, OutputError, Parsed};

    type ParseFn = fn(&Input) -> Result<Parsed, OutputError>;

    /// `text` as a run that exited 0 printed it.
    pub fn parse_run(parse: ParseFn, text: &str) -> Result<Parsed, OutputError> {
        parse(&Input {
            text,
            exit: Some(0),
            own: "x",
        })
    }

    pub fn parse_ok(parse: ParseFn, text: &str) -> Parsed {
        parse_run(parse, text).expect("parses")
    }

    /// The line a parse stopped at because its samples would overrun its [`super::Budget`].
    pub fn refused_at_budget(parse: ParseFn, text: &str) -> usize {
        match parse_run(parse, text) {
            Err(OutputError::Line { line, reason })
                if reason.contains("times the output's size") =>
            {
                line
            }
            other => panic!("not refused at the budget: {other:?}"),
        }
    }

    pub fn bad_line_numbers(p: &Parsed) -> Vec<usize> {
        p.bad_lines
            .iter()
            .map(|e| match e {
                OutputError::Line { line, .. } => *line,
                _ => 0,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_set_keeps_new_names_within_the_declared_budget() {
        let mut declared = DeclaredBudget::new(10 * DeclaredBudget::cost("job_00000") * 2);
        let mut set = PairSet::default();
        for i in 0..10_000 {
            set.upsert_within(&format!("job_{i:05}"), "1", &mut declared);
        }
        assert!(declared.refused() > 9_000, "{}", declared.refused());
        set.upsert_within("job_00000", "7", &mut declared);
        let pairs = set.into_vec();
        assert!((10..=20).contains(&pairs.len()), "{}", pairs.len());
        assert_eq!(pairs[0], ("job_00000".to_owned(), "7".to_owned()));
    }

    fn pairs(f: Format, out: &[u8]) -> Result<Vec<Pair>, OutputError> {
        parse(f, out, Some(0), "x").map(|p| p.pairs())
    }

    #[test]
    fn value_is_first_non_blank_line() {
        assert_eq!(
            pairs(Format::Value, b"\n 42 \nmore\n").unwrap(),
            vec![("x".into(), "42".into())]
        );
        assert_eq!(pairs(Format::Value, b"  \n"), Err(OutputError::Empty));
        assert_eq!(pairs(Format::Value, b"4\x002"), Err(OutputError::Nul));
        assert_eq!(
            pairs(Format::Value, b"\xff\xfe"),
            Err(OutputError::NotUtf8(0))
        );
    }

    #[test]
    fn kv_lines() {
        let got = parse_kv("# comment\na = 1\nb=\"two words\"\n\na = 3\n").unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "3".into()), ("b".into(), "two words".into())]
        );
        assert!(matches!(
            parse_kv("a = 1\ngarbage\n"),
            Err(OutputError::Line { line: 2, .. })
        ));
        assert!(matches!(
            parse_kv("two words = 1\n"),
            Err(OutputError::Line { line: 1, .. })
        ));
    }

    #[test]
    fn elim_lines() {
        let got = parse_elim("2 a 1 b 2\n1 a 5\n").unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "5".into()), ("b".into(), "2".into())]
        );
        assert!(parse_elim("2 a 1\n").is_err());
        assert!(parse_elim("x a 1\n").is_err());
        assert_eq!(parse_elim_line("0").unwrap(), vec![]);
        // A count whose double does not fit is a mismatch, not an overflow.
        assert!(parse_elim_line("9223372036854775808").is_err());
        assert!(parse_elim_line("18446744073709551615 a 1").is_err());
    }

    #[test]
    fn malformed_lines_past_the_first_hundred_are_counted_not_kept() {
        let mut text = "good 1\n".to_owned();
        text.push_str(&"!\n".repeat(1000));
        let p = parse(Format::Prometheus, text.as_bytes(), Some(0), "x").unwrap();
        assert_eq!(p.samples.len(), 1);
        assert_eq!(p.bad_lines.len(), MAX_BAD_LINES);
        assert_eq!(p.bad_count(), 1000);
    }

    #[test]
    fn a_later_pair_replaces_an_earlier_one_in_its_place() {
        let mut text = String::new();
        for round in 0..3 {
            for i in 0..1000 {
                text.push_str(&format!("n{i} = {round}\n"));
            }
        }
        let got = parse_kv(&text).unwrap();
        assert_eq!(got.len(), 1000);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, (k, v))| *k == format!("n{i}") && v == "2"));
    }

    #[test]
    fn every_format_has_a_distinct_name() {
        let names = Format::names();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.as_str()), Some(*f));
        }
    }

    #[test]
    fn output_is_recognised_for_the_hint() {
        let prom = "# HELP varlog_bytes Bytes\n# TYPE varlog_bytes gauge\nvarlog_bytes{path=\"/var/log\"} 123\n";
        assert_eq!(looks_like(prom), Some(Format::Prometheus));
        assert_eq!(
            looks_like("cpu,host=a usage_idle=97.5,n=3i 1700000000000000000\n"),
            Some(Format::Influx)
        );
        assert_eq!(
            looks_like("DISK OK - free space: / 3326 MB (56%); | /=2643MB;5948;5958;0;5968\n"),
            Some(Format::Nagios)
        );
        assert_eq!(looks_like("2 a 1 b 2\n"), Some(Format::Elim));
        assert_eq!(looks_like("a = 1\n-\n"), Some(Format::Classad));
        assert_eq!(looks_like("a = 1\n"), Some(Format::Kv));
        assert_eq!(
            looks_like("DetectedGPUs=\"GPU-5368a050\"\nGPU_5368a050=[ DieTempC=28; ]\n"),
            Some(Format::Classad)
        );
        assert_eq!(looks_like("hello world\n"), None);
        assert_eq!(
            looks_like("multigraph cpu\nuser.value 5\n"),
            Some(Format::Munin)
        );
        assert_eq!(
            looks_like("0 \"Disk root\" used=4;8;9 fine\nP Load - ok\n"),
            Some(Format::Checkmk)
        );
        assert_eq!(
            looks_like("PUTVAL \"h/load/load\" N:1:2:3\n"),
            Some(Format::Collectd)
        );
        assert_eq!(
            looks_like("CHART a.b '' t u\nDIMENSION d\nBEGIN a.b\nSET d = 1\nEND\n"),
            Some(Format::Netdata)
        );
        assert_eq!(looks_like("begin\nh:load.5m:0.5\nend\n"), Some(Format::Sge));
    }
}
