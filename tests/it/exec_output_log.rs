//! Log limits: unexpected output names once per probe and name, a bounded set of them
//! remembered and the rest counted; stderr at most once per minute per probe unless its text
//! changes; stderr and malformed lines at most a burst a minute (issue 26, item 5).

use std::time::{Duration, Instant};

use xce_agent::probe::output_log::{OutputLog, LOG_BURST, STDERR_LOG_EVERY, UNEXPECTED_REMEMBERED};

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

#[test]
fn ever_new_names_are_counted_not_remembered() {
    let mut log = OutputLog::default();
    let t0 = Instant::now();
    let mut logged = 0;
    for batch in 0..1000 {
        let names: Vec<String> = (0..100).map(|i| format!("job_{batch}_{i}")).collect();
        logged += log.unexpected_at("p", &names, t0).len();
    }
    assert_eq!(
        logged, UNEXPECTED_REMEMBERED,
        "each of the first names once"
    );
    assert_eq!(log.remembered_names(), UNEXPECTED_REMEMBERED);
    assert_eq!(log.unexpected_total(), 100_000, "every name counted");
    // A remembered name is still not logged twice.
    assert!(log.unexpected_at("p", &["job_0_0".into()], t0).is_empty());
}

#[test]
fn ever_changing_stderr_is_logged_at_most_a_burst_a_minute() {
    let mut log = OutputLog::default();
    let t0 = Instant::now();
    let due = (0..1000)
        .filter(|i| log.stderr_due(&format!("line {i}"), t0))
        .count();
    assert_eq!(due, LOG_BURST as usize);
    assert!(log.stderr_due("line 1000", t0 + STDERR_LOG_EVERY));
}

#[test]
fn malformed_lines_are_logged_at_most_a_burst_a_minute() {
    let mut log = OutputLog::default();
    let t0 = Instant::now();
    let logged = (0..1000)
        .filter(|i| log.malformed("p", &format!("bad kv line {i}"), t0))
        .count();
    assert_eq!(logged, LOG_BURST as usize);
    assert!(log.malformed("p", "bad", t0 + STDERR_LOG_EVERY));
}
