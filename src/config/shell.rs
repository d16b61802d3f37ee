//! `command:` or `shell:`, the two ways an exec or stream probe names what it runs: an
//! argument list run without a shell, or one command line (a Zabbix UserParameter, a cron
//! habit: `df -P / | awk 'NR==2 {print $5+0}'`) that [`SHELL`] runs with `-c`. Both give the
//! argv the child gets; everything else about the run (user, containment, timeout,
//! environment, limits) is the same.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::error::{Errors, Pos};
use super::kind_spec::SHELL;
use super::probe_output;

/// `shell:` as written: one command line. A list is refused with the field it belongs in.
#[derive(Debug, Clone, PartialEq)]
pub struct RawShell(pub String);

impl<'de> Deserialize<'de> for RawShell {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawShell;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command line, a string run by /bin/sh -c")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawShell, E> {
                Ok(RawShell(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawShell, A::Error> {
                Err(de::Error::custom(
                    "`shell` is one command line, a string run by /bin/sh -c; an argument list is `command:`",
                ))
            }
        }
        d.deserialize_any(V)
    }
}

/// The argv of the probe's `command:` or `shell:`; errors (neither, both, an empty one, a
/// list whose program has spaces) go to `errs`.
pub fn argv(
    errs: &mut Errors,
    (command, shell): (
        &Option<Spanned<probe_output::RawCommand>>,
        &Option<Spanned<RawShell>>,
    ),
    pos: Pos,
) -> Option<Vec<String>> {
    match (command, shell) {
        (None, None) => {
            errs.at(
                pos,
                "exec and stream probes need `command` (a list such as [script, arg1]) or `shell` (a command line run by /bin/sh -c)",
            );
            None
        }
        (Some(_), Some(shell)) => {
            errs.at(
                Pos::of(shell),
                "`command` and `shell` do not go together: `command` is an argument list run without a shell, `shell` a command line run by /bin/sh -c; keep one",
            );
            None
        }
        (None, Some(shell)) => line(errs, shell),
        (Some(command), None) => list(errs, command),
    }
}

fn line(errs: &mut Errors, shell: &Spanned<RawShell>) -> Option<Vec<String>> {
    let text = &shell.value.0;
    if text.trim().is_empty() {
        errs.at(Pos::of(shell), "`shell` is empty: expected a command line");
        return None;
    }
    if text.contains('\0') {
        errs.at(Pos::of(shell), "`shell` contains a NUL character");
        return None;
    }
    Some(vec![SHELL.to_owned(), "-c".to_owned(), text.clone()])
}

fn list(errs: &mut Errors, field: &Spanned<probe_output::RawCommand>) -> Option<Vec<String>> {
    let command = probe_output::command(errs, field)?;
    if command.is_empty() || command[0].trim().is_empty() {
        errs.at(
            Pos::of(field),
            "`command` is empty: expected [program, arg, ...]",
        );
        return None;
    }
    if command[0].contains(char::is_whitespace) && !command[0].starts_with('/') {
        errs.at(
            Pos::of(field),
            format!(
                "program {:?} contains spaces: `command` is an argument list run without a shell, e.g. [script, arg]; for a command line a shell runs, write it as `shell:`",
                command[0]
            ),
        );
    }
    Some(command)
}
