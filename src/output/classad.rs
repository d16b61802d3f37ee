//! `format: classad`: what HTCondor startd cron scripts print. `Name = value` lines whose
//! values are ClassAd literals: numbers, `"strings"` (with `\"` and `\\`), `true`/`false`;
//! `UNDEFINED` means "no value" (the attribute is left out); any other expression
//! (`True && regexp(...)`) is kept as its text, a string. Attribute names are
//! case-insensitive. A line `-` ends one ad; `- NAME` ends it and names it: its attributes
//! get the label `ad="NAME"` (select them as `Attr{ad="NAME"}`; without `select:` a resource
//! named `NAME_Attr` gets them). Within one run, a later ad's value for the same attribute
//! (and the same ad name) replaces an earlier one. The output is read whatever the exit
//! status, as HTCondor does (a non-zero exit with nothing printed is a failed run).
//!
//! A nested record, `Name = [ Attr = value; ... ]` (what `condor_gpu_discovery` prints by
//! default since HTCondor 9.11: `GPU_5368a050=[ DieTempC=28; ... ]`), gives one sample per
//! attribute named `Name.Attr` (records in records: `Name.Inner.Attr`), never the record
//! itself.

use std::collections::hash_map::{Entry, HashMap};

use super::stream::{Block, BlockLine, BlockStream, Blocks, Streaming};
use super::{DeclaredBudget, Exits, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "classad",
    title: "ClassAd attributes",
    parse,
    exits: Exits::Any,
    selectable: true,
    empty_is_an_answer: true,
    fold_case: true,
    stream: Streaming::Blocks(BLOCKS),
    peer: &super::NO_PEER,
};

/// A stream's ClassAd output: `Name = value` lines, each ad ended by `-` or `- NAME`.
const BLOCKS: Blocks = Blocks {
    end: separator,
    parse: parse_ad,
    called: "ClassAd",
    terminator: "`-`",
    goodbye: None,
    asked: false,
};

/// `-` and `- NAME` end an ad (the one rule for them, whole outputs and streams alike).
fn separator(line: &str) -> Option<&str> {
    line.strip_prefix('-').map(str::trim)
}

/// One ad's lines: its attributes, labelled `ad="NAME"` by a `- NAME` separator, a later
/// value of an attribute replacing an earlier one.
fn parse_ad(block: &Block) -> Parsed {
    let mut ad = Parsed::default();
    // Each attribute carries its ad's name: a long one would be copied into every
    // attribute of the ad.
    if block.name.len() > MAX_AD_NAME {
        let after = block.lines.last().map_or(0, |(n, _)| n + 1);
        ad.bad(
            after,
            format!("ad name longer than {MAX_AD_NAME} bytes; the ad is dropped"),
        );
        return ad;
    }
    for (number, line) in block.lines {
        if line.starts_with('#') {
            continue;
        }
        match attributes(line) {
            Ok(found) => ad.samples.extend(found.into_iter().map(|(name, value)| Sample {
                name,
                labels: Vec::new(),
                value,
                line: *number,
            })),
            Err(why) => ad.bad(*number, why),
        }
    }
    if !block.name.is_empty() {
        for s in &mut ad.samples {
            s.labels = vec![(AD_LABEL.to_owned(), block.name.to_owned())];
        }
    }
    ad.samples = later_wins(ad.samples);
    ad
}

/// The label a `- NAME` separator puts on its ad's attributes.
pub const AD_LABEL: &str = "ad";

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut ads = AdStream::default();
    let mut out = Parsed::default();
    let mut count = 0;
    for line in input.text.lines() {
        if let AdLine::Ended { ad, .. } = ads.push(line) {
            out.append(ad);
            count += 1;
        }
    }
    // A finished run's last ad needs no `-`: HTCondor publishes what it printed.
    if let Some(ad) = ads.finish() {
        out.append(ad);
        count += 1;
    }
    // Each ad is already without repeats: only several need another pass.
    if count > 1 {
        out.samples = later_wins(std::mem::take(&mut out.samples));
    }
    Ok(out)
}

/// Add the next ad to the ones read before: a later value of an attribute (in the ad of
/// the same name) replaces an earlier one.
pub fn merge_ads(into: &mut Parsed, ad: Parsed) {
    into.append(ad);
    into.samples = later_wins(std::mem::take(&mut into.samples));
}

/// Ads merged as they end (a stream's first values): a later value of an attribute, in the
/// ad of the same name, replaces the earlier one. Indexed, so each ad costs its own size,
/// never another pass over the ads before it. Each new name (with its labels: a collectd
/// identifier, an ad's attribute) is charged to the probe's declared-state budget; past it,
/// new names are dropped and the ones kept still take their later values.
#[derive(Debug, Default)]
pub struct MergedAds {
    parsed: Parsed,
    index: HashMap<(String, Vec<(String, String)>), usize>,
}

impl MergedAds {
    pub fn add(&mut self, ad: Parsed, declared: &mut DeclaredBudget) {
        for s in ad.samples {
            match self
                .index
                .entry((s.name.to_ascii_lowercase(), s.labels.clone()))
            {
                Entry::Occupied(e) => self.parsed.samples[*e.get()] = s,
                Entry::Vacant(e) => {
                    // Twice the name and labels: the index holds its own copy.
                    let labels: usize = s.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
                    let bytes = 2 * (s.name.len() + labels) + s.value.len();
                    if declared.charge_len(bytes).is_ok() {
                        e.insert(self.parsed.samples.len());
                        self.parsed.samples.push(s);
                    }
                }
            }
        }
        self.parsed.append(Parsed {
            samples: Vec::new(),
            bad_lines: ad.bad_lines,
            bad_lines_more: ad.bad_lines_more,
        });
    }

    pub fn parsed(&self) -> &Parsed {
        &self.parsed
    }
}

/// Longest ad a stream may print before its `-`.
pub const MAX_AD_BYTES: usize = super::stream::MAX_BLOCK_BYTES;

/// Longest name a `- NAME` line may give its ad.
pub const MAX_AD_NAME: usize = 1024;

/// Reads ClassAd output one line at a time: the format's [`Blocks`] entry through the one
/// block reader, for a finished run's whole output and a stream's lines alike.
#[derive(Debug, Default)]
pub struct AdStream(BlockStream);

/// What one line did to the ad being read.
#[derive(Debug, PartialEq)]
pub enum AdLine {
    /// An attribute, a blank or comment line, or a malformed line: the ad goes on.
    Inside,
    /// A `-` or `- NAME` line ended this ad: `tag` is `NAME` (empty for `-`), and the
    /// ad's attributes carry it as the label `ad="NAME"`.
    Ended { tag: String, ad: Parsed },
    /// The ad passed [`MAX_AD_BYTES`] without a `-`: it is dropped, and so is the rest of it
    /// up to the next `-`.
    TooLong,
}

impl AdStream {
    /// Read one line (without its newline).
    pub fn push(&mut self, raw: &str) -> AdLine {
        match self.0.push(&BLOCKS, raw) {
            BlockLine::Inside => AdLine::Inside,
            BlockLine::Ended { name, parsed } => AdLine::Ended {
                tag: name,
                ad: parsed,
            },
            BlockLine::TooLong => AdLine::TooLong,
        }
    }

    /// The lines read since the last `-`, as an ad of their own (`None` when there are
    /// none): what a run that ended without its last `-` printed.
    pub fn finish(&mut self) -> Option<Parsed> {
        self.0.finish(&BLOCKS)
    }

    /// Lines of the ad being read.
    pub fn pending(&self) -> usize {
        self.0.pending()
    }
}

/// A later value of the same attribute (names compared without case) in the same ad
/// replaces an earlier one, in the earlier one's place.
fn later_wins(samples: Vec<Sample>) -> Vec<Sample> {
    let mut kept: Vec<Sample> = Vec::with_capacity(samples.len());
    let mut index: HashMap<(String, Vec<(String, String)>), usize> = HashMap::new();
    for s in samples {
        match index.entry((s.name.to_ascii_lowercase(), s.labels.clone())) {
            Entry::Occupied(e) => kept[*e.get()] = s,
            Entry::Vacant(e) => {
                e.insert(kept.len());
                kept.push(s);
            }
        }
    }
    kept
}

/// `Name = value`: the attribute (none for UNDEFINED), or each attribute of a nested record.
fn attributes(line: &str) -> Result<Vec<(String, String)>, String> {
    let Some((name, value)) = line.split_once('=') else {
        return Err(format!(
            "expected `Name = value` or `-`, got {:?}",
            super::clip(line)
        ));
    };
    let (name, value) = (name.trim(), value.trim());
    check_name(name)?;
    let mut found = Vec::new();
    match value.strip_prefix('[') {
        Some(body) => {
            let mut nested = Nested {
                names_left: NESTED_NAME_BYTES_PER_LINE_BYTE * line.len(),
                found: &mut found,
            };
            let rest = nested.record(name, body, 1)?;
            if !rest.trim().is_empty() {
                return Err(format!(
                    "{name}: unexpected {:?} after the record's `]`",
                    super::clip(rest.trim())
                ));
            }
        }
        None => found.extend(literal(name, value)?.map(|v| (name.to_owned(), v))),
    }
    Ok(found)
}

fn check_name(name: &str) -> Result<(), String> {
    let name_ok = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if name_ok {
        Ok(())
    } else {
        Err(format!("bad attribute name {:?}", super::clip(name)))
    }
}

/// Records in records deeper than this are refused (`[a=[a=[...`), not recursed into.
const MAX_NESTING: usize = 16;

/// What a line's nested attribute names may take, against the line's size: each attribute
/// repeats its record's name, so `LongName=[a=1;b=2;...]` would otherwise grow as the square
/// of the line.
const NESTED_NAME_BYTES_PER_LINE_BYTE: usize = 8;

/// The attributes of one line's nested records, found so far, and what their names may
/// still take.
struct Nested<'a> {
    names_left: usize,
    found: &'a mut Vec<(String, String)>,
}

impl Nested<'_> {
    /// The attributes of the record whose text follows its `[` in `body`, named
    /// `prefix.Attr`; the text after its `]`.
    fn record<'b>(&mut self, prefix: &str, body: &'b str, depth: usize) -> Result<&'b str, String> {
        if depth > MAX_NESTING {
            return Err(format!(
                "{prefix}: records nested more than {MAX_NESTING} deep"
            ));
        }
        let mut rest = body;
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix(']') {
                return Ok(after);
            }
            if rest.is_empty() {
                return Err(format!("{prefix}: the record has no closing `]`"));
            }
            let Some((attr, after)) = rest.split_once('=') else {
                return Err(format!(
                    "{prefix}: expected `Name = value;` in the record, got {:?}",
                    super::clip(rest)
                ));
            };
            let attr = attr.trim();
            check_name(attr).map_err(|why| format!("{prefix}: {why}"))?;
            let name = format!("{prefix}.{attr}");
            self.names_left = self.names_left.checked_sub(name.len()).ok_or_else(|| {
                format!(
                    "{prefix}: its attributes' names would take more than {NESTED_NAME_BYTES_PER_LINE_BYTE} times the line's size; refused"
                )
            })?;
            let after = after.trim_start();
            let tail = if let Some(inner) = after.strip_prefix('[') {
                self.record(&name, inner, depth + 1)?
            } else {
                let end = value_end(after);
                if let Some(v) = literal(&name, after[..end].trim())? {
                    self.found.push((name, v));
                }
                &after[end..]
            };
            let tail = tail.trim_start();
            rest = match tail.strip_prefix(';') {
                Some(next) => next,
                None if tail.starts_with(']') || tail.is_empty() => tail,
                None => {
                    return Err(format!(
                        "{prefix}.{attr}: expected `;` or `]` after its value, got {:?}",
                        super::clip(tail)
                    ))
                }
            };
        }
    }
}

/// Where a value inside a record ends: at the first `;` or `]` outside a string literal and
/// outside brackets (`{1, 2}`, `f(a; b)` is no ClassAd, but a list or call may hold `]`).
fn value_end(s: &str) -> usize {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '{' | '[' => depth += 1,
            ')' | '}' if depth > 0 => depth -= 1,
            ']' if depth > 0 => depth -= 1,
            ';' | ']' => return i,
            _ => {}
        }
    }
    s.len()
}

/// A value's literal as a sample holds it: `None` for UNDEFINED.
fn literal(name: &str, value: &str) -> Result<Option<String>, String> {
    if value.is_empty() {
        return Err(format!("{name} has no value"));
    }
    if value.eq_ignore_ascii_case("undefined") {
        return Ok(None);
    }
    if value.eq_ignore_ascii_case("error") {
        return Err(format!("{name} is ERROR"));
    }
    let literal = if value.eq_ignore_ascii_case("true") {
        "true".to_owned()
    } else if value.eq_ignore_ascii_case("false") {
        "false".to_owned()
    } else if let Some(s) = string_literal(value) {
        s
    } else {
        // A number, or an expression kept as its text.
        value.to_owned()
    };
    Ok(Some(literal))
}

/// `"..."` as a whole value, unescaped; `None` when it is not exactly one string literal.
fn string_literal(v: &str) -> Option<String> {
    let inner = v.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (i + 1 == inner.len()).then_some(out),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collectd stream's first values gather its identifiers: one printing new ones for
    /// ever stops growing at the budget, and an identifier kept still takes its later value.
    #[test]
    fn merged_ads_keep_new_names_within_the_declared_budget() {
        let putval = |i: usize, v: &str| {
            let mut budget = crate::output::Budget::for_output(1 << 20);
            match crate::output::collectd::parse_line(
                &format!("PUTVAL h/exec-{i}/gauge-used N:{v}"),
                1,
                &mut budget,
            ) {
                Ok(crate::output::collectd::Line::Values(samples, _)) => Parsed::of(samples),
                other => panic!("{other:?}"),
            }
        };
        let mut declared = DeclaredBudget::new(20_000);
        let mut merged = MergedAds::default();
        for i in 0..10_000 {
            merged.add(putval(i, "1"), &mut declared);
        }
        let kept = merged.parsed().samples.len();
        assert!((20..200).contains(&kept), "{kept}");
        assert_eq!(declared.entries(), kept);
        assert!(declared.used() <= declared.limit());
        assert_eq!(declared.refused(), (10_000 - kept) as u64);
        merged.add(putval(0, "42"), &mut declared);
        assert_eq!(merged.parsed().samples.len(), kept);
        assert_eq!(merged.parsed().samples[0].value, "42");
    }

    fn run(text: &str) -> Parsed {
        parse(&Input {
            text,
            exit: Some(37),
            own: "x",
        })
        .unwrap()
    }

    #[test]
    fn literals_undefined_and_expressions() {
        let p = run(concat!(
            "BadCron = 123\n",
            "NODE_IS_HEALTHY = False\n",
            "Msg = \"disk \\\"/scratch\\\" full\"\n",
            "Gone = UNDEFINED\n",
            "Expr = True && regexp(\"x\", Name)\n",
            "Real = 1.5e3\n",
        ));
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(&str, &str)> = p
            .samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("BadCron", "123"),
                ("NODE_IS_HEALTHY", "false"),
                ("Msg", "disk \"/scratch\" full"),
                ("Expr", "True && regexp(\"x\", Name)"),
                ("Real", "1.5e3"),
            ]
        );
    }

    #[test]
    fn an_ad_name_too_long_to_copy_into_every_attribute_drops_its_ad() {
        let attrs: String = (0..1000).map(|i| format!("A{i} = {i}\n")).collect();
        let p = run(&format!(
            "{attrs}- {}\nKept = 1\n- SHORT\n",
            "N".repeat(MAX_AD_NAME + 1)
        ));
        let got: Vec<String> = p.samples.iter().map(|s| s.key()).collect();
        assert_eq!(got, ["Kept{ad=\"SHORT\"}"]);
        assert_eq!(p.bad_lines.len(), 1);
        assert!(p.bad_lines[0].to_string().contains("ad name longer than"));
    }

    #[test]
    fn separators_name_ads_and_later_updates_win() {
        let p = run("Requests = 5\n- SQUID0\nRequests = 7\n- SQUID1\nLoad = 1\n-\nload = 2\n");
        let got: Vec<(String, String)> = p
            .samples
            .iter()
            .map(|s| (s.key(), s.value.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("Requests{ad=\"SQUID0\"}".to_owned(), "5".to_owned()),
                ("Requests{ad=\"SQUID1\"}".to_owned(), "7".to_owned()),
                ("load".to_owned(), "2".to_owned()),
            ]
        );
    }

    #[test]
    fn a_stream_gives_each_ad_at_its_separator_numbering_lines_from_the_start() {
        let mut ads = AdStream::default();
        assert_eq!(ads.push("Load = 1"), AdLine::Inside);
        assert_eq!(ads.push("load = 2"), AdLine::Inside);
        assert_eq!(ads.pending(), 2);
        let AdLine::Ended { tag, ad } = ads.push("-") else {
            panic!("`-` ends the ad")
        };
        assert_eq!(
            (tag.as_str(), ad.samples.len()),
            ("", 1),
            "later wins: {ad:?}"
        );
        assert_eq!((ad.samples[0].value.as_str(), ad.samples[0].line), ("2", 2));
        ads.push("Requests = 5");
        ads.push("bad line");
        let AdLine::Ended { tag, ad } = ads.push("- SQUID0") else {
            panic!()
        };
        assert_eq!(tag, "SQUID0");
        assert_eq!(ad.samples[0].key(), "Requests{ad=\"SQUID0\"}");
        assert_eq!(super::super::test_support::bad_line_numbers(&ad), vec![5]);
        assert_eq!(ads.finish(), None, "nothing after the last `-`");
        ads.push("Tail = 1");
        assert_eq!(ads.finish().map(|a| a.samples[0].line), Some(7));
    }

    #[test]
    fn an_ad_that_never_ends_is_dropped_at_the_bound_until_the_next_separator() {
        let mut ads = AdStream::default();
        let line = format!("A = \"{}\"", "x".repeat(1000));
        let mut too_long = 0;
        for _ in 0..(MAX_AD_BYTES / line.len() + 10) {
            if ads.push(&line) == AdLine::TooLong {
                too_long += 1;
            }
        }
        assert_eq!(too_long, 1, "reported once");
        assert_eq!(ads.pending(), 0, "memory released");
        assert_eq!(
            ads.push("-"),
            AdLine::Inside,
            "the dropped ad ends unpublished"
        );
        ads.push("B = 1");
        assert!(matches!(ads.push("-"), AdLine::Ended { ad, .. } if ad.samples.len() == 1));
    }

    #[test]
    fn nested_records_give_each_attribute_named_by_its_path() {
        let p = run(concat!(
            "DetectedGPUs=\"GPU-5368a050, GPU-5d2744da\"\n",
            "Common=[ DriverVersion=11.40; MaxSupportedVersion=11040; ]\n",
            "GPU_5368a050=[ id=\"GPU-5368a050\"; DeviceName=\"A100; [SXM4]\"; DieTempC=28; ECCEnabled=true; Gone=undefined; List={1, 2}; ]\n",
            "Outer = [ Inner = [ X = 1 ]; Y = \"y\" ]\n",
            "Empty=[ ]\n",
        ));
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(&str, &str)> = p
            .samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("DetectedGPUs", "GPU-5368a050, GPU-5d2744da"),
                ("Common.DriverVersion", "11.40"),
                ("Common.MaxSupportedVersion", "11040"),
                ("GPU_5368a050.id", "GPU-5368a050"),
                ("GPU_5368a050.DeviceName", "A100; [SXM4]"),
                ("GPU_5368a050.DieTempC", "28"),
                ("GPU_5368a050.ECCEnabled", "true"),
                ("GPU_5368a050.List", "{1, 2}"),
                ("Outer.Inner.X", "1"),
                ("Outer.Y", "y"),
            ]
        );
    }

    #[test]
    fn malformed_records_are_bad_lines() {
        let deep = format!("D = {}1{}\n", "[a=".repeat(MAX_NESTING + 1), "]".repeat(MAX_NESTING + 1));
        let long = format!(
            "{} = [ {} ]\n",
            "N".repeat(4096),
            "a=1; ".repeat(100)
        );
        let p = run(&format!(
            "A = [ x = 1\nB = [ x = 1 ] junk\nC = [ 2x = 1 ]\nE = [ x ]\n{deep}{long}F = [ x = ERROR ]\nG = [ x = 1 ]\n"
        ));
        assert_eq!(
            super::super::test_support::bad_line_numbers(&p),
            vec![1, 2, 3, 4, 5, 6, 7]
        );
        let why: Vec<String> = p.bad_lines.iter().map(ToString::to_string).collect();
        assert!(why[0].contains("no closing `]`"), "{why:?}");
        assert!(why[4].contains("nested more than"), "{why:?}");
        assert!(why[5].contains("times the line's size"), "{why:?}");
        let got: Vec<String> = p.samples.iter().map(|s| s.key()).collect();
        assert_eq!(got, ["G.x"]);
    }

    #[test]
    fn malformed_lines_are_named_and_the_rest_kept() {
        let p = run("A = 1\nnot an attribute\n2x = 3\nB =\nC = ERROR\nD = 4\n");
        assert_eq!(p.samples.len(), 2);
        let lines = super::super::test_support::bad_line_numbers(&p);
        assert_eq!(lines, vec![2, 3, 4, 5]);
    }
}
