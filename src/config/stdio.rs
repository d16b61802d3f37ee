//! The probe fields about the child's standard streams: `stdout: pipe|pty` (exec and stream
//! probes) and `stdin: none|signal` (stream probes). Kept apart from `resources.rs` so the
//! probe-kind table does not grow by their parsing.

use serde_saphyr::Spanned;

use super::error::{Errors, Pos};

/// What the child's stdout is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StdoutMode {
    /// A pipe: what nearly every program expects of a probe's stdout.
    #[default]
    Pipe,
    /// A pseudo-terminal, so a program whose stdio block-buffers a pipe (a Perl or Python
    /// loop that never flushes, awk, sed) writes each line as it prints it. Stderr stays a
    /// pipe.
    Pty,
}

impl StdoutMode {
    /// The names `stdout:` takes, each with its mode.
    pub const TABLE: [(&'static str, StdoutMode); 2] =
        [("pipe", StdoutMode::Pipe), ("pty", StdoutMode::Pty)];

    pub fn as_str(self) -> &'static str {
        name_in(&Self::TABLE, self)
    }
}

/// What the agent writes to a stream child's stdin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StdinMode {
    /// /dev/null.
    #[default]
    None,
    /// A newline at each interval (Telegraf execd's `signal = "STDIN"`): the child answers
    /// each with one batch of lines.
    Signal,
}

impl StdinMode {
    /// The names `stdin:` takes, each with its mode.
    pub const TABLE: [(&'static str, StdinMode); 2] =
        [("none", StdinMode::None), ("signal", StdinMode::Signal)];

    pub fn as_str(self) -> &'static str {
        name_in(&Self::TABLE, self)
    }
}

fn name_in<T: PartialEq>(table: &[(&'static str, T)], mode: T) -> &'static str {
    table
        .iter()
        .find(|(_, m)| *m == mode)
        .map_or("?", |(name, _)| name)
}

/// `stdout:`; absent is `pipe`.
pub fn stdout(errs: &mut Errors, raw: Option<&Spanned<String>>) -> StdoutMode {
    one_of(errs, raw, "stdout", &StdoutMode::TABLE)
}

/// `stdin:`; absent is `none`.
pub fn stdin(errs: &mut Errors, raw: Option<&Spanned<String>>) -> StdinMode {
    one_of(errs, raw, "stdin", &StdinMode::TABLE)
}

/// The mode `raw` names in `table`; absent or unknown (an error at its position): the
/// default.
fn one_of<T: Copy + Default>(
    errs: &mut Errors,
    raw: Option<&Spanned<String>>,
    field: &str,
    table: &[(&'static str, T)],
) -> T {
    let Some(raw) = raw else {
        return T::default();
    };
    if let Some((_, mode)) = table.iter().find(|(name, _)| *name == raw.value) {
        return *mode;
    }
    let names: Vec<&str> = table.iter().map(|(name, _)| *name).collect();
    errs.at(
        Pos::of(raw),
        format!(
            "unknown {field} {:?}; expected one of {}",
            raw.value,
            names.join(", ")
        ),
    );
    T::default()
}
