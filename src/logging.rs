//! Where the binary's log goes: the journal under systemd, plain lines on stderr elsewhere,
//! every field passed through [`crate::text::sanitize`].

/// Set up logging for the process: `level` (a level or RUST_LOG filter) if given, else
/// `RUST_LOG`, else `info` for the daemon and `warn` for an `interactive` command.
pub fn init(level: Option<&str>, interactive: bool) {
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
/// `name=value`), each value passed through [`crate::text::sanitize`], so what a probe
/// printed (its stderr, a bad line in an error) can neither split the line nor reach the
/// terminal as an escape sequence.
fn log_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = crate::text::sanitize(&text);
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
