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
         see `systemctl status xce-agent`, or the status_socket: of the agent.yaml given with --config",
        path.display()
    )]
    NotRunning { path: PathBuf, why: std::io::Error },
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
