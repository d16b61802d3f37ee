//! How a stream probe reads a format as its output comes, declared by each format's entry
//! in the table ([`super::FormatDef::stream`]): not at all, each line an update, or lines
//! gathered into blocks that a terminator line ends (ClassAd's `-`). A new streaming format
//! is its entry plus its parser; the stream supervisor reads every one through
//! [`BlockStream`] or the line parser its entry names, never by a `match` on the format.

use super::{DeclaredBudget, Pair, Parsed};

/// How a stream reads a format (see the module's text).
#[derive(Clone, Copy)]
pub enum Streaming {
    /// Only a finished run's whole output: a stream probe may not use it.
    No,
    /// Each line is one update.
    Lines(Lines),
    /// Lines gather into a block; a terminator line ends it, and the block is one update.
    Blocks(Blocks),
    /// A reader that keeps state across lines (Netdata's charts, declared once and updated
    /// every interval) or whose lines carry labelled samples (collectd's PUTVAL): each
    /// update it completes gives some of the probe's values.
    Sessions(Sessions),
}

/// A stateful format's stream entry.
#[derive(Clone, Copy)]
pub struct Sessions {
    /// A fresh reader for each start of the child: what it declared dies with it.
    pub start: fn() -> Box<dyn SessionReader>,
    /// What one update is called, for the messages ("chart update").
    pub called: &'static str,
}

/// Reads one child's lines (see [`Sessions`]).
pub trait SessionReader: Send {
    /// One line (without its newline; `number` counts from the child's start). `Ok(None)`:
    /// nothing to apply yet (a declaration, a line inside an update); `Ok(Some(parsed))`:
    /// an update's samples, with any of its values that could not be read as bad lines;
    /// `Err`: the line is malformed. What the reader keeps of a declaration is charged to
    /// `declared`, the probe's budget; past it the declaration is dropped, not an error.
    fn line(
        &mut self,
        line: &str,
        number: usize,
        declared: &mut DeclaredBudget,
    ) -> Result<Option<Parsed>, String>;
}

impl Streaming {
    pub fn reads(&self) -> bool {
        !matches!(self, Streaming::No)
    }
}

/// A line format's stream entry.
#[derive(Clone, Copy)]
pub struct Lines {
    /// One line (trimmed of its newline, not blank) as `name -> raw` pairs; none: nothing
    /// to apply (a comment, ELIM's `0`). `own` names `format: value`'s value.
    pub parse: fn(line: &str, own: &str) -> Result<Vec<Pair>, String>,
    /// A line is a whole answer (ELIM, value); else each line gives one value of several
    /// (kv), and a stream's first values wait for every fed resource or a bad line.
    pub whole: bool,
}

/// A block format's stream entry.
#[derive(Clone, Copy)]
pub struct Blocks {
    /// Whether a line (trimmed) is the terminator; `Some(name)`: it is, naming the block
    /// (ClassAd's `- NAME`; empty for none).
    pub end: fn(line: &str) -> Option<&str>,
    /// One block's lines (terminator left out) into samples; a block's name labels them
    /// as the format's own text says.
    pub parse: fn(&Block) -> Parsed,
    /// What one block is called, and its terminator line, for the messages ("ClassAd",
    /// "`-`").
    pub called: &'static str,
    pub terminator: &'static str,
    /// Written to the child's stdin when the agent stops it, before SIGTERM (a Grid Engine
    /// load sensor's `quit\n`); needs `stdin: signal`, which gives the child a stdin pipe.
    pub goodbye: Option<&'static [u8]>,
    /// The child waits to be asked for each block with a newline on its stdin (a Grid Engine
    /// load sensor, as sge_execd asks it): a stream probe in this format gets
    /// `stdin: signal` unless its config says otherwise.
    pub asked: bool,
}

impl Streaming {
    /// The `stdin:` a stream probe in this format gets when its config names none.
    pub fn asked_on_stdin(&self) -> bool {
        matches!(self, Streaming::Blocks(b) if b.asked)
    }
}

/// A block's lines, as its parser gets them.
pub struct Block<'a> {
    /// Each line with its number in the stream (1-based, for the malformed lines').
    pub lines: &'a [(usize, String)],
    pub name: &'a str,
}

/// Longest block a stream may print before its terminator (a finished run's whole output
/// is capped at the same size): a stream that never ends a block must not grow the
/// agent's memory.
pub const MAX_BLOCK_BYTES: usize = 64 * 1024;

/// What one line did to the block being read.
#[derive(Debug, PartialEq)]
pub enum BlockLine {
    /// A line of the block (or the rest of one dropped): the block goes on.
    Inside,
    /// A terminator ended this block: its name, and its samples and malformed lines.
    Ended { name: String, parsed: Parsed },
    /// The block passed [`MAX_BLOCK_BYTES`] without a terminator: it is dropped, and so is
    /// the rest of it up to the next terminator.
    TooLong,
}

/// Reads a block format one line at a time (see [`Blocks`]).
#[derive(Debug, Default)]
pub struct BlockStream {
    lines: Vec<(usize, String)>,
    /// Lines the stream has given, for the line numbers.
    line: usize,
    bytes: usize,
    /// Lines that could not be read as text, with their numbers, for the block's parse.
    unreadable: Parsed,
    /// The block ran past [`MAX_BLOCK_BYTES`]: its lines are dropped up to the terminator.
    skipping: bool,
}

impl BlockStream {
    /// Read one line (without its newline).
    pub fn push(&mut self, def: &Blocks, raw: &str) -> BlockLine {
        self.line += 1;
        let line = raw.trim();
        if let Some(name) = (def.end)(line) {
            if std::mem::take(&mut self.skipping) {
                return BlockLine::Inside;
            }
            return BlockLine::Ended {
                name: name.to_owned(),
                parsed: self.end(def, name),
            };
        }
        if self.skipping || line.is_empty() {
            return BlockLine::Inside;
        }
        self.bytes += line.len();
        if self.bytes > MAX_BLOCK_BYTES {
            self.clear();
            self.skipping = true;
            return BlockLine::TooLong;
        }
        self.lines.push((self.line, line.to_owned()));
        BlockLine::Inside
    }

    /// Count a line that could not be read as text (not UTF-8, too long) as malformed.
    pub fn bad_line(&mut self, why: &str) {
        self.line += 1;
        if !self.skipping {
            self.unreadable.bad(self.line, why);
        }
    }

    /// The lines read since the last terminator, as a block of their own (`None` when none
    /// holds a value or a malformed line): what a child that exited without its last
    /// terminator printed.
    pub fn finish(&mut self, def: &Blocks) -> Option<Parsed> {
        self.skipping = false;
        let parsed = self.end(def, "");
        (!parsed.samples.is_empty() || parsed.bad_count() > 0).then_some(parsed)
    }

    /// Lines of the block being read.
    pub fn pending(&self) -> usize {
        self.lines.len() + self.unreadable.bad_count()
    }

    fn end(&mut self, def: &Blocks, name: &str) -> Parsed {
        let mut parsed = (def.parse)(&Block {
            lines: &self.lines,
            name,
        });
        parsed.append(std::mem::take(&mut self.unreadable));
        self.clear();
        parsed
    }

    fn clear(&mut self) {
        self.lines.clear();
        self.bytes = 0;
        self.unreadable = Parsed::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Sample;

    /// A block format of another shape than ClassAd's, as a Grid Engine load sensor's
    /// `begin` / `host:name:value` / `end`: one entry and its parser.
    const SENSOR: Blocks = Blocks {
        end: |l| (l == "end").then_some(""),
        parse: |block| {
            let mut parsed = Parsed::default();
            for (n, line) in block.lines {
                match line.rsplit_once(':') {
                    _ if line == "begin" => {}
                    Some((name, value)) => parsed.samples.push(Sample {
                        name: name.to_owned(),
                        labels: Vec::new(),
                        value: value.to_owned(),
                        line: *n,
                    }),
                    None => parsed.bad(*n, "expected host:name:value"),
                }
            }
            parsed
        },
        called: "report",
        terminator: "`end`",
        goodbye: Some(b"quit\n"),
        asked: true,
    };

    #[test]
    fn a_terminator_ends_each_block_and_lines_are_numbered_from_the_start() {
        let mut s = BlockStream::default();
        for l in ["begin", "h:load:1", "", "junk"] {
            assert_eq!(s.push(&SENSOR, l), BlockLine::Inside);
        }
        assert_eq!(s.pending(), 3, "the blank line is not one of the block's");
        let BlockLine::Ended { name, parsed } = s.push(&SENSOR, "end") else {
            panic!("`end` ends the block");
        };
        assert_eq!(name, "");
        assert_eq!((parsed.samples[0].line, parsed.samples.len()), (2, 1));
        assert_eq!(
            crate::output::test_support::bad_line_numbers(&parsed),
            vec![4]
        );
        s.bad_line("not valid UTF-8");
        assert_eq!(s.pending(), 1);
        let left = s
            .finish(&SENSOR)
            .expect("an unfinished block with a bad line");
        assert_eq!(crate::output::test_support::bad_line_numbers(&left), [6]);
        assert_eq!(s.finish(&SENSOR), None, "nothing after it");
    }

    #[test]
    fn a_block_past_the_bound_is_dropped_up_to_its_terminator() {
        let mut s = BlockStream::default();
        let line = format!("h:x:{}", "9".repeat(1000));
        let pushed: Vec<BlockLine> = (0..MAX_BLOCK_BYTES / line.len() + 10)
            .map(|_| s.push(&SENSOR, &line))
            .collect();
        assert_eq!(
            pushed.iter().filter(|p| **p == BlockLine::TooLong).count(),
            1
        );
        assert_eq!(s.pending(), 0, "memory released");
        assert_eq!(
            s.push(&SENSOR, "end"),
            BlockLine::Inside,
            "dropped, not ended"
        );
        s.push(&SENSOR, "h:load:2");
        assert!(
            matches!(s.push(&SENSOR, "end"), BlockLine::Ended { parsed, .. } if parsed.samples.len() == 1)
        );
    }
}
