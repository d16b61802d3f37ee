//! `format: elim`: LSF ELIM lines, `n name1 value1 ... nameN valueN`.

use super::{clip, upsert, Exits, FormatDef, Input, OutputError, Pair, Parsed};

pub const DEF: FormatDef = FormatDef {
    name: "elim",
    title: "LSF ELIM lines",
    parse,
    exits: Exits::Zero,
    selectable: false,
    empty_is_an_answer: false,
    fold_case: false,
    streams: true,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    parse_elim(input.text).map(Parsed::from_pairs)
}

/// Every complete line updates the values it names; the last line wins.
pub fn parse_elim(t: &str) -> Result<Vec<Pair>, OutputError> {
    let mut pairs: Vec<Pair> = Vec::new();
    for (i, line) in t.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        for (k, v) in parse_elim_line(line).map_err(|reason| OutputError::Line {
            line: i + 1,
            reason,
        })? {
            upsert(&mut pairs, &k, &v);
        }
    }
    if pairs.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(pairs)
}

/// One ELIM line. `0` alone is valid: nothing to report this time.
pub fn parse_elim_line(line: &str) -> Result<Vec<Pair>, String> {
    let mut words = line.split_whitespace();
    let n: usize = match words.next() {
        Some(w) => w.parse().map_err(|_| {
            format!(
                "expected a count first (`n name value ...`), got {:?}",
                clip(w)
            )
        })?,
        None => return Ok(Vec::new()),
    };
    let rest: Vec<&str> = words.collect();
    if rest.len() != n * 2 {
        return Err(format!(
            "count says {n} pairs but {} words follow",
            rest.len()
        ));
    }
    Ok(rest
        .chunks(2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect())
}
