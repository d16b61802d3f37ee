//! resources.yaml as written: every field the agent reads keeps its position, fields it does
//! not read are kept by name only. Meaning is given in `resources.rs`, after parsing, so each
//! error can point at its line and column.

use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_saphyr::Spanned;

use super::limits::{Bound, INTERVAL};
use super::names::{field_names, Field};
use super::probe_spec::RawProbe;
use super::scalar::Scalar;

#[derive(Debug, Default)]
pub struct RawResourcesFile {
    pub resources: Vec<Spanned<RawResource>>,
    /// Other top-level sections belong to the controller; kept by name so that a misspelt
    /// `resources:` is an error, not an empty file.
    pub other_sections: Vec<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawResourcesFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawResourcesFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping with a `resources:` list")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<RawResourcesFile, E> {
                Ok(RawResourcesFile::default())
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawResourcesFile, A::Error> {
                let mut file = RawResourcesFile::default();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    if key.value == "resources" {
                        file.resources = map.next_value::<Option<_>>()?.unwrap_or_default();
                    } else {
                        map.next_value::<IgnoredAny>()?;
                        file.other_sections.push(key);
                    }
                }
                Ok(file)
            }
        }
        d.deserialize_map(V)
    }
}

/// [`RESOURCE_FIELDS`], one line each, for the man page `xce-resources.yaml(5)`.
pub const RESOURCE_FIELD_DOCS: &[Field] = &[
    Field::new("name", "The resource's name, as the controller and lsload-like tools show it."),
    Field::new("desc", "What it is, for people (the controller's)."),
    Field::new("valtype", "numeric, string or boolean: a probe's output that does not parse as it is a failure, never 0."),
    Field::new("ordtype", "increasing or decreasing (the controller's; checked here)."),
    Field::new("flags", "The controller's flags; passed through, not read by the agent."),
    Field::new("interval", "How often the probe runs, a duration; present and above 0 makes the resource dynamic.").bounded(Bound::Interval(INTERVAL)),
    Field::new("resourcemap", "Where the resource exists: a list of instances, each `{location: [HOSTS...]}` (host names, node[001-128] ranges, `default`, `all`, `others`) with the controller's `value`."),
    Field::new("probe", "How this agent gets the value: a mapping whose fields are below."),
];

/// [`INSTANCE_FIELDS`], one line each.
pub const INSTANCE_FIELD_DOCS: &[Field] = &[
    Field::new(
        "location",
        "The hosts of this instance: a list (node001, node[001-128], default, all, others).",
    ),
    Field::new(
        "value",
        "The controller's static value for the instance; not read by the agent.",
    ),
];

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

/// Fields of a `resourcemap` entry the agent knows (`value` is the controller's).
pub const INSTANCE_FIELDS: &[&str] = &["location", "value"];

/// One `resourcemap` entry: one instance of the resource.
#[derive(Debug, Default)]
pub struct RawInstance {
    pub location: Option<Spanned<Vec<Spanned<String>>>>,
    /// Other keys: the controller may use them, unless they look like a misspelt field.
    pub unknown: Vec<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawInstance {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawInstance;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a resourcemap entry (a mapping with location and value)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawInstance, A::Error> {
                let mut entry = RawInstance::default();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    if key.value == "location" {
                        entry.location = map.next_value()?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                        if key.value != "value" {
                            entry.unknown.push(key);
                        }
                    }
                }
                Ok(entry)
            }
        }
        d.deserialize_map(V)
    }
}

/// Fields of `probe:`, which belong there and not on the resource.
pub fn probe_fields() -> &'static [&'static str] {
    field_names::<RawProbe>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::names::{names_of, near_miss, nearest};
    use crate::config::probe_spec::RawLimits;

    #[test]
    fn the_field_docs_are_the_lists_the_parser_reads() {
        assert_eq!(names_of(RESOURCE_FIELD_DOCS), RESOURCE_FIELDS);
        assert_eq!(names_of(INSTANCE_FIELD_DOCS), INSTANCE_FIELDS);
    }

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
        assert_eq!(near_miss("timout", probe_fields()), Some("timeout"));
        assert_eq!(near_miss("provide", probe_fields()), Some("provides"));
        assert_eq!(
            nearest("lod1", &["users", "load5", "load1", "load15"], 2),
            ["load1", "load5"]
        );
    }

    #[test]
    fn probe_fields_come_from_the_struct() {
        let fields = probe_fields();
        assert!(
            fields.contains(&"kind") && fields.contains(&"stale_after"),
            "{fields:?}"
        );
        assert_eq!(field_names::<RawLimits>().len(), 6);
    }
}
