//! Exec probes: real child processes, every way a script can go wrong.

use crate::support::{read_pid, script, task_from_yaml, wait_gone};
use xce_agent::output::{Format, OutputError};
use xce_agent::probe::failure::SpawnRefused;
use xce_agent::probe::{run_once, Outcome, RunFailure};
use xce_agent::value::{Reading, Value};

fn yaml(command: &str, extra: &str) -> String {
    format!(
        "resources:\n  - name: p\n    interval: 30\n    probe: {{kind: exec, command: {command}{extra}}}\n  - name: q\n    valtype: string\n    interval: 30\n"
    )
}

async fn run(dir: &std::path::Path, body: &str, extra: &str) -> xce_agent::probe::ProbeRun {
    script(dir, "probe.sh", body);
    let (task, ctx) = task_from_yaml(&yaml("[probe.sh]", extra), "p", dir);
    run_once(&task, &ctx).await
}

fn failed_with(run: &xce_agent::probe::ProbeRun) -> String {
    match &run.readings[0].1 {
        Reading::Failed(e) => e.to_string(),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn value_output_is_typed() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), "#!/bin/sh\necho '  42.5 '\necho ignored\n", "").await;
    assert_eq!(r.outcome, Outcome::Ok);
    assert_eq!(
        r.readings,
        vec![("p".into(), Reading::Ok(Value::Numeric(42.5)))]
    );
}

#[tokio::test]
async fn environment_is_cleared_and_documented() {
    let dir = tempfile::tempdir().unwrap();
    // A variable of this process (cargo and the shell set many), not one the agent sets:
    // read, never set here (a set_var would reach every test sharing the process).
    let (leak, _) = std::env::vars()
        .find(|(k, v)| {
            !v.is_empty()
                && !k.starts_with("XCE_")
                && !["PATH", "SITE", "PWD", "SHLVL", "_"].contains(&k.as_str())
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !k.starts_with(|c: char| c.is_ascii_digit())
        })
        .expect("the test process has an environment variable");
    let body = format!(
        "#!/bin/sh\n[ -z \"${{{leak}:-}}\" ] || exit 3\n[ \"$XCE_HOST\" = node001 ] || exit 4\n[ \"$XCE_RESOURCE\" = p ] || exit 5\n[ \"$XCE_INTERVAL\" = 30 ] || exit 6\n[ \"$SITE\" = x ] || exit 7\nread line && exit 8\necho 1\n"
    );
    let r = run(dir.path(), &body, ", env: {SITE: x}").await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
}

#[tokio::test]
async fn non_zero_exit_fails_with_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        dir.path(),
        "#!/bin/sh\necho 5\necho 'disk not mounted' >&2\nexit 3\n",
        "",
    )
    .await;
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(failed_with(&r), "exited with status 3: disk not mounted");
}

#[tokio::test]
async fn garbage_output_is_a_failure_not_zero() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), "#!/bin/sh\necho 'N/A'\n", "").await;
    assert_eq!(
        failed_with(&r),
        "cannot parse \"N/A\" as numeric: not a number"
    );
    let r = run(dir.path(), "#!/bin/sh\nprintf '4\\0002'\n", "").await;
    assert_eq!(
        failed_with(&r),
        "bad value output: output contains a NUL byte"
    );
    let r = run(dir.path(), "#!/bin/sh\nprintf '\\377\\376'\n", "").await;
    assert_eq!(
        failed_with(&r),
        "bad value output: output is not valid UTF-8 (at byte 0)"
    );
    let r = run(dir.path(), "#!/bin/sh\ntrue\n", "").await;
    assert_eq!(failed_with(&r), "bad value output: empty output");
    // The failure keeps its source: which format, which parse error.
    assert!(
        matches!(
            r.failure.as_deref(),
            Some(RunFailure::Output {
                format: Format::Value,
                error: OutputError::Empty
            })
        ),
        "{:?}",
        r.failure
    );
}

#[tokio::test]
async fn killed_by_signal() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), "#!/bin/sh\nkill -SEGV $$\n", "").await;
    assert_eq!(failed_with(&r), "killed by signal SIGSEGV");
}

#[tokio::test]
async fn missing_program() {
    let dir = tempfile::tempdir().unwrap();
    let (task, ctx) = task_from_yaml(&yaml("[nope.sh]", ""), "p", dir.path());
    let r = run_once(&task, &ctx).await;
    let e = failed_with(&r);
    let wanted = format!(
        "{} not found (`nope.sh` is not an absolute path, so it is looked up in plugin_dir {}, then on the probes' PATH {}, and is in neither)",
        dir.path().join("nope.sh").display(),
        dir.path().display(),
        xce_agent::probe::path::PROBE_PATH
    );
    assert_eq!(e, wanted);
    assert!(
        matches!(r.failure.as_deref(), Some(RunFailure::Refused(why)) if matches!(**why, SpawnRefused::NotRunnable(_))),
        "{:?}",
        r.failure
    );
}

/// A run gives the verdict `check` gives, with the fix, instead of the kernel's EACCES.
#[tokio::test]
async fn a_program_without_the_exec_bit_fails_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = script(dir.path(), "probe.sh", "#!/bin/sh\necho 1\n");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (task, ctx) = task_from_yaml(&yaml("[probe.sh]", ""), "p", dir.path());
    let e = failed_with(&run_once(&task, &ctx).await);
    let wanted = format!(
        "{p} is not executable (mode 0640); fix: chmod 755 {p}",
        p = p.display()
    );
    assert_eq!(e, wanted);
}

/// The probe prints its value and exits, but a backgrounded grandchild keeps stdout open:
/// the run must end at the timeout and leave nothing running.
#[tokio::test]
async fn grandchild_holding_stdout_ends_at_timeout_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let body = format!(
        "#!/bin/sh\nsh -c 'echo $$ > {}; exec sleep 1000' &\necho 7\n",
        pidfile.display()
    );
    let r = run(dir.path(), &body, ", timeout: 1s").await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    let e = failed_with(&r);
    assert!(
        e.starts_with("timed out after 1s: exited, but a background process kept its output open"),
        "{e}"
    );
    wait_gone(read_pid(&pidfile));
}

#[tokio::test]
async fn hung_probe_is_terminated_then_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("p.pid");
    let body = format!(
        "#!/bin/sh\ntrap '' TERM\necho $$ > {}\nwhile :; do sleep 1; done\n",
        pidfile.display()
    );
    let r = run(dir.path(), &body, ", timeout: 1s").await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert!(failed_with(&r).contains("did not finish; process group killed after SIGTERM grace"));
    wait_gone(read_pid(&pidfile));
}

#[tokio::test]
async fn huge_output_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), "#!/bin/sh\nexec yes 12345\n", ", timeout: 20s").await;
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(failed_with(&r), "output exceeds 65536 bytes");
    let detail = r.exec.unwrap();
    assert_eq!(detail.stdout.len(), 65536);
}

#[tokio::test]
async fn kv_feeds_provided_resources_and_types_each() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "multi.sh",
        "#!/bin/sh\necho 'p = 3'\necho 'q = \"a b\"'\necho 'stray = 1'\n",
    );
    let y = "resources:\n  - name: p\n    interval: 30\n    probe: {kind: exec, command: [multi.sh], format: kv, provides: [q]}\n  - name: q\n    valtype: string\n    interval: 30\n";
    let (task, ctx) = task_from_yaml(y, "p", dir.path());
    let r = run_once(&task, &ctx).await;
    assert_eq!(
        r.readings,
        vec![
            ("p".into(), Reading::Ok(Value::Numeric(3.0))),
            ("q".into(), Reading::Ok(Value::String("a b".into())))
        ]
    );
    assert_eq!(r.unexpected, vec!["stray".to_string()]);
}

/// A probe that feeds many resources looks its names up in a set (a few, by a scan): the
/// same names are unexpected either way.
#[tokio::test]
async fn kv_with_many_provided_resources_lists_only_the_strays() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("m{i}")).collect();
    let lines: String = names.iter().map(|n| format!("echo '{n} = 1'\n")).collect();
    script(
        dir.path(),
        "many.sh",
        &format!("#!/bin/sh\n{lines}echo 'stray = 1'\n"),
    );
    let mut y = format!(
        "resources:\n  - name: m0\n    interval: 30\n    probe: {{kind: exec, command: [many.sh], format: kv, provides: [{}]}}\n",
        names[1..].join(", ")
    );
    for n in &names[1..] {
        y.push_str(&format!("  - name: {n}\n    interval: 30\n"));
    }
    let (task, ctx) = task_from_yaml(&y, "m0", dir.path());
    let r = run_once(&task, &ctx).await;
    assert_eq!(r.readings.len(), 12);
    assert!(r
        .readings
        .iter()
        .all(|(_, v)| *v == Reading::Ok(Value::Numeric(1.0))));
    assert_eq!(r.unexpected, vec!["stray".to_string()]);
}

#[tokio::test]
async fn elim_line_with_wrong_count_fails() {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), "elim.sh", "#!/bin/sh\necho '2 p 3'\n");
    let y = "resources:\n  - name: p\n    interval: 30\n    probe: {kind: exec, command: [elim.sh], format: elim}\n";
    let (task, ctx) = task_from_yaml(y, "p", dir.path());
    let r = run_once(&task, &ctx).await;
    assert_eq!(
        failed_with(&r),
        "bad elim output: line 1: count says 2 pairs but 2 words follow"
    );
    assert_eq!(r.outcome, Outcome::Failed);
}

#[tokio::test]
async fn an_elim_declared_exec_that_times_out_is_told_to_use_kind_stream() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        dir.path(),
        "#!/bin/sh\nprintf '1 p'\nexec sleep 1000\n",
        ", format: elim, timeout: 1s",
    )
    .await;
    assert_eq!(r.outcome, Outcome::TimedOut);
    let err = failed_with(&r);
    assert!(
        err.ends_with("(no complete line came; an LSF elim keeps running: declare it `kind: stream` (and `stdout: pty` if it does not flush its output to a pipe))"),
        "{err}"
    );
}

#[tokio::test]
async fn stdout_pty_gives_an_exec_probe_a_terminal_and_plain_newlines() {
    let dir = tempfile::tempdir().unwrap();
    let body = "#!/bin/sh\n[ -t 1 ] && echo 7\n";
    let r = run(dir.path(), body, ", stdout: pty").await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    assert_eq!(r.readings[0].1, Reading::Ok(Value::Numeric(7.0)));
    assert_eq!(r.exec.unwrap().stdout, b"7\n");
    // The same script with a pipe prints nothing: the terminal is what made the value.
    let r = run(dir.path(), body, "").await;
    assert_eq!(r.outcome, Outcome::Failed);
}

/// A probe still running when its quick-exit wait ends (its pipes are watched from then on,
/// beside its exit) still gives its exit and its value.
#[tokio::test]
async fn a_probe_that_outlives_the_quick_exit_wait_is_watched_to_its_exit() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), "#!/bin/sh\nsleep 0.3\necho 9\n", "").await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    assert_eq!(r.readings[0].1, Reading::Ok(Value::Numeric(9.0)));
}

/// A probe's stdout, stderr and capture descriptor block as any pipe's do (the agent's ends
/// are non-blocking from their `pipe2`; the child makes its ends blocking before its exec):
/// a program that writes more than a pipe holds waits for room rather than failing with
/// EAGAIN. The flags are read from the shell's own fdinfo, by the shell (a command would
/// have its output on a pipe of its own).
#[tokio::test]
async fn a_probes_output_pipes_are_blocking() {
    let body = |fds: &str| {
        format!(
            "#!/bin/sh\nbad=\nfor fd in {fds}; do\n  while read -r key value; do\n    \
             if [ \"$key\" = flags: ] && [ $(( $value & 04000 )) -ne 0 ]; then bad=\"$bad $fd\"; fi\n  \
             done < /proc/$$/fdinfo/$fd\ndone\n[ -z \"$bad\" ] || {{ echo \"non-blocking:$bad\" >&2; exit 3; }}\necho 1\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), &body("1 2"), "").await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
    let r = run(dir.path(), &body("1 2 7"), ", capture: [gmetric]").await;
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
}

/// A failed run's reading is the run's typed failure, shared: the exit status and what the
/// script said are data, and the text is the one shown.
#[tokio::test]
async fn a_failed_reading_is_the_typed_failure() {
    use xce_agent::probe::child::Exit;
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), "#!/bin/sh\necho 'disk gone' >&2\nexit 3\n", "").await;
    assert_eq!(failed_with(&r), "exited with status 3: disk gone");
    let Reading::Failed(f) = &r.readings[0].1 else {
        panic!("{:?}", r.readings)
    };
    match f.downcast_ref::<RunFailure>() {
        Some(RunFailure::Ended(e)) => {
            assert_eq!(e.exit, Exit::Code(3));
            assert_eq!(e.said.as_deref(), Some("disk gone"));
        }
        other => panic!("not an ending: {other:?}"),
    }
    // The run and the resource it feeds hold one error, not a copy each.
    let run_failure = r.failure.as_deref().unwrap();
    assert!(std::ptr::addr_eq(
        f.downcast_ref::<RunFailure>().unwrap(),
        run_failure
    ));
}

/// Runs of one probe's loop share its launch (`probe::RunCache`): each run still sees the
/// file system as it is, whatever the launch kept from the first run.
mod reusing_the_launch {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use xce_agent::probe::{run_reusing, RunCache};

    fn value(r: &xce_agent::probe::ProbeRun) -> Reading {
        r.readings[0].1.clone()
    }

    /// A probe of a script by its absolute path (a launch made from the config alone),
    /// that prints 1, and the cache its loop would keep.
    struct Probe {
        dir: tempfile::TempDir,
        path: std::path::PathBuf,
        task: xce_agent::plan::ProbeTask,
        ctx: xce_agent::probe::ProbeContext,
        cache: RunCache,
    }

    fn probe() -> Probe {
        let dir = tempfile::tempdir().unwrap();
        let path = script(dir.path(), "probe.sh", "#!/bin/sh\necho 1\n");
        let command = format!("[{}]", path.display());
        let (task, ctx) = task_from_yaml(&yaml(&command, ""), "p", dir.path());
        Probe {
            dir,
            path,
            task,
            ctx,
            cache: RunCache::default(),
        }
    }

    #[tokio::test]
    async fn a_script_replaced_between_runs_runs_as_the_new_file() {
        let p = probe();
        let first = run_reusing(&p.task, &p.ctx, &p.cache).await;
        assert_eq!(value(&first), Reading::Ok(Value::Numeric(1.0)));
        // A new file renamed over the old one: another inode at the same path.
        script(p.dir.path(), "new.sh", "#!/bin/sh\necho 2\n");
        std::fs::rename(p.dir.path().join("new.sh"), &p.path).unwrap();
        let second = run_reusing(&p.task, &p.ctx, &p.cache).await;
        assert_eq!(value(&second), Reading::Ok(Value::Numeric(2.0)));
        assert_eq!(
            first.exec.unwrap().argv,
            second.exec.unwrap().argv,
            "the same command"
        );
    }

    #[tokio::test]
    async fn a_script_removed_between_runs_fails_the_next_run() {
        let p = probe();
        assert_eq!(
            run_reusing(&p.task, &p.ctx, &p.cache).await.outcome,
            Outcome::Ok
        );
        std::fs::remove_file(&p.path).unwrap();
        let r = run_reusing(&p.task, &p.ctx, &p.cache).await;
        assert_eq!(r.outcome, Outcome::Failed);
        assert!(failed_with(&r).contains("not found"), "{}", failed_with(&r));
        // And back: the next run finds it again.
        script(p.dir.path(), "probe.sh", "#!/bin/sh\necho 3\n");
        let r = run_reusing(&p.task, &p.ctx, &p.cache).await;
        assert_eq!(value(&r), Reading::Ok(Value::Numeric(3.0)));
    }

    #[tokio::test]
    async fn a_script_others_can_write_is_refused_at_the_next_run() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: the script rule is enforced only for a root agent");
            return;
        }
        let p = probe();
        assert_eq!(
            run_reusing(&p.task, &p.ctx, &p.cache).await.outcome,
            Outcome::Ok
        );
        std::fs::set_permissions(&p.path, std::fs::Permissions::from_mode(0o775)).unwrap();
        let r = run_reusing(&p.task, &p.ctx, &p.cache).await;
        assert_eq!(r.outcome, Outcome::Failed);
        assert!(
            failed_with(&r).contains("writable by group or other"),
            "{}",
            failed_with(&r)
        );
    }

    /// The program's identity the rule compares with its passed verdict is the one the
    /// run's runnable check just read: an unchanged script is not walked again, a replaced
    /// one is.
    #[tokio::test]
    async fn the_rule_walks_a_script_again_only_once_it_changed() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: the script rule is enforced only for a root agent");
            return;
        }
        let p = probe();
        let walks = || p.ctx.supervisor.verdicts.full_walks(&p.path);
        for _ in 0..3 {
            let r = run_reusing(&p.task, &p.ctx, &p.cache).await;
            assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.error());
        }
        assert_eq!(walks(), 1);
        script(p.dir.path(), "new.sh", "#!/bin/sh\necho 2\n");
        std::fs::rename(p.dir.path().join("new.sh"), &p.path).unwrap();
        let r = run_reusing(&p.task, &p.ctx, &p.cache).await;
        assert_eq!(value(&r), Reading::Ok(Value::Numeric(2.0)));
        assert_eq!(walks(), 2);
    }

    /// A bare name is looked up at every run: plugin_dir first, then the probes' PATH.
    #[tokio::test]
    async fn a_bare_name_is_looked_up_again_at_each_run() {
        let dir = tempfile::tempdir().unwrap();
        let mine = script(dir.path(), "true", "#!/bin/sh\necho 4\n");
        let (task, ctx) = task_from_yaml(&yaml("[\"true\"]", ""), "p", dir.path());
        let cache = RunCache::default();
        let first = run_reusing(&task, &ctx, &cache).await;
        assert_eq!(value(&first), Reading::Ok(Value::Numeric(4.0)));
        assert_eq!(first.exec.unwrap().argv[0], mine.display().to_string());
        std::fs::remove_file(&mine).unwrap();
        // Now the system's `true`: it prints nothing (no value), but it is what ran.
        let second = run_reusing(&task, &ctx, &cache).await;
        let argv0 = second.exec.unwrap().argv[0].clone();
        assert!(
            argv0 != mine.display().to_string() && argv0.ends_with("/true"),
            "{argv0}"
        );
    }
}
