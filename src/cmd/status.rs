//! `xce-agent status`: ask the running daemon, print, and exit by what it says; with
//! `--watch`, again every second.

use std::io::{IsTerminal as _, Write as _};
use std::path::Path;
use std::time::Duration;

use super::exit;
use crate::cli::{Common, StatusFormat};
use crate::render;
use crate::status::client::{query, running_daemons, ClientError};
use crate::status::StatusReport;
use crate::value::Status;

/// Only agent.yaml is read: a resources.yaml broken since the daemon loaded it must not hide
/// the daemon.
pub async fn run(common: &Common, format: StatusFormat, watch: bool, names: &[String]) -> u8 {
    let agent = match crate::config::load_agent(&common.config) {
        Ok((agent, _)) => agent,
        Err(errors) => {
            eprintln!("{errors}");
            return exit::CONFIG;
        }
    };
    let json = format == StatusFormat::Json;
    let asking = Asking {
        socket: &agent.status_socket_to_ask(),
        config: &common.config,
    };
    ask(&asking, json, watch, names).await
}

/// Where the daemon answers, and the agent.yaml it was started with.
struct Asking<'a> {
    socket: &'a Path,
    config: &'a Path,
}

/// 0 when every resource is ok or pending and the link is connected (or not configured).
fn exit_code(report: &StatusReport) -> u8 {
    let trouble = report
        .resources
        .iter()
        .any(|r| matches!(r.status, Status::Failed | Status::Stale))
        || !matches!(report.link.state.as_str(), "connected" | "none")
        || report.config.last_reload.as_ref().is_some_and(|r| !r.ok);
    if trouble {
        exit::TROUBLE
    } else {
        exit::OK
    }
}

/// One frame: what to print and the exit code it means.
async fn frame(
    asking: &Asking<'_>,
    json: bool,
    names: &[String],
) -> Result<(String, u8), (String, u8)> {
    match query(asking.socket, names).await {
        Ok(report) => {
            let text = if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => s + "\n",
                    Err(e) => return Err((format!("xce-agent: {e}\n"), exit::CONFIG)),
                }
            } else {
                render::status::render(&report)
            };
            Ok((text, exit_code(&report)))
        }
        Err(ClientError::NotRunning { path, why }) => {
            // Nothing answers: is a daemon with this agent.yaml running all the same?
            let e = match running_daemons(Path::new("/proc"), asking.config) {
                pids if pids.is_empty() => ClientError::NotRunning { path, why },
                pids => ClientError::SocketOff { path, pids },
            };
            let code = match e {
                ClientError::NotRunning { .. } => exit::NOT_RUNNING,
                _ => exit::CONFIG,
            };
            Err((format!("xce-agent: {e}\n"), code))
        }
        Err(e) => Err((format!("xce-agent: {e}\n"), exit::CONFIG)),
    }
}

/// Returns the exit code. Without `watch` an error goes to stderr; with it, into the
/// frame (the daemon may come back), and the loop runs until the process is interrupted
/// or stdout is gone.
async fn ask(asking: &Asking<'_>, json: bool, watch: bool, names: &[String]) -> u8 {
    if !watch {
        return match frame(asking, json, names).await {
            Ok((text, code)) => {
                print!("{text}");
                code
            }
            Err((text, code)) => {
                eprint!("{text}");
                code
            }
        };
    }
    let terminal = std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (text, code) = frame(asking, json, names).await.unwrap_or_else(|e| e);
        let mut out = std::io::stdout().lock();
        // A terminal gets the frame redrawn in place; a pipe gets frames one after another.
        let written = if terminal {
            write!(out, "\x1b[H\x1b[2J{text}")
        } else {
            writeln!(out, "{text}")
        };
        if written.and_then(|()| out.flush()).is_err() {
            return code;
        }
    }
}
