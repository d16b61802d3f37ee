//! `format: collectd`: what a script run by collectd's Exec plugin prints
//! (`collectd-exec(5)`): `PUTVAL "host/plugin[-instance]/type[-instance]" [interval=N]
//! time:v1[:v2...]`, `time` a Unix time or `N` for now, `U` an unknown value. `PUTNOTIF`
//! lines are notifications: logged, not values and not errors. The agent runs the script as
//! collectd does, with `COLLECTD_HOSTNAME` (this host's name) and `COLLECTD_INTERVAL` (the
//! probe's interval in seconds, as `10.000`) set.
//!
//! Samples: one per value, named by the identifier without its host (`memory/memory-used`),
//! labelled `host`, `plugin`, `plugin_instance`, `type`, `type_instance` (the parts present)
//! and, for a type with several values (`if_octets` rx and tx), `ds` (0, 1, ...). Without
//! `select:` a resource named like the type instance (or the type when there is none) is fed
//! by it: `provides: [used]`. A later line for the same identifier replaces an earlier one.
//!
//! [`parse_line`] reads one line, for a stream reader (collectd's Exec scripts usually loop
//! forever, printing a batch per interval).

use std::time::Duration;

use super::stream::{SessionReader, Sessions, Streaming};
use super::{
    clip, Budget, DeclaredBudget, FormatDef, Input, Latest, OutputError, Parsed, Peer, PeerRun, Sample,
};

pub const DEF: FormatDef = FormatDef {
    // collectd runs an Exec script that loops (a batch per interval) as long as it lives:
    // a stream probe reads each PUTVAL as it comes.
    stream: Streaming::Sessions(Sessions {
        start: || Box::new(ExecStream),
        called: "PUTVAL line",
    }),
    ..FormatDef::of_a_peer(
        "collectd",
        "collectd Exec output (PUTVAL)",
        parse,
        &PEER,
    )
};

/// A stream's lines, one at a time: each PUTVAL is an update of the values it carries. It
/// keeps nothing across lines (what first values gather of its identifiers is charged
/// where they are gathered).
struct ExecStream;

impl SessionReader for ExecStream {
    fn line(
        &mut self,
        line: &str,
        number: usize,
        _declared: &mut DeclaredBudget,
    ) -> Result<Option<Parsed>, String> {
        let mut budget = Budget::for_output(line.len());
        match parse_line(line, number, &mut budget)? {
            Line::Nothing => Ok(None),
            Line::Notification(text) => {
                tracing::info!("collectd notification: {}", crate::text::escape(&text));
                Ok(None)
            }
            Line::Values(samples, unknown) => {
                let mut parsed = Parsed::of(samples);
                for why in unknown {
                    parsed.bad(number, why);
                }
                Ok(Some(parsed))
            }
        }
    }
}

const PEER: Peer = Peer::environment(env, &["type_instance", "type"]);

fn env(run: &PeerRun) -> Vec<(String, String)> {
    vec![
        ("COLLECTD_HOSTNAME".to_owned(), run.host.to_owned()),
        ("COLLECTD_INTERVAL".to_owned(), interval_text(run.interval)),
    ]
}

/// collectd's `%.3f` of its interval in seconds.
fn interval_text(interval: Duration) -> String {
    format!("{:.3}", interval.as_secs_f64())
}

/// What one line of Exec output says.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A PUTVAL's values, and why any of them (a `U`) gave no sample.
    Values(Vec<Sample>, Vec<String>),
    /// A PUTNOTIF's text, for the log.
    Notification(String),
    /// Blank.
    Nothing,
}

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut latest = Latest::default();
    let mut budget = Budget::for_output(input.text.len());
    for (i, line) in input.text.lines().enumerate() {
        let number = i + 1;
        match parse_line(line, number, &mut budget) {
            Ok(Line::Nothing) => {}
            Ok(Line::Notification(text)) => {
                tracing::info!(probe = input.own, "collectd notification: {text}");
            }
            Ok(Line::Values(samples, unknown)) => {
                for why in unknown {
                    out.bad(number, why);
                }
                for s in samples {
                    latest.put(&mut out, s);
                }
            }
            Err(reason) if budget.spent() => {
                return Err(OutputError::Line {
                    line: number,
                    reason,
                })
            }
            Err(why) => out.bad(number, why),
        }
    }
    if out.samples.is_empty() && out.bad_lines.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(out)
}

/// One line of Exec output (`number` is its line, for the samples). Each value repeats the
/// identifier: its samples are charged to `budget` (a stream reader gives each line or
/// batch its own).
pub fn parse_line(line: &str, number: usize, budget: &mut Budget) -> Result<Line, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(Line::Nothing);
    }
    let (command, rest) = line
        .split_once(char::is_whitespace)
        .map_or((line, ""), |(c, r)| (c, r.trim_start()));
    match command.to_ascii_uppercase().as_str() {
        "PUTVAL" => putval(rest, number, budget),
        "PUTNOTIF" => Ok(Line::Notification(rest.to_owned())),
        _ => Err(format!(
            "expected PUTVAL or PUTNOTIF, got {:?}",
            clip(command)
        )),
    }
}

fn putval(rest: &str, number: usize, budget: &mut Budget) -> Result<Line, String> {
    let (identifier, rest) = quoted_or_word(rest)?;
    let mut words = rest.split_whitespace().peekable();
    while let Some(option) = words.next_if(|w| w.contains('=')) {
        let (key, value) = option.split_once('=').unwrap_or((option, ""));
        if key == "interval" && value.parse::<f64>().map_or(true, |v| v <= 0.0) {
            return Err(format!("interval {value:?} is not a positive number"));
        }
    }
    let Some(list) = words.next() else {
        return Err(format!("PUTVAL {identifier:?} has no values (`time:value[:value...]`)"));
    };
    if let Some(extra) = words.next() {
        return Err(format!("unexpected {:?} after the values", clip(extra)));
    }
    let labels = identifier_labels(&identifier)?;
    let name = identifier
        .split_once('/')
        .map_or(identifier.as_str(), |(_, n)| n)
        .to_owned();
    let mut parts = list.split(':');
    let time = parts.next().unwrap_or("");
    if time != "N" && time.parse::<f64>().is_err() {
        return Err(format!("time {:?} is neither a Unix time nor N", clip(time)));
    }
    let values: Vec<&str> = parts.collect();
    if values.is_empty() {
        return Err(format!("PUTVAL {identifier:?} has a time but no value"));
    }
    let several = values.len() > 1;
    let mut samples = Vec::new();
    let mut unknown = Vec::new();
    for (ds, v) in values.into_iter().enumerate() {
        let mut labels = labels.clone();
        if several {
            labels.push(("ds".to_owned(), ds.to_string()));
        }
        let sample = Sample {
            name: name.clone(),
            labels,
            value: v.to_owned(),
            line: number,
        };
        budget.charge_sample(&sample)?;
        if v == "U" {
            unknown.push(format!("{} is U: the script could not read it", sample.key()));
        } else if v.parse::<f64>().is_err() {
            return Err(format!("value {:?} of {identifier:?} is not a number", clip(v)));
        } else {
            samples.push(sample);
        }
    }
    Ok(Line::Values(samples, unknown))
}

/// A double-quoted identifier (`\"` and `\\` escapes) or a bare word, and the rest.
fn quoted_or_word(s: &str) -> Result<(String, &str), String> {
    let Some(quoted) = s.strip_prefix('"') else {
        let (w, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        if w.is_empty() {
            return Err("PUTVAL needs an identifier `host/plugin/type`".into());
        }
        return Ok((w.to_owned(), rest));
    };
    let mut out = String::new();
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &quoted[i + 1..])),
            '\\' => match chars.next() {
                Some((_, n)) => out.push(n),
                None => break,
            },
            c => out.push(c),
        }
    }
    Err(format!("identifier {:?} has no closing quote", clip(s)))
}

/// `host/plugin[-instance]/type[-instance]` as labels.
fn identifier_labels(identifier: &str) -> Result<Vec<(String, String)>, String> {
    let parts: Vec<&str> = identifier.split('/').collect();
    let [host, plugin, kind] = parts.as_slice() else {
        return Err(format!(
            "identifier {:?} is not `host/plugin[-instance]/type[-instance]`",
            clip(identifier)
        ));
    };
    if host.is_empty() || plugin.is_empty() || kind.is_empty() {
        return Err(format!(
            "identifier {:?} has an empty part",
            clip(identifier)
        ));
    }
    let mut labels = vec![("host".to_owned(), (*host).to_owned())];
    for (part, name) in [(*plugin, "plugin"), (*kind, "type")] {
        let (base, instance) = part.split_once('-').unwrap_or((part, ""));
        labels.push((name.to_owned(), base.to_owned()));
        if !instance.is_empty() {
            labels.push((format!("{name}_instance"), instance.to_owned()));
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{bad_line_numbers, parse_ok, refused_at_budget};
    use super::*;

    fn label<'a>(s: &'a Sample, k: &str) -> Option<&'a str> {
        s.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn putval_lines_as_the_exec_plugin_documents_them() {
        let p = parse_ok(
            parse,
            "PUTVAL \"n1/memory/memory-used\" interval=10 N:123456\nPUTNOTIF severity=okay time=1 message=fine\n\nPUTVAL n1/interface-eth0/if_octets 1700000000:10:20\nputval \"n1/memory/memory-used\" N:654321\n",
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(p.samples.len(), 3);
        let used = &p.samples[0];
        assert_eq!(used.name, "memory/memory-used");
        assert_eq!(used.value, "654321", "a later line replaces an earlier one");
        assert_eq!(label(used, "type_instance"), Some("used"));
        assert_eq!(label(used, "host"), Some("n1"));
        assert_eq!(DEF.peer.short_name(used), Some("used"));
        let rx = &p.samples[1];
        assert_eq!(rx.name, "interface-eth0/if_octets");
        assert_eq!(label(rx, "plugin_instance"), Some("eth0"));
        assert_eq!(label(rx, "ds"), Some("0"));
        assert_eq!(DEF.peer.short_name(rx), Some("if_octets"));
        assert_eq!(p.samples[2].value, "20");
    }

    #[test]
    fn malformed_lines_and_unknown_values_name_their_line() {
        let p = parse_ok(
            parse,
            "PUTVAL a/b/c N:1\nPUTVAL a/b N:1\nPUTVAL a/b/d N:U:2\nLISTVAL\nPUTVAL a/b/e\nPUTVAL a/b/f yesterday:1\nPUTVAL a/b/g N:x\nPUTVAL \"a/b/h N:1\nPUTVAL a/b/i interval=0 N:1\n",
        );
        assert_eq!(bad_line_numbers(&p), [2, 3, 4, 5, 6, 7, 8, 9]);
        let names: Vec<String> = p.samples.iter().map(Sample::key).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(p.bad_lines[1].to_string().contains("is U"));
    }

    #[test]
    fn a_long_identifier_repeated_per_value_is_refused_at_the_budget() {
        let values = vec!["1"; 200_000].join(":");
        let text = format!("PUTVAL h/p/{} N:{values}\n", "t".repeat(60_000));
        assert_eq!(refused_at_budget(parse, &text), 1);
    }

    #[test]
    fn collectd_environment_and_the_line_reader() {
        let env = env(&PeerRun {
            probe: "p",
            host: "node7.example",
            interval: Duration::from_millis(2500),
            state_dir: None,
        });
        assert_eq!(
            env,
            [
                ("COLLECTD_HOSTNAME".to_owned(), "node7.example".to_owned()),
                ("COLLECTD_INTERVAL".to_owned(), "2.500".to_owned())
            ]
        );
        let budget = &mut Budget::for_output(0);
        assert_eq!(parse_line("  ", 1, budget), Ok(Line::Nothing));
        assert!(matches!(
            parse_line("PUTNOTIF message=hi", 1, budget),
            Ok(Line::Notification(t)) if t == "message=hi"
        ));
    }
}
