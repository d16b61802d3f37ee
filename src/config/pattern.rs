//! A `regex:` as the config holds it: compiled once, compared by its pattern.

use std::ops::Deref;
use std::sync::Arc;

use regex::Regex;

/// A compiled regular expression that compares by its pattern text. `Regex` has no
/// `PartialEq`, and a reload must still tell whether a probe's `regex:` changed: two
/// compilations of one pattern are the same probe. Shared, not cloned: a `Regex` clone gets
/// its own match cache (kilobytes each), and a file often repeats one pattern.
#[derive(Debug, Clone)]
pub struct Pattern(Arc<Regex>);

impl Pattern {
    pub fn new(pattern: &str) -> Result<Self, regex::Error> {
        Regex::new(pattern).map(|re| Self(Arc::new(re)))
    }
}

impl Deref for Pattern {
    type Target = Regex;

    fn deref(&self) -> &Regex {
        &self.0
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_equal_by_their_text_not_their_compilation() {
        let a = Pattern::new(r"temp=(\d+)").expect("valid");
        let b = Pattern::new(r"temp=(\d+)").expect("valid");
        let c = Pattern::new(r"temp=(\d*)").expect("valid");
        assert!(!Arc::ptr_eq(&a.0, &b.0), "two compilations");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a.captures("temp=42").map(|c| c[1].to_owned()),
            Some("42".into())
        );
    }
}
