//! Text that came from outside (a peer's host name, a resource name, a probe's value) shown in
//! a line-oriented output: listen's text format, log lines. Escaping the characters that could
//! end a line, move the cursor or reorder what a terminal shows means one input is always one
//! output line and reads as data, never as markup.

use std::borrow::Cow;
use std::fmt::Write as _;

/// True for the characters `escape` rewrites: control characters (C0, DEL, C1), the Unicode
/// line and paragraph separators, bidirectional overrides, and the backslash that starts
/// every escape (so an escaped text reads back unambiguously).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character of `needs_escape` written as a Rust-style escape (`\n`, `\t`,
/// `\\`, `\u{1b}`); borrowed unchanged in the common case of clean text.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
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
    }

    #[test]
    fn escaped_text_is_always_a_clean_line() {
        let nasty: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        assert!(is_clean_line(&escape(&nasty)));
        assert!(!is_clean_line(&nasty));
    }
}
