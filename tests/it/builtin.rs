//! The builtin sampler over fixture /proc trees (tests/fixtures/proc-*, derived from a real
//! capture by tests/fixtures/proc-x86/make.py): exact expected values for every index,
//! counter reset, CPU hot-unplug, failed and absent sources; plus one live sanity check.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use xce_agent::probe::builtin::{catalogue, sample_once, spawn, Roots, Sampler};
use xce_agent::value::{Reading, Value};

const MIB: f64 = 1024.0 * 1024.0;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// Roots of a fixture tree. `tmp` is /proc, whose statvfs is all zeros, so `tmp`/`maxtmp`
/// are exact here (a real file system's free space moves under our feet); `dev` has no
/// terminals, so `it` comes from the captured uptime.
fn roots(tree: &Path) -> Roots {
    Roots {
        proc: tree.join("proc"),
        sys: tree.join("sys"),
        dev: tree.join("no-dev"),
        run: tree.join("run"),
        tmp: PathBuf::from("/proc"),
        utmp: tree.join("no-utmp"),
        nvml: PathBuf::from("/nonexistent/libnvidia-ml.so.1"),
    }
}

fn step(n: usize) -> Roots {
    roots(&fixture(&format!("proc-x86/t{n}")))
}

fn num(s: &Sampler, index: &str) -> f64 {
    match s.reading(index) {
        Some(Reading::Ok(Value::Numeric(v))) => v,
        other => panic!("{index}: expected a number, got {other:?}"),
    }
}

fn assert_num(s: &Sampler, index: &str, want: f64) {
    let got = num(s, index);
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{index}: got {got}, want {want}"
    );
}

fn assert_pending(s: &Sampler, index: &str) {
    assert!(
        matches!(s.reading(index), Some(Reading::Pending(_))),
        "{index}: {:?}",
        s.reading(index)
    );
}

fn failed_reason(s: &Sampler, index: &str) -> String {
    match s.reading(index) {
        Some(Reading::Failed(why)) => why.to_string(),
        other => panic!("{index}: expected failed, got {other:?}"),
    }
}

const SLOW: Duration = Duration::from_secs(15);
const FAST: Duration = Duration::from_secs(5);

/// Drives t0..t4 one slow tick (15 s) apart; returns the sampler after each step.
fn run_sequence(steps: usize) -> (Sampler, Instant) {
    let t0 = Instant::now();
    let mut s = Sampler::new(step(0));
    for n in 0..steps {
        s.set_roots(step(n));
        let now = t0 + SLOW * n as u32;
        s.fast_tick(now);
        s.slow_tick(now);
    }
    (s, t0)
}

#[test]
fn first_sample_levels_and_pending_rates() {
    let (s, _) = run_sequence(1);
    // Rates need a second sample.
    for rate in ["ut", "pg", "io"] {
        assert_pending(&s, rate);
    }
    // Run queue: loadavg says 3 running, one of which is the sampler itself.
    for rq in ["r15s", "r1m", "r15m"] {
        assert_num(&s, rq, 2.0);
    }
    // meminfo (kB): MemAvailable 24023952, SwapFree 8000000, MemTotal 24683584, SwapTotal 8388604.
    assert_num(&s, "mem", 24023952.0 / 1024.0);
    assert_num(&s, "swp", 8000000.0 / 1024.0);
    assert_num(&s, "maxmem", 24683584.0 / 1024.0);
    assert_num(&s, "maxswp", 8388604.0 / 1024.0);
    assert_num(&s, "tmp", 0.0);
    assert_num(&s, "maxtmp", 0.0);
    assert_num(&s, "ncpus", 2.0);
    // logind: alice (2 sessions), bob; greeter, background, closing and .ref ignored.
    assert_num(&s, "ls", 2.0);
    // No terminal at all: idle since boot, uptime 755.70 s = 12 whole minutes.
    assert_num(&s, "it", 12.0);
    // PSI `some avg10`.
    assert_num(&s, "cpu_psi", 3.66);
    assert_num(&s, "mem_psi", 0.0);
    assert_num(&s, "io_psi", 1.01);
    // No NVML library: the GPU indices are not on this host, with the reason.
    for gpu in ["ngpus", "ngpus_free", "gpu_ut", "gpu_mem_free"] {
        assert_eq!(s.reading(gpu), None);
        let why = s.absent_reason(gpu).expect("absent reason");
        assert!(why.contains("no NVIDIA driver"), "{why}");
    }
}

#[test]
fn every_catalogue_index_is_served_or_absent() {
    let (s, _) = run_sequence(2);
    for info in catalogue() {
        assert!(
            s.reading(info.name).is_some() || s.absent_reason(info.name).is_some(),
            "{} neither served nor absent",
            info.name
        );
        // An index declared in `indices!` that no collector fills stays as it started.
        assert_ne!(
            s.reading(info.name),
            Some(Reading::Pending("no sample yet".into())),
            "{}: no collector writes its slot",
            info.name
        );
    }
    assert_eq!(s.reading("nosuch"), None);
    assert_eq!(s.absent_reason("nosuch"), None);
}

#[test]
fn rates_smoothing_and_counter_reset_exact() {
    let f = (-1.0f64 / 4.0).exp();
    let f_gap = (-1.0f64 / 2.0).exp(); // 30 s since the last update (the reset interval gave none)

    // t1: ut = 1400/3000; pg = 750 pages/15 s; io = (vda 6000 + sda 1500 sectors) * 0.5 KB / 15 s.
    let (s, _) = run_sequence(2);
    let ut1 = 100.0 * 1400.0 / 3000.0;
    let pg1 = 750.0 / 15.0;
    let io1 = 7500.0 * 512.0 / 1024.0 / 15.0;
    assert_num(&s, "ut", ut1);
    assert_num(&s, "pg", pg1);
    assert_num(&s, "io", io1);

    // t2: ut 600/3000; pg 150/15 s; io vda 1500 sectors / 15 s.
    let (s, _) = run_sequence(3);
    let ut2 = ut1 * f + 20.0 * (1.0 - f);
    let pg2 = pg1 * f + 10.0 * (1.0 - f);
    let io2 = io1 * f + (1500.0 * 0.5 / 15.0) * (1.0 - f);
    assert_num(&s, "ut", ut2);
    assert_num(&s, "pg", pg2);
    assert_num(&s, "io", io2);

    // t3: cpu, vmstat and vda counters went down: no negative or huge rate, the averages
    // stand; sda still counts (3000 sectors).
    let (s, _) = run_sequence(4);
    assert_num(&s, "ut", ut2);
    assert_num(&s, "pg", pg2);
    let io3 = io2 * f + (3000.0 * 0.5 / 15.0) * (1.0 - f);
    assert_num(&s, "io", io3);

    // t4: the series go on from the t3 values.
    let (s, _) = run_sequence(5);
    assert_num(&s, "ut", ut2 * f_gap + 50.0 * (1.0 - f_gap));
    assert_num(&s, "pg", pg2 * f_gap + 20.0 * (1.0 - f_gap));
    assert_num(&s, "io", io3 * f + (600.0 * 0.5 / 15.0) * (1.0 - f));
}

#[test]
fn run_queue_smoothing_per_5s_sample() {
    let t0 = Instant::now();
    let mut s = Sampler::new(step(0));
    s.fast_tick(t0); // x = 2
    s.set_roots(step(1));
    s.fast_tick(t0 + FAST); // x = 4
    s.set_roots(step(3));
    s.fast_tick(t0 + FAST * 2); // x = 1
    let expect = |f: f64| (2.0 * f + 4.0 * (1.0 - f)) * f + 1.0 * (1.0 - f);
    assert_num(&s, "r15s", expect((-1.0f64 / 3.0).exp()));
    assert_num(&s, "r1m", expect((-1.0f64 / 12.0).exp()));
    assert_num(&s, "r15m", expect((-1.0f64 / 180.0).exp()));
    // The fast tick touches only the run queue.
    assert_pending(&s, "mem");
}

#[test]
fn cpu_hot_unplug() {
    let u0 = fixture("proc-unplug/u0");
    let u1 = fixture("proc-unplug/u1");
    for sys_present in [true, false] {
        let with = |tree: &Path| {
            let mut r = roots(tree);
            if !sys_present {
                // No online list: ncpus counts the cpuN lines of /proc/stat.
                r.sys = tree.join("no-sys");
            }
            r
        };
        let t0 = Instant::now();
        let mut s = Sampler::new(with(&u0));
        s.slow_tick(t0);
        assert_num(&s, "ncpus", 2.0);
        s.set_roots(with(&u1));
        s.slow_tick(t0 + SLOW);
        assert_num(&s, "ncpus", 1.0);
        // cpu1's line is gone; the aggregate grew by busy 900, idle 600.
        assert_num(&s, "ut", 100.0 * 900.0 / 1500.0);
    }
}

/// Copies a fixture tree into a temp dir so a test can break it.
fn scratch_copy(tree: &Path) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dest = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dest);
            } else {
                std::fs::copy(e.path(), dest).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(tree, dir.path());
    dir
}

#[test]
fn missing_file_fails_only_its_indices() {
    let dir = scratch_copy(&fixture("proc-x86/t0"));
    std::fs::remove_file(dir.path().join("proc/meminfo")).unwrap();
    std::fs::write(dir.path().join("proc/diskstats"), "8 0 sda not-a-number\n").unwrap();
    let mut r = roots(dir.path());
    r.tmp = dir.path().join("no-such-tmp");
    let mut s = Sampler::new(r);
    s.fast_tick(Instant::now());
    s.slow_tick(Instant::now());
    for idx in ["mem", "swp", "maxmem", "maxswp"] {
        let why = failed_reason(&s, idx);
        assert!(
            why.contains("meminfo") && why.contains("No such file"),
            "{why}"
        );
    }
    // The reading is the collector's error, with the kernel's under it.
    let Some(Reading::Failed(why)) = s.reading("mem") else {
        panic!("{:?}", s.reading("mem"))
    };
    let io = why
        .source()
        .and_then(|e| e.downcast_ref::<std::io::Error>());
    assert_eq!(
        io.map(std::io::Error::kind),
        Some(std::io::ErrorKind::NotFound)
    );
    assert!(
        failed_reason(&s, "io").contains("cannot parse"),
        "{:?}",
        s.reading("io")
    );
    for idx in ["tmp", "maxtmp"] {
        assert!(failed_reason(&s, idx).contains("no-such-tmp"));
    }
    // The others go on.
    assert_num(&s, "r15s", 2.0);
    assert_num(&s, "ncpus", 2.0);
    assert_num(&s, "ls", 2.0);
    assert_num(&s, "cpu_psi", 3.66);
    assert_pending(&s, "ut");
    assert_pending(&s, "pg");
}

#[test]
fn rate_resumes_after_a_failed_read() {
    // t0 ok, t1 /proc/stat unreadable, t2 ok: ut is the rate over t0..t2 (30 s).
    let broken = scratch_copy(&fixture("proc-x86/t1"));
    std::fs::write(broken.path().join("proc/stat"), "garbage\n").unwrap();
    let t0 = Instant::now();
    let mut s = Sampler::new(step(0));
    s.slow_tick(t0);
    s.set_roots(roots(broken.path()));
    s.slow_tick(t0 + SLOW);
    assert!(failed_reason(&s, "ut").contains("stat"));
    s.set_roots(step(2));
    s.slow_tick(t0 + SLOW * 2);
    assert_num(&s, "ut", 100.0 * 2000.0 / 6000.0);
}

#[test]
fn no_psi_means_absent() {
    let dir = scratch_copy(&fixture("proc-x86/t0"));
    std::fs::remove_dir_all(dir.path().join("proc/pressure")).unwrap();
    let mut s = Sampler::new(roots(dir.path()));
    s.slow_tick(Instant::now());
    for idx in ["cpu_psi", "mem_psi", "io_psi"] {
        assert_eq!(s.reading(idx), None);
        assert!(s.absent_reason(idx).unwrap().contains("pressure"));
    }
    assert_num(&s, "mem", 24023952.0 / 1024.0);
}

#[test]
fn psi_cpu_without_full_line_and_bad_psi() {
    let dir = scratch_copy(&fixture("proc-x86/t0"));
    // Linux 4.20..5.12: the cpu file has only the `some` line.
    std::fs::write(
        dir.path().join("proc/pressure/cpu"),
        "some avg10=7.25 avg60=1.00 avg300=0.50 total=99\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("proc/pressure/io"), "some avg10=oops\n").unwrap();
    let mut s = Sampler::new(roots(dir.path()));
    s.slow_tick(Instant::now());
    assert_num(&s, "cpu_psi", 7.25);
    assert!(failed_reason(&s, "io_psi").contains("avg10"));
}

#[test]
fn utmp_fallback_when_no_logind() {
    let mut r = step(0);
    r.run = fixture("proc-x86/no-run");
    r.utmp = fixture("proc-utmp/utmp");
    let mut s = Sampler::new(r.clone());
    s.slow_tick(Instant::now());
    // alice (twice) and bob; LOGIN, DEAD, BOOT records and the partial record ignored.
    assert_num(&s, "ls", 2.0);
    // Neither logind nor utmp: nobody can be logged in.
    r.utmp = fixture("proc-utmp/missing");
    s.set_roots(r);
    s.slow_tick(Instant::now());
    assert_num(&s, "ls", 0.0);
}

/// Creates `root/rel` (and its parents) with its atime `ago` seconds before `wall`.
fn touch_ago(root: &Path, rel: &str, wall: SystemTime, ago: u64) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, "").unwrap();
    let file = std::fs::File::options().write(true).open(&p).unwrap();
    file.set_times(std::fs::FileTimes::new().set_accessed(wall - Duration::from_secs(ago)))
        .unwrap();
}

/// The logind fixture of t0 has one session with a terminal: alice on `tty1`.
#[test]
fn idle_minutes_from_login_terminals_and_input_atimes() {
    let dev = tempfile::tempdir().unwrap();
    let (wall, at) = (SystemTime::now(), Instant::now());
    touch_ago(dev.path(), "tty1", wall, 7200);
    touch_ago(dev.path(), "input/event0", wall, 25 * 60 + 59); // the newest: 25 whole minutes
    touch_ago(dev.path(), "input/mice", wall, 3000);
    std::fs::create_dir_all(dev.path().join("input/by-id")).unwrap();
    let mut r = step(0);
    r.dev = dev.path().to_owned();
    let mut s = Sampler::new_pinned(r, at, wall);
    s.slow_tick(at);
    assert_num(&s, "it", 25.0);
    // 10 minutes later, nobody typed.
    s.slow_tick(at + Duration::from_secs(600));
    assert_num(&s, "it", 35.0);
    // Alice types on tty1 (its atime 130 s before that tick): 2 whole minutes.
    touch_ago(dev.path(), "tty1", wall + Duration::from_secs(1200), 130);
    s.slow_tick(at + Duration::from_secs(1200));
    assert_num(&s, "it", 2.0);
}

#[test]
fn idle_ignores_terminals_outside_login_sessions() {
    let dev = tempfile::tempdir().unwrap();
    let (wall, at) = (SystemTime::now(), Instant::now());
    touch_ago(dev.path(), "tty1", wall, 7200); // alice's session: 120 minutes
                                               // Just used, but nobody is logged in on them (logind sessions 2 and 3 have no TTY; the
                                               // greeter's and the closing session's do not count): not interactive use of the host.
    for rel in ["tty2", "pts/0", "pts/ptmx", "ttyS0", "console"] {
        touch_ago(dev.path(), rel, wall, 1);
    }
    let mut r = step(0);
    r.dev = dev.path().to_owned();
    let mut s = Sampler::new_pinned(r, at, wall);
    s.slow_tick(at);
    assert_num(&s, "it", 120.0);
}

/// One glibc `struct utmp` (384 bytes, x86-64/aarch64 layout) with type, line and user set.
fn utmp_record(ut_type: i16, line: &str, user: &str) -> Vec<u8> {
    let mut rec = vec![0u8; 384];
    rec[..2].copy_from_slice(&ut_type.to_ne_bytes());
    rec[8..8 + line.len()].copy_from_slice(line.as_bytes());
    rec[44..44 + user.len()].copy_from_slice(user.as_bytes());
    rec
}

#[test]
fn idle_from_utmp_lines_ignores_hostile_ones() {
    // <tmp>/host/dev is the dev root; <tmp>/etc/passwd is where "../../etc/passwd" leads.
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("host/dev");
    let (wall, at) = (SystemTime::now(), Instant::now());
    touch_ago(&dev, "pts/0", wall, 10 * 60 + 30); // alice: 10 whole minutes
    touch_ago(&dev, "pts/3", wall, 1); // carol logged out (DEAD_PROCESS)
    touch_ago(tmp.path(), "etc/passwd", wall, 1);
    let utmp = tmp.path().join("utmp");
    let records = [
        utmp_record(7, "pts/0", "alice"),
        utmp_record(7, "../../etc/passwd", "mallory"),
        utmp_record(7, "pts/9", "bob"), // stale: pts/9 no longer exists
        utmp_record(8, "pts/3", "carol"),
    ];
    std::fs::write(&utmp, records.concat()).unwrap();
    let mut r = step(0);
    r.run = fixture("proc-x86/no-run");
    r.utmp = utmp;
    r.dev = dev;
    let mut s = Sampler::new_pinned(r, at, wall);
    s.slow_tick(at);
    assert_num(&s, "it", 10.0);
    // mallory is logged in, whatever her line says.
    assert_num(&s, "ls", 3.0);
}

#[test]
fn idle_since_boot_without_login_terminals_or_input_devices() {
    let dev = tempfile::tempdir().unwrap();
    let (wall, at) = (SystemTime::now(), Instant::now());
    // A console just used, but no session is on it.
    touch_ago(dev.path(), "tty2", wall, 1);
    let mut r = step(0);
    r.dev = dev.path().to_owned();
    let mut s = Sampler::new_pinned(r, at, wall);
    s.slow_tick(at);
    // The captured uptime, 755.70 s.
    assert_num(&s, "it", 12.0);
}

#[test]
fn idle_fails_when_the_sessions_cannot_be_read() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = step(0);
    r.run = fixture("proc-x86/no-run");
    // A directory where utmp should be: it exists but cannot be read as a file.
    r.utmp = tmp.path().to_owned();
    let mut s = Sampler::new(r);
    s.slow_tick(Instant::now());
    let why = failed_reason(&s, "it");
    assert!(why.contains("login terminals unknown"), "{why}");
    assert!(failed_reason(&s, "ls").contains("cannot read"));
}

#[test]
fn tmp_is_statvfs_of_the_tmp_root() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = step(0);
    r.tmp = dir.path().to_owned();
    let mut s = Sampler::new(r);
    s.slow_tick(Instant::now());
    let st = nix::sys::statvfs::statvfs(dir.path()).unwrap();
    // The size of a file system does not move; its free space may (other writers).
    assert_num(
        &s,
        "maxtmp",
        st.blocks() as f64 * st.fragment_size() as f64 / MIB,
    );
    let tmp = num(&s, "tmp");
    assert!(tmp > 0.0 && tmp <= num(&s, "maxtmp"), "{tmp}");
}

#[test]
fn live_host_values_are_in_range() {
    let host = Roots::host();
    let t0 = Instant::now();
    let mut s = Sampler::new(host.clone());
    s.fast_tick(t0);
    s.slow_tick(t0);
    // A second sample so that rates have values: counters need a tick (10 ms) to move;
    // `slow_tick` keeps the older baseline until then. Waiting on /proc/stat itself is the
    // readiness signal, not a fixed sleep.
    let ticks = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_owned()
    };
    let first = ticks("/proc/stat");
    while ticks("/proc/stat") == first {
        std::thread::yield_now();
    }
    s.slow_tick(Instant::now());
    let ut = num(&s, "ut");
    assert!((0.0..=100.0).contains(&ut), "ut {ut}");
    assert!(num(&s, "ncpus") >= 1.0);
    let (mem, maxmem) = (num(&s, "mem"), num(&s, "maxmem"));
    assert!(mem > 0.0 && mem <= maxmem, "mem {mem} maxmem {maxmem}");
    assert!(num(&s, "swp") <= num(&s, "maxswp"));
    assert!(num(&s, "tmp") <= num(&s, "maxtmp"));
    for idx in ["r15s", "r1m", "r15m", "pg", "io", "ls", "it"] {
        assert!(num(&s, idx) >= 0.0, "{idx}");
    }
    for idx in ["cpu_psi", "mem_psi", "io_psi"] {
        if let Some(r) = s.reading(idx) {
            let Reading::Ok(Value::Numeric(v)) = r else {
                panic!("{idx}: {r:?}")
            };
            assert!((0.0..=100.0).contains(&v), "{idx} {v}");
        }
    }
    if let Some(Reading::Ok(Value::Numeric(n))) = s.reading("ngpus") {
        assert!(num(&s, "ngpus_free") <= n);
        assert!((0.0..=100.0).contains(&num(&s, "gpu_ut")));
    } else {
        assert!(s.absent_reason("ngpus").is_some());
    }
}

#[tokio::test]
async fn sample_once_has_rates() {
    let snap = sample_once(Roots::host(), Duration::from_millis(300)).await;
    for idx in ["ut", "r15s", "mem", "io", "pg"] {
        assert!(
            matches!(snap.reading(idx), Some(Reading::Ok(Value::Numeric(_)))),
            "{idx}: {:?}",
            snap.reading(idx)
        );
    }
}

#[tokio::test]
async fn spawned_sampler_publishes_snapshots_until_shutdown() {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut rx = spawn(step(0), shutdown.clone());
    // Before the first tick: pending, not zero.
    assert!(matches!(
        rx.borrow().reading("mem"),
        Some(Reading::Pending(_))
    ));
    // The first tick is immediate and does the slow work too.
    rx.changed().await.expect("sampler alive");
    let snap = rx.borrow_and_update().clone();
    assert_eq!(
        snap.reading("mem"),
        Some(Reading::Ok(Value::Numeric(24023952.0 / 1024.0)))
    );
    assert_eq!(snap.reading("r15s"), Some(Reading::Ok(Value::Numeric(2.0))));
    assert!(matches!(snap.reading("ut"), Some(Reading::Pending(_))));
    assert_eq!(snap.reading("ngpus"), None);
    assert!(snap.absent_reason("ngpus").is_some());
    shutdown.cancel();
    // The task ends and drops its sender.
    while rx.changed().await.is_ok() {}
}

/// The NVML path against a stand-in library (tests/fixtures/proc-nvml/fake_nvml.c), built
/// with the system C compiler. A host without one cannot run this test: it says so and fails.
#[test]
fn gpus_through_a_stand_in_nvml() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(fixture("proc-nvml/fake_nvml.c"))
        .status()
        .expect("a C compiler (cc) to build the stand-in NVML");
    assert!(status.success());
    let mut r = step(0);
    r.nvml = lib;
    let mut s = Sampler::new(r);
    // Present before the first tick: pending, not absent.
    assert_pending(&s, "ngpus");
    s.slow_tick(Instant::now());
    assert_num(&s, "ngpus", 3.0);
    assert_num(&s, "ngpus_free", 2.0);
    // GPU 2 (MIG) does not report utilisation: the mean is over GPUs 0 and 1.
    assert_num(&s, "gpu_ut", 25.0);
    assert_num(&s, "gpu_mem_free", 4500.0);
}
