//! `format: json`: one JSON document, as Telegraf's exec input reads its `json` data format.
//! An object (or an array) is flattened into one sample per leaf, named by its dotted path:
//! `{"gpu": [{"temp": 61}]}` gives `gpu.0.temp = 61` (array elements by their index).
//! Numbers, booleans and strings are values; `null` and empty objects or arrays give none.
//! Without `select:`, a resource named like the path with `_` for `.` (`gpu_0_temp`) is fed
//! by it; `select:` names the path itself (`gpu.0.temp`). Output that is not JSON is a failed
//! run whose error says where the document broke.

use serde_json::Value as Json;

use super::{Exits, FormatDef, Input, OutputError, Parsed, Sample};

pub const DEF: FormatDef = FormatDef {
    name: "json",
    title: "a JSON document",
    parse,
    exits: Exits::Zero,
    selectable: true,
    empty_is_an_answer: true,
    fold_case: false,
    streams: false,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    if input.text.trim().is_empty() {
        return Err(OutputError::Empty);
    }
    // serde_json bounds nesting (128 levels), so the walk below is bounded too.
    let doc: Json = serde_json::from_str(input.text).map_err(|e| OutputError::Line {
        line: e.line(),
        reason: without_position(&e),
    })?;
    if !(doc.is_object() || doc.is_array()) {
        return Err(OutputError::Line {
            line: 1,
            reason: "expected a JSON object or array, as Telegraf's json format reads".into(),
        });
    }
    let mut out = Parsed::default();
    flatten(&doc, &mut String::new(), &mut out.samples);
    Ok(out)
}

/// serde_json's message with its column but not its line (the error names the line).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => format!("{} at column {}", &text[..i], e.column()),
        None => text,
    }
}

/// Every leaf under `value`, its name `path` plus the keys and indices down to it.
fn flatten(value: &Json, path: &mut String, out: &mut Vec<Sample>) {
    let mut child = |key: &str, value: &Json, path: &mut String| {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        flatten(value, path, out);
        path.truncate(len);
    };
    match value {
        Json::Object(map) => {
            for (key, v) in map {
                child(key, v, path);
            }
        }
        Json::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                child(&i.to_string(), v, path);
            }
        }
        Json::Null => {}
        Json::Bool(b) => out.push(Sample::plain(path, if *b { "true" } else { "false" })),
        Json::Number(n) => out.push(Sample::plain(path, &n.to_string())),
        Json::String(s) => out.push(Sample::plain(path, s)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::parse_ok;
    use super::*;

    fn names_and_values(text: &str) -> Vec<(String, String)> {
        parse_ok(parse, text)
            .samples
            .into_iter()
            .map(|s| (s.name, s.value))
            .collect()
    }

    #[test]
    fn nested_objects_and_arrays_flatten_to_dotted_paths() {
        let got = names_and_values(
            r#"{"gpu": [{"temp": 61, "ok": true}, {"temp": 58.5, "ok": false}],
                "a": {"b": "two words", "none": null, "empty": {}}, "n": -3e2}"#,
        );
        assert_eq!(
            got,
            [
                ("a.b", "two words"),
                ("gpu.0.ok", "true"),
                ("gpu.0.temp", "61"),
                ("gpu.1.ok", "false"),
                ("gpu.1.temp", "58.5"),
                ("n", "-300.0"),
            ]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
        assert_eq!(names_and_values("[1, [2]]")[1], ("1.0".into(), "2".into()));
    }

    #[test]
    fn malformed_json_is_an_error_naming_where_it_broke() {
        let err = parse(&Input {
            text: "{\"a\": 1,\n \"b\": }\n",
            exit: Some(0),
            own: "x",
        })
        .unwrap_err();
        let OutputError::Line { line, reason } = err else {
            panic!("{err:?}")
        };
        assert_eq!(line, 2);
        assert_eq!(reason, "expected value at column 7");
        for bad in ["42", "\"text\"", "true"] {
            let e = parse(&Input {
                text: bad,
                exit: Some(0),
                own: "x",
            });
            assert!(
                matches!(&e, Err(OutputError::Line { reason, .. }) if reason.contains("object or array")),
                "{bad}: {e:?}"
            );
        }
        let e = parse(&Input {
            text: " \n",
            exit: Some(0),
            own: "x",
        });
        assert_eq!(e, Err(OutputError::Empty));
    }
}
