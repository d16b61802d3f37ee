//! Property tests of every probe output parser: arbitrary bytes never panic; generated
//! output parses back to exactly what was printed; a malformed line is named by its number
//! and the other lines still count.

use proptest::prelude::*;
use serde_json::Value as Json;
use xce_agent::config::Format;
use xce_agent::output::{self, OutputError, Pair, Parsed};

const FORMATS: &[Format] = Format::ALL;

fn parse(f: Format, bytes: &[u8]) -> Result<Vec<Pair>, OutputError> {
    output::parse(f, bytes, Some(0), "own").map(|p| p.pairs())
}

fn parsed(f: Format, text: &str) -> Parsed {
    output::parse(f, text.as_bytes(), Some(0), "own").unwrap()
}

fn bad_line_numbers(p: &Parsed) -> Vec<usize> {
    p.bad_lines
        .iter()
        .map(|e| match e {
            OutputError::Line { line, .. } => *line,
            other => panic!("not a line error: {other:?}"),
        })
        .collect()
}

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
    #![proptest_config(crate::support::proptest_config(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        for &f in FORMATS {
            if let Ok(pairs) = parse(f, &bytes) {
                // Whatever parses came from valid UTF-8 without NUL.
                prop_assert!(!bytes.contains(&0));
                prop_assert!(std::str::from_utf8(&bytes).is_ok());
                // Only the selectable formats call an empty answer an answer.
                prop_assert!(!pairs.is_empty() || f.selectable());
            }
        }
    }

    #[test]
    fn line_shaped_text_never_panics(text in "([0-9]{1,2}|[a-z]{1,4}|=| |\"|'|#|\n|\r|\t|\u{0}|é|\\\\|[{}]|,|;|[|]|-|[iuT.]|NaN|Inf){0,80}") {
        for &f in FORMATS {
            let r = parse(f, text.as_bytes());
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
        prop_assert_eq!(parse(Format::Kv, text.as_bytes()), Ok(pairs));
    }

    #[test]
    fn kv_quoted_values_lose_their_quotes(k in name(), v in "[ -!#-~]{0,20}") {
        let text = format!("{k} = \"{v}\"\n");
        prop_assert_eq!(parse(Format::Kv, text.as_bytes()), Ok(vec![(k, v)]));
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
        prop_assert_eq!(parse(Format::Elim, text.as_bytes()), Ok(pairs));
    }

    #[test]
    fn elim_last_line_wins(k in name(), v1 in "[!-~]{1,8}", v2 in "[!-~]{1,8}") {
        let text = format!("1 {k} {v1}\n1 {k} {v2}\n");
        prop_assert_eq!(parse(Format::Elim, text.as_bytes()), Ok(vec![(k, v2)]));
    }

    #[test]
    fn elim_wrong_count_is_an_error_with_its_line(k in name(), v in "[!-~]{1,8}", n in 2usize..9) {
        let text = format!("1 {k} {v}\n{n} {k} {v}\n");
        let r = parse(Format::Elim, text.as_bytes());
        prop_assert!(matches!(r, Err(OutputError::Line { line: 2, .. })), "{:?}", r);
    }

    #[test]
    fn value_is_the_first_non_blank_line(blank in "[ \t\n]{0,6}", v in "[!-~]([ -~]{0,20}[!-~])?", rest in "[ -~\n]{0,40}") {
        let text = format!("{blank}{v}\n{rest}");
        prop_assert_eq!(parse(Format::Value, text.as_bytes()), Ok(vec![("own".to_owned(), v)]));
    }
}

/// A finite number as a probe prints it.
fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-1_000_000i64..1_000_000).prop_map(|i| i as f64),
        (-1e12f64..1e12),
        (0f64..1.0),
    ]
}

fn same_number(printed: f64, parsed: &str) -> bool {
    parsed
        .parse::<f64>()
        .is_ok_and(|v| (v - printed).abs() <= 1e-9 * printed.abs().max(1.0))
}

fn prom_escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn influx_escape(v: &str, also: &[char]) -> String {
    let mut out = String::new();
    for c in v.chars() {
        if c == '\\' || also.contains(&c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// (name, labels, value) of a parsed sample.
type FlatSample = (String, Vec<(String, String)>, String);

type PromSample = (String, Vec<(String, String)>, f64);

fn prom_sample() -> impl Strategy<Value = PromSample> {
    (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,15}",
        proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,8}", "[ -~\n]{0,12}", 0..4)
            .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
        number(),
    )
}

/// (measurement, tags, fields): a field value is printed text and what it parses to.
type InfluxPoint = (String, Vec<(String, String)>, Vec<(String, String, String)>);

fn influx_field() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        any::<i64>().prop_map(|i| (format!("{i}i"), i.to_string())),
        any::<u32>().prop_map(|u| (format!("{u}u"), u.to_string())),
        number().prop_map(|x| (format!("{x:?}"), format!("{x:?}"))),
        prop_oneof![
            Just(("t", "true")),
            Just(("FALSE", "false")),
            Just(("True", "true"))
        ]
        .prop_map(|(a, b)| (a.to_owned(), b.to_owned())),
        "[ -~]{0,12}".prop_map(|s| (format!("\"{}\"", influx_escape(&s, &['"'])), s)),
    ]
}

fn influx_point() -> impl Strategy<Value = InfluxPoint> {
    (
        "[a-z][a-z0-9_ ,=]{0,10}",
        proptest::collection::btree_map("[a-z][a-z0-9 ,=]{0,6}", "[a-z0-9 ,=]{1,6}", 0..3)
            .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
        proptest::collection::btree_map("[a-z][a-z0-9_ ,=]{0,6}", influx_field(), 1..4).prop_map(
            |m| {
                m.into_iter()
                    .map(|(k, (p, v))| (k, p, v))
                    .collect::<Vec<_>>()
            },
        ),
    )
}

fn influx_line((m, tags, fields): &InfluxPoint, ts: Option<i64>) -> String {
    let mut line = influx_escape(m, &[',', ' ']);
    for (k, v) in tags {
        line.push_str(&format!(
            ",{}={}",
            influx_escape(k, &[',', '=', ' ']),
            influx_escape(v, &[',', '=', ' '])
        ));
    }
    let fields: Vec<String> = fields
        .iter()
        .map(|(k, printed, _)| format!("{}={printed}", influx_escape(k, &[',', '=', ' '])))
        .collect();
    line.push(' ');
    line.push_str(&fields.join(","));
    if let Some(ts) = ts {
        line.push_str(&format!(" {ts}"));
    }
    line
}

/// A memory specifier with a multiplier in bytes (`sge_types(1)`: k 1000, K 1024, m, M, g,
/// G); `None` for any other value.
fn sge_memory_bytes(v: &str) -> Option<f64> {
    let (number, unit) = v.split_at(v.len().checked_sub(1)?);
    let power = "kmg".find(unit).map(|i| 1000f64.powi(i as i32 + 1));
    let binary = "KMG".find(unit).map(|i| 1024f64.powi(i as i32 + 1));
    let plain =
        number.chars().all(|c| c.is_ascii_digit() || c == '.') && number.matches('.').count() <= 1;
    let n: f64 = if plain {
        number.parse().ok()?
    } else {
        return None;
    };
    Some(n * power.or(binary)?)
}

/// A ClassAd literal as printed and as the parser gives it back.
fn classad_value() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        any::<i64>().prop_map(|i| (i.to_string(), i.to_string())),
        number().prop_map(|x| (format!("{x:?}"), format!("{x:?}"))),
        prop_oneof![
            Just(("True", "true")),
            Just(("false", "false")),
            Just(("FALSE", "false"))
        ]
        .prop_map(|(a, b)| (a.to_owned(), b.to_owned())),
        "[ -~]{0,16}".prop_map(|s| (
            format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
            s
        )),
    ]
}

/// A JSON value a probe might print: leaves of every type, nested objects and arrays.
fn json_value() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(Json::from),
        number().prop_map(Json::from),
        "[ -~]{0,12}".prop_map(Json::String),
        Just(Json::Null),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
            proptest::collection::btree_map("[a-z_][a-z0-9_]{0,6}", inner, 0..5)
                .prop_map(|m| Json::Object(m.into_iter().collect())),
        ]
    })
}

/// The leaves of `value` as the test expects them: (dotted path, the leaf), nulls left out.
fn json_leaves(value: &Json, path: &str, out: &mut Vec<(String, Json)>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Json::Object(map) => map.iter().for_each(|(k, v)| json_leaves(v, &join(k), out)),
        Json::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(i, v)| json_leaves(v, &join(&i.to_string()), out)),
        Json::Null => {}
        leaf => out.push((path.to_owned(), leaf.clone())),
    }
}

fn insert_line(lines: &mut Vec<String>, at: usize, garbage: &str) -> usize {
    let at = at % (lines.len() + 1);
    lines.insert(at, garbage.to_owned());
    at + 1
}

proptest! {
    #![proptest_config(crate::support::proptest_config(256))]

    #[test]
    fn prometheus_round_trips_and_names_a_bad_line(
        samples in proptest::collection::vec(prom_sample(), 0..12),
        comments in any::<bool>(),
        garbage in prop_oneof![Just("9bad 1"), Just("m{a=1} 2"), Just("m 1 2 3"), Just("m abc"), Just("m{a=\"1\" 2")],
        at in any::<usize>(),
    ) {
        let mut lines = Vec::new();
        for (name, labels, v) in &samples {
            if comments {
                lines.push(format!("# HELP {name} some help\n# TYPE {name} gauge"));
            }
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", prom_escape(v))).collect();
            let set = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
            lines.push(format!("{name}{set} {v:?}"));
        }
        let text = lines.join("\n");
        let p = parsed(Format::Prometheus, &text);
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        prop_assert_eq!(p.samples.len(), samples.len());
        for (s, (name, labels, v)) in p.samples.iter().zip(&samples) {
            prop_assert_eq!(&s.name, name);
            prop_assert_eq!(&s.labels, labels);
            prop_assert!(same_number(*v, &s.value), "{} vs {}", v, s.value);
        }
        // One malformed line: named by its number, every other sample still there.
        let mut flat: Vec<String> = text.lines().map(str::to_owned).collect();
        let bad = insert_line(&mut flat, at, garbage);
        let p = parsed(Format::Prometheus, &flat.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![bad]);
        prop_assert_eq!(p.samples.len(), samples.len());
    }

    #[test]
    fn influx_round_trips_and_names_a_bad_line(
        points in proptest::collection::vec((influx_point(), proptest::option::of(any::<i64>())), 0..8),
        garbage in prop_oneof![Just("nofields"), Just("m x="), Just("m x=\"open"), Just("m x=1 notatime"), Just("m x=12x"), Just("m,t x=1")],
        at in any::<usize>(),
    ) {
        let mut lines: Vec<String> = points.iter().map(|(p, ts)| influx_line(p, *ts)).collect();
        let p = parsed(Format::Influx, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?} in {:?}", p.bad_lines, lines);
        let want: Vec<FlatSample> = points
            .iter()
            .flat_map(|((m, tags, fields), _)| {
                fields.iter().map(move |(k, _, v)| (format!("{m}.{k}"), tags.clone(), v.clone()))
            })
            .collect();
        let got: Vec<FlatSample> =
            p.samples.iter().map(|s| (s.name.clone(), s.labels.clone(), s.value.clone())).collect();
        prop_assert_eq!(got, want.clone());
        let bad = insert_line(&mut lines, at, garbage);
        let p = parsed(Format::Influx, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![bad]);
        prop_assert_eq!(p.samples.len(), want.len());
    }

    /// `condor_gpu_discovery`'s nested records: one record per line, each attribute a
    /// sample named `Record.Attr`; a record left open is a bad line naming its number.
    #[test]
    fn classad_nested_records_round_trip_and_an_open_one_is_a_bad_line(
        records in proptest::collection::btree_map(
            "GPU_[a-f0-9]{8}",
            proptest::collection::btree_map("[A-Z][a-z0-9_]{0,12}", classad_value(), 0..6),
            1..4,
        ),
        garbage in prop_oneof![Just("Open = [ a = 1;"), Just("Junk = [ a = 1 ] b"), Just("Bad = [ 2x = 1 ]")],
        at in any::<usize>(),
    ) {
        let mut lines = Vec::new();
        let mut want = Vec::new();
        for (rec, attrs) in &records {
            let mut seen = std::collections::BTreeSet::new();
            let attrs: Vec<_> = attrs.iter().filter(|(k, _)| seen.insert(k.to_ascii_lowercase())).collect();
            let body: Vec<String> = attrs.iter().map(|(k, (printed, _))| format!("{k}={printed}; ")).collect();
            lines.push(format!("{rec}=[ {}]", body.concat()));
            want.extend(attrs.iter().map(|(k, (_, v))| (format!("{rec}.{k}"), v.clone())));
        }
        let p = parsed(Format::Classad, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(String, String)> = p.samples.iter().map(|s| (s.name.clone(), s.value.clone())).collect();
        prop_assert_eq!(got, want.clone());
        let bad = insert_line(&mut lines, at, garbage);
        let p = parsed(Format::Classad, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![bad]);
        prop_assert_eq!(p.samples.len(), want.len());
    }

    #[test]
    fn classad_round_trips_and_names_a_bad_line(
        attrs in proptest::collection::btree_map("[A-Z][a-z0-9_]{0,12}", classad_value(), 0..10),
        garbage in prop_oneof![Just("no equals here"), Just("2x = 3"), Just("B ="), Just("C = ERROR")],
        at in any::<usize>(),
    ) {
        // Attribute names are case-insensitive: keep one spelling of each.
        let mut seen = std::collections::BTreeSet::new();
        let attrs: Vec<(String, (String, String))> =
            attrs.into_iter().filter(|(k, _)| seen.insert(k.to_ascii_lowercase())).collect();
        let mut lines: Vec<String> = attrs.iter().map(|(k, (printed, _))| format!("{k} = {printed}")).collect();
        let p = parsed(Format::Classad, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(String, String)> = p.samples.iter().map(|s| (s.name.clone(), s.value.clone())).collect();
        let want: Vec<(String, String)> = attrs.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect();
        prop_assert_eq!(got, want);
        let bad = insert_line(&mut lines, at, garbage);
        let p = parsed(Format::Classad, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![bad]);
        prop_assert_eq!(p.samples.len(), attrs.len());
    }

    #[test]
    fn json_round_trips_by_path_and_a_cut_document_is_an_error_with_its_line(
        doc in proptest::collection::btree_map("[a-z_][a-z0-9_]{0,6}", json_value(), 0..6),
        pretty in any::<bool>(),
        cut in any::<usize>(),
    ) {
        let doc = Json::Object(doc.into_iter().collect());
        let text = if pretty { serde_json::to_string_pretty(&doc) } else { serde_json::to_string(&doc) }.unwrap();
        let p = parsed(Format::Json, &text);
        let mut want = Vec::new();
        json_leaves(&doc, "", &mut want);
        prop_assert_eq!(p.samples.len(), want.len(), "{:?}", p.samples);
        for (s, (path, leaf)) in p.samples.iter().zip(&want) {
            prop_assert_eq!(&s.name, path);
            match leaf {
                Json::String(v) => prop_assert_eq!(&s.value, v),
                Json::Bool(b) => prop_assert_eq!(&s.value, &b.to_string()),
                Json::Number(n) => prop_assert!(same_number(n.as_f64().unwrap(), &s.value), "{} vs {}", n, s.value),
                other => prop_assert!(false, "not a leaf: {other}"),
            }
        }
        // A document cut short is never half-read: the run fails, naming a line of it.
        let at = 1 + cut % (text.len() - 1).max(1);
        if at < text.len() && text.is_char_boundary(at) {
            match output::parse(Format::Json, &text.as_bytes()[..at], Some(0), "own") {
                Err(OutputError::Line { line, .. }) => prop_assert!(line >= 1 && line <= text.lines().count()),
                other => prop_assert!(false, "{:?} for {:?}", other, &text[..at]),
            }
        }
    }

    #[test]
    fn nagios_perfdata_round_trips_in_base_units(
        items in proptest::collection::btree_map(
            "[a-zA-Z][a-zA-Z0-9_ /']{0,10}",
            (0f64..1e6, prop_oneof![Just(("", 1.0)), Just(("s", 1.0)), Just(("ms", 1e-3)), Just(("us", 1e-6)), Just(("%", 1.0)), Just(("B", 1.0)), Just(("KB", 1024.0)), Just(("MB", 1048576.0)), Just(("GB", 1073741824.0)), Just(("c", 1.0))]),
            1..8,
        ),
        exit in 0i32..3,
        second_line in any::<bool>(),
    ) {
        let items: Vec<(String, f64, &str, f64)> = items.into_iter().map(|(k, (v, (u, f)))| (k, v, u, f)).collect();
        let printed: Vec<String> = items
            .iter()
            .map(|(k, v, u, _)| format!("'{}'={v}{u};1;2;0;", k.replace('\'', "''")))
            .collect();
        let text = if second_line && printed.len() > 1 {
            format!("CHECK OK - fine | {}\nlong text\n| {}\n", printed[0], printed[1..].join(" "))
        } else {
            format!("CHECK OK - fine | {}\n", printed.join(" "))
        };
        let p = output::parse(Format::Nagios, text.as_bytes(), Some(exit), "own").unwrap();
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        for (k, v, _, factor) in &items {
            let s = p.samples.iter().find(|s| &s.name == k);
            prop_assert!(s.is_some(), "{} missing", k);
            prop_assert!(same_number(v * factor, &s.unwrap().value));
        }
        let exit_sample = p.samples.iter().find(|s| s.name == "exit").map(|s| s.value.clone());
        prop_assert_eq!(exit_sample, Some(exit.to_string()));
    }
}

proptest! {
    #![proptest_config(crate::support::proptest_config(256))]

    /// A stream probe's ClassAd reader, fed line by line: one ad per `-` or `- NAME`, each
    /// with exactly its attributes (labelled with its name), together what the
    /// finished-run parser reads from the same text; a malformed line is named by its
    /// number from the stream's start, in the ad it was in.
    #[test]
    fn classad_stream_gives_one_ad_per_separator_as_the_run_parser_reads_them(
        ads in proptest::collection::vec(
            (
                proptest::collection::btree_map("[A-Z][a-z0-9_]{0,8}", classad_value(), 0..5),
                proptest::option::of("[A-Z][A-Z0-9]{0,6}"),
            ),
            0..5,
        ),
        garbage in prop_oneof![Just("no equals here"), Just("2x = 3"), Just("B ="), Just("C = ERROR")],
        at in any::<usize>(),
    ) {
        let mut lines = Vec::new();
        for (attrs, tag) in &ads {
            let mut seen = std::collections::BTreeSet::new();
            for (k, (printed, _)) in attrs {
                if seen.insert(k.to_ascii_lowercase()) {
                    lines.push(format!("{k} = {printed}"));
                }
            }
            lines.push(tag.as_ref().map_or_else(|| "-".to_owned(), |t| format!("- {t}")));
        }
        let stream = |lines: &[String]| {
            let mut reader = output::AdStream::default();
            let mut got = Vec::new();
            for l in lines {
                if let output::AdLine::Ended { tag, ad } = reader.push(l) {
                    got.push((tag, ad));
                }
            }
            (got, reader.finish())
        };
        let (got, rest) = stream(&lines);
        prop_assert_eq!(got.len(), ads.len());
        prop_assert!(rest.is_none());
        let mut merged = Parsed::default();
        let mut indexed = output::MergedAds::default();
        let mut declared = output::DeclaredBudget::default();
        for ((tag, ad), (_, want_tag)) in got.into_iter().zip(&ads) {
            prop_assert_eq!(&tag, want_tag.as_deref().unwrap_or(""));
            for s in &ad.samples {
                let want: Vec<(String, String)> =
                    want_tag.iter().map(|t| ("ad".to_owned(), t.clone())).collect();
                prop_assert_eq!(&s.labels, &want);
            }
            indexed.add(ad.clone(), &mut declared);
            output::merge_ads(&mut merged, ad);
        }
        // The indexed merge a stream's first values use is the same merge.
        prop_assert_eq!(&indexed.parsed().samples, &merged.samples);
        prop_assert_eq!(merged.samples, parsed(Format::Classad, &lines.join("\n")).samples);
        // One malformed line: named by its number, in an ad or after the last one.
        let bad = insert_line(&mut lines, at, garbage);
        let (got, rest) = stream(&lines);
        let mut numbers: Vec<usize> = got.iter().flat_map(|(_, ad)| bad_line_numbers(ad)).collect();
        numbers.extend(rest.iter().flat_map(bad_line_numbers));
        prop_assert_eq!(numbers, vec![bad]);
    }

    #[test]
    fn classad_stream_takes_any_lines_without_panicking(lines in proptest::collection::vec("[ -~]{0,30}|-.*", 0..30)) {
        let mut reader = output::AdStream::default();
        let mut ended = 0;
        for l in &lines {
            if matches!(reader.push(l), output::AdLine::Ended { .. }) {
                ended += 1;
            }
        }
        let separators = lines.iter().filter(|l| l.trim().starts_with('-')).count();
        prop_assert_eq!(ended, separators);
        reader.finish();
        prop_assert_eq!(reader.pending(), 0);
    }
}

/// Names the peers' formats print: a letter, then letters, digits and `_`.
fn peer_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,10}"
}

fn samples_of(p: &Parsed) -> Vec<(String, String)> {
    p.samples
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect()
}

fn this_host() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

proptest! {
    #![proptest_config(crate::support::proptest_config(128))]

    #[test]
    fn munin_round_trips_by_field_and_graph_and_names_a_bad_line(
        fields in proptest::collection::btree_map(peer_name(), number(), 1..8),
        graph in proptest::option::of(peer_name()),
        garbage in prop_oneof![Just("no_dot_here 1"), Just("x.value U"), Just("y.value many"), Just("multigraph")],
        at in any::<usize>(),
    ) {
        let mut lines: Vec<String> = graph.iter().map(|g| format!("multigraph {g}")).collect();
        lines.extend(fields.iter().map(|(k, v)| format!("{k}.value {v}")));
        let p = parsed(Format::Munin, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let want: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (graph.as_ref().map_or_else(|| k.clone(), |g| format!("{g}.{k}")), v.to_string()))
            .collect();
        prop_assert_eq!(samples_of(&p), want);
        // After the multigraph line, so the block keeps its graph.
        let at = graph.is_some() as usize + at % (lines.len() - graph.is_some() as usize + 1);
        lines.insert(at, garbage.to_owned());
        let p = parsed(Format::Munin, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![at + 1]);
    }

    #[test]
    fn checkmk_round_trips_states_and_metrics_and_names_a_bad_line(
        services in proptest::collection::btree_map(
            "[A-Za-z][A-Za-z0-9_ ]{0,10}[A-Za-z0-9]",
            (0u8..4, proptest::collection::btree_map(peer_name(), number(), 0..4)),
            1..6,
        ),
        garbage in prop_oneof![Just("7 svc - text"), Just("0 \"open"), Just("0 svc"), Just("0 svc a=x")],
        at in any::<usize>(),
    ) {
        let mut lines = Vec::new();
        let mut want = Vec::new();
        for (svc, (state, metrics)) in &services {
            let m: Vec<String> = metrics.iter().map(|(k, v)| format!("{k}={v};;")).collect();
            let m = if m.is_empty() { "-".to_owned() } else { m.join("|") };
            lines.push(format!("{state} \"{svc}\" {m} text for {svc}"));
            want.push((svc.clone(), state.to_string()));
            want.extend(metrics.iter().map(|(k, v)| (k.clone(), v.to_string())));
            want.push(("text".to_owned(), format!("text for {svc}")));
        }
        let p = parsed(Format::Checkmk, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        prop_assert_eq!(samples_of(&p), want);
        let bad = insert_line(&mut lines, at, garbage);
        let p = parsed(Format::Checkmk, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![bad]);
    }

    #[test]
    fn collectd_round_trips_each_value_and_names_a_bad_line(
        values in proptest::collection::btree_map(
            (peer_name(), peer_name()),
            proptest::collection::vec(number(), 1..4),
            1..6,
        ),
        quoted in any::<bool>(),
        garbage in prop_oneof![Just("PUTVAL a/b N:1:U"), Just("PUTVAL a/b/c"), Just("LISTVAL"), Just("PUTVAL a/b/c then:1")],
        at in any::<usize>(),
    ) {
        let mut lines = vec!["PUTNOTIF severity=okay message=hello".to_owned()];
        let mut want = Vec::new();
        for ((plugin, instance), vs) in &values {
            let id = format!("n1/{plugin}/gauge-{instance}");
            let id = if quoted { format!("\"{id}\"") } else { id };
            let list: Vec<String> = vs.iter().map(f64::to_string).collect();
            lines.push(format!("PUTVAL {id} interval=10 N:{}", list.join(":")));
            want.extend(vs.iter().map(|v| (format!("{plugin}/gauge-{instance}"), v.to_string())));
        }
        let p = parsed(Format::Collectd, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        prop_assert_eq!(samples_of(&p), want);
        let bad = insert_line(&mut lines, at, garbage);
        let p = parsed(Format::Collectd, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![bad]);
    }

    #[test]
    fn netdata_values_are_set_times_multiplier_over_divisor(
        dims in proptest::collection::btree_map(peer_name(), (-1_000_000i64..1_000_000, 1i64..1000, 1i64..1000), 1..6),
        updates in 1usize..3,
        garbage in prop_oneof![Just("SET nowhere = 1"), Just("BEGIN no.chart"), Just("END"), Just("WHAT")],
    ) {
        let mut lines = vec!["CHART 'test.chart' '' 'a title' 'units' fam ctx line 1 1".to_owned()];
        for (id, (_, m, d)) in &dims {
            lines.push(format!("DIMENSION {id} '{id} name' absolute {m} {d}"));
        }
        for _ in 0..updates {
            lines.push("BEGIN test.chart".to_owned());
            lines.extend(dims.iter().map(|(id, (v, _, _))| format!("SET {id} = {v}")));
            lines.push("END".to_owned());
        }
        let p = parsed(Format::Netdata, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        prop_assert_eq!(p.samples.len(), dims.len());
        for (s, (id, (v, m, d))) in p.samples.iter().zip(&dims) {
            prop_assert_eq!(&s.name, &format!("test.chart.{id}"));
            prop_assert!(same_number(*v as f64 * *m as f64 / *d as f64, &s.value), "{} vs {}", v, s.value);
        }
        // Outside an update (before the first BEGIN) the garbage is named by its line.
        let at = dims.len() + 1;
        lines.insert(at, garbage.to_owned());
        let p = parsed(Format::Netdata, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![at + 1]);
    }

    #[test]
    fn sge_round_trips_a_report_and_names_a_bad_line(
        values in proptest::collection::btree_map(
            "[a-z][a-z0-9_.]{0,10}",
            prop_oneof!["[!-~]([ -~]{0,10}[!-~])?", "[0-9]{1,9}(\\.[0-9]{1,3})?[kKmMgG]"],
            1..8,
        ),
        global in any::<bool>(),
        garbage in prop_oneof![Just("other-host.example:x:1"), Just("no colons"), Just("h::1")],
        at in any::<usize>(),
    ) {
        let host = if global { "global".to_owned() } else { this_host() };
        let mut lines = vec!["begin".to_owned()];
        lines.extend(values.iter().map(|(k, v)| format!("{host}:{k}:{v}")));
        lines.push("end".to_owned());
        let p = parsed(Format::Sge, &lines.join("\n"));
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let want: Vec<(String, String)> = values
            .into_iter()
            .map(|(k, v)| {
                let bytes = sge_memory_bytes(&v).map_or(v, |b| b.to_string());
                (k, bytes)
            })
            .collect();
        prop_assert_eq!(samples_of(&p), want.clone());
        let at = 1 + at % (lines.len() - 1);
        lines.insert(at, garbage.to_owned());
        let p = parsed(Format::Sge, &lines.join("\n"));
        prop_assert_eq!(bad_line_numbers(&p), vec![at + 1]);
        prop_assert_eq!(p.samples.len(), want.len());
    }

    #[test]
    fn json_records_are_picked_by_their_keys_in_any_order(
        temps in proptest::collection::btree_map(0u32..1000, -50i64..150, 1..8),
        order in any::<proptest::sample::Index>(),
    ) {
        let mut records: Vec<Json> = temps
            .iter()
            .map(|(i, t)| serde_json::json!({"name": "gpu", "index": i, "temp": t}))
            .collect();
        let turn = order.index(records.len());
        records.rotate_left(turn);
        let doc = serde_json::to_string(&Json::Array(records)).unwrap();
        let p = parsed(Format::Json, &doc);
        for (i, t) in &temps {
            let pick = output::Pick {
                selector: Some(output::parse_selector(&format!("temp{{name=\"gpu\",index=\"{i}\"}}")).unwrap()),
                ..output::Pick::default()
            };
            let r = output::select::reading(Format::Json, &pick, &p, "r", xce_agent::value::Valtype::Numeric);
            prop_assert_eq!(r, Some(xce_agent::value::Reading::Ok(xce_agent::value::Value::Numeric(*t as f64))));
        }
    }

    #[test]
    fn nagios_unquoted_labels_with_spaces_are_whole(
        items in proptest::collection::btree_map("[a-z][a-z0-9_]{0,5}( [a-z][a-z0-9_]{0,5}){0,2}", 0f64..1e6, 1..6),
    ) {
        let printed: Vec<String> = items.iter().map(|(k, v)| format!("{k}={v};1;2;0")).collect();
        let text = format!("CHECK OK - fine | {}\n", printed.join(" "));
        let p = output::parse(Format::Nagios, text.as_bytes(), Some(0), "own").unwrap();
        prop_assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        let got: Vec<(String, String)> = p.samples.iter().filter(|s| s.line > 0).map(|s| (s.name.clone(), s.value.clone())).collect();
        let want: Vec<(String, String)> = items.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        prop_assert_eq!(got, want);
    }
}
