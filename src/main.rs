//! The xce-agent binary: parse the command line, set up logging and the runtime, and hand
//! the command to its module in `xce_agent::cmd`. The exit code is decided there; an error
//! is printed here, with its causes.

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _};
use xce_agent::cli::{Cli, Command, Common, COMMON_OPTIONS};
use xce_agent::cmd::{self, exit};

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    refuse_unread_options(&matches);
    let common = &match &cli.command {
        Some(Command::Check { args } | Command::Probe { args, .. }) => cli.common.with(args),
        Some(Command::Status { config, .. }) => cli.common.with_config(config),
        Some(Command::Listen { log, .. }) => Common {
            log_level: log.log_level.clone().or(cli.common.log_level.clone()),
            ..cli.common.clone()
        },
        _ => cli.common.clone(),
    };
    init_logging(
        common.log_level.as_deref(),
        cli.once || cli.command.is_some(),
    );
    // One worker thread (beside this one, which runs the command's own loop). A probe run
    // is a few system calls and waits, so a second worker buys no throughput; it costs
    // wake-ups, a spawned task or a readiness event landing on the other, idle, thread
    // (BENCHMARKS.md section 21: context switches and CPU per exec run).
    // Before any thread exists, so that every thread inherits it.
    xce_agent::probe::reaper::hold_child_signals();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xce-agent: cannot start the runtime: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Some(Command::Check { .. }) => cmd::check::run(common).await,
            Some(Command::Probe { name, .. }) => cmd::probe::run(common, name).await,
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
                let doors = cmd::listen::Doors {
                    addr: addr.as_deref(),
                    unix: unix.as_deref(),
                    unix_uids,
                };
                cmd::listen::run(doors, *format, *ack, only, *refresh, tls, budget).await
            }
            Some(Command::Status {
                format,
                watch,
                names,
                ..
            }) => Ok(cmd::status::run(common, *format, *watch, names).await),
            Some(Command::Tls { command }) => cmd::tls::run(command),
            Some(Command::GenerateAssets { dir }) => cmd::assets::run(dir),
            None if cli.once => cmd::once::run(common, cli.format, &cli.only).await,
            None => cmd::daemon::run(common).await,
        }
    });
    let code = result.unwrap_or_else(|e| {
        let code = e.exit_code();
        // anyhow's `{:#}`: the error and its causes on one line.
        eprintln!("xce-agent: {:#}", anyhow::Error::new(e));
        code
    });
    exit_now(code)
}

/// The daemon's options given before a subcommand that does not read them
/// (`xce-agent -c F listen ...`) are an error, as clap says one: its `--help` does not list
/// them, and an option that is silently ignored misleads.
fn refuse_unread_options(matches: &clap::ArgMatches) {
    let Some(sub) = matches.subcommand_name() else {
        return;
    };
    for (id, flag, readers) in COMMON_OPTIONS {
        if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            && !readers.contains(&sub)
        {
            let mut cmd = Cli::command();
            cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("`{sub}` does not read {flag} (see `xce-agent {sub} --help`)"),
            )
            .exit();
        }
    }
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

fn init_logging(level: Option<&str>, interactive: bool) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::EnvFilter;
    // Interactive commands print their results on stdout; only warnings belong on stderr.
    let default = if interactive { "warn" } else { "info" };
    let filter = level
        .map(EnvFilter::new)
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    // Under systemd with stderr going to the journal, log to the journal directly: it keeps
    // the level as the entry's priority and the fields as fields. Anything else (a terminal,
    // a file, the journal socket unavailable) gets plain lines on stderr.
    let journald = (!interactive && stderr_is_journal())
        .then(|| tracing_journald::layer().ok())
        .flatten();
    let fmt = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .fmt_fields(log_fields())
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journald)
        .with(fmt)
        .try_init();
}

/// How a log line's fields are written: as tracing-subscriber's default (the message, then
/// `name=value`), each value passed through [`xce_agent::text::sanitize`], so what a probe
/// printed (its stderr, a bad line in an error) can neither split the line nor reach the
/// terminal as an escape sequence.
fn log_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = xce_agent::text::sanitize(&text);
        if field.name() == "message" {
            w.write_str(&text)
        } else {
            write!(w, "{}={text}", field.name())
        }
    })
    .delimited(" ")
}

/// systemd sets JOURNAL_STREAM=DEV:INODE for the stream it connects to stderr; the variable
/// is inherited, so it only counts when it names our stderr (sd_journal_stream_fd(3)).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd as _;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}
