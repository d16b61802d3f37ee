//! libxce_receiver from C: the library built by cargo (`cargo build -p xce-receiver`), the
//! example controller built by `make -C examples/c` with the system `cc`, the real agent
//! binary streaming to it over mutual TLS with an openssl-made PKI; another host's
//! certificate and a plaintext client refused with their reasons; kill -9 and restart; the
//! same under valgrind with no errors and no definite or possible leaks, against the debug
//! build and the release library installed as docs/controller.md says; every function with
//! NULL or misused arguments (capi/tests/api_misuse.c); the installed layout (soname, .pc);
//! the exported symbols against capi/libxce_receiver.symbols.
//!
//! `cc`, `make`, `openssl`, `valgrind` and `pkg-config` are needed: where one is missing the
//! test says so and skips, except in CI (`CI=true`), where `.ci/run` installs them and a
//! missing one fails.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;

use crate::support::tls::{openssl_available, openssl_pki};
use crate::support::*;
use crate::support::{numeric_declared, resval, zero_sized_batch};
use xce_agent::link::wire::{self, Envelope, Hello};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A program from another project: missing is a failure in CI (`.ci/run` installs it) and a
/// printed skip elsewhere.
fn required(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} is missing: .ci/run installs it, CI must have it");
    }
    eprintln!("SKIP: {what} is not installed here");
    false
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(REPO).join("target"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// The library (debug profile) and the example, built once per test process; `None` (after
/// saying why) where `cc` or `make` is missing.
fn example() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !required("cc (a C compiler)", runs("cc", &["--version"]))
                || !required("make", runs("make", &["--version"]))
            {
                return None;
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            run_ok(
                Command::new(cargo)
                    .args(["build", "--quiet", "-p", "xce-receiver"])
                    .current_dir(REPO),
            );
            run_ok(
                Command::new("make")
                    .args(["-s", "-C", "examples/c"])
                    .arg(format!("TARGET_DIR={}", target_dir().display()))
                    .current_dir(REPO),
            );
            Some(Path::new(REPO).join("examples/c/xce-controller-example"))
        })
        .as_deref()
}

/// capi/Cargo.toml's version: the library's.
fn capi_version() -> String {
    let manifest =
        std::fs::read_to_string(Path::new(REPO).join("capi/Cargo.toml")).expect("capi/Cargo.toml");
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("a version in capi/Cargo.toml")
        .to_owned()
}

fn valgrind_available() -> bool {
    required(
        "valgrind (Debian's valgrind)",
        runs("valgrind", &["--version"]),
    )
}

/// The example controller as a child: its stdout and stderr lines on channels.
struct ExampleProc {
    child: Child,
    addr: SocketAddr,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    /// Every stdout line read so far, for failure messages.
    seen: Vec<String>,
    /// What the example said of the library it loaded (`xce_receiver_version()`).
    library: Option<String>,
}

/// valgrind as docs/controller.md runs it: any error, definite or possible leak is exit 99.
/// The suppressions are the ones the -dev package ships (capi/valgrind.supp says why each).
/// The release library is checked with valgrind's default 12 frames, as a user would run it;
/// the debug build's frames are not inlined, so the frame that tells a suppressed stack from
/// any other lies deeper and the debug runs look 40 deep.
fn valgrind_args(suppressions: &Path, debug_build: bool) -> Vec<String> {
    [
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,possible",
        "--show-leak-kinds=definite,possible",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .chain(debug_build.then(|| "--num-callers=40".to_owned()))
    .chain([format!("--suppressions={}", suppressions.display())])
    .collect()
}

fn checkout_suppressions() -> PathBuf {
    Path::new(REPO).join("capi/valgrind.supp")
}

/// How to run the example: its path, where its library is (`LD_LIBRARY_PATH`; the debug
/// build's rpath finds it itself), and the suppressions that come with that library.
pub(crate) struct Example {
    pub(crate) program: PathBuf,
    pub(crate) library_path: Option<PathBuf>,
    pub(crate) suppressions: PathBuf,
    /// The checkout's debug build (not inlined: valgrind looks deeper, see valgrind_args).
    pub(crate) debug_build: bool,
}

/// The release library as docs/controller.md builds and installs it
/// (`scripts/install-capi.sh --profile release`, into a staging root under the target dir)
/// and the example copied out of the checkout and built there with a plain `make`, which
/// links it through pkg-config: what a controller host does with the -dev package.
fn release_example() -> Option<&'static Example> {
    static BUILT: OnceLock<Option<Example>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !required("cc (a C compiler)", runs("cc", &["--version"]))
                || !required("make", runs("make", &["--version"]))
                || !required("pkg-config", runs("pkg-config", &["--version"]))
            {
                return None;
            }
            let root = target_dir().join("capi-release-install");
            let _ = std::fs::remove_dir_all(&root);
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            run_ok(
                Command::new(format!("{REPO}/scripts/install-capi.sh"))
                    .args(["--profile", "release", "--prefix", "/usr", "--destdir"])
                    .arg(&root)
                    .env("CARGO", cargo),
            );
            let examples = root.join("examples");
            std::fs::create_dir_all(&examples).expect("mkdir examples");
            for f in ["Makefile", "xce-controller-example.c", "worker.c"] {
                std::fs::copy(Path::new(REPO).join("examples/c").join(f), examples.join(f))
                    .expect("copy the example");
            }
            let libdir = root.join("usr/lib");
            Some(built_with_make(&examples, &root, &libdir))
        })
        .as_ref()
}

/// The example in `dir` (Makefile and source, outside the checkout) built with a plain `make`
/// against the library installed under `sysroot` (its .pc in `libdir`/pkgconfig).
pub(crate) fn built_with_make(dir: &Path, sysroot: &Path, libdir: &Path) -> Example {
    let pkgconfig = |cmd: &mut Command| {
        cmd.env("PKG_CONFIG_PATH", libdir.join("pkgconfig"))
            .env("PKG_CONFIG_SYSROOT_DIR", sysroot);
    };
    let mut make = Command::new("make");
    make.current_dir(dir);
    pkgconfig(&mut make);
    run_ok(&mut make);
    let mut var = Command::new("pkg-config");
    var.args(["--variable=valgrind_suppressions", "xce_receiver"]);
    pkgconfig(&mut var);
    let supp = run_ok(&mut var);
    // pkg-config puts the sysroot in front of -I and -L, and of a variable only in some
    // versions: the installed file is under the sysroot either way.
    let supp = supp.trim();
    let supp = if Path::new(supp).starts_with(sysroot) {
        PathBuf::from(supp)
    } else {
        sysroot.join(supp.trim_start_matches('/'))
    };
    assert!(
        supp.exists(),
        "the suppressions the .pc names are not installed: {}",
        supp.display()
    );
    Example {
        program: dir.join("xce-controller-example"),
        library_path: Some(libdir.to_path_buf()),
        suppressions: supp,
        debug_build: false,
    }
}

impl ExampleProc {
    fn spawn(example: &Path, args: &[String], valgrind: bool) -> Self {
        let ex = Example {
            program: example.to_path_buf(),
            library_path: None,
            suppressions: checkout_suppressions(),
            debug_build: true,
        };
        Self::spawn_example(&ex, args, valgrind)
    }

    fn spawn_example(example: &Example, args: &[String], valgrind: bool) -> Self {
        let mut cmd = if valgrind {
            let mut c = Command::new("valgrind");
            c.args(valgrind_args(&example.suppressions, example.debug_build));
            c.arg(&example.program);
            c
        } else {
            Command::new(&example.program)
        };
        if let Some(lib) = &example.library_path {
            cmd.env("LD_LIBRARY_PATH", lib);
        }
        let mut child = cmd
            .arg("127.0.0.1:0")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the example controller");
        let stdout = lines_of(child.stdout.take().expect("stdout"));
        let stderr = lines_of(child.stderr.take().expect("stderr"));
        let mut me = Self {
            child,
            addr: "0.0.0.0:0".parse().expect("addr"),
            stdout,
            stderr,
            seen: Vec::new(),
            library: None,
        };
        let line = loop {
            match me.stderr.recv_timeout(HANG_GUARD) {
                Ok(l) if l.contains("listening on ") => break l,
                Ok(l) if l.contains("libxce_receiver ") => me.library = Some(l),
                Ok(_) => {}
                Err(e) => panic!("the example never said where it listens: {e}"),
            }
        };
        me.addr = line
            .rsplit(' ')
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        me
    }

    /// The next stdout line that starts with `prefix` and contains every one of `parts`,
    /// within the hang guard in all (other lines, such as a host's resvals every second, keep
    /// coming: they must not keep a line that never comes waited for forever).
    fn expect(&mut self, prefix: &str, parts: &[&str]) -> String {
        let give_up = std::time::Instant::now() + HANG_GUARD;
        loop {
            let left = give_up.saturating_duration_since(std::time::Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) && parts.iter().all(|p| l.contains(p)) {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "no line {prefix:?} with {parts:?} from the example ({e}); it printed:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The next stderr line that contains every one of `parts`, within the hang guard.
    fn expect_stderr(&mut self, parts: &[&str]) -> String {
        let mut seen = Vec::new();
        loop {
            match self.stderr.recv_timeout(HANG_GUARD) {
                Ok(l) if parts.iter().all(|p| l.contains(p)) => return l,
                Ok(l) => seen.push(l),
                Err(e) => panic!("no stderr line with {parts:?} ({e}); it printed:\n{seen:?}"),
            }
        }
    }

    fn signal(&self, sig: Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap_or_else(|e| panic!("{sig}: {e}"));
    }

    /// SIGTERM, then the exit status and the rest of stdout and of stderr.
    fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>, Vec<String>) {
        self.signal(Signal::SIGTERM);
        let out = crate::support::lines_until_closed(&self.stdout, "the example");
        let err = crate::support::lines_until_closed(&self.stderr, "the example");
        let status = self.child.wait().expect("wait");
        (status, out, err)
    }
}

impl Drop for ExampleProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter probe every second: the agent sends a delta each second, so a healthy host never
/// goes quiet for the receiver's grace (the agent's own heartbeat is 10 s).
const COUNTER: &str = "resources:\n  - name: level\n    valtype: numeric\n    interval: 1\n    \
                       probe: {kind: exec, command: [level.sh]}\n";

/// An agent site for `host`, dialing `controller` with the certificate `name`.pem.
fn tls_site(pki: &Path, host: &str, name: &str, controller: SocketAddr) -> Site {
    let site = Site::new(&[], COUNTER);
    site.counter_script("level");
    std::fs::write(
        site.agent_yaml(),
        format!(
            "host: {host}\nresources: resources.yaml\nplugin_dir: {}\nrun_as: root\n\
             controllers: [\"{controller}\"]\ntls:\n  ca: {}\n  cert: {}\n  key: {}\n",
            site.path().display(),
            pki.join("ca.pem").display(),
            pki.join(format!("{name}.pem")).display(),
            pki.join(format!("{name}.key")).display()
        ),
    )
    .expect("write agent.yaml");
    site
}

fn example_tls_args(pki: &Path) -> Vec<String> {
    let f = |n: &str| pki.join(n).display().to_string();
    vec![
        "--tls-ca".into(),
        f("ca.pem"),
        "--tls-cert".into(),
        f("ctl.pem"),
        "--tls-key".into(),
        f("ctl.key"),
        // Two heartbeats of 1 s and a margin: 3 s of silence make a host stale.
        "--agent-heartbeat-ms".into(),
        "1000".into(),
    ]
}

/// A plaintext client against the TLS receiver: refused as not TLS.
async fn plaintext_client(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let hello = Hello::new("node001", "boot", "digest", Vec::new());
    let frame = wire::encode_envelope(&Envelope::Hello(hello)).expect("encode");
    s.write_all(&frame).await.expect("write");
    s
}

/// The whole life of a controller: an agent accepted over mutual TLS and its values; an agent
/// with another host's certificate and a plaintext client refused with their reasons; the
/// agent killed (gone, stale, its values unknown in the table and the library's snapshot) and
/// restarted (its values return); SIGTERM stops everything and frees it.
async fn controller_life(
    example: &Example,
    valgrind: bool,
) -> (std::process::ExitStatus, Vec<String>, Vec<String>) {
    let pki = tempfile::tempdir().expect("tempdir");
    openssl_pki(
        pki.path(),
        &[
            ("ctl", "IP:127.0.0.1"),
            ("node001", "DNS:node001"),
            ("node001evil", "DNS:node001.evil"),
        ],
    );
    let mut ctl = ExampleProc::spawn_example(example, &example_tls_args(pki.path()), valgrind);
    // xce_receiver_version() from C: the loaded library's version and protocols.
    let version = format!(
        "libxce_receiver {} (agent protocol {} to {})",
        capi_version(),
        wire::MIN_PROTOCOL_VERSION,
        wire::PROTOCOL_VERSION
    );
    assert!(
        ctl.library
            .as_deref()
            .is_some_and(|l| l.ends_with(&version)),
        "the example did not say {version:?}: {:?}",
        ctl.library
    );

    let node001 = tls_site(pki.path(), "node001", "node001", ctl.addr);
    let mut agent = node001.spawn_agent();
    ctl.expect(
        "accepted node001 ",
        &[
            "subject=\"CN=node001\"",
            "sans=node001",
            "agent=",
            "resources=1",
        ],
    );
    ctl.expect("resval node001 level ", &[" ok last_report="]);
    // Protocol 2: the agent hears the verdict and says so.
    agent
        .wait_log(&format!("accepted by {} as host node001", ctl.addr), 1)
        .await;

    // node001.evil's certificate claiming node001: refused, with the reason. (The agent
    // itself refuses to start on a certificate that names only another host; this one names
    // node001 in a domain the controller is not configured with, which the agent cannot
    // know, so it starts and the controller decides.)
    let impostor = tls_site(pki.path(), "node001", "node001evil", ctl.addr);
    let mut impostor_agent = impostor.spawn_agent();
    let refused = ctl.expect(
        "refused 127.0.0.1:",
        &[" identity ", "node001.evil", "node001"],
    );
    assert!(refused.contains("does not name"), "{refused}");
    // ...and the impostor logs the controller's reason (and backs off), never "accepted".
    impostor_agent
        .wait_log("the controller refused this agent", 1)
        .await;
    let log = impostor_agent.log_text();
    assert!(
        log.contains("identity") && log.contains("does not name"),
        "{log}"
    );
    assert!(log.contains("backing off"), "{log}");
    assert!(!log.contains("accepted by"), "{log}");
    drop(impostor_agent);
    // The real node001 was not kicked off: its values keep coming on the same connection.
    ctl.expect("resval node001 level ", &[" ok "]);

    // Plaintext against TLS.
    let _plain = plaintext_client(ctl.addr).await;
    ctl.expect("refused 127.0.0.1:", &[" not_tls "]);
    // ...and the library's log says so through the example's callback (xce_receiver_config_set_log).
    ctl.expect_stderr(&[
        "xce-controller-example: log error: TLS handshake failed",
        "reason=\"not_tls\"",
    ]);

    // kill -9: the connection ends (gone) and the host goes stale within the grace; the
    // table has its values unknown.
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait_exit().await;
    let mut gone = false;
    let mut stale = false;
    while !(gone && stale) {
        let l = ctl.expect("", &["node001"]);
        gone |= l.starts_with("gone node001 ");
        stale |= l.starts_with("stale node001 ") && l.ends_with("unknown=1");
    }
    ctl.signal(Signal::SIGUSR1);
    ctl.expect("table node001 level - stale", &[]);
    ctl.expect("snapshot stale node001", &[]);
    ctl.expect("snapshot resval node001 level - stale", &["host stale"]);
    ctl.expect("table end", &[]);

    // Restart: accepted again and values return.
    let mut agent = node001.spawn_agent();
    ctl.expect("accepted node001 ", &["subject=\"CN=node001\""]);
    let back = ctl.expect("resval node001 level ", &[" ok "]);
    assert!(!back.contains("level - "), "{back}");
    ctl.signal(Signal::SIGUSR1);
    let row = ctl.expect("table node001 level ", &[]);
    assert!(!row.contains(" - "), "values did not return: {row}");
    assert!(agent.terminate().await.success());
    ctl.terminate()
}

/// The example from the debug build in the checkout (`make -C examples/c`).
fn debug_example() -> Option<Example> {
    Some(Example {
        program: example()?.to_path_buf(),
        library_path: None,
        suppressions: checkout_suppressions(),
        debug_build: true,
    })
}

#[tokio::test]
async fn the_c_example_gets_values_over_mutual_tls_refuses_impostors_and_sees_a_killed_agent_go_stale(
) {
    let Some(example) = debug_example() else {
        return;
    };
    if !openssl_available() {
        return;
    }
    let (status, out, err) = controller_life(&example, false).await;
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        err.join("\n")
    );
    assert_eq!(out.last().map(String::as_str), Some("stopped"), "{out:?}");
}

/// The whole life under valgrind: exit 0, no error, nothing definitely or possibly lost.
pub(crate) async fn controller_life_is_valgrind_clean(example: &Example) {
    let (status, out, err) = controller_life(example, true).await;
    let report = err.join("\n");
    assert_eq!(status.code(), Some(0), "valgrind found errors:\n{report}");
    assert_eq!(out.last().map(String::as_str), Some("stopped"), "{out:?}");
    assert!(
        report.contains("ERROR SUMMARY: 0 errors"),
        "no clean valgrind summary:\n{report}"
    );
    assert!(
        (report.contains("definitely lost: 0 bytes") && report.contains("possibly lost: 0 bytes"))
            || report.contains("All heap blocks were freed"),
        "{report}"
    );
}

#[tokio::test]
async fn the_c_example_runs_clean_under_valgrind() {
    let Some(example) = debug_example() else {
        return;
    };
    if !valgrind_available() || !openssl_available() {
        return;
    }
    controller_life_is_valgrind_clean(&example).await;
}

/// The release library as docs/controller.md builds, installs and links it (pkg-config, the
/// example's plain `make` outside the checkout): valgrind-clean too, with only the
/// suppressions the library installs.
#[tokio::test]
#[ignore = "builds the release library (fat LTO: minutes); CI runs it with `cargo test -- --ignored`"]
async fn the_c_example_runs_clean_under_valgrind_against_the_installed_release_library() {
    if !valgrind_available() || !openssl_available() {
        return;
    }
    let Some(example) = release_example() else {
        return;
    };
    controller_life_is_valgrind_clean(example).await;
}

/// capi/tests/api_misuse.c: every function with NULL or misused arguments gets an error
/// code; also under valgrind where it is installed.
#[test]
fn every_function_with_null_or_misused_arguments_returns_an_error_code() {
    if example().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("api_misuse");
    let lib = target_dir().join("debug");
    run_ok(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
            .arg(format!("-I{REPO}/capi/include"))
            .arg("-o")
            .arg(&bin)
            .arg(format!("{REPO}/capi/tests/api_misuse.c"))
            .arg(format!("-L{}", lib.display()))
            .arg("-lxce_receiver")
            .arg(format!("-Wl,-rpath,{}", lib.display())),
    );
    let out = run_ok(&mut Command::new(&bin));
    assert!(out.contains("checks passed"), "{out}");
    if valgrind_available() {
        let out = run_ok(
            Command::new("valgrind")
                .args(valgrind_args(&checkout_suppressions(), true))
                .arg(&bin),
        );
        assert!(out.contains("ERROR SUMMARY: 0 errors"), "{out}");
    }
}

/// scripts/install-capi.sh lays the library out as a distribution does: a C program built
/// with only `pkg-config --cflags --libs xce_receiver` needs libxce_receiver.so.0 (the
/// soname) and runs.
#[test]
fn the_installed_library_links_by_pkg_config_and_its_soname() {
    if example().is_none() || !required("pkg-config", runs("pkg-config", &["--version"])) {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_ok(
        Command::new(format!("{REPO}/scripts/install-capi.sh"))
            .args(["--profile", "debug", "--prefix", "/usr", "--destdir"])
            .arg(root.path())
            .env("CARGO", cargo),
    );
    let libdir = root.path().join("usr/lib");
    for f in [
        "libxce_receiver.so.0.2.0",
        "libxce_receiver.so.0",
        "libxce_receiver.so",
        "libxce_receiver.a",
        "pkgconfig/xce_receiver.pc",
    ] {
        assert!(libdir.join(f).exists(), "{f} not installed");
    }
    assert!(root.path().join("usr/include/xce_receiver.h").exists());
    let flags = run_ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "xce_receiver"])
            .env("PKG_CONFIG_PATH", libdir.join("pkgconfig"))
            .env("PKG_CONFIG_SYSROOT_DIR", root.path()),
    );
    let bin = root.path().join("example");
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-o"])
        .arg(&bin)
        .arg(format!("{REPO}/examples/c/xce-controller-example.c"))
        .args(flags.split_whitespace());
    run_ok(&mut cc);
    let needed = run_ok(Command::new("readelf").arg("-d").arg(&bin));
    assert!(needed.contains("[libxce_receiver.so.0]"), "{needed}");
    // It loads and runs: no arguments is its usage, exit 2.
    let out = Command::new(&bin)
        .env("LD_LIBRARY_PATH", &libdir)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: xce-controller-example"));
}

fn frame(env: &Envelope) -> Vec<u8> {
    wire::encode_envelope(env).expect("encode")
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The hostile frames the receiver withstands hit the C program too: the amplification batch
/// (72 bytes announcing a million resvals) drops its connection with reason `limit` and no
/// resval; a flood of tiny frames costs nothing but time; the program's memory stays bounded
/// and a real host still gets through.
#[tokio::test]
async fn hostile_frames_cost_the_c_program_a_line_each_and_bounded_memory() {
    let Some(example) = example() else { return };
    let mut ctl = ExampleProc::spawn(
        example,
        &["--insecure".into(), "--queue".into(), "64".into()],
        false,
    );
    let names = vec!["gpu".to_owned()];
    let hello = |host: &str| {
        frame(&Envelope::Hello(Hello::new(
            host,
            "boot",
            "digest",
            numeric_declared(&names),
        )))
    };
    let mut conns = Vec::new();
    let hosts: Vec<String> = (1..=8).map(|i| format!("node10{i}")).collect();
    for host in &hosts {
        let mut bytes = hello(host);
        for seq in 1..=12 {
            bytes.extend(zero_sized_batch(seq, 1_000_000));
        }
        let mut s = tokio::net::TcpStream::connect(ctl.addr)
            .await
            .expect("connect");
        let _ = s.write_all(&bytes).await;
        conns.push(s);
    }
    let mut dropped = std::collections::BTreeSet::new();
    while dropped.len() < hosts.len() {
        let l = ctl.expect("gone node10", &[" limit "]);
        assert!(l.contains("more than the 1"), "{l}");
        dropped.insert(l.split(' ').nth(1).unwrap_or_default().to_owned());
    }
    // A flood of tiny frames: a host, then 100,000 heartbeats in one stream.
    let mut flood = hello("node201");
    flood.extend(frame(&Envelope::Batch(wire::Batch {
        seq: 1,
        full: true,
        sent_at_ms: 1,
        resvals: vec![resval("gpu", xce_agent::value::Value::Numeric(1.0))],
    })));
    let hb = frame(&Envelope::Heartbeat(wire::Heartbeat {
        seq: 1,
        sent_at_ms: 1,
    }));
    for _ in 0..100_000 {
        flood.extend_from_slice(&hb);
    }
    let mut s = tokio::net::TcpStream::connect(ctl.addr)
        .await
        .expect("connect");
    s.write_all(&flood).await.expect("write the flood");
    s.shutdown().await.expect("close");
    ctl.expect("gone node201 closed", &[]);
    // A real host still gets through, its value intact.
    let mut good = hello("node002");
    good.extend(frame(&Envelope::Batch(wire::Batch {
        seq: 1,
        full: true,
        sent_at_ms: 1,
        resvals: vec![resval("gpu", xce_agent::value::Value::Numeric(3.0))],
    })));
    let mut g = tokio::net::TcpStream::connect(ctl.addr)
        .await
        .expect("connect");
    g.write_all(&good).await.expect("write");
    ctl.expect("resval node002 gpu 3 ", &[]);
    let rss = rss_kib(ctl.child.id());
    eprintln!("NOTE: the C program's RSS after the hostile frames: {rss} KiB");
    // Eight million announced resvals would be gigabytes; the program holds a few MiB of
    // its own beyond the debug library's code.
    assert!(rss < 64 * 1024, "RSS {rss} KiB after the hostile frames");
    drop(conns);
    let seen = std::mem::take(&mut ctl.seen);
    let (status, out, _) = ctl.terminate();
    assert!(status.success());
    let from_hostile: Vec<&String> = seen
        .iter()
        .chain(&out)
        .filter(|l| l.starts_with("resval node10"))
        .collect();
    assert!(from_hostile.is_empty(), "{from_hostile:?}");
}

/// The symbols the shared library exports, by `nm -D --defined-only`.
fn exported_functions(library: &Path) -> std::collections::BTreeSet<String> {
    run_ok(
        Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(library),
    )
    .lines()
    .filter_map(|l| {
        let mut f = l.split_whitespace();
        let (_addr, kind, name) = (f.next()?, f.next()?, f.next()?);
        // Text and data symbols: what a program can link to.
        matches!(kind, "T" | "D" | "B" | "R" | "W" | "V").then(|| name.to_owned())
    })
    .collect()
}

/// capi/libxce_receiver.symbols (Debian's symbols file, the runtime package's DEBIAN/symbols)
/// lists the exported functions: a function added, removed or renamed is a decision made
/// there, in the same change, not something a package notices later.
#[test]
fn the_exported_symbols_are_the_committed_list() {
    if example().is_none() || !required("nm (binutils)", runs("nm", &["--version"])) {
        return;
    }
    let file = Path::new(REPO).join("capi/libxce_receiver.symbols");
    let text = std::fs::read_to_string(&file).expect("capi/libxce_receiver.symbols");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("libxce_receiver.so.0 libxce-receiver0 #MINVER#"),
        "the symbols file's first line names the soname and the runtime package"
    );
    let committed: std::collections::BTreeSet<String> = lines
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .map(|s| s.trim_end_matches("@Base").to_owned())
        .collect();
    let exported = exported_functions(&target_dir().join("debug/libxce_receiver.so"));
    let added: Vec<_> = exported.difference(&committed).collect();
    let removed: Vec<_> = committed.difference(&exported).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "libxce_receiver's exported symbols are not capi/libxce_receiver.symbols:\n  \
         exported but not listed: {added:?}\n  listed but not exported: {removed:?}\n\
         If this is deliberate (docs/controller.md, \"ABI\"): a new function gets a line \
         \" NAME@Base VERSION\" with the version that first has it (and that version's minor \
         is bumped); a removed or changed one is an incompatible change: bump the major in \
         capi/Cargo.toml (the soname libxce_receiver.so.MAJOR and the package \
         libxce-receiverMAJOR follow) and rewrite the list for it."
    );
}

/// examples/c/worker.c (built beside the controller example by the same make).
fn worker_example() -> Option<PathBuf> {
    example()?;
    Some(Path::new(REPO).join("examples/c/xce-worker-example"))
}

/// The worker's door end to end: the real agent daemon feeds examples/c/worker.c over a
/// unix socket (no TLS); the worker registers the declared resource, takes its values,
/// marks it unknown when the agent is gone; a process of another uid is refused; SIGTERM
/// frees everything (under valgrind where it is installed).
#[tokio::test]
async fn the_worker_example_takes_an_agents_values_over_the_unix_socket() {
    let Some(worker) = worker_example() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Others may traverse it: a process of another uid tries the socket below.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sock = dir.path().join("worker.sock");
    let valgrind = valgrind_available();
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        c.args(valgrind_args(&checkout_suppressions(), true))
            .arg(&worker);
        c
    } else {
        Command::new(&worker)
    };
    let uid = nix::unistd::geteuid().as_raw().to_string();
    let mut child = cmd
        .arg(&sock)
        .args(["--uid", &uid])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the worker example");
    let stdout = lines_of(child.stdout.take().expect("stdout"));
    let stderr = lines_of(child.stderr.take().expect("stderr"));
    loop {
        match stderr.recv_timeout(HANG_GUARD) {
            Ok(l) if l.contains("listening on ") => break,
            Ok(_) => {}
            Err(e) => panic!("the worker never said it listens: {e}"),
        }
    }
    let mut seen = Vec::new();
    let mut expect = |prefix: &str| loop {
        match stdout.recv_timeout(HANG_GUARD) {
            Ok(l) => {
                seen.push(l.clone());
                if l.starts_with(prefix) {
                    return l;
                }
            }
            Err(e) => panic!("no line {prefix:?} from the worker ({e}): {seen:?}"),
        }
    };
    // The agent, with only the unix controller: no tls: section needed.
    let site = Site::reporting_to_unix(&sock, COUNTER);
    site.counter_script("level");
    let mut agent = site.spawn_agent();
    expect("register level");
    expect("value level ");
    // A process of another uid is refused before a byte is read.
    if nix::unistd::geteuid().is_root() {
        let status = Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)",
            ])
            .arg(&sock)
            .uid(65534)
            .gid(65534)
            .status()
            .expect("python3");
        assert!(status.success());
        let refused = expect("refused ");
        assert!(
            refused.contains("uid=65534") && refused.contains(" identity "),
            "{refused}"
        );
    } else {
        eprintln!("another uid's refusal not tried: needs root");
    }
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait_exit().await;
    expect("unknown level gone");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let out = crate::support::lines_until_closed(&stdout, "the worker");
    let err = crate::support::lines_until_closed(&stderr, "the worker");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", err.join("\n"));
    assert_eq!(out.last().map(String::as_str), Some("stopped"), "{out:?}");
    if valgrind {
        let report = err.join("\n");
        assert!(report.contains("ERROR SUMMARY: 0 errors"), "{report}");
    }
}
