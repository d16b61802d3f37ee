//! Scalars kept as written, validated after parsing. Validating here instead of inside serde
//! keeps the exact line and column for the error (a visitor's custom error has none).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// Any YAML scalar, as text, plus whether it was a number.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Text(s) => write!(f, "{s:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a scalar (number or string)")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(i64::try_from(v)
                    .map(Scalar::Int)
                    .unwrap_or(Scalar::Float(v as f64)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a scalar is not the duration, size or count a field expects.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScalarError {
    #[error("{DURATION_EXPECTED}; got {written:?} ({reason})")]
    NotADuration { written: String, reason: String },
    #[error(
        "{0:.0} seconds is too large (a duration is at most a year or less; see the field's limit)"
    )]
    DurationTooLarge(f64),
    #[error("{SIZE_EXPECTED}; got {0:?}")]
    NotASize(String),
    #[error("size {0:?} is too large")]
    SizeTooLarge(String),
    #[error("{0:.0} is too large for a count")]
    CountTooLarge(f64),
    /// `expected` says what the field takes; `got` is the scalar as written.
    #[error("{expected}; got {got}")]
    Expected { expected: &'static str, got: Scalar },
}

const DURATION_EXPECTED: &str = "expected a duration: seconds (30) or with a unit (30s, 5m, 500ms)";
const SIZE_EXPECTED: &str =
    "expected a size in bytes (1048576) or with a unit (512KiB, 64MiB, 1GiB)";
const COUNT_EXPECTED: &str = "expected a non-negative whole number";

impl Scalar {
    /// `30` (seconds) or a humantime string such as `30s`, `5m`, `1h 30m`, `500ms`.
    pub fn to_duration(&self) -> Result<Duration, ScalarError> {
        match self {
            Scalar::Int(i) if *i >= 0 => Ok(Duration::from_secs(*i as u64)),
            Scalar::Float(x) if x.is_finite() && *x >= 0.0 && *x < 1e12 => {
                Ok(Duration::from_secs_f64(*x))
            }
            // Past i64 (YAML gives it as a float) or past any bound a config uses.
            Scalar::Float(x) if x.is_finite() && *x >= 1e12 => {
                Err(ScalarError::DurationTooLarge(*x))
            }
            Scalar::Text(s) => {
                let t = s.trim();
                if let Ok(secs) = t.parse::<u64>() {
                    return Ok(Duration::from_secs(secs));
                }
                humantime::parse_duration(t).map_err(|e| ScalarError::NotADuration {
                    written: s.clone(),
                    reason: e.to_string(),
                })
            }
            other => Err(other.expected(DURATION_EXPECTED)),
        }
    }

    /// A byte size: `1048576`, `512KiB`, `64MiB`, `1GiB` (also KB/MB/GB as powers of 1024,
    /// which is what every admin means for limits).
    pub fn to_bytes(&self) -> Result<u64, ScalarError> {
        match self {
            Scalar::Int(i) if *i >= 0 => Ok(*i as u64),
            Scalar::Text(s) => {
                let t = s.trim();
                let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
                let (num, unit) = t.split_at(split);
                let not_a_size = || ScalarError::NotASize(s.clone());
                let n: u64 = num.parse().map_err(|_| not_a_size())?;
                let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
                    "" | "b" => 1,
                    "k" | "kb" | "kib" => 1 << 10,
                    "m" | "mb" | "mib" => 1 << 20,
                    "g" | "gb" | "gib" => 1 << 30,
                    "t" | "tb" | "tib" => 1 << 40,
                    _ => return Err(not_a_size()),
                };
                n.checked_mul(mult)
                    .ok_or_else(|| ScalarError::SizeTooLarge(s.clone()))
            }
            other => Err(other.expected(SIZE_EXPECTED)),
        }
    }

    pub fn to_count(&self) -> Result<u64, ScalarError> {
        match self {
            Scalar::Int(i) if *i >= 0 => Ok(*i as u64),
            Scalar::Text(s) if s.trim().parse::<u64>().is_ok() => {
                Ok(s.trim().parse::<u64>().unwrap_or_default())
            }
            Scalar::Float(x) if x.is_finite() && x.fract() == 0.0 && *x > 0.0 => {
                Err(ScalarError::CountTooLarge(*x))
            }
            other => Err(other.expected(COUNT_EXPECTED)),
        }
    }

    fn expected(&self, expected: &'static str) -> ScalarError {
        ScalarError::Expected {
            expected,
            got: self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(Scalar::Int(30).to_duration(), Ok(Duration::from_secs(30)));
        assert_eq!(
            Scalar::Text("30".into()).to_duration(),
            Ok(Duration::from_secs(30))
        );
        assert_eq!(
            Scalar::Text("5m".into()).to_duration(),
            Ok(Duration::from_secs(300))
        );
        assert_eq!(
            Scalar::Text("250ms".into()).to_duration(),
            Ok(Duration::from_millis(250))
        );
        assert!(Scalar::Text("thirty".into()).to_duration().is_err());
        assert!(Scalar::Int(-1).to_duration().is_err());
        assert!(Scalar::Bool(true).to_duration().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(Scalar::Text("512KiB".into()).to_bytes(), Ok(512 * 1024));
        assert_eq!(Scalar::Text("1G".into()).to_bytes(), Ok(1 << 30));
        assert_eq!(Scalar::Int(100).to_bytes(), Ok(100));
        assert!(Scalar::Text("12 parsecs".into()).to_bytes().is_err());
        assert!(Scalar::Text("99999999999TiB".into()).to_bytes().is_err());
    }
}
