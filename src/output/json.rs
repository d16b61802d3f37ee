//! `format: json`: one JSON document, as Telegraf's exec input reads its `json` data format.
//! An object (or an array) is flattened into one sample per leaf, named by its dotted path:
//! `{"gpu": [{"temp": 61}]}` gives `gpu.0.temp = 61` (array elements by their index).
//! Numbers, booleans and strings are values; `null` and empty objects or arrays give none.
//! Without `select:`, a resource named like the path with `_` for `.` (`gpu_0_temp`) is fed
//! by it; `select:` names the path itself (`gpu.0.temp`). Output that is not JSON is a failed
//! run whose error says where the document broke.
//!
//! A record is picked by its keys' values, as Telegraf's `tag_keys` and `json_name_key`
//! name records: `select: {gpu1_temp: 'temp{index="1"}'}` takes the `temp` of the object
//! whose `index` is 1, wherever that object is in its array (`gpu.3.temp` when `gpu.3.index`
//! is 1). The selector's name is the leaf's path inside the record; its labels are keys of
//! the same record.
//!
//! The document is read as it is parsed (never built as a tree first) and its leaves are
//! charged against the parse's [`Budget`]: 16 MiB of JSON costs the agent its samples, at
//! most [`super::SAMPLE_BYTES_PER_OUTPUT_BYTE`] times its size, not a tree of values on top.
//! serde_json bounds the nesting (128 levels). A key repeated in one object gives a sample
//! for each (a resource they both feed names both).

use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::stream::Streaming;
use super::{Budget, Exits, FormatDef, Input, OutputError, Parsed, Sample, Selector};

pub const DEF: FormatDef = FormatDef {
    name: "json",
    title: "a JSON document",
    parse,
    exits: Exits::Zero,
    selectable: true,
    empty_is_an_answer: true,
    fold_case: false,
    stream: Streaming::No,
    peer: &super::NO_PEER,
};

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let text = input.text.trim_start();
    if text.trim_end().is_empty() {
        return Err(OutputError::Empty);
    }
    if !(text.starts_with('{') || text.starts_with('[')) {
        let skipped = input.text.len() - text.len();
        return Err(OutputError::Line {
            line: 1 + input.text[..skipped].matches('\n').count(),
            reason: "expected a JSON object or array, as Telegraf's json format reads".into(),
        });
    }
    let mut out = Parsed::default();
    let mut budget = Budget::for_output(input.text.len());
    let mut path = String::new();
    let mut de = serde_json::Deserializer::from_str(input.text);
    let read = Leaves {
        path: &mut path,
        out: &mut out.samples,
        budget: &mut budget,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    read.map_err(|e| OutputError::Line {
        line: e.line(),
        reason: without_position(&e),
    })?;
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

/// Every leaf under the value being read, its name `path` plus the keys and indices down to
/// it, pushed to `out` as it is read.
struct Leaves<'a> {
    path: &'a mut String,
    out: &'a mut Vec<Sample>,
    budget: &'a mut Budget,
}

impl Leaves<'_> {
    fn child(&mut self) -> Leaves<'_> {
        Leaves {
            path: self.path,
            out: self.out,
            budget: self.budget,
        }
    }

    fn enter(&mut self, key: &str) -> usize {
        let len = self.path.len();
        if !self.path.is_empty() {
            self.path.push('.');
        }
        self.path.push_str(key);
        len
    }

    fn leaf<E: serde::de::Error>(self, value: &str) -> Result<(), E> {
        self.budget
            .charge(self.path.len(), 0, value.len())
            .map_err(E::custom)?;
        self.out.push(Sample::plain(self.path, value));
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Leaves<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Leaves<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<(), E> {
        self.leaf(if b { "true" } else { "false" })
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<(), E> {
        self.leaf(&n.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<(), E> {
        self.leaf(&n.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<(), E> {
        // Written as serde_json writes a number (`-3e2` is `-300.0`).
        match serde_json::Number::from_f64(n) {
            Some(n) => self.leaf(&n.to_string()),
            None => Err(E::custom("a number that is not finite")),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        self.leaf(s)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        loop {
            let len = self.enter(&i.to_string());
            let more = seq.next_element_seed(self.child())?;
            self.path.truncate(len);
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let len = self.enter(&key);
            map.next_value_seed(self.child())?;
            self.path.truncate(len);
        }
        Ok(())
    }
}

/// The samples `sel` takes by record: those at `RECORD.NAME` (or `NAME` at the top) whose
/// record has every key of `sel.labels` with that value. One pass to index the leaves, one
/// to match: O(samples), whatever the number of records.
pub(super) fn in_records<'s>(samples: &'s [Sample], sel: &Selector) -> Vec<&'s Sample> {
    let by_path: HashMap<&str, &str> = samples
        .iter()
        .map(|s| (s.name.as_str(), s.value.as_str()))
        .collect();
    let mut key = String::new();
    samples
        .iter()
        .filter(|s| {
            let record = if s.name == sel.name {
                ""
            } else {
                match s.name.strip_suffix(sel.name.as_str()) {
                    Some(r) if r.ends_with('.') => &r[..r.len() - 1],
                    _ => return false,
                }
            };
            sel.labels.iter().all(|(k, v)| {
                key.clear();
                if !record.is_empty() {
                    key.push_str(record);
                    key.push('.');
                }
                key.push_str(k);
                by_path.get(key.as_str()) == Some(&v.as_str())
            })
        })
        .collect()
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
                ("gpu.0.temp", "61"),
                ("gpu.0.ok", "true"),
                ("gpu.1.temp", "58.5"),
                ("gpu.1.ok", "false"),
                ("a.b", "two words"),
                ("n", "-300.0"),
            ]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
        assert_eq!(names_and_values("[1, [2]]")[1], ("1.0".into(), "2".into()));
    }

    #[test]
    fn records_are_picked_by_their_keys_not_their_place() {
        let p = parse_ok(
            parse,
            r#"[{"name": "gpu", "index": 1, "temp": 58, "fan": {"rpm": 900}},
                {"name": "gpu", "index": 0, "temp": 61, "fan": {"rpm": 800}},
                {"name": "psu", "index": 0, "temp": 40}]"#,
        );
        let sel = |s: &str| crate::output::parse_selector(s).unwrap();
        let values = |s: &str| -> Vec<String> {
            in_records(&p.samples, &sel(s))
                .into_iter()
                .map(|s| s.value.clone())
                .collect()
        };
        assert_eq!(values(r#"temp{name="gpu",index="1"}"#), ["58"]);
        assert_eq!(values(r#"fan.rpm{index="0"}"#), ["800"]);
        assert_eq!(values(r#"temp{index="0"}"#), ["61", "40"]);
        assert!(values(r#"temp{index="7"}"#).is_empty());
        // A record at the top is the document itself.
        let top = parse_ok(parse, r#"{"host": "n1", "load": 2}"#);
        assert_eq!(in_records(&top.samples, &sel(r#"load{host="n1"}"#)).len(), 1);
    }

    #[test]
    fn a_document_whose_paths_repeat_too_much_text_is_refused_at_its_budget() {
        // 50 kB of JSON whose 20,000 leaves each repeat a 10 kB key: 200 MB of sample names.
        let key = "k".repeat(10_000);
        let zeros = vec!["0"; 20_000].join(",");
        let text = format!("{{\"{key}\": [{zeros}]}}");
        let e = parse(&Input {
            text: &text,
            exit: Some(0),
            own: "x",
        })
        .unwrap_err();
        assert!(
            matches!(&e, OutputError::Line { line: 1, reason } if reason.contains("times the output's size")),
            "{e:?}"
        );
        // The same leaves under a short key are an answer.
        let text = format!("{{\"k\": [{zeros}]}}");
        assert_eq!(parse_ok(parse, &text).samples.len(), 20_000);
    }

    #[test]
    fn nesting_is_bounded() {
        let text = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let e = parse(&Input {
            text: &text,
            exit: Some(0),
            own: "x",
        });
        assert!(
            matches!(&e, Err(OutputError::Line { reason, .. }) if reason.contains("recursion limit")),
            "{e:?}"
        );
        let text = format!("{}1{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(parse_ok(parse, &text).samples.len(), 1);
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
