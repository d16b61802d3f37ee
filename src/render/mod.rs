//! Everything the commands print, in one place: `--once`'s table and JSON ([`once`]),
//! `check`'s plan ([`plan`]), `probe NAME`'s report ([`probe`]), `status`'s table
//! ([`status`]), and the pieces `listen --format table` shares with them.

pub mod man;
pub mod once;
pub mod plan;
pub mod probe;
pub mod status;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use crate::text::escape;
use crate::value::{Status, Value};

pub fn format_time(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A value as the tables show it to people (`status`, `--once`, `listen --format table`),
/// LSF's way; JSON and the wire keep the exact value. The rule:
///
/// * a number has 3 significant digits, but never loses integer digits: `2.6275805558362759`
///   shows as `2.63`, `75.92` as `75.9`, `23311.6` as `23312`, `0.001234` as `0.00123`;
///   trailing zeros go (`2.5`, `2`); below 0.001 or from 10^15 up it is written
///   as `1.23e-5`;
/// * a size in megabytes — LSF's `mem`, `swp`, `tmp`, `maxmem`, `maxswp`, `maxtmp`, and any
///   resource whose name ends in `_mb` — shows with lsload's units: `512M`, `22.8G`,
///   `1.5T` (1024-based), by the same 3-digit rule;
/// * strings and booleans as they are, an unknown value as `-`.
pub fn human_value(name: &str, value: &Value) -> String {
    match value {
        Value::Numeric(v) if is_megabytes(name) && v.is_finite() => {
            let mut v = *v;
            let mut unit = "M";
            for next in ["G", "T", "P"] {
                if v.abs() < 1024.0 {
                    break;
                }
                v /= 1024.0;
                unit = next;
            }
            format!("{}{unit}", human_number(v))
        }
        Value::Numeric(v) => human_number(*v),
        other => other.to_string(),
    }
}

/// The resources [`human_value`] shows as sizes: values in megabytes.
fn is_megabytes(name: &str) -> bool {
    matches!(name, "mem" | "swp" | "tmp" | "maxmem" | "maxswp" | "maxtmp")
        || name.to_ascii_lowercase().ends_with("_mb")
}

/// A number to 3 significant digits, keeping every integer digit ([`human_value`]'s rule).
pub fn human_number(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    if a == 0.0 {
        return "0".into();
    }
    if !(0.001..1e15).contains(&a) {
        let s = format!("{v:.2e}");
        // `1.50e-5` -> `1.5e-5`
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exp}");
    }
    // Decimals that leave 3 significant digits: 2 below 10, 1 below 100, none from 100 up.
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    if s == "-0" {
        "0".into()
    } else {
        s.to_owned()
    }
}

/// Left-aligned columns, the last one unpadded. Every cell is shown escaped
/// ([`crate::text::escape`]): a probe's value or error, a name, a peer's host never moves the
/// cursor, writes the clipboard or reorders the line (a bidi override) on the terminal that
/// shows the table. The one place every table (`status`, `--once`, `check`, `listen --format
/// table`) goes through.
pub fn columns(rows: &[Vec<String>]) -> String {
    let escaped: Vec<Vec<Cow<'_, str>>> = rows
        .iter()
        .map(|r| r.iter().map(|c| escape(c)).collect())
        .collect();
    let rows = &escaped;
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A table as `status`, `--once` and `check` show one: a header, then a row per resource or
/// probe, laid out by [`columns`]. Its second column is INSTANCE, `-` in a row without one;
/// a table of resources leaves it out where no row has one.
pub struct Table {
    rows: Vec<Vec<String>>,
    /// Some row has an instance.
    instances: bool,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|s| (*s).to_owned()).collect()],
            instances: false,
        }
    }

    /// A row: `name`, its `instance` (`-` for none), then `rest`.
    pub fn row(&mut self, name: String, instance: &str, rest: impl IntoIterator<Item = String>) {
        self.instances |= !instance.is_empty();
        let instance = if instance.is_empty() { "-" } else { instance };
        let mut row = vec![name, instance.to_owned()];
        row.extend(rest);
        self.rows.push(row);
    }

    /// A resource's row: its name, instance, value and status, then `rest`.
    pub fn resource(
        &mut self,
        name: &str,
        instance: &str,
        value: &Value,
        status: Status,
        rest: impl IntoIterator<Item = String>,
    ) {
        let shown = [human_value(name, value), status.to_string()];
        self.row(name.to_owned(), instance, shown.into_iter().chain(rest));
    }

    /// A row as it is (a line that continues the one above, a table without INSTANCE).
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub fn text(&self) -> String {
        columns(&self.rows)
    }

    /// [`Table::text`] without the INSTANCE column where no row has an instance.
    pub fn text_without_empty_instances(mut self) -> String {
        if !self.instances {
            for row in &mut self.rows {
                row.remove(1);
            }
        }
        self.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_three_significant_digits_and_keep_their_integer_part() {
        for (v, shown) in [
            (2.6275805558362759, "2.63"),
            (2.5, "2.5"),
            (2.0, "2"),
            (75.92, "75.9"),
            (99.96, "100"),
            (123.456, "123"),
            (23311.64, "23312"),
            (0.001234, "0.00123"),
            (0.0001234, "1.23e-4"),
            (-3.25159, "-3.25"),
            (-0.0001, "-1e-4"),
            (0.0, "0"),
            (-0.0, "0"),
            (1e15, "1e15"),
            (123456789012.0, "123456789012"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(human_number(v), shown, "{v}");
        }
    }

    #[test]
    fn megabytes_show_with_lsload_units() {
        let n = Value::Numeric;
        assert_eq!(human_value("mem", &n(23311.64)), "22.8G");
        assert_eq!(human_value("tmp", &n(512.0)), "512M");
        assert_eq!(human_value("swp", &n(0.0)), "0M");
        assert_eq!(human_value("maxmem", &n(1024.0)), "1G");
        assert_eq!(human_value("scratch_free_MB", &n(1_572_864.0)), "1.5T");
        assert_eq!(human_value("r15s", &n(2.6275805558362759)), "2.63");
        assert_eq!(human_value("memory", &n(23311.64)), "23312");
        assert_eq!(human_value("mem", &Value::Unknown), "-");
        assert_eq!(human_value("os", &Value::String("a b".into())), "a b");
        assert_eq!(human_value("up", &Value::Boolean(true)), "true");
    }

    #[test]
    fn every_cell_is_escaped_and_aligned_by_what_is_shown() {
        let rows = vec![
            vec!["NAME".to_owned(), "VALUE".to_owned()],
            vec!["a\u{202e}b".to_owned(), "\u{1b}]52;c;AA==\u{7}".to_owned()],
            vec!["long_name_x".to_owned(), "1".to_owned()],
        ];
        let out = columns(&rows);
        assert!(out.lines().all(crate::text::is_clean_line), "{out}");
        assert_eq!(
            out,
            "NAME         VALUE\na\\u{202e}b   \\u{1b}]52;c;AA==\\u{7}\nlong_name_x  1\n"
        );
    }
}
