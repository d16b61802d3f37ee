//! Property tests of the config loaders: random and mutated YAML never panics, and every
//! error names the file and a position inside it (or line 0: the whole file); generated
//! valid files always load. Bounded (256 cases each) so they run within `cargo test`.

use std::path::Path;

use proptest::prelude::*;
use xce_agent::config::{agent, resources, ConfigErrors};

const EXAMPLE_RESOURCES: &str = include_str!("../../configs/resources.yaml");
const EXAMPLE_AGENT: &str = include_str!("../../configs/agent.yaml");

/// Every error is in `file`, with a message, at line 0 (whole file) or a line the text has.
fn check_errors(file: &Path, text: &str, errs: &ConfigErrors) {
    assert!(!errs.0.is_empty(), "an Err with no error in it");
    let lines = text.lines().count() as u64 + 1;
    for e in &errs.0 {
        assert_eq!(e.file, file, "{e}");
        assert!(!e.message.trim().is_empty(), "empty message: {e:?}");
        if e.pos.line != 0 {
            assert!(e.pos.line <= lines, "line past the end ({lines}): {e}");
            assert!(e.pos.column >= 1, "line without a column: {e}");
        }
    }
}

fn load_both(text: &str) {
    let rpath = Path::new("/etc/xce/resources.yaml");
    if let Err(errs) = resources::parse(rpath, text) {
        check_errors(rpath, text, &errs);
    }
    let apath = Path::new("/etc/xce/agent.yaml");
    if let Err(errs) = agent::parse(apath, text) {
        check_errors(apath, text, &errs);
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, text: String },
    DuplicateLine { line: usize },
    SwapLines { a: usize, b: usize },
    ReplaceByte { at: usize, byte: char },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (
            any::<usize>(),
            prop_oneof![
                Just(":".to_owned()),
                Just("- ".to_owned()),
                Just("\n  ".to_owned()),
                Just("{".to_owned()),
                Just("[".to_owned()),
                Just("&a ".to_owned()),
                Just("*a".to_owned()),
                Just("!!binary ".to_owned()),
                Just("\t".to_owned()),
                Just("interval: -1\n".to_owned()),
                Just("probe: {kind: exec}\n".to_owned()),
                "\\PC{0,12}",
            ]
        )
            .prop_map(|(at, text)| Mutation::Insert { at, text }),
        any::<usize>().prop_map(|line| Mutation::DuplicateLine { line }),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
        (any::<usize>(), any::<char>()).prop_map(|(at, byte)| Mutation::ReplaceByte { at, byte }),
    ]
}

fn char_boundary(s: &str, at: usize) -> usize {
    let mut i = at % (s.len() + 1);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, m: &Mutation) -> String {
    let mut s = text.to_owned();
    match m {
        Mutation::Delete { at, len } => {
            let a = char_boundary(&s, *at);
            let b = char_boundary(&s, (a + len).min(s.len()));
            s.replace_range(a..b.max(a), "");
        }
        Mutation::Insert { at, text } => {
            let a = char_boundary(&s, *at);
            s.insert_str(a, text);
        }
        Mutation::DuplicateLine { line } => {
            let mut lines: Vec<&str> = s.lines().collect();
            if !lines.is_empty() {
                let i = line % lines.len();
                lines.insert(i, lines[i]);
            }
            s = lines.join("\n");
        }
        Mutation::SwapLines { a, b } => {
            let mut lines: Vec<&str> = s.lines().collect();
            if !lines.is_empty() {
                let n = lines.len();
                lines.swap(a % n, b % n);
            }
            s = lines.join("\n");
        }
        Mutation::ReplaceByte { at, byte } => {
            let a = char_boundary(&s, *at);
            if let Some(c) = s[a..].chars().next() {
                s.replace_range(a..a + c.len_utf8(), &byte.to_string());
            }
        }
    }
    s
}

/// A resource name by LSF's rules, prefixed so it never collides with a builtin index.
fn res_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,20}".prop_map(|s| format!("x_{s}"))
}

#[derive(Debug, Clone)]
struct GenResource {
    name: String,
    valtype: &'static str,
    interval: u32,
    kind: u8,
}

fn gen_resource() -> impl Strategy<Value = GenResource> {
    (
        res_name(),
        prop_oneof![Just("numeric"), Just("string"), Just("boolean")],
        1u32..=86_400, // valid intervals: up to max_interval's default, a day
        0u8..3,
    )
        .prop_map(|(name, valtype, interval, kind)| GenResource {
            name,
            valtype,
            interval,
            kind,
        })
}

fn render(rs: &[GenResource]) -> String {
    let mut out = String::from("resources:\n");
    for r in rs {
        out.push_str(&format!(
            "  - name: {}\n    valtype: {}\n    interval: {}\n    resourcemap:\n      - location: [default]\n",
            r.name, r.valtype, r.interval
        ));
        match r.kind {
            0 => out.push_str("    probe:\n      kind: exec\n      command: [probe.sh, -x]\n      format: value\n"),
            1 => out.push_str("    probe:\n      kind: file\n      path: /proc/loadavg\n      regex: '^(\\S+)'\n"),
            _ => {}
        }
    }
    out
}

proptest! {
    #![proptest_config(crate::support::proptest_config(256))]

    #[test]
    fn random_text_never_panics(text in "\\PC{0,200}") {
        load_both(&text);
    }

    #[test]
    fn yaml_shaped_noise_never_panics(
        text in "([a-z_]{1,8}: ?|- |  |\\[|\\]|\\{|\\}|,|'|\"|#|\n|[0-9]{1,3}|&x |\\*x|!!str ){0,60}"
    ) {
        load_both(&text);
    }

    #[test]
    fn mutated_example_resources_never_panic(ms in proptest::collection::vec(mutation(), 1..6)) {
        let text = ms.iter().fold(EXAMPLE_RESOURCES.to_owned(), |t, m| apply(&t, m));
        load_both(&text);
    }

    #[test]
    fn mutated_example_agent_never_panics(ms in proptest::collection::vec(mutation(), 1..4)) {
        let text = ms.iter().fold(EXAMPLE_AGENT.to_owned(), |t, m| apply(&t, m));
        load_both(&text);
    }

    #[test]
    fn generated_valid_resources_load(
        rs in proptest::collection::btree_map(res_name(), gen_resource(), 1..20)
    ) {
        let rs: Vec<GenResource> = rs
            .into_iter()
            .map(|(name, r)| GenResource { name, ..r })
            .collect();
        let text = render(&rs);
        let loaded = resources::parse(Path::new("resources.yaml"), &text);
        prop_assert!(loaded.is_ok(), "{}\n{}", text, loaded.err().map(|e| e.to_string()).unwrap_or_default());
        let loaded = loaded.unwrap_or_else(|_| unreachable!());
        prop_assert_eq!(loaded.resources.len(), rs.len());
        for r in &rs {
            let got = loaded.get(&r.name);
            prop_assert!(got.is_some(), "{} lost", r.name);
        }
    }
}

#[test]
fn the_examples_load() {
    resources::parse(Path::new("resources.yaml"), EXAMPLE_RESOURCES).expect("example resources");
    agent::parse(Path::new("/x/agent.yaml"), EXAMPLE_AGENT).expect("example agent");
}
