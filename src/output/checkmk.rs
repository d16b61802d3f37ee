//! `format: checkmk`: Checkmk local checks, one service per line:
//! `<state> <service> <metrics> <text>`. The state is 0 (OK), 1 (WARN), 2 (CRIT), 3
//! (UNKNOWN), or `P`: computed from the metrics' thresholds as Checkmk does (a metric at or
//! over `crit` is CRIT, at or over `warn` is WARN; a range `lo:hi` is breached outside it). A
//! service name with spaces is in double quotes. Metrics are `name=value;warn;crit;min;max`
//! joined by `|`, or `-` for none; the text is the rest of the line: the summary, then,
//! after a literal `\n`, the long output (its lines joined by `\n`, as Checkmk writes it). A
//! section header (`<<<local>>>`, as an agent plugin writes it) is skipped. Empty output is
//! a host with no local checks to report: an answer, as Checkmk reads it.
//!
//! Samples: the service's state as a number named by the service, each metric named by
//! itself with the label `service`, and the text as the strings `text` and `long_text` with
//! the label `service` (an informational check's value is its text:
//! `0 "CPU level" - CPU level: x86-64-v4`). Without `select:` a resource named like a metric
//! or a service is fed by it; `select:` names a service (`"Disk root"`), a metric of one
//! (`used{service="Disk root"}`) or its text (`text{service="CPU level"}`).

use super::{clip, Budget, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    // The Checkmk agent prints an empty `<<<local>>>` section when no check has anything
    // to say; the server reads that as no services, not as a broken agent.
    empty_is_an_answer: true,
    ..FormatDef::of_a_peer(
        "checkmk",
        "Checkmk local check output",
        parse,
        &super::NO_PEER,
    )
};

/// The label naming a metric's service.
pub const SERVICE_LABEL: &str = "service";

/// The samples holding a service's summary and its long output.
pub const TEXT: &str = "text";
pub const LONG_TEXT: &str = "long_text";

/// What separates the summary from the long output, and the long output's lines: the two
/// characters `\` `n`, kept as they are in `long_text` (a string value holds no newline).
const ESCAPED_NEWLINE: &str = "\\n";

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut budget = Budget::for_output(input.text.len());
    for (i, line) in input.text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (line.starts_with("<<<") && line.ends_with(">>>")) {
            continue;
        }
        match service_line(&mut out, line, i + 1, &mut budget) {
            Ok(()) => {}
            Err(reason) if budget.spent() => {
                return Err(OutputError::Line {
                    line: i + 1,
                    reason,
                })
            }
            Err(why) => out.bad(i + 1, why),
        }
    }
    Ok(out)
}

/// One service: its state and metrics pushed to `out`, or why the line is not one.
fn service_line(
    out: &mut Parsed,
    line: &str,
    number: usize,
    budget: &mut Budget,
) -> Result<(), String> {
    let (state, rest) = word(line);
    let computed = match state {
        "0" | "1" | "2" | "3" => None,
        "P" => Some(0u8),
        other => {
            return Err(format!(
                "state {:?} is not 0, 1, 2, 3 or P (expected `<state> <service> <metrics> <text>`)",
                clip(other)
            ))
        }
    };
    let (service, rest) = service_name(rest)?;
    let (metrics, text) = word(rest);
    if metrics.is_empty() {
        return Err(format!("service {service:?} has no metrics field (`-` for none)"));
    }
    let mut worst = computed;
    let mut samples = Vec::new();
    if metrics != "-" {
        for item in metrics.split('|').filter(|m| !m.is_empty()) {
            let (name, value, level) = metric(item).map_err(|why| format!("service {service:?}: {why}"))?;
            worst = worst.map(|w| w.max(level));
            // The service's name is repeated in every metric's label: counted.
            budget.charge(name.len(), SERVICE_LABEL.len() + service.len(), value.len())?;
            samples.push(Sample {
                name: name.to_owned(),
                labels: vec![(SERVICE_LABEL.to_owned(), service.clone())],
                value,
                line: number,
            });
        }
    }
    let (summary, long) = text
        .split_once(ESCAPED_NEWLINE)
        .unwrap_or((text, ""));
    for (name, value) in [(TEXT, summary.trim()), (LONG_TEXT, long.trim())] {
        if value.is_empty() {
            continue;
        }
        budget.charge(name.len(), SERVICE_LABEL.len() + service.len(), value.len())?;
        samples.push(Sample {
            name: name.to_owned(),
            labels: vec![(SERVICE_LABEL.to_owned(), service.clone())],
            value: value.to_owned(),
            line: number,
        });
    }
    let state = worst.map_or_else(|| state.to_owned(), |w| w.to_string());
    out.samples.push(Sample {
        name: service,
        labels: Vec::new(),
        value: state,
        line: number,
    });
    out.samples.append(&mut samples);
    Ok(())
}

/// A line the way local checks write it: a state, a service, and `-` or `name=value` metrics.
pub(super) fn looks_like(line: &str) -> bool {
    let (state, rest) = word(line);
    matches!(state, "0" | "1" | "2" | "3" | "P")
        && service_name(rest).is_ok_and(|(_, rest)| {
            let metrics = word(rest).0;
            metrics == "-" || metrics.contains('=')
        })
}

/// The first blank-separated word and the rest.
fn word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    s.split_once(char::is_whitespace)
        .map_or((s, ""), |(w, rest)| (w, rest.trim_start()))
}

fn service_name(s: &str) -> Result<(String, &str), String> {
    if let Some(quoted) = s.strip_prefix('"') {
        let Some((name, rest)) = quoted.split_once('"') else {
            return Err(format!("service name {:?} has no closing quote", clip(s)));
        };
        if name.is_empty() {
            return Err("empty service name".into());
        }
        return Ok((name.to_owned(), rest));
    }
    let (name, rest) = word(s);
    if name.is_empty() {
        return Err("no service name after the state".into());
    }
    Ok((name.to_owned(), rest))
}

/// `name=value;warn;crit;min;max`: (name, value in base units, the level its thresholds give).
fn metric(item: &str) -> Result<(&str, String, u8), String> {
    let Some((name, fields)) = item.split_once('=') else {
        return Err(format!(
            "metric {:?} is not `name=value;warn;crit;min;max`",
            clip(item)
        ));
    };
    if name.is_empty() {
        return Err(format!("metric {:?} has an empty name", clip(item)));
    }
    let mut parts = fields.split(';');
    let raw = parts.next().unwrap_or("");
    let value = match super::nagios::value_in_base_unit(raw) {
        Ok(Some(v)) => v,
        Ok(None) => return Err(format!("metric {name:?} is U: the check could not determine it")),
        Err(why) => return Err(format!("metric {name:?}: {why}")),
    };
    let n: f64 = value
        .parse()
        .map_err(|_| format!("metric {name:?}: value {raw:?} is not a number"))?;
    let warn = parts.next().unwrap_or("");
    let crit = parts.next().unwrap_or("");
    let level = if breaches(n, crit).map_err(|w| format!("metric {name:?}: {w}"))? {
        2
    } else if breaches(n, warn).map_err(|w| format!("metric {name:?}: {w}"))? {
        1
    } else {
        0
    };
    Ok((name, value, level))
}

/// Whether `v` breaches a threshold: `t` an upper level (`v >= t`), `lo:hi` a range (outside
/// it), empty none.
fn breaches(v: f64, threshold: &str) -> Result<bool, String> {
    let number = |s: &str| -> Result<Option<f64>, String> {
        if s.is_empty() {
            return Ok(None);
        }
        s.parse::<f64>()
            .map(Some)
            .map_err(|_| format!("threshold {:?} is not a number", clip(s)))
    };
    match threshold.split_once(':') {
        None => Ok(number(threshold)?.is_some_and(|t| v >= t)),
        Some((lo, hi)) => {
            let below = number(lo)?.is_some_and(|lo| v < lo);
            let above = number(hi)?.is_some_and(|hi| v > hi);
            Ok(below || above)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{bad_line_numbers, parse_ok, refused_at_budget};
    use super::*;

    fn get<'a>(p: &'a Parsed, name: &str, service: Option<&str>) -> Option<&'a str> {
        p.samples
            .iter()
            .find(|s| {
                s.name == name
                    && match service {
                        Some(svc) => s.labels == [(SERVICE_LABEL.to_owned(), svc.to_owned())],
                        None => s.labels.is_empty(),
                    }
            })
            .map(|s| s.value.as_str())
    }

    #[test]
    fn states_quoted_services_and_metrics() {
        let p = parse_ok(
            parse,
            "<<<local:sep(0)>>>\n0 \"Disk root\" used=41.5;80;90;0;100|inodes=12 All fine here\n2 myservice - Something is wrong\n1 Load load1=0.7;0.5;2|load5=0.4 busy\n",
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(get(&p, "Disk root", None), Some("0"));
        assert_eq!(get(&p, "used", Some("Disk root")), Some("41.5"));
        assert_eq!(get(&p, "inodes", Some("Disk root")), Some("12"));
        assert_eq!(get(&p, "myservice", None), Some("2"));
        assert_eq!(get(&p, "Load", None), Some("1"));
        assert_eq!(get(&p, "load5", Some("Load")), Some("0.4"));
    }

    #[test]
    fn the_text_is_a_string_sample_and_the_long_output_another() {
        let p = parse_ok(
            parse,
            "0 \"CPU x86-64 level\" - CPU x86_64 level: x86-64-v4\n1 Updates pending=3 3 updates\\nlibc6 2.36-9\\nopenssl 3.0.15\n0 Quiet -\n",
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(
            get(&p, TEXT, Some("CPU x86-64 level")),
            Some("CPU x86_64 level: x86-64-v4")
        );
        assert_eq!(get(&p, LONG_TEXT, Some("CPU x86-64 level")), None);
        assert_eq!(get(&p, TEXT, Some("Updates")), Some("3 updates"));
        // Kept escaped: a string value holds no newline.
        assert_eq!(
            get(&p, LONG_TEXT, Some("Updates")),
            Some("libc6 2.36-9\\nopenssl 3.0.15")
        );
        assert_eq!(get(&p, "pending", Some("Updates")), Some("3"));
        assert_eq!(get(&p, TEXT, Some("Quiet")), None);
        assert_eq!(get(&p, "Quiet", None), Some("0"));
    }

    #[test]
    fn empty_output_is_no_services_not_an_error() {
        for text in ["", "\n", "<<<local:sep(0)>>>\n"] {
            let p = parse_ok(parse, text);
            assert!(p.samples.is_empty() && p.bad_lines.is_empty(), "{text:?}");
        }
        const { assert!(DEF.empty_is_an_answer) };
    }

    #[test]
    fn p_computes_the_state_from_the_thresholds() {
        let p = parse_ok(
            parse,
            "P ok a=1;5;10\nP warn a=5;5;10|b=0\nP crit a=1;5;10|b=11;5;10\nP range t=15;20:30;10:40\nP range2 t=45;20:30;10:40\nP nothing -\n",
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        for (svc, state) in [
            ("ok", "0"),
            ("warn", "1"),
            ("crit", "2"),
            ("range", "1"),
            ("range2", "2"),
            ("nothing", "0"),
        ] {
            assert_eq!(get(&p, svc, None), Some(state), "{svc}");
        }
    }

    #[test]
    fn a_long_service_name_repeated_per_metric_is_refused_at_the_budget() {
        let metrics = vec!["a=1"; 20_000].join("|");
        let text = format!("0 {} {metrics} text\n", "s".repeat(60_000)).repeat(4);
        assert_eq!(refused_at_budget(parse, &text), 1);
    }

    #[test]
    fn malformed_lines_name_their_number_and_keep_the_rest() {
        let p = parse_ok(
            parse,
            "0 good a=1\n7 bad -\n0 \"unclosed a=1\n0 nometrics\n0 badmetric a=x\n0 noequals junk\nP badthreshold a=1;x\n0 alsogood -\n",
        );
        assert_eq!(get(&p, "good", None), Some("0"));
        assert_eq!(get(&p, "alsogood", None), Some("0"));
        assert_eq!(bad_line_numbers(&p), [2, 3, 4, 5, 6, 7]);
        assert!(p.bad_lines[0].to_string().contains("is not 0, 1, 2, 3 or P"));
    }
}
