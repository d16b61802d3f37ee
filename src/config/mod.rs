//! Loading and validating agent.yaml and resources.yaml. Every error carries file:line:column.

pub mod agent;
pub mod error;
pub mod hostlist;
pub mod limits;
pub mod pattern;
mod probe_output;
pub mod probe_spec;
mod raw;
mod recover;
mod shell;
pub use raw::{
    near_miss, nearest, INSTANCE_FIELDS, INSTANCE_FIELD_DOCS, RESOURCE_FIELDS, RESOURCE_FIELD_DOCS,
};
pub mod resources;
pub mod scalar;
pub mod stdio;
mod yaml_hint;

use std::path::{Path, PathBuf};

pub use agent::AgentConfig;
pub use error::{ConfigError, ConfigErrors, Pos};
pub use resources::{
    ExecSpec, FileSpec, Format, Instance, Limits, Location, ProbeKind, ProbeSpec, Resource,
    Resources, StreamSpec,
};
pub use stdio::{StdinMode, StdoutMode};

/// Both files, validated together.
#[derive(Debug, Clone)]
pub struct Config {
    pub agent: AgentConfig,
    pub resources: Resources,
    /// FNV-1a of both files' bytes: the controller sees which config an agent runs.
    pub digest: String,
}

use limits::MAX_CONFIG_BYTES;

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
