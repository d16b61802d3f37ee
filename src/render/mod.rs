//! Everything the commands print, in one place: `--once`'s table and JSON ([`once`]),
//! `check`'s plan ([`plan`]), `probe NAME`'s report ([`probe`]), `status`'s table
//! ([`status`]), and the pieces `listen --format table` shares with them.

pub mod once;
pub mod plan;
pub mod probe;
pub mod status;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use crate::text::escape;

pub fn format_time(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

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
