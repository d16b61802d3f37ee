//! `format: elim`: LSF ELIM lines, `n name1 value1 ... nameN valueN`.

use super::stream::{Lines, Streaming};
use super::{clip, Exits, FormatDef, Input, LastWins, OutputError, Pair, Parsed};

/// LSF's `ELIM_ABORT_VALUE`: an elim that exits with it has nothing to report on this host.
pub const ELIM_ABORT_VALUE: i32 = 97;

pub const DEF: FormatDef = FormatDef {
    name: "elim",
    title: "LSF ELIM lines",
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
    LastWins::of_lines(input.text, |line| elim_pairs(line).map_err(|e| e.to_string()))
}

/// A stream's line: the values it names (`0`: none this time).
fn stream_line(line: &str, _own: &str) -> Result<Vec<Pair>, String> {
    parse_elim_line(line).map_err(|e| e.to_string())
}

/// Every complete line updates the values it names; the last line wins.
pub fn parse_elim(t: &str) -> Result<Vec<Pair>, OutputError> {
    parse(&Input {
        text: t,
        exit: None,
        own: "",
    })
    .map(|p| p.pairs())
}

/// Why an ELIM line is not `n name value ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElimLineError {
    #[error("expected a count first (`n name value ...`), got {0:?}")]
    NoCount(String),
    #[error("count says {count} pairs but {words} words follow")]
    CountMismatch { count: usize, words: usize },
}

/// One ELIM line. `0` alone is valid: nothing to report this time.
pub fn parse_elim_line(line: &str) -> Result<Vec<Pair>, ElimLineError> {
    Ok(elim_pairs(line)?
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect())
}

/// One ELIM line's names and values, borrowed from it: the line parser both the batch parse
/// and a stream's read a line with.
fn elim_pairs(line: &str) -> Result<Vec<(&str, &str)>, ElimLineError> {
    Ok(elim_words(line)?
        .chunks_exact(2)
        .map(|c| (c[0], c[1]))
        .collect())
}

/// The names and values of one ELIM line, in turn.
fn elim_words(line: &str) -> Result<Vec<&str>, ElimLineError> {
    let mut words = line.split_whitespace();
    let n: usize = match words.next() {
        Some(w) => w
            .parse()
            .map_err(|_| ElimLineError::NoCount(clip(w)))?,
        None => return Ok(Vec::new()),
    };
    let rest: Vec<&str> = words.collect();
    if n.checked_mul(2) != Some(rest.len()) {
        return Err(ElimLineError::CountMismatch {
            count: n,
            words: rest.len(),
        });
    }
    Ok(rest)
}
