//! Loading and validating agent.yaml and resources.yaml. Every error carries file:line:column.
//!
//! Layers, each file importing only those before it (the test at the foot of this file holds
//! every file to its `ORDER`), split by what a file knows, not by when it runs in a load:
//! - vocabulary: `error` (positions, the errors), `scalar` (values as written: durations,
//!   sizes, counts), `pattern`, `hostlist`, `limits` (the bound of every number), `names`
//!   (the field tables' rows, field names, near misses);
//! - reading YAML: `yaml_hint` -> `yaml` (the parser's budget, its errors said plainly),
//!   `recover` (every error in one pass);
//! - field shapes: `stdio`, `probe_output` (command, format, select) -> `kind_spec` (what
//!   each probe kind runs or reads, validated);
//! - the probe: `probe_spec` (the kind and field tables; `probe:` validated);
//! - the files: `raw` -> `resources` (resources.yaml), `agent` (agent.yaml);
//! - this module: reading both files and loading them together.
//!
//! Outside `config` it imports only `value` and `output` (the parsers of what probes
//! print), which sit below it in the crate's layering (see `lib.rs`).

pub mod agent;
pub mod error;
pub mod hostlist;
pub mod kind_spec;
pub mod limits;
pub mod names;
pub mod pattern;
mod probe_output;
pub mod probe_spec;
mod raw;
mod recover;
pub mod resources;
pub mod scalar;
mod shell;
pub mod stdio;
mod yaml;
mod yaml_hint;

pub use names::{near_miss, nearest};
pub use raw::{INSTANCE_FIELDS, INSTANCE_FIELD_DOCS, RESOURCE_FIELDS, RESOURCE_FIELD_DOCS};

use std::path::{Path, PathBuf};

pub use crate::output::Format;
pub use agent::AgentConfig;
pub use error::{ConfigError, ConfigErrors, Pos};
pub use kind_spec::{Capturer, ExecSpec, FileSpec, Limits, StreamSpec};
pub use probe_spec::{ProbeKind, ProbeSpec};
pub use resources::{Instance, Location, Resource, Resources};
pub use stdio::{StdinMode, StdoutMode};

/// agent.yaml where none is named: where the packages install it. `xce-agent` reads it, and
/// `status` looks for the daemon that runs with it.
pub const DEFAULT_AGENT_YAML: &str = "/etc/xce/agent.yaml";
/// The environment variable that names agent.yaml (`--config` wins over it).
pub const AGENT_YAML_ENV: &str = "XCE_AGENT_CONFIG";

/// Both files, validated together.
#[derive(Debug, Clone)]
pub struct Config {
    pub agent: AgentConfig,
    pub resources: Resources,
    /// FNV-1a of both files' bytes: the controller sees which config an agent runs.
    pub digest: String,
}

use yaml::MAX_CONFIG_BYTES;

fn read(path: &Path) -> Result<String, ConfigError> {
    let whole = || ConfigError::new(path, Pos::default(), "");
    let meta = std::fs::metadata(path).map_err(|e| ConfigError {
        message: format!("cannot read: {e}"),
        ..whole()
    })?;
    if !meta.is_file() {
        return Err(ConfigError {
            message: "not a regular file".into(),
            ..whole()
        });
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError {
            message: format!(
                "file is {} bytes; the limit is {MAX_CONFIG_BYTES}",
                meta.len()
            ),
            ..whole()
        });
    }
    let bytes = std::fs::read(path).map_err(|e| ConfigError {
        message: format!("cannot read: {e}"),
        ..whole()
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let upto = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = upto.iter().filter(|b| **b == b'\n').count() as u64 + 1;
        let column = upto.iter().rev().take_while(|b| **b != b'\n').count() as u64 + 1;
        ConfigError::new(path, Pos { line, column }, "file is not valid UTF-8")
    })
}

pub fn load_agent(path: &Path) -> Result<(AgentConfig, String), ConfigErrors> {
    let text = read(path)?;
    Ok((agent::parse(path, &text)?, text))
}

pub fn load_resources(path: &Path) -> Result<(Resources, String), ConfigErrors> {
    load_resources_with(path, &limits::Bounds::default())
}

pub fn load_resources_with(
    path: &Path,
    bounds: &limits::Bounds,
) -> Result<(Resources, String), ConfigErrors> {
    let text = read(path)?;
    Ok((resources::parse_with(path, &text, bounds)?, text))
}

/// Load agent.yaml and the resources.yaml it names (or `resources_override`).
pub fn load(agent_path: &Path, resources_override: Option<&Path>) -> Result<Config, ConfigErrors> {
    let (mut agent, agent_text) = match load_agent(agent_path) {
        Ok(loaded) => loaded,
        Err(mut errors) => {
            // Every error at once, across both files: resources.yaml's too, wherever
            // agent.yaml (broken as it is) or --resources still says it is.
            let resources = resources_override
                .map(Path::to_owned)
                .or_else(|| agent::resources_path_of(agent_path));
            if let Some(Err(more)) = resources.map(|r| load_resources(&r)) {
                errors.0.extend(more.0);
            }
            return Err(errors);
        }
    };
    if let Some(r) = resources_override {
        agent.resources = PathBuf::from(r);
    }
    let (resources, res_text) = load_resources_with(&agent.resources, &agent.bounds())?;
    let digest = format!(
        "{:016x}",
        fnv1a(&[agent_text.as_bytes(), b"\0", res_text.as_bytes()])
    );
    Ok(Config {
        agent,
        resources,
        digest,
    })
}

/// FNV-1a 64: stable across Rust versions and machines, unlike `DefaultHasher`, which matters
/// for digests and for the cluster-wide splay.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// `config`'s files, each importing only those before it.
    pub const ORDER: &[&str] = &[
        "error",
        "scalar",
        "pattern",
        "hostlist",
        "limits",
        "names",
        "yaml_hint",
        "yaml",
        "recover",
        "stdio",
        "probe_output",
        "kind_spec",
        "shell",
        "probe_spec",
        "raw",
        "resources",
        "agent",
        "mod",
    ];

    /// What `config` may import from the rest of the crate: the layers below it.
    const BELOW: &[&str] = &["output", "value"];

    /// A file's code without its tests and comments, which may name anything.
    fn code_of(path: &Path) -> String {
        let text = std::fs::read_to_string(path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        code.lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn every_file_imports_only_the_layers_below_it() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut ordered: Vec<String> = ORDER.iter().map(|f| (*f).to_owned()).collect();
        ordered.sort();
        assert_eq!(
            files, ordered,
            "every file of src/config has its place in ORDER"
        );
        let sibling = regex::Regex::new(r"\b(?:super|crate::config)::(\w+)").unwrap();
        let outside = regex::Regex::new(r"\bcrate::(\w+)").unwrap();
        let mut wrong = Vec::new();
        for (rank, file) in ORDER.iter().enumerate() {
            let code = code_of(&dir.join(format!("{file}.rs")));
            for cap in sibling.captures_iter(&code) {
                // A name that is no file is mod.rs's (a re-export): the top, never below.
                let to = ORDER
                    .iter()
                    .position(|f| *f == &cap[1])
                    .unwrap_or(ORDER.len());
                if *file != "mod" && to >= rank {
                    wrong.push(format!("{file} -> {}", &cap[1]));
                }
            }
            for cap in outside.captures_iter(&code) {
                if cap[1] != *"config" && !BELOW.contains(&&cap[1]) {
                    wrong.push(format!("{file} -> crate::{}", &cap[1]));
                }
            }
        }
        assert!(wrong.is_empty(), "imports against the layering: {wrong:?}");
    }
}
