//! The spawn itself (clone with CLONE_VM, raw system calls in the child): what a child starts
//! with — its own session and process group, only descriptors 0-2, an empty signal mask,
//! default dispositions, no_new_privs — and exec failures reported with their errno and path.
//! An exec run's child is cloned without the vfork wait: its failures before exec are
//! reported at its exit, and its stack and plan outlive its handle.

use crate::support as common;

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use xce_agent::probe::child::{self, ChildSpec, Exit};

fn sh(script: &str) -> ChildSpec {
    let mut spec = ChildSpec::new("/bin/sh", Duration::from_secs(30));
    spec.args = vec![OsString::from("-c"), OsString::from(script)].into();
    spec
}

async fn output(spec: &ChildSpec) -> (child::ChildOutcome, String) {
    let o = child::run(spec).await.expect("spawn");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    (o, text)
}

fn status_field(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in {out}"))
        .trim()
        .to_owned()
}

#[tokio::test]
async fn the_child_leads_its_own_process_group() {
    let (o, out) = output(&sh("awk '{print $5}' /proc/$$/stat")).await;
    assert_eq!(o.exit, Exit::Code(0));
    assert_eq!(out.trim(), o.pid.to_string());
}

/// A session of its own: no controlling terminal, whatever terminal the agent has (fields 6
/// and 7 of /proc/<pid>/stat: the session and the terminal, 0 for none).
#[tokio::test]
async fn the_child_leads_a_session_of_its_own_without_a_terminal() {
    let (o, out) = output(&sh("awk '{print $6, $7}' /proc/$$/stat")).await;
    assert_eq!(o.exit, Exit::Code(0));
    assert_eq!(out.trim(), format!("{} 0", o.pid));
}

#[tokio::test]
async fn only_descriptors_0_to_2_reach_the_child() {
    // A descriptor the agent inherited or opened without close-on-exec. (Other tests' children
    // started by `Command` may inherit it too meanwhile: it harms none of them.)
    let stray = std::fs::File::open("/etc/hostname").unwrap();
    let inheritable = nix::unistd::dup(&stray).unwrap();
    assert!(inheritable.as_raw_fd() > 2);
    let (o, out) = output(&sh("ls /proc/$$/fd")).await;
    assert_eq!(o.exit, Exit::Code(0));
    let fds: Vec<&str> = out.lines().collect();
    assert_eq!(fds, ["0", "1", "2"], "the child saw {fds:?}");
}

/// `capture:`'s pipe is the one more descriptor a probe gets, on 7 (what the stand-ins write
/// to), and what is written there comes back with the outcome, apart from stdout.
#[tokio::test]
async fn a_capture_child_also_gets_its_pipe_on_descriptor_7_and_nothing_else() {
    let stray = std::fs::File::open("/etc/hostname").unwrap();
    let _inheritable = nix::unistd::dup(&stray).unwrap();
    let mut spec = sh("ls /proc/$$/fd; printf 'gmetric\\0000\\0' >&7");
    spec.capture = true;
    let (o, out) = output(&spec).await;
    assert_eq!(o.exit, Exit::Code(0));
    let fds: Vec<&str> = out.lines().collect();
    assert_eq!(fds, ["0", "1", "2", "7"], "the child saw {fds:?}");
    let captured = o.captured.expect("a capture pipe");
    assert_eq!(captured.bytes, b"gmetric\x000\x00");
    assert!(!captured.overflowed);
    // Without `capture`, 7 is as closed as the rest.
    let (o, _) = output(&sh("printf x >&7")).await;
    assert_ne!(o.exit, Exit::Code(0));
    assert!(o.captured.is_none());
}

#[tokio::test]
async fn the_child_starts_with_an_empty_mask_and_default_dispositions() {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
    // Blocked in the spawning thread; the agent (Rust's runtime) also ignores SIGPIPE.
    let mut set = SigSet::empty();
    set.add(Signal::SIGUSR1);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).unwrap();
    let (o, out) = output(&sh("cat /proc/self/status")).await;
    pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None).unwrap();
    assert_eq!(o.exit, Exit::Code(0));
    assert_eq!(status_field(&out, "SigBlk"), "0000000000000000");
    assert_eq!(status_field(&out, "SigIgn"), "0000000000000000");
}

#[tokio::test]
async fn no_new_privs_is_set_unless_the_probe_opts_out() {
    let mut spec = sh("cat /proc/self/status");
    let (_, out) = output(&spec).await;
    assert_eq!(status_field(&out, "NoNewPrivs"), "1");
    spec.no_new_privs = false;
    let (_, out) = output(&spec).await;
    assert_eq!(status_field(&out, "NoNewPrivs"), "0");
}

async fn spawn_error(program: &Path) -> String {
    let spec = ChildSpec::new(program, Duration::from_secs(5));
    match child::run(&spec).await {
        Ok(o) => panic!("{} started: {o:?}", program.display()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn exec_failures_carry_their_errno_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let e = spawn_error(&missing).await;
    assert_eq!(
        e,
        format!(
            "cannot start {}: No such file or directory (os error 2)",
            missing.display()
        )
    );

    let not_executable = dir.path().join("plain");
    std::fs::write(&not_executable, "#!/bin/sh\necho 1\n").unwrap();
    let e = spawn_error(&not_executable).await;
    assert_eq!(
        e,
        format!(
            "cannot start {}: Permission denied (os error 13)",
            not_executable.display()
        )
    );

    // Executable, but neither a #! script nor a binary: no silent fallback to a shell, and
    // the kernel's errno said in words.
    let garbage = common::script(dir.path(), "garbage", "echo no shebang\n");
    let e = spawn_error(&garbage).await;
    assert_eq!(
        e,
        format!(
            "cannot start {g}: {g} has no #! line and is not a binary the kernel can run; fix: make its first line #!/bin/sh (or the interpreter it is written for) (the kernel said: Exec format error (os error 8))",
            g = garbage.display()
        )
    );
}

#[tokio::test]
async fn a_failed_credential_switch_names_its_stage() {
    if nix::unistd::geteuid().is_root() {
        eprintln!("skipped: as root every switch succeeds; the test needs an unprivileged agent");
        return;
    }
    let mut spec = sh("true");
    spec.credentials = Some(std::sync::Arc::new(child::Credentials::new(
        "root".into(),
        nix::unistd::Uid::from_raw(0),
        nix::unistd::Gid::from_raw(0),
        vec![],
    )));
    let e = child::run(&spec).await.unwrap_err().to_string();
    assert!(
        e.contains("setgroups failed: Operation not permitted"),
        "{e}"
    );
}

/// The agent binary started with a stray descriptor open (as a launching shell leaves them):
/// the probe, run as `nobody` when the agent is root, does not see it.
#[test]
fn a_probe_cannot_see_a_descriptor_the_agent_inherited() {
    let s = common::Setup::new(&format!(
        "resources:\n{}",
        common::resource("fds", "{kind: exec, command: [fds], format: kv}")
    ));
    s.script(
        "fds",
        "#!/bin/sh\nfor f in $(ls /proc/$$/fd); do echo \"fd$f = 1\"; done\necho \"fds = 1\"\n",
    );
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "exec 7</etc/hostname 9</etc/hostname; exec {} --config {} probe fds",
            env!("CARGO_BIN_EXE_xce-agent"),
            s.agent_yaml().display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("fd2 = 1"), "{text}{stderr}");
    assert!(!text.contains("fd7 = 1"), "{text}");
    assert!(!text.contains("fd9 = 1"), "{text}");
}

/// Field 7 of /proc/PID/stat, the controlling terminal's device number (0: none).
fn tty_nr(stat: &str) -> String {
    let after_comm = &stat[stat.rfind(')').expect("stat has a comm") + 2..];
    after_comm.split(' ').nth(4).expect("tty_nr").to_owned()
}

#[tokio::test]
async fn a_pty_stdout_is_a_terminal_without_crlf_and_not_the_controlling_one() {
    let mut spec = sh("[ -t 1 ] && echo tty; [ -t 2 ] || echo 'stderr pipe'; cat /proc/$$/stat");
    spec.stdout = xce_agent::config::StdoutMode::Pty;
    let (o, out) = output(&spec).await;
    // The end of the terminal's output (EIO on the master) is the end of stdout.
    assert_eq!(
        (o.exit, &o.ending),
        (Exit::Code(0), &child::Ending::Finished)
    );
    let mut lines = out.split('\n');
    assert_eq!(lines.next(), Some("tty"), "{out:?}");
    assert_eq!(lines.next(), Some("stderr pipe"), "{out:?}");
    assert!(
        !out.contains('\r'),
        "terminal output processing is off: {out:?}"
    );
    // The child stays in the agent's session, with the agent's controlling terminal (or
    // none), not its stdout's.
    let ours = std::fs::read_to_string("/proc/self/stat").unwrap();
    assert_eq!(tty_nr(lines.next().unwrap()), tty_nr(&ours));
}

#[tokio::test]
async fn a_pty_leaves_no_descriptor_behind_in_the_agent_or_the_child() {
    // The child names its terminal and looks for it among its parent's (this process's)
    // descriptors: a slave the agent kept would also keep the master from ever ending.
    let mut spec = sh(concat!(
        "me=$(readlink /proc/$$/fd/1); echo \"$me\"\n",
        "for f in /proc/$PPID/fd/*; do [ \"$(readlink \"$f\")\" = \"$me\" ] && echo \"agent holds $f\"; done\n",
        "ls -1 /proc/$$/fd"
    ));
    spec.stdout = xce_agent::config::StdoutMode::Pty;
    let (o, out) = output(&spec).await;
    assert_eq!(o.exit, Exit::Code(0));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("/dev/pts/"), "{out}");
    assert_eq!(lines[1..], ["0", "1", "2"], "{out}");
}

#[tokio::test]
async fn a_pty_stdout_is_capped_like_a_pipe() {
    let mut spec = sh("head -c 100000 /dev/zero; exec sleep 1000");
    spec.stdout = xce_agent::config::StdoutMode::Pty;
    spec.stdout_cap = 1000;
    let o = child::run(&spec).await.expect("spawn");
    assert!(
        matches!(o.ending, child::Ending::OutputOverflow { cap: 1000, .. }),
        "{:?}",
        o.ending
    );
    assert_eq!(o.stdout.len(), 1000);
}

#[tokio::test]
async fn stdin_ticks_never_block_on_a_child_that_does_not_read() {
    let mut spec = sh("exec sleep 1000");
    spec.stdin_pipe = true;
    let (mut started, mut reader) = child::Child::start(&spec).expect("spawn");
    // A pipe holds 64 KiB of ticks; past that each tick is dropped, never waited on.
    let sent = (0..1 << 20)
        .take_while(|_| started.tick() == child::Tick::Sent)
        .count();
    assert!((1..1 << 20).contains(&sent), "{sent} ticks sent");
    assert_eq!(started.tick(), child::Tick::Dropped);
    started.terminate(&mut reader, Duration::from_secs(5)).await;
    started.wait().await;
    // Its reader gone, the next tick is EPIPE: reported as closed, not an error.
    assert_eq!(started.tick(), child::Tick::Closed);
}

#[tokio::test]
async fn without_a_stdin_pipe_a_tick_reports_closed() {
    let (started, _reader) = child::Child::start(&sh("exec sleep 1000")).expect("spawn");
    assert_eq!(started.tick(), child::Tick::Closed);
}

#[tokio::test]
async fn output_many_times_the_first_read_buffer_arrives_whole_and_in_order() {
    // The reader starts with small buffers and grows them: nothing may be lost or reordered
    // on the way, on either pipe.
    let (o, out) = output(&sh("seq 1 10000; seq 1 3000 >&2")).await;
    let numbers = |n: u32| (1..=n).map(|i| format!("{i}\n")).collect::<String>();
    assert_eq!(out, numbers(10000));
    let err = numbers(3000);
    assert_eq!(o.stderr_total, err.len() as u64);
    assert_eq!(
        o.stderr_tail,
        err.as_bytes()[err.len() - child::DEFAULT_STDERR_TAIL..]
    );
}

/// A NUL byte cannot reach execve: the environment that holds one is refused before the
/// spawn, with what is wrong.
#[tokio::test]
async fn a_nul_byte_in_the_environment_is_refused_before_the_spawn() {
    let mut spec = ChildSpec::new("/bin/true", Duration::from_secs(5));
    spec.env = child::Env::new(vec![("BAD".into(), "a\0b".into())]);
    let e = child::run(&spec).await.unwrap_err().to_string();
    assert!(
        e.contains("an environment variable contains a NUL byte"),
        "{e}"
    );
}

/// The same spec started with the vfork wait (failure known at the spawn) and as an exec run
/// (without it: known at the child's exit): the same error.
async fn both_ways(spec: &ChildSpec) -> String {
    let at_spawn = match child::Child::start(spec) {
        Ok(_) => panic!("started: {spec:?}"),
        Err(e) => e.to_string(),
    };
    let at_exit = child::run(spec).await.unwrap_err().to_string();
    assert_eq!(at_exit, at_spawn);
    at_exit
}

#[tokio::test]
async fn a_failure_before_exec_is_reported_at_the_exit_as_at_the_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = sh("true");
    spec.cwd = dir.path().join("missing").into();
    let e = both_ways(&spec).await;
    assert!(e.contains("chdir failed: No such file or directory"), "{e}");

    // Above the kernel's nr_open even root cannot raise RLIMIT_NOFILE.
    let mut spec = sh("true");
    spec.limits.open_files = Some(u64::MAX / 2);
    let e = both_ways(&spec).await;
    assert!(
        e.contains("setting a resource limit failed: Operation not permitted"),
        "{e}"
    );

    let e = both_ways(&ChildSpec::new(
        dir.path().join("absent"),
        Duration::from_secs(5),
    ))
    .await;
    assert!(e.ends_with("No such file or directory (os error 2)"), "{e}");
}

/// `sh -c 'echo "$0"' WORD`, with a long word so that each run's plan differs in size.
fn echo_word(word: &str) -> ChildSpec {
    let mut spec = sh("echo \"$0\"");
    spec.args = spec
        .args
        .iter()
        .cloned()
        .chain([OsString::from(word)])
        .collect();
    spec
}

/// `n` exec runs at once on this thread (cloned back to back); each says its own word.
async fn runs_at_once(n: usize, tag: &str) {
    let words: Vec<String> = (0..n)
        .map(|i| format!("{tag}-{i}-{}", "x".repeat(i * 37)))
        .collect();
    let specs: Vec<ChildSpec> = words.iter().map(|w| echo_word(w)).collect();
    let outcomes = futures::future::join_all(specs.iter().map(child::run)).await;
    for (word, outcome) in words.iter().zip(outcomes) {
        let o = outcome.expect("spawn");
        assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{word}\n"));
        assert_eq!(o.exit, Exit::Code(0));
    }
}

#[tokio::test]
async fn more_runs_at_once_than_the_stack_pool_keeps_each_run_on_their_own() {
    runs_at_once(3 * child::STACKS_KEPT, "many").await;
    // And again, on the stacks given back.
    runs_at_once(3 * child::STACKS_KEPT, "again").await;
}

/// Processes whose command line holds `arg`.
fn with_arg(arg: &str) -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
        .filter(|cmdline| cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        .count()
}

#[tokio::test]
async fn a_run_dropped_right_after_its_spawn_ends_its_child_and_the_next_runs_are_whole() {
    for round in 0..20 {
        // GNU sleep adds its arguments: the second one only marks the process.
        let mark = format!("0.{}{round:02}", std::process::id());
        let mut spec = ChildSpec::new("/bin/sleep", Duration::from_secs(300));
        spec.args = vec![OsString::from("1000"), OsString::from(&mark)].into();
        {
            let run = child::run(&spec);
            tokio::pin!(run);
            // One poll: the child is cloned (possibly still before its exec), then the run
            // goes, and its child with it.
            tokio::select! {
                biased;
                _ = &mut run => panic!("a sleep of 1000 s ended"),
                () = std::future::ready(()) => {}
            }
        }
        // Runs cloned while the dropped one's child may still run on its stack and plan (in
        // most rounds it has not reached its exec yet: its loan is quarantined, and the kill
        // finds no group yet, so it goes to the pid).
        runs_at_once(child::STACKS_KEPT + 1, &format!("after{round}")).await;
        common::wait_until("the dropped run's child to be gone", || {
            with_arg(&mark) == 0
        })
        .await;
    }
}

/// Where a seccomp filter refuses `close_range` and `unshare` (a container runtime's, a
/// site's), a child that shares the agent's descriptor table cannot get one of its own: it
/// exits at its first call, the agent says once that it stops sharing, and that run starts
/// again with a child that copies the table, as every later one does: no run fails. The table
/// is shared only where the agent holds many descriptors (two a contained probe's leaf, held
/// from its first run): here from about the 256th of 300 probes run one at a time.
#[cfg(target_arch = "x86_64")]
#[test]
fn where_a_filter_refuses_the_unshare_the_run_starts_again_and_the_next_ones_copy_the_table() {
    const PROBES: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("refuse_unshare");
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seccomp/refuse_unshare.c");
    let built = std::process::Command::new("cc")
        .arg("-o")
        .arg(&wrapper)
        .arg(&source)
        .status()
        .expect("a C compiler (cc) to build the seccomp wrapper");
    assert!(built.success());
    let mut resources = String::from("resources:\n");
    for i in 0..PROBES {
        resources.push_str(&format!(
            "  - name: p{i:03}\n    interval: 30\n    probe: {{kind: exec, command: [one.sh]}}\n"
        ));
    }
    // One run at a time: a run's failure is known before the next starts.
    let s = common::Setup::with_agent(&resources, "max_parallel: 1\n");
    s.script("one.sh", "#!/bin/sh\necho 1\n");
    let out = std::process::Command::new(&wrapper)
        .arg(env!("CARGO_BIN_EXE_xce-agent"))
        .arg("--config")
        .arg(s.agent_yaml())
        .args(["--once", "--format", "json"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.contains("probes are contained: each in its own cgroup") {
        eprintln!(
            "skipped: the agent cannot contain its probes here (no writable cgroup v2), so it \
             holds no descriptors for them and never shares its table; CI runs as root on a \
             host with a cgroup v2 mount"
        );
        return;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    let runs = v["resources"].as_array().unwrap();
    let failed: Vec<_> = runs.iter().filter(|r| r["status"] != "ok").collect();
    assert!(failed.is_empty(), "{failed:#?}\n{stderr}");
    let ok = runs
        .iter()
        .filter(|r| r["status"] == "ok" && r["value"] == 1.0);
    assert_eq!(ok.count(), PROBES, "{stderr}");
    // Said once, with the kernel's word: the one child that tried.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("could not get a descriptor table of its own"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("Operation not permitted"), "{}", said[0]);
}
