//! Who a probe runs as, with which limits and which environment. The credential tests need
//! root (CI runs as root) and print a skip note otherwise.

use crate::support::{load_task, resource, Setup};
use xce_agent::probe::{run_once, Outcome, ProbeRun};

fn root() -> bool {
    let r = nix::unistd::geteuid().is_root();
    if !r {
        eprintln!("skipped: needs root (CI runs the tests as root)");
    }
    r
}

/// A value probe: prints `1` (its value) and then whatever `body` prints.
async fn run(probe_extra: &str, agent_extra: &str, body: &str) -> (ProbeRun, String) {
    let probe = format!("{{kind: exec, command: [p]{probe_extra}}}");
    let s = Setup::with_agent(
        &format!("resources:\n{}", resource("p", &probe)),
        agent_extra,
    );
    s.script("p", &format!("#!/bin/sh\necho 1\n{body}\n"));
    let (task, ctx) = load_task(&s, "p");
    let run = run_once(&task, &ctx).await;
    let out = run
        .exec
        .as_ref()
        .map(|e| String::from_utf8_lossy(&e.stdout).into_owned())
        .unwrap_or_default();
    (run, out)
}

fn groups_of(user: &str) -> String {
    let pw = nix::unistd::User::from_name(user).unwrap().unwrap();
    let name = std::ffi::CString::new(user).unwrap();
    let mut gs: Vec<u32> = nix::unistd::getgrouplist(&name, pw.gid)
        .unwrap()
        .iter()
        .map(|g| g.as_raw())
        .collect();
    gs.sort_unstable();
    gs.dedup();
    gs.iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn sorted_words(s: &str) -> String {
    let mut w: Vec<u32> = s
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    w.sort_unstable();
    w.dedup();
    w.iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
}

const ID: &str = "echo \"uid=$(id -u)\"; echo \"gid=$(id -g)\"; echo \"groups=$(id -G)\"";

#[tokio::test]
async fn default_user_is_the_agents_run_as_with_its_groups() {
    if !root() {
        return;
    }
    let (r, out) = run("", "", ID).await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    assert_eq!(line(&out, "uid"), nobody.uid.to_string());
    assert_eq!(line(&out, "gid"), nobody.gid.to_string());
    assert_eq!(sorted_words(line(&out, "groups")), groups_of("nobody"));
}

#[tokio::test]
async fn probe_run_as_gets_supplementary_groups_from_getgrouplist() {
    if !root() {
        return;
    }
    // `daemon` or another system user with a different uid; pick the first that exists.
    let Some(user) = ["daemon", "bin", "sys"]
        .into_iter()
        .find(|u| nix::unistd::User::from_name(u).ok().flatten().is_some())
    else {
        eprintln!("skipped: no daemon/bin/sys user");
        return;
    };
    let (r, out) = run(&format!(", run_as: {user}"), "", ID).await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    let pw = nix::unistd::User::from_name(user).unwrap().unwrap();
    assert_eq!(line(&out, "uid"), pw.uid.to_string());
    assert_eq!(sorted_words(line(&out, "groups")), groups_of(user));
    assert_eq!(&*r.exec.unwrap().user, user);
}

#[tokio::test]
async fn root_needs_an_explicit_run_as_root() {
    if !root() {
        return;
    }
    let (r, out) = run(", run_as: root", "", ID).await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    assert_eq!(line(&out, "uid"), "0");
    // The agent's run_as alone never means root unless it says root.
    let (r, out) = run("", "run_as: nobody\n", ID).await;
    assert_eq!(r.outcome, Outcome::Ok);
    assert_ne!(line(&out, "uid"), "0");
}

#[tokio::test]
async fn unknown_user_fails_with_a_clear_message() {
    if !root() {
        return;
    }
    let (r, _) = run(", run_as: no_such_user_xce", "", ID).await;
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(
        r.error().as_deref(),
        Some("no such user \"no_such_user_xce\"")
    );
}

#[tokio::test]
async fn core_dumps_are_off_and_limits_apply() {
    let (r, out) = run(
        ", limits: {cpu: 7s, address_space: 512MiB, open_files: 100, processes: 50}",
        "",
        "echo \"core=$(ulimit -c)\"; echo \"cpu=$(ulimit -t)\"; echo \"as=$(ulimit -v)\"; echo \"nofile=$(ulimit -n)\"; awk '/^Max processes/ {print \"nproc=\" $3}' /proc/self/limits",
    )
    .await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    assert_eq!(line(&out, "core"), "0");
    assert_eq!(line(&out, "cpu"), "7");
    assert_eq!(
        line(&out, "as"),
        (512 * 1024).to_string(),
        "ulimit -v is KiB"
    );
    assert_eq!(line(&out, "nofile"), "100");
    assert_eq!(line(&out, "nproc"), "50");
}

#[tokio::test]
async fn no_limits_means_only_core_is_set() {
    let (r, out) = run(
        "",
        "",
        "echo \"core=$(ulimit -c)\"; echo \"cpu=$(ulimit -t)\"",
    )
    .await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    assert_eq!(line(&out, "core"), "0");
    assert_eq!(line(&out, "cpu"), "unlimited");
}

#[tokio::test]
async fn environment_is_exactly_the_documented_one_and_stdin_is_dev_null() {
    // `env` output with one name per line, sorted; PWD is set by the shell itself.
    let (r, out) = run(
        ", env: {SITE: x1, XCE_HOST: overridden}",
        "",
        "env | LC_ALL=C sort | sed 's/^/env /'; echo \"stdin=$(readlink /proc/self/fd/0)\"; echo \"cwd=$(pwd)\"",
    )
    .await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    let env: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("env "))
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .collect();
    assert_eq!(
        env,
        vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "SITE=x1",
            "XCE_HOST=overridden",
            "XCE_INTERVAL=60",
            "XCE_RESOURCE=p",
            "XCE_RESOURCES=p",
            "XCE_TIMEOUT=30",
        ]
    );
    assert_eq!(line(&out, "stdin"), "/dev/null");
    assert_eq!(line(&out, "cwd"), "/");
}
