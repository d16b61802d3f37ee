//! `xce-agent probe NAME` through the binary: what it shows and its exit status.

use crate::support::{resource, Setup};

fn probe(s: &Setup, name: &str) -> (i32, String, String) {
    let out = assert_cmd::Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["-c", s.agent_yaml().to_str().unwrap(), "probe", name])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn setup(resources: &str) -> Setup {
    Setup::new(&format!("resources:\n{resources}"))
}

#[test]
fn a_good_exec_probe_shows_everything_and_exits_0() {
    let s = setup(&resource(
        "scratch",
        "{kind: exec, command: [sc, \"two words\"], env: {SITE: x1}}",
    ));
    s.script("sc", "#!/bin/sh\necho 812\necho warming up >&2\n");
    let (code, out, err) = probe(&s, "scratch");
    assert_eq!(code, 0, "{out}{err}");
    let prog = s.path().join("sc");
    for want in [
        "probe scratch (kind exec) on node001".to_owned(),
        format!("argv:      {} 'two words'", prog.display()),
        "cwd:       /".to_owned(),
        "SITE=x1".to_owned(),
        "XCE_RESOURCE=scratch".to_owned(),
        "ended:     exited with status 0".to_owned(),
        "| 812".to_owned(),
        "| warming up".to_owned(),
        "scratch = 812".to_owned(),
        "result: ok".to_owned(),
    ] {
        assert!(out.contains(&want), "missing {want:?} in:\n{out}");
    }
    if nix::unistd::geteuid().is_root() {
        assert!(out.contains("user:      nobody (uid "), "{out}");
        assert!(out.contains("script check: ok"), "{out}");
    }
}

#[test]
fn a_parse_error_is_shown_exactly_and_exits_1() {
    let s = setup(&resource("n", "{kind: exec, command: [bad]}"));
    s.script("bad", "#!/bin/sh\necho twelve\n");
    let (code, out, _) = probe(&s, "n");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("n = FAILED: "), "{out}");
    assert!(out.contains("\"twelve\""), "{out}");
}

#[test]
fn a_signal_and_stderr_are_reported() {
    let s = setup(&resource("k", "{kind: exec, command: [k]}"));
    s.script("k", "#!/bin/sh\necho dying >&2\nkill -KILL $$\n");
    let (code, out, _) = probe(&s, "k");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("ended:     killed by signal SIGKILL"), "{out}");
    assert!(out.contains("| dying"), "{out}");
}

#[test]
fn non_utf8_output_is_shown_escaped() {
    let s = setup(&resource("u", "{kind: exec, command: [u]}"));
    s.script("u", "#!/bin/sh\nprintf '\\377\\376x\\n'\n");
    let (code, out, _) = probe(&s, "u");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("| \\xff\\xfex"), "{out}");
    assert!(out.contains("not valid UTF-8"), "{out}");
}

#[test]
fn an_insecure_script_shows_the_verdict_and_is_not_run() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let s = setup(&resource("w", "{kind: exec, command: [w]}"));
    let p = s.script("w", "#!/bin/sh\necho 1\n");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, out, _) = probe(&s, "w");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("script check: REFUSED"), "{out}");
    assert!(
        out.contains(&format!("chmod go-w {}", p.display())),
        "{out}"
    );
    assert!(out.contains("ended:     not started"), "{out}");
}

#[test]
fn a_script_without_the_exec_bit_gets_the_same_verdict_as_check() {
    use std::os::unix::fs::PermissionsExt;
    // Not `w`: a name not in plugin_dir is looked up on the PATH, where procps has a `w`.
    let s = setup(&resource("w", "{kind: exec, command: [w.sh]}"));
    let p = s.script("w.sh", "#!/bin/sh\necho 1\n");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, out, _) = probe(&s, "w");
    assert_eq!(code, 1, "{out}");
    let wanted = format!(
        "script check: PROBLEM: {p} is not executable (mode 0644); fix: chmod 755 {p}",
        p = p.display()
    );
    assert!(out.contains(&wanted), "{out}");
    std::fs::remove_file(&p).unwrap();
    let (_, out, _) = probe(&s, "w");
    let wanted = format!(
        "script check: PROBLEM: {} not found (`w.sh` is not an absolute path, so it is looked up in plugin_dir {}, then on the probes' PATH {}, and is in neither)",
        p.display(),
        s.path().display(),
        xce_agent::probe::path::PROBE_PATH
    );
    assert!(out.contains(&wanted), "{out}");
}

#[test]
fn a_stream_probe_reports_its_first_values() {
    let s = setup(&format!(
        "{}  - {{name: b, valtype: numeric, interval: 60s, resourcemap: [{{location: [default]}}]}}\n",
        resource("a", "{kind: stream, command: [el], format: elim, provides: [a, b]}")
    ));
    s.script("el", "#!/bin/sh\necho \"2 a 1 b 2\"\nexec sleep 1000\n");
    let (code, out, _) = probe(&s, "b");
    assert_eq!(code, 0, "{out}");
    for want in [
        "kind stream",
        "LSF_RESOURCES=a b",
        "ELIM_ABORT_VALUE=97",
        "a = 1",
        "b = 2",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
}

#[test]
fn a_file_probe_and_a_builtin_probe() {
    let s = setup(&format!(
        "{}{}",
        resource("f", "{kind: file, path: FILE}"),
        resource("r1m", "{kind: builtin}")
    ));
    let f = s.path().join("value");
    std::fs::write(&f, "42\n").unwrap();
    let yaml = std::fs::read_to_string(s.path().join("resources.yaml")).unwrap();
    std::fs::write(
        s.path().join("resources.yaml"),
        yaml.replace("FILE", f.to_str().unwrap()),
    )
    .unwrap();
    let (code, out, _) = probe(&s, "f");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("path:      {}", f.display())),
        "{out}"
    );
    assert!(out.contains("f = 42"), "{out}");
    // The sampler takes two samples a second apart, so the run queue has a value.
    let (code, out, _) = probe(&s, "r1m");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("index:     r1m"), "{out}");
    assert!(out.contains("\n    r1m = "), "{out}");
}

#[test]
fn unknown_or_skipped_names_exit_2_with_the_reason() {
    let s = setup(&format!(
        "{}  - {{name: st, valtype: numeric, resourcemap: [{{location: [default]}}]}}\n",
        resource("x", "{kind: exec, command: [x]}")
    ));
    let (code, _, err) = probe(&s, "nope");
    assert_eq!(code, 2);
    assert!(
        err.contains("nope is not probed on node001: no such resource"),
        "{err}"
    );
    let (code, _, err) = probe(&s, "st");
    assert_eq!(code, 2);
    assert!(err.contains("static (no interval)"), "{err}");
    // A near miss of a name, and of this host's name in a resourcemap, is pointed out.
    let (code, _, err) = probe(&s, "xx");
    assert_eq!(code, 2);
    assert!(
        err.contains("no such resource in resources.yaml; did you mean x?"),
        "{err}"
    );
    let s = setup(
        "  - {name: mine, valtype: numeric, interval: 60s, resourcemap: [{location: [node002, node0001]}], probe: {kind: exec, command: [x]}}\n",
    );
    let (code, _, err) = probe(&s, "mine");
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "no instance covers this host (resourcemap names node0001: a typo of node001?)"
        ),
        "{err}"
    );
    let out = assert_cmd::Command::cargo_bin("xce-agent")
        .unwrap()
        .args(["-c", s.agent_yaml().to_str().unwrap(), "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(resourcemap names node0001: a typo of node001?)"),
        "{text}"
    );
}

#[test]
fn a_config_error_exits_2() {
    let s = setup("  - name: [broken\n");
    let (code, _, err) = probe(&s, "x");
    assert_eq!(code, 2, "{err}");
}

/// An admin runs `probe NAME` from a root terminal; the probe runs as `nobody`. It must not
/// reach that terminal: not open `/dev/tty` (which is whatever terminal controls the
/// process), so not type into the admin's shell with TIOCSTI either (as su and bubblewrap
/// once let their children do). The terminal here is a real pty made this process's child's
/// controlling terminal by util-linux's `setsid --ctty`.
#[test]
fn a_probe_cannot_reach_the_terminal_of_the_admin_who_runs_probe_name() {
    use std::os::fd::AsRawFd;
    if std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no setsid(1) (util-linux) to give the agent a controlling terminal");
        return;
    }
    let s = Setup::with_agent(
        &format!(
            "resources:\n{}",
            resource("tty", "{kind: exec, command: [tty_probe]}")
        ),
        "run_as: nobody\n",
    );
    // 1 when the probe could open a controlling terminal, after trying to type a command
    // into it; 0 when it has none.
    s.script(
        "tty_probe",
        "#!/bin/sh\n\
         if (: </dev/tty) 2>/dev/null; then\n\
         python3 -c 'import fcntl, termios\n\
         with open(\"/dev/tty\", \"rb\") as t:\n\
         \x20   for b in b\"echo typed-by-a-probe\\n\": fcntl.ioctl(t, termios.TIOCSTI, bytes([b]))' 2>/dev/null\n\
         echo 1\n\
         else\n\
         echo 0\n\
         fi\n",
    );
    let pty = nix::pty::openpty(None, None).unwrap();
    let out = std::process::Command::new("setsid")
        .arg("--ctty")
        .arg(assert_cmd::cargo::cargo_bin("xce-agent"))
        .args(["-c", s.agent_yaml().to_str().unwrap(), "probe", "tty"])
        .stdin(std::fs::File::from(pty.slave.try_clone().unwrap()))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("tty = 0"),
        "the probe opened the admin's terminal:\n{stdout}{stderr}"
    );
    // Whatever reached the terminal's input queue would be readable on the slave, and echoed
    // to the master.
    for (end, fd) in [("slave", &pty.slave), ("master", &pty.master)] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        match nix::unistd::read(fd, &mut buf) {
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EIO) => {}
            Ok(n) => panic!(
                "the terminal's {end} holds {:?} (fd {})",
                String::from_utf8_lossy(&buf[..n]),
                fd.as_raw_fd()
            ),
            Err(e) => panic!("reading the {end}: {e}"),
        }
    }
}
