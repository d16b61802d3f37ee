//! Trust is earned by ownership: a root agent believes agent.yaml, resources.yaml, the CA
//! bundle and the CRL only when nobody but root could have written them (the file and every
//! directory above it), as it believes scripts. Refused by `check`, at start and at reload
//! (which keeps the running configuration); `trust_config_files_of_any_owner: true` waives it
//! for every file but agent.yaml, loudly.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use nix::sys::signal::Signal;
use nix::unistd::{chown, Uid};

use crate::support::{Site, HANG_GUARD};

const NOBODY: u32 = 65534;

fn root() -> bool {
    let r = nix::unistd::geteuid().is_root();
    if !r {
        eprintln!(
            "skipped: a non-root agent does not enforce ownership (CI runs the tests as root)"
        );
    }
    r
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn give_to_nobody(p: &Path) {
    chown(p, Some(Uid::from_raw(NOBODY)), None).unwrap();
}

/// One numeric resource `name`, probed every second by `name.sh` (a counter).
fn counter(name: &str) -> String {
    format!(
        "  - name: {name}\n    valtype: numeric\n    interval: 1s\n    resourcemap: [{{location: [default]}}]\n    probe: {{kind: exec, command: [{name}.sh]}}\n"
    )
}

fn site() -> Site {
    let s = Site::new(&[], &format!("resources:\n{}", counter("c")));
    s.counter_script("c");
    s
}

fn agent(s: &Site, args: &[&str]) -> Output {
    assert_cmd::Command::cargo_bin("xce-agent")
        .unwrap()
        .arg("--config")
        .arg(s.agent_yaml())
        .args(args)
        .env("XCE_LOG", "info")
        // A hang guard, not a threshold: a daemon that wrongly starts would run forever.
        .timeout(HANG_GUARD)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A TLS section whose CA bundle and CRL are real files (their content is never read: the
/// ownership check comes first).
fn with_tls(s: &Site) -> (PathBuf, PathBuf) {
    let tls = s.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    chmod(&tls, 0o700);
    let (ca, crl) = (tls.join("ca.pem"), tls.join("ca.crl"));
    for f in ["ca.pem", "ca.crl", "host.pem", "host.key"] {
        std::fs::write(tls.join(f), "not read\n").unwrap();
        chmod(&tls.join(f), 0o600);
    }
    let agent = std::fs::read_to_string(s.agent_yaml()).unwrap();
    std::fs::write(
        s.agent_yaml(),
        format!(
            "{agent}tls: {{ca: tls/ca.pem, cert: tls/host.pem, key: tls/host.key, crl: tls/ca.crl}}\n"
        ),
    )
    .unwrap();
    (ca, crl)
}

/// Each way a file that decides what runs as root can be changed by someone else: `check`,
/// `--once` and the daemon all refuse, naming the file and the fix.
#[test]
fn files_others_can_change_are_refused_with_the_fix() {
    if !root() {
        return;
    }
    struct Case {
        what: &'static str,
        /// Spoils the site; returns the path at fault and the fix.
        spoil: fn(&Site) -> (PathBuf, String),
        /// The file the error is about (`None`: the path at fault).
        file: fn(&Site) -> Option<PathBuf>,
    }
    let resources = |s: &Site| Some(s.file("resources.yaml"));
    let cases = [
        Case {
            what: "resources.yaml owned by nobody",
            spoil: |s| {
                let f = s.file("resources.yaml");
                give_to_nobody(&f);
                let fix = format!(
                    "is owned by uid {NOBODY}, not root; fix: chown root {}",
                    f.display()
                );
                (f, fix)
            },
            file: resources,
        },
        Case {
            what: "resources.yaml mode 0666",
            spoil: |s| {
                let f = s.file("resources.yaml");
                chmod(&f, 0o666);
                let fix = format!(
                    "is writable by group or other (mode 0666); fix: chmod go-w {}",
                    f.display()
                );
                (f, fix)
            },
            file: resources,
        },
        Case {
            what: "agent.yaml owned by nobody",
            spoil: |s| {
                let f = s.agent_yaml();
                give_to_nobody(&f);
                let fix = format!("fix: chown root {}", f.display());
                (f, fix)
            },
            file: |s| Some(s.agent_yaml()),
        },
        Case {
            what: "agent.yaml group-writable",
            spoil: |s| {
                let f = s.agent_yaml();
                chmod(&f, 0o664);
                let fix = format!("(mode 0664); fix: chmod go-w {}", f.display());
                (f, fix)
            },
            file: |s| Some(s.agent_yaml()),
        },
        Case {
            what: "resources.yaml in a directory anyone may write",
            spoil: |s| {
                let conf = s.path().join("conf");
                std::fs::create_dir(&conf).unwrap();
                std::fs::rename(s.file("resources.yaml"), conf.join("resources.yaml")).unwrap();
                chmod(&conf, 0o777);
                let agent = std::fs::read_to_string(s.agent_yaml()).unwrap();
                std::fs::write(
                    s.agent_yaml(),
                    agent.replace(
                        "resources: resources.yaml",
                        "resources: conf/resources.yaml",
                    ),
                )
                .unwrap();
                let fix = format!(
                    "{} (a directory above it) is writable by group or other (mode 0777); fix: chmod go-w {}",
                    conf.display(),
                    conf.display()
                );
                (conf, fix)
            },
            file: |s| Some(s.path().join("conf/resources.yaml")),
        },
        Case {
            what: "the CA bundle owned by nobody",
            spoil: |s| {
                let (ca, _) = with_tls(s);
                give_to_nobody(&ca);
                let fix = format!("fix: chown root {}", ca.display());
                (ca, fix)
            },
            file: |_| None,
        },
        Case {
            what: "the CRL writable by others",
            spoil: |s| {
                let (_, crl) = with_tls(s);
                chmod(&crl, 0o606);
                let fix = format!("(mode 0606); fix: chmod go-w {}", crl.display());
                (crl, fix)
            },
            file: |_| None,
        },
    ];
    for case in &cases {
        let s = site();
        let (at, fix) = (case.spoil)(&s);
        let file = (case.file)(&s).unwrap_or_else(|| at.clone());
        let wanted = format!("{}: not trusted: a root agent reads ", file.display());
        for args in [&["check"][..], &["--once"], &[]] {
            let out = agent(&s, args);
            let all = text(&out);
            assert_eq!(out.status.code(), Some(2), "{}, {args:?}: {all}", case.what);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let line = stderr
                .lines()
                .find(|l| l.starts_with(&wanted))
                .unwrap_or_else(|| panic!("{}, {args:?}: no {wanted:?} in {all}", case.what));
            assert!(line.contains(&fix), "{}: {line:?} lacks {fix:?}", case.what);
            // Only agent.yaml is never waivable.
            assert_eq!(
                line.contains("trust_config_files_of_any_owner: true"),
                file != s.agent_yaml(),
                "{}: {line}",
                case.what
            );
            assert_eq!(s.runs("c"), 0, "{}, {args:?}: a probe ran", case.what);
        }
    }
}

/// The opt-out: honoured for resources.yaml (with a warning that names the file and why, in
/// `check` and in the daemon's log), never for agent.yaml, which would otherwise vouch for
/// itself.
#[test]
fn the_opt_out_is_loud_and_never_covers_agent_yaml() {
    if !root() {
        return;
    }
    let s = site();
    let agent_yaml = std::fs::read_to_string(s.agent_yaml()).unwrap();
    std::fs::write(
        s.agent_yaml(),
        format!("{agent_yaml}trust_config_files_of_any_owner: true\n"),
    )
    .unwrap();
    let resources = s.file("resources.yaml");
    give_to_nobody(&resources);
    let out = agent(&s, &["check"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("WARNING: trust_config_files_of_any_owner: true: resources.yaml, the CA bundle and the CRL are believed whoever owns them"),
        "{all}"
    );
    assert!(
        stdout.contains(&format!(
            "WARNING: trust_config_files_of_any_owner: resources.yaml {} is believed although {} is owned by uid {NOBODY}, not root",
            resources.display(),
            resources.display()
        )),
        "{all}"
    );
    let once = agent(&s, &["--once"]);
    assert!(
        String::from_utf8_lossy(&once.stderr).contains("WARN")
            && String::from_utf8_lossy(&once.stderr)
                .contains("trust_config_files_of_any_owner: resources.yaml"),
        "{}",
        text(&once)
    );
    // agent.yaml itself: refused, switch or not.
    give_to_nobody(&s.agent_yaml());
    let out = agent(&s, &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with(&format!(
            "{}: not trusted: a root agent reads agent.yaml only when nobody but root can change it",
            s.agent_yaml().display()
        )),
        "{}",
        text(&out)
    );
}

/// A reload whose resources.yaml someone else could have written is refused, the running
/// configuration goes on; once the file is root's the same reload is applied.
#[tokio::test]
async fn a_reload_of_a_file_others_can_change_keeps_the_running_config() {
    if !root() {
        return;
    }
    let s = site();
    s.counter_script("d");
    let mut daemon = s.spawn_agent();
    s.wait_runs("c", 1).await;
    let resources = s.file("resources.yaml");
    std::fs::write(
        &resources,
        format!("resources:\n{}{}", counter("c"), counter("d")),
    )
    .unwrap();
    give_to_nobody(&resources);
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("reload failed", 1).await;
    let log = daemon.log_text();
    assert!(
        log.contains(&format!(
            "{}: not trusted: a root agent reads resources.yaml only when nobody but root can change it: {} is owned by uid {NOBODY}, not root; fix: chown root {}",
            resources.display(),
            resources.display(),
            resources.display()
        )),
        "{log}"
    );
    // The old plan runs on, without the new probe.
    let before = s.runs("c");
    s.wait_runs("c", before + 2).await;
    assert_eq!(s.runs("d"), 0, "the refused file's new probe ran");
    chown(&resources, Some(Uid::from_raw(0)), None).unwrap();
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("reloaded", 1).await;
    s.wait_runs("d", 1).await;
    let status = daemon.terminate().await;
    assert!(status.success(), "{status:?}\n{}", daemon.log_text());
}

/// `check` and the daemon's start log say when probes run as root, and which.
#[tokio::test]
async fn check_and_the_start_log_say_when_probes_run_as_root() {
    if !root() {
        return;
    }
    // Site::new says run_as: root.
    let s = site();
    let out = agent(&s, &["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let note = "-: 1 of 1 probe(s) run as root (agent.yaml says run_as: root): c; ";
    assert!(stdout.contains(note), "{}", text(&out));
    let mut daemon = s.spawn_agent();
    daemon
        .wait_log(
            "1 of 1 probe(s) run as root (agent.yaml says run_as: root): c",
            1,
        )
        .await;
    assert!(
        daemon.log_text().contains(" WARN "),
        "{}",
        daemon.log_text()
    );
    daemon.terminate().await;
    // One probe of two as root, by its own run_as; the agent's default (nobody) for the other.
    let agent_yaml = std::fs::read_to_string(s.agent_yaml()).unwrap();
    std::fs::write(s.agent_yaml(), agent_yaml.replace("run_as: root\n", "")).unwrap();
    let two = format!(
        "resources:\n{}{}",
        counter("c").replace("command: [c.sh]", "command: [c.sh], run_as: root"),
        counter("d")
    );
    std::fs::write(s.file("resources.yaml"), two).unwrap();
    s.counter_script("d");
    let out = agent(&s, &["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("-: 1 of 2 probe(s) run as root (their run_as is root): c; "),
        "{}",
        text(&out)
    );
    // None as root: no note.
    let none = format!("resources:\n{}", counter("d"));
    std::fs::write(s.file("resources.yaml"), none).unwrap();
    let out = agent(&s, &["check"]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("run as root"),
        "{}",
        text(&out)
    );
}

/// The rule only where it applies: a root-owned tree under root's sticky /tmp (every other
/// test's site) passes, as scripts there do.
#[test]
fn a_root_owned_site_under_sticky_tmp_passes() {
    let s = site();
    let out = agent(&s, &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
