//! Which sample feeds which resource. `select:` maps a resource to a selector in its
//! format's terms (`metric{label="v"}`, a perfdata label, `measurement.field{tag="v"}`, a
//! ClassAd attribute); without one, a sample whose name matches the resource's (case
//! ignored, characters other than letters, digits and `_` read as `_`) feeds it. Several
//! matching samples are an error unless `aggregate:` says how to combine them.

use std::collections::BTreeMap;

use super::{Format, Parsed, Sample};
use crate::value::{Reading, Valtype, Value};

/// `name{label="value",...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = Sample {
            name: self.name.clone(),
            labels: self.labels.clone(),
            value: String::new(),
            line: 0,
        };
        f.write_str(&s.key())
    }
}

/// How several matching samples become one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    Sum,
    Min,
    Max,
    Count,
}

impl Aggregate {
    pub const NAMES: &'static [&'static str] = &["sum", "min", "max", "count"];

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "sum" => Some(Self::Sum),
            "min" => Some(Self::Min),
            "max" => Some(Self::Max),
            "count" => Some(Self::Count),
            _ => None,
        }
    }
}

/// What `select:` says for one resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pick {
    /// `None`: the sample named like the resource.
    pub selector: Option<Selector>,
    pub aggregate: Option<Aggregate>,
    /// The value when the output has no matching sample.
    pub default: Option<String>,
    /// The resource's values go to a shared instance on this host (not from `select:`, from
    /// the plan): without a selector, a sample for the global host (`host="global"`, as a
    /// Grid Engine load sensor's `global:` line) feeds it before any other, and never a
    /// host's own instance.
    pub shared: bool,
}

/// A probe's `select:` and `aggregate:`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    pub picks: BTreeMap<String, Pick>,
    /// For the resources whose pick does not say.
    pub aggregate: Option<Aggregate>,
}

impl Selection {
    pub fn pick(&self, resource: &str) -> Pick {
        let mut p = self.picks.get(resource).cloned().unwrap_or_default();
        p.aggregate = p.aggregate.or(self.aggregate);
        p
    }

    /// [`Selection::pick`] for a resource whose values go to a shared instance or not.
    pub fn pick_for(&self, resource: &str, shared: bool) -> Pick {
        Pick {
            shared,
            ..self.pick(resource)
        }
    }
}

/// The label a sample for the cluster as a whole carries (`host="global"`): Grid Engine's
/// `global:name:value`, or a Prometheus or influx sample labelled so.
pub const HOST_LABEL: &str = "host";

/// Whether `sample` is a value for the global host rather than this one.
pub fn is_global(sample: &Sample) -> bool {
    sample
        .labels
        .iter()
        .any(|(k, v)| k == HOST_LABEL && v.eq_ignore_ascii_case(super::sge::GLOBAL))
}

/// A `select:` selector that does not parse: the selector as written and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.problem.describe(&self.selector))]
pub struct SelectorError {
    pub selector: String,
    pub problem: SelectorProblem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectorProblem {
    NoName,
    /// The text after the closing brace.
    AfterBrace(String),
    NoPairs,
    /// The label whose value is not quoted.
    Unquoted(String),
    /// The label whose value has no closing quote.
    Unclosed(String),
    EmptyLabel,
    /// The label after which neither `,` nor `}` follows.
    NoSeparator(String),
}

impl SelectorProblem {
    fn describe(&self, s: &str) -> String {
        match self {
            Self::NoName => format!("selector {s:?} has no name before `{{`"),
            Self::AfterBrace(after) => format!("unexpected {after:?} after `}}` in selector {s:?}"),
            Self::NoPairs => format!("selector {s:?}: expected label=\"value\" pairs in braces"),
            Self::Unquoted(key) => {
                format!("selector {s:?}: the value of {key} must be in double quotes")
            }
            Self::Unclosed(key) => {
                format!("selector {s:?}: the value of {key} has no closing quote")
            }
            Self::EmptyLabel => format!("selector {s:?} has an empty label name"),
            Self::NoSeparator(key) => format!("selector {s:?}: expected `,` or `}}` after {key}"),
        }
    }
}

/// Parse `name{k="v",...}`. The name is everything before `{` (a perfdata label may hold
/// spaces or `/`); label values are double-quoted with `\"` and `\\` escapes.
pub fn parse_selector(s: &str) -> Result<Selector, SelectorError> {
    let bad = |problem| SelectorError {
        selector: s.to_owned(),
        problem,
    };
    let (name, labels) = match s.find('{') {
        None => (s.trim(), ""),
        Some(i) => (s[..i].trim(), &s[i + 1..]),
    };
    // A perfdata label may be quoted as the plugin prints it: 'queue depth'.
    let name = match name.strip_prefix('\'').and_then(|n| n.strip_suffix('\'')) {
        Some(inner) if !inner.is_empty() => inner,
        _ => name,
    };
    if name.is_empty() {
        return Err(bad(SelectorProblem::NoName));
    }
    let mut out = Selector {
        name: name.to_owned(),
        labels: Vec::new(),
    };
    if !s.contains('{') {
        return Ok(out);
    }
    let mut rest = labels.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            if !after.trim().is_empty() {
                return Err(bad(SelectorProblem::AfterBrace(after.trim().to_owned())));
            }
            return Ok(out);
        }
        let Some((key, after)) = rest.split_once('=') else {
            return Err(bad(SelectorProblem::NoPairs));
        };
        let key = key.trim();
        let Some(quoted) = after.trim_start().strip_prefix('"') else {
            return Err(bad(SelectorProblem::Unquoted(key.to_owned())));
        };
        let Some((value, after)) = super::prometheus::quoted_value(quoted) else {
            return Err(bad(SelectorProblem::Unclosed(key.to_owned())));
        };
        if key.is_empty() {
            return Err(bad(SelectorProblem::EmptyLabel));
        }
        out.labels.push((key.to_owned(), value));
        rest = after.trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
        } else if !rest.starts_with('}') {
            return Err(bad(SelectorProblem::NoSeparator(key.to_owned())));
        }
    }
}

/// How a sample's name is compared with a resource's: case ignored, every character other
/// than letters, digits and `_` read as `_` (`node:load1` is `node_load1`). No string is
/// built: this runs for every sample and every fed resource.
fn same_name(name: &str, resource: &str) -> bool {
    let mut r = resource.chars();
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        };
        match r.next() {
            Some(rc) if rc.eq_ignore_ascii_case(&c) => {}
            _ => return false,
        }
    }
    r.next().is_none()
}

fn matches_directly(format: Format, sample: &Sample, resource: &str) -> bool {
    if !format.selectable() {
        return sample.name == resource;
    }
    if same_name(&sample.name, resource) {
        return true;
    }
    // The name the format's own ecosystem calls it by (a Netdata dimension id).
    if format
        .def()
        .peer
        .short_name(sample)
        .is_some_and(|short| same_name(short, resource))
    {
        return true;
    }
    // A ClassAd named by its `- NAME` separator also feeds `NAME_Attr`.
    format == Format::Classad
        && sample
            .labels
            .iter()
            .filter(|(k, _)| k == super::classad::AD_LABEL)
            .any(|(_, tag)| same_name(&format!("{tag}_{}", sample.name), resource))
}

fn matches_selector(format: Format, sample: &Sample, sel: &Selector) -> bool {
    let name_ok = if format.def().fold_case {
        sample.name.eq_ignore_ascii_case(&sel.name)
    } else {
        sample.name == sel.name
    };
    name_ok && sel.labels.iter().all(|l| sample.labels.contains(l))
}

/// Whether `sample` is one `pick` takes for `resource`. Without a selector, a global
/// sample never feeds a host's own instance.
pub fn matches(format: Format, pick: &Pick, sample: &Sample, resource: &str) -> bool {
    match &pick.selector {
        Some(sel) => matches_selector(format, sample, sel),
        None => (pick.shared || !is_global(sample)) && matches_directly(format, sample, resource),
    }
}

/// Whether `pick` gives `resource` a reading whatever the output holds (a count, a default).
pub fn always_answers(pick: &Pick) -> bool {
    pick.aggregate == Some(Aggregate::Count) || pick.default.is_some()
}

/// The reading `parsed` gives `resource`, or `None` when it holds nothing for it.
pub fn reading(
    format: Format,
    pick: &Pick,
    parsed: &Parsed,
    resource: &str,
    valtype: Valtype,
) -> Option<Reading> {
    let mut found: Vec<&Sample> = match &pick.selector {
        // A JSON record is picked by its keys' values, not by its place in an array.
        Some(sel) if format == Format::Json && !sel.labels.is_empty() => {
            super::json::in_records(&parsed.samples, sel)
        }
        _ => parsed
            .samples
            .iter()
            .filter(|s| matches(format, pick, s, resource))
            .collect(),
    };
    if pick.selector.is_none() && pick.shared && found.iter().any(|s| is_global(s)) {
        // The global value is the shared instance's; this host's own is not.
        found.retain(|s| is_global(s));
    }
    let typed = |s: &Sample| match valtype.parse(&s.value) {
        Ok(v) => Reading::Ok(v),
        Err(e) if s.line > 0 => Reading::Failed(format!("{e} (output line {})", s.line).into()),
        Err(e) => Reading::Failed(crate::value::Failure::new(e)),
    };
    if pick.aggregate == Some(Aggregate::Count) {
        return Some(match valtype {
            Valtype::Numeric => Reading::Ok(Value::Numeric(found.len() as f64)),
            other => Reading::Failed(
                format!("`aggregate: count` gives a number; {resource} is {other}").into(),
            ),
        });
    }
    match (found.as_slice(), &pick.aggregate) {
        ([], _) => pick.default.as_ref().map(|d| match valtype.parse(d) {
            Ok(v) => Reading::Ok(v),
            Err(e) => Reading::Failed(format!("the default: {e}").into()),
        }),
        ([one], _) => Some(typed(one)),
        (many, Some(agg)) => Some(combine(*agg, many, resource, valtype)),
        (many, None) => {
            let mut shown: Vec<String> = many.iter().take(4).map(|s| s.key()).collect();
            if many.len() > 4 {
                shown.push(format!("and {} more", many.len() - 4));
            }
            Some(Reading::Failed(format!(
                "{} samples match {}: {}; add labels to its `select:` or set `aggregate: sum|min|max|count`",
                many.len(),
                pick.selector
                    .as_ref()
                    .map_or_else(|| resource.to_owned(), |s| s.to_string()),
                shown.join(", ")
            ).into()))
        }
    }
}

fn combine(agg: Aggregate, samples: &[&Sample], resource: &str, valtype: Valtype) -> Reading {
    if valtype != Valtype::Numeric {
        return Reading::Failed(
            format!("`aggregate` combines numbers; {resource} is {valtype}").into(),
        );
    }
    let mut values = Vec::with_capacity(samples.len());
    for s in samples {
        match Valtype::Numeric.parse(&s.value) {
            Ok(Value::Numeric(v)) => values.push(v),
            Ok(_) => {}
            Err(e) => return Reading::Failed(format!("{} (output line {})", e, s.line).into()),
        }
    }
    let v = match agg {
        Aggregate::Sum => values.iter().sum(),
        Aggregate::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        Aggregate::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Aggregate::Count => values.len() as f64,
    };
    Reading::Ok(Value::Numeric(v))
}

/// Why a resource got nothing from a run whose output parsed, with what might fix it.
pub fn absent_reason(
    format: Format,
    pick: &Pick,
    parsed: &Parsed,
    text: &str,
    resource: &str,
) -> String {
    let mut why = match &pick.selector {
        Some(sel) => format!("{resource}: no sample matches `{sel}` in the output"),
        None => format!("{resource:?} is not in the probe's output"),
    };
    let global_only = pick.selector.is_none()
        && !pick.shared
        && parsed
            .samples
            .iter()
            .any(|s| is_global(s) && matches_directly(format, s, resource));
    if global_only {
        why = format!(
            "{resource:?} is in the probe's output only for the global host (host=\"global\"), which feeds a shared instance, not this host's own; give {resource} a shared resourcemap (location: [all]), or `select:` it"
        );
    }
    if let Some(first) = parsed.bad_lines.first() {
        why.push_str(&format!(
            "; {} line(s) did not parse, the first: {first}",
            parsed.bad_count()
        ));
    }
    match super::looks_like(text) {
        Some(f) if f != format => why.push_str(&format!(
            "; the output looked like {}: did you mean `format: {}`?",
            f.def().title,
            f.as_str()
        )),
        _ => {}
    }
    if format.def().empty_is_an_answer && parsed.samples.is_empty() && parsed.bad_count() == 0 {
        why.push_str(
            "; it printed no samples: if that means a value, give it as `default:` in `select:`",
        );
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse() {
        assert_eq!(
            parse_selector("node_md_disks{device=\"md0\", state=\"act\\\"ive\"}").unwrap(),
            Selector {
                name: "node_md_disks".into(),
                labels: vec![
                    ("device".into(), "md0".into()),
                    ("state".into(), "act\"ive".into())
                ],
            }
        );
        assert_eq!(parse_selector("/").unwrap().name, "/");
        assert_eq!(parse_selector("with space").unwrap().name, "with space");
        assert_eq!(parse_selector("'with space'").unwrap().name, "with space");
        for bad in [
            "{a=\"1\"}",
            "m{a=1}",
            "m{a=\"1\"",
            "m{a=\"1\"} x",
            "m{a=\"1\" b=\"2\"}",
        ] {
            assert!(parse_selector(bad).is_err(), "{bad}");
        }
    }

    /// (name, labels, value)
    type Fixture<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

    fn parsed(samples: &[Fixture]) -> Parsed {
        Parsed::of(
            samples
                .iter()
                .enumerate()
                .map(|(i, (n, l, v))| Sample {
                    name: (*n).into(),
                    labels: l.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect(),
                    value: (*v).into(),
                    line: i + 1,
                })
                .collect(),
        )
    }

    #[test]
    fn direct_selected_several_and_aggregated() {
        let p = parsed(&[
            ("node:load1", &[], "0.5"),
            ("disk_free", &[("path", "/")], "10"),
            ("disk_free", &[("path", "/tmp")], "5"),
        ]);
        let f = Format::Prometheus;
        let get = |pick: &Pick, r: &str| reading(f, pick, &p, r, Valtype::Numeric);
        assert_eq!(
            get(&Pick::default(), "NODE_LOAD1"),
            Some(Reading::Ok(Value::Numeric(0.5)))
        );
        let sel = |s: &str| Pick {
            selector: Some(parse_selector(s).unwrap()),
            ..Pick::default()
        };
        assert_eq!(
            get(&sel("disk_free{path=\"/tmp\"}"), "x"),
            Some(Reading::Ok(Value::Numeric(5.0)))
        );
        let Some(Reading::Failed(e)) = get(&sel("disk_free"), "x") else {
            panic!()
        };
        assert!(
            e.to_string().contains(
                "2 samples match disk_free: disk_free{path=\"/\"}, disk_free{path=\"/tmp\"}"
            ),
            "{e}"
        );
        let mut sum = sel("disk_free");
        sum.aggregate = Some(Aggregate::Sum);
        assert_eq!(get(&sum, "x"), Some(Reading::Ok(Value::Numeric(15.0))));
        sum.aggregate = Some(Aggregate::Count);
        assert_eq!(get(&sel("nothing"), "x"), None);
        let mut dflt = sel("nothing");
        dflt.default = Some("0".into());
        assert_eq!(get(&dflt, "x"), Some(Reading::Ok(Value::Numeric(0.0))));
    }

    /// Grid Engine's `global:` line, a Prometheus or influx sample labelled `host="global"`:
    /// a shared instance takes it before this host's own sample of the same name, and a
    /// host's own instance never takes it (and says what would).
    #[test]
    fn a_global_sample_feeds_the_shared_instance_and_never_a_hosts_own() {
        let p = parsed(&[
            ("matlab_lic", &[("host", "global")], "12"),
            ("matlab_lic", &[], "3"),
            ("only_global", &[("host", "GLOBAL")], "7"),
        ]);
        let f = Format::Prometheus;
        let shared = Pick {
            shared: true,
            ..Pick::default()
        };
        let own = Pick::default();
        let get = |pick: &Pick, r: &str| reading(f, pick, &p, r, Valtype::Numeric);
        assert_eq!(
            get(&shared, "matlab_lic"),
            Some(Reading::Ok(Value::Numeric(12.0)))
        );
        assert_eq!(
            get(&own, "matlab_lic"),
            Some(Reading::Ok(Value::Numeric(3.0)))
        );
        assert_eq!(
            get(&shared, "only_global"),
            Some(Reading::Ok(Value::Numeric(7.0)))
        );
        assert_eq!(get(&own, "only_global"), None);
        let why = absent_reason(f, &own, &p, "", "only_global");
        assert!(why.contains("only for the global host"), "{why}");
        // A selector says exactly what it takes, whichever instance the resource has.
        let sel = Pick {
            selector: Some(parse_selector("matlab_lic{host=\"global\"}").unwrap()),
            ..Pick::default()
        };
        assert_eq!(get(&sel, "x"), Some(Reading::Ok(Value::Numeric(12.0))));
    }
}
