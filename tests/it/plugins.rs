//! The shipped plugins (plugins/*) run as the agent runs them (cleared environment, fixed
//! PATH, XCE_* variables, stdin /dev/null) against fake inputs: fixture sysfs/proc trees and
//! stub commands checked in under tests/fixtures/plugins/stubs/ (checked in, not written at
//! run time, so no test can hit ETXTBSY executing a file another thread still has open).

use crate::support as common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const AGENT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn plugin(name: &str) -> PathBuf {
    root().join("plugins").join(name)
}

fn fixture(rel: &str) -> PathBuf {
    root().join("tests/fixtures/plugins").join(rel)
}

fn stubs(name: &str) -> PathBuf {
    fixture(&format!("stubs/{name}"))
}

/// A plugin invocation with the agent's environment; `stub` dirs go first on PATH.
struct Run {
    cmd: Command,
}

impl Run {
    fn new(name: &str, args: &[&str]) -> Self {
        let mut cmd = Command::new(plugin(name));
        cmd.args(args)
            .env_clear()
            .env("PATH", AGENT_PATH)
            .env("XCE_HOST", "node001")
            .env("XCE_RESOURCE", name)
            .env("XCE_RESOURCES", name)
            .env("XCE_INTERVAL", "60")
            .env("XCE_TIMEOUT", "10")
            .stdin(Stdio::null());
        Run { cmd }
    }

    fn stub(mut self, dir: &str) -> Self {
        self.cmd
            .env("PATH", format!("{}:{AGENT_PATH}", stubs(dir).display()));
        self
    }

    fn path(mut self, path: &str) -> Self {
        self.cmd.env("PATH", path);
        self
    }

    fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    fn output(mut self) -> Output {
        match self.cmd.output() {
            Ok(out) => out,
            Err(e) => panic!("cannot run {:?}: {e}", self.cmd),
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit 0 with exactly `stdout`; returns stderr for further checks.
#[track_caller]
fn assert_ok(out: &Output, stdout: &str) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "exit status; stderr: {err}");
    assert_eq!(text(&out.stdout), stdout, "stdout; stderr: {err}");
    err
}

/// Exit `code`, nothing on stdout, and stderr mentioning `reason`.
#[track_caller]
fn assert_fails(out: &Output, code: i32, reason: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "exit status; stderr: {err}");
    assert_eq!(
        text(&out.stdout),
        "",
        "a failing probe prints nothing on stdout"
    );
    assert!(
        err.contains(reason),
        "stderr {err:?} should contain {reason:?}"
    );
}

// ---------------------------------------------------------------- every plugin

fn plugin_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(root().join("plugins"))
        .expect("plugins/ is readable")
        .map(|e| e.expect("plugins/ entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_plugin_is_an_executable_sh_script_that_parses() {
    let files = plugin_files();
    assert!(
        files.len() >= 6,
        "expected the shipped plugins, found {files:?}"
    );
    for file in files {
        let meta = fs::metadata(&file).expect("plugin metadata");
        assert!(meta.is_file(), "{} is not a regular file", file.display());
        // Git records one executable bit; the rest of the mode follows the checkout's umask
        // (packaging installs them 0755 root:root).
        let mode = meta.permissions().mode();
        assert_ne!(mode & 0o100, 0, "{} is not executable", file.display());
        let body = fs::read_to_string(&file).expect("plugin is text");
        assert!(
            body.starts_with("#!/bin/sh\n"),
            "{} must start with #!/bin/sh",
            file.display()
        );
        for section in [
            "resources.yaml",
            "Usage",
            "Environment",
            "Output",
            "Exit codes",
            "Needs",
        ] {
            assert!(
                body.contains(section),
                "{} header lacks a {section:?} section",
                file.display()
            );
        }
        let check = Command::new("sh")
            .arg("-n")
            .arg(&file)
            .output()
            .expect("run sh -n");
        assert!(
            check.status.success(),
            "sh -n {}: {}",
            file.display(),
            text(&check.stderr)
        );
    }
}

/// shellcheck is not on every build machine (CI installs it): plugins, stubs and the .deb's
/// maintainer scripts are clean.
#[test]
#[ignore = "needs shellcheck; CI runs it with `cargo test -- --ignored`"]
fn plugins_and_stubs_are_shellcheck_clean() {
    common::require_tool("shellcheck", &["--version"], "apt-get install shellcheck");
    let mut files = plugin_files();
    for dir in ["df", "nvidia-smi", "stat", "lmutil"] {
        files.push(stubs(dir).join(dir));
    }
    for script in ["postinst", "prerm", "postrm"] {
        files.push(root().join("packaging/debian").join(script));
    }
    let out = Command::new("shellcheck")
        .args(&files)
        .output()
        .expect("run shellcheck");
    assert!(out.status.success(), "shellcheck:\n{}", text(&out.stdout));
}

// ---------------------------------------------------------------- scratch_free

/// A scratch "mount": a real directory the stub df reports as mounted, and a proc root
/// whose mounts file lists it with the fixture's filesystem type.
struct Scratch {
    _tmp: tempfile::TempDir,
    mount: String,
    proc_root: PathBuf,
}

fn scratch(mounts_fixture: &str) -> Scratch {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("scratch");
    fs::create_dir(&dir).expect("mkdir scratch");
    let mount = fs::canonicalize(&dir)
        .expect("canonical")
        .display()
        .to_string();
    let proc_root = tmp.path().join("proc");
    fs::create_dir(&proc_root).expect("mkdir proc");
    let table = fs::read_to_string(fixture(mounts_fixture)).expect("mounts fixture");
    fs::write(proc_root.join("mounts"), table.replace("@MOUNT@", &mount)).expect("write mounts");
    Scratch {
        _tmp: tmp,
        mount,
        proc_root,
    }
}

fn scratch_free(s: &Scratch, args: &[&str], df_k: &str, df_i: &str) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    all.push(&s.mount);
    Run::new("scratch_free", &all)
        .stub("df")
        .env("DF_K_FIXTURE", fixture(df_k))
        .env("DF_I_FIXTURE", fixture(df_i))
        .env("DF_MOUNT", &s.mount)
        .env("PROC_ROOT", &s.proc_root)
}

#[test]
fn scratch_free_reports_mb_and_inode_percent() {
    let s = scratch("mounts/scratch_lustre");
    let out = scratch_free(
        &s,
        &["-t", "lustre,gpfs"],
        "df/k_scratch.txt",
        "df/i_scratch.txt",
    )
    .output();
    assert_ok(
        &out,
        "scratch_free_mb = 81234\nscratch_inodes_free_pct = 97\n",
    );
}

#[test]
fn scratch_free_value_format_and_prefix() {
    let s = scratch("mounts/scratch_lustre");
    let mb = scratch_free(&s, &["-f", "value"], "df/k_scratch.txt", "df/i_scratch.txt").output();
    assert_ok(&mb, "81234\n");
    let inodes = scratch_free(
        &s,
        &["-f", "value", "-q", "inodes"],
        "df/k_scratch.txt",
        "df/i_scratch.txt",
    )
    .output();
    assert_ok(&inodes, "97\n");
    let named = scratch_free(&s, &["-p", "tmp"], "df/k_scratch.txt", "df/i_scratch.txt").output();
    assert_ok(&named, "tmp_free_mb = 81234\ntmp_inodes_free_pct = 97\n");
}

#[test]
fn scratch_free_without_inode_count_reports_space_only() {
    let s = scratch("mounts/scratch_lustre");
    let out = scratch_free(&s, &[], "df/k_scratch.txt", "df/i_no_inodes.txt").output();
    let err = assert_ok(&out, "scratch_free_mb = 81234\n");
    assert!(err.contains("reports no inode count"), "{err}");
    let value = scratch_free(
        &s,
        &["-f", "value", "-q", "inodes"],
        "df/k_scratch.txt",
        "df/i_no_inodes.txt",
    )
    .output();
    assert_fails(&value, 1, "reports no inode count");
}

#[test]
fn scratch_free_missing_path_fails() {
    let s = scratch("mounts/scratch_lustre");
    let gone = format!("{}/not-there", s.mount);
    let out = Run::new("scratch_free", &[&gone])
        .stub("df")
        .env("DF_K_FIXTURE", fixture("df/k_scratch.txt"))
        .env("DF_I_FIXTURE", fixture("df/i_scratch.txt"))
        .env("DF_MOUNT", &s.mount)
        .output();
    assert_fails(&out, 1, "not-there does not exist");
}

#[test]
fn scratch_free_unmounted_directory_fails_unless_any_dir_allowed() {
    let s = scratch("mounts/scratch_lustre");
    // df says the directory lives on "/": the scratch filesystem is not mounted.
    let out = scratch_free(&s, &[], "df/k_root.txt", "df/i_scratch.txt").output();
    assert_fails(&out, 1, "is not a mount point (it is on /)");
    let any = scratch_free(
        &s,
        &["-d", "-f", "value"],
        "df/k_root.txt",
        "df/i_scratch.txt",
    )
    .output();
    assert_ok(&any, "78968\n");
}

#[test]
fn scratch_free_wrong_filesystem_type_fails() {
    let s = scratch("mounts/scratch_fallback_xfs");
    let out = scratch_free(
        &s,
        &["-t", "lustre"],
        "df/k_scratch.txt",
        "df/i_scratch.txt",
    )
    .output();
    assert_fails(&out, 1, "is a xfs filesystem, expected one of: lustre");
}

#[test]
fn scratch_free_df_failure_and_usage_errors() {
    let s = scratch("mounts/scratch_lustre");
    let out = scratch_free(&s, &[], "df/k_scratch.txt", "df/i_scratch.txt")
        .env("DF_FAIL", "Input/output error")
        .output();
    assert_fails(&out, 1, "Input/output error");
    let no_path = Run::new("scratch_free", &[]).output();
    assert_fails(&no_path, 2, "expected exactly one PATH");
    let bad_format =
        scratch_free(&s, &["-f", "json"], "df/k_scratch.txt", "df/i_scratch.txt").output();
    assert_fails(&bad_format, 2, "-f must be kv or value");
}

// ---------------------------------------------------------------- ib_port_state

fn ib(tree: &Path, args: &[&str]) -> Output {
    Run::new("ib_port_state", args)
        .env("IB_SYSFS_ROOT", tree)
        .output()
}

#[test]
fn ib_all_infiniband_ports_active() {
    let out = ib(&fixture("ib/healthy"), &[]);
    // mlx5_2 is a RoCE (Ethernet) port: skipped without -e.
    assert_ok(
        &out,
        "ib_up = true\nib_active_ports = 2\nib_rate_gbps = 100\n",
    );
    let with_roce = ib(&fixture("ib/healthy"), &["-e"]);
    assert_ok(
        &with_roce,
        "ib_up = true\nib_active_ports = 3\nib_rate_gbps = 25\n",
    );
    let one = ib(&fixture("ib/healthy"), &["-p", "mlx5_0:1"]);
    assert_ok(
        &one,
        "ib_up = true\nib_active_ports = 1\nib_rate_gbps = 200\n",
    );
}

#[test]
fn ib_down_port_makes_ib_up_false_with_reason() {
    let out = ib(&fixture("ib/degraded"), &[]);
    let err = assert_ok(
        &out,
        "ib_up = false\nib_active_ports = 1\nib_rate_gbps = 200\n",
    );
    assert!(
        err.contains("mlx5_1 port 1: state \"1: DOWN\", phys_state \"3: Disabled\""),
        "{err}"
    );
    assert!(err.contains("mlx5_1 port 2: state \"2: INIT\""), "{err}");
    // Only the required port matters with -p.
    let required = ib(&fixture("ib/degraded"), &["-p", "mlx5_0:1"]);
    assert_ok(
        &required,
        "ib_up = true\nib_active_ports = 1\nib_rate_gbps = 200\n",
    );
}

#[test]
fn ib_rate_is_the_slowest_active_port() {
    let out = ib(&fixture("ib/trained_down"), &[]);
    assert_ok(
        &out,
        "ib_up = true\nib_active_ports = 2\nib_rate_gbps = 2.5\n",
    );
}

#[test]
fn ib_missing_required_port_is_down() {
    let out = ib(&fixture("ib/healthy"), &["-p", "mlx5_0:1,mlx5_9:1"]);
    let err = assert_ok(
        &out,
        "ib_up = false\nib_active_ports = 1\nib_rate_gbps = 200\n",
    );
    assert!(err.contains("mlx5_9 port 1: not present"), "{err}");
}

#[test]
fn ib_no_hca_fails_or_reports_zero_with_flag() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let absent = tmp.path().join("no-infiniband");
    assert_fails(
        &ib(&absent, &[]),
        1,
        "does not exist: no InfiniBand driver loaded",
    );
    assert_fails(&ib(tmp.path(), &[]), 1, "no InfiniBand HCA under");
    assert_ok(
        &ib(&absent, &["-z"]),
        "ib_up = false\nib_active_ports = 0\nib_rate_gbps = 0\n",
    );
    assert_fails(
        &ib(&fixture("ib/healthy"), &["-p", "mlx5_0"]),
        2,
        "is not HCA:PORT",
    );
}

// ---------------------------------------------------------------- gpus_free

fn gpus(args: &[&str], gpu_csv: &str, apps_csv: &str) -> Run {
    Run::new("gpus_free", args)
        .stub("nvidia-smi")
        .env("SMI_GPU_FIXTURE", fixture(gpu_csv))
        .env("SMI_APPS_FIXTURE", fixture(apps_csv))
}

#[test]
fn gpus_free_counts_idle_gpus_without_processes() {
    // GPU 1: process + busy; GPU 2: process, idle; GPU 3: 3 % (< 5), no process.
    let out = gpus(&[], "gpu/query_gpu_h100.csv", "gpu/compute_apps_h100.csv").output();
    assert_ok(
        &out,
        "ngpus = 4\nngpus_free = 2\ngpu_mem_free_mb = 284998\n",
    );
    let strict = gpus(
        &["-u", "3"],
        "gpu/query_gpu_h100.csv",
        "gpu/compute_apps_h100.csv",
    )
    .output();
    assert_ok(
        &strict,
        "ngpus = 4\nngpus_free = 1\ngpu_mem_free_mb = 284998\n",
    );
    let by_memory = gpus(
        &["-m", "0"],
        "gpu/query_gpu_h100.csv",
        "gpu/compute_apps_none.csv",
    )
    .output();
    assert_ok(
        &by_memory,
        "ngpus = 4\nngpus_free = 1\ngpu_mem_free_mb = 284998\n",
    );
}

#[test]
fn gpus_free_handles_not_available_fields() {
    let out = gpus(&[], "gpu/query_gpu_mig.csv", "gpu/compute_apps_none.csv").output();
    assert_ok(&out, "ngpus = 2\nngpus_free = 2\ngpu_mem_free_mb = 40940\n");
}

#[test]
fn gpus_free_nvidia_smi_missing() {
    let out = Run::new("gpus_free", &[]).path("/nonexistent-bin").output();
    assert_fails(&out, 1, "nvidia-smi not found in PATH");
}

#[test]
fn gpus_free_nvidia_smi_failing() {
    let out = gpus(&[], "gpu/driver_failed.txt", "gpu/compute_apps_none.csv")
        .env("SMI_GPU_EXIT", "9")
        .output();
    assert_fails(
        &out,
        1,
        "(exit 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    );
    let apps = gpus(&[], "gpu/query_gpu_h100.csv", "gpu/driver_failed.txt")
        .env("SMI_APPS_EXIT", "9")
        .output();
    assert_fails(&apps, 1, "--query-compute-apps failed (exit 9)");
}

#[test]
fn gpus_free_no_devices_fails_or_reports_zero_with_flag() {
    let out = gpus(&[], "gpu/no_devices.txt", "gpu/compute_apps_none.csv")
        .env("SMI_GPU_EXIT", "6")
        .output();
    assert_fails(&out, 1, "No devices were found");
    let zero = gpus(&["-z"], "gpu/no_devices.txt", "gpu/compute_apps_none.csv")
        .env("SMI_GPU_EXIT", "6")
        .output();
    assert_ok(&zero, "ngpus = 0\nngpus_free = 0\ngpu_mem_free_mb = 0\n");
    let usage = gpus(
        &["-u", "high"],
        "gpu/query_gpu_h100.csv",
        "gpu/compute_apps_none.csv",
    )
    .output();
    assert_fails(&usage, 2, "-u needs a whole percent");
}

// ---------------------------------------------------------------- mount_health

fn mounts(args: &[&str]) -> Run {
    Run::new("mount_health", args)
        .stub("stat")
        .env("PROC_ROOT", fixture("mounts/compute_node_proc"))
}

#[test]
fn mount_health_all_mounted_and_answering() {
    let out = mounts(&["home=/home", "/scratch", "data=/data sets"]).output();
    assert_ok(&out, "mounts_ok = true\nmounts_bad = none\n");
}

#[test]
fn mount_health_reports_unmounted_read_only_and_failing_mounts_in_argument_order() {
    let out = mounts(&[
        "-w",
        "/home",
        "/nothere",
        "apps=/apps",
        "ref=/ref",
        "scratch=/scratch",
    ])
    .env("STAT_FAIL", "/scratch")
    .output();
    // /apps: the rw mount on top of an ro one is fine; /ref: ro on top.
    let err = assert_ok(
        &out,
        "mounts_ok = false\nmounts_bad = /nothere,ref,scratch\n",
    );
    assert!(err.contains("/nothere: /nothere is not mounted"), "{err}");
    assert!(err.contains("ref: /ref is mounted read-only"), "{err}");
    assert!(err.contains("scratch: stat -f failed (exit 1)"), "{err}");
    let ro_allowed = mounts(&["/ref"]).output();
    assert_ok(&ro_allowed, "mounts_ok = true\nmounts_bad = none\n");
}

/// The stub stat for `hang` writes its pid and sleeps forever; the script must report the
/// mount and leave no process behind (killed and reaped: a zombie would still answer kill 0).
fn assert_hung_mount_reported_and_killed(run: Run, pid_file: &Path, within: &str) {
    let out = run.output();
    let pid_text = fs::read_to_string(pid_file).expect("the stub stat ran and wrote its pid");
    let pid: i32 = pid_text.trim().parse().expect("pid file holds a pid");
    let alive = kill(Pid::from_raw(pid), None);
    if alive.is_ok() {
        // Do not leak the stub if the script failed to kill it.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert_eq!(alive, Err(Errno::ESRCH), "stub stat {pid} is still there");
    let err = assert_ok(&out, "mounts_ok = false\nmounts_bad = home,/nothere\n");
    assert!(
        err.contains(&format!("home: no answer within {within} (hung mount?)")),
        "{err}"
    );
}

#[test]
fn mount_health_hung_mount_is_reported_and_its_stat_killed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pid_file = tmp.path().join("stat.pid");
    let run = mounts(&["-t", "1", "home=/home", "/scratch", "/nothere"])
        .env("STAT_HANG", "/home")
        .env("STAT_PID_FILE", &pid_file);
    assert_hung_mount_reported_and_killed(run, &pid_file, "1s");
}

#[test]
fn mount_health_default_timeout_fits_inside_the_agents() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pid_file = tmp.path().join("stat.pid");
    let run = mounts(&["home=/home", "/scratch", "/nothere"])
        .env("XCE_TIMEOUT", "2")
        .env("STAT_HANG", "/home")
        .env("STAT_PID_FILE", &pid_file);
    assert_hung_mount_reported_and_killed(run, &pid_file, "1s");
}

#[test]
fn mount_health_usage_and_unreadable_table() {
    assert_fails(&mounts(&[]).output(), 2, "no mount point given");
    assert_fails(&mounts(&["scratch"]).output(), 2, "is not an absolute path");
    assert_fails(
        &mounts(&["-t", "0", "/home"]).output(),
        2,
        "-t needs a whole number",
    );
    let out = Run::new("mount_health", &["/home"])
        .env("PROC_ROOT", "/nonexistent-proc")
        .output();
    assert_fails(&out, 1, "cannot read /nonexistent-proc/mounts");
}

// ---------------------------------------------------------------- flexlm_licenses

fn lmstat(args: &[&str], fixture_file: &str) -> Run {
    Run::new("flexlm_licenses", args)
        .stub("lmutil")
        .env("LM_FIXTURE", fixture(fixture_file))
}

#[test]
fn flexlm_reports_free_licenses_per_feature() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let args_file = tmp.path().join("args");
    let out = lmstat(
        &[
            "-c",
            "27000@lic1",
            "MATLAB",
            "SIMULINK=lic_simulink",
            "cfd-solver.hpc",
            "cfd_base",
            "Signal_Toolbox",
        ],
        "flexlm/lmstat_a.txt",
    )
    .env("LM_ARGS_FILE", &args_file)
    .output();
    // MATLAB appears twice (two license files): 100-37 + 50-10. cfd_base is in overdraft.
    assert_ok(
        &out,
        "lic_MATLAB = 103\nlic_simulink = 20\nlic_cfd_solver_hpc = 384\nlic_cfd_base = 0\nlic_Signal_Toolbox = 0\n",
    );
    let args = fs::read_to_string(&args_file).expect("stub recorded its arguments");
    assert_eq!(args, "-a -c 27000@lic1\n");
}

#[test]
fn flexlm_without_features_reports_every_counted_one() {
    let out = lmstat(&[], "flexlm/lmstat_a.txt").output();
    assert_ok(
        &out,
        "lic_MATLAB = 103\nlic_SIMULINK = 20\nlic_Optimization_Toolbox = 0\nlic_Signal_Toolbox = 0\n\
         lic_cfd_base = 0\nlic_cfd_solver_hpc = 384\n",
    );
}

#[test]
fn flexlm_missing_feature_is_left_out_with_a_warning() {
    let out = lmstat(
        &["MATLAB", "Nope", "Curve_Fitting_Toolbox"],
        "flexlm/lmstat_a.txt",
    )
    .output();
    let err = assert_ok(&out, "lic_MATLAB = 103\n");
    assert!(err.contains("feature Nope not in lmstat output"), "{err}");
    assert!(
        err.contains("feature Curve_Fitting_Toolbox not in lmstat output"),
        "{err}"
    );
    let none = lmstat(&["Nope"], "flexlm/lmstat_a.txt").output();
    assert_fails(
        &none,
        1,
        "none of the requested features is in lmstat output",
    );
}

#[test]
fn flexlm_cannot_connect_fails_whatever_lmstat_exits_with() {
    for exit in ["0", "1"] {
        let out = lmstat(
            &["-c", "27000@lic1", "MATLAB"],
            "flexlm/lmstat_cannot_connect.txt",
        )
        .env("LM_EXIT", exit)
        .output();
        assert_fails(&out, 1, "license server 27000@lic1: Error getting status: Cannot connect to license server system.");
    }
}

#[test]
fn flexlm_lmstat_missing_failing_and_usage() {
    let out = Run::new("flexlm_licenses", &["MATLAB"])
        .path("/nonexistent-bin")
        .output();
    assert_fails(&out, 1, "neither lmstat nor lmutil found in PATH");
    let failed = lmstat(&["MATLAB"], "flexlm/lmstat_a.txt")
        .env("LM_EXIT", "3")
        .output();
    assert_fails(&failed, 1, "lmutil lmstat failed (exit 3)");
    let bad_name = lmstat(&["MATLAB=1matlab"], "flexlm/lmstat_a.txt").output();
    assert_fails(&bad_name, 2, "'1matlab' is not a valid resource name");
}

// ---------------------------------------------------------------- elim.example

fn elim(lsf_resources: &str) -> Command {
    let mut cmd = Command::new(plugin("elim.example"));
    cmd.env_clear()
        .env("PATH", AGENT_PATH)
        .env("LSF_RESOURCES", lsf_resources)
        .env("ELIM_ABORT_VALUE", "97")
        .env("ELIM_PROC_ROOT", fixture("elim_proc"))
        .stdin(Stdio::null());
    cmd
}

#[test]
fn elim_example_streams_requested_resources_and_stops_on_term() {
    let mut child = elim("nzombies mem nprocs oom_kills")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn elim.example");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    kill(pid, Signal::SIGTERM).expect("signal elim");
    let status = child.wait().expect("wait elim");
    read.expect("read a report line");
    // The order is LSF_RESOURCES' order; "mem" is not this elim's and is skipped.
    assert_eq!(line, "3 nzombies 1 nprocs 4 oom_kills 2\n");
    assert_eq!(status.code(), Some(0), "TERM is a clean stop");
}

#[test]
fn elim_example_aborts_with_elim_abort_value_when_nothing_to_report() {
    let out = elim("mem swp").output().expect("run elim.example");
    assert_eq!(out.status.code(), Some(97));
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains("none of LSF_RESOURCES (mem swp)"));
}
