//! Agent-side CPU per exec probe run, children excluded, in the configuration nodes run —
//! root agent, probes as `run_as: nobody`, containment on (each run cloned into the probe's
//! cgroup and ended with cgroup.kill) — beside the physical floor measured in the same run:
//! a raw libc loop of posix_spawn (own process group, default signals, stdin /dev/null,
//! stdout piped) + read to EOF + waitpid of the same script. Then the non-root configuration
//! (no credential switch, no cgroup: what an unprivileged agent gets) beside the same floor,
//! measured in a child process of this bench that dropped to `nobody` (or in this process
//! when it is not root). CPU is getrusage(RUSAGE_SELF) utime + stime: every thread of the
//! process, the runtime's included, so it does not depend on how busy the shared machine is.
//!
//! Run: `cargo bench --bench exec_cpu` (env RUNS, default 2000 per side).

mod support {
    pub mod env;
    pub mod rusage;
}

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use support::env::env_or;
use support::rusage::{self, UsageWho};
use xce_agent::probe::{self, BuiltinSource, ProbeContext};
use xce_agent::value::Reading;

struct NoBuiltins;

impl BuiltinSource for NoBuiltins {
    fn reading(&self, _index: &str) -> Option<Reading> {
        None
    }
}

#[derive(Default)]
struct Side {
    runs: u32,
    self_cpu: Duration,
    child_cpu: Duration,
    wall: Duration,
}

impl Side {
    fn measure(&mut self, runs: u32, mut f: impl FnMut()) {
        let (s0, c0, w0) = (
            rusage::cpu(UsageWho::RUSAGE_SELF),
            rusage::cpu(UsageWho::RUSAGE_CHILDREN),
            Instant::now(),
        );
        (0..runs).for_each(|_| f());
        self.wall += w0.elapsed();
        self.self_cpu += rusage::cpu(UsageWho::RUSAGE_SELF) - s0;
        self.child_cpu += rusage::cpu(UsageWho::RUSAGE_CHILDREN) - c0;
        self.runs += runs;
    }

    fn per_run(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / f64::from(self.runs.max(1))
    }
}

/// The floor: posix_spawn + pipe + read to EOF + waitpid, in raw libc, nothing else.
struct Floor {
    path: CString,
    argv: [*const libc::c_char; 2],
    envp: [*const libc::c_char; 2],
    _env: CString,
    null: CString,
}

impl Floor {
    fn new(script: &Path) -> Self {
        let path = CString::new(script.as_os_str().as_encoded_bytes()).expect("path");
        let env = CString::new(format!("PATH={}", probe::child::PROBE_PATH)).expect("env");
        Self {
            argv: [path.as_ptr(), std::ptr::null()],
            envp: [env.as_ptr(), std::ptr::null()],
            path,
            _env: env,
            null: CString::new("/dev/null").expect("null"),
        }
    }

    fn once(&self) {
        // SAFETY: plain libc calls on locals and on CStrings owned by self; every object
        // initialised by an *_init is destroyed before return.
        unsafe {
            let mut fds = [0; 2];
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            libc::posix_spawn_file_actions_init(&mut fa);
            libc::posix_spawn_file_actions_addopen(
                &mut fa,
                0,
                self.null.as_ptr(),
                libc::O_RDONLY,
                0,
            );
            libc::posix_spawn_file_actions_adddup2(&mut fa, fds[1], 1);
            let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
            libc::posix_spawnattr_init(&mut attr);
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::posix_spawnattr_setsigdefault(&mut attr, &all);
            libc::posix_spawnattr_setpgroup(&mut attr, 0);
            libc::posix_spawnattr_setflags(
                &mut attr,
                (libc::POSIX_SPAWN_SETPGROUP | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
            );
            let mut pid = 0;
            let rc = libc::posix_spawn(
                &mut pid,
                self.path.as_ptr(),
                &fa,
                &attr,
                self.argv.as_ptr() as *const *mut libc::c_char,
                self.envp.as_ptr() as *const *mut libc::c_char,
            );
            assert_eq!(rc, 0, "posix_spawn");
            libc::posix_spawn_file_actions_destroy(&mut fa);
            libc::posix_spawnattr_destroy(&mut attr);
            libc::close(fds[1]);
            let mut buf = [0u8; 64];
            let mut got = 0;
            loop {
                let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            libc::close(fds[0]);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert!(got == 2 && status == 0, "floor run failed");
        }
    }
}

/// One configuration of the agent beside the floor, interleaved in blocks so background
/// load on the shared machine hits both alike. Prints one table row and returns the ratio.
fn compare(label: &str, runs: u32, floor: &Floor, mut agent_once: impl FnMut()) -> f64 {
    for _ in 0..50 {
        floor.once();
        agent_once();
    }
    let (mut f, mut a) = (Side::default(), Side::default());
    let block = 100.min(runs);
    let mut done = 0;
    while done < runs {
        f.measure(block, || floor.once());
        a.measure(block, &mut agent_once);
        done += block;
    }
    let ratio = a.self_cpu.as_secs_f64() / f.self_cpu.as_secs_f64().max(1e-9);
    println!(
        "| {label} | {:.0} | {:.0} | **{ratio:.2}x** | {:.0} / {:.0} | {:.0} / {:.0} |",
        a.per_run(a.self_cpu),
        f.per_run(f.self_cpu),
        a.per_run(a.child_cpu),
        f.per_run(f.child_cpu),
        a.per_run(a.wall),
        f.per_run(f.wall),
    );
    ratio
}

fn setup_script(dir: &Path) -> std::path::PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = dir.join("tiny.sh");
    std::fs::write(&script, "#!/bin/sh\necho 1\n").expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

fn agent_runner(
    script: &Path,
    run_as: &str,
    supervisor: std::sync::Arc<probe::supervisor::Supervisor>,
) -> impl FnMut() {
    let yaml = format!(
        "resources:\n  - name: tiny\n    interval: 1s\n    probe: {{kind: exec, command: [{}], format: value}}\n",
        script.display()
    );
    let res = xce_agent::config::resources::parse(Path::new("resources.yaml"), &yaml)
        .expect("resources parse");
    let plan = xce_agent::plan::make_plan(&res, "node001", &Default::default());
    let task = plan.tasks[0].clone();
    let ctx = ProbeContext {
        host: "node001".into(),
        plugin_dir: script.parent().expect("dir").to_owned(),
        run_as: run_as.into(),
        builtin: std::sync::Arc::new(NoBuiltins),
        files: xce_agent::probe::file_reader::FileReads::new(32),
        supervisor,
    };
    // The daemon's runtime: multi-thread, 2 workers.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let _ = probe::child::become_subreaper();
    });
    move || {
        rt.block_on(async {
            let r = probe::run_once(&task, &ctx).await;
            assert_eq!(r.outcome, probe::Outcome::Ok, "{:?}", r.error());
        })
    }
}

const HEADER: &str = "| configuration | agent CPU/run (µs) | floor CPU/run (µs) | agent / floor | children CPU/run agent / floor (µs) | wall/run agent / floor (µs) |\n|---|---|---|---|---|---|";

fn main() {
    let runs: u32 = env_or("RUNS", 2000);
    if let Ok(script) = std::env::var("XCE_BENCH_UNPRIVILEGED") {
        // The child: an unprivileged agent (no run_as switch, no cgroup), same floor.
        let script = Path::new(&script);
        let floor = Floor::new(script);
        compare(
            "agent as an unprivileged user (no run_as switch, no cgroup)",
            runs,
            &floor,
            agent_runner(script, "root", probe::supervisor::Supervisor::uncontained()),
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let script = setup_script(dir.path());
    let floor = Floor::new(&script);
    println!("exec probe run, {runs} runs per side, script `#!/bin/sh\\necho 1`; floor = raw posix_spawn + pipe + read + waitpid");
    println!("{HEADER}");
    let root = nix::unistd::geteuid().is_root();
    let nobody = nix::unistd::User::from_name("nobody").ok().flatten();
    match (&nobody, root) {
        (Some(_), true) => {
            let supervisor =
                probe::supervisor::Supervisor::new(probe::cgroup::Containment::for_this_process());
            let contained = supervisor.containment.tree().is_some();
            let label = if contained {
                "root agent, run_as: nobody, containment on (cgroup per probe)"
            } else {
                "root agent, run_as: nobody (no writable cgroup v2: process groups only)"
            };
            compare(
                label,
                runs,
                &floor,
                agent_runner(&script, "nobody", supervisor),
            );
        }
        _ => println!(
            "| root agent, run_as: nobody | skipped: needs root and a nobody user | | | | |"
        ),
    }
    match (nobody, root) {
        (Some(user), true) => {
            // Drop to nobody in a fresh process: the same binary, measuring itself there.
            let out = std::process::Command::new(std::env::current_exe().expect("exe"))
                .env("XCE_BENCH_UNPRIVILEGED", &script)
                .env("RUNS", runs.to_string())
                .uid(user.uid.as_raw())
                .gid(user.gid.as_raw())
                .output()
                .expect("unprivileged bench");
            print!("{}", String::from_utf8_lossy(&out.stdout));
            if !out.status.success() {
                println!(
                    "unprivileged side failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        _ => {
            compare(
                "agent as an unprivileged user (no run_as switch, no cgroup)",
                runs,
                &floor,
                agent_runner(
                    &script,
                    "root",
                    probe::supervisor::Supervisor::uncontained(),
                ),
            );
        }
    }
}
