//! `format: netdata`: Netdata's external plugin protocol (plugins.d). A plugin declares
//! charts (`CHART type.id name title units ...`) and their dimensions (`DIMENSION id [name
//! [algorithm [multiplier [divisor]]]]`), then sends each update as `BEGIN type.id`,
//! `SET id = value` lines and `END`. A dimension's value is what it SET times its multiplier
//! divided by its divisor (`sensors` sets millidegrees with divisor 1000: degrees). Words
//! may be in single or double quotes. `DISABLE` (the plugin has nothing to collect) is an
//! error; the other keywords (FLUSH, VARIABLE, LABEL, ...) carry no values.
//!
//! The agent runs the plugin as netdata does, with its update-every in seconds as the first
//! argument (and `NETDATA_UPDATE_EVERY`). A plugin that exits after its updates (a
//! `charts.d.plugin` with a short `restart_timeout`) is an exec probe; one that runs forever
//! is a stream, read block by block ([`Session`] keeps the charts across blocks).
//!
//! What a session keeps of the charts and dimensions is charged to the probe's
//! [`DeclaredBudget`]; past it a new CHART or DIMENSION is dropped, and an update of a chart
//! or dimension not kept is skipped rather than an error (it may be one the budget dropped).
//!
//! Samples: one per dimension, named `chart.dimension` (`system.load.load1`), labelled
//! `chart` and `dimension`; the latest update wins. Without `select:` a resource named like
//! the dimension id is fed by it (`provides: [load1]`). An `incremental` dimension's value is
//! the counter the plugin sent, not the rate netdata's charts draw.

use std::collections::HashMap;

use super::stream::{SessionReader, Sessions, Streaming, MAX_BLOCK_BYTES};
use super::{
    clip, Budget, DeclaredBudget, FormatDef, Input, Latest, OutputError, Parsed, Peer, PeerRun, Sample,
};

pub const DEF: FormatDef = FormatDef {
    // A plugin runs for as long as netdata does, declaring its charts once and updating
    // them every update-every: a stream probe keeps its session across the updates.
    stream: Streaming::Sessions(Sessions {
        start: || Box::new(PluginStream::default()),
        called: "chart update",
    }),
    ..FormatDef::of_a_peer(
        "netdata",
        "Netdata plugin output (plugins.d)",
        parse,
        &PEER,
    )
};

/// A plugin's stream: its session, and the budget of the update being read (each update
/// gets its own, as large as a block a stream may print).
struct PluginStream {
    session: Session,
    budget: Budget,
}

impl Default for PluginStream {
    fn default() -> Self {
        Self {
            session: Session::default(),
            budget: Budget::for_output(MAX_BLOCK_BYTES),
        }
    }
}

impl SessionReader for PluginStream {
    fn line(
        &mut self,
        line: &str,
        number: usize,
        declared: &mut DeclaredBudget,
    ) -> Result<Option<Parsed>, String> {
        match self.session.line(line, number, &mut self.budget, declared)? {
            Event::Nothing => Ok(None),
            Event::Update(samples) => {
                self.budget = Budget::for_output(MAX_BLOCK_BYTES);
                Ok(Some(Parsed::of(samples)))
            }
        }
    }
}

const PEER: Peer = Peer {
    args: |run| vec![update_every(run)],
    env: |run| vec![("NETDATA_UPDATE_EVERY".to_owned(), update_every(run))],
    short_names: &["dimension"],
    state_dir: false,
};

/// Netdata's update-every: whole seconds, at least 1.
fn update_every(run: &PeerRun) -> String {
    run.interval.as_secs().max(1).to_string()
}

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut session = Session::default();
    let mut latest = Latest::default();
    let mut budget = Budget::for_output(input.text.len());
    let mut declared = DeclaredBudget::default();
    for (i, line) in input.text.lines().enumerate() {
        match session.line(line, i + 1, &mut budget, &mut declared) {
            Ok(Event::Nothing) => {}
            Ok(Event::Update(samples)) => {
                for s in samples {
                    latest.put(&mut out, s);
                }
            }
            Err(reason) if budget.spent() => {
                return Err(OutputError::Line {
                    line: i + 1,
                    reason,
                })
            }
            Err(why) => out.bad(i + 1, why),
        }
    }
    if let Some(chart) = session.collecting.as_ref().map(|c| c.chart.clone()) {
        out.bad(
            input.text.lines().count(),
            format!("the update of chart {chart:?} has no END"),
        );
    }
    if out.samples.is_empty() && out.bad_lines.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(out)
}

/// What a line did.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Nothing,
    /// An `END`: the chart's values of this update.
    Update(Vec<Sample>),
}

/// A plugin's charts and the update being read: the state a stream reader keeps across
/// blocks (a chart is declared once, updated every interval). A stream that declares new
/// charts or dimensions for ever is held to the probe's [`DeclaredBudget`].
#[derive(Debug, Default)]
pub struct Session {
    charts: HashMap<String, Chart>,
    /// The chart DIMENSION lines add to; `None` also after a CHART the budget dropped.
    defining: Option<String>,
    collecting: Option<Collecting>,
    /// The budget dropped a CHART or DIMENSION of this session: an update naming a chart
    /// or dimension not kept may be one of those, and is skipped, not an error.
    dropped: bool,
    /// Inside `BEGIN` of a chart not kept (after a drop): its SET lines and its `END` are
    /// skipped.
    skipping: bool,
}

#[derive(Debug, Default)]
struct Chart {
    dimensions: HashMap<String, Scale>,
}

#[derive(Debug, Clone, Copy)]
struct Scale {
    multiplier: i64,
    divisor: i64,
}

#[derive(Debug)]
struct Collecting {
    chart: String,
    samples: Vec<Sample>,
}

impl Session {
    /// Read one line (`number` is its line, for the samples). A value's sample repeats its
    /// chart's id: it is charged to `budget` (a stream reader gives each block its own). A
    /// chart or dimension kept is charged to `declared`, the probe's budget.
    pub fn line(
        &mut self,
        line: &str,
        number: usize,
        budget: &mut Budget,
        declared: &mut DeclaredBudget,
    ) -> Result<Event, String> {
        let words = split_words(line);
        let Some((keyword, args)) = words.split_first() else {
            return Ok(Event::Nothing);
        };
        if std::mem::take(&mut self.skipping) {
            match keyword.as_str() {
                "SET" => {
                    self.skipping = true;
                    return Ok(Event::Nothing);
                }
                "END" => return Ok(Event::Nothing),
                // Anything else ends the skipped update and is read as itself.
                _ => {}
            }
        }
        match keyword.as_str() {
            "CHART" => self.chart(args, declared),
            "DIMENSION" => self.dimension(args, declared),
            "BEGIN" => self.begin(args),
            "SET" => self.set(args, number, budget),
            "END" => self.end(),
            "FLUSH" => {
                self.collecting = None;
                Ok(Event::Nothing)
            }
            "DISABLE" => Err("the plugin sent DISABLE: it has nothing to collect here".into()),
            "VARIABLE" | "LABEL" | "OVERWRITE" | "CLABEL" | "CLABEL_COMMIT" | "FUNCTION"
            | "HOST" | "HOST_DEFINE" | "HOST_DEFINE_END" | "HOST_LABEL" => Ok(Event::Nothing),
            other => Err(format!("unknown keyword {:?}", clip(other))),
        }
    }

    /// Charge a new entry named `name`; whether it may be kept.
    fn keep(&mut self, name: &str, declared: &mut DeclaredBudget) -> bool {
        if declared.charge(name).is_err() {
            self.dropped = true;
            return false;
        }
        true
    }

    fn chart(&mut self, args: &[String], declared: &mut DeclaredBudget) -> Result<Event, String> {
        let Some(id) = args.first().filter(|id| id.contains('.')) else {
            return Err("CHART needs a `type.id` first".into());
        };
        if !self.charts.contains_key(id) && !self.keep(id, declared) {
            // Its DIMENSION lines are dropped with it.
            self.defining = None;
            return Ok(Event::Nothing);
        }
        self.charts.entry(id.clone()).or_default();
        self.defining = Some(id.clone());
        Ok(Event::Nothing)
    }

    fn dimension(
        &mut self,
        args: &[String],
        declared: &mut DeclaredBudget,
    ) -> Result<Event, String> {
        let Some(chart) = self.defining.clone() else {
            if self.dropped {
                // The dimension of a chart the budget dropped.
                return Ok(Event::Nothing);
            }
            return Err("DIMENSION before any CHART".into());
        };
        let Some(id) = args.first().filter(|id| !id.is_empty()) else {
            return Err("DIMENSION needs an id".into());
        };
        // Netdata reads a missing, zero or unreadable multiplier or divisor as 1.
        let factor = |at: usize| -> Result<i64, String> {
            match args.get(at).map(String::as_str) {
                None | Some("") => Ok(1),
                Some(w) => match w.parse::<i64>() {
                    Ok(0) => Ok(1),
                    Ok(n) => Ok(n),
                    Err(_) => Err(format!("DIMENSION {id:?}: {:?} is not an integer", clip(w))),
                },
            }
        };
        let scale = Scale {
            multiplier: factor(3)?,
            divisor: factor(4)?,
        };
        let known = self
            .charts
            .get(&chart)
            .is_some_and(|c| c.dimensions.contains_key(id));
        if !known && !self.keep(id, declared) {
            return Ok(Event::Nothing);
        }
        if let Some(c) = self.charts.get_mut(&chart) {
            c.dimensions.insert(id.clone(), scale);
        }
        Ok(Event::Nothing)
    }

    fn begin(&mut self, args: &[String]) -> Result<Event, String> {
        let Some(id) = args.first() else {
            return Err("BEGIN needs a chart id".into());
        };
        if !self.charts.contains_key(id) {
            self.collecting = None;
            if self.dropped {
                // Perhaps a chart the budget dropped: its update is skipped.
                self.skipping = true;
                return Ok(Event::Nothing);
            }
            return Err(format!("BEGIN names chart {:?}, which no CHART declared", clip(id)));
        }
        self.collecting = Some(Collecting {
            chart: id.clone(),
            samples: Vec::new(),
        });
        Ok(Event::Nothing)
    }

    fn set(&mut self, args: &[String], number: usize, budget: &mut Budget) -> Result<Event, String> {
        let Some(c) = self.collecting.as_mut() else {
            return Err("SET outside a BEGIN ... END update".into());
        };
        let (id, raw) = match args {
            [id, eq, value] if eq == "=" => (id, value.as_str()),
            // `SET id =` with nothing after it: no value this time.
            [_, eq] if eq == "=" => return Ok(Event::Nothing),
            _ => return Err("expected `SET id = value`".into()),
        };
        let Some(scale) = self
            .charts
            .get(&c.chart)
            .and_then(|chart| chart.dimensions.get(id))
        else {
            if self.dropped {
                // Perhaps a dimension the budget dropped.
                return Ok(Event::Nothing);
            }
            return Err(format!(
                "SET names dimension {:?}, which chart {:?} did not declare",
                clip(id),
                c.chart
            ));
        };
        let value = scaled(raw, *scale).ok_or_else(|| {
            format!("SET {:?}: value {:?} is not a number", clip(id), clip(raw))
        })?;
        let sample = Sample {
            name: format!("{}.{id}", c.chart),
            labels: vec![
                ("chart".to_owned(), c.chart.clone()),
                ("dimension".to_owned(), id.clone()),
            ],
            value,
            line: number,
        };
        budget.charge_sample(&sample)?;
        c.samples.push(sample);
        Ok(Event::Nothing)
    }

    fn end(&mut self) -> Result<Event, String> {
        match self.collecting.take() {
            Some(c) => Ok(Event::Update(c.samples)),
            None => Err("END without a BEGIN".into()),
        }
    }
}

/// `raw` x multiplier / divisor, written as the plugin wrote it when both are 1.
fn scaled(raw: &str, scale: Scale) -> Option<String> {
    let v: f64 = raw.parse().ok().filter(|v: &f64| v.is_finite())?;
    if scale.multiplier == 1 && scale.divisor == 1 {
        return Some(raw.to_owned());
    }
    Some((v * scale.multiplier as f64 / scale.divisor as f64).to_string())
}

/// Words separated by blanks; a word in single or double quotes keeps its blanks (as
/// netdata's `pluginsd_split_words` reads them).
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.trim().chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '\'' || c == '"' {
            chars.next();
            for n in chars.by_ref() {
                if n == c {
                    break;
                }
                word.push(n);
            }
        } else {
            while let Some(n) = chars.next_if(|n| !n.is_whitespace()) {
                word.push(n);
            }
        }
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{bad_line_numbers, parse_ok, refused_at_budget};
    use super::*;

    /// A budget for `n` entries named like `c.NNNN` / `dNNNN`.
    fn room_for(n: usize) -> DeclaredBudget {
        DeclaredBudget::new(n * DeclaredBudget::cost("c.0000"))
    }

    #[test]
    fn a_stream_that_declares_for_ever_stops_growing_at_its_budget() {
        let mut stream = PluginStream::default();
        let declared = &mut room_for(40);
        let mut line = |l: &str| stream.line(l, 0, declared);
        for l in ["CHART system.load", "DIMENSION load1 '' absolute 1 100"] {
            assert_eq!(line(l), Ok(None));
        }
        // 1000 charts of 100 dimensions each: every line read, none an error.
        for c in 0..1000 {
            assert_eq!(line(&format!("CHART c.{c:04}")), Ok(None));
            for d in 0..100 {
                assert_eq!(line(&format!("DIMENSION d{d:04}")), Ok(None));
            }
        }
        // The chart declared before the budget was reached still updates.
        for l in ["BEGIN system.load", "SET load1 = 52"] {
            assert_eq!(line(l), Ok(None));
        }
        let update = line("END").unwrap().expect("an update");
        assert_eq!(update.samples[0].value, "0.52");
        // An update of a chart or dimension the budget dropped is skipped, not an error
        // (an error would fail every resource the probe feeds, at every update).
        for l in ["BEGIN c.0999", "SET d0099 = 1", "END", "BEGIN system.load"] {
            assert_eq!(line(l), Ok(None), "{l}");
        }
        assert_eq!(line("SET d0099 = 1"), Ok(None));
        assert_eq!(line("SET load1 = 7"), Ok(None));
        let update = line("END").unwrap().expect("an update");
        assert_eq!(update.samples.len(), 1);
        assert_eq!(update.samples[0].value, "0.07");
        // A skipped update left without its END ends at the next keyword, read as itself.
        for l in ["BEGIN c.0999", "SET d0099 = 1", "BEGIN system.load", "SET load1 = 9"] {
            assert_eq!(line(l), Ok(None), "{l}");
        }
        let update = line("END").unwrap().expect("an update");
        assert_eq!(update.samples[0].value, "0.09");

        assert!(declared.used() <= declared.limit());
        assert!(declared.used() + DeclaredBudget::cost("c.0000") > declared.limit());
        // Every chart past the budget was refused; its dimensions went with it, uncharged.
        assert!(declared.refused() >= 999, "{}", declared.refused());
        assert!(declared.first_refusal());
        let kept: usize = stream
            .session
            .charts
            .values()
            .map(|c| 1 + c.dimensions.len())
            .sum();
        assert!((38..=40).contains(&kept), "{kept}");
        assert_eq!(declared.entries(), kept, "what the session keeps is what it charged");
    }

    #[test]
    fn a_chart_declared_again_costs_nothing_more() {
        let mut s = Session::default();
        let (budget, declared) = (&mut Budget::for_output(0), &mut room_for(3));
        for _ in 0..100 {
            for l in ["CHART a.b", "DIMENSION d1", "DIMENSION d2 '' absolute 2"] {
                assert_eq!(s.line(l, 0, budget, declared), Ok(Event::Nothing));
            }
        }
        assert_eq!((declared.entries(), declared.refused()), (3, 0));
    }

    fn get<'a>(p: &'a Parsed, name: &str) -> Option<&'a str> {
        p.samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value.as_str())
    }

    const SENSORS: &str = "CHART 'sensors.temp_coretemp' '' 'Temperature' 'Celsius' 'temperature' 'sensors.temp' line 90001 1 '' '' 'sensors'
DIMENSION temp1_input 'Core 0' absolute 1 1000
CHART system.load '' 'Load' 'load' load system.load line 100 1
DIMENSION load1 '' absolute 1 100
DIMENSION load5 '' absolute 1 100
DIMENSION jobs '' absolute

BEGIN 'sensors.temp_coretemp'
SET temp1_input = 45000
END
BEGIN system.load 1000000
SET load1 = 52
SET load5 = 
SET jobs = 7
END
BEGIN 'sensors.temp_coretemp' 1000000
SET temp1_input = 46500
END
";

    #[test]
    fn values_are_set_times_multiplier_over_divisor_and_the_latest_wins() {
        let p = parse_ok(parse, SENSORS);
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(get(&p, "sensors.temp_coretemp.temp1_input"), Some("46.5"));
        assert_eq!(get(&p, "system.load.load1"), Some("0.52"));
        assert_eq!(get(&p, "system.load.load5"), None);
        assert_eq!(get(&p, "system.load.jobs"), Some("7"));
        assert_eq!(DEF.peer.short_name(&p.samples[1]), Some("load1"));
    }

    #[test]
    fn a_session_keeps_its_charts_across_blocks() {
        let mut s = Session::default();
        let budget = &mut Budget::for_output(0);
        let declared = &mut DeclaredBudget::default();
        for (i, l) in SENSORS.lines().take(6).enumerate() {
            assert_eq!(s.line(l, i + 1, budget, declared), Ok(Event::Nothing));
        }
        let block = ["BEGIN system.load", "SET jobs = 3", "END"];
        let mut last = Event::Nothing;
        for round in 0..2 {
            for l in block {
                last = s.line(l, round, budget, declared).unwrap();
            }
        }
        let Event::Update(samples) = last else {
            panic!("{last:?}")
        };
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].value, "3");
    }

    #[test]
    fn protocol_errors_name_their_line() {
        let p = parse_ok(
            parse,
            "SET a = 1\nEND\nDIMENSION x\nCHART nodot\nCHART a.b\nDIMENSION d '' absolute x 1\nDIMENSION d\nBEGIN c.d\nBEGIN a.b\nSET e = 1\nSET d = many\nSET d 1\nSET d = 4\nEND\nWHAT\nDISABLE\nBEGIN a.b\n",
        );
        assert_eq!(get(&p, "a.b.d"), Some("4"));
        assert_eq!(
            bad_line_numbers(&p),
            [1, 2, 3, 4, 6, 8, 10, 11, 12, 15, 16, 17]
        );
    }

    #[test]
    fn a_long_chart_id_repeated_per_value_is_refused_at_the_budget() {
        let chart = format!("a.{}", "c".repeat(60_000));
        let text = format!(
            "CHART {chart}\nDIMENSION d\nBEGIN {chart}\n{}END\n",
            "SET d = 1\n".repeat(20_000)
        );
        assert!((4..100).contains(&refused_at_budget(parse, &text)));
    }

    #[test]
    fn quoted_words_keep_their_blanks() {
        assert_eq!(
            split_words("DIMENSION a 'Core 0' \"x y\" ''"),
            ["DIMENSION", "a", "Core 0", "x y", ""]
        );
    }
}
