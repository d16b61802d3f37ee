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
    #[error("{0} is too large (a duration is at most a year or less; see the field's limit)")]
    DurationTooLarge(String),
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

/// The one duration grammar of both files, the controller's reading of `interval`: whole
/// seconds, or a whole number and one unit of `s`, `m`, `h`, `d`. No spaces, words, signs,
/// fractions, exponents or compounds (`5m30s`): one way to write each duration.
pub const DURATION_GRAMMAR: &str =
    "a whole number of seconds (30) or a whole number with one unit s, m, h or d (30s, 5m, 1h, 1d)";
const DURATION_EXPECTED: &str = "expected a duration: a whole number of seconds (30) or a whole number with one unit s, m, h or d (30s, 5m, 1h, 1d)";
const SIZE_EXPECTED: &str =
    "expected a size in bytes (1048576) or with a unit (512KiB, 64MiB, 1GiB)";
const COUNT_EXPECTED: &str = "expected a non-negative whole number";

impl Scalar {
    /// A duration in [`DURATION_GRAMMAR`]: `30` (seconds), `30s`, `5m`, `1h`, `1d`.
    pub fn to_duration(&self) -> Result<Duration, ScalarError> {
        match self {
            Scalar::Int(i) if *i >= 0 => Ok(Duration::from_secs(*i as u64)),
            // Past i64 (YAML gives it as a float) or past any bound a config uses.
            Scalar::Float(x) if x.is_finite() && *x >= 1e12 => {
                Err(ScalarError::DurationTooLarge(format!("{x:.0} seconds")))
            }
            Scalar::Float(x) if x.is_finite() && *x >= 0.0 => Err(ScalarError::NotADuration {
                written: x.to_string(),
                reason: "no fractions or exponents: whole seconds, or a smaller unit".into(),
            }),
            Scalar::Text(s) => parse_duration(s.trim()).map_err(|reason| match reason {
                Refused::TooLarge => ScalarError::DurationTooLarge(format!("{s:?}")),
                Refused::Because(reason) => ScalarError::NotADuration {
                    written: s.clone(),
                    reason,
                },
            }),
            other => Err(other.expected(DURATION_EXPECTED)),
        }
    }

    /// A duration in [`DURATION_GRAMMAR`], or a whole number of milliseconds (`200ms`): for
    /// the few fields whose useful values are below a second (the link's `coalesce`).
    pub fn to_duration_or_ms(&self) -> Result<Duration, ScalarError> {
        if let Scalar::Text(s) = self {
            if let Some(ms) = s.trim().strip_suffix("ms") {
                if !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()) {
                    return ms
                        .parse::<u64>()
                        .map(Duration::from_millis)
                        .map_err(|_| ScalarError::DurationTooLarge(format!("{s:?}")));
                }
            }
        }
        self.to_duration()
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

/// A duration as [`DURATION_GRAMMAR`] writes it, in the largest unit that holds it whole
/// (`30s`, `5m`, `36h`, `365d`); what a message says is what the admin can write back.
/// A fraction of a second shows in whole milliseconds where it is whole (`coalesce` reads
/// them back), else as humantime does.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() % 1_000_000 != 0 {
        return humantime::format_duration(d).to_string();
    }
    if d.subsec_nanos() != 0 {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    match [(86_400, "d"), (3600, "h"), (60, "m")]
        .into_iter()
        .find(|(unit, _)| s != 0 && s % unit == 0)
    {
        Some((unit, name)) => format!("{}{name}", s / unit),
        None => format!("{s}s"),
    }
}

/// A size as `to_bytes` reads it, in the largest unit that holds it whole (`16MiB`,
/// `1024TiB`; plain bytes otherwise), so a message's size can be written back.
pub fn format_size(bytes: u64) -> String {
    match [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")]
        .into_iter()
        .find(|(shift, _)| bytes != 0 && bytes % (1u64 << shift) == 0)
    {
        Some((shift, name)) => format!("{}{name}", bytes >> shift),
        None => bytes.to_string(),
    }
}

enum Refused {
    TooLarge,
    Because(String),
}

fn unit_seconds(unit: &str) -> Option<u64> {
    match unit {
        "" | "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3600),
        "d" => Some(86_400),
        _ => None,
    }
}

/// [`DURATION_GRAMMAR`], with the reason a refused text is not in it.
fn parse_duration(t: &str) -> Result<Duration, Refused> {
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(Refused::Because(
            "it does not start with a whole number".into(),
        ));
    }
    let n: u64 = num.parse().map_err(|_| Refused::TooLarge)?;
    if let Some(mult) = unit_seconds(unit) {
        return n
            .checked_mul(mult)
            .map(Duration::from_secs)
            .ok_or(Refused::TooLarge);
    }
    Err(Refused::Because(why_not(t, unit)))
}

/// What is wrong with a duration's text after its first number, said with the fix.
fn why_not(t: &str, rest: &str) -> String {
    if rest.starts_with(char::is_whitespace) {
        return "the unit goes right after the number, with no space".into();
    }
    if rest.starts_with(['.', 'e', 'E']) && rest.len() > 1 {
        return "no fractions or exponents: whole numbers, in a smaller unit if need be".into();
    }
    // A compound (`5m30s`, `5m30`, `1h30m`): say its total in seconds.
    if let Some(secs) = compound_seconds(t) {
        return format!("one number and one unit: write {secs}s");
    }
    let unit: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
    if unit_seconds(&unit).is_some() {
        "only a unit may follow the number".into()
    } else {
        format!("unknown unit {unit:?}: the units are s, m, h and d")
    }
}

/// The total of `1h30m`, `5m30s` or `5m30` (a trailing bare number is seconds).
fn compound_seconds(t: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut rest = t;
    let mut terms = 0;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(split);
        let n: u64 = num.parse().ok()?;
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        total = total.checked_add(n.checked_mul(unit_seconds(unit)?)?)?;
        rest = after;
        terms += 1;
    }
    (terms > 1).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accepted() {
        let secs = |n| Ok(Duration::from_secs(n));
        assert_eq!(Scalar::Int(30).to_duration(), secs(30));
        assert_eq!(Scalar::Int(0).to_duration(), secs(0));
        for (text, n) in [
            ("30", 30),
            ("30s", 30),
            ("5m", 300),
            ("1h", 3600),
            ("1d", 86_400),
            ("007s", 7),
            (" 5m ", 300),
            ("18446744073709551615s", u64::MAX),
        ] {
            assert_eq!(Scalar::Text(text.into()).to_duration(), secs(n), "{text}");
        }
    }

    #[test]
    fn durations_refused_with_the_grammar_and_the_fix() {
        for (text, reason) in [
            (
                "5 minutes",
                "the unit goes right after the number, with no space",
            ),
            ("5 m", "the unit goes right after the number"),
            ("5m30", "one number and one unit: write 330s"),
            ("5m30s", "one number and one unit: write 330s"),
            ("1h30m", "one number and one unit: write 5400s"),
            ("1e3", "no fractions or exponents"),
            ("1.5h", "no fractions or exponents"),
            ("250ms", "unknown unit \"ms\": the units are s, m, h and d"),
            ("5min", "unknown unit \"min\""),
            ("2years", "unknown unit \"years\""),
            ("5M", "unknown unit \"M\""),
            ("thirty", "it does not start with a whole number"),
            ("-1", "it does not start with a whole number"),
            ("+5s", "it does not start with a whole number"),
            ("", "it does not start with a whole number"),
            ("5s!", "only a unit may follow the number"),
        ] {
            let e = Scalar::Text(text.into())
                .to_duration()
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(DURATION_EXPECTED), "{text}: {e}");
            assert!(e.contains(&format!("got {text:?}")), "{text}: {e}");
            assert!(e.contains(reason), "{text}: {e}");
        }
        let e = Scalar::Float(1000.0).to_duration().unwrap_err().to_string();
        assert!(e.contains("no fractions or exponents"), "{e}");
        let e = Scalar::Float(0.5).to_duration().unwrap_err().to_string();
        assert!(e.starts_with(DURATION_EXPECTED), "{e}");
        for too_large in ["18446744073709551616", "300000000000000000d"] {
            let e = Scalar::Text(too_large.into()).to_duration().unwrap_err();
            assert!(
                matches!(e, ScalarError::DurationTooLarge(_)),
                "{too_large}: {e}"
            );
        }
        assert!(Scalar::Int(-1).to_duration().is_err());
        assert!(Scalar::Bool(true).to_duration().is_err());
    }

    #[test]
    fn durations_are_written_back_in_the_grammar() {
        for (secs, shown) in [
            (0, "0s"),
            (30, "30s"),
            (90, "90s"),
            (300, "5m"),
            (5400, "90m"),
            (7200, "2h"),
            (86_400, "1d"),
            (31_536_000, "365d"),
            (u64::MAX, "18446744073709551615s"),
        ] {
            let text = format_duration(Duration::from_secs(secs));
            assert_eq!(text, shown);
            assert_eq!(
                Scalar::Text(text).to_duration(),
                Ok(Duration::from_secs(secs))
            );
        }
    }

    #[test]
    fn sizes_are_written_back_in_the_largest_whole_unit() {
        for (bytes, written) in [
            (0, "0"),
            (1, "1"),
            (1536, "1536"),
            (16 << 20, "16MiB"),
            (1 << 50, "1024TiB"),
        ] {
            assert_eq!(format_size(bytes), written);
            assert_eq!(Scalar::Text(written.into()).to_bytes(), Ok(bytes));
        }
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
