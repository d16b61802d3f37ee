//! `format: influx`: InfluxDB line protocol as Telegraf's exec input reads it:
//! `measurement[,tag=v...] field=v[,field=v...] [timestamp]`. Field values: floats,
//! integers (`12i`, unsigned `12u`), booleans (`t`, `true`, `F`, `False`, ...) and quoted
//! strings. Backslash escapes `,`, `=`, space (and `"` and `\` in strings). One sample per
//! field, named `measurement.field`, with the tags as its labels.

use super::stream::Streaming;
use super::{Budget, Exits, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "influx",
    title: "influx line protocol",
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
    // Each field repeats its line's measurement and tags: charged, so a line of many tags
    // and many fields cannot cost the square of its length.
    let mut budget = Budget::for_output(input.text.len());
    for (i, raw) in input.text.lines().enumerate() {
        let line = raw.trim_start();
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        match point(line, &mut budget) {
            Ok(samples) => out.samples.extend(samples.into_iter().map(|mut s| {
                s.line = i + 1;
                s
            })),
            Err(reason) if budget.spent() => {
                return Err(OutputError::Line {
                    line: i + 1,
                    reason,
                })
            }
            Err(why) => out.bad(i + 1, why),
        }
    }
    Ok(out)
}

/// Text up to the first unescaped char of `stops`; escapes of `, = space " \` are undone.
fn take<'a>(s: &'a str, stops: &[char]) -> (String, &'a str) {
    let mut out = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if stops.contains(&c) {
            return (out, &s[i..]);
        }
        if c == '\\' {
            if let Some(&(_, n)) = chars.peek() {
                if matches!(n, ',' | '=' | ' ' | '"' | '\\') {
                    out.push(n);
                    chars.next();
                    continue;
                }
            }
        }
        out.push(c);
    }
    (out, "")
}

fn point(line: &str, budget: &mut Budget) -> Result<Vec<Sample>, String> {
    let (measurement, mut rest) = take(line, &[',', ' ']);
    if measurement.is_empty() {
        return Err("no measurement name".into());
    }
    let mut tags = Vec::new();
    while let Some(after) = rest.strip_prefix(',') {
        let (key, after_key) = take(after, &['=', ',', ' ']);
        let Some(after_eq) = after_key.strip_prefix('=') else {
            return Err(format!("{measurement}: tag {key:?} has no `=`"));
        };
        let (value, after_value) = take(after_eq, &[',', ' ', '=']);
        if key.is_empty() || value.is_empty() {
            return Err(format!("{measurement}: empty tag key or value"));
        }
        if after_value.starts_with('=') {
            return Err(format!("{measurement}: unescaped `=` in tag {key}"));
        }
        tags.push((key, value));
        rest = after_value;
    }
    let Some(fields) = rest.strip_prefix(' ') else {
        return Err(format!("{measurement}: no fields"));
    };
    let mut s = fields.trim_start();
    let mut samples = Vec::new();
    loop {
        let (key, after_key) = take(s, &['=', ',', ' ']);
        let Some(after_eq) = after_key.strip_prefix('=') else {
            return Err(format!("{measurement}: field {key:?} has no `=`"));
        };
        if key.is_empty() {
            return Err(format!("{measurement}: empty field name"));
        }
        let (value, after_value) = if let Some(q) = after_eq.strip_prefix('"') {
            let (v, after) = take(q, &['"']);
            let Some(after) = after.strip_prefix('"') else {
                return Err(format!(
                    "{measurement}: field {key}'s string has no closing quote"
                ));
            };
            (v, after)
        } else {
            let (raw, after) = take(after_eq, &[',', ' ']);
            let v = field_value(&raw).map_err(|why| format!("{measurement}.{key}: {why}"))?;
            (v, after)
        };
        let tag_bytes: usize = tags
            .iter()
            .map(|(k, v): &(String, String)| 2 * std::mem::size_of::<String>() + k.len() + v.len())
            .sum();
        budget.charge(measurement.len() + 1 + key.len(), tag_bytes, value.len())?;
        samples.push(Sample {
            name: format!("{measurement}.{key}"),
            labels: tags.clone(),
            value,
            line: 0,
        });
        match after_value.chars().next() {
            Some(',') => s = &after_value[1..],
            Some(' ') => {
                let ts = after_value.trim();
                if !ts.is_empty() && ts.parse::<i64>().is_err() {
                    return Err(format!("{measurement}: timestamp {ts:?} is not an integer"));
                }
                break;
            }
            None => break,
            Some(c) => return Err(format!("{measurement}: unexpected {c:?} after field {key}")),
        }
    }
    Ok(samples)
}

fn field_value(raw: &str) -> Result<String, String> {
    match raw {
        "t" | "T" | "true" | "True" | "TRUE" => return Ok("true".into()),
        "f" | "F" | "false" | "False" | "FALSE" => return Ok("false".into()),
        "" => return Err("empty value".into()),
        _ => {}
    }
    if let Some(i) = raw.strip_suffix('i') {
        return i
            .parse::<i64>()
            .map(|n| n.to_string())
            .map_err(|_| format!("{raw:?} is not an integer"));
    }
    if let Some(u) = raw.strip_suffix('u') {
        return u
            .parse::<u64>()
            .map(|n| n.to_string())
            .map_err(|_| format!("{raw:?} is not an unsigned integer"));
    }
    match raw.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(raw.to_owned()),
        _ => Err(format!("{raw:?} is not a number, boolean or quoted string")),
    }
}

/// A line that parses as a point with at least one field.
pub fn looks_like_line(line: &str) -> bool {
    line.contains(' ') && point(line, &mut Budget::for_output(line.len())).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Parsed {
        super::super::test_support::parse_ok(parse, text)
    }

    #[test]
    fn fields_tags_types_and_escapes() {
        let p = run(concat!(
            "# comment\n",
            "disk,path=/scratch,fstype=xfs used_percent=41.5,inodes=123i,ro=false 1700000000000000000\n",
            "my\\ meas,tag\\=k=v\\,1 msg=\"say \\\"hi\\\"\",n=7u\n",
        ));
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let names: Vec<&str> = p.samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "disk.used_percent",
                "disk.inodes",
                "disk.ro",
                "my meas.msg",
                "my meas.n"
            ]
        );
        assert_eq!(p.samples[0].labels[0], ("path".into(), "/scratch".into()));
        assert_eq!(p.samples[1].value, "123");
        assert_eq!(p.samples[2].value, "false");
        assert_eq!(p.samples[3].labels, vec![("tag=k".into(), "v,1".into())]);
        assert_eq!(p.samples[3].value, "say \"hi\"");
        assert_eq!(p.samples[4].value, "7");
        assert_eq!(p.samples[4].line, 3);
    }

    #[test]
    fn a_line_of_many_tags_and_many_fields_is_refused_at_the_budget() {
        // 2,000 tags and 2,000 fields on one 60 kB line: each field would copy every tag.
        let tags: String = (0..2000).map(|i| format!(",t{i}=v{i}")).collect();
        let fields: Vec<String> = (0..2000).map(|i| format!("f{i}=1")).collect();
        let text = format!("m{tags} {}\n", fields.join(","));
        let e = parse(&Input {
            text: &text,
            exit: Some(0),
            own: "x",
        })
        .unwrap_err();
        assert!(
            matches!(&e, OutputError::Line { line: 1, reason } if reason.contains("times the output's size")),
            "{e:?}"
        );
        // The fields without the tags are an answer.
        let text = format!("m {}\n", fields.join(","));
        assert_eq!(run(&text).samples.len(), 2000);
    }

    #[test]
    fn malformed_lines_are_named_and_the_rest_kept() {
        let p =
            run("a x=1\nnofields\nb y=\ncc z=\"open\nd w=1 notatime\ne v=12x\nf,t u=1\nok k=2\n");
        assert_eq!(p.samples.len(), 2, "{:?}", p.samples);
        let lines = super::super::test_support::bad_line_numbers(&p);
        assert_eq!(lines, vec![2, 3, 4, 5, 6, 7]);
    }
}
