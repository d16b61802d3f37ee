//! `format: kv`: `name = value` lines (HTCondor startd cron style without ClassAd typing).

use super::{clip, Exits, FormatDef, Input, OutputError, Pair, PairSet, Parsed};

pub const DEF: FormatDef = FormatDef {
    name: "kv",
    title: "`name = value` lines",
    parse,
    exits: Exits::Zero,
    selectable: false,
    empty_is_an_answer: false,
    fold_case: false,
    streams: true,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    parse_kv(input.text).map(Parsed::from_pairs)
}

/// `name = value` lines; blank lines and `#` comments are ignored; a value in double quotes
/// (HTCondor strings) loses its quotes. A later line for the same name wins.
pub fn parse_kv(t: &str) -> Result<Vec<Pair>, OutputError> {
    let mut pairs = PairSet::default();
    for (i, line) in t.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(OutputError::Line {
                line: i + 1,
                reason: format!("expected `name = value`, got {:?}", clip(line)),
            });
        };
        let (k, mut v) = (k.trim(), v.trim());
        if k.is_empty() || k.contains(char::is_whitespace) {
            return Err(OutputError::Line {
                line: i + 1,
                reason: format!("bad name {:?}", clip(k)),
            });
        }
        if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
            v = &v[1..v.len() - 1];
        }
        pairs.upsert(k, v);
    }
    if pairs.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(pairs.into_vec())
}
