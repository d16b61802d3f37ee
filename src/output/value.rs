//! `format: value`: the first non-blank line is the probe's own value.

use super::{Exits, OutputError};
use super::{FormatDef, Input, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "value",
    title: "a first-line value",
    parse,
    exits: Exits::Zero,
    selectable: false,
    empty_is_an_answer: false,
    fold_case: false,
    streams: true,
    peer: &super::NO_PEER,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let v = parse_value(input.text)?;
    Ok(Parsed::of(vec![Sample::plain(input.own, &v)]))
}

/// The first non-blank line.
pub fn parse_value(t: &str) -> Result<String, OutputError> {
    t.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or(OutputError::Empty)
}
