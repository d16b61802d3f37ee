//! Text that came from outside (a peer's host name, a resource name, a probe's value, what a
//! probe printed) shown where a terminal or a log shows it: listen's text format, every table
//! (`status`, `--once`, `check`, `listen --format table`), `probe NAME`'s report and log
//! lines. Escaping the characters that could end a line, move the cursor, write the
//! clipboard or the title (ESC and OSC sequences) or reorder what a terminal shows (bidi
//! overrides and the other Unicode format characters) means one input is always one output
//! line and reads as data, never as markup. This is the one escaping function; the JSON
//! outputs do not use it (serde_json escapes control characters and keeps the rest lossless).

use std::borrow::Cow;
use std::fmt::Write as _;

/// True for the characters `escape` rewrites: control characters (C0, DEL, C1), the Unicode
/// line and paragraph separators, the format characters (general category Cf: bidi
/// embeddings, overrides, isolates and marks, zero-width characters, the BOM, tags), and the
/// backslash that starts every escape (so an escaped text reads back unambiguously).
fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\\' || matches!(c, '\u{2028}' | '\u{2029}') || is_format_char(c)
}

/// Unicode general category Cf (format characters, Unicode 15.1): invisible, and some of them
/// (U+202A-U+202E, U+2066-U+2069, U+200E/F, U+061C) reorder the text around them.
fn is_format_char(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}'
    )
}

/// `s` with every character of `needs_escape` written as a Rust-style escape (`\n`, `\t`,
/// `\\`, `\u{1b}`); borrowed unchanged in the common case of clean text. Lossless: the
/// original reads back from the escaped text.
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_where(s, needs_escape)
}

/// Like [`escape`] but a backslash stays as it is: for the log, where a line may already hold
/// text that [`escape`] wrote (a second pass changes nothing) and Debug-quoted fields. Not
/// lossless, and never needs to be: it only keeps what a probe said from acting on a terminal
/// or splitting a log line.
pub fn sanitize(s: &str) -> Cow<'_, str> {
    escape_where(s, |c| c != '\\' && needs_escape(c))
}

fn escape_where(s: &str, rewrite: fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(rewrite) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !rewrite(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// A block of text (a probe's stdout or stderr) as lines, each escaped: the line breaks stay
/// line breaks, everything else `escape` rewrites is written out (a `\r` too, which would
/// move the cursor back over what the line showed).
pub fn escape_lines(s: &str) -> impl Iterator<Item = Cow<'_, str>> {
    let s = s.strip_suffix('\n').unwrap_or(s);
    (!s.is_empty())
        .then(|| s.split('\n'))
        .into_iter()
        .flatten()
        .map(escape)
}

/// Whether a line is safe to print as is: no character `escape` would rewrite, except that a
/// backslash is fine (it is how an escape reads). What the tests check every output line with.
pub fn is_clean_line(line: &str) -> bool {
    !line.chars().any(|c| c != '\\' && needs_escape(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_text_is_borrowed() {
        assert!(matches!(escape("node001 gpu_free"), Cow::Borrowed(_)));
    }

    #[test]
    fn line_breaks_and_terminal_escapes_are_written_out() {
        assert_eq!(escape("evil\nnode042"), "evil\\nnode042");
        assert_eq!(escape("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(escape("a\\nb"), "a\\\\nb");
        assert_eq!(escape("x\u{2028}y\u{202e}"), "x\\u{2028}y\\u{202e}");
        assert_eq!(escape("\u{85}\r\t\u{7f}"), "\\u{85}\\r\\t\\u{7f}");
        // OSC 52 (clipboard write), the title, a clear screen.
        assert_eq!(
            escape("\u{1b}]52;c;ZWNobyBoaQ==\u{7}\u{1b}]0;t\u{7}\u{1b}c"),
            "\\u{1b}]52;c;ZWNobyBoaQ==\\u{7}\\u{1b}]0;t\\u{7}\\u{1b}c"
        );
    }

    #[test]
    fn format_characters_are_written_out() {
        for c in [
            '\u{202a}',
            '\u{202e}',
            '\u{2066}',
            '\u{2069}',
            '\u{200e}',
            '\u{200f}',
            '\u{61c}',
            '\u{200b}',
            '\u{feff}',
            '\u{ad}',
            '\u{e0041}',
        ] {
            let s = format!("a{c}b");
            assert_eq!(escape(&s), format!("a\\u{{{:x}}}b", u32::from(c)), "{c:?}");
        }
        // Letters, marks and emoji are not format characters.
        assert!(matches!(escape("naïve ok ✓ 温度 שלום"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_block_keeps_its_lines() {
        let lines: Vec<_> = escape_lines("one\r\ntwo\u{1b}[2J\n").collect();
        assert_eq!(lines, ["one\\r", "two\\u{1b}[2J"]);
        assert_eq!(escape_lines("").count(), 0);
    }

    #[test]
    fn sanitized_text_keeps_backslashes_and_is_idempotent_on_escaped_text() {
        assert_eq!(
            sanitize("a\\b\n\u{1b}[2J\u{202e}"),
            "a\\b\\n\\u{1b}[2J\\u{202e}"
        );
        let escaped = escape("x\u{1b}]52;c;AA==\u{7}\n");
        assert!(matches!(sanitize(&escaped), Cow::Borrowed(_)));
    }

    #[test]
    fn escaped_text_is_always_a_clean_line() {
        let nasty: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        assert!(is_clean_line(&escape(&nasty)));
        assert!(!is_clean_line(&nasty));
    }
}
