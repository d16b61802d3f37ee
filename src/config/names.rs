//! Field names: the row type of the field tables, the names serde derives for a struct (so
//! that no list of known fields is written by hand), and the known name a misspelt one is
//! closest to: every "unknown field ...; did you mean ..." of both files comes from here.

use serde::de::Visitor;
use serde::{Deserialize, Deserializer};

use super::limits::Bound;

/// One row of a field table: the name serde reads, the line the section-5 man page prints,
/// and, for a number, the range its validation accepts (printed beside the line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub doc: &'static str,
    pub bound: Option<Bound>,
}

impl Field {
    pub const fn new(name: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            doc,
            bound: None,
        }
    }

    pub const fn bounded(self, bound: Bound) -> Self {
        Self {
            bound: Some(bound),
            ..self
        }
    }
}

/// A table's names, in its order.
pub fn names_of(table: &[Field]) -> Vec<&'static str> {
    table.iter().map(|f| f.name).collect()
}

/// The field names serde derives for struct `T`, so that lists of known fields are never
/// written by hand: a field added to the struct is known everywhere at once.
pub fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Capture<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Capture<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("fields captured"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Capture(&mut fields));
    fields
}

/// A known field within two edits of `key`, case ignored: `intreval` -> `interval`.
pub fn near_miss<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let k = key.to_ascii_lowercase();
    known
        .iter()
        .copied()
        .filter(|f| *f != key)
        .map(|f| (edit_distance(&k, f), f))
        .filter(|(d, f)| *d <= if f.len() <= 4 { 1 } else { 2 })
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f)
}

/// Up to `n` of `known`, nearest to `key` first (edit distance, case ignored; ties keep
/// `known`'s order): what a did-you-mean lists when no single near miss stands out.
pub fn nearest<'a>(key: &str, known: &[&'a str], n: usize) -> Vec<&'a str> {
    let k = key.to_ascii_lowercase();
    let mut ranked: Vec<(usize, &'a str)> = known
        .iter()
        .map(|f| (edit_distance(&k, &f.to_ascii_lowercase()), *f))
        .collect();
    ranked.sort_by_key(|(d, _)| *d);
    ranked.into_iter().take(n).map(|(_, f)| f).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_near_miss_is_within_two_edits_case_ignored() {
        let known = ["interval", "valtype", "resourcemap", "name"];
        assert_eq!(near_miss("intreval", &known), Some("interval"));
        assert_eq!(near_miss("ValType", &known), Some("valtype"));
        assert_eq!(near_miss("resource_map", &known), Some("resourcemap"));
        assert_eq!(near_miss("distributions", &known), None);
        // Short names get one edit only.
        assert_eq!(near_miss("nmae", &known), None);
        assert_eq!(near_miss("nam", &known), Some("name"));
    }

    #[test]
    fn field_names_are_the_ones_serde_derives() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Two {
            first: u8,
            second_one: u8,
        }
        assert_eq!(field_names::<Two>(), ["first", "second_one"]);
    }
}
