//! `release_code_after`: once the start-up is done, and again after each reload, the daemon
//! pages out its own binary (MADV_PAGEOUT) and drops its mappings of every never-written
//! file page, the shared libraries' included (MADV_DONTNEED), so that the code only the
//! start-up ran (the command line, the YAML parser, the checks) stops counting in its RSS; 0
//! turns it off (BENCHMARKS.md section 23c).

use nix::sys::signal::Signal;

use crate::support::{wait_status, wait_until, Site};
use xce_agent::value::Value;

const RELEASED: &str = "released the start-up code";

fn site(release_code_after: &str) -> Site {
    let resources = "resources:\n  - name: c\n    valtype: numeric\n    interval: 1s\n    resourcemap: [{location: [default]}]\n    probe: {kind: exec, command: [c.sh]}\n";
    let site = Site::new(&[], resources);
    site.counter_script("c");
    let agent = std::fs::read_to_string(site.agent_yaml()).expect("read agent.yaml");
    site.write_atomic(
        "agent.yaml",
        &format!("{agent}status_socket: status.sock\n"),
    );
    set_release_code_after(&site, release_code_after);
    site
}

fn set_release_code_after(site: &Site, value: &str) {
    let agent = std::fs::read_to_string(site.agent_yaml()).expect("read agent.yaml");
    let kept: String = agent
        .lines()
        .filter(|l| !l.starts_with("release_code_after:"))
        .map(|l| format!("{l}\n"))
        .collect();
    site.write_atomic(
        "agent.yaml",
        &format!("{kept}release_code_after: {value}\n"),
    );
}

#[tokio::test]
async fn the_start_up_code_is_released_after_the_start_and_again_after_a_reload() {
    let site = site("10ms");
    let mut daemon = site.spawn_agent();
    wait_until("the release after the start", || {
        daemon.log_text().contains(RELEASED)
    })
    .await;
    daemon.signal(Signal::SIGHUP);
    wait_until("the release after the reload", || {
        daemon.log_text().matches(RELEASED).count() == 2
    })
    .await;
    // Nothing it wrote was dropped: the agent goes on running its probes (the libraries'
    // code and its own, faulted back in) and answers `status` with what they printed.
    let runs = site.runs("c");
    wait_until("a run after the release", || site.runs("c") > runs).await;
    let (report, code) = wait_status(&site, "a status answer after the release", |r| {
        r.resources
            .iter()
            .any(|res| res.name == "c" && matches!(res.value, Value::Numeric(_)))
    })
    .await;
    assert_eq!(code, 0, "{report:?}");
    daemon.assert_alive();
    let (status, log) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "exit {status:?}\n{log}");
}

#[tokio::test]
async fn release_code_after_0_releases_nothing_and_a_reload_can_turn_it_on() {
    let site = site("0");
    let mut daemon = site.spawn_agent();
    wait_until("a first run", || site.runs("c") > 0).await;
    daemon.signal(Signal::SIGHUP);
    wait_until("the unchanged reload", || {
        daemon.log_text().contains("configuration unchanged")
    })
    .await;
    assert!(
        !daemon.log_text().contains(RELEASED),
        "{}",
        daemon.log_text()
    );
    set_release_code_after(&site, "10ms");
    daemon.signal(Signal::SIGHUP);
    wait_until("the release after the reload that turned it on", || {
        daemon.log_text().contains(RELEASED)
    })
    .await;
    let (status, log) = (daemon.terminate().await, daemon.log_text());
    assert!(status.success(), "exit {status:?}\n{log}");
}
