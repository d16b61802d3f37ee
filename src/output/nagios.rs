//! `format: nagios`: the Nagios plugin API (also Icinga, NHC-style checks). The exit status is
//! the verdict: 0 OK, 1 WARNING, 2 CRITICAL are answers, 3 UNKNOWN (or anything else) is a
//! failed run. Output: `TEXT | perfdata` on the first line, long text on the next lines, and
//! more perfdata after a second `|` until the end. A perfdata item is
//! `'label'=value[UOM];warn;crit;min;max`; values are converted to base units: seconds
//! (s, ms, us), bytes (B, KB, MB, GB, TB as powers of 1024, as the plugins compute them, and
//! `kB`, `KiB`...`TiB` as /proc/meminfo readers print them);
//! `%` and `c` (a counter) stay as printed.
//!
//! Samples: one per perfdata label, plus `exit` (the status as a number), `ok` (true when
//! the status is 0) and `text` (the first line before `|`).

use super::stream::Streaming;
use super::{Exits, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "nagios",
    title: "Nagios plugin output",
    parse,
    exits: Exits::Nagios,
    selectable: true,
    empty_is_an_answer: true,
    fold_case: false,
    stream: Streaming::No,
    peer: &super::NO_PEER,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut lines = input.text.lines().enumerate();
    let mut perf: Vec<(usize, &str)> = Vec::new();
    let mut status_text = "";
    if let Some((_, first)) = lines.next() {
        let (text, data) = first.split_once('|').unwrap_or((first, ""));
        status_text = text.trim();
        perf.push((1, data));
    }
    let mut in_perf = false;
    for (i, line) in lines {
        if in_perf {
            perf.push((i + 1, line));
        } else if let Some((_, data)) = line.split_once('|') {
            in_perf = true;
            perf.push((i + 1, data));
        }
    }
    if let Some(code) = input.exit {
        out.samples.push(Sample::plain("exit", &code.to_string()));
        out.samples.push(Sample::plain(
            "ok",
            if code == 0 { "true" } else { "false" },
        ));
    }
    if !status_text.is_empty() {
        out.samples.push(Sample::plain("text", status_text));
    }
    for (line, data) in perf {
        perfdata_line(&mut out, line, data);
    }
    Ok(out)
}

/// The items of one perfdata line; a bad item is reported and the others kept.
fn perfdata_line(out: &mut Parsed, line: usize, data: &str) {
    let mut rest = data.trim_start();
    while !rest.is_empty() {
        match item(rest) {
            Ok((label, raw, tail)) => {
                match value_in_base_unit(raw) {
                    Ok(Some(v)) => out.samples.push(Sample {
                        name: label,
                        labels: Vec::new(),
                        value: v,
                        line,
                    }),
                    Ok(None) => out.bad(
                        line,
                        format!("perfdata {label:?} is U: the plugin could not determine it"),
                    ),
                    Err(why) => out.bad(line, format!("perfdata {label:?}: {why}")),
                }
                rest = tail.trim_start();
            }
            Err((why, tail)) => {
                out.bad(line, why);
                rest = tail.trim_start();
            }
        }
    }
}

type ItemError<'a> = (String, &'a str);

/// `label=value;warn;crit;min;max` at the start of `s`: (label, value with UOM, rest).
fn item(s: &str) -> Result<(String, &str, &str), ItemError<'_>> {
    let (label, after) = if let Some(quoted) = s.strip_prefix('\'') {
        // '' inside a quoted label is one quote.
        let mut label = String::new();
        let mut chars = quoted.char_indices().peekable();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            if c == '\'' {
                if chars.peek().is_some_and(|(_, n)| *n == '\'') {
                    label.push('\'');
                    chars.next();
                } else {
                    end = Some(i + 1);
                    break;
                }
            } else {
                label.push(c);
            }
        }
        let Some(end) = end else {
            return Err((format!("unterminated quote in perfdata {s:?}"), ""));
        };
        (label, &quoted[end..])
    } else {
        // Real plugins print labels with spaces unquoted (`free memory=23180MB;512;256;0`,
        // common in Sensu's checks): the label is everything up to the `=`. Text with no
        // `=` after it is not perfdata at all.
        let Some(end) = s.find('=') else {
            return Err((
                format!(
                    "perfdata {:?} is not `label=value[UOM];warn;crit;min;max`",
                    super::clip(s)
                ),
                "",
            ));
        };
        (s[..end].trim_end().to_owned(), &s[end..])
    };
    let word_end = after.find(' ').unwrap_or(after.len());
    let (word, tail) = after.split_at(word_end);
    let Some(fields) = word.strip_prefix('=') else {
        return Err((
            format!(
                "perfdata {:?} is not `label=value[UOM];warn;crit;min;max`",
                super::clip(s)
            ),
            tail,
        ));
    };
    if label.is_empty() {
        return Err((format!("perfdata {word:?} has an empty label"), tail));
    }
    let value = fields.split(';').next().unwrap_or("");
    Ok((label, value, tail))
}

/// `12.5MB` -> bytes; `U` -> None.
pub(super) fn value_in_base_unit(raw: &str) -> Result<Option<String>, String> {
    if raw == "U" {
        return Ok(None);
    }
    let split = raw
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(raw.len());
    // `1e3` is a number; `3ms` must not read `e` as an exponent: only digits follow it.
    let (num, uom) = raw.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("value {raw:?} is not a number"))?;
    let factor = match uom {
        "" | "s" | "%" | "B" | "c" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        // `kB` and the IEC names as plugins that read /proc/meminfo print them
        // (nagios-plugins-linux's check_memory: `mem_total=24683784kB`).
        "KB" | "kB" | "KiB" => 1024.0,
        "MB" | "MiB" => 1024.0 * 1024.0,
        "GB" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TB" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} (known: s ms us % B KB MB GB TB c, kB, KiB MiB GiB TiB)"
            ))
        }
    };
    if factor == 1.0 {
        return Ok(Some(num.to_owned()));
    }
    Ok(Some((n * factor).to_string()))
}

/// A first line the way plugins write it: `SERVICE STATUS - text` or `text | perfdata`.
pub fn looks_like(first: &str) -> bool {
    let head = first.split('|').next().unwrap_or("");
    let status = ["OK", "WARNING", "CRITICAL", "UNKNOWN"];
    let words: Vec<&str> = head.split_whitespace().take(4).collect();
    // `LOAD OK - ...`, `PROCS OK: ...`; not `state = OK`.
    let status_word = words.iter().enumerate().take(3).any(|(i, w)| {
        status.contains(&w.trim_end_matches(':'))
            && (w.ends_with(':') || words.get(i + 1).is_some_and(|n| *n == "-"))
    });
    status_word
        || first
            .split_once('|')
            .is_some_and(|(_, p)| p.contains('=') && p.contains(';'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, exit: i32) -> Parsed {
        parse(&Input {
            text,
            exit: Some(exit),
            own: "x",
        })
        .unwrap()
    }

    fn get<'a>(p: &'a Parsed, name: &str) -> Option<&'a str> {
        p.samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value.as_str())
    }

    #[test]
    fn check_load_and_check_disk_perfdata() {
        let p = run(
            "LOAD OK - total load average: 0.52, 0.58, 0.59|load1=0.520;5.000;10.000;0; load5=0.580;4.000;6.000;0; load15=0.590;3.000;4.000;0; \n",
            0,
        );
        assert_eq!(get(&p, "load1"), Some("0.520"));
        assert_eq!(get(&p, "load15"), Some("0.590"));
        assert_eq!(get(&p, "exit"), Some("0"));
        assert_eq!(get(&p, "ok"), Some("true"));
        assert_eq!(
            get(&p, "text"),
            Some("LOAD OK - total load average: 0.52, 0.58, 0.59")
        );
        let p = run(
            "DISK WARNING - free space: / 3326 MB (5%); | /=2643MB;5948;5958;0;5968\n",
            1,
        );
        assert_eq!(get(&p, "/"), Some(&*(2643.0 * 1048576.0f64).to_string()));
        assert_eq!(get(&p, "ok"), Some("false"));
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
    }

    #[test]
    fn quoted_labels_units_and_continued_perfdata() {
        let p = run(
            "OK - fine | 'with space'=5ms;;; 'it''s'=2KB\nlong text\nmore | rta=0.1s;1;2\npl=0%;;;0;100 c=12c\n",
            0,
        );
        assert_eq!(get(&p, "with space"), Some("0.005"));
        assert_eq!(get(&p, "it's"), Some("2048"));
        assert_eq!(get(&p, "rta"), Some("0.1"));
        assert_eq!(get(&p, "pl"), Some("0"));
        assert_eq!(get(&p, "c"), Some("12"));
    }

    #[test]
    fn bad_items_name_their_line_and_keep_the_rest() {
        let p = run("OK | a=1 b=2furlong c=U d=3 =4 junk\n", 0);
        assert_eq!(get(&p, "a"), Some("1"));
        assert_eq!(get(&p, "d"), Some("3"));
        assert_eq!(p.bad_lines.len(), 4, "{:?}", p.bad_lines);
        for e in &p.bad_lines {
            assert!(matches!(e, OutputError::Line { line: 1, .. }));
        }
        assert!(p.bad_lines[0].to_string().contains("unknown unit"));
        assert!(p.bad_lines[3].to_string().contains("\"junk\" is not `label=value"));
    }

    #[test]
    fn an_unquoted_label_with_spaces_is_the_whole_label() {
        // Sensu's check-memory, check-swap: labels with spaces, unquoted.
        let p = run(
            "MEMORY OK | free memory=23180MB;512;256;0 used swap=0MB;;;0 load=1\n",
            0,
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(
            get(&p, "free memory"),
            Some(&*(23180.0 * 1048576.0f64).to_string())
        );
        assert_eq!(get(&p, "used swap"), Some("0"));
        assert_eq!(get(&p, "load"), Some("1"));
        assert_eq!(get(&p, "memory"), None, "no half label");
        // nagios-plugins-linux's check_memory prints kB, as /proc/meminfo does.
        let p = run("memory OK | mem_total=2kB a=1KiB b=1GiB\n", 0);
        assert_eq!(get(&p, "mem_total"), Some("2048"));
        assert_eq!(get(&p, "b"), Some(&*(1u64 << 30).to_string()));
    }

    #[test]
    fn plugin_lines_are_recognised_and_kv_lines_are_not() {
        assert!(looks_like("LOAD OK - total load average: 0.52"));
        assert!(looks_like("PROCS OK: 121 processes"));
        assert!(looks_like("anything | a=1;2;3"));
        assert!(!looks_like("state = OK"));
        assert!(!looks_like("OK"));
    }

    #[test]
    fn empty_output_still_has_the_exit_status() {
        let p = run("", 0);
        assert_eq!(get(&p, "ok"), Some("true"));
        assert_eq!(get(&p, "text"), None);
        let p = run("Node is down: /scratch not mounted\n", 1);
        assert_eq!(get(&p, "exit"), Some("1"));
    }
}
