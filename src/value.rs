//! Values, their types and the per-resource record (`Resval`) that the store keeps and the
//! link sends. A value that does not parse as its declared `valtype` is an error, never a 0.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest string value the protocol carries (bytes). LSF's string resources are short
/// words (a model, a state, a version); 1 KiB leaves room for a path or a list and keeps a
/// host's state small at the receiver. The agent refuses a longer value as a failed run;
/// the receiver rejects it (docs/protocol.md).
pub const MAX_STRING_VALUE: usize = 1024;

/// Longest error text sent with a resval (bytes): longer texts are cut at a character
/// boundary by the agent and the receiver alike.
pub const MAX_ERROR_TEXT: usize = 1024;

/// LSF value types. `numeric` is a 64-bit float: load indices are fractional and LSF's own
/// numeric resources are floats on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Valtype {
    Numeric,
    String,
    Boolean,
}

impl Valtype {
    pub const NAMES: &'static [&'static str] = &["numeric", "string", "boolean"];

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "numeric" => Some(Self::Numeric),
            "string" => Some(Self::String),
            "boolean" => Some(Self::Boolean),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Numeric => "numeric",
            Self::String => "string",
            Self::Boolean => "boolean",
        }
    }

    /// Parse one raw token a probe produced. Surrounding whitespace is ignored; anything
    /// else that does not fit the type is an error with the reason.
    pub fn parse(self, raw: &str) -> Result<Value, ParseError> {
        let text = raw.trim();
        match self {
            Self::Numeric => parse_numeric(text),
            Self::Boolean => parse_boolean(text),
            Self::String => {
                if text.is_empty() {
                    Err(ParseError::new(raw, self, "empty string"))
                } else if text.chars().any(|c| c.is_control()) {
                    Err(ParseError::new(raw, self, "contains control characters"))
                } else if text.len() > MAX_STRING_VALUE {
                    Err(ParseError::new(
                        raw,
                        self,
                        "longer than the protocol's cap on a string value (1024 bytes)",
                    ))
                } else {
                    Ok(Value::String(text.to_owned()))
                }
            }
        }
    }
}

impl fmt::Display for Valtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn parse_numeric(text: &str) -> Result<Value, ParseError> {
    if text.is_empty() {
        return Err(ParseError::new(text, Valtype::Numeric, "empty output"));
    }
    // `f64::from_str` accepts "inf" and "NaN"; a probe printing those is broken, not infinite.
    // (Compared in place: every numeric reading passes here, and a lowercased copy of each
    // was an allocation.)
    let holds = |word: &[u8]| {
        text.as_bytes()
            .windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word))
    };
    if holds(b"inf") || holds(b"nan") {
        return Err(ParseError::new(
            text,
            Valtype::Numeric,
            "not a finite number",
        ));
    }
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(Value::Numeric(v)),
        Ok(_) => Err(ParseError::new(
            text,
            Valtype::Numeric,
            "not a finite number",
        )),
        Err(_) => Err(ParseError::new(text, Valtype::Numeric, "not a number")),
    }
}

fn parse_boolean(text: &str) -> Result<Value, ParseError> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "y" | "on" => Ok(Value::Boolean(true)),
        "0" | "false" | "no" | "n" | "off" => Ok(Value::Boolean(false)),
        _ => Err(ParseError::new(
            text,
            Valtype::Boolean,
            "expected true/false, yes/no, on/off or 1/0",
        )),
    }
}

/// Why a raw token is not a value of its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {shown:?} as {valtype}: {reason}")]
pub struct ParseError {
    pub shown: String,
    pub valtype: Valtype,
    pub reason: &'static str,
}

impl ParseError {
    fn new(raw: &str, valtype: Valtype, reason: &'static str) -> Self {
        // Keep error messages short: a probe that printed a megabyte should not put it
        // in the log, the table and the wire.
        let mut shown: String = raw.chars().take(64).collect();
        if raw.chars().count() > 64 {
            shown.push('…');
        }
        Self {
            shown,
            valtype,
            reason,
        }
    }
}

/// A resource value. `Unknown` is what LSF shows as `-`: no value we can vouch for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Numeric(f64),
    String(String),
    Boolean(bool),
    #[serde(serialize_with = "serialize_unknown")]
    Unknown,
}

fn serialize_unknown<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_none()
}

impl Value {
    pub fn is_unknown(&self) -> bool {
        matches!(self, Value::Unknown)
    }

    /// The value as it is, for the views that show what was measured (`probe NAME`,
    /// `listen`): a number in the shortest form that reads back as the same number (0.002,
    /// 1377.546), where `Display` rounds to 2 decimals as lsload does (0, 1377.55).
    pub fn exact(&self) -> String {
        match self {
            Value::Numeric(v) => v.to_string(),
            other => other.to_string(),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Numeric(v) => Some(*v),
            Value::Boolean(b) => Some(if *b { 1.0 } else { 0.0 }),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Integers print without a fraction, others with at most 2 decimals, as lsload.
            Value::Numeric(v) if v.fract() == 0.0 && v.abs() < 1e15 => write!(f, "{}", *v as i64),
            Value::Numeric(v) => {
                let s = format!("{v:.2}");
                f.write_str(s.trim_end_matches('0').trim_end_matches('.'))
            }
            Value::String(s) => f.write_str(s),
            Value::Boolean(b) => f.write_str(if *b { "true" } else { "false" }),
            Value::Unknown => f.write_str("-"),
        }
    }
}

/// How much we trust a resval right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The last run gave a good value.
    Ok,
    /// The last run failed; the value is the last good one until it goes stale, then unknown.
    Failed,
    /// No fresh reading for longer than the resource's stale time; the value is unknown.
    Stale,
    /// No reading yet (just started, or a rate that needs a second sample).
    Pending,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Stale => "stale",
            Status::Pending => "pending",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The latest known state of one resource instance on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resval {
    pub name: String,
    /// Empty for this host's own instance; otherwise the shared instance's location as
    /// written in resources.yaml (`all`, `others`, or the host list), which the controller
    /// reads from the same file.
    pub instance: String,
    pub value: Value,
    pub status: Status,
    /// Unix milliseconds of the last good reading; `None` before the first one.
    pub last_report_ms: Option<u64>,
    pub error: Option<Failure>,
}

/// Why a resource has no fresh value: the typed error itself (a probe run's failure, with
/// its source), shared by every resource the run feeds and cheap to clone, rendered to text
/// only where it is shown (status, the wire, the log). Generic so that this leaf module
/// knows nothing of probes: [`std::ops::Deref`] gives the error, its `source()` and
/// `downcast_ref`. Serialized as its text; text read back (from the wire, a test) is a
/// failure that is only words.
#[derive(Clone)]
pub struct Failure(Arc<dyn std::error::Error + Send + Sync>);

impl Failure {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// An error that is already shared (one run's failure, recorded for many resources).
    pub fn shared(error: Arc<dyn std::error::Error + Send + Sync>) -> Self {
        Self(error)
    }
}

impl std::ops::Deref for Failure {
    type Target = dyn std::error::Error + Send + Sync;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Two failures are the same when they read the same: the store tells a change, and the
/// log a new error, by what an admin would see change.
impl PartialEq for Failure {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}

/// A failure that is only words: one whose cause is a sentence (a stream's restart, a
/// value the output left out), or text that came back from the wire.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Words(String);

impl From<String> for Failure {
    fn from(text: String) -> Self {
        Self::new(Words(text))
    }
}

impl From<&str> for Failure {
    fn from(text: &str) -> Self {
        Self::from(text.to_owned())
    }
}

impl Serialize for Failure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Failure {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from)
    }
}

/// What one probe run says about one resource.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    Ok(Value),
    /// The run failed; keep the last good value until it goes stale.
    Failed(Failure),
    /// The source answered but its data is too old (file `max_age`, a silent stream).
    Stale(String),
    /// Not computable yet (a rate before its second sample).
    Pending(String),
}

pub fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_string_longer_than_the_protocols_cap_is_a_clear_error() {
        let long = "x".repeat(MAX_STRING_VALUE + 1);
        let e = Valtype::String.parse(&long).unwrap_err().to_string();
        assert!(e.contains("cap on a string value (1024 bytes)"), "{e}");
        assert!(e.len() < 300, "the value is not quoted whole: {e}");
        let fits = "x".repeat(MAX_STRING_VALUE);
        assert!(Valtype::String.parse(&fits).is_ok());
    }

    use super::*;

    #[test]
    fn numeric_rejects_garbage_and_non_finite() {
        assert_eq!(Valtype::Numeric.parse(" 42.5\n"), Ok(Value::Numeric(42.5)));
        for bad in [
            "",
            "abc",
            "12abc",
            "inf",
            "NaN",
            "-infinity",
            "1e999",
            "INF",
            "+Inf",
            "nAn",
        ] {
            assert!(Valtype::Numeric.parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn boolean_and_string() {
        assert_eq!(Valtype::Boolean.parse("Yes"), Ok(Value::Boolean(true)));
        assert_eq!(Valtype::Boolean.parse("0"), Ok(Value::Boolean(false)));
        assert!(Valtype::Boolean.parse("maybe").is_err());
        assert_eq!(
            Valtype::String.parse(" gpu-a100 "),
            Ok(Value::String("gpu-a100".into()))
        );
        assert!(Valtype::String.parse("  ").is_err());
        assert!(Valtype::String.parse("a\u{0}b").is_err());
    }

    #[test]
    fn display_like_lsload() {
        assert_eq!(Value::Numeric(3.0).to_string(), "3");
        assert_eq!(Value::Numeric(0.456).to_string(), "0.46");
        assert_eq!(Value::Numeric(1.5).to_string(), "1.5");
        assert_eq!(Value::Unknown.to_string(), "-");
    }

    #[test]
    fn exact_shows_every_digit_display_rounds_as_lsload() {
        for (v, exact, shown) in [
            (0.002, "0.002", "0"),
            (1377.546, "1377.546", "1377.55"),
            (42.0, "42", "42"),
            (-0.5, "-0.5", "-0.5"),
            (1e20, "100000000000000000000", "100000000000000000000.00"),
        ] {
            assert_eq!(Value::Numeric(v).exact(), exact);
            if v.abs() < 1e15 {
                assert_eq!(Value::Numeric(v).to_string(), shown);
            }
        }
        assert_eq!(Value::String("a b".into()).exact(), "a b");
        assert_eq!(Value::Boolean(true).exact(), "true");
        assert_eq!(Value::Unknown.exact(), "-");
    }

    #[test]
    fn parse_error_is_short() {
        let long = "x".repeat(10_000);
        let e = Valtype::Numeric.parse(&long).unwrap_err();
        assert!(e.to_string().len() < 200);
    }
}
