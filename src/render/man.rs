//! The section-5 man pages of the two files, `xce-agent.yaml(5)` and
//! `xce-resources.yaml(5)`, written from the field tables the parser is held to (each
//! table's unit test compares it with the struct serde reads), so a field the parser knows
//! is on the page.

use std::fmt::Write as _;

use crate::config::names::Field;
use crate::config::probe_spec::{self, FIELDS, FIELD_DOCS, LIMIT_FIELD_DOCS};
use crate::config::scalar::DURATION_GRAMMAR;
use crate::config::{agent, INSTANCE_FIELD_DOCS, RESOURCE_FIELD_DOCS};

/// Text for roff: backslashes and hyphens escaped, no line starting with a control character.
fn roff(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with(['.', '\'']) {
        format!("\\&{t}")
    } else {
        t
    }
}

fn header(out: &mut String, name: &str, what: &str) {
    let version = env!("CARGO_PKG_VERSION");
    let _ = writeln!(
        out,
        ".TH {} 5 \"\" \"xce-agent {version}\" \"File Formats\"",
        roff(name)
    );
    let _ = writeln!(out, ".SH NAME\n{} \\- {}", roff(name), roff(what));
}

fn section(out: &mut String, title: &str, intro: &str) {
    let _ = writeln!(out, ".SH {}", roff(title));
    if !intro.is_empty() {
        let _ = writeln!(out, "{}", roff(intro));
    }
}

/// One field: `.TP`, the name in bold (under `prefix`, e.g. `tls.`), then its line, its
/// bound as its row in the field table declares it, and what else is said of it.
fn field(out: &mut String, prefix: &str, f: &Field, extra: &str) {
    let range = f
        .bound
        .map(|b| format!(" Range: {}.", b.describe()))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        ".TP\n.B {}\n{}{}{}",
        roff(&format!("{prefix}{}", f.name)),
        roff(f.doc),
        roff(&range),
        roff(extra)
    );
}

fn durations(out: &mut String) {
    section(
        out,
        "DURATIONS",
        &format!(
            "Every duration is {DURATION_GRAMMAR}: no spaces, words, fractions, exponents or \
             compounds (write 330s, not 5m30s)."
        ),
    );
}

/// `xce-agent.yaml(5)`: agent.yaml.
pub fn agent_yaml() -> String {
    let mut out = String::new();
    header(
        &mut out,
        "xce-agent.yaml",
        "how xce-agent runs on this host",
    );
    section(
        &mut out,
        "DESCRIPTION",
        "/etc/xce/agent.yaml is the agent's own file: every field is optional, and a field it \
         does not know is an error. `xce-agent check` validates it with resources.yaml.",
    );
    section(&mut out, "FIELDS", "");
    for f in agent::FIELD_DOCS {
        field(&mut out, "", f, "");
    }
    section(
        &mut out,
        "TLS FIELDS",
        "Under tls:. ca, cert and key are required.",
    );
    for f in agent::TLS_FIELD_DOCS {
        field(&mut out, "tls.", f, "");
    }
    durations(&mut out);
    section(&mut out, "SEE ALSO", "xce-agent(1), xce-resources.yaml(5)");
    out
}

/// `xce-resources.yaml(5)`: resources.yaml.
pub fn resources_yaml() -> String {
    let mut out = String::new();
    header(
        &mut out,
        "xce-resources.yaml",
        "the dynamic resources xce-agent probes",
    );
    section(
        &mut out,
        "DESCRIPTION",
        "/etc/xce/resources.yaml is the controller's list of resources, under resources:; the \
         agent reads the fields below and adds probe:. Other fields are the controller's and \
         are tolerated, unless one looks like a misspelling of a field below.",
    );
    section(&mut out, "RESOURCE FIELDS", "");
    for f in RESOURCE_FIELD_DOCS {
        field(&mut out, "", f, "");
    }
    section(
        &mut out,
        "RESOURCEMAP FIELDS",
        "Each entry of resourcemap:.",
    );
    for f in INSTANCE_FIELD_DOCS {
        field(&mut out, "", f, "");
    }
    section(
        &mut out,
        "PROBE FIELDS",
        &format!(
            "Under probe:. The kinds are {}; a field given to a kind that does not take it is \
             an error.",
            probe_spec::kind_names().join(", ")
        ),
    );
    for ((_, takes), f) in FIELDS.iter().zip(FIELD_DOCS) {
        let kinds = match takes {
            probe_spec::Takes::Every => "every kind".to_owned(),
            probe_spec::Takes::Only(kinds) => kinds.join(", "),
        };
        field(&mut out, "", f, &format!(" Kinds: {kinds}."));
    }
    section(
        &mut out,
        "LIMITS FIELDS",
        "Under probe: limits: (exec and stream probes).",
    );
    for f in LIMIT_FIELD_DOCS {
        field(&mut out, "limits.", f, "");
    }
    durations(&mut out);
    section(&mut out, "SEE ALSO", "xce-agent(1), xce-agent.yaml(5)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_escapes_what_it_must() {
        assert_eq!(roff("a-b \\n"), "a\\-b \\en");
        assert_eq!(roff(".TH x"), "\\&.TH x");
        assert_eq!(roff("'x"), "\\&'x");
    }

    #[test]
    fn every_probe_field_has_its_line_and_its_kinds() {
        let page = resources_yaml();
        assert_eq!(FIELDS.len(), FIELD_DOCS.len());
        assert!(
            page.contains(".TP\n.B index\nThe built\\-in index"),
            "{page}"
        );
        assert!(page.contains("Kinds: builtin."), "{page}");
    }
}
