//! `format: sge`: a Grid Engine load sensor's report (`sge_execd(8)`, LOAD SENSORS):
//! `begin`, lines `host:name:value`, `end`. `host` is this host (its short name or FQDN, as
//! SGE matches them) or `global` (a cluster-wide value); a line for another host is an error
//! that names it. The value is the rest of the line after the second `:`.
//!
//! Samples: one per load value, named as SGE names it (`load.5m`, `np_load_avg`, `nuser`); a
//! global value carries the label `host="global"`. A memory value with a multiplier, as
//! `sge_types(1)` defines them (`k` 1000, `K` 1024, `m` 1000², `M` 1024², `g` 1000³, `G`
//! 1024³: `tmpfree:77261344k`, `2.5G`), is given in bytes, as SGE reads it. Without `select:` a resource named like
//! the value is fed by it (`load.5m` feeds `load_5m`); `select:` names it as written.
//!
//! A load sensor is long-running: sge_execd writes a newline on its stdin for each report
//! and `quit` to stop it. [`parse_block`] reads one report for a stream reader; [`parse`]
//! reads whole text (a one-shot script printing one report).

use super::stream::{Block, Blocks, Streaming};
use super::{clip, FormatDef, Input, Latest, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    // A stream probe asks for each report with a newline on the sensor's stdin and says
    // `quit` before it stops the sensor, as sge_execd does.
    stream: Streaming::Blocks(Blocks {
        end: |line| (line == END).then_some(""),
        parse: report,
        called: "load report",
        terminator: "`end`",
        goodbye: Some(b"quit\n"),
        asked: true,
    }),
    ..FormatDef::of_a_peer(
        "sge",
        "a Grid Engine load sensor report",
        parse,
        &super::NO_PEER,
    )
};

/// The host a cluster-wide value names.
pub const GLOBAL: &str = "global";

/// What a load sensor writes before and after each report.
pub const BEGIN: &str = "begin";
pub const END: &str = "end";

/// The host name the sensor compares with: the machine's, as SGE's `gethostname -name`.
pub fn this_host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default()
    })
}

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut latest = Latest::default();
    let mut block: Option<Vec<(usize, &str)>> = None;
    let mut last_line = 0;
    for (i, line) in input.text.lines().enumerate() {
        let number = i + 1;
        last_line = number;
        let trimmed = line.trim();
        match (trimmed, block.as_mut()) {
            ("", _) => {}
            (BEGIN, Some(_)) => out.bad(number, "`begin` inside a report (no `end` before it)"),
            (BEGIN, None) => block = Some(Vec::new()),
            (END, Some(_)) => {
                let lines = block.take().unwrap_or_default();
                let report = parse_block(&lines, this_host());
                for s in report.samples {
                    latest.put(&mut out, s);
                }
                out.append(Parsed {
                    samples: Vec::new(),
                    ..report
                });
            }
            (END, None) => out.bad(number, "`end` without a `begin`"),
            (_, Some(lines)) => lines.push((number, line)),
            (_, None) => out.bad(
                number,
                format!(
                    "{:?} is outside a `begin` ... `end` report",
                    clip(trimmed)
                ),
            ),
        }
    }
    if block.is_some() {
        out.bad(last_line, "the report has no `end`");
    }
    if out.samples.is_empty() && out.bad_lines.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(out)
}

/// One report a stream read up to its `end`: its lines after `begin` (a sensor that leaves
/// `begin` out is read all the same, as sge_execd does).
fn report(block: &Block) -> Parsed {
    let lines: Vec<(usize, &str)> = block
        .lines
        .iter()
        .map(|(n, l)| (*n, l.as_str()))
        .filter(|(_, l)| *l != BEGIN)
        .collect();
    parse_block(&lines, this_host())
}

/// One report: the `(line number, line)`s between `begin` and `end`, for `this_host`. A
/// later line for the same value replaces an earlier one.
pub fn parse_block(lines: &[(usize, &str)], this_host: &str) -> Parsed {
    let mut out = Parsed::default();
    let mut latest = Latest::default();
    for &(number, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(host), Some(name), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            out.bad(
                number,
                format!("expected `host:name:value`, got {:?}", clip(line)),
            );
            continue;
        };
        let (host, name, value) = (host.trim(), name.trim(), value.trim());
        if name.is_empty() {
            out.bad(number, format!("no load value name in {:?}", clip(line)));
            continue;
        }
        if value.is_empty() {
            // Grid Engine's own load.sh prints `host:load.15m:` when uptime's layout shifts.
            out.bad(number, format!("{name} has no value"));
            continue;
        }
        let labels = if host.eq_ignore_ascii_case(GLOBAL) {
            vec![(super::select::HOST_LABEL.to_owned(), GLOBAL.to_owned())]
        } else if same_host(host, this_host) {
            Vec::new()
        } else {
            out.bad(
                number,
                format!(
                    "{name} is reported for host {:?}, not this host ({this_host}) or `global`",
                    clip(host)
                ),
            );
            continue;
        };
        let sample = Sample {
            name: name.to_owned(),
            labels,
            value: memory_in_bytes(value).unwrap_or_else(|| value.to_owned()),
            line: number,
        };
        latest.put(&mut out, sample);
    }
    out
}

/// A memory specifier with a multiplier (`sge_types(1)`: a number, then one of `kKmMgG`)
/// in bytes; `None` for any other value (a plain number, a string), which stays as written.
fn memory_in_bytes(value: &str) -> Option<String> {
    let unit = value.chars().last()?;
    let multiplier: f64 = match unit {
        'k' => 1e3,
        'K' => 1024.0,
        'm' => 1e6,
        'M' => 1024.0 * 1024.0,
        'g' => 1e9,
        'G' => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let number = &value[..value.len() - 1];
    // Digits with at most one point: `1e3k` or `infk` is a string, not a memory value.
    let digits_and_a_point = !number.is_empty()
        && number.chars().all(|c| c.is_ascii_digit() || c == '.')
        && number.chars().filter(|&c| c == '.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    if !digits_and_a_point {
        return None;
    }
    let bytes = number.parse::<f64>().ok()? * multiplier;
    bytes.is_finite().then(|| bytes.to_string())
}

/// SGE's match: the same name ignoring case, or the same short name when one is an FQDN.
fn same_host(written: &str, this: &str) -> bool {
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_ascii_lowercase();
    written.eq_ignore_ascii_case(this) || (!written.is_empty() && short(written) == short(this))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::bad_line_numbers;
    use super::*;

    fn block(text: &str) -> Parsed {
        let lines: Vec<(usize, &str)> = text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
        parse_block(&lines, "node7.example.org")
    }

    #[test]
    fn a_report_for_this_host_and_global_values() {
        let p = block(
            "node7:arch:lx-amd64\nnode7.example.org:load.5m: 0.52\nNODE7:np_load_avg:0.13\nglobal:licenses:12\nnode7:clock:12:30\n",
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(&str, &str, usize)> = p
            .samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str(), s.labels.len()))
            .collect();
        assert_eq!(
            got,
            [
                ("arch", "lx-amd64", 0),
                ("load.5m", "0.52", 0),
                ("np_load_avg", "0.13", 0),
                ("licenses", "12", 1),
                ("clock", "12:30", 0),
            ]
        );
    }

    #[test]
    fn memory_values_with_a_multiplier_are_bytes_as_sge_types_defines_them() {
        let p = block(
            "node7:tmpfree:77261344k\nnode7:mem_free:2.5G\nnode7:a:1K\nnode7:b:3m\nnode7:c:3M\nnode7:d:2g\nnode7:plain:512\nnode7:arch:lx-amd64\nnode7:word:k\nnode7:e:1e3k\nnode7:f:1.2.3M\n",
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(&str, &str)> = p
            .samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("tmpfree", "77261344000"),
                ("mem_free", "2684354560"),
                ("a", "1024"),
                ("b", "3000000"),
                ("c", "3145728"),
                ("d", "2000000000"),
                ("plain", "512"),
                ("arch", "lx-amd64"),
                ("word", "k"),
                ("e", "1e3k"),
                ("f", "1.2.3M"),
            ]
        );
    }

    #[test]
    fn another_host_and_malformed_lines_are_errors_naming_them() {
        let p = block("node7:a:1\nnode8:b:2\ngarbage\nnode7::3\nnode7:a:4\nnode7:c:\n");
        assert_eq!(bad_line_numbers(&p), [2, 3, 4, 6]);
        assert!(p.bad_lines[0].to_string().contains("host \"node8\""));
        assert_eq!(p.samples.len(), 1);
        assert_eq!(p.samples[0].value, "4");
    }

    #[test]
    fn whole_text_reads_each_report_between_begin_and_end() {
        let host = this_host();
        let text = format!(
            "stray\nbegin\n{host}:load.5m:1\nend\nbegin\n{host}:load.5m:2\nglobal:g:3\nend\nend\nbegin\n{host}:x:1\n"
        );
        let p = parse(&Input {
            text: &text,
            exit: Some(0),
            own: "x",
        })
        .unwrap();
        assert_eq!(bad_line_numbers(&p), [1, 9, 11]);
        let got: Vec<(&str, &str)> = p
            .samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(got, [("load.5m", "2"), ("g", "3")]);
    }
}
