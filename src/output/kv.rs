//! `format: kv`: `name = value` lines (HTCondor startd cron style without ClassAd typing).

use super::stream::{Lines, Streaming};
use super::{clip, Exits, FormatDef, Input, LastWins, OutputError, Pair, Parsed};

pub const DEF: FormatDef = FormatDef {
    name: "kv",
    title: "`name = value` lines",
    parse,
    exits: Exits::Zero,
    selectable: false,
    empty_is_an_answer: false,
    fold_case: false,
    stream: Streaming::Lines(Lines {
        parse: stream_line,
        whole: false,
    }),
    peer: &super::NO_PEER,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    LastWins::of_lines(input.text, kv_line)
}

/// A stream's line: one `name = value`, or a `#` comment (nothing).
fn stream_line(line: &str, _own: &str) -> Result<Vec<Pair>, String> {
    if line.trim_start().starts_with('#') {
        return Ok(Vec::new());
    }
    parse_kv(line).map_err(|e| e.to_string())
}

/// `name = value` lines; blank lines and `#` comments are ignored; a value in double quotes
/// (HTCondor strings) loses its quotes. A later line for the same name wins.
pub fn parse_kv(t: &str) -> Result<Vec<Pair>, OutputError> {
    parse(&Input {
        text: t,
        exit: None,
        own: "",
    })
    .map(|p| p.pairs())
}

/// One line: `None` for a blank or comment line. The line parser both the batch parse and
/// (through [`parse_kv`]) a stream's read a line with.
fn kv_line(line: &str) -> Result<Option<(&str, &str)>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let Some((k, v)) = line.split_once('=') else {
        return Err(format!("expected `name = value`, got {:?}", clip(line)));
    };
    let (k, mut v) = (k.trim(), v.trim());
    if k.is_empty() || k.contains(char::is_whitespace) {
        return Err(format!("bad name {:?}", clip(k)));
    }
    if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        v = &v[1..v.len() - 1];
    }
    Ok(Some((k, v)))
}
