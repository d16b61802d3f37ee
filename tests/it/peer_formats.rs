//! Other systems' own scripts run unmodified through the agent (`--once --format json`,
//! `probe NAME`): Debian's munin-plugins-core and monitoring-plugins-contrib, netdata's
//! charts.d.plugin with its shipped `sensors` chart, Grid Engine's load sensors, and
//! collectd Exec and Checkmk local-check scripts written as their documentation shows.
//! Values are checked against /proc or the fixture's numbers. `.ci/run` installs the
//! packages; elsewhere a missing one is a printed skip.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::formats::{number, once, probe, required, row};
use crate::support::Setup;
use serde_json::Value as Json;
use xce_agent::config::Format;

/// `--once` that exits 0: every resource answered.
fn answered(s: &Setup) -> Json {
    let (code, json) = once(s);
    assert_eq!(code, Some(0), "{json:#}");
    json
}

fn installed(path: &str, package: &str) -> Option<PathBuf> {
    let p = PathBuf::from(path);
    required(&format!("{path} (Debian {package})"), p.exists()).then_some(p)
}

fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap()
        .split_whitespace()
        .take(3)
        .map(|w| w.parse().unwrap())
        .collect()
}

fn meminfo_kb(key: &str) -> Option<f64> {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")).map(str::to_owned))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name),
    )
    .unwrap()
}

/// The aggregate `user` jiffies in /proc/stat, as munin's cpu plugin prints them (x 100 / HZ).
fn cpu_user() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let user: f64 = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let hz = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    let hz: f64 = String::from_utf8_lossy(&hz.stdout).trim().parse().unwrap();
    (user * 100.0 / hz).round()
}

#[test]
fn munin_core_plugins_load_memory_and_cpu_run_as_munin_node_runs_them() {
    let (Some(load), Some(memory), Some(cpu)) = (
        installed("/usr/share/munin/plugins/load", "munin-plugins-core"),
        installed("/usr/share/munin/plugins/memory", "munin-plugins-core"),
        installed("/usr/share/munin/plugins/cpu", "munin-plugins-core"),
    ) else {
        return;
    };
    // memory's fields add up to MemTotal; the ones this kernel has are printed.
    let mut parts = vec![
        "apps",
        "free",
        "buffers",
        "cached",
        "slab",
        "page_tables",
        "swap_cache",
    ];
    if meminfo_kb("Shmem").is_some() {
        parts.push("shmem");
    }
    if meminfo_kb("Percpu").is_some() {
        parts.push("per_cpu");
    }
    let declared: String = parts
        .iter()
        .map(|p| format!("  - {{name: mem_{p}, interval: 60}}\n"))
        .collect();
    let select: Vec<String> = parts.iter().map(|p| format!("mem_{p}: {p}")).collect();
    let provides: Vec<String> = parts[1..].iter().map(|p| format!("mem_{p}")).collect();
    // `load` sources $MUNIN_LIBDIR/plugins/plugin.sh: it runs only with munin-node's
    // environment, which the format sets.
    let s = Setup::new(&format!(
        r#"
resources:
  - name: load
    interval: 60
    probe: {{kind: exec, command: [{load}], format: munin}}
  - name: mem_apps
    interval: 60
    probe:
      kind: exec
      command: [{memory}]
      format: munin
      provides: [{provides}]
      select: {{{select}}}
{declared_rest}  - name: cpu_user
    interval: 60
    probe: {{kind: exec, command: [{cpu}], format: munin, select: {{cpu_user: user}}}}
"#,
        load = load.display(),
        memory = memory.display(),
        cpu = cpu.display(),
        provides = provides.join(", "),
        select = select.join(", "),
        declared_rest = declared
            .lines()
            .skip(1)
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    ));
    let (before, user_before) = (loadavg(), cpu_user());
    let json = answered(&s);
    let (after, user_after) = (loadavg(), cpu_user());
    // load prints /proc/loadavg's second field.
    let l = number(&json, "load");
    assert!(
        (l - before[1]).abs() < 0.005 || (l - after[1]).abs() < 0.005,
        "load {l}, /proc/loadavg said {before:?} then {after:?}"
    );
    let total: f64 = parts
        .iter()
        .map(|p| number(&json, &format!("mem_{p}")))
        .sum();
    assert_eq!(total, meminfo_kb("MemTotal").unwrap() * 1024.0, "{json:#}");
    let user = number(&json, "cpu_user");
    assert!(
        (user_before..=user_after).contains(&user),
        "cpu user {user}, /proc/stat said {user_before} then {user_after}"
    );
    let (code, text) = probe(&s, "load");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("MUNIN_LIBDIR=/usr/share/munin"), "{text}");
}

#[test]
fn contrib_check_memory_and_load_perfdata_as_the_plugins_print_it() {
    let (Some(memory), Some(load)) = (
        installed(
            "/usr/lib/nagios/plugins/check_memory",
            "monitoring-plugins-contrib",
        ),
        installed(
            "/usr/lib/nagios/plugins/check_madrisan_load",
            "monitoring-plugins-contrib",
        ),
    ) else {
        return;
    };
    let s = Setup::new(&format!(
        r#"
resources:
  - name: mem_total
    interval: 60
    probe: {{kind: exec, command: [{}], format: nagios}}
  - name: load1
    interval: 60
    probe: {{kind: exec, command: [{}], format: nagios}}
"#,
        memory.display(),
        load.display()
    ));
    // The kernel updates the load every 5 s: on a busy machine it can move twice while the
    // agent runs, so a run whose value matches neither side is run again (at most 3 times).
    let mut seen = Vec::new();
    for _ in 0..3 {
        let before = loadavg();
        let json = answered(&s);
        let after = loadavg();
        // `mem_total=24683784kB`: kB as /proc/meminfo means it.
        assert_eq!(
            number(&json, "mem_total"),
            meminfo_kb("MemTotal").unwrap() * 1024.0
        );
        let l = number(&json, "load1");
        // /proc/loadavg rounds to 0.01 (the true load is within 0.005 of it, either way);
        // check_madrisan_load prints three decimals of the same figure (sysinfo's), so
        // 0.455 beside "0.45" agrees (a run failed on exactly that with a strict `<`).
        const AGREES: f64 = 0.005 + 0.001;
        if (l - before[0]).abs() <= AGREES || (l - after[0]).abs() <= AGREES {
            return;
        }
        seen.push((l, before[0], after[0]));
    }
    panic!("load1 never matched /proc/loadavg around it: (load1, before, after) {seen:?}");
}

/// charts.d's `fixid`: non-alphanumerics to `_`, squeezed, trimmed, lower case.
fn netdata_fixid(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    mapped
        .split('_')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

#[test]
fn netdata_charts_d_sensors_through_the_agent_with_its_update_every() {
    let Some(plugin) = installed(
        "/usr/lib/netdata/plugins.d/charts.d.plugin",
        "netdata-plugins-bash",
    ) else {
        return;
    };
    // charts.d.plugin makes its temp dir with `mktemp -d /tmp/...` (TMPDIR ignored) unless it
    // runs as root, then under /var/run: as nobody it needs a world-writable /tmp, which a
    // machine need not have. As root (the test runs as root in CI) it does not.
    let run_as = if nix::unistd::geteuid().is_root() {
        "run_as: root\n"
    } else {
        ""
    };
    let s = Setup::with_agent("resources: []\n", run_as);
    // A hwmon tree under NETDATA_HOST_PREFIX, as the shipped sensors chart reads /sys.
    let hwmon = s
        .path()
        .join("host/sys/devices/platform/coretemp.0/hwmon/hwmon1");
    std::fs::create_dir_all(&hwmon).unwrap();
    std::fs::write(hwmon.join("name"), "coretemp\n").unwrap();
    std::fs::write(hwmon.join("temp1_input"), "45000\n").unwrap();
    std::fs::write(hwmon.join("temp1_label"), "Core 0\n").unwrap();
    // charts.d.conf: only the sensors chart, and exit after a second of updates (netdata
    // restarts it; the agent runs it again at its next interval). The agent passes the
    // interval, 1 s, as charts.d's update-every: it sleeps that long between updates.
    let conf = s.path().join("netdata");
    std::fs::create_dir(&conf).unwrap();
    std::fs::write(
        conf.join("charts.d.conf"),
        "enable_all_charts=\"no\"\nsensors=force\nrestart_timeout=1\n",
    )
    .unwrap();
    let dimension = netdata_fixid(&hwmon.join("temp1_input").display().to_string());
    s.write_atomic(
        "resources.yaml",
        &format!(
            r#"
resources:
  - name: core0_temp
    interval: 1
    probe:
      kind: exec
      command: [{}]
      format: netdata
      timeout: 30
      env: {{NETDATA_HOST_PREFIX: {host}, NETDATA_USER_CONFIG_DIR: {conf}}}
      provides: [run_time]
      select: {{core0_temp: 'sensors.temp_hwmon1_hwmon1_hwmon1_coretemp.{dimension}'}}
  - name: run_time
    interval: 1
"#,
            plugin.display(),
            host = s.path().join("host").display(),
            conf = conf.display(),
        ),
    );
    let json = answered(&s);
    // 45000 millidegrees, divisor 1000.
    assert_eq!(number(&json, "core0_temp"), 45.0);
    // The plugin's own chart, fed by its dimension id without a select.
    assert!(number(&json, "run_time") >= 0.0);
    let (code, text) = probe(&s, "core0_temp");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("NETDATA_UPDATE_EVERY=1"), "{text}");
    // The update-every argument netdata passes is shown as run.
    assert!(
        text.contains(&format!("argv:      {} 1\n", plugin.display())),
        "{text}"
    );
}

/// Drive a Grid Engine load sensor as sge_execd does: a newline asks for a report, which
/// runs from `begin` to `end`; `quit` asks it to exit.
fn one_report(sensor: &Path, sge_root: &Path) -> String {
    let mut child = Command::new(sensor)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("SGE_ROOT", sge_root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\n").unwrap();
    let mut report = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        report.push_str(&line);
        report.push('\n');
        if line == "end" {
            break;
        }
    }
    stdin.write_all(b"quit\n").unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success(), "the sensor exits on quit");
    report
}

/// `SGE_ROOT` as an execd host has it, under `dir`, readable by `nobody`: util/ from the
/// package, and utilbin/ARCH/gethostname (gridengine-exec's binary) as a stub printing this
/// host's name. The root, and the architecture `util/arch` names.
fn sge_root(dir: &Path) -> (PathBuf, String) {
    let root = dir.join("sge");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink("/usr/share/gridengine/util", root.join("util")).unwrap();
    let arch = Command::new(root.join("util/arch"))
        .env("SGE_ROOT", &root)
        .output()
        .unwrap();
    let arch = String::from_utf8_lossy(&arch.stdout).trim().to_owned();
    let bin = root.join("utilbin").join(&arch);
    std::fs::create_dir_all(&bin).unwrap();
    crate::support::script(&bin, "gethostname", "#!/bin/sh\nuname -n\n");
    for d in [dir, &root, &root.join("utilbin"), &bin] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    (root, arch)
}

#[test]
fn grid_engine_load_sensors_reports_parse_with_this_hosts_values() {
    let dir = "/usr/share/gridengine/util/resources/loadsensors";
    let (Some(load), Some(nuser)) = (
        installed(&format!("{dir}/load.sh"), "gridengine-common"),
        installed(&format!("{dir}/nuser.sh"), "gridengine-common"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (root, arch) = sge_root(dir.path());

    let before = loadavg();
    let report = one_report(&load, &root);
    let after = loadavg();
    let parsed = xce_agent::output::parse(Format::Sge, report.as_bytes(), Some(0), "x").unwrap();
    let get = |name: &str| {
        parsed
            .samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value.clone())
    };
    assert_eq!(get("arch"), Some(arch), "{report}");
    // load.sh cuts uptime's text, so which average lands in load.5m depends on uptime's
    // layout (and load.15m may be empty, a line the parser names): it is one of them.
    let l: f64 = get("load.5m").unwrap().parse().unwrap();
    assert!(
        before.iter().chain(&after).any(|v| (v - l).abs() < 0.005),
        "load.5m {l}, /proc/loadavg said {before:?} then {after:?}\n{report}"
    );
    for bad in &parsed.bad_lines {
        assert!(bad.to_string().contains("has no value"), "{bad}\n{report}");
    }

    let report = one_report(&nuser, &root);
    let parsed = xce_agent::output::parse(Format::Sge, report.as_bytes(), Some(0), "x").unwrap();
    let who = Command::new("who").output().unwrap();
    let users: std::collections::BTreeSet<String> = String::from_utf8_lossy(&who.stdout)
        .lines()
        .filter_map(|l| l.split(' ').next().map(str::to_owned))
        .collect();
    assert!(parsed.bad_lines.is_empty(), "{report}");
    assert_eq!(parsed.samples[0].name, "nuser");
    assert_eq!(parsed.samples[0].value, users.len().to_string(), "{report}");
}

#[test]
fn a_collectd_exec_script_gets_collectds_environment() {
    let s = Setup::new(
        r#"
resources:
  - name: total
    interval: 60
    probe:
      kind: exec
      command: [collectd-meminfo.sh]
      format: collectd
      provides: [collectd_interval]
      select: {collectd_interval: 'exec-agent/gauge-interval{host="node001"}'}
  - name: collectd_interval
    interval: 60
"#,
    );
    s.script("collectd-meminfo.sh", &fixture("collectd-meminfo.sh"));
    let json = answered(&s);
    // `total` is the type instance of memory/memory-total: no select needed.
    assert_eq!(
        number(&json, "total"),
        meminfo_kb("MemTotal").unwrap() * 1024.0
    );
    // COLLECTD_HOSTNAME is the agent's host and COLLECTD_INTERVAL the probe's interval.
    assert_eq!(number(&json, "collectd_interval"), 60.0);
    let (code, text) = probe(&s, "total");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("COLLECTD_INTERVAL=60.000"), "{text}");
    assert!(
        !text.contains("did not parse"),
        "PUTNOTIF is not an error: {text}"
    );
}

#[test]
fn a_checkmk_local_check_gives_states_and_metrics() {
    let s = Setup::new(
        r#"
resources:
  - name: mem_total_kb
    interval: 60
    probe:
      kind: exec
      command: [checkmk-meminfo.sh]
      format: checkmk
      provides: [memory_state, answer, thresholds_state, over, kernel, kernel_long]
      select:
        memory_state: 'Memory total'
        thresholds_state: Thresholds
        over: 'over{service="Thresholds"}'
        kernel: 'text{service="Kernel release"}'
        kernel_long: 'long_text{service="Kernel release"}'
  - {name: memory_state, interval: 60}
  - {name: answer, interval: 60}
  - {name: thresholds_state, interval: 60}
  - {name: over, interval: 60}
  - {name: kernel, interval: 60, valtype: string}
  - {name: kernel_long, interval: 60, valtype: string}
  - name: local_checks
    interval: 60
    probe:
      kind: exec
      command: [no-local-checks.sh]
      format: checkmk
      select: {local_checks: {match: 'Memory total', default: 3}}
"#,
    );
    // The agent's local directory with nothing to say: an empty section.
    s.script(
        "no-local-checks.sh",
        "#!/bin/sh\necho '<<<local:sep(0)>>>'\n",
    );
    s.script("checkmk-meminfo.sh", &fixture("checkmk-meminfo.sh"));
    let json = answered(&s);
    assert_eq!(
        number(&json, "mem_total_kb"),
        meminfo_kb("MemTotal").unwrap()
    );
    assert_eq!(number(&json, "memory_state"), 0.0);
    assert_eq!(number(&json, "answer"), 42.0);
    // P: 95 is over the crit level 90.
    assert_eq!(number(&json, "thresholds_state"), 2.0);
    assert_eq!(number(&json, "over"), 95.0);
    let uname = |flag: &str| {
        let out = Command::new("uname").arg(flag).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let kernel = row(&json, "kernel");
    assert_eq!(
        kernel["value"],
        format!("Kernel release: {}", uname("-r")),
        "{kernel:#}"
    );
    assert_eq!(
        row(&json, "kernel_long")["value"],
        format!("machine: {}\\nos: {}", uname("-m"), uname("-s"))
    );
    // No services is an answer: the default stands in, and the run is not a failure.
    assert_eq!(number(&json, "local_checks"), 3.0);
    let (code, text) = probe(&s, "kernel");
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("Kernel release: {}", uname("-r"))),
        "{text}"
    );
    let (code, text) = probe(&s, "local_checks");
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn a_new_format_that_cannot_read_its_output_says_which_line() {
    let s = Setup::new(
        r#"
resources:
  - name: load
    interval: 60
    probe: {kind: exec, command: [not-munin.sh], format: munin}
"#,
    );
    s.script(
        "not-munin.sh",
        "#!/bin/sh\necho 'load 0.5'\necho 'load.value U'\n",
    );
    let (_, json) = once(&s);
    let r = row(&json, "load");
    assert_ne!(r["status"], "ok", "{r:#}");
    let err = r["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("line 1") && err.contains("field.value"),
        "{r:#}"
    );
}

#[test]
fn a_peers_output_in_the_wrong_format_says_which_format_it_looked_like() {
    let s = Setup::new(
        r#"
resources:
  - name: load
    interval: 60
    probe: {kind: exec, command: [munin-load.sh], format: nagios}
"#,
    );
    s.script("munin-load.sh", "#!/bin/sh\necho 'load.value 0.52'\n");
    let (code, json) = once(&s);
    assert_eq!(code, Some(1), "{json:#}");
    let r = row(&json, "load");
    assert_eq!(
        r["error"],
        "\"load\" is not in the probe's output; the output looked like Munin plugin output: did you mean `format: munin`?",
        "{r:#}"
    );
}

#[test]
fn json_records_are_selected_by_their_keys_whatever_their_order() {
    let s = Setup::new(
        r#"
resources:
  - name: gpu0_temp
    interval: 60
    probe:
      kind: exec
      command: [gpus.sh]
      format: json
      provides: [gpu1_temp, psu_temp]
      select:
        gpu0_temp: 'temp{name="gpu",index="0"}'
        gpu1_temp: 'temp{name="gpu",index="1"}'
        psu_temp: 'sensor.temp{name="psu"}'
  - {name: gpu1_temp, interval: 60}
  - {name: psu_temp, interval: 60}
"#,
    );
    // As Telegraf's json format with json_name_key = "name", tag_keys = ["index"] reads it.
    s.script(
        "gpus.sh",
        "#!/bin/sh\necho '[{\"name\": \"gpu\", \"index\": 1, \"temp\": 58}, {\"name\": \"psu\", \"sensor\": {\"temp\": 40}}, {\"name\": \"gpu\", \"index\": 0, \"temp\": 61}]'\n",
    );
    let json = answered(&s);
    assert_eq!(number(&json, "gpu0_temp"), 61.0);
    assert_eq!(number(&json, "gpu1_temp"), 58.0);
    assert_eq!(number(&json, "psu_temp"), 40.0);
}

/// Debian's `diskstats` plugin keeps its last counters between runs with Munin::Plugin's
/// `save_state` in `$MUNIN_STATEFILE`: its first run prints nothing and saves them, the next
/// prints rates. The probe's own state directory is made for the user it runs as (`nobody`
/// when the tests run as root), private; one that is a link elsewhere is refused.
#[test]
fn a_munin_plugin_keeps_its_state_in_the_probes_own_directory() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let Some(diskstats) = installed("/usr/share/munin/plugins/diskstats", "munin-plugins-core")
    else {
        return;
    };
    let config = |select: &str| {
        format!(
            "resources:\n  - name: disk_util\n    interval: 60\n    probe: {{kind: exec, command: [{}], format: munin, select: {{disk_util: '{select}'}}}}\n",
            diskstats.display()
        )
    };
    let s = Setup::new(&config("unknown_yet"));
    // The first run saves the counters and prints no value.
    let (code, json) = once(&s);
    assert_eq!(code, Some(1), "{json:#}");
    let dir = s.file("state/plugin-state/disk_util");
    let meta = std::fs::symlink_metadata(&dir).expect("the probe's state directory");
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let run_as = if nix::unistd::geteuid().is_root() {
        nix::unistd::User::from_name("nobody").unwrap().unwrap().uid
    } else {
        nix::unistd::geteuid()
    };
    assert_eq!(meta.uid(), run_as.as_raw());
    assert!(
        dir.join("disk_util-node001").exists(),
        "no state file in {dir:?}"
    );
    // The next run has the counters: it prints a multigraph of each disk's utilization. The
    // plugin divides by the whole seconds since the saved counters: the next one must begin.
    let since_epoch = || std::time::UNIX_EPOCH.elapsed().unwrap();
    let saved_at = since_epoch().as_secs();
    std::thread::sleep(std::time::Duration::from_secs(saved_at + 1) - since_epoch());
    let (code, text) = probe(&s, "disk_util");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("MUNIN_PLUGSTATE="), "{text}");
    let field = text
        .split("multigraph diskstats_utilization\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        // `probe NAME` shows stdout indented behind a bar.
        .map(|l| l.trim_start().trim_start_matches('|').trim())
        .and_then(|l| l.split_once(".value"))
        .map(|(f, _)| f.to_owned())
        .unwrap_or_else(|| panic!("no utilization graph in {text}"));
    std::fs::write(
        s.file("resources.yaml"),
        config(&format!("diskstats_utilization.{field}")),
    )
    .unwrap();
    let json = answered(&s);
    let util = number(&json, "disk_util");
    assert!((0.0..=100.0).contains(&util), "{json:#}");
    // A state directory that is a link to another directory is not handed to the plugin.
    let elsewhere = s.file("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    let (code, json) = once(&s);
    assert_eq!(code, Some(1), "{json:#}");
    let error = row(&json, "disk_util")["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.contains("is a symbolic link"), "{json:#}");
    // `check` says so before any run, and makes nothing.
    let out = crate::formats::agent(&s).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("disk_util: ") && text.contains("is a symbolic link"),
        "{text}"
    );
}

#[test]
fn the_probes_own_env_wins_over_the_peers() {
    let s = Setup::new(
        r#"
resources:
  - name: elsewhere_interval
    interval: 60
    probe:
      kind: exec
      command: [collectd-meminfo.sh]
      format: collectd
      env: {COLLECTD_HOSTNAME: elsewhere, COLLECTD_INTERVAL: "7"}
      select: {elsewhere_interval: 'exec-agent/gauge-interval{host="elsewhere"}'}
"#,
    );
    s.script("collectd-meminfo.sh", &fixture("collectd-meminfo.sh"));
    let json = answered(&s);
    assert_eq!(number(&json, "elsewhere_interval"), 7.0);
}

/// A load sensor as Grid Engine's documentation writes one: it waits for a newline on its
/// stdin, answers `begin` / `host:name:value` / `end`, and exits on `quit`.
const SENSOR: &str = r#"#!/bin/sh
host=$(uname -n)
while read -r line; do
  [ "$line" = quit ] && exit 0
  echo begin
  echo "$host:sensor_load:3.5"
  echo "global:licenses_free:12"
  echo end
done
"#;

#[test]
fn a_load_sensor_is_a_stream_asked_by_newline_and_told_to_quit() {
    let s = Setup::new(
        r#"
resources:
  - name: sensor_load
    interval: 60
    probe:
      kind: stream
      command: [sensor.sh]
      format: sge
      provides: [licenses_free]
  # The `global:` line's value is the cluster's: a shared instance, reported by node001.
  - name: licenses_free
    interval: 60
    resourcemap: [{location: [node001]}]
"#,
    );
    s.script("sensor.sh", SENSOR);
    // No `stdin:` in the config: `format: sge` asks for each report as sge_execd does.
    let json = answered(&s);
    assert_eq!(number(&json, "sensor_load"), 3.5);
    assert_eq!(number(&json, "licenses_free"), 12.0);
    // Stopped with `quit` before any SIGTERM: the sensor exits by itself, with status 0.
    let (code, text) = probe(&s, "sensor_load");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("exited with status 0"), "{text}");
}

#[test]
fn grid_engines_own_nuser_sensor_runs_unmodified_as_a_stream() {
    let Some(nuser) = installed(
        "/usr/share/gridengine/util/resources/loadsensors/nuser.sh",
        "gridengine-common",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (root, _) = sge_root(dir.path());
    let s = Setup::new(&format!(
        r#"
resources:
  - name: nuser
    interval: 60
    probe:
      kind: stream
      command: [{}]
      format: sge
      env: {{SGE_ROOT: {}}}
"#,
        nuser.display(),
        root.display()
    ));
    let json = answered(&s);
    let who = Command::new("who").output().unwrap();
    let users: std::collections::BTreeSet<String> = String::from_utf8_lossy(&who.stdout)
        .lines()
        .filter_map(|l| l.split(' ').next().map(str::to_owned))
        .collect();
    assert_eq!(number(&json, "nuser"), users.len() as f64, "{json:#}");
}

/// Grid Engine's `maui.sh` sensor reports `/tmp`'s size as `df -k` blocks with SGE's `k`
/// multiplier (`disk_total:30832636k`): bytes as SGE reads them, k = 1000 (`sge_types(1)`).
#[test]
fn grid_engines_maui_sensor_reports_memory_values_with_a_multiplier() {
    let Some(maui) = installed(
        "/usr/share/gridengine/util/resources/loadsensors/maui.sh",
        "gridengine-common",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (root, _) = sge_root(dir.path());
    let s = Setup::new(&format!(
        r#"
resources:
  - name: disk_total
    interval: 60
    probe:
      kind: stream
      command: [{}]
      format: sge
      env: {{SGE_ROOT: {}}}
      provides: [oslevel]
  - {{name: oslevel, interval: 60, valtype: string}}
"#,
        maui.display(),
        root.display()
    ));
    let json = answered(&s);
    let df = Command::new("df").args(["-k", "/tmp"]).output().unwrap();
    let blocks: f64 = String::from_utf8_lossy(&df.stdout)
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(number(&json, "disk_total"), blocks * 1000.0, "{json:#}");
    let (code, text) = probe(&s, "disk_total");
    assert_eq!(code, Some(0), "{text}");
}

/// A collectd Exec script as collectd-exec(5) shows the usual one: it loops for as long as
/// it lives, a batch of PUTVALs per interval.
const COLLECTD_LOOP: &str = r#"#!/bin/sh
HOSTNAME="${COLLECTD_HOSTNAME:-localhost}"
INTERVAL="${COLLECTD_INTERVAL:-60}"
while :; do
  total=$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo)
  echo "PUTNOTIF severity=okay time=$(date +%s) message=starting a batch"
  echo "PUTVAL \"$HOSTNAME/memory/memory-total\" interval=$INTERVAL N:$total"
  echo "PUTVAL \"$HOSTNAME/exec-agent/gauge-interval\" interval=$INTERVAL N:$INTERVAL"
  sleep "${INTERVAL%.*}"
done
"#;

#[test]
fn a_looping_collectd_exec_script_is_a_stream() {
    let s = Setup::new(
        r#"
resources:
  - name: total
    interval: 60
    probe:
      kind: stream
      command: [collectd-loop.sh]
      format: collectd
      provides: [collectd_interval]
      select: {collectd_interval: 'exec-agent/gauge-interval'}
  - name: collectd_interval
    interval: 60
"#,
    );
    s.script("collectd-loop.sh", COLLECTD_LOOP);
    // The first values wait for both PUTVALs: each line carries one of them.
    let json = answered(&s);
    assert_eq!(
        number(&json, "total"),
        meminfo_kb("MemTotal").unwrap() * 1024.0
    );
    assert_eq!(number(&json, "collectd_interval"), 60.0);
}

#[test]
fn a_bad_collectd_line_on_a_stream_says_which() {
    let s = Setup::new(
        r#"
resources:
  - name: total
    interval: 60
    probe: {kind: stream, command: [bad.sh], format: collectd}
"#,
    );
    s.script("bad.sh", "#!/bin/sh\necho 'PUTVAL nonsense'\nsleep 60\n");
    let (code, json) = once(&s);
    assert_eq!(code, Some(1), "{json:#}");
    let error = row(&json, "total")["error"].as_str().unwrap().to_owned();
    assert!(error.contains("bad collectd line"), "{error}");
}

/// A netdata external plugin as plugins.d describes one: charts declared once, then an
/// update of each per update-every (its first argument), for as long as it lives.
const NETDATA_PLUGIN: &str = r#"#!/bin/sh
every="${1:-1}"
echo "CHART example.random '' 'A random number' 'n' random example.random line 1 $every"
echo "DIMENSION r1 '' absolute 1 1000"
echo "CHART example.static '' 'A number' 'n' static example.static line 2 $every"
echo "DIMENSION fixed '' absolute 3 2"
while :; do
  echo "BEGIN example.random"
  echo "SET r1 = 2500"
  echo "END"
  echo "BEGIN example.static"
  echo "SET fixed = 7"
  echo "END"
  sleep "$every"
done
"#;

#[test]
fn a_netdata_plugin_is_a_stream_whose_charts_are_declared_once() {
    let s = Setup::new(
        r#"
resources:
  - name: r1
    interval: 2
    probe:
      kind: stream
      command: [example.plugin]
      format: netdata
      provides: [fixed]
  - name: fixed
    interval: 2
"#,
    );
    s.script("example.plugin", NETDATA_PLUGIN);
    let json = answered(&s);
    // SET x multiplier / divisor, the scale of the DIMENSION declared before the updates.
    assert_eq!(number(&json, "r1"), 2.5);
    assert_eq!(number(&json, "fixed"), 10.5);
    let (code, text) = probe(&s, "r1");
    assert_eq!(code, Some(0), "{text}");
    // Run as netdata runs it: its update-every, the interval, as its first argument.
    assert!(text.contains("example.plugin 2\n"), "{text}");
}

/// A `shell:` line in a format whose system passes arguments (netdata's update-every) gets
/// them as its positional parameters, after `-c LINE` and `$0`, never in front of `-c`.
#[test]
fn a_shell_line_gets_the_peers_arguments_as_its_positional_parameters() {
    let s = Setup::new(
        r#"
resources:
  - name: every
    interval: 3
    probe:
      kind: exec
      shell: 'printf "CHART a.b\nDIMENSION every\nBEGIN a.b\nSET every = %s\nEND\n" "$1"'
      format: netdata
"#,
    );
    let json = answered(&s);
    assert_eq!(number(&json, "every"), 3.0);
}

/// The daemon streams what the formats read, and `listen`'s text lines show it as measured:
/// a Checkmk informational check's text, a load sensor's memory value with SGE's `k`, and
/// nested ClassAd attributes (one a fraction the 2-decimal tables would show as 0).
#[test]
fn checkmk_text_sge_memory_and_nested_classads_reach_listen_through_the_daemon() {
    let mut listen = crate::support::ListenProc::spawn_format("text");
    let site = crate::support::Site::new(
        &[listen.addr.to_string()],
        r#"
resources:
  - name: cpu_level
    valtype: string
    interval: 1
    probe:
      kind: exec
      command: [cpu_level.sh]
      format: checkmk
      select: {cpu_level: 'text{service="CPU x86-64 level"}'}
  - name: tmpfree
    valtype: numeric
    interval: 1
    probe: {kind: stream, command: [tmpfree.sh], format: sge}
  - name: gpu_temp
    valtype: numeric
    interval: 1
    probe:
      kind: exec
      command: [gpus.sh]
      format: classad
      provides: [gpu_util]
      select: {gpu_temp: GPU_5368a050.DieTempC, gpu_util: GPU_5368a050.Util}
  - {name: gpu_util, valtype: numeric, interval: 1}
"#,
    );
    site.script(
        "cpu_level.sh",
        "#!/bin/sh\necho '0 \"CPU x86-64 level\" - CPU x86_64 level: x86-64-v4'\n",
    );
    site.script(
        "tmpfree.sh",
        "#!/bin/sh\nwhile read -r line; do\n  [ \"$line\" = quit ] && exit 0\n  printf 'begin\\n%s:tmpfree:77261344k\\nend\\n' \"$(uname -n)\"\ndone\n",
    );
    site.script(
        "gpus.sh",
        "#!/bin/sh\necho 'DetectedGPUs=\"GPU-5368a050\"'\necho 'GPU_5368a050=[ id=\"GPU-5368a050\"; DieTempC=28; Util=0.002; ]'\n",
    );
    let mut agent = site.spawn_agent();
    let mut want: std::collections::BTreeMap<&str, &str> = [
        ("cpu_level", "CPU x86_64 level: x86-64-v4"),
        ("tmpfree", "77261344000"),
        ("gpu_temp", "28"),
        ("gpu_util", "0.002"),
    ]
    .into_iter()
    .collect();
    let mut seen = Vec::new();
    while !want.is_empty() {
        let line = listen
            .stdout
            .recv_timeout(crate::support::HANG_GUARD)
            .unwrap_or_else(|e| panic!("listen printed no more lines ({e}); saw {seen:#?}"));
        want.retain(|name, value| {
            !line.starts_with(&format!("node001 {name} ok {value} last_report="))
        });
        seen.push(line);
    }
    agent.assert_alive();
    listen.assert_alive();
}
