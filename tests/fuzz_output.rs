//! Property tests of the three probe output parsers (value, kv, elim): arbitrary bytes never
//! panic; generated kv and ELIM output parses back to exactly the pairs that were printed.

use proptest::prelude::*;
use xce_agent::config::Format;
use xce_agent::probe::output::{self, OutputError, Pair};

const FORMATS: [Format; 3] = [Format::Value, Format::Kv, Format::Elim];

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_.-]{0,15}"
}

/// A kv value: printable, no surrounding blanks, not wrapped in double quotes (those are
/// stripped, by design).
fn kv_value() -> impl Strategy<Value = String> {
    "[!-~]([ -~]{0,20}[!-~])?".prop_filter("quoted", |v| !(v.starts_with('"') && v.ends_with('"')))
}

fn unique(pairs: Vec<(String, String)>) -> Vec<Pair> {
    let mut seen = std::collections::BTreeSet::new();
    pairs
        .into_iter()
        .filter(|(k, _)| seen.insert(k.clone()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        for f in FORMATS {
            if let Ok(pairs) = output::parse(f, &bytes, "own") {
                // Whatever parses came from valid UTF-8 without NUL.
                prop_assert!(!bytes.contains(&0));
                prop_assert!(std::str::from_utf8(&bytes).is_ok());
                prop_assert!(!pairs.is_empty());
            }
        }
    }

    #[test]
    fn line_shaped_text_never_panics(text in "([0-9]{1,2}|[a-z]{1,4}|=| |\"|#|\n|\r|\t|\u{0}|é){0,80}") {
        for f in FORMATS {
            let r = output::parse(f, text.as_bytes(), "own");
            if text.contains('\0') {
                prop_assert_eq!(r, Err(OutputError::Nul));
            }
        }
    }

    #[test]
    fn kv_round_trips(
        pairs in proptest::collection::vec((name(), kv_value()), 1..20),
        pad in proptest::collection::vec(("[ \t]{0,2}", "[ \t]{0,2}"), 20),
        comments in any::<bool>(),
    ) {
        let pairs = unique(pairs);
        let mut text = String::new();
        for (i, (k, v)) in pairs.iter().enumerate() {
            if comments {
                text.push_str("# a comment = not a value\n\n");
            }
            let (a, b) = &pad[i % pad.len()];
            text.push_str(&format!("{a}{k}{b}={a}{v}{b}\n"));
        }
        prop_assert_eq!(output::parse(Format::Kv, text.as_bytes(), "own"), Ok(pairs));
    }

    #[test]
    fn kv_quoted_values_lose_their_quotes(k in name(), v in "[ -!#-~]{0,20}") {
        let text = format!("{k} = \"{v}\"\n");
        prop_assert_eq!(output::parse(Format::Kv, text.as_bytes(), "own"), Ok(vec![(k, v)]));
    }

    #[test]
    fn elim_round_trips(
        pairs in proptest::collection::vec((name(), "[!-~]{1,12}"), 1..20),
        split in 1usize..6,
    ) {
        let pairs = unique(pairs);
        // The same pairs spread over several lines (each line its own count).
        let text: String = pairs
            .chunks(split)
            .map(|c| {
                let words: Vec<String> = c.iter().map(|(k, v)| format!("{k} {v}")).collect();
                format!("{} {}\n", c.len(), words.join(" "))
            })
            .collect();
        prop_assert_eq!(output::parse(Format::Elim, text.as_bytes(), "own"), Ok(pairs));
    }

    #[test]
    fn elim_last_line_wins(k in name(), v1 in "[!-~]{1,8}", v2 in "[!-~]{1,8}") {
        let text = format!("1 {k} {v1}\n1 {k} {v2}\n");
        prop_assert_eq!(output::parse(Format::Elim, text.as_bytes(), "own"), Ok(vec![(k, v2)]));
    }

    #[test]
    fn elim_wrong_count_is_an_error_with_its_line(k in name(), v in "[!-~]{1,8}", n in 2usize..9) {
        let text = format!("1 {k} {v}\n{n} {k} {v}\n");
        let r = output::parse(Format::Elim, text.as_bytes(), "own");
        prop_assert!(matches!(r, Err(OutputError::Line { line: 2, .. })), "{:?}", r);
    }

    #[test]
    fn value_is_the_first_non_blank_line(blank in "[ \t\n]{0,6}", v in "[!-~]([ -~]{0,20}[!-~])?", rest in "[ -~\n]{0,40}") {
        let text = format!("{blank}{v}\n{rest}");
        prop_assert_eq!(output::parse(Format::Value, text.as_bytes(), "own"), Ok(vec![("own".to_owned(), v)]));
    }
}
