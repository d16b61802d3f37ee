//! The one reading of a stream's lines into updates, as its format's table entry says
//! ([`output::Streaming`]): each line of a line format is an update; the lines of a block
//! format gather into one that its terminator ends. Two consumers take the updates: the
//! daemon's [`apply`] makes each a run for the probe's [`Sink`]; `--once` and `probe NAME`
//! gather them into the first values ([`Gathered`]).

use std::time::{Instant, SystemTime};

use super::{Line, MAX_LINE};
use crate::config::StreamSpec;
use crate::output::stream::{
    BlockLine, BlockStream, Blocks, Lines, SessionReader, Sessions, MAX_BLOCK_BYTES,
};
use crate::output::{self, DeclaredBudget, Format, Streaming};
use crate::plan::ProbeTask;
use crate::probe::sink::Sink;
use crate::probe::{readings_from_pairs, ProbeRun};
use crate::value::Reading;

/// What one line of a stream completes.
#[derive(Debug)]
pub(super) enum Update {
    /// Nothing to apply, but a report: a blank line, a comment, ELIM's `0`.
    Nothing,
    /// A line inside a block: not a report yet (silence is measured between blocks).
    Inside,
    /// A line format's values.
    Pairs(Vec<output::Pair>),
    /// A block ended: its name and what it holds.
    Block {
        name: String,
        parsed: output::Parsed,
    },
    /// A session's update: samples for some of the probe's resources (the others keep
    /// their values, as with a line that carries a subset).
    Samples(output::Parsed),
    /// A line or block that did not parse; with `fails`, every fed resource fails with
    /// `why` (a line that held values that could not be read), else it is only skipped.
    Rejected { why: String, fails: bool },
}

impl Update {
    /// Whether it counts as the stream having said something (for silence).
    pub(super) fn is_report(&self) -> bool {
        !matches!(self, Update::Inside)
    }
}

/// A stream's lines into updates (see the module's text).
pub(super) struct Updates {
    format: Format,
    how: How,
    /// What a session reader charged to the probe's declared-state budget: bytes and
    /// entries, given back when the reader ends with its child ([`Updates::charged`]).
    charged: (usize, usize),
}

enum How {
    Lines(Lines),
    Blocks(&'static Blocks, BlockStream),
    /// A session, and the lines it has read (for their numbers).
    Sessions(&'static Sessions, Box<dyn SessionReader>, usize),
    /// The config refuses such a stream; every line says why, should one get here.
    Not,
}

impl Updates {
    pub(super) fn new(format: Format) -> Self {
        let how = match &format.def().stream {
            Streaming::Lines(lines) => How::Lines(*lines),
            Streaming::Blocks(blocks) => How::Blocks(blocks, BlockStream::default()),
            Streaming::Sessions(sessions) => How::Sessions(sessions, (sessions.start)(), 0),
            Streaming::No => How::Not,
        };
        Self {
            format,
            how,
            charged: (0, 0),
        }
    }

    /// What this reader charged to the probe's declared-state budget: (bytes, entries).
    pub(super) fn charged(&self) -> (usize, usize) {
        self.charged
    }

    /// The update `line` completes. What a session keeps of a declaration is charged to
    /// `declared`, the probe's budget.
    pub(super) fn take(&mut self, own: &str, line: Line, declared: &mut DeclaredBudget) -> Update {
        let format = self.format;
        match &mut self.how {
            How::Lines(lines) => {
                let text = match text_line(format, line) {
                    Ok(text) => text,
                    Err(rejected) => return rejected,
                };
                if text.trim().is_empty() {
                    return Update::Nothing;
                }
                match (lines.parse)(&text, own) {
                    Ok(p) if p.is_empty() => Update::Nothing,
                    Ok(p) => Update::Pairs(p),
                    Err(e) => rejected(format, &e),
                }
            }
            How::Blocks(def, stream) => {
                let pushed = match line {
                    Line::TooLong => {
                        stream.bad_line(&format!("longer than {MAX_LINE} bytes; skipped"));
                        BlockLine::Inside
                    }
                    Line::Complete(bytes) => match std::str::from_utf8(&bytes) {
                        Ok(text) => stream.push(def, text),
                        Err(_) => {
                            stream.bad_line("not valid UTF-8");
                            BlockLine::Inside
                        }
                    },
                };
                match pushed {
                    BlockLine::Inside => Update::Inside,
                    BlockLine::Ended { name, parsed } => Update::Block { name, parsed },
                    BlockLine::TooLong => Update::Rejected {
                        why: too_long(def),
                        fails: true,
                    },
                }
            }
            How::Sessions(_, reader, number) => {
                *number += 1;
                let text = match text_line(format, line) {
                    Ok(text) => text,
                    Err(rejected) => return rejected,
                };
                let before = (declared.used(), declared.entries());
                let read = reader.line(&text, *number, declared);
                self.charged.0 += declared.used().saturating_sub(before.0);
                self.charged.1 += declared.entries().saturating_sub(before.1);
                match read {
                    Ok(None) => Update::Inside,
                    Ok(Some(parsed)) => Update::Samples(parsed),
                    Err(why) => rejected(format, &why),
                }
            }
            How::Not => rejected(format, "the format is not read line by line"),
        }
    }

    /// The child exited by itself: a block it left without its terminator is one more
    /// update, as HTCondor publishes a cron job's output when it exits. (A child the agent
    /// stops, on shutdown or for silence, has it dropped.)
    pub(super) fn finish(&mut self) -> Option<Update> {
        match &mut self.how {
            How::Blocks(def, stream) => stream.finish(def).map(|parsed| Update::Block {
                name: String::new(),
                parsed,
            }),
            How::Lines(_) | How::Sessions(..) | How::Not => None,
        }
    }

    /// What a wait for first values did not get, for its message.
    fn missing(&self) -> String {
        match &self.how {
            How::Blocks(def, stream) if stream.pending() > 0 => format!(
                "no {} line ended the {} it began ({} lines read)",
                def.terminator,
                def.called,
                stream.pending()
            ),
            How::Blocks(def, _) => {
                format!("no {} ended by a {} line", def.called, def.terminator)
            }
            How::Sessions(sessions, ..) => format!("no {} with values", sessions.called),
            How::Lines(_) | How::Not => "no complete line with values".to_owned(),
        }
    }

    /// A line format's line is a whole answer (else first values wait for every resource).
    fn line_is_whole(&self) -> bool {
        match &self.how {
            How::Lines(lines) => lines.whole,
            How::Blocks(..) | How::Sessions(..) | How::Not => true,
        }
    }
}

/// A complete line of text (checked UTF-8), or the update that rejects it: a line too long
/// is skipped, one that is not text is bad.
/// Without a CR its writer left before the newline.
fn text_line(format: Format, line: Line) -> Result<String, Update> {
    match line {
        Line::TooLong => Err(Update::Rejected {
            why: format!("stream line longer than {MAX_LINE} bytes; skipped"),
            fails: false,
        }),
        Line::Complete(b) => match String::from_utf8(b) {
            Ok(mut text) => {
                // Every CR before the newline, as `trim_end_matches('\r')` did.
                while text.ends_with('\r') {
                    text.pop();
                }
                Ok(text)
            }
            Err(_) => Err(rejected(format, "line is not valid UTF-8")),
        },
    }
}

fn rejected(format: Format, why: &str) -> Update {
    Update::Rejected {
        why: format!("bad {} line: {why}", format.as_str()),
        fails: true,
    }
}

fn too_long(def: &Blocks) -> String {
    let (called, end) = (def.called, def.terminator);
    format!(
        "a {called} ran past {MAX_BLOCK_BYTES} bytes without a {end} line; a stream's {called} output ends each update with {end}"
    )
}

/// The daemon's consumer: each update one run for the probe's sink, stamped now. A line
/// may carry a subset of the values: the names it leaves out keep theirs. A block's
/// resources it gives no value keep their last one, pending with the reason, until their
/// stale time fails them; one selected from another named block (`ad="SQUID1"` while this
/// is SQUID0's) is not touched. A block's malformed lines are logged by number; the rest
/// still applies.
pub(super) fn apply(sink: &mut Sink, spec: &StreamSpec, update: Update, began: Instant) {
    sink.say_declared_budget();
    let started = SystemTime::now();
    let run = match update {
        Update::Nothing | Update::Inside => return,
        Update::Rejected { why, fails } => return sink.reject(&why, fails),
        Update::Pairs(pairs) => {
            let (mut readings, unexpected) = readings_from_pairs(sink.task(), pairs);
            readings.retain(|(_, r)| !matches!(r, Reading::Pending(_)));
            ProbeRun::parsed(started, began.elapsed(), readings, unexpected, Vec::new())
        }
        Update::Block { name, parsed } => {
            let format = spec.exec.format;
            log_bad_lines(sink, format, &parsed);
            let mut readings = Vec::with_capacity(sink.task().feeds.len());
            for feed in &sink.task().feeds {
                let pick = spec.exec.select.pick_for(&feed.name, feed.is_shared());
                if selects_another_block(&pick, &name) {
                    continue;
                }
                let reading =
                    output::select::reading(format, &pick, &parsed, &feed.name, feed.valtype)
                        .unwrap_or_else(|| {
                            Reading::Pending(output::select::absent_reason(
                                format, &pick, &parsed, "", &feed.name,
                            ))
                        });
                readings.push((feed.name.clone(), reading));
            }
            ProbeRun::parsed(started, began.elapsed(), readings, Vec::new(), Vec::new())
        }
        Update::Samples(parsed) => {
            let format = spec.exec.format;
            log_bad_lines(sink, format, &parsed);
            let readings: Vec<_> = sink
                .task()
                .feeds
                .iter()
                .filter_map(|feed| {
                    let pick = spec.exec.select.pick_for(&feed.name, feed.is_shared());
                    output::select::reading(format, &pick, &parsed, &feed.name, feed.valtype)
                        .map(|r| (feed.name.clone(), r))
                })
                .collect();
            if readings.is_empty() {
                // An update of values this probe does not take (another chart's): nothing
                // to count, as a comment line.
                return;
            }
            ProbeRun::parsed(started, began.elapsed(), readings, Vec::new(), Vec::new())
        }
    };
    sink.take(run);
}

/// An update's malformed lines, by number, through the sink's throttle: the rest of the
/// update still applies.
fn log_bad_lines(sink: &mut Sink, format: Format, parsed: &output::Parsed) {
    for bad in &parsed.bad_lines {
        sink.malformed(&format!("bad {} line: {bad}", format.as_str()));
    }
}

/// Whether `pick` selects a value of a named block other than `name`.
fn selects_another_block(pick: &output::Pick, name: &str) -> bool {
    pick.selector.as_ref().is_some_and(|sel| {
        sel.labels
            .iter()
            .any(|(k, v)| k == output::AD_LABEL && v != name)
    })
}

/// What `--once` / `probe NAME` have read of a stream so far.
pub(super) struct Gathered {
    updates: Updates,
    got: Got,
    /// The probe's declared-state budget for this wait: the session's declarations and the
    /// names gathered (a stream printing ever-new collectd identifiers or kv names until
    /// the deadline).
    declared: DeclaredBudget,
}

enum Got {
    /// A line format: the pairs of the lines read (a later line's value wins).
    Pairs(output::PairSet),
    /// A block format: the blocks ended so far, merged.
    Blocks {
        blocks: output::MergedAds,
        ended: usize,
        /// Per fed resource: whether the blocks so far give it a value (checked against
        /// each new block only: a value once given stays).
        answered: Vec<bool>,
    },
}

/// How a wait for first values ends.
pub(super) enum FirstValues {
    Got,
    /// The deadline passed without a complete update with values.
    TimedOut,
    Bad(String),
    /// The child ended (or could not be read) before reporting anything.
    Ended,
}

impl Gathered {
    /// `declared`: the probe's declared-state budget, in bytes.
    pub(super) fn new(format: Format, declared: usize) -> Self {
        let got = match format.def().stream {
            Streaming::Blocks(_) | Streaming::Sessions(_) => Got::Blocks {
                blocks: output::MergedAds::default(),
                ended: 0,
                answered: Vec::new(),
            },
            Streaming::Lines(_) | Streaming::No => Got::Pairs(output::PairSet::default()),
        };
        Self {
            updates: Updates::new(format),
            got,
            declared: DeclaredBudget::new(declared),
        }
    }

    /// Take one line; `Some` when it decides how the wait ends. A line format whose lines
    /// are whole answers is done at its first values; kv when every fed resource has a
    /// value; a block format when its blocks so far give every fed resource one (or a
    /// block holds a malformed line: the line may be the value still missing, and waiting
    /// would not bring it). A rejected line or block ends it.
    pub(super) fn take(
        &mut self,
        task: &ProbeTask,
        spec: &StreamSpec,
        line: Line,
    ) -> Option<FirstValues> {
        let update = self.updates.take(&task.name, line, &mut self.declared);
        if self.declared.first_refusal() {
            tracing::warn!(probe = %task.name, "{}", self.declared.reached_text());
        }
        match update {
            Update::Nothing | Update::Inside => None,
            Update::Rejected { why, .. } => Some(FirstValues::Bad(why)),
            Update::Pairs(p) => {
                let Got::Pairs(pairs) = &mut self.got else {
                    return None;
                };
                for (k, v) in p {
                    pairs.upsert_within(&k, &v, &mut self.declared);
                }
                let complete = self.updates.line_is_whole()
                    || task.feeds.iter().all(|f| pairs.contains(&f.name));
                complete.then_some(FirstValues::Got)
            }
            Update::Block { parsed, .. } | Update::Samples(parsed) => {
                self.add_block(task, spec, parsed)
            }
        }
    }

    fn add_block(
        &mut self,
        task: &ProbeTask,
        spec: &StreamSpec,
        block: output::Parsed,
    ) -> Option<FirstValues> {
        let Got::Blocks {
            blocks,
            ended,
            answered,
        } = &mut self.got
        else {
            return None;
        };
        let format = spec.exec.format;
        let malformed = !block.bad_lines.is_empty();
        answered.resize(task.feeds.len(), false);
        for (f, done) in task.feeds.iter().zip(answered.iter_mut()) {
            let pick = spec.exec.select.pick_for(&f.name, f.is_shared());
            *done = *done
                || output::select::always_answers(&pick)
                || block
                    .samples
                    .iter()
                    .any(|s| output::select::matches(format, &pick, s, &f.name));
        }
        blocks.add(block, &mut self.declared);
        *ended += 1;
        let complete = answered.iter().all(|d| *d);
        (complete || malformed).then_some(FirstValues::Got)
    }

    /// The deadline passed, or the child exited and its output has been read. What it
    /// gave so far is the answer (a kv probe that printed some values and paused; a
    /// ClassAd stream whose later ads did not come); a child that exited by itself also
    /// has the lines after its last terminator count, as in the daemon.
    pub(super) fn at_end(&mut self, exited: bool) -> FirstValues {
        if exited {
            if let Some(Update::Block { parsed, .. }) = self.updates.finish() {
                if let Got::Blocks { blocks, ended, .. } = &mut self.got {
                    blocks.add(parsed, &mut self.declared);
                    *ended += 1;
                }
            }
        }
        let any = match &self.got {
            Got::Pairs(pairs) => !pairs.is_empty(),
            Got::Blocks { ended, .. } => *ended > 0,
        };
        match (any, exited) {
            (true, _) => FirstValues::Got,
            (false, true) => FirstValues::Ended,
            (false, false) => FirstValues::TimedOut,
        }
    }

    /// What a timed-out wait did not get, for its message.
    pub(super) fn missing(&self) -> String {
        self.updates.missing()
    }

    pub(super) fn into_run(
        self,
        task: &ProbeTask,
        spec: &StreamSpec,
        (started, duration): (SystemTime, std::time::Duration),
        stdout: &[u8],
    ) -> ProbeRun {
        match self.got {
            Got::Pairs(pairs) => ProbeRun::from_pairs(task, started, duration, pairs.into_vec()),
            Got::Blocks { blocks, .. } => ProbeRun::from_output(
                task,
                started,
                duration,
                (spec.exec.format, &spec.exec.select),
                blocks.parsed(),
                &String::from_utf8_lossy(stdout),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a child's session charged is known, so its end gives the room back: a plugin
    /// restarted after reaching its budget declares its charts again.
    #[test]
    fn a_sessions_charges_are_counted_so_its_end_can_give_them_back() {
        let mut declared = DeclaredBudget::new(DeclaredBudget::cost("dimension") * 50);
        let take = |updates: &mut Updates, declared: &mut DeclaredBudget, l: &str| {
            updates.take("p", Line::Complete(l.as_bytes().to_vec()), declared)
        };
        // A name outside the session, charged by someone else (the log's names).
        declared.charge("elsewhere").expect("room");
        let mut first = Updates::new(Format::Netdata);
        take(&mut first, &mut declared, "CHART a.b");
        for i in 0..1000 {
            take(&mut first, &mut declared, &format!("DIMENSION d{i}"));
        }
        assert!(declared.refused() > 0);
        let (bytes, entries) = first.charged();
        assert_eq!(entries, declared.entries() - 1);
        assert_eq!(bytes, declared.used() - DeclaredBudget::cost("elsewhere"));
        declared.release(bytes, entries);
        assert_eq!(
            declared.entries(),
            1,
            "only what the session did not charge"
        );

        let mut second = Updates::new(Format::Netdata);
        take(&mut second, &mut declared, "CHART a.b");
        take(&mut second, &mut declared, "DIMENSION d1");
        for l in ["BEGIN a.b", "SET d1 = 3"] {
            assert!(matches!(
                take(&mut second, &mut declared, l),
                Update::Inside
            ));
        }
        let Update::Samples(parsed) = take(&mut second, &mut declared, "END") else {
            panic!("the restarted plugin's chart updates");
        };
        assert_eq!(parsed.samples[0].value, "3");
    }
}
