//! The `xce-agent status` command: ask, print, and exit by what the daemon says; with
//! `--watch`, again every second.

use std::io::{IsTerminal as _, Write as _};
use std::path::Path;
use std::time::Duration;

use super::client::{query, ClientError};
use super::table::{self, EXIT_ERROR, EXIT_NOT_RUNNING};

/// One frame: what to print and the exit code it means.
async fn frame(path: &Path, json: bool, names: &[String]) -> Result<(String, u8), (String, u8)> {
    match query(path, names).await {
        Ok(report) => {
            let text = if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => s + "\n",
                    Err(e) => return Err((format!("xce-agent: {e}\n"), EXIT_ERROR)),
                }
            } else {
                table::render(&report)
            };
            Ok((text, table::exit_code(&report)))
        }
        Err(e) => {
            let code = match e {
                ClientError::NotRunning { .. } => EXIT_NOT_RUNNING,
                _ => EXIT_ERROR,
            };
            Err((format!("xce-agent: {e}\n"), code))
        }
    }
}

/// Returns the exit code. Without `watch` an error goes to stderr; with it, into the
/// frame (the daemon may come back), and the loop runs until the process is interrupted
/// or stdout is gone.
pub async fn run(path: &Path, json: bool, watch: bool, names: &[String]) -> u8 {
    if !watch {
        return match frame(path, json, names).await {
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
        let (text, code) = frame(path, json, names).await.unwrap_or_else(|e| e);
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
