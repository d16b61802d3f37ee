//! Log limits: unexpected output names once per probe and name; stderr at most once per
//! minute per probe unless its text changes.

use std::time::{Duration, Instant};

use xce_agent::probe::exec::{OutputLog, STDERR_LOG_EVERY};

#[test]
fn unexpected_names_are_logged_once_per_name() {
    let mut log = OutputLog::default();
    assert_eq!(log.unexpected("p", &["x".into(), "y".into()]), ["x", "y"]);
    assert!(log.unexpected("p", &["x".into(), "y".into()]).is_empty());
    assert_eq!(log.unexpected("p", &["x".into(), "z".into()]), ["z"]);
}

#[test]
fn stderr_is_rate_limited_unless_it_changes() {
    let mut log = OutputLog::default();
    let t0 = Instant::now();
    assert!(!log.stderr_due("  ", t0), "empty stderr is never logged");
    assert!(log.stderr_due("disk slow", t0));
    assert!(!log.stderr_due("disk slow", t0 + Duration::from_secs(1)));
    assert!(
        log.stderr_due("disk gone", t0 + Duration::from_secs(2)),
        "new text"
    );
    assert!(!log.stderr_due("disk gone", t0 + Duration::from_secs(3)));
    assert!(log.stderr_due("disk gone", t0 + Duration::from_secs(2) + STDERR_LOG_EVERY));
}
