//! The typed resources.yaml: what each resource is, where its instances are, how to probe it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;

use super::error::{ConfigErrors, Errors, Pos};
use super::hostlist;
use super::limits::{check_interval, Bounds, INTERVAL};
use super::names::near_miss;
use super::probe_spec::{self, ProbeKind, ProbeSpec, RawProbe};
use super::raw::{probe_fields, RawResource, RawResourcesFile, INSTANCE_FIELDS, RESOURCE_FIELDS};
use super::recover::{self, Items};
use super::scalar::format_duration;
use super::yaml::parse_yaml;
use crate::value::Valtype;

#[derive(Debug, Clone)]
pub struct Resources {
    pub path: PathBuf,
    pub resources: Vec<Resource>,
    /// Fields the agent does not use, for a debug log line: (resource, field, position).
    pub ignored_fields: Vec<(String, String, Pos)>,
}

impl Resources {
    pub fn get(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }

    /// Builtin probes must name an index the agent knows. The catalogue is passed in so that
    /// config stays below the probes in the layering.
    pub fn check_builtin_indices(&self, known: &[&str]) -> Result<(), ConfigErrors> {
        let mut errs = Errors::new(&self.path);
        for r in &self.resources {
            if let Some(ProbeSpec {
                kind: ProbeKind::Builtin { index },
                pos,
                ..
            }) = &r.probe
            {
                if !known.contains(&index.as_str()) {
                    errs.at(
                        *pos,
                        format!(
                            "unknown builtin index {index:?} for {:?}; known: {}",
                            r.name,
                            known.join(", ")
                        ),
                    );
                }
            }
        }
        errs.finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordtype {
    Increasing,
    Decreasing,
}

#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    pub pos: Pos,
    pub desc: Option<String>,
    pub valtype: Valtype,
    pub ordtype: Option<Ordtype>,
    /// `None`: a static resource; the agent does not report it.
    pub interval: Option<Duration>,
    pub instances: Vec<Instance>,
    pub probe: Option<ProbeSpec>,
}

impl Resource {
    pub fn is_dynamic(&self) -> bool {
        self.interval.is_some()
    }
}

/// One `resourcemap` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub location: Location,
    /// The location as written, joined by commas: the instance's name on the wire.
    pub label: String,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// Every host has its own instance.
    Default,
    /// One instance shared by every host.
    All,
    /// One instance shared by the hosts no other entry names.
    Others,
    /// One instance shared by these hosts (ranges expanded), in the order written: the first
    /// is the one that probes it.
    Hosts(Vec<String>),
}

/// Why a name breaks LSF's resource-name rules (config and the wire apply the same ones).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("resource name is empty")]
    Empty,
    #[error("resource name {0:?} is longer than 39 characters")]
    TooLong(String),
    #[error("resource name {0:?} must start with a letter or '_' and contain only letters, digits and '_'")]
    BadCharacters(String),
}

/// LSF resource-name rules: at most 39 characters, a letter or `_` first, then letters,
/// digits and `_` (no operators, which would break resource requirement strings).
pub fn check_resource_name(name: &str) -> Result<(), NameError> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let first_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if name.is_empty() {
        Err(NameError::Empty)
    } else if name.len() > 39 {
        Err(NameError::TooLong(name.to_owned()))
    } else if !first_ok || !ok_chars {
        Err(NameError::BadCharacters(name.to_owned()))
    } else {
        Ok(())
    }
}

pub fn parse(path: &Path, text: &str) -> Result<Resources, ConfigErrors> {
    parse_with(path, text, &Bounds::default())
}

/// Parse with the bounds agent.yaml sets (the longest interval).
pub fn parse_with(path: &Path, text: &str, bounds: &Bounds) -> Result<Resources, ConfigErrors> {
    let (raw, shape_errors): (RawResourcesFile, _) =
        recover::parse_all(text, Items::ResourceEntries, |t| parse_yaml(path, t))?;
    let mut errs = Errors::new(path);
    errs.list.extend(shape_errors);
    for key in &raw.other_sections {
        if near_miss(&key.value, &["resources"]).is_some() {
            errs.at(
                Pos::of(key),
                format!("unknown section `{}`; did you mean `resources`?", key.value),
            );
        }
    }
    let mut out = Resources {
        path: path.to_owned(),
        resources: Vec::new(),
        ignored_fields: Vec::new(),
    };
    let mut first_pos: BTreeMap<String, Pos> = BTreeMap::new();
    let mut raw_probes = Vec::new();
    for entry in &raw.resources {
        // Duplicates are found on the raw names, so a broken first entry still counts.
        if let Some(name) = &entry.value.name {
            if let Some(prev) = first_pos.get(&name.value) {
                errs.at(
                    Pos::of(name),
                    format!(
                        "duplicate resource {:?}: already defined at line {}",
                        name.value, prev.line
                    ),
                );
                continue;
            }
            first_pos.insert(name.value.clone(), Pos::of(name));
        }
        if let Some(res) = resource(&mut errs, entry, &mut out.ignored_fields, bounds) {
            raw_probes.push(entry.value.probe.as_ref());
            out.resources.push(res);
        }
    }
    check_provides(&mut errs, &out.resources, &raw_probes);
    probe_spec::forget_compiled_patterns();
    errs.finish()?;
    Ok(out)
}

fn resource(
    errs: &mut Errors,
    entry: &Spanned<RawResource>,
    ignored: &mut Vec<(String, String, Pos)>,
    bounds: &Bounds,
) -> Option<Resource> {
    let raw = &entry.value;
    let pos = Pos::of(entry);
    let before = errs.list.len();
    for key in &raw.duplicate {
        errs.at(
            Pos::of(key),
            format!("field `{}` is given twice", key.value),
        );
    }
    let Some(name) = &raw.name else {
        errs.at(pos, "resource has no `name`");
        return None;
    };
    if let Err(e) = check_resource_name(&name.value) {
        errs.at(Pos::of(name), e.to_string());
    }
    for key in &raw.unknown {
        if probe_fields().contains(&key.value.as_str()) {
            // Dedented out of `probe:`: silently ignoring it would leave a probe-less resource.
            errs.at(
                Pos::of(key),
                format!(
                    "`{}` belongs under `probe:` (indent it two more spaces than `probe:`)",
                    key.value
                ),
            );
            continue;
        }
        match near_miss(&key.value, RESOURCE_FIELDS) {
            Some(known) => errs.at(
                Pos::of(key),
                format!(
                    "unknown field `{}` in resource {:?}; did you mean `{known}`?",
                    key.value, name.value
                ),
            ),
            None => ignored.push((name.value.clone(), key.value.clone(), Pos::of(key))),
        }
    }
    let valtype = match &raw.valtype {
        None => Valtype::Numeric,
        Some(v) => Valtype::from_name(&v.value).unwrap_or_else(|| {
            errs.at(
                Pos::of(v),
                format!(
                    "unknown valtype {:?}; expected one of numeric, string, boolean",
                    v.value
                ),
            );
            Valtype::Numeric
        }),
    };
    let ordtype = raw.ordtype.as_ref().and_then(|o| {
        let t = match o.value.as_str() {
            "increasing" => Some(Ordtype::Increasing),
            "decreasing" => Some(Ordtype::Decreasing),
            _ => {
                errs.at(
                    Pos::of(o),
                    format!(
                        "unknown ordtype {:?}; expected increasing or decreasing",
                        o.value
                    ),
                );
                None
            }
        };
        if t.is_some() && valtype != Valtype::Numeric {
            errs.at(
                Pos::of(o),
                format!("ordtype applies only to numeric resources, not {valtype}"),
            );
        }
        t
    });
    let interval = raw
        .interval
        .as_ref()
        .and_then(|i| match i.value.to_duration() {
            Ok(d) if d.is_zero() => None,
            Ok(d) if d < INTERVAL.min => {
                errs.at(
                    Pos::of(i),
                    format!(
                        "interval must be at least {}",
                        format_duration(INTERVAL.min)
                    ),
                );
                None
            }
            Ok(d) => check_interval(d, bounds)
                .map_err(|e| errs.at(Pos::of(i), e))
                .ok(),
            Err(e) => {
                errs.at(Pos::of(i), format!("bad interval: {e}"));
                None
            }
        });
    let instances = instances(errs, raw, &name.value, pos);
    let probe = raw.probe.as_ref().and_then(|p| {
        if interval.is_none() && raw.interval.is_none() {
            errs.at(
                Pos::of(p),
                format!(
                    "resource {:?} has a probe but no interval: a static resource is never probed; add `interval:`",
                    name.value
                ),
            );
        }
        let mut probe = probe_spec::probe(errs, p, &name.value)?;
        if let Some(spec) = probe.kind.exec_spec_mut() {
            spec.limits.pids = spec.limits.pids.or(bounds.probe_pids_max);
        }
        Some(probe)
    });
    if errs.list.len() > before {
        return None;
    }
    Some(Resource {
        name: name.value.clone(),
        pos: Pos::of(name),
        desc: raw.desc.clone(),
        valtype,
        ordtype,
        interval,
        instances,
        probe,
    })
}

fn instances(errs: &mut Errors, raw: &RawResource, name: &str, pos: Pos) -> Vec<Instance> {
    let Some(map) = &raw.resourcemap else {
        // No resourcemap: LSF's default is a per-host resource.
        return vec![Instance {
            location: Location::Default,
            label: "default".into(),
            pos,
        }];
    };
    let mut out: Vec<Instance> = Vec::new();
    // host key -> (resourcemap entry, where it was named)
    let mut owner: BTreeMap<String, (usize, Pos)> = BTreeMap::new();
    for (entry_idx, entry) in map.value.iter().enumerate() {
        for key in &entry.value.unknown {
            if let Some(known) = near_miss(&key.value, INSTANCE_FIELDS) {
                errs.at(
                    Pos::of(key),
                    format!("unknown field `{}`; did you mean `{known}`?", key.value),
                );
            }
        }
        let Some(loc) = &entry.value.location else {
            errs.at(
                Pos::of(entry),
                format!("resourcemap entry of {name:?} has no `location`"),
            );
            continue;
        };
        if loc.value.is_empty() {
            errs.at(
                Pos::of(loc),
                "empty location: expected default, all, others or host names",
            );
            continue;
        }
        let words: Vec<&str> = loc.value.iter().map(|s| s.value.as_str()).collect();
        let label = words.join(",");
        // The label is the instance's name on the wire: the receiver applies the same rule.
        if let Err(e) = hostlist::check_instance_name(&label) {
            errs.at(Pos::of(loc), e);
            continue;
        }
        let special = words
            .iter()
            .find(|w| matches!(**w, "default" | "all" | "others"));
        let location = match special {
            Some(w) if words.len() > 1 => {
                errs.at(
                    Pos::of(loc),
                    format!(
                        "`{w}` must be the only word of its location, not mixed with host names"
                    ),
                );
                continue;
            }
            Some(&"default") => Location::Default,
            Some(&"all") => Location::All,
            Some(_) => Location::Others,
            None => {
                let mut hosts = Vec::new();
                for word in &loc.value {
                    match hostlist::expand(&word.value) {
                        Ok(hs) => {
                            for h in hs {
                                let key = hostlist::host_key(&h);
                                match owner.get(&key) {
                                    Some((entry_no, prev)) if *entry_no != entry_idx => errs.at(
                                        Pos::of(word),
                                        format!(
                                            "host {h:?} is in two instances of {name:?} (also at line {})",
                                            prev.line
                                        ),
                                    ),
                                    Some(_) => {}
                                    None => {
                                        owner.insert(key, (entry_idx, Pos::of(word)));
                                    }
                                }
                                hosts.push(h);
                            }
                        }
                        Err(e) => errs.at(Pos::of(word), e),
                    }
                }
                Location::Hosts(hosts)
            }
        };
        if let Some(prev) = out.iter().find(|i| {
            std::mem::discriminant(&i.location) == std::mem::discriminant(&location)
                && !matches!(location, Location::Hosts(_))
        }) {
            errs.at(
                Pos::of(loc),
                format!(
                    "`{label}` is given twice for {name:?} (also at line {})",
                    prev.pos.line
                ),
            );
            continue;
        }
        out.push(Instance {
            location,
            label,
            pos: Pos::of(loc),
        });
    }
    let has = |want: fn(&Location) -> bool| out.iter().find(|i| want(&i.location));
    if let Some(all) = has(|l| matches!(l, Location::All)) {
        if out.len() > 1 {
            errs.at(
                all.pos,
                format!("`all` already covers every host: {name:?} cannot have other instances"),
            );
        }
    }
    if let (Some(_), Some(others)) = (
        has(|l| matches!(l, Location::Default)),
        has(|l| matches!(l, Location::Others)),
    ) {
        errs.at(
            others.pos,
            format!(
                "{name:?} has both `default` and `others`: every unnamed host would be in both"
            ),
        );
    }
    out
}

/// Multi-value probes: each provided name must be a declared dynamic resource without a probe
/// of its own, fed by one probe only. Its resourcemap is its own: one probe may feed host and
/// shared resources (an LSF ELIM reports both), and the plan sends each to its instance.
fn check_provides(errs: &mut Errors, resources: &[Resource], raw: &[Option<&Spanned<RawProbe>>]) {
    let by_name: BTreeMap<&str, &Resource> =
        resources.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut fed_by: BTreeMap<&str, &str> = BTreeMap::new();
    for (res, raw) in resources.iter().zip(raw) {
        let Some(p) = &res.probe else { continue };
        let list_pos = raw
            .and_then(|r| r.value.provides.as_ref())
            .map(Pos::of)
            .unwrap_or(p.pos);
        let mut seen = BTreeSet::new();
        for name in &p.provides {
            if !seen.insert(name) {
                continue;
            }
            if name != &res.name {
                match by_name.get(name.as_str()) {
                    None => {
                        errs.at(
                            list_pos,
                            format!(
                                "`provides` names {name:?}, which is not declared in this file"
                            ),
                        );
                        continue;
                    }
                    Some(other) if !other.is_dynamic() => {
                        errs.at(
                            list_pos,
                            format!("`provides` names {name:?}, which is static (no interval)"),
                        );
                        continue;
                    }
                    Some(other) if other.probe.is_some() => {
                        errs.at(
                            list_pos,
                            format!("`provides` names {name:?}, which has its own probe"),
                        );
                        continue;
                    }
                    _ => {}
                }
            }
            if let Some(prev) = fed_by.insert(name.as_str(), res.name.as_str()) {
                if prev != res.name {
                    errs.at(
                        list_pos,
                        format!("{name:?} is already provided by the probe of {prev:?}"),
                    );
                }
            }
        }
    }
}
