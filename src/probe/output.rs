//! Parsers for what probes print. They return raw tokens by name; typing against each
//! resource's valtype happens in one place (`value::Valtype::parse`).

use crate::config::Format;

/// One `name -> raw text` pair a probe reported.
pub type Pair = (String, String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error("empty output")]
    Empty,
    #[error("output is not valid UTF-8 (at byte {0})")]
    NotUtf8(usize),
    #[error("output contains a NUL byte")]
    Nul,
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

fn text(out: &[u8]) -> Result<&str, OutputError> {
    if out.contains(&0) {
        return Err(OutputError::Nul);
    }
    std::str::from_utf8(out).map_err(|e| OutputError::NotUtf8(e.valid_up_to()))
}

/// Parse `out` in `format`. For `value`, the single pair is named `own`.
pub fn parse(format: Format, out: &[u8], own: &str) -> Result<Vec<Pair>, OutputError> {
    let t = text(out)?;
    match format {
        Format::Value => parse_value(t).map(|v| vec![(own.to_owned(), v)]),
        Format::Kv => parse_kv(t),
        Format::Elim => parse_elim(t),
    }
}

/// The first non-blank line.
pub fn parse_value(t: &str) -> Result<String, OutputError> {
    t.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or(OutputError::Empty)
}

/// `name = value` lines; blank lines and `#` comments are ignored; a value in double quotes
/// (HTCondor strings) loses its quotes. A later line for the same name wins.
pub fn parse_kv(t: &str) -> Result<Vec<Pair>, OutputError> {
    let mut pairs: Vec<Pair> = Vec::new();
    for (i, line) in t.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(OutputError::Line {
                line: i + 1,
                reason: format!("expected `name = value`, got {:?}", clip(line)),
            });
        };
        let (k, mut v) = (k.trim(), v.trim());
        if k.is_empty() || k.contains(char::is_whitespace) {
            return Err(OutputError::Line {
                line: i + 1,
                reason: format!("bad name {:?}", clip(k)),
            });
        }
        if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
            v = &v[1..v.len() - 1];
        }
        upsert(&mut pairs, k, v);
    }
    if pairs.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(pairs)
}

/// LSF ELIM lines: `n name1 value1 ... nameN valueN`. Every complete line updates the values
/// it names; the last line wins.
pub fn parse_elim(t: &str) -> Result<Vec<Pair>, OutputError> {
    let mut pairs: Vec<Pair> = Vec::new();
    for (i, line) in t.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        for (k, v) in parse_elim_line(line).map_err(|reason| OutputError::Line {
            line: i + 1,
            reason,
        })? {
            upsert(&mut pairs, &k, &v);
        }
    }
    if pairs.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(pairs)
}

/// One ELIM line. `0` alone is valid: nothing to report this time.
pub fn parse_elim_line(line: &str) -> Result<Vec<Pair>, String> {
    let mut words = line.split_whitespace();
    let n: usize = match words.next() {
        Some(w) => w.parse().map_err(|_| {
            format!(
                "expected a count first (`n name value ...`), got {:?}",
                clip(w)
            )
        })?,
        None => return Ok(Vec::new()),
    };
    let rest: Vec<&str> = words.collect();
    if rest.len() != n * 2 {
        return Err(format!(
            "count says {n} pairs but {} words follow",
            rest.len()
        ));
    }
    Ok(rest
        .chunks(2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect())
}

fn upsert(pairs: &mut Vec<Pair>, k: &str, v: &str) {
    match pairs.iter_mut().find(|(n, _)| n == k) {
        Some(p) => p.1 = v.to_owned(),
        None => pairs.push((k.to_owned(), v.to_owned())),
    }
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_is_first_non_blank_line() {
        assert_eq!(
            parse(Format::Value, b"\n 42 \nmore\n", "x").unwrap(),
            vec![("x".into(), "42".into())]
        );
        assert_eq!(parse(Format::Value, b"  \n", "x"), Err(OutputError::Empty));
        assert_eq!(parse(Format::Value, b"4\x002", "x"), Err(OutputError::Nul));
        assert_eq!(
            parse(Format::Value, b"\xff\xfe", "x"),
            Err(OutputError::NotUtf8(0))
        );
    }

    #[test]
    fn kv_lines() {
        let got = parse_kv("# comment\na = 1\nb=\"two words\"\n\na = 3\n").unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "3".into()), ("b".into(), "two words".into())]
        );
        assert!(matches!(
            parse_kv("a = 1\ngarbage\n"),
            Err(OutputError::Line { line: 2, .. })
        ));
        assert!(matches!(
            parse_kv("two words = 1\n"),
            Err(OutputError::Line { line: 1, .. })
        ));
    }

    #[test]
    fn elim_lines() {
        let got = parse_elim("2 a 1 b 2\n1 a 5\n").unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "5".into()), ("b".into(), "2".into())]
        );
        assert!(parse_elim("2 a 1\n").is_err());
        assert!(parse_elim("x a 1\n").is_err());
        assert_eq!(parse_elim_line("0").unwrap(), vec![]);
    }
}
