//! Reading a config file's YAML: under the agent's budget (a breach names the limit and what
//! to do), and every parser error turned into one positioned line the admin can act on.

use std::path::Path;

use super::error::{ConfigError, Pos};
use super::names::near_miss;
use super::yaml_hint::{hint, shape_hint};

/// Room for about 100,000 resources of a few dozen fields each (BENCHMARKS.md measures
/// `check` at 100,000). Honest files scale with these; an alias bomb is stopped by the
/// alias limits below, which honest files (no or few aliases) never approach.
pub const MAX_YAML_NODES: usize = 8_000_000;
/// A config file's size cap: a wrong path pointing at a log must not eat memory.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// Events that aliases may replay in one file, in all: the alias-bomb guard.
pub const MAX_ALIAS_REPLAY: usize = 1_000_000;

fn yaml_options(max_nodes: usize) -> serde_saphyr::Options {
    let mut alias_limits = serde_saphyr::options::AliasLimits::default();
    alias_limits.max_total_replayed_events = MAX_ALIAS_REPLAY;
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: max_nodes,
            max_events: max_nodes.saturating_mul(2),
            max_recorded_anchor_events: MAX_ALIAS_REPLAY,
        },
        alias_limits: alias_limits,
    }
}

/// Parse a config file's YAML under the agent's budget. A breach names the limit and what
/// to do; any other error is the parser's, positioned.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, ConfigError> {
    parse_yaml_limited(path, text, MAX_YAML_NODES)
}

fn parse_yaml_limited<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    max_nodes: usize,
) -> Result<T, ConfigError> {
    serde_saphyr::from_str_with_options(text, yaml_options(max_nodes)).map_err(|e| {
        let whole = |message: String| ConfigError::new(path, Pos::default(), message);
        if let serde_saphyr::Error::Budget { breach, .. } = innermost(&e) {
            return whole(budget_message(breach, max_nodes));
        }
        let raw = e.to_string();
        if raw.contains("alias") && raw.contains("replay") {
            return whole(alias_message());
        }
        from_yaml(path, text, &e)
    })
}

/// The error under the parser's wrappers (alias locations, snippets).
fn innermost(mut e: &serde_saphyr::Error) -> &serde_saphyr::Error {
    use serde_saphyr::Error as E;
    while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = e {
        e = error;
    }
    e
}

fn alias_message() -> String {
    format!(
        "the file's aliases (*name) expand to more than {MAX_ALIAS_REPLAY} YAML events, the agent's limit against alias bombs; write the repeated parts out instead of aliasing them"
    )
}

fn budget_message(breach: &serde_saphyr::budget::BudgetBreach, max_nodes: usize) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    match breach {
        B::Nodes { .. } | B::Events { .. } => format!(
            "the file has more than {max_nodes} YAML nodes, the agent's limit (room for about 100,000 resources); remove resources and sections this site does not use, or split the controller's other sections into their own file"
        ),
        B::Aliases { .. }
        | B::Anchors { .. }
        | B::AliasAnchorRatio { .. }
        | B::RecordedAnchorEvents { .. }
        | B::RecordedAnchorBytes { .. } => alias_message(),
        B::Depth { depth } => format!(
            "the file nests {depth} levels deep, past the YAML parser's limit; a resources file needs fewer than 10 (look for a runaway indentation or [[[...]]])"
        ),
        other => format!(
            "the file exceeds a YAML parser limit ({other:?}); it is not a config file the agent can load"
        ),
    }
}

/// Turn a YAML/serde error into a positioned config error with a one-line message and, for
/// the parser's terse messages, what usually causes them, pointing at the likely line.
pub fn from_yaml(file: &Path, text: &str, err: &serde_saphyr::Error) -> ConfigError {
    let pos = err
        .location()
        .map(|l| Pos::from_location(&l))
        .unwrap_or_default();
    if let Some(message) = unknown_field(err) {
        return ConfigError::new(file, pos, message);
    }
    let text_of_error = err.without_snippet().to_string();
    // The library's own text may repeat the position; keep the first line, which is the reason.
    let first = text_of_error
        .lines()
        .next()
        .unwrap_or("invalid YAML")
        .trim();
    let mut message = match first.rfind(" at line ") {
        Some(i) => first[..i].to_owned(),
        None => first.to_owned(),
    };
    if message.contains("flow sequence") {
        message.push_str(
            " (a host range such as node[1-3] inside [ ] must be quoted: [\"node[1-3]\"])",
        );
    }
    if let Some(hint) = shape_hint(&message) {
        message.push_str("; ");
        message.push_str(hint);
    }
    let (pos, hint) = hint(text, pos, &message);
    if let Some(hint) = hint {
        message.push_str("; ");
        message.push_str(&hint);
    }
    ConfigError::new(file, pos, message)
}

/// serde's "unknown field `x`, expected one of ..." as one near-miss rule for every mapping of
/// both files: the known names come from the struct serde derived them for.
fn unknown_field(err: &serde_saphyr::Error) -> Option<String> {
    let mut err = err;
    loop {
        match err {
            serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } => err = error,
            serde_saphyr::Error::SerdeUnknownField {
                field, expected, ..
            } => {
                return Some(match near_miss(field, expected) {
                    Some(known) => format!("unknown field `{field}`; did you mean `{known}`?"),
                    None => format!(
                        "unknown field `{field}`; the fields here are: {}",
                        expected.join(", ")
                    ),
                });
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_node_limit_the_message_names_it_and_what_to_do() {
        let text = format!("x: [{}]\n", vec!["1"; 2000].join(","));
        let e = parse_yaml_limited::<serde::de::IgnoredAny>(Path::new("r.yaml"), &text, 1000)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "r.yaml: the file has more than 1000 YAML nodes, the agent's limit (room for about 100,000 resources); remove resources and sections this site does not use, or split the controller's other sections into their own file");
    }
}
