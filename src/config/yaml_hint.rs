//! What usually causes the YAML parser's terse messages, and the line where the mistake most
//! likely is. The parser reports where it noticed a problem, which is often the line after
//! the mistake (a value given on one line, a nested key on the next).

use super::error::Pos;

/// A hint for `message` at `pos` in `text`, and the position to report (moved to the line
/// with the likely mistake).
pub fn hint(text: &str, pos: Pos, message: &str) -> (Pos, Option<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let at = pos.line as usize; // 1-based; 0 = unknown
    if let Some((line, column)) = first_tab_indent(&lines, message, at) {
        return (
            Pos { line, column },
            Some(format!(
                "line {line} is indented with a tab: YAML indentation must be spaces"
            )),
        );
    }
    let Some(this) = at.checked_sub(1).and_then(|i| lines.get(i)) else {
        return (pos, None);
    };
    let above = previous_content_line(&lines, at);
    if message.contains("did not find expected key") {
        let hint = match above {
            Some((n, line)) => format!(
                "line {at} starts in column {}, line {n} above it in column {}: keys of one mapping start in the same column (check the indentation)",
                indent(this) + 1,
                indent(line) + 1
            ),
            None => "keys of one mapping start in the same column (check the indentation)".into(),
        };
        return (pos, Some(hint));
    }
    if message.contains("mapping values are not allowed") {
        // Columns count characters, not bytes.
        let before: String = this
            .chars()
            .take((pos.column as usize).saturating_sub(1))
            .collect();
        if before.contains(": ") {
            return (
                pos,
                Some("a value containing `: ` must be quoted (desc: \"a: b\")".into()),
            );
        }
        if let Some((n, line)) = above.filter(|(_, l)| has_inline_value(l)) {
            return (
                Pos {
                    line: n as u64,
                    column: indent(line) as u64 + 1,
                },
                Some(format!(
                    "line {n} already has a value, so line {at}, indented deeper, cannot be nested under it: one of the two lines has the wrong indentation"
                )),
            );
        }
        return (
            pos,
            Some("usually a wrong indentation or a missing space after `:`".into()),
        );
    }
    if message.contains("did not find expected '-' indicator") {
        let trimmed = this.trim_start();
        let hint = if trimmed.starts_with('-') && !trimmed[1..].starts_with([' ', '\t']) {
            "a list item needs a space after `-` (`- name: b`)".to_owned()
        } else {
            format!(
                "line {at} is indented differently from the list's items above it: every `- ` of one list, and every key of an item, starts in the same column"
            )
        };
        return (pos, Some(hint));
    }
    if message.contains("expected ':'") {
        if let Some((key, value)) = missing_space_after_colon(this) {
            return (
                pos,
                Some(format!("a space is needed after `:` (`{key}: {value}`)")),
            );
        }
    }
    (pos, None)
}

/// The message serde gives for a value of the wrong shape, said the way the admin wrote it.
pub fn shape_hint(message: &str) -> Option<&'static str> {
    if message.contains("expected sequence start")
        || (message.contains("invalid type: string") && message.contains("sequence"))
    {
        Some("this field takes a list: write it as [a, b] (or one `- item` per line)")
    } else if message.contains("invalid type: sequence") || message.contains("invalid type: map") {
        Some("this field takes one value, not a list or a mapping")
    } else if message.starts_with("invalid i64") || message.starts_with("invalid u64") {
        Some("this field takes a whole number")
    } else {
        None
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// The nearest line before `at` (1-based) that is neither blank nor a comment.
fn previous_content_line<'a>(lines: &[&'a str], at: usize) -> Option<(usize, &'a str)> {
    (1..at)
        .rev()
        .map(|n| (n, lines[n - 1]))
        .find(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
}

/// `key: value` (not `key:` opening a nested block).
fn has_inline_value(line: &str) -> bool {
    let content = line.trim().trim_start_matches("- ");
    content
        .split_once(": ")
        .is_some_and(|(_, v)| !v.trim().is_empty() && !v.trim().starts_with('#'))
}

/// `interval:30` -> (`interval`, `30`).
fn missing_space_after_colon(line: &str) -> Option<(&str, &str)> {
    let content = line.trim().trim_start_matches("- ");
    let (key, rest) = content.split_once(':')?;
    let simple = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (simple && !rest.is_empty() && !rest.starts_with([' ', '\t'])).then_some((key, rest.trim()))
}

/// The first tab in a line's indentation, up to the line after the error (the parser often
/// stops on the line before), or anywhere when the parser itself speaks of a tab.
fn first_tab_indent(lines: &[&str], message: &str, at: usize) -> Option<(u64, u64)> {
    let upto = if message.contains("tab") || at == 0 {
        lines.len()
    } else {
        (at + 1).min(lines.len())
    };
    lines[..upto].iter().enumerate().find_map(|(i, l)| {
        let lead = &l[..l.len() - l.trim_start().len()];
        lead.find('\t').map(|c| (i as u64 + 1, c as u64 + 1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_space_after_colon_is_found() {
        assert_eq!(
            missing_space_after_colon("    interval:30"),
            Some(("interval", "30"))
        );
        assert_eq!(missing_space_after_colon("    interval: 30"), None);
        assert_eq!(missing_space_after_colon("  - name:a"), Some(("name", "a")));
    }

    #[test]
    fn columns_past_multibyte_text_do_not_panic() {
        let text = "resources:\n  - name: a\n    desc: ünïcödé: x\n";
        let at = Pos {
            line: 3,
            column: 17,
        };
        let (_, found) = hint(text, at, "mapping values are not allowed in this context");
        assert!(found.is_some_and(|h| h.contains("must be quoted")));
        let at = Pos { line: 1, column: 2 };
        let (_, found) = hint("é:é\n", at, "could not find expected ':'");
        assert!(found.is_none());
    }

    #[test]
    fn an_inline_value_is_told_from_a_nested_block() {
        assert!(has_inline_value("    kind: exec"));
        assert!(!has_inline_value("    probe:"));
        assert!(!has_inline_value("    probe:   # comment"));
    }
}
