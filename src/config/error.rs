//! Configuration errors, always with a position so the admin can jump to it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_saphyr::{Location, Spanned};

/// A position in a config file. Line and column are 1-based; 0 means "whole file".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: u64,
    pub column: u64,
}

impl Pos {
    pub fn of<T>(s: &Spanned<T>) -> Self {
        Self::from_location(&s.referenced)
    }

    pub fn from_location(l: &Location) -> Self {
        Self {
            line: l.line(),
            column: l.column(),
        }
    }
}

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub pos: Pos,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: &Path, pos: Pos, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            pos,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pos.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.pos.line,
                self.pos.column,
                self.message
            )
        }
    }
}

/// Every error found in one load, in file order. Validation goes on after the first error so
/// that one `check` run shows the admin everything to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}

/// Collects errors against one file.
pub struct Errors<'a> {
    pub file: &'a Path,
    pub list: Vec<ConfigError>,
}

impl<'a> Errors<'a> {
    pub fn new(file: &'a Path) -> Self {
        Self {
            file,
            list: Vec::new(),
        }
    }

    /// `message`: a text or a typed error from a validator, shown as it displays.
    pub fn at(&mut self, pos: Pos, message: impl std::fmt::Display) {
        self.list
            .push(ConfigError::new(self.file, pos, message.to_string()));
    }

    pub fn finish(mut self) -> Result<(), ConfigErrors> {
        if self.list.is_empty() {
            Ok(())
        } else {
            self.list.sort_by_key(|e| (e.pos.line, e.pos.column));
            Err(ConfigErrors(self.list))
        }
    }
}

/// Turn a YAML/serde error into a positioned config error with a one-line message and, for
/// the parser's terse messages, what usually causes them, pointing at the likely line.
pub fn from_yaml(file: &Path, text: &str, err: &serde_saphyr::Error) -> ConfigError {
    let pos = err
        .location()
        .map(|l| Pos::from_location(&l))
        .unwrap_or_default();
    if let Some(message) = unknown_field(err) {
        return ConfigError::new(file, pos, message);
    }
    let text_of_error = err.without_snippet().to_string();
    // The library's own text may repeat the position; keep the first line, which is the reason.
    let first = text_of_error
        .lines()
        .next()
        .unwrap_or("invalid YAML")
        .trim();
    let mut message = match first.rfind(" at line ") {
        Some(i) => first[..i].to_owned(),
        None => first.to_owned(),
    };
    if message.contains("flow sequence") {
        message.push_str(
            " (a host range such as node[1-3] inside [ ] must be quoted: [\"node[1-3]\"])",
        );
    }
    if let Some(hint) = super::recover::shape_hint(&message) {
        message.push_str("; ");
        message.push_str(hint);
    }
    let (pos, hint) = super::yaml_hint::hint(text, pos, &message);
    if let Some(hint) = hint {
        message.push_str("; ");
        message.push_str(&hint);
    }
    ConfigError::new(file, pos, message)
}

/// serde's "unknown field `x`, expected one of ..." as one near-miss rule for every mapping of
/// both files: the known names come from the struct serde derived them for.
fn unknown_field(err: &serde_saphyr::Error) -> Option<String> {
    let mut err = err;
    loop {
        match err {
            serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } => err = error,
            serde_saphyr::Error::SerdeUnknownField {
                field, expected, ..
            } => {
                return Some(match super::raw::near_miss(field, expected) {
                    Some(known) => format!("unknown field `{field}`; did you mean `{known}`?"),
                    None => format!(
                        "unknown field `{field}`; the fields here are: {}",
                        expected.join(", ")
                    ),
                });
            }
            _ => return None,
        }
    }
}
