//! The probe fields about output: `command:` (a list, or one string split by shell-word
//! rules), `format:`, `select:` and `aggregate:`. Kept apart from `resources.rs` so a new
//! format's fields do not touch the rest of the probe validation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::error::{Errors, Pos};
use super::scalar::Scalar;
use crate::output::{parse_selector, Aggregate, Format, Pick, Selection};

/// `command:` as written: `[program, arg, ...]` or `"program arg ..."`.
#[derive(Debug, Clone, PartialEq)]
pub enum RawCommand {
    List(Vec<String>),
    Line(String),
}

impl<'de> Deserialize<'de> for RawCommand {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawCommand;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command: a list such as [script, arg] or a string \"script arg\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawCommand, E> {
                Ok(RawCommand::Line(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawCommand, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(RawCommand::List(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// One `select:` entry: a selector, or `{match: SELECTOR, aggregate: sum, default: 0}`.
#[derive(Debug, Default)]
pub struct RawPick {
    pub selector: Option<String>,
    /// Where `match:` is; `None` for the short form (the entry's own position).
    pub selector_at: Option<Pos>,
    pub aggregate: Option<Spanned<String>>,
    pub default: Option<Spanned<Scalar>>,
    pub unknown: Vec<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawPick {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawPick;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a selector, or a mapping with match, aggregate, default")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawPick, E> {
                Ok(RawPick {
                    selector: Some(v.to_owned()),
                    ..RawPick::default()
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawPick, A::Error> {
                let mut p = RawPick::default();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    match key.value.as_str() {
                        "match" => {
                            let s: Spanned<String> = map.next_value()?;
                            p.selector_at = Some(Pos::of(&s));
                            p.selector = Some(s.value);
                        }
                        "aggregate" => p.aggregate = Some(map.next_value()?),
                        "default" => p.default = Some(map.next_value()?),
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                            p.unknown.push(key);
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_any(V)
    }
}

pub type RawSelect = BTreeMap<String, Spanned<RawPick>>;

/// What a shell would do with these, which a probe's command never gets.
const SHELL_ONLY: &[(&str, &str)] = &[
    ("|", "a pipe"),
    (";", "a command separator"),
    ("&", "`&`/`&&`"),
    (">", "a redirection"),
    ("<", "a redirection"),
    ("$(", "command substitution"),
    ("`", "command substitution"),
];

/// Split `line` as a POSIX shell splits words, without a shell: quotes and backslashes are
/// honoured; nothing is expanded or globbed; operators are refused.
pub fn split_command(line: &str) -> Result<Vec<String>, String> {
    let refuse = |what: &str| {
        Err(format!(
            "`command` contains {what}, which needs a shell: `command` runs without one. Write the line as `shell:` instead of `command:` (run by /bin/sh -c), or write a wrapper script and name it in `command`"
        ))
    };
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("`command` has an unterminated ' quote".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(n @ ('"' | '\\' | '$' | '`')) => w.push(n),
                            Some('\n') => {}
                            Some(n) => {
                                w.push('\\');
                                w.push(n);
                            }
                            None => return Err("`command` has an unterminated \" quote".into()),
                        },
                        Some('$') if matches!(chars.peek(), Some('(')) => {
                            return refuse("command substitution");
                        }
                        Some('$')
                            if chars.peek().is_some_and(|n| {
                                n.is_ascii_alphabetic() || *n == '{' || *n == '_'
                            }) =>
                        {
                            return Err(no_variables());
                        }
                        Some('`') => return refuse("command substitution"),
                        Some(c) => w.push(c),
                        None => return Err("`command` has an unterminated \" quote".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(n) => word.get_or_insert_with(String::new).push(n),
                None => return Err("`command` ends with a lone backslash".into()),
            },
            '$' if chars
                .peek()
                .is_some_and(|n| n.is_ascii_alphabetic() || *n == '{' || *n == '_') =>
            {
                return Err(no_variables());
            }
            c => {
                let mut two = String::from(c);
                if let Some(n) = chars.peek() {
                    two.push(*n);
                }
                if let Some((_, what)) = SHELL_ONLY.iter().find(|(op, _)| two.starts_with(op)) {
                    return refuse(what);
                }
                word.get_or_insert_with(String::new).push(c);
            }
        }
    }
    if let Some(w) = word {
        words.push(w);
    }
    Ok(words)
}

fn no_variables() -> String {
    "`command` names a shell variable: nothing is expanded (no shell). Set what the script needs in `env:`, write the line as `shell:` (run by /bin/sh -c), or write a wrapper script".into()
}

/// The argv, from either form of `command:`.
pub fn command(errs: &mut Errors, raw: &Spanned<RawCommand>) -> Option<Vec<String>> {
    match &raw.value {
        RawCommand::List(list) => Some(list.clone()),
        RawCommand::Line(line) => match split_command(line) {
            Ok(words) => Some(words),
            Err(e) => {
                errs.at(Pos::of(raw), e);
                None
            }
        },
    }
}

pub fn format(errs: &mut Errors, raw: Option<&Spanned<String>>) -> Format {
    let Some(f) = raw else {
        return Format::Value;
    };
    Format::from_name(&f.value).unwrap_or_else(|| {
        errs.at(
            Pos::of(f),
            format!(
                "unknown format {:?}; expected one of {}",
                f.value,
                Format::names().join(", ")
            ),
        );
        Format::Value
    })
}

fn aggregate(errs: &mut Errors, raw: Option<&Spanned<String>>) -> Option<Aggregate> {
    let raw = raw?;
    let a = Aggregate::from_name(&raw.value);
    if a.is_none() {
        errs.at(
            Pos::of(raw),
            format!(
                "unknown aggregate {:?}; expected one of {}",
                raw.value,
                Aggregate::NAMES.join(", ")
            ),
        );
    }
    a
}

/// `select:` and `aggregate:` for a probe in `format` feeding `provides`.
pub fn selection(
    errs: &mut Errors,
    format: Format,
    select: Option<&Spanned<RawSelect>>,
    aggregate_field: Option<&Spanned<String>>,
    provides: &[String],
) -> Selection {
    let mut out = Selection {
        picks: BTreeMap::new(),
        aggregate: aggregate(errs, aggregate_field),
    };
    let given = select.map(Pos::of).or(aggregate_field.map(Pos::of));
    if let Some(at) = given {
        if !format.selectable() {
            let takes: Vec<&str> = crate::output::Format::ALL
                .iter()
                .filter(|f| f.selectable())
                .map(|f| f.as_str())
                .collect();
            errs.at(
                at,
                format!(
                    "`select` and `aggregate` apply to the formats {}; this probe's format is {}",
                    takes.join(", "),
                    format.as_str()
                ),
            );
            return out;
        }
    }
    let Some(select) = select else {
        return out;
    };
    let fed: BTreeSet<&str> = provides.iter().map(String::as_str).collect();
    for (resource, raw) in &select.value {
        let at = Pos::of(raw);
        if !fed.contains(resource.as_str()) {
            errs.at(
                at,
                format!(
                    "`select` names {resource:?}, which this probe does not feed (it feeds {})",
                    provides.join(", ")
                ),
            );
            continue;
        }
        for key in &raw.value.unknown {
            errs.at(
                Pos::of(key),
                format!(
                    "`{}` is not a field of a select entry; expected match, aggregate, default",
                    key.value
                ),
            );
        }
        let selector = raw.value.selector.as_ref().and_then(|s| {
            parse_selector(s)
                .map_err(|e| errs.at(raw.value.selector_at.unwrap_or(at), e))
                .ok()
        });
        out.picks.insert(
            resource.clone(),
            Pick {
                selector,
                aggregate: aggregate(errs, raw.value.aggregate.as_ref()),
                default: raw.value.default.as_ref().map(|d| match &d.value {
                    Scalar::Text(t) => t.clone(),
                    other => other.to_string(),
                }),
                // The plan says, per host (`Selection::pick_for`).
                shared: false,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_split_like_a_shell() {
        assert_eq!(
            split_command("/usr/lib/nagios/plugins/check_disk -w 10% -p /").unwrap(),
            ["/usr/lib/nagios/plugins/check_disk", "-w", "10%", "-p", "/"]
        );
        assert_eq!(
            split_command(r#"check 'two words' "say \"hi\"" a\ b '' *.prom"#).unwrap(),
            ["check", "two words", "say \"hi\"", "a b", "", "*.prom"]
        );
    }

    #[test]
    fn shell_syntax_is_refused_with_advice() {
        for bad in [
            "a | b",
            "a; b",
            "a && b",
            "a > out",
            "a $(date)",
            "a \"$(date)\"",
            "a `date`",
            "a $HOME",
        ] {
            let e = split_command(bad).unwrap_err();
            assert!(e.contains("wrapper script"), "{bad}: {e}");
            assert!(e.contains("`shell:`"), "{bad}: {e}");
        }
        assert!(split_command("a 'open").is_err());
        assert_eq!(split_command("a '|' \"a;b\"").unwrap(), ["a", "|", "a;b"]);
    }
}
