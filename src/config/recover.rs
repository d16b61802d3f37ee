//! Every error in one pass, including the ones serde stops at. A value of the wrong shape (a
//! string where a list belongs, a list where a number belongs) or a YAML syntax error ends a
//! serde parse at once, so the admin would see one error, fix it, and only then meet the
//! next. Here such an error is kept, the item that holds it — one top-level key of agent.yaml,
//! one entry of resources.yaml's list — is blanked (its lines emptied, so every later line
//! keeps its number) and the file is parsed again, until it parses or
//! [`MAX_RECOVERED_ERRORS`] are found. What then parses is validated as usual, so its errors
//! join these.

use std::borrow::Cow;

use super::error::{ConfigError, ConfigErrors};

/// Errors one file may report before the agent stops looking (each costs a parse).
pub const MAX_RECOVERED_ERRORS: usize = 20;

/// What one item of a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Items {
    /// agent.yaml: a key at the start of a line and what is indented under it.
    TopLevelKeys,
    /// resources.yaml: one `- ` entry of the `resources:` list (other top-level sections as
    /// in agent.yaml).
    ResourceEntries,
}

/// Parse `text` with `parse`; errors that blanking their item gets past are returned beside
/// the value. Fails with every error found when the file never parses.
pub fn parse_all<T>(
    text: &str,
    items: Items,
    parse: impl Fn(&str) -> Result<T, ConfigError>,
) -> Result<(T, Vec<ConfigError>), ConfigErrors> {
    let mut text = Cow::Borrowed(text);
    let mut found: Vec<ConfigError> = Vec::new();
    loop {
        let e = match parse(&text) {
            Ok(value) => return Ok((value, found)),
            Err(e) => e,
        };
        // The same error again: the blanked item did not hold it.
        if found.last().is_some_and(|last| last.pos == e.pos) {
            return Err(ConfigErrors(found));
        }
        let blanked = (found.len() + 1 < MAX_RECOVERED_ERRORS)
            .then(|| blank_item(&text, e.pos.line, items))
            .flatten();
        found.push(e);
        match blanked {
            Some(t) => text = Cow::Owned(t),
            None => return Err(ConfigErrors(found)),
        }
    }
}

/// `text` with the item holding 1-based `line` emptied; `None` when there is none (a
/// whole-file error, or a line outside every item) or it is already empty.
pub fn blank_item(text: &str, line: u64, items: Items) -> Option<String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let at = usize::try_from(line).ok()?.checked_sub(1)?;
    if at >= lines.len() {
        return None;
    }
    let starts = item_starts(&lines, items);
    let start = *starts.iter().rev().find(|&&s| s <= at)?;
    let end = starts
        .iter()
        .find(|&&s| s > start)
        .copied()
        .unwrap_or(lines.len());
    if lines[start..end].iter().all(|l| l.trim().is_empty()) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if !(start..end).contains(&i) {
            out.push_str(l);
        }
    }
    Some(out)
}

/// The lines (0-based) where items start, in order.
fn item_starts(lines: &[&str], items: Items) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut in_resources = false;
    // The column of the `resources:` list's dashes, from its first entry.
    let mut entry_indent: Option<usize> = None;
    for (i, l) in lines.iter().enumerate() {
        if is_top_level_key(l) {
            starts.push(i);
            in_resources = items == Items::ResourceEntries && l.starts_with("resources:");
            entry_indent = None;
            continue;
        }
        if !in_resources {
            continue;
        }
        let body = l.trim_start();
        let is_dash = body == "-" || body.starts_with("- ");
        if !is_dash {
            continue;
        }
        let indent = l.len() - body.len();
        match entry_indent {
            None => {
                entry_indent = Some(indent);
                starts.push(i);
            }
            Some(d) if d == indent => starts.push(i),
            _ => {}
        }
    }
    starts
}

/// A line that opens a top-level item: a key in the first column (not a comment, a list
/// item or a document marker).
fn is_top_level_key(l: &str) -> bool {
    l.chars()
        .next()
        .is_some_and(|c| !matches!(c, ' ' | '\t' | '#' | '-' | '.' | '\r'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const RESOURCES: &str = "resources:\n  - name: a\n    interval: [1]\n  - name: b\n    resourcemap:\n      - location: x\n  - name: c\nother:\n  k: v\n";

    #[test]
    fn an_entry_of_the_resources_list_is_blanked_and_lines_keep_their_numbers() {
        let out = blank_item(RESOURCES, 3, Items::ResourceEntries).unwrap();
        assert_eq!(
            out,
            "resources:\n\n\n  - name: b\n    resourcemap:\n      - location: x\n  - name: c\nother:\n  k: v\n"
        );
        // A nested list's dash is not an entry: the whole entry b goes.
        let out = blank_item(RESOURCES, 6, Items::ResourceEntries).unwrap();
        assert!(
            out.contains("  - name: a\n") && !out.contains("name: b"),
            "{out}"
        );
        assert_eq!(out.lines().count(), RESOURCES.lines().count());
        // Another section is one item.
        let out = blank_item(RESOURCES, 9, Items::ResourceEntries).unwrap();
        assert!(out.ends_with("  - name: c\n\n\n"), "{out:?}");
    }

    #[test]
    fn agent_yaml_items_are_its_top_level_keys() {
        let text = "host: n1\ntls:\n  ca: [x]\n  cert: y\nrun_as: nobody\n";
        let out = blank_item(text, 3, Items::TopLevelKeys).unwrap();
        assert_eq!(out, "host: n1\n\n\n\nrun_as: nobody\n");
        assert_eq!(blank_item(text, 0, Items::TopLevelKeys), None);
        assert_eq!(blank_item("\n\n", 1, Items::TopLevelKeys), None);
    }

    #[test]
    fn errors_are_collected_until_the_file_parses() {
        // A stand-in parser: an error at the first line holding "bad".
        let parse = |t: &str| match t.lines().position(|l| l.contains("bad")) {
            Some(i) => Err(ConfigError::new(
                Path::new("r.yaml"),
                crate::config::error::Pos {
                    line: i as u64 + 1,
                    column: 1,
                },
                "bad",
            )),
            None => Ok(t.lines().filter(|l| l.contains("name")).count()),
        };
        let text = "resources:\n  - name: a\n    x: bad\n  - name: b\n  - name: c\n    y: bad\n";
        let (names, errors) = parse_all(text, Items::ResourceEntries, parse).unwrap();
        assert_eq!(names, 1);
        let lines: Vec<u64> = errors.iter().map(|e| e.pos.line).collect();
        assert_eq!(lines, [3, 6]);
        // A top-level key holding the error is blanked like an entry.
        let (_, errors) = parse_all("bad: 1\nname: x\n", Items::TopLevelKeys, parse).unwrap();
        assert_eq!(errors.len(), 1);
        let many = "resources:\n".to_owned() + &"  - x: bad\n".repeat(50);
        let e = parse_all(&many, Items::ResourceEntries, parse).unwrap_err();
        assert_eq!(e.0.len(), MAX_RECOVERED_ERRORS);
    }
}
