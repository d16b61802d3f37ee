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
