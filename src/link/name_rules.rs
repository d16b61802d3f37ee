//! A frame's names against the rules resources.yaml is held to (the same functions), and a
//! hello's free text against its length bound: names are data, never markup, so one resval
//! is always one output line wherever it is printed.

use super::frame_limits::MAX_HELLO_TEXT;
use super::wire::Hello;
use crate::config::hostlist::{
    check_instance_name, validate_host_name, InstanceNameError, InvalidHostName,
};
use crate::config::resources::{check_resource_name, NameError};

/// Why a hello is refused: which field broke which rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("hello host: {0}")]
    Host(InvalidHostName),
    #[error("hello {field} of {len} bytes is longer than {MAX_HELLO_TEXT}")]
    TextTooLong { field: &'static str, len: usize },
    #[error("hello declares {0}")]
    Declared(PairError),
}

/// Why a (resource, instance) pair is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    #[error(transparent)]
    Resource(#[from] NameError),
    #[error(transparent)]
    Instance(#[from] InstanceNameError),
}

/// A hello's names against the resource-name rules (the host by RFC 1123 as in
/// resources.yaml, each resource by LSF's rule, each instance by the location syntax) and its
/// free-text fields against their length bound.
pub fn check_hello(h: &Hello) -> Result<(), HelloError> {
    validate_host_name(&h.host).map_err(HelloError::Host)?;
    for (field, value) in [
        ("agentVersion", &h.agent_version),
        ("bootId", &h.boot_id),
        ("configDigest", &h.config_digest),
    ] {
        if value.len() > MAX_HELLO_TEXT {
            return Err(HelloError::TextTooLong {
                field,
                len: value.len(),
            });
        }
    }
    for d in &h.resources {
        check_names(&d.name, &d.instance).map_err(HelloError::Declared)?;
    }
    Ok(())
}

/// One (resource, instance) pair against the name rules, as resvals and welcomes carry them.
pub fn check_names(name: &str, instance: &str) -> Result<(), PairError> {
    check_resource_name(name)?;
    Ok(check_instance_name(instance)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::wire::Declared;
    use crate::value::Valtype;

    fn hello(host: &str, name: &str, instance: &str) -> Hello {
        Hello::new(
            host,
            "boot",
            "digest",
            vec![Declared {
                name: name.into(),
                instance: instance.into(),
                valtype: Valtype::Numeric,
                interval_ms: 1000,
                shared: !instance.is_empty(),
            }],
        )
    }

    #[test]
    fn a_hello_with_names_by_the_rules_passes() {
        assert_eq!(check_hello(&hello("node001.hpc", "gpu_free", "")), Ok(()));
        assert_eq!(
            check_hello(&hello("node001", "lic", "node[001-004],login1")),
            Ok(())
        );
    }

    #[test]
    fn names_that_could_carry_markup_are_refused() {
        let forged = "evil\nnode042 gpu_free ok 8 seq=1 full\nnode042";
        let cases = [
            hello(forged, "gpu", ""),
            hello("node001", "gpu\nfake", ""),
            hello("node001", "9lives", ""),
            hello("node001", &"x".repeat(40), ""),
            hello("node001", "gpu", "all\u{1b}[2J"),
            hello("", "gpu", ""),
        ];
        for h in cases {
            assert!(check_hello(&h).is_err(), "accepted {h:?}");
        }
        let mut h = hello("node001", "gpu", "");
        h.agent_version = "v".repeat(MAX_HELLO_TEXT + 1);
        assert!(check_hello(&h)
            .unwrap_err()
            .to_string()
            .contains("agentVersion"));
    }
}
