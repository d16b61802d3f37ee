//! The script rule's honest half (#36): program text — a `shell:` line, an interpreter's inline
//! code, `env -S`, awk, sed, `find -exec`, `xargs` — cannot be proven safe by reading it, so a
//! root agent refuses it as root unless the probe says why it is `trusted:`; and a path that
//! program text names but that does not exist yet is judged by who may create it, at every
//! run, so a file made later in a directory others can write never runs. And what the child
//! executes is the descriptor the rule judged, not the path.

use crate::support as common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{agent_output, load_task, resource, Setup};
use xce_agent::probe::child::{self, ChildSpec, Exit};
use xce_agent::probe::security::Verdicts;
use xce_agent::probe::{run_once, Outcome};

fn root() -> bool {
    let r = nix::unistd::geteuid().is_root();
    if !r {
        eprintln!("skipped: the rule is enforced by a root agent only (CI runs the tests as root)");
    }
    r
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A YAML scalar for `s` (a JSON string is a YAML double-quoted one).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// `<tmp>` (root's, 0755) holding `open/` (0777) and `safe/` (root's, 0755), each with the
/// same payloads: `x.sh`, `s` and `xname` (shell scripts) and `m.py` (a Python module), each
/// appending a line to the file `$MARK` names and printing 1; and `list`, naming `x.sh` for
/// xargs.
struct Places {
    d: tempfile::TempDir,
    open: PathBuf,
    safe: PathBuf,
}

fn places() -> Places {
    let d = tempfile::tempdir().unwrap();
    chmod(d.path(), 0o755);
    let mut made = Vec::new();
    for name in ["open", "safe"] {
        let dir = d.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for script in ["x.sh", "s", "xname"] {
            common::script(&dir, script, "#!/bin/sh\necho ran >> \"$MARK\"\necho 1\n");
        }
        std::fs::write(
            dir.join("m.py"),
            "import os\nopen(os.environ['MARK'], 'a').write('ran\\n')\nprint(1)\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("list"),
            format!("{}\n", dir.join("x.sh").display()),
        )
        .unwrap();
        made.push(dir);
    }
    chmod(&made[0], 0o777);
    Places {
        safe: made.pop().unwrap(),
        open: made.pop().unwrap(),
        d,
    }
}

/// The spellings that ran code from a world-writable place although the rule reads the line
/// (issue #36), `D` standing for the directory: `shell:` lines, then `command:` argv.
const SHELL_LINES: &[&str] = &[
    "cd D && ./s",
    "cd D; sh s",
    "D/\\x.sh",
    "\"D\"/\"x.sh\"",
    "D/x.s?",
    "D/x.s[h]",
    "PATH=D:$PATH xname",
    "export PYTHONPATH=D; python3 -c 'import m'",
];

const COMMANDS: &[&[&str]] = &[
    &["/usr/bin/env", "-S", "/bin/sh D/x.sh"],
    &["/usr/bin/awk", "BEGIN { system(\"D/x.sh\") }"],
    &["/bin/sed", "-n", "1e D/x.sh", "/etc/hostname"],
    &[
        "/usr/bin/find",
        "D",
        "-name",
        "x.sh",
        "-exec",
        "/bin/sh",
        "{}",
        ";",
    ],
    &["/usr/bin/xargs", "-a", "D/list", "/bin/sh"],
    // Inline code behind an option with a value: once neither checked nor seen as code.
    &["/bin/sh", "-o", "errexit", "-c", "D/x.sh"],
];

/// One resource per spelling, run as root, with `D` = `dir`, writing to `mark-N` beside it;
/// `extra` ends each probe's flow mapping.
fn spellings(p: &Places, dir: &Path, extra: &str) -> (String, Vec<(String, String, PathBuf)>) {
    let d = dir.to_str().unwrap();
    let mut resources = String::from("resources:\n");
    let mut table = Vec::new();
    let lines = SHELL_LINES
        .iter()
        .map(|l| format!("shell: {}", quoted(&l.replace('D', d))));
    let commands = COMMANDS.iter().map(|c| {
        let argv: Vec<String> = c.iter().map(|w| w.replace('D', d)).collect();
        format!("command: {}", serde_json::to_string(&argv).unwrap())
    });
    for (i, (field, text)) in lines
        .map(|l| (l.clone(), l))
        .chain(commands.map(|c| (c.clone(), c)))
        .enumerate()
    {
        let name = format!("p{i}");
        let mark = p.d.path().join(format!("mark-{i}"));
        resources.push_str(&resource(
            &name,
            &format!(
                "{{kind: exec, {field}, run_as: root, env: {{MARK: {}}}{extra}}}",
                quoted(mark.to_str().unwrap())
            ),
        ));
        table.push((name, text, mark));
    }
    (resources, table)
}

/// Without `trusted:`, none of the spellings starts as root, whether the writable code is in
/// a world-writable directory or not: the refusal names program text and how to trust it.
/// With `trusted:` and the code in root's own directory, every one of them runs — the
/// spellings are real ways to run the payload, not lines that fail anyway.
#[tokio::test]
async fn no_spelling_runs_writable_code_as_root_and_trusted_text_runs() {
    if !root() {
        return;
    }
    let p = places();
    let (resources, table) = spellings(&p, &p.open, "");
    let s = Setup::new(&resources);
    for (name, text, mark) in &table {
        let (task, ctx) = load_task(&s, name);
        let run = run_once(&task, &ctx).await;
        assert_eq!(run.outcome, Outcome::Failed, "{text}");
        let err = run.error().unwrap_or_default().to_owned();
        assert!(err.starts_with("refusing to run "), "{text}: {err}");
        assert_eq!(run.exec.unwrap().exit, None, "{text}: it must not start");
        assert!(!mark.exists(), "{text}: the payload ran");
    }
    // The same spellings towards root's own directory: refused as text, with the fix...
    let (resources, table) = spellings(&p, &p.safe, "");
    let s = Setup::new(&resources);
    for (name, text, mark) in &table {
        let (task, ctx) = load_task(&s, name);
        let run = run_once(&task, &ctx).await;
        let err = run.error().unwrap_or_default().to_owned();
        assert!(
            err.contains("it runs program text (") && err.contains("`trusted:`"),
            "{text}: {err}"
        );
        assert!(!mark.exists(), "{text}: the payload ran");
    }
    // ...and run once trusted.
    let (resources, table) = spellings(&p, &p.safe, ", trusted: 'reviewed by the site'");
    let s = Setup::new(&resources);
    for (name, text, mark) in &table {
        let (task, ctx) = load_task(&s, name);
        let run = run_once(&task, &ctx).await;
        assert!(
            mark.exists(),
            "{text}: the trusted line did not run: {:?}",
            run.error()
        );
    }
}

/// A `shell:` line sourcing a file that does not exist yet in a directory anyone may write:
/// refused before the file exists, and still refused once an unprivileged user has made it
/// (the race of #36 that ran such a file 17 times in 60 s); the same for a name in sticky
/// `/tmp`. The probe runs as its unprivileged run_as user: this is not the program-text rule.
#[tokio::test]
async fn a_file_made_later_in_a_writable_directory_never_runs() {
    if !root() {
        return;
    }
    let p = places();
    let later = p.open.join("later.sh");
    let mark = p.open.join("mark");
    let in_tmp = format!("/tmp/xce-later-{}-{}.sh", std::process::id(), line!());
    let s = Setup::new(&format!(
        "resources:\n{}{}",
        resource(
            "later",
            &format!(
                "{{kind: exec, shell: {}}}",
                quoted(&format!(". {}; echo 1", later.display()))
            )
        ),
        resource(
            "tmp",
            &format!(
                "{{kind: exec, shell: {}}}",
                quoted(&format!(". {in_tmp}; echo 1"))
            )
        ),
    ));
    let (task, ctx) = load_task(&s, "later");
    let refused = |run: &xce_agent::probe::ProbeRun| {
        assert_eq!(run.outcome, Outcome::Failed);
        assert!(run.exec.as_ref().unwrap().exit.is_none(), "it started");
        run.error().unwrap_or_default().to_owned()
    };
    let err = refused(&run_once(&task, &ctx).await);
    assert!(
        err.contains(&format!(
            "{} does not exist, and anyone who may write {} (mode 0777) may create it",
            later.display(),
            p.open.display()
        )),
        "{err}"
    );
    // An unprivileged user makes it after the check; the agent's next runs (same verdicts).
    std::fs::write(&later, format!("echo ran >> {}\n", mark.display())).unwrap();
    chmod(&later, 0o644);
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    nix::unistd::chown(&later, Some(nobody.uid), Some(nobody.gid)).unwrap();
    for _ in 0..3 {
        let err = refused(&run_once(&task, &ctx).await);
        assert!(err.starts_with("refusing to run /bin/sh: "), "{err}");
        assert!(err.contains(&later.display().to_string()), "{err}");
    }
    assert!(!mark.exists(), "the file made later ran");
    let (task, ctx) = load_task(&s, "tmp");
    let err = refused(&run_once(&task, &ctx).await);
    assert!(
        err.contains(&format!(
            "{in_tmp} does not exist, and anyone who may write /tmp"
        )),
        "{err}"
    );
}

/// `check` prints every trusted line with its reason and every line whose words it could not
/// prove with the user it runs as; untrusted text as root is a problem with the fix.
#[test]
fn check_lists_trusted_and_unproven_lines() {
    if !root() {
        return;
    }
    let s =
        Setup::new(&format!(
        "resources:\n{}{}{}",
        resource("a", "{kind: exec, shell: 'echo 1'}"),
        resource(
            "b",
            "{kind: exec, shell: 'echo 2', run_as: root, trusted: 'root-only pipeline, reviewed'}"
        ),
        resource("c", "{kind: exec, command: [awk, 'BEGIN { print 3 }'], run_as: root}"),
    ));
    let (code, out) = agent_output(&s.agent_yaml(), &["check"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("a: unproven: the shell: line \"echo 1\" runs program text as its run_as user that the script rule cannot prove (sh -c: code given inline)"),
        "{out}"
    );
    assert!(
        out.contains("b: trusted (root-only pipeline, reviewed): the shell: line \"echo 2\" runs program text as root"),
        "{out}"
    );
    let c = out
        .lines()
        .find(|l| l.starts_with("c: refusing to run "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        c.contains("as root: it runs program text (awk: an awk program")
            && c.contains("`trusted:`"),
        "{c}"
    );
}

/// `trusted:` needs its reason.
#[test]
fn trusted_without_a_reason_is_a_config_error() {
    let s = Setup::new(&format!(
        "resources:\n{}",
        resource("a", "{kind: exec, shell: 'echo 1', trusted: ' '}")
    ));
    let (code, out) = agent_output(&s.agent_yaml(), &["check"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("`trusted` is empty: write why"), "{out}");
}

/// Check `program` as a root agent does before a run, then replace it by a rename (what an
/// attacker who won a directory race, or an admin's deploy, does between check and exec), and
/// run the child the check produced: the checked file runs, never the new one.
async fn run_after_a_swap(program: &Path, replacement: &Path) -> Exit {
    let verdicts = Verdicts::default();
    let checked = verdicts
        .check_and_open(program, &[], &BTreeMap::new(), None)
        .expect("the checked program passes");
    std::fs::rename(replacement, program).unwrap();
    let mut spec = ChildSpec::new(program, Duration::from_secs(10));
    spec.checked = Some(checked);
    child::run(&spec).await.expect("spawn").exit
}

/// A `#!` script runs by its path (its directories passed the rule): its interpreter gets
/// that path as `$0`, which plugins use to find their own files, not `/dev/fd/N`.
#[tokio::test]
async fn a_checked_script_keeps_its_path_as_its_name() {
    if !root() {
        return;
    }
    let p = places();
    let program = common::script(&p.safe, "probe", "#!/bin/sh\necho \"$0\"\n");
    let verdicts = Verdicts::default();
    let mut spec = ChildSpec::new(&program, Duration::from_secs(10));
    spec.checked = Some(
        verdicts
            .check_and_open(&program, &[], &BTreeMap::new(), None)
            .unwrap(),
    );
    let o = child::run(&spec).await.expect("spawn");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{}\n", program.display())
    );
}

#[tokio::test]
async fn a_binary_replaced_after_its_check_runs_as_checked() {
    if !root() {
        return;
    }
    let p = places();
    let program = p.safe.join("probe");
    std::fs::copy("/bin/true", &program).unwrap();
    let new = p.safe.join("new");
    std::fs::copy("/bin/false", &new).unwrap();
    let exit = run_after_a_swap(&program, &new).await;
    assert_eq!(exit, Exit::Code(0), "the replacement (false) ran");
    // The path names the replacement now: the next check judges it, and it is what runs.
    let again = p.safe.join("again");
    std::fs::copy("/bin/true", &again).unwrap();
    assert_eq!(run_after_a_swap(&program, &again).await, Exit::Code(1));
}

/// The descriptor is kept with the passed verdict: later runs reuse it without a new walk
/// while the path names the same file; a file renamed over it is walked and opened afresh.
#[test]
fn the_checked_descriptor_is_reused_until_the_file_changes() {
    if !root() {
        return;
    }
    let p = places();
    let program = p.safe.join("probe");
    std::fs::copy("/bin/true", &program).unwrap();
    let verdicts = Verdicts::default();
    let check = || {
        verdicts
            .check_and_open(&program, &[], &BTreeMap::new(), None)
            .unwrap()
    };
    let first = check();
    let second = check();
    assert!(std::sync::Arc::ptr_eq(&first.fd, &second.fd));
    assert_eq!(verdicts.full_walks(&program), 1);
    let new = p.safe.join("new");
    std::fs::copy("/bin/false", &new).unwrap();
    std::fs::rename(&new, &program).unwrap();
    let third = check();
    assert!(!std::sync::Arc::ptr_eq(&first.fd, &third.fd));
    assert_eq!(verdicts.full_walks(&program), 2);
}

/// A stream probe's `shell:` line as root is refused the same way (one spawn path), and runs
/// once trusted.
#[tokio::test]
async fn a_stream_shell_line_as_root_needs_trusted() {
    if !root() {
        return;
    }
    let probe = |name: &str, extra: &str| {
        format!(
            "{{kind: stream, format: elim, shell: 'echo \"1 {name} 4\"; exec sleep 1000', run_as: root{extra}}}"
        )
    };
    let s = Setup::new(&format!(
        "resources:\n{}{}",
        resource("s", &probe("s", "")),
        resource("t", &probe("t", ", trusted: 'reviewed'")),
    ));
    let (task, ctx) = load_task(&s, "s");
    let run = xce_agent::probe::stream::first_values(&task, &ctx).await;
    let err = run.error().unwrap_or_default().to_owned();
    assert!(
        err.starts_with(
            "refusing to run /bin/sh as root: it runs program text (sh -c: code given inline)"
        ),
        "{err}"
    );
    assert_eq!(run.exec.unwrap().exit, None, "it must not start");
    let (task, ctx) = load_task(&s, "t");
    let run = xce_agent::probe::stream::first_values(&task, &ctx).await;
    assert_eq!(run.outcome, Outcome::Ok, "{:?}", run.error());
    assert_eq!(
        run.readings[0].1,
        xce_agent::value::Reading::Ok(xce_agent::value::Value::Numeric(4.0))
    );
}
