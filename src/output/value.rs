//! `format: value`: the first non-blank line is the probe's own value.

use super::stream::{Lines, Streaming};
use super::{Exits, OutputError, Pair};
use super::{FormatDef, Input, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "value",
    title: "a first-line value",
    parse,
    exits: Exits::Zero,
    selectable: false,
    empty_is_an_answer: false,
    fold_case: false,
    stream: Streaming::Lines(Lines {
        parse: stream_line,
        whole: true,
    }),
    peer: &super::NO_PEER,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    // The value line is moved into its sample, not copied (a run of every exec probe).
    let mut sample = Sample::plain(input.own, "");
    sample.value = parse_value(input.text)?;
    Ok(Parsed::of(vec![sample]))
}

/// A stream's line: the probe's own value.
fn stream_line(line: &str, own: &str) -> Result<Vec<Pair>, String> {
    parse_value(line)
        .map(|v| vec![(own.to_owned(), v)])
        .map_err(|e| e.to_string())
}

/// The first non-blank line.
pub fn parse_value(t: &str) -> Result<String, OutputError> {
    t.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or(OutputError::Empty)
}
