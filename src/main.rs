//! The xce-agent binary: parse the command line, set up logging and the runtime, and hand
//! the command to its module in `xce_agent::cmd`. The exit code is decided there; an error
//! is printed here, with its causes.

use std::process::ExitCode;

use xce_agent::cli::Cli;
use xce_agent::cmd::{self, exit};

fn main() -> ExitCode {
    let cli = Cli::from_command_line();
    let common = cli.effective_common();
    xce_agent::logging::init(common.log_level.as_deref(), cli.is_interactive());
    let runtime = match cmd::runtime::build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xce-agent: cannot start the runtime: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let code = runtime
        .block_on(cmd::dispatch(&cli, &common))
        .unwrap_or_else(|e| {
            let code = e.exit_code();
            // anyhow's `{:#}`: the error and its causes on one line.
            eprintln!("xce-agent: {:#}", anyhow::Error::new(e));
            code
        });
    exit_now(code)
}

/// End the process now. Returning from `main` would drop the runtime, and that waits for
/// every blocking task still in flight — a read stuck in a hung mount forever, a builtin
/// sampler tick (GPU queries can take a second) for as long as it runs. Everything the
/// command owes (output, the last batch to the controller) is done by the time it returns.
fn exit_now(code: u8) -> ExitCode {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(i32::from(code))
}
