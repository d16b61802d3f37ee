//! resources.yaml as written: every field the agent reads keeps its position, fields it does
//! not read are kept by name only. Meaning is given in `resources.rs`, after parsing, so each
//! error can point at its line and column.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_saphyr::Spanned;

use super::scalar::Scalar;

#[derive(Debug, Deserialize)]
pub struct RawResourcesFile {
    /// Other top-level sections belong to the controller.
    #[serde(default)]
    pub resources: Vec<Spanned<RawResource>>,
}

/// Fields of a resource entry the agent understands.
pub const RESOURCE_FIELDS: &[&str] = &[
    "name",
    "desc",
    "valtype",
    "ordtype",
    "flags",
    "interval",
    "resourcemap",
    "probe",
];

#[derive(Debug, Default)]
pub struct RawResource {
    pub name: Option<Spanned<String>>,
    pub desc: Option<String>,
    pub valtype: Option<Spanned<String>>,
    pub ordtype: Option<Spanned<String>>,
    pub interval: Option<Spanned<Scalar>>,
    pub resourcemap: Option<Spanned<Vec<Spanned<RawInstance>>>>,
    pub probe: Option<Spanned<RawProbe>>,
    /// Keys the agent does not use (the controller may): reported at debug level, or as an
    /// error when they look like a misspelt field the agent does use.
    pub unknown: Vec<Spanned<String>>,
    /// Keys given twice in one entry.
    pub duplicate: Vec<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawResource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawResource;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a resource (a mapping with name, valtype, interval, ...)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawResource, A::Error> {
                let mut r = RawResource::default();
                let mut seen = std::collections::BTreeSet::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    if !seen.insert(key.value.clone()) {
                        r.duplicate.push(key);
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    match key.value.as_str() {
                        "name" => r.name = Some(map.next_value()?),
                        "desc" => r.desc = map.next_value::<Option<String>>()?,
                        "valtype" => r.valtype = Some(map.next_value()?),
                        "ordtype" => r.ordtype = Some(map.next_value()?),
                        "interval" => r.interval = map.next_value()?,
                        "resourcemap" => r.resourcemap = map.next_value()?,
                        "probe" => r.probe = map.next_value()?,
                        "flags" => {
                            map.next_value::<IgnoredAny>()?;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            r.unknown.push(key);
                        }
                    }
                }
                Ok(r)
            }
        }
        d.deserialize_map(V)
    }
}

/// One `resourcemap` entry: one instance of the resource.
#[derive(Debug, Deserialize)]
pub struct RawInstance {
    pub location: Option<Spanned<Vec<Spanned<String>>>>,
    /// Static value; the controller's business, parsed only so it is allowed here.
    #[serde(default, rename = "value")]
    pub _value: Option<IgnoredAny>,
}

/// `probe:` is the agent's own field, so it is strict: an unknown key is an error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProbe {
    pub kind: Option<Spanned<String>>,
    // builtin
    pub index: Option<Spanned<String>>,
    // exec / stream
    pub command: Option<Spanned<Vec<String>>>,
    pub format: Option<Spanned<String>>,
    pub env: Option<Spanned<BTreeMap<String, String>>>,
    pub run_as: Option<Spanned<String>>,
    pub limits: Option<Spanned<RawLimits>>,
    pub no_new_privs: Option<Spanned<bool>>,
    pub timeout: Option<Spanned<Scalar>>,
    pub provides: Option<Spanned<Vec<Spanned<String>>>>,
    // file
    pub path: Option<Spanned<String>>,
    pub regex: Option<Spanned<String>>,
    pub max_age: Option<Spanned<Scalar>>,
    pub max_bytes: Option<Spanned<Scalar>>,
    // stream
    pub silence: Option<Spanned<Scalar>>,
    pub restart_on_silence: Option<Spanned<bool>>,
    // every kind
    pub stale_after: Option<Spanned<Scalar>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub cpu: Option<Spanned<Scalar>>,
    pub address_space: Option<Spanned<Scalar>>,
    pub open_files: Option<Spanned<Scalar>>,
    pub processes: Option<Spanned<Scalar>>,
    pub memory: Option<Spanned<Scalar>>,
    pub pids: Option<Spanned<Scalar>>,
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
    fn near_misses() {
        assert_eq!(near_miss("intreval", RESOURCE_FIELDS), Some("interval"));
        assert_eq!(near_miss("ValType", RESOURCE_FIELDS), Some("valtype"));
        assert_eq!(
            near_miss("resource_map", RESOURCE_FIELDS),
            Some("resourcemap")
        );
        assert_eq!(near_miss("hostBased", RESOURCE_FIELDS), None);
        assert_eq!(near_miss("distributions", RESOURCE_FIELDS), None);
    }
}
