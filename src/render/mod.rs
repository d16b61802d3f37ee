//! Everything the commands print, in one place: `--once`'s table and JSON ([`once`]),
//! `check`'s plan ([`plan`]), `probe NAME`'s report ([`probe`]), `status`'s table
//! ([`status`]), and the pieces `listen --format table` shares with them.

pub mod once;
pub mod plan;
pub mod probe;
pub mod status;

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

pub fn format_time(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Left-aligned columns, the last one unpadded.
pub fn columns(rows: &[Vec<String>]) -> String {
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
