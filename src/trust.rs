//! Which configuration files a root agent believes. agent.yaml, resources.yaml, the CA bundle
//! and the CRL decide what runs on this host and as whom, so a root agent reads them only when
//! nobody but root could have written them: the file and every directory above it pass the
//! scripts' rule ([`security::check_program`] with no `run_as` owner: root-owned, not writable
//! by group or other, a root-owned sticky directory such as `/tmp` allowed above), the way
//! sudo, cron and systemd treat their own files.
//!
//! Enforced only when the agent runs as root, as the script rule is ([`security::enforced`]):
//! a non-root agent runs everything as itself, so its files give nobody more than they have.
//!
//! `trust_config_files_of_any_owner: true` in agent.yaml waives the rule for resources.yaml,
//! the CA bundle and the CRL (a site whose resources.yaml sits on shared storage with
//! root_squash), never for agent.yaml itself: the switch is honoured only from a file that
//! passes, else whoever could write agent.yaml could turn the rule off. Every load that uses
//! it warns, naming each file it let through and why.

use std::path::{Path, PathBuf};

use crate::config::{AgentConfig, ConfigError, ConfigErrors, Pos};
use crate::probe::security::{self, InsecureProgram, Problem};

/// The agent.yaml switch, as written there.
pub const OPT_OUT: &str = "trust_config_files_of_any_owner";

/// What a configuration file is, for the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Agent,
    Resources,
    TlsCa,
    TlsCrl,
}

impl Role {
    fn what(self) -> &'static str {
        match self {
            Role::Agent => "agent.yaml",
            Role::Resources => "resources.yaml",
            Role::TlsCa => "the TLS CA bundle (tls: ca:)",
            Role::TlsCrl => "the TLS CRL (tls: crl:)",
        }
    }
}

/// Why `file` is not trusted, with the fix; `None` when it passes. A file that is not there
/// is left to the load, which says so in its own words.
fn verdict(file: &Path) -> Option<InsecureProgram> {
    let file = if file.is_absolute() {
        file.to_owned()
    } else {
        std::env::current_dir().unwrap_or_default().join(file)
    };
    match security::check_program(&file, None) {
        Err(e) if matches!(e.problem, Problem::Missing(_)) => None,
        r => r.err(),
    }
}

/// The reason, without the scripts' "refusing to run".
fn reason(e: &InsecureProgram) -> String {
    let at = e.path.display();
    let which = if e.path == e.program {
        format!("{at}")
    } else {
        format!("{at} (a directory above it)")
    };
    match &e.problem {
        Problem::WritableByOthers { mode } => format!(
            "{which} is writable by group or other (mode {:04o}); fix: chmod go-w {at}",
            mode & 0o7777
        ),
        Problem::BadOwner { uid } => {
            format!("{which} is owned by uid {uid}, not root; fix: chown root {at}")
        }
        Problem::NotRegularFile => format!("{at} is not a regular file"),
        Problem::Missing(why) => format!("cannot check {at}: {why}"),
        Problem::TooManySymlinks => format!("{at}: too many levels of symbolic links"),
        // The walk of a file gives none of these (they are about a probe's env: and text).
        Problem::CodeLoadingEnv { .. }
        | Problem::Creatable { .. }
        | Problem::SharedSearchDir { .. }
        | Problem::ProgramText { .. }
        | Problem::Changed => e.to_string(),
    }
}

fn refusal(role: Role, file: &Path, e: &InsecureProgram) -> ConfigError {
    let waiver = if role == Role::Agent {
        String::new()
    } else {
        format!(
            " (where {} cannot be root's, e.g. on shared storage with root_squash: \
             `{OPT_OUT}: true` in agent.yaml, see docs/security.md)",
            role.what()
        )
    };
    ConfigError::new(
        file,
        Pos::default(),
        format!(
            "not trusted: a root agent reads {} only when nobody but root can change it: {}{waiver}",
            role.what(),
            reason(e)
        ),
    )
}

/// agent.yaml, before anything in it is believed (its own opt-out included).
pub fn check_agent_file(path: &Path) -> Result<(), ConfigErrors> {
    if !security::enforced() {
        return Ok(());
    }
    match verdict(path) {
        None => Ok(()),
        Some(e) => Err(refusal(Role::Agent, path, &e).into()),
    }
}

/// The files agent.yaml names that decide what runs as whom: resources.yaml, the CA bundle
/// and the CRL.
fn named_files(agent: &AgentConfig) -> Vec<(Role, PathBuf)> {
    let mut files = vec![(Role::Resources, agent.resources.clone())];
    if let Some(tls) = &agent.tls {
        files.push((Role::TlsCa, tls.ca.clone()));
        if let Some(crl) = &tls.crl {
            files.push((Role::TlsCrl, crl.clone()));
        }
    }
    files
}

/// The files agent.yaml names, checked unless [`OPT_OUT`] waives them (resources.yaml is the
/// one actually read, a `--resources` override included).
pub fn check_named_files(agent: &AgentConfig) -> Result<(), ConfigErrors> {
    if !security::enforced() || agent.trust_config_files_of_any_owner {
        return Ok(());
    }
    let errors: Vec<ConfigError> = named_files(agent)
        .into_iter()
        .filter_map(|(role, file)| verdict(&file).map(|e| refusal(role, &file, &e)))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

/// What [`OPT_OUT`] lets through, one warning each (the first says the switch is on, even
/// when every file would pass today): `check` prints them and the daemon logs them at WARN
/// at start and at every reload. Empty when the switch is off.
pub fn waived(agent: &AgentConfig) -> Vec<String> {
    if !agent.trust_config_files_of_any_owner {
        return Vec::new();
    }
    let mut out = vec![format!(
        "{OPT_OUT}: true: resources.yaml, the CA bundle and the CRL are believed whoever owns \
         them; anyone who can write one decides what this host runs and as whom{}",
        if security::enforced() {
            ""
        } else {
            " (this agent is not root: nothing is enforced anyway)"
        }
    )];
    for (role, file) in named_files(agent) {
        if let Some(e) = verdict(&file) {
            out.push(format!(
                "{OPT_OUT}: {} {} is believed although {}",
                role.what(),
                file.display(),
                reason(&e)
            ));
        }
    }
    out
}
