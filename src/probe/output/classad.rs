//! `format: classad`: what HTCondor startd cron scripts print. `Name = value` lines whose
//! values are ClassAd literals: numbers, `"strings"` (with `\"` and `\\`), `true`/`false`;
//! `UNDEFINED` means "no value" (the attribute is left out); any other expression
//! (`True && regexp(...)`) is kept as its text, a string. Attribute names are
//! case-insensitive. A line `-` ends one ad; `- NAME` ends it and names it: its attributes
//! get the label `ad="NAME"` (select them as `Attr{ad="NAME"}`; without `select:` a resource
//! named `NAME_Attr` gets them). Within one run, a later ad's value for the same attribute
//! (and the same ad name) replaces an earlier one. The output is read whatever the exit
//! status, as HTCondor does (a non-zero exit with nothing printed is a failed run).

use std::collections::hash_map::{Entry, HashMap};

use super::{Exits, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "classad",
    title: "ClassAd attributes",
    parse,
    exits: Exits::Any,
    selectable: true,
    empty_is_an_answer: true,
    fold_case: true,
};

/// The label a `- NAME` separator puts on its ad's attributes.
pub const AD_LABEL: &str = "ad";

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut ad_start = 0;
    for (i, raw) in input.text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(tag) = line.strip_prefix('-') {
            let tag = tag.trim();
            if !tag.is_empty() {
                for s in &mut out.samples[ad_start..] {
                    s.labels = vec![(AD_LABEL.to_owned(), tag.to_owned())];
                }
            }
            ad_start = out.samples.len();
            continue;
        }
        match attribute(line) {
            Ok(Some((name, value))) => out.samples.push(Sample {
                name,
                labels: Vec::new(),
                value,
                line: i + 1,
            }),
            Ok(None) => {}
            Err(why) => out.bad(i + 1, why),
        }
    }
    // A later update of the same attribute wins (names compared without case).
    let mut kept: Vec<Sample> = Vec::with_capacity(out.samples.len());
    let mut index: HashMap<(String, Vec<(String, String)>), usize> = HashMap::new();
    for s in out.samples.drain(..) {
        match index.entry((s.name.to_ascii_lowercase(), s.labels.clone())) {
            Entry::Occupied(e) => kept[*e.get()] = s,
            Entry::Vacant(e) => {
                e.insert(kept.len());
                kept.push(s);
            }
        }
    }
    out.samples = kept;
    Ok(out)
}

/// `Name = value`: `None` for UNDEFINED.
fn attribute(line: &str) -> Result<Option<(String, String)>, String> {
    let Some((name, value)) = line.split_once('=') else {
        return Err(format!(
            "expected `Name = value` or `-`, got {:?}",
            super::clip(line)
        ));
    };
    let (name, value) = (name.trim(), value.trim());
    let name_ok = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !name_ok {
        return Err(format!("bad attribute name {:?}", super::clip(name)));
    }
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
    Ok(Some((name.to_owned(), literal)))
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
    fn malformed_lines_are_named_and_the_rest_kept() {
        let p = run("A = 1\nnot an attribute\n2x = 3\nB =\nC = ERROR\nD = 4\n");
        assert_eq!(p.samples.len(), 2);
        let lines = super::super::test_support::bad_line_numbers(&p);
        assert_eq!(lines, vec![2, 3, 4, 5]);
    }
}
