//! `format: prometheus`: the Prometheus text exposition format 0.0.4, and OpenMetrics text
//! where it differs (`# EOF`, `# UNIT`, exemplars after ` # `). `# HELP`/`# TYPE` and other
//! comments are skipped; a histogram or summary is its `_bucket`, `_sum`, `_count` (and
//! quantile) samples as printed; timestamps are ignored; `NaN` and `±Inf` are passed on
//! (a numeric resource refuses them). No samples at all is a normal answer.

use super::stream::Streaming;
use super::{Exits, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "prometheus",
    title: "Prometheus text",
    parse,
    exits: Exits::Zero,
    selectable: true,
    empty_is_an_answer: true,
    fold_case: false,
    stream: Streaming::No,
    peer: &super::NO_PEER,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    for (i, raw) in input.text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if line == "# EOF" {
            break;
        }
        if line.starts_with('#') {
            continue;
        }
        match sample(line) {
            Ok((name, labels, value)) => out.samples.push(Sample {
                name,
                labels,
                value,
                line: i + 1,
            }),
            Err(why) => out.bad(i + 1, why),
        }
    }
    Ok(out)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

type Labels = Vec<(String, String)>;

/// `name{labels} value [timestamp]`.
fn sample(line: &str) -> Result<(String, Labels, String), String> {
    let end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..end];
    if !name.starts_with(is_name_start) {
        return Err(format!(
            "expected a metric name, got {:?}",
            super::clip(line)
        ));
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (l, after) = label_set(inner)?;
        labels = l;
        rest = after;
    }
    // OpenMetrics exemplar: `value [timestamp] # {labels} value`.
    let rest = rest.split(" # ").next().unwrap_or(rest);
    let mut words = rest.split_whitespace();
    let Some(value) = words.next() else {
        return Err(format!("{name} has no value"));
    };
    check_value(value).map_err(|why| format!("{name}: {why}"))?;
    if let Some(ts) = words.next() {
        if ts.parse::<f64>().is_err() {
            return Err(format!("{name}: timestamp {ts:?} is not a number"));
        }
    }
    if let Some(extra) = words.next() {
        return Err(format!("{name}: unexpected {extra:?} after the timestamp"));
    }
    Ok((name.to_owned(), labels, value.to_owned()))
}

fn check_value(v: &str) -> Result<(), String> {
    let ok = matches!(v, "NaN" | "+Inf" | "-Inf" | "Inf" | "+inf" | "-inf")
        || v.parse::<f64>().is_ok_and(f64::is_finite);
    if ok {
        Ok(())
    } else {
        Err(format!("value {v:?} is not a number"))
    }
}

/// The label pairs after `{`, up to the closing `}`; returns the text after it.
fn label_set(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let end = s.find(|c: char| !is_name_char(c)).unwrap_or(s.len());
        let key = &s[..end];
        if key.is_empty() {
            return Err(format!("expected a label name at {:?}", super::clip(s)));
        }
        let Some(after_eq) = s[end..].trim_start().strip_prefix('=') else {
            return Err(format!("label {key} has no `=`"));
        };
        let Some(quoted) = after_eq.trim_start().strip_prefix('"') else {
            return Err(format!("label {key}'s value is not in double quotes"));
        };
        let (value, after) = quoted_value(quoted)
            .ok_or_else(|| format!("label {key}'s value has no closing quote"))?;
        labels.push((key.to_owned(), value));
        s = after.trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(format!("expected `,` or `}}` after label {key}"));
        }
    }
}

/// A label value after its opening quote: `\\`, `\"` and `\n` are escapes.
pub(super) fn quoted_value(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// A line that is a sample with labels: what Prometheus text fed to `kv` looks like.
pub fn looks_like_sample(line: &str) -> bool {
    sample(line).is_ok_and(|(_, labels, _)| !labels.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Parsed {
        super::super::test_support::parse_ok(parse, text)
    }

    #[test]
    fn samples_labels_escapes_and_timestamps() {
        let p = run(concat!(
            "# HELP node_md_disks Disks.\n# TYPE node_md_disks gauge\n",
            "node_md_disks{device=\"md0\",state=\"active\"} 2\n",
            "odd{path=\"C:\\\\dir \\\"x\\\"\\n\",} 1.5e3 1700000000000\n",
            "plain 7\n",
            "nan_one NaN\n",
        ));
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(p.samples.len(), 4);
        assert_eq!(
            p.samples[0].labels,
            vec![
                ("device".into(), "md0".into()),
                ("state".into(), "active".into())
            ]
        );
        assert_eq!(p.samples[1].labels[0].1, "C:\\dir \"x\"\n");
        assert_eq!(p.samples[1].value, "1.5e3");
        assert_eq!(p.samples[2].line, 5);
        assert_eq!(p.samples[3].value, "NaN");
    }

    #[test]
    fn openmetrics_eof_and_exemplars() {
        let p = run("a_total 3 # {trace_id=\"x\"} 1\n# EOF\nb 1\n");
        assert_eq!(p.samples.len(), 1);
        assert_eq!(p.samples[0].value, "3");
    }

    #[test]
    fn malformed_lines_are_named_and_the_rest_kept() {
        let p = run("good 1\n{x=\"1\"} 2\nm{a=1} 3\nm{a=\"1\" 4\nn\nv abc\nw 1 2 3\nalso_good 2\n");
        assert_eq!(p.samples.len(), 2);
        let lines = super::super::test_support::bad_line_numbers(&p);
        assert_eq!(lines, vec![2, 3, 4, 5, 6, 7]);
    }
}
