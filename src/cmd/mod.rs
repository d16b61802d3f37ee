//! The binary's commands, one module each. A command prints its own results and returns the
//! process's exit code, or a [`CmdError`] that the binary prints and exits by
//! ([`CmdError::exit_code`]). What they print is built in [`crate::render`].

pub mod assets;
pub mod check;
pub mod daemon;
pub mod listen;
pub mod once;
pub mod probe;
pub mod runtime;
pub mod status;
mod strict;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::{Cli, Command, Common};
use crate::config::hostlist::{self, InvalidHostName};
use crate::config::Config;
use crate::plan::Plan;
use crate::probe::{builtin, BuiltinSource};
use crate::value::Reading;

/// The process's exit codes, every command's, in one place.
pub mod exit {
    pub const OK: u8 = 0;
    /// `--once`, `probe NAME`: a probe failed.
    pub const PROBE_FAILED: u8 = 1;
    /// `status`: a resource failed or is stale, or the link to the controller is down.
    pub const TROUBLE: u8 = 1;
    /// The configuration is invalid, or the command could not do its work (a port that
    /// cannot be bound included); `status`: could not ask (permission denied, bad config,
    /// unreadable answer).
    pub const CONFIG: u8 = 2;
    /// `status`: nothing answers on the socket.
    pub const NOT_RUNNING: u8 = 3;
    /// `check`: both files are valid, but this host cannot run its plan as written (a
    /// script refused or missing, an unknown `run_as` user, a certificate problem): the
    /// files may be right for other hosts. A file that cannot be read, parsed or trusted
    /// is [`CONFIG`].
    pub const HOST_PROBLEMS: u8 = 1;
}

/// Why a command could not run. The binary prints it with its causes (`{:#}`).
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// Whole in its message (no source): a reload logs it on one line.
    #[error("cannot read this machine's host name: {0}")]
    HostNameUnreadable(nix::Error),
    #[error("this machine's host name: {0}; set `host:` in agent.yaml")]
    HostNameInvalid(InvalidHostName),
    #[error("cannot install signal handlers")]
    Signals,
    #[error("metrics: cannot listen on {addr}")]
    MetricsBind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("status socket (status_socket: in agent.yaml)")]
    StatusSocket(#[source] crate::status::server::BindError),
    #[error("listen --unix: the worker's socket")]
    UnixDoor(#[source] crate::status::server::BindError),
    #[error("cannot listen on {addr}")]
    ListenBind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write assets into {}", .dir.display())]
    Assets {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] crate::link::tls::TlsError),
    #[error(transparent)]
    Ca(#[from] crate::tls_ca::CaError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Writing the output, or the listener's own address.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl CmdError {
    /// Every failure to run is reported as a configuration error today: the admin's next
    /// step is the config (a port, a path, a certificate) in each case.
    pub fn exit_code(&self) -> u8 {
        exit::CONFIG
    }
}

/// Run the command `cli` names (the daemon without one), with `common`, its options merged
/// ([`Cli::effective_common`]); the process's exit code, or why the command could not run.
pub async fn dispatch(cli: &Cli, common: &Common) -> Result<u8, CmdError> {
    match &cli.command {
        Some(Command::Check { .. }) => check::run(common).await,
        Some(Command::Probe { name, .. }) => probe::run(common, name).await,
        Some(Command::Listen {
            addr,
            unix,
            unix_uids,
            format,
            ack,
            only,
            refresh,
            tls,
            budget,
            ..
        }) => {
            let doors = listen::Doors {
                addr: addr.as_deref(),
                unix: unix.as_deref(),
                unix_uids,
            };
            listen::run(doors, *format, *ack, only, *refresh, tls, budget).await
        }
        Some(Command::Status {
            format,
            watch,
            names,
            ..
        }) => Ok(status::run(common, *format, *watch, names).await),
        Some(Command::Tls { command }) => tls::run(command),
        Some(Command::GenerateAssets { dir }) => assets::run(dir),
        None if cli.once => once::run(common, cli.format, &cli.only).await,
        None => daemon::run(common).await,
    }
}

/// This host's name: `--host`, else agent.yaml's `host`, else the machine's.
pub fn host_name(common: &Common, config: &Config) -> Result<String, CmdError> {
    if let Some(h) = common.host.clone().or_else(|| config.agent.host.clone()) {
        return Ok(h);
    }
    let h = nix::unistd::gethostname().map_err(CmdError::HostNameUnreadable)?;
    let h = h.to_string_lossy().into_owned();
    // The hello carries it: a name a receiver would refuse is better refused here, with the fix.
    hostlist::validate_host_name(&h).map_err(CmdError::HostNameInvalid)?;
    Ok(h)
}

/// Load both files; on error print every problem with its position and return None. What
/// `trust_config_files_of_any_owner` lets through is logged at WARN.
pub fn load(common: &Common) -> Option<Config> {
    let config = load_files(common)?;
    for w in crate::trust::waived(&config.agent) {
        tracing::warn!("{w}");
    }
    Some(config)
}

/// [`load`] without the warnings (`check` prints them in its report).
pub fn load_files(common: &Common) -> Option<Config> {
    match crate::daemon::load_config(&common.config, common.resources.as_deref()) {
        Ok(c) => {
            for (res, field, pos) in &c.resources.ignored_fields {
                tracing::debug!(
                    "{}:{}:{}: field `{field}` of {res:?} is not used by the agent",
                    c.resources.path.display(),
                    pos.line,
                    pos.column
                );
            }
            Some(c)
        }
        Err(errors) => {
            eprintln!("{errors}");
            let n = errors.0.len();
            eprintln!(
                "xce-agent: configuration invalid ({n} error{})",
                if n == 1 { "" } else { "s" }
            );
            None
        }
    }
}

/// `NAME is not probed on HOST: why`, on stderr, for the commands that take resource names.
fn refuse_unprobed(config: &Config, plan: &Plan, name: &str) -> u8 {
    let why = crate::plan::why_not_probed(&config.resources, plan, name);
    eprintln!("xce-agent: {name} is not probed on {}: {why}", plan.host);
    exit::CONFIG
}

/// The builtin indices for a one-shot command: two samples a second apart (so rates and
/// averages have a first value) when a probe needs them, none otherwise.
async fn one_shot_builtins(needed: bool) -> Arc<dyn BuiltinSource> {
    if needed {
        Arc::new(builtin::sample_once(builtin::Roots::host(), Duration::from_secs(1)).await)
    } else {
        Arc::new(NoBuiltins)
    }
}

/// For runs without builtin probes: no sampler is started.
struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}
