//! Why a probe run failed, as data: the child's ending and what it said, the file read's
//! error, why a stream gave no first values. Each is rendered to text only where it is shown
//! (the log, `--once`, `probe NAME`, status, the wire), in the one wording they all share; a
//! caller that needs the facts matches on them or follows `source()` to the kernel's error.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::child::{self, Ending, Exit};
use super::read_error::ReadError;
use crate::output;
use crate::output::ELIM_ABORT_VALUE;
use crate::value::ParseError;

/// Why a run failed as a whole, with its source. One is shared (an `Arc`) by the run and by
/// every resource it feeds ([`crate::value::Failure`]).
#[derive(Debug, thiserror::Error)]
pub enum RunFailure {
    /// The child could not be started: its user, the security rules, its cgroup.
    #[error(transparent)]
    Refused(Arc<SpawnRefused>),
    /// The spawn itself failed.
    #[error(transparent)]
    Spawn(Arc<child::SpawnError>),
    /// The child ended badly: its exit status, the timeout or the output cap, with what it
    /// said about it.
    #[error(transparent)]
    Ended(ChildEnded),
    /// Its output did not parse.
    #[error("bad {} output: {error}", format.as_str())]
    Output {
        format: output::Format,
        error: output::OutputError,
    },
    /// A file in a probe output format did not parse.
    #[error("bad {} in {}: {error}", format.as_str(), path.display())]
    FileOutput {
        format: output::Format,
        path: std::path::PathBuf,
        error: output::OutputError,
    },
    /// Parsing the output outlived the timeout, or panicked.
    #[error(transparent)]
    Parse(ParseFailure),
    /// A file probe's user cannot be looked up.
    #[error("run_as: {0}")]
    RunAs(child::UserError),
    /// A file probe's read failed, its file is too old, or it holds no value.
    #[error(transparent)]
    Read(FileFailure),
    /// A stream gave no first values.
    #[error(transparent)]
    NoFirstValues(NoFirstValues),
    /// `capture:` could not stand in, or its calls were lost.
    #[error(transparent)]
    Capture(CaptureFailure),
}

/// Why a probe with `capture:` has no answer.
#[derive(Debug, thiserror::Error)]
pub enum CaptureFailure {
    #[error(transparent)]
    StandIns(#[from] super::capture::stand_ins::StandInsError),
    /// The stand-ins wrote more than the cap: the calls past it were lost, so what the
    /// script last said of its node is not known.
    #[error("the captured calls exceed {} bytes; the pipe was closed on the later ones, so the node's state is not known", .0)]
    Overflow(usize),
}

/// Why a file probe gave no value: its read, its age, or what the file holds.
#[derive(Debug, thiserror::Error)]
pub enum FileFailure {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Its mtime is older than `max_age` (the writer is dead).
    #[error("{} not modified for {} (max_age {})", .path.display(), humantime::format_duration(Duration::from_secs(.age.as_secs())), humantime::format_duration(*.max_age))]
    TooOld {
        path: PathBuf,
        age: Duration,
        max_age: Duration,
    },
    #[error("regex {regex:?} does not match {}", .path.display())]
    NoMatch { regex: String, path: PathBuf },
    #[error("{} is empty", .path.display())]
    Empty { path: PathBuf },
    /// Its value does not parse as the resource's type.
    #[error(transparent)]
    Value(#[from] ParseError),
}

/// Why an exec or stream probe's child cannot be started; the run fails with this text.
#[derive(Debug, thiserror::Error)]
pub enum SpawnRefused {
    #[error(transparent)]
    User(#[from] child::UserError),
    #[error(transparent)]
    NotRunnable(#[from] super::security::NotRunnable),
    #[error(transparent)]
    Insecure(#[from] super::security::InsecureProgram),
    #[error("cannot make the probe's cgroup: {0}")]
    Cgroup(super::cgroup::CgroupError),
    #[error(transparent)]
    StateDir(#[from] super::plugin_state::StateDirError),
}

/// How an exec probe's child ended badly (a timeout, the output cap, an exit status that is
/// no answer), and what it said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildEnded {
    pub ending: Ending,
    pub exit: Exit,
    /// What the probe's format makes of the exit code (a Nagios plugin's UNKNOWN).
    pub meaning: Option<&'static str>,
    /// Its own words: the last line of its stderr, else (for an exit status) the first line
    /// of its stdout.
    pub said: Option<String>,
    /// An LSF elim run as `kind: exec` that timed out: what to declare instead.
    pub hint: Option<ElimHint>,
}

/// What an elim that timed out as an exec probe had printed, for the hint to declare it a
/// stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElimHint {
    /// It printed at least one complete line.
    pub printed_lines: bool,
    /// Its stdout was a pipe: `stdout: pty` helps one that does not flush to a pipe.
    pub on_a_pipe: bool,
}

impl fmt::Display for ChildEnded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ending {
            Ending::Finished => write!(f, "{}", self.exit)?,
            ref ending => write!(f, "{ending}")?,
        }
        if let Some(m) = self.meaning {
            write!(f, " ({m})")?;
        }
        if let Some(said) = &self.said {
            write!(f, ": {said}")?;
        }
        if let Some(hint) = self.hint {
            let printed = if hint.printed_lines {
                "an LSF elim prints its lines and keeps running"
            } else {
                "no complete line came; an LSF elim keeps running"
            };
            let pty = if hint.on_a_pipe {
                " (and `stdout: pty` if it does not flush its output to a pipe)"
            } else {
                ""
            };
            write!(f, " ({printed}: declare it `kind: stream`{pty})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ChildEnded {}

/// Why a finished run's output gave no answer though the child did well.
#[derive(Debug, thiserror::Error)]
pub enum ParseFailure {
    /// The parse panicked (a bug of ours, kept to this run).
    #[error("parsing the output failed: {0}")]
    Panicked(#[source] tokio::task::JoinError),
    /// The parse outlived the probe's timeout; it is left to finish on its own.
    #[error("parsing the output took longer than the timeout ({})", humantime::format_duration(*.0))]
    TimedOut(Duration),
}

/// Why a stream gave no first values (`--once`, `probe NAME`), and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoFirstValues {
    pub why: NoValues,
    /// The last line of its stderr, where the reason does not already say it.
    pub said: Option<String>,
}

impl NoFirstValues {
    /// With the last non-blank line of `stderr`, unless the reason already holds it.
    pub fn new(why: NoValues, stderr: &str) -> Self {
        let last = Some(last_line(stderr)).filter(|l| !l.is_empty());
        let said = last
            .filter(|last| !why.to_string().contains(last))
            .map(str::to_owned);
        Self { why, said }
    }
}

impl fmt::Display for NoFirstValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.why)?;
        if let Some(said) = &self.said {
            write!(f, ": {said}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NoFirstValues {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.why)
    }
}

/// The reason a stream gave no first values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoValues {
    #[error("not a stream probe")]
    NotAStream,
    /// The timeout passed; `missing` says what it still waited for.
    #[error("timed out after {}: {missing}", humantime::format_duration(*.after))]
    TimedOut { after: Duration, missing: String },
    /// Its first update did not parse.
    #[error("{0}")]
    Rejected(String),
    /// LSF's `ELIM_ABORT_VALUE`: the elim has nothing to report on this host.
    #[error(
        "elim aborted (exit {ELIM_ABORT_VALUE}, ELIM_ABORT_VALUE): nothing to report on this host"
    )]
    Aborted,
    /// It ended (`None`: it did not exit) before printing any values.
    #[error("{} before reporting any values", .0.map_or_else(|| "did not exit".to_owned(), |e| e.to_string()))]
    Ended(Option<Exit>),
}

/// Why a stream's child stopped giving values: the supervisor restarts it after a backoff
/// ([`Restarting`]), or, for an elim's abort, not at all.
#[derive(Debug, thiserror::Error)]
pub enum StreamStopped {
    /// Its child could not be started: its user, the security rules, its cgroup.
    #[error(transparent)]
    Refused(Arc<SpawnRefused>),
    /// The spawn itself failed.
    #[error(transparent)]
    Spawn(Arc<child::SpawnError>),
    /// It exited (or was ended).
    #[error(transparent)]
    Exited(Exited),
    /// It exited with LSF's `ELIM_ABORT_VALUE`: nothing to report on this host.
    #[error("elim aborted (exit {ELIM_ABORT_VALUE}, ELIM_ABORT_VALUE): {0}")]
    Aborted(Exited),
}

/// How a stream's child exited, and the last line of its stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub exit: Exit,
    pub said: Option<String>,
}

impl fmt::Display for Exited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.exit)?;
        if let Some(said) = &self.said {
            write!(f, ": {said}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Exited {}

/// A stream that stopped and starts again after `after`: what its resources fail with
/// meanwhile.
#[derive(Debug, thiserror::Error)]
#[error("{why}; restarting in {}", humantime::format_duration(*.after))]
pub struct Restarting {
    #[source]
    pub why: StreamStopped,
    pub after: Duration,
}

/// The last informative line: the one a failing script's stderr usually explains itself
/// in. Blank lines and decorations (a rule of `-` or `=`: no letter or digit) are passed
/// over, and so is the source line a caret line underlines: Ruby's error_highlight ends an
/// exception with the failing code and `^^^^^^^` under it, below the message. Output of
/// nothing but decorations gives its last non-blank line.
pub fn last_line(s: &str) -> &str {
    let lines = || s.lines().rev().map(str::trim).filter(|l| !l.is_empty());
    let decoration = |l: &str| !l.chars().any(char::is_alphanumeric);
    let underline = |l: &str| l.chars().all(|c| matches!(c, '^' | '~' | ' ' | '\t'));
    let mut underlined = false;
    for line in lines() {
        if underlined {
            // The code the carets point into.
            underlined = false;
            continue;
        }
        if decoration(line) {
            underlined = underline(line);
            continue;
        }
        return line;
    }
    lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::read_error::Unreadable;
    use crate::value::Failure;
    use std::error::Error as _;

    fn ended(ending: Ending, exit: Exit) -> ChildEnded {
        ChildEnded {
            ending,
            exit,
            meaning: None,
            said: None,
            hint: None,
        }
    }

    #[test]
    fn a_child_ending_reads_as_before() {
        let mut e = ended(Ending::Finished, Exit::Code(3));
        e.meaning = Some("UNKNOWN");
        e.said = Some("disk gone".into());
        assert_eq!(e.to_string(), "exited with status 3 (UNKNOWN): disk gone");
        let cap = Ending::OutputOverflow {
            cap: 10,
            killed: true,
        };
        assert_eq!(
            ended(cap.clone(), Exit::Signal(9)).to_string(),
            cap.to_string()
        );
        let timeout = Ending::TimedOut {
            after: Duration::from_secs(1),
            killed: false,
            exited_before_deadline: false,
        };
        let mut e = ended(timeout.clone(), Exit::Signal(15));
        e.hint = Some(ElimHint {
            printed_lines: false,
            on_a_pipe: true,
        });
        assert_eq!(
            e.to_string(),
            format!("{timeout} (no complete line came; an LSF elim keeps running: declare it `kind: stream` (and `stdout: pty` if it does not flush its output to a pipe))")
        );
    }

    #[test]
    fn the_exit_status_is_reachable_from_the_stored_failure() {
        let run = Arc::new(RunFailure::Ended(ended(Ending::Finished, Exit::Signal(11))));
        let stored = Failure::shared(run.clone());
        assert_eq!(stored.to_string(), "killed by signal SIGSEGV");
        let Some(RunFailure::Ended(e)) = stored.downcast_ref::<RunFailure>() else {
            panic!("{stored:?}")
        };
        assert_eq!(e.exit, Exit::Signal(11));
        assert_eq!(stored, Failure::from("killed by signal SIGSEGV"));
    }

    #[test]
    fn a_read_error_keeps_its_io_error_as_source() {
        let io = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let text = format!("cannot read /x: {io}");
        let read = Unreadable::io("read", std::path::Path::new("/x"), io);
        let run = RunFailure::Read(FileFailure::Read(ReadError::Failed(read)));
        assert_eq!(run.to_string(), text);
        let source = run
            .source()
            .and_then(|e| e.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::PermissionDenied)
        );
    }

    #[test]
    fn too_old_and_parse_failures_read_as_before() {
        let old = FileFailure::TooOld {
            path: "/var/run/x".into(),
            age: Duration::from_millis(125_400),
            max_age: Duration::from_secs(60),
        };
        assert_eq!(
            old.to_string(),
            "/var/run/x not modified for 2m 5s (max_age 1m)"
        );
        assert_eq!(
            ParseFailure::TimedOut(Duration::from_secs(5)).to_string(),
            "parsing the output took longer than the timeout (5s)"
        );
    }

    #[test]
    fn no_first_values_adds_the_last_stderr_line_unless_said() {
        let ended = NoValues::Ended(Some(Exit::Code(2)));
        let e = NoFirstValues::new(ended.clone(), "noise\n  no license  \n\n");
        assert_eq!(
            e.to_string(),
            "exited with status 2 before reporting any values: no license"
        );
        assert_eq!(e.source().map(ToString::to_string), Some(ended.to_string()));
        let bad = NoValues::Rejected("line 1: no license".into());
        let e = NoFirstValues::new(bad, "no license\n");
        assert_eq!(e.said, None);
        assert_eq!(e.to_string(), "line 1: no license");
        assert_eq!(
            NoFirstValues::new(NoValues::Aborted, "").to_string(),
            "elim aborted (exit 97, ELIM_ABORT_VALUE): nothing to report on this host"
        );
    }

    #[test]
    fn a_stream_restart_reads_as_before_and_keeps_the_exit() {
        let exited = Exited {
            exit: Exit::Code(3),
            said: Some("crashing".into()),
        };
        let why = StreamStopped::Exited(exited.clone());
        let stored = Failure::new(Restarting {
            why,
            after: Duration::from_secs(1),
        });
        assert_eq!(
            stored.to_string(),
            "exited with status 3: crashing; restarting in 1s"
        );
        let stopped = stored
            .source()
            .and_then(|e| e.downcast_ref::<StreamStopped>());
        assert!(matches!(stopped, Some(StreamStopped::Exited(e)) if *e == exited));
        let abort = StreamStopped::Aborted(Exited {
            exit: Exit::Code(ELIM_ABORT_VALUE),
            said: None,
        });
        assert_eq!(
            abort.to_string(),
            "elim aborted (exit 97, ELIM_ABORT_VALUE): exited with status 97"
        );
    }
}

#[cfg(test)]
mod last_line_tests {
    use super::last_line;

    #[test]
    fn the_last_informative_line_passes_over_decorations_and_the_code_carets_point_into() {
        // Ruby 3.4, error_highlight on (the default).
        let ruby = "/opt/check.rb:2:in 'Integer#/': divided by 0 (ZeroDivisionError)\n\nputs total / count\n           ^^^^^^^^\n";
        assert_eq!(
            last_line(ruby),
            "/opt/check.rb:2:in 'Integer#/': divided by 0 (ZeroDivisionError)"
        );
        assert_eq!(last_line("disk gone\n---------\n\n"), "disk gone");
        assert_eq!(last_line("first\nsecond\n"), "second");
        assert_eq!(last_line("^^^^\n"), "^^^^");
        assert_eq!(last_line("  \n"), "");
        // Python 3.11 underlines inside its traceback; its last line is the exception.
        let python = "  File \"/x.py\", line 1, in <module>\n    1/0\n    ~^~\nZeroDivisionError: division by zero\n";
        assert_eq!(last_line(python), "ZeroDivisionError: division by zero");
    }
}
