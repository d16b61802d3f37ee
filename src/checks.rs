//! What `check` verifies about this host's plan beyond the files themselves: that each probe's
//! program and user exist and would be allowed to run. `check`, `probe NAME` and a reload
//! share these checks, so a reload refuses what `check` calls a problem.

use crate::config::Config;
use crate::plan::Plan;
use crate::probe::{exec, resolve, security};

/// (resource, text) lines, as `check` prints them.
pub type Findings = Vec<(String, String)>;

/// The line `check` prints for a probe that runs program text the script rule cannot prove
/// safe ([`security::program_text`]): every trusted one with its reason, and every other one
/// with the user it runs as (a refused one is a problem already, with its fix).
fn unproven_line(
    spec: &crate::config::ExecSpec,
    plugin_dir: &std::path::Path,
    as_root: bool,
    verdict: &security::Verdict,
) -> Option<String> {
    let resolved = resolve::command(plugin_dir, &spec.command).ok()?;
    let path_var = spec
        .env
        .get("PATH")
        .map_or(crate::probe::path::PROBE_PATH, String::as_str);
    let what = security::program_text(&resolved.program, &resolved.args, path_var)?;
    let line = if spec.shell {
        format!(
            "the shell: line {:?}",
            spec.command.get(2).map_or("", String::as_str)
        )
    } else {
        format!("command {:?}", spec.command)
    };
    let runs = if as_root {
        "as root"
    } else if security::enforced() {
        "as its run_as user"
    } else {
        "as the agent's own user"
    };
    match &spec.trusted {
        Some(why) => Some(format!(
            "trusted ({why}): {line} runs program text {runs} that the script rule cannot prove ({what})"
        )),
        None if as_root && matches!(verdict, security::Verdict::Refused(_)) => None,
        None => Some(format!(
            "unproven: {line} runs program text {runs} that the script rule cannot prove ({what}); the files it names are checked, not what it computes"
        )),
    }
}

/// Problems (a probe cannot run here, or a root agent refuses it) and notes worth knowing.
pub fn plan_checks(config: &Config, plan: &Plan) -> (Findings, Findings) {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let root = security::enforced();
    let mut unenforced = 0;
    // A probe runs as another user than root: its child switches uid before its exec.
    let mut switches_user = false;
    for t in &plan.tasks {
        let Some(spec) = t.kind.exec_spec() else {
            continue;
        };
        let uid = match exec::credentials_for(spec.run_as.as_deref(), &config.agent.run_as) {
            Ok(c) => c.map(|c| c.uid),
            Err(e) => {
                problems.push((t.name.clone(), format!("run_as: {e}")));
                continue;
            }
        };
        switches_user |= uid.is_some_and(|u| !u.is_root());
        let plugin_dir = &config.agent.plugin_dir;
        if let Some(note) = resolve::command(plugin_dir, &spec.command)
            .ok()
            .and_then(|r| r.note(&spec.command[0], plugin_dir))
        {
            notes.push((t.name.clone(), note));
        }
        let verdict = resolve::verdict(
            &spec.command,
            &spec.env,
            plugin_dir,
            uid,
            spec.trusted.as_deref(),
        );
        if let Some(line) = unproven_line(
            spec,
            plugin_dir,
            uid.is_none_or(|u| u.is_root()) && root,
            &verdict,
        ) {
            notes.push((t.name.clone(), line));
        }
        match verdict {
            security::Verdict::Ok => {}
            security::Verdict::Problem(e) | security::Verdict::Refused(e) => {
                problems.push((t.name.clone(), e))
            }
            security::Verdict::Unenforced(e) => {
                unenforced += 1;
                notes.push((t.name.clone(), format!("would be refused as root: {e}")));
            }
        }
        if spec.format.def().peer.state_dir {
            // A run would refuse the plugin's state directory as it is now.
            if let Err(e) = crate::probe::plugin_state::inspect(&t.name, uid) {
                problems.push((t.name.clone(), e.to_string()));
            }
        }
        if !spec.no_new_privs {
            notes.push((
                t.name.clone(),
                "no_new_privs: false: setuid programs it runs can raise its privileges".to_owned(),
            ));
        } else if let Some(setuid) = setuid_program_called(plugin_dir, &spec.command) {
            notes.push((
                t.name.clone(),
                format!(
                    "calls {}, a setuid program: with no_new_privs on (the default) it runs without its privileges and fails (sudo prints nothing on stdout); set `no_new_privs: false` if it must",
                    setuid.display()
                ),
            ));
        }
        if !root {
            if let Some(u) = &spec.run_as {
                notes.push((
                    t.name.clone(),
                    format!("agent is not root: runs as itself, not as {u:?}"),
                ));
            }
        }
    }
    if let Some(text) = root_probes_text(config, plan) {
        notes.push(("-".to_owned(), text));
    }
    if root && switches_user {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let dumpable = read("/proc/sys/fs/suid_dumpable");
        let scope = read("/proc/sys/kernel/yama/ptrace_scope");
        if let Some(text) = ptrace_window_text(dumpable.as_deref(), scope.as_deref()) {
            notes.push(("-".to_owned(), text));
        }
    }
    let runs_programs = plan.tasks.iter().any(|t| t.kind.exec_spec().is_some());
    if runs_programs {
        notes.push(("-".to_owned(), crate::probe::cgroup::check_text()));
        let limits = plan
            .tasks
            .iter()
            .filter_map(|t| Some((t.name.as_str(), &t.kind.exec_spec()?.limits)));
        for text in crate::probe::cgroup::unenforced_limits_text(limits) {
            notes.push(("-".to_owned(), text));
        }
    }
    if !root && runs_programs {
        notes.push((
            "-".to_owned(),
            format!(
                "agent is not root: script permission checks are not enforced (a developer running their own scripts){}",
                if unenforced > 0 { "; see the notes above for what a root agent would refuse" } else { "" }
            ),
        ));
    }
    (problems, notes)
}

/// The first setuid or setgid program a command names (its program, a launcher's command as
/// in `timeout 5 sudo smartctl`, or a word of a `shell:` line), found as the probe would find
/// it: what no_new_privs keeps from gaining its privileges. Every word is looked at, so an
/// argument that happens to name one (`echo mount`) is named too: this is only a note.
fn setuid_program_called(
    plugin_dir: &std::path::Path,
    command: &[String],
) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let is_shell_separator = |c: char| c.is_whitespace() || ";|&()`$<>\"'".contains(c);
    command
        .iter()
        .flat_map(|arg| arg.split(is_shell_separator))
        .filter(|word| !word.is_empty() && !word.starts_with('-'))
        .map(|word| resolve::program(plugin_dir, word).0)
        .find(|path| {
            std::fs::metadata(path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o6000 != 0)
        })
}

/// The exec and stream probes of `plan` that run as root: the agent is root and the probe's
/// `run_as` (else agent.yaml's) is root or a user with uid 0. None for a non-root agent: it
/// runs every probe as itself.
pub fn root_probes(config: &Config, plan: &Plan) -> Vec<String> {
    if !nix::unistd::geteuid().is_root() {
        return Vec::new();
    }
    plan.tasks
        .iter()
        .filter(|t| {
            let Some(spec) = t.kind.exec_spec() else {
                return false;
            };
            match exec::credentials_for(spec.run_as.as_deref(), &config.agent.run_as) {
                Ok(None) => true,
                Ok(Some(c)) => c.uid.is_root(),
                Err(_) => false,
            }
        })
        .map(|t| t.name.clone())
        .collect()
}

/// What `check` notes where a `run_as` probe's child can be traced by its user while it
/// still shares the agent's memory. The child switches its uid before its `execve` (the
/// spawn's `setresuid`); the kernel then sets the memory's dumpable flag from
/// `fs.suid_dumpable`. At 0 (the kernel's default) or 2 (systemd's) only a process with
/// CAP_SYS_PTRACE may attach; at 1 the probe's user may, unless Yama's `ptrace_scope` (1 or
/// more) keeps a process from attaching to anything but its own descendants. Between the
/// switch and the exec (microseconds) such a tracer could write the root agent's memory.
/// `suid_dumpable` and `ptrace_scope` are the two files' texts; a missing Yama is scope 0.
pub fn ptrace_window_text(
    suid_dumpable: Option<&str>,
    ptrace_scope: Option<&str>,
) -> Option<String> {
    let dumpable = suid_dumpable?.trim();
    let scope = ptrace_scope.map_or("0", str::trim);
    (dumpable == "1" && scope == "0").then(|| {
        "WARNING fs.suid_dumpable is 1 and kernel.yama.ptrace_scope is 0 (or Yama is absent): between a run_as probe's uid switch and its exec (microseconds, in every run) its user may ptrace it while it shares the root agent's memory; set fs.suid_dumpable to 0 or 2 (systemd's default), or kernel.yama.ptrace_scope to 1".to_owned()
    })
}

/// Names listed in [`root_probes_text`] before "and N more".
const ROOT_PROBES_LISTED: usize = 10;

/// What `check` notes and the daemon logs at start when probes run as root.
pub fn root_probes_text(config: &Config, plan: &Plan) -> Option<String> {
    let names = root_probes(config, plan);
    if names.is_empty() {
        return None;
    }
    let total = plan
        .tasks
        .iter()
        .filter(|t| t.kind.exec_spec().is_some())
        .count();
    let mut listed = names
        .iter()
        .take(ROOT_PROBES_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > ROOT_PROBES_LISTED {
        listed.push_str(&format!(" and {} more", names.len() - ROOT_PROBES_LISTED));
    }
    let whose = if config.agent.run_as == "root" {
        "agent.yaml says run_as: root"
    } else {
        "their run_as is root"
    };
    Some(format!(
        "{} of {total} probe(s) run as root ({whose}): {listed}; a probe as root can do anything on this host: give it run_as: an unprivileged user unless it needs root",
        names.len()
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    use super::*;
    use crate::plan::plan_for;

    /// A finding `resource: text`, given as parts that all appear in it.
    type Finding = &'static [&'static str];

    /// The findings in the order `plan_checks` gives them. The containment note (`-`, its
    /// text depends on the host) is checked on its own and not listed.
    struct Expect {
        problems: &'static [Finding],
        notes: &'static [Finding],
    }

    struct Case {
        name: &'static str,
        /// The `probe:` of resource `r` (a flow mapping).
        probe: &'static str,
        /// Files the probe finds in plugin_dir: (name, mode); mode 0 makes a directory.
        files: &'static [(&'static str, u32)],
        as_root: Expect,
        as_user: Expect,
    }

    const NONE: Expect = Expect {
        problems: &[],
        notes: &[],
    };
    const NOT_ENFORCED: Finding = &["-: agent is not root: script permission checks are not enforced (a developer running their own scripts)"];
    const NOT_ENFORCED_SEE_ABOVE: Finding = &[
        NOT_ENFORCED[0],
        "; see the notes above for what a root agent would refuse",
    ];
    /// As a user, the temp plugin_dir is the user's own: a root agent would refuse it.
    const WOULD_REFUSE: Finding = &["r: would be refused as root: ", "is owned by uid"];

    const CASES: &[Case] = &[
        Case {
            name: "a builtin probe runs no program: nothing to check, no containment note",
            probe: "{kind: builtin, index: r1m}",
            files: &[],
            as_root: NONE,
            as_user: NONE,
        },
        Case {
            name: "a clean script passes",
            probe: "{kind: exec, command: [ok.sh]}",
            files: &[("ok.sh", 0o755)],
            as_root: NONE,
            as_user: Expect {
                problems: &[],
                notes: &[WOULD_REFUSE, NOT_ENFORCED_SEE_ABOVE],
            },
        },
        Case {
            name: "a missing program is a problem that says where it was looked up",
            probe: "{kind: exec, command: [gone.sh]}",
            files: &[],
            as_root: Expect {
                problems: &[&["r: ", "/gone.sh not found (`gone.sh` is not an absolute path, so it is looked up in plugin_dir "]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[&["r: ", "/gone.sh not found (`gone.sh` is not an absolute path"]],
                notes: &[NOT_ENFORCED],
            },
        },
        Case {
            name: "a program without an execute bit is a problem with the fix",
            probe: "{kind: exec, command: [plain.sh]}",
            files: &[("plain.sh", 0o644)],
            as_root: Expect {
                problems: &[&["r: ", "/plain.sh is not executable (mode 0644); fix: chmod 755 "]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[&["r: ", "/plain.sh is not executable (mode 0644); fix: chmod 755 "]],
                notes: &[NOT_ENFORCED],
            },
        },
        Case {
            name: "a directory is no program",
            probe: "{kind: exec, command: [dir.d]}",
            files: &[("dir.d", 0)],
            as_root: Expect {
                problems: &[&["r: ", "/dir.d is not a regular file"]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[&["r: ", "/dir.d is not a regular file"]],
                notes: &[NOT_ENFORCED],
            },
        },
        Case {
            name: "a group-writable script is refused by a root agent, a note otherwise",
            probe: "{kind: exec, command: [open.sh]}",
            files: &[("open.sh", 0o775)],
            as_root: Expect {
                problems: &[&["r: ", "/open.sh", "chmod go-w"]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[],
                notes: &[
                    &["r: would be refused as root: ", "/open.sh"],
                    NOT_ENFORCED_SEE_ABOVE,
                ],
            },
        },
        Case {
            name: "an unknown run_as is a problem for a root agent, a note otherwise",
            probe: "{kind: exec, command: [ok.sh], run_as: no_such_user_xce}",
            files: &[("ok.sh", 0o755)],
            as_root: Expect {
                problems: &[&["r: run_as: no such user \"no_such_user_xce\""]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[],
                notes: &[
                    WOULD_REFUSE,
                    &["r: agent is not root: runs as itself, not as \"no_such_user_xce\""],
                    NOT_ENFORCED_SEE_ABOVE,
                ],
            },
        },
        Case {
            name: "no_new_privs: false is a note",
            probe: "{kind: exec, command: [ok.sh], no_new_privs: false}",
            files: &[("ok.sh", 0o755)],
            as_root: Expect {
                problems: &[],
                notes: &[&["r: no_new_privs: false: setuid programs it runs can raise its privileges"]],
            },
            as_user: Expect {
                problems: &[],
                notes: &[
                    WOULD_REFUSE,
                    &["r: no_new_privs: false: setuid programs it runs can raise its privileges"],
                    NOT_ENFORCED_SEE_ABOVE,
                ],
            },
        },
        Case {
            name: "a setuid program a shell line calls gets the hint naming no_new_privs: false",
            probe: "{kind: exec, shell: 'helper -n smartctl -A /dev/sda | awk 1'}",
            files: &[("helper", 0o4755)],
            as_root: Expect {
                problems: &[],
                notes: &[
                    &["r: unproven: the shell: line", "as its run_as user that the script rule cannot prove"],
                    &["r: calls ", "/helper, a setuid program: with no_new_privs on", "set `no_new_privs: false` if it must"],
                ],
            },
            as_user: Expect {
                problems: &[],
                notes: &[&["r: calls ", "/helper, a setuid program"], NOT_ENFORCED],
            },
        },
        Case {
            name: "a bare name not in plugin_dir is found on the probes' PATH, and check says where",
            probe: "{kind: exec, command: [sh, -c, 'echo 1']}",
            files: &[],
            as_root: Expect {
                problems: &[],
                notes: &[
                    &["r: `sh` is /", "(not in plugin_dir ", ": found on the probes' PATH /usr/local/sbin:"],
                    &["r: unproven: command [\"sh\", \"-c\", \"echo 1\"] runs program text as its run_as user"],
                ],
            },
            as_user: Expect {
                problems: &[],
                notes: &[&["r: `sh` is /", ": found on the probes' PATH "], NOT_ENFORCED],
            },
        },
        Case {
            name: "an interpreter's relative script is looked up in plugin_dir",
            probe: "{kind: exec, command: [/bin/sh, sub/x.sh]}",
            files: &[("sub", 0)],
            as_root: Expect {
                problems: &[&["r: sh's script sub/x.sh not found: a relative script is looked up in plugin_dir, and ", "/sub/x.sh does not exist"]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[&["r: sh's script sub/x.sh not found"]],
                notes: &[NOT_ENFORCED],
            },
        },
        Case {
            name: "a stream probe's program is checked as an exec's",
            probe: "{kind: stream, command: [gone.sh], format: elim}",
            files: &[],
            as_root: Expect {
                problems: &[&["r: ", "/gone.sh not found"]],
                notes: &[],
            },
            as_user: Expect {
                problems: &[&["r: ", "/gone.sh not found"]],
                notes: &[NOT_ENFORCED],
            },
        },
    ];

    fn config_in(dir: &Path, probe: &str) -> Config {
        let agent = format!("host: node001\nplugin_dir: {}\n", dir.display());
        let resources = format!(
            "resources:\n  - name: r\n    valtype: numeric\n    interval: 60s\n    resourcemap: [{{location: [default]}}]\n    probe: {probe}\n"
        );
        Config {
            agent: crate::config::agent::parse(&dir.join("agent.yaml"), &agent)
                .expect("agent.yaml"),
            resources: crate::config::resources::parse(&dir.join("resources.yaml"), &resources)
                .expect("resources.yaml"),
            digest: String::new(),
        }
    }

    fn plugin_dir_with(files: &[(&str, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        // Under sticky, root-owned /tmp; not writable by others itself.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod temp dir");
        for (name, mode) in files {
            let path = dir.path().join(name);
            if *mode == 0 {
                std::fs::create_dir(&path).expect("mkdir");
            } else {
                std::fs::write(&path, "#!/bin/sh\necho 1\n").expect("write script");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))
                    .expect("chmod script");
            }
        }
        dir
    }

    fn assert_findings(case: &str, what: &str, found: &Findings, expected: &[Finding]) {
        let lines: Vec<String> = found.iter().map(|(r, t)| format!("{r}: {t}")).collect();
        assert_eq!(
            lines.len(),
            expected.len(),
            "{case}: {what} {lines:#?}, expected {expected:?}"
        );
        for (line, parts) in lines.iter().zip(expected) {
            for part in *parts {
                assert!(
                    line.contains(part),
                    "{case}: {what} {line:?} lacks {part:?}"
                );
            }
        }
    }

    #[test]
    fn a_dumpable_uid_switch_without_yama_is_a_warning_and_nothing_else_is() {
        for (dumpable, scope, warned) in [
            (Some("1\n"), Some("0\n"), true),
            (Some("1\n"), None, true),
            (Some("1\n"), Some("1\n"), false),
            (Some("1\n"), Some("3\n"), false),
            (Some("0\n"), Some("0\n"), false),
            (Some("2\n"), None, false),
            (None, None, false),
            (Some("garbage"), Some("0"), false),
        ] {
            let text = ptrace_window_text(dumpable, scope);
            assert_eq!(text.is_some(), warned, "{dumpable:?} {scope:?}: {text:?}");
            if let Some(t) = text {
                assert!(t.contains("fs.suid_dumpable to 0 or 2"), "{t}");
            }
        }
    }

    #[test]
    fn plan_checks_give_each_problem_and_note_of_the_table() {
        let root = security::enforced();
        eprintln!(
            "running as {}: the table's {} column is checked; the other one needs a run as {}",
            if root { "root" } else { "a user" },
            if root { "as_root" } else { "as_user" },
            if root {
                "a user"
            } else {
                "root (CI runs the tests as root)"
            },
        );
        for case in CASES {
            let dir = plugin_dir_with(case.files);
            let config = config_in(dir.path(), case.probe);
            let plan = plan_for(&config, "node001", &BTreeSet::new());
            assert_eq!(plan.tasks.len(), 1, "{}: the probe is planned", case.name);
            let (problems, mut notes) = plan_checks(&config, &plan);
            let containment = notes.iter().position(|(r, t)| {
                r == "-"
                    && (t.starts_with("containment: ") || t.starts_with("no cgroup containment ("))
            });
            let runs_program = !case.probe.contains("builtin");
            assert_eq!(
                containment.is_some(),
                runs_program,
                "{}: a containment note comes with programs only: {notes:#?}",
                case.name
            );
            if let Some(i) = containment {
                notes.remove(i);
            }
            // Whether the default pids limit is enforced depends on the host: the
            // containment tests check that note.
            notes.retain(|(r, t)| !(r == "-" && t.starts_with("limits NOT ENFORCED")));
            // So does this one (the host's sysctls): ptrace_window_text's own test checks it.
            notes.retain(|(r, t)| !(r == "-" && t.starts_with("WARNING fs.suid_dumpable")));
            let expect = if root { &case.as_root } else { &case.as_user };
            assert_findings(case.name, "problems", &problems, expect.problems);
            assert_findings(case.name, "notes", &notes, expect.notes);
        }
    }
}
