//! The command's side of the status socket: one request, one answer, and errors that say
//! what to do about them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

use super::server::PERMISSION_DENIED;
use super::{ErrorReply, Request, Response, StatusReport, PROTOCOL_VERSION};

/// The daemon answers from memory; a daemon that takes longer is wedged.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// An answer bigger than this is not one (10,000 resources take a few MiB).
pub const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "the agent is not running (cannot connect to {}: {why})\n\
         see `systemctl status xce-agent`; a daemon started by hand answers on /run/xce-agent/status.sock as root, $XDG_RUNTIME_DIR/xce-agent/status.sock as another user, or on the status_socket: of the agent.yaml given with --config",
        path.display()
    )]
    NotRunning { path: PathBuf, why: std::io::Error },
    /// Nothing answers on the socket, but an agent daemon is running: its socket is off.
    #[error(
        "the agent is running (pid {}, with this agent.yaml) but nothing answers on {}: its status socket is off (the daemon logs why at start: `status socket off: ...`; under systemd the unit's RuntimeDirectory=xce-agent makes /run/xce-agent; outside it the daemon makes /run/xce-agent as root and $XDG_RUNTIME_DIR/xce-agent as another user; or set status_socket: in agent.yaml)",
        pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        path.display()
    )]
    SocketOff { path: PathBuf, pids: Vec<u32> },
    #[error("permission denied: run as root or as a member of status_group ({})", path.display())]
    PermissionDenied { path: PathBuf },
    #[error("the agent did not answer on {} within {ANSWER_TIMEOUT:?}", path.display())]
    Timeout { path: PathBuf },
    #[error("the agent refused the request: {0}")]
    Refused(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unreadable answer from the agent: {0}")]
    BadAnswer(String),
}

/// Commands that are not the daemon: an `xce-agent` process with one of these is a one-off.
const NOT_THE_DAEMON: &[&str] = &[
    "status",
    "check",
    "probe",
    "listen",
    "tls",
    "generate-assets",
    "help",
    "--once",
    "--help",
    "-h",
    "--version",
    "-V",
];

/// Pids of the `xce-agent` daemons under `proc` (a /proc tree) that run with the agent.yaml
/// `config`, other than this process: nothing answering on the socket then means the
/// daemon's socket is off, not that no daemon runs.
pub fn running_daemons(proc: &Path, config: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let wanted = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_owned());
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            let dir = proc.join(pid.to_string());
            daemon_config(&dir).is_some_and(|c| {
                let c = match c.is_absolute() {
                    true => c,
                    false => std::fs::read_link(dir.join("cwd"))
                        .unwrap_or_default()
                        .join(c),
                };
                std::fs::canonicalize(&c).unwrap_or(c) == wanted
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The agent.yaml of the daemon whose /proc directory is `dir`, as it was given; `None`
/// when the process is not an `xce-agent` daemon.
fn daemon_config(dir: &Path) -> Option<PathBuf> {
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let (argv0, rest) = args.split_first()?;
    if Path::new(argv0).file_name()? != "xce-agent"
        || rest.iter().any(|a| NOT_THE_DAEMON.contains(&a.as_str()))
    {
        return None;
    }
    let given = rest.iter().enumerate().find_map(|(i, a)| match a.as_str() {
        "--config" | "-c" => rest.get(i + 1).cloned(),
        _ => a.strip_prefix("--config=").map(str::to_owned),
    });
    let from_env = || {
        let environ = std::fs::read(dir.join("environ")).ok()?;
        environ.split(|b| *b == 0).find_map(|v| {
            v.strip_prefix(crate::config::AGENT_YAML_ENV.as_bytes())?
                .strip_prefix(b"=")
                .map(|p| String::from_utf8_lossy(p).into_owned())
        })
    };
    Some(PathBuf::from(given.or_else(from_env).unwrap_or_else(
        || crate::config::DEFAULT_AGENT_YAML.to_owned(),
    )))
}

/// Ask the daemon behind `path` for its state (only `names`, when not empty).
pub async fn query(path: &Path, names: &[String]) -> Result<StatusReport, ClientError> {
    match tokio::time::timeout(ANSWER_TIMEOUT, exchange(path, names)).await {
        Ok(r) => r,
        Err(_) => Err(ClientError::Timeout {
            path: path.to_owned(),
        }),
    }
}

async fn exchange(path: &Path, names: &[String]) -> Result<StatusReport, ClientError> {
    let io = |source| ClientError::Io {
        path: path.to_owned(),
        source,
    };
    let mut stream = UnixStream::connect(path)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                ClientError::NotRunning {
                    path: path.to_owned(),
                    why: e,
                }
            }
            std::io::ErrorKind::PermissionDenied => ClientError::PermissionDenied {
                path: path.to_owned(),
            },
            _ => io(e),
        })?;
    let request = Request {
        version: Some(PROTOCOL_VERSION),
        names: names.to_vec(),
    };
    let mut line =
        serde_json::to_vec(&request).map_err(|e| ClientError::BadAnswer(e.to_string()))?;
    line.push(b'\n');
    // A refused client may find the socket closed before its request is written: the
    // answer (already sent) is what counts, so a write error is not the end.
    let _ = stream.write_all(&line).await;
    let mut body = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut body)
        .await
        .map_err(io)?;
    // The state first, the error shape only when that fails: an untagged `Response` would
    // buffer a whole answer (megabytes for 10,000 resources) before trying either.
    let answer = match serde_json::from_slice::<StatusReport>(&body) {
        Ok(report) => Response::Status(Box::new(report)),
        Err(e) => match serde_json::from_slice::<ErrorReply>(&body) {
            Ok(error) => Response::Error(error),
            Err(_) => {
                return Err(ClientError::BadAnswer(format!(
                    "{e} ({} bytes)",
                    body.len()
                )));
            }
        },
    };
    match answer {
        Response::Status(report) if report.version == PROTOCOL_VERSION => Ok(*report),
        Response::Status(report) => Err(ClientError::BadAnswer(format!(
            "protocol version {} (this command speaks {PROTOCOL_VERSION})",
            report.version
        ))),
        Response::Error(e) if e.error == PERMISSION_DENIED => Err(ClientError::PermissionDenied {
            path: path.to_owned(),
        }),
        Response::Error(e) => Err(ClientError::Refused(e.error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_daemons_with_this_agent_yaml_are_found_in_a_proc_tree() {
        let proc = tempfile::tempdir().unwrap();
        let site = tempfile::tempdir().unwrap();
        let config = site.path().join("agent.yaml");
        std::fs::write(&config, "").unwrap();
        let c = config.to_str().unwrap();
        let relative = "xce-agent\0-c\0agent.yaml\0".to_owned();
        for (pid, cmdline) in [
            ("100", format!("/usr/bin/xce-agent\0--config\0{c}\0")),
            ("101", format!("xce-agent\0status\0--config\0{c}\0")),
            ("102", format!("bash\0-c\0xce-agent --config {c}\0")),
            (
                "103",
                format!("./target/debug/xce-agent\0-c\0{c}\0--once\0"),
            ),
            ("104", format!("xce-agent\0--config={c}\0")),
            ("106", "xce-agent\0".to_owned()),
            ("107", relative),
            ("108", "xce-agent\0--config\0/other/agent.yaml\0".to_owned()),
            ("self", "xce-agent\0".to_owned()),
        ] {
            std::fs::create_dir(proc.path().join(pid)).unwrap();
            std::fs::write(proc.path().join(pid).join("cmdline"), cmdline).unwrap();
        }
        // Relative to its working directory; by the environment.
        std::os::unix::fs::symlink(site.path(), proc.path().join("107/cwd")).unwrap();
        std::fs::write(
            proc.path().join("106/environ"),
            format!("HOME=/root\0XCE_AGENT_CONFIG={c}\0"),
        )
        .unwrap();
        // A process that has gone between the listing and the read.
        std::fs::create_dir(proc.path().join("105")).unwrap();
        assert_eq!(running_daemons(proc.path(), &config), [100, 104, 106, 107]);
    }
}
