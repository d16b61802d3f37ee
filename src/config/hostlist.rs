//! Host names and Slurm-style host ranges (`node[001-128]`, `gpu[1,3,5-7]`,
//! `r[1-2]n[01-04]`), and the one rule for "is this the same host".

/// More hosts than any cluster has: a typo like `node[1-999999999]` must be an error, not an
/// allocation that takes the node down.
pub const MAX_EXPANSION: usize = 1_000_000;

/// A location entry that is no host name or range: the entry as written and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.problem.describe(&self.pattern))]
pub struct HostRangeError {
    pub pattern: String,
    pub problem: RangeProblem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeProblem {
    Unclosed,
    UnexpectedClose,
    EmptyBrackets,
    /// More than [`MAX_EXPANSION`] hosts.
    TooMany,
    /// The `lo-hi` part whose `lo` is above its `hi`.
    Backwards(String),
    /// The text inside the brackets that is no number.
    NotANumber(String),
    /// Digits that do not fit a number.
    BadNumber(String),
    /// An expanded name that is no host name.
    Host(InvalidHostName),
}

impl RangeProblem {
    fn describe(&self, pattern: &str) -> String {
        match self {
            Self::Unclosed => format!("unclosed '[' in host range {pattern:?}"),
            Self::UnexpectedClose => format!("unexpected ']' in host range {pattern:?}"),
            Self::EmptyBrackets => format!("empty '[]' in host range {pattern:?}"),
            Self::TooMany => {
                format!("host range {pattern:?} expands to more than {MAX_EXPANSION} hosts")
            }
            Self::Backwards(part) => format!("range {part:?} runs backwards in {pattern:?}"),
            Self::NotANumber(s) => format!(
                "expected numbers like 001-128 or 1,3,5-7 inside '[]' in {pattern:?}, got {s:?}"
            ),
            Self::BadNumber(s) => format!("bad number {s:?} in {pattern:?}"),
            Self::Host(e) => format!("{e} (from {pattern:?})"),
        }
    }
}

/// Expand one location entry into host names. A name without brackets is itself.
pub fn expand(pattern: &str) -> Result<Vec<String>, HostRangeError> {
    expand_hosts(pattern).map_err(|problem| HostRangeError {
        pattern: pattern.to_owned(),
        problem,
    })
}

fn expand_hosts(pattern: &str) -> Result<Vec<String>, RangeProblem> {
    let mut out = vec![String::new()];
    let mut rest = pattern;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or(RangeProblem::Unclosed)?;
        let prefix = &rest[..open];
        if prefix.contains(']') {
            return Err(RangeProblem::UnexpectedClose);
        }
        let choices = expand_bracket(&rest[open + 1..close])?;
        let total = out.len().saturating_mul(choices.len());
        if total > MAX_EXPANSION {
            return Err(RangeProblem::TooMany);
        }
        out = out
            .iter()
            .flat_map(|head| choices.iter().map(move |c| format!("{head}{prefix}{c}")))
            .collect();
        rest = &rest[close + 1..];
    }
    if rest.contains(']') {
        return Err(RangeProblem::UnexpectedClose);
    }
    for h in &mut out {
        h.push_str(rest);
    }
    for h in &out {
        validate_host_name(h).map_err(RangeProblem::Host)?;
    }
    Ok(out)
}

fn expand_bracket(body: &str) -> Result<Vec<String>, RangeProblem> {
    if body.is_empty() {
        return Err(RangeProblem::EmptyBrackets);
    }
    let mut out = Vec::new();
    for part in body.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (a, b) = (parse_num(lo)?, parse_num(hi)?);
                if a > b {
                    return Err(RangeProblem::Backwards(part.to_owned()));
                }
                if (b - a) as usize >= MAX_EXPANSION {
                    return Err(RangeProblem::TooMany);
                }
                // `001-128` pads to the width written on the left, as Slurm does.
                let width = if lo.starts_with('0') { lo.len() } else { 0 };
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
            None => {
                parse_num(part)?;
                out.push(part.to_owned());
            }
        }
        if out.len() > MAX_EXPANSION {
            return Err(RangeProblem::TooMany);
        }
    }
    Ok(out)
}

fn parse_num(s: &str) -> Result<u64, RangeProblem> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
        return Err(RangeProblem::NotANumber(s.to_owned()));
    }
    s.parse().map_err(|_| RangeProblem::BadNumber(s.to_owned()))
}

/// A name that is not an RFC 1123 host name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a valid host name")]
pub struct InvalidHostName(pub String);

/// RFC 1123 labels: letters, digits, hyphens, dots between labels.
pub fn validate_host_name(h: &str) -> Result<(), InvalidHostName> {
    let invalid = || Err(InvalidHostName(h.to_owned()));
    if h.is_empty() || h.len() > 253 {
        return invalid();
    }
    for label in h.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-');
        if !ok {
            return invalid();
        }
    }
    Ok(())
}

/// Longest shared-instance name (a resourcemap location joined by commas) either side
/// accepts: room for a few hundred host names, far below a frame's size.
pub const MAX_INSTANCE_NAME_LEN: usize = 4096;

/// A shared instance's name on the wire and in resources.yaml: `all`, `others`, or host names
/// and ranges joined by commas (`node[001-004],login1`). Only the characters of that syntax
/// (letters, digits, `-`, `_`, `.`, `,`, `[`, `]`), so a name can never carry a space, a
/// control character or markup into a controller's output. Empty is this host's own instance.
pub fn check_instance_name(instance: &str) -> Result<(), InstanceNameError> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"-_.,[]".contains(&b);
    if instance.len() > MAX_INSTANCE_NAME_LEN {
        Err(InstanceNameError::TooLong(instance.len()))
    } else if !instance.bytes().all(ok) {
        Err(InstanceNameError::Characters(instance.to_owned()))
    } else {
        Ok(())
    }
}

/// Why [`check_instance_name`] refuses a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceNameError {
    /// Its length in bytes.
    #[error("instance name of {0} bytes is longer than {MAX_INSTANCE_NAME_LEN}")]
    TooLong(usize),
    #[error("instance name {0:?} may hold only letters, digits and - _ . , [ ]")]
    Characters(String),
}

/// The same host: equal ignoring case, or one side is a short name equal to the other's first
/// label (`node001` is `node001.cluster.example`). Two different domains never match.
pub fn same_host(a: &str, b: &str) -> bool {
    if a.eq_ignore_ascii_case(b) {
        return true;
    }
    let (short_a, dom_a) = split_fqdn(a);
    let (short_b, dom_b) = split_fqdn(b);
    (dom_a.is_none() || dom_b.is_none()) && short_a.eq_ignore_ascii_case(short_b)
}

/// `listed` looks like a typo of `host` (short names, case ignored): one character more or
/// less, two neighbours swapped, or one changed where either is not a digit. A changed digit
/// is not a typo: `node002` is another node, not a misspelt `node001`.
pub fn looks_like_typo_of(listed: &str, host: &str) -> bool {
    let a: Vec<char> = split_fqdn(listed).0.to_ascii_lowercase().chars().collect();
    let b: Vec<char> = split_fqdn(host).0.to_ascii_lowercase().chars().collect();
    if a == b {
        return false;
    }
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = |x: &[char], y: &[char]| {
        x.iter()
            .rev()
            .zip(y.iter().rev())
            .take_while(|(p, q)| p == q)
            .count()
    };
    match a.len().abs_diff(b.len()) {
        // One character inserted or deleted.
        1 => {
            let (long, short) = if a.len() > b.len() {
                (&a, &b)
            } else {
                (&b, &a)
            };
            prefix + suffix(long, short) >= short.len()
        }
        0 => {
            let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            match differ[..] {
                [i] => !(a[i].is_ascii_digit() && b[i].is_ascii_digit()),
                [i, j] => j == i + 1 && a[i] == b[j] && a[j] == b[i],
                _ => false,
            }
        }
        _ => false,
    }
}

fn split_fqdn(h: &str) -> (&str, Option<&str>) {
    match h.split_once('.') {
        Some((s, d)) => (s, Some(d)),
        None => (h, None),
    }
}

/// Canonical key for comparing hosts: lower-case short name.
pub fn host_key(h: &str) -> String {
    split_fqdn(h).0.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_of_this_host_is_told_from_another_host() {
        for typo in [
            "node0001",
            "node01",
            "nod001",
            "ndoe001",
            "nodeO01",
            "NODE0001.other",
        ] {
            assert!(looks_like_typo_of(typo, "node001"), "{typo}");
        }
        for other in [
            "node002",
            "node101",
            "node001",
            "Node001",
            "gpu001",
            "node00123",
        ] {
            assert!(!looks_like_typo_of(other, "node001"), "{other}");
        }
    }

    #[test]
    fn plain_and_ranges() {
        assert_eq!(expand("host1").unwrap(), vec!["host1"]);
        assert_eq!(
            expand("node[001-003]").unwrap(),
            vec!["node001", "node002", "node003"]
        );
        assert_eq!(
            expand("gpu[1,3,5-6]").unwrap(),
            vec!["gpu1", "gpu3", "gpu5", "gpu6"]
        );
        assert_eq!(
            expand("r[1-2]n[01-02].hpc").unwrap(),
            vec!["r1n01.hpc", "r1n02.hpc", "r2n01.hpc", "r2n02.hpc"]
        );
        assert_eq!(
            expand("node[8-10]").unwrap(),
            vec!["node8", "node9", "node10"]
        );
    }

    #[test]
    fn bad_ranges_are_errors() {
        for bad in [
            "node[1-",
            "node[]",
            "node[3-1]",
            "node[a-b]",
            "node]1[",
            "node[1-999999999]",
            "bad host",
            "[0-999][0-999][0-9]",
        ] {
            assert!(expand(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn range_errors_name_the_pattern_and_the_part() {
        let text = |p: &str| expand(p).unwrap_err().to_string();
        assert_eq!(text("node[1-"), "unclosed '[' in host range \"node[1-\"");
        assert_eq!(text("node]1"), "unexpected ']' in host range \"node]1\"");
        assert_eq!(text("node[]"), "empty '[]' in host range \"node[]\"");
        assert_eq!(
            text("node[3-1]"),
            "range \"3-1\" runs backwards in \"node[3-1]\""
        );
        assert_eq!(
            text("node[a-b]"),
            "expected numbers like 001-128 or 1,3,5-7 inside '[]' in \"node[a-b]\", got \"a\""
        );
        assert_eq!(
            text("node[1-999999999]"),
            "host range \"node[1-999999999]\" expands to more than 1000000 hosts"
        );
        assert_eq!(
            text("bad host"),
            "\"bad host\" is not a valid host name (from \"bad host\")"
        );
    }

    #[test]
    fn instance_names_keep_to_the_location_syntax() {
        for good in ["", "all", "others", "node[001-004],login1", "r1n01.hpc"] {
            assert!(check_instance_name(good).is_ok(), "{good:?} refused");
        }
        let long = "n".repeat(MAX_INSTANCE_NAME_LEN + 1);
        for bad in [
            "a b",
            "x\nnode042",
            "gpu[1, 3]",
            "\u{1b}[2J",
            "a;b",
            long.as_str(),
        ] {
            assert!(check_instance_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn host_identity() {
        assert!(same_host("Node001", "node001"));
        assert!(same_host("node001", "node001.cluster.example"));
        assert!(same_host("NODE001.cluster.example", "node001"));
        assert!(!same_host("node001.a.example", "node001.b.example"));
        assert!(!same_host("node001", "node0011"));
    }
}
