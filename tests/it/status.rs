//! `xce-agent status` against a real daemon, and `listen --format table` against real agents:
//! the socket, its permissions, its bounds, a stale socket file, and state that changes.

use crate::support as e2e_common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::support::{agent_bin, status, wait_status, wait_until, AgentProc, ListenProc, Site};
use xce_agent::status::StatusReport;

const RESOURCES: &str = r#"
resources:
  - name: scratch
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [scratch.sh]}
  - name: mode
    valtype: string
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [mode.sh]}
"#;

/// A site whose agent serves its status socket in the site's directory. `mode.sh` prints
/// the content of `mode` and fails when it is `fail`.
fn status_site(controllers: &[String], extra: &str) -> Site {
    let site = Site::new(controllers, RESOURCES);
    site.counter_script("scratch");
    let d = site.path().display();
    site.script(
        "mode.sh",
        &format!("#!/bin/sh\nm=$(cat {d}/mode)\n[ \"$m\" = fail ] && {{ echo broken >&2; exit 3; }}\necho $m\n"),
    );
    site.write_atomic("mode", "fine\n");
    with_status_socket(site, extra)
}

/// `site`, its agent serving its status socket in the site's directory.
fn with_status_socket(site: Site, extra: &str) -> Site {
    let mut agent = std::fs::OpenOptions::new()
        .append(true)
        .open(site.agent_yaml())
        .expect("open agent.yaml");
    write!(agent, "status_socket: status.sock\n{extra}").expect("append to agent.yaml");
    site
}

fn socket(site: &Site) -> PathBuf {
    site.file("status.sock")
}

fn status_cmd(site: &Site, args: &[&str]) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.arg("status")
        .arg("--config")
        .arg(site.agent_yaml())
        .args(args)
        .stdin(Stdio::null());
    cmd
}

fn run(mut cmd: Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run xce-agent status");
    (
        status.code().expect("exit code"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn resource<'a>(r: &'a StatusReport, name: &str) -> &'a xce_agent::status::ResourceInfo {
    r.resources
        .iter()
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("no {name} in {r:?}"))
}

/// Two stream probes: `good` prints two ELIM lines, `garbage` two lines that are not.
pub const STREAMS: &str = "resources:
  - {name: good, valtype: numeric, interval: 60s, resourcemap: [{location: [default]}], probe: {kind: stream, command: [good], format: elim}}
  - {name: garbage, valtype: numeric, interval: 60s, resourcemap: [{location: [default]}], probe: {kind: stream, command: [garbage], format: elim}}
";

/// The scripts of [`STREAMS`], written by `script(name, body)`.
pub fn stream_scripts<T>(script: impl Fn(&str, &str) -> T) {
    script(
        "good",
        "#!/bin/sh\necho '1 good 5'\necho '1 good 6'\nexec sleep 1000\n",
    );
    script(
        "garbage",
        "#!/bin/sh\necho 'not an elim line'\necho 'nor this'\nexec sleep 1000\n",
    );
}

/// A Grid Engine load sensor printing `value`, as sge_execd asks it (a newline a report).
fn load_sensor(value: u32) -> String {
    format!(
        "#!/bin/sh\nwhile read -r line; do\n  [ \"$line\" = quit ] && exit 0\n  \
         printf 'begin\\n%s:sensed:{value}\\nend\\n' \"$(uname -n)\"\ndone\n"
    )
}

/// Like sge_execd, the agent restarts a load sensor whose executable changed (issue 27
/// item 1): the new one's reports arrive, and the restart is counted.
#[tokio::test]
async fn a_load_sensor_whose_executable_changes_is_restarted() {
    let stream = "resources:
  - {name: sensed, valtype: numeric, interval: 1s, resourcemap: [{location: [default]}], probe: {kind: stream, command: [sensor], format: sge}}
";
    let site = with_status_socket(Site::new(&[], stream), "");
    site.script("sensor", &load_sensor(1));
    let _agent = site.spawn_agent();
    let value = |r: &StatusReport| {
        r.resources
            .iter()
            .find(|x| x.name == "sensed")
            .map(|x| x.value.clone())
    };
    wait_status(&site, "the first sensor's report", |r| {
        value(r) == Some(xce_agent::value::Value::Numeric(1.0))
    })
    .await;
    // Replaced as a package upgrade does (a new file renamed over the old one), with a
    // modification time of its own.
    site.write_atomic("sensor", &load_sensor(2));
    let path = site.file("sensor");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let (report, _) = wait_status(&site, "the new sensor's report", |r| {
        value(r) == Some(xce_agent::value::Value::Numeric(2.0))
    })
    .await;
    let probe = report.probes.iter().find(|p| p.name == "sensed").unwrap();
    assert_eq!(probe.restarts, 1, "{probe:?}");
}

/// Stream probes are counted like the others (issue 27, items 9 and 10): each line applied
/// is a run, with its last success; a stream whose every line is rejected says so.
#[tokio::test]
async fn a_streams_lines_are_counted_as_runs_and_rejected_ones_shown() {
    let site = with_status_socket(Site::new(&[], STREAMS), "");
    stream_scripts(|name, body| site.script(name, body));
    let _agent = site.spawn_agent();
    let probe = |r: &StatusReport, name: &str| {
        r.probes
            .iter()
            .find(|p| p.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no probe {name} in {r:?}"))
    };
    let (report, _) = wait_status(&site, "both streams' lines counted", |r| {
        probe(r, "good").runs_ok == 2 && probe(r, "garbage").runs_rejected == 2
    })
    .await;
    let good = probe(&report, "good");
    assert!(good.last_success_ms.is_some(), "{good:?}");
    assert_eq!(
        (good.runs_failed, good.runs_rejected, good.restarts),
        (0, 0, 0)
    );
    let garbage = probe(&report, "garbage");
    assert_eq!((garbage.runs_ok, garbage.last_success_ms), (0, None));
    assert!(
        resource(&report, "garbage")
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("bad elim line")),
        "{report:?}"
    );
    let (_, table, _) = status(&site, &[]);
    let mut probes = table.lines().skip_while(|l| !l.starts_with("PROBE "));
    let header = probes.next().expect("the probes' table");
    let rejected_column = header
        .split_whitespace()
        .position(|c| c == "REJECTED")
        .expect("a REJECTED column");
    let row = probes
        .find(|l| l.starts_with("garbage "))
        .expect("garbage's row");
    assert_eq!(
        row.split_whitespace().nth(rejected_column),
        Some("2"),
        "{table}"
    );
}

#[tokio::test]
async fn status_shows_the_daemons_values_and_link_as_table_and_json() {
    let listen = ListenProc::spawn_with(&["--format", "json", "--ack"]);
    let controller = listen.addr.to_string();
    let site = status_site(std::slice::from_ref(&controller), "");
    let mut agent = site.spawn_agent();
    let (report, code) = wait_status(&site, "values sent and acknowledged", |r| {
        r.link.state == "connected"
            && r.link.last_ack_ms.is_some()
            && r.resources.iter().all(|x| x.status.as_str() == "ok")
    })
    .await;
    assert_eq!(code, 0, "all ok: exit 0");
    assert_eq!(report.agent.host, "node001");
    assert_eq!(report.agent.pid, agent.pid());
    assert_eq!(report.config.generation, 1);
    assert_eq!(report.link.controller.as_deref(), Some(controller.as_str()));
    assert_eq!(resource(&report, "mode").value.to_string(), "fine");
    assert_eq!(resource(&report, "mode").probe, "mode");
    assert!(resource(&report, "scratch").next_run_ms.is_some());
    let probe = report
        .probes
        .iter()
        .find(|p| p.name == "scratch")
        .expect("scratch probe");
    assert!(probe.runs_ok >= 1, "{probe:?}");

    let (code, table, _) = status(&site, &[]);
    assert_eq!(code, 0, "{table}");
    assert!(
        table.contains(&format!("connected to {controller}")),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("mode "))
        .unwrap_or_else(|| panic!("no mode row in\n{table}"));
    assert_eq!(
        row.split_whitespace().take(3).collect::<Vec<_>>(),
        ["mode", "fine", "ok"]
    );

    // Only agent.yaml is read: a resources.yaml broken after the start does not matter.
    std::fs::write(site.file("resources.yaml"), "resources: [").expect("break resources.yaml");
    let (code, _, err) = status(&site, &[]);
    assert_eq!(code, 0, "{err}");

    // NAME... limits the answer.
    let (_, json, _) = status(&site, &["--format", "json", "mode"]);
    let only: StatusReport = serde_json::from_str(&json).expect("json answer");
    let names: Vec<&str> = only.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["mode"]);
    agent.assert_alive();
}

#[tokio::test]
async fn a_failing_probe_and_a_vanished_controller_show_in_status() {
    let listen = ListenProc::spawn_with(&["--format", "json"]);
    let site = status_site(&[listen.addr.to_string()], "");
    let _agent = site.spawn_agent();
    wait_status(&site, "the link up and mode ok", |r| {
        r.link.state == "connected" && resource(r, "mode").status.as_str() == "ok"
    })
    .await;

    site.write_atomic("mode", "fail\n");
    let (report, code) = wait_status(&site, "mode to fail", |r| {
        resource(r, "mode").status.as_str() == "failed"
    })
    .await;
    assert_eq!(code, 1, "a failed resource: exit 1");
    let mode = resource(&report, "mode");
    assert!(
        mode.error.as_deref().is_some_and(|e| e.contains("exit")),
        "{mode:?}"
    );
    assert!(report
        .probes
        .iter()
        .any(|p| p.name == "mode" && p.runs_failed >= 1));
    let (code, table, _) = status(&site, &[]);
    assert_eq!(code, 1);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("mode ") && l.contains("failed")),
        "{table}"
    );

    site.write_atomic("mode", "fine\n");
    wait_status(&site, "mode to recover", |r| {
        resource(r, "mode").status.as_str() == "ok"
    })
    .await;

    drop(listen);
    let (report, code) = wait_status(&site, "the link to go down", |r| {
        r.link.state != "connected"
    })
    .await;
    assert_eq!(code, 1, "link down: exit 1");
    assert!(report.link.controller.is_none());
    assert_eq!(
        report.link.resvals_waiting, 2,
        "everything waits for the next snapshot"
    );
    assert!(report.link.disconnects >= 1 || report.link.connect_failures >= 1);
}

#[tokio::test]
async fn watch_redraws_every_second() {
    let site = status_site(&[], "");
    let _agent = site.spawn_agent();
    wait_status(&site, "the daemon to answer", |_| true).await;
    let mut child = status_cmd(&site, &["--watch"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn status --watch");
    let mut out = child.stdout.take().expect("stdout");
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while text.matches("HOST  node001").count() < 2 {
        let n = out.read(&mut buf).expect("read status --watch");
        assert!(n > 0, "status --watch ended early:\n{text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(text.contains("LINK  no controllers configured"), "{text}");
}

#[tokio::test]
async fn no_daemon_exits_3_with_what_to_do() {
    let site = status_site(&[], "");
    let (code, _, err) = status(&site, &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains(&socket(&site).display().to_string()), "{err}");
    assert!(err.contains("systemctl status xce-agent"), "{err}");
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_live_one_is_not_stolen() {
    let site = status_site(&[], "");
    // What a daemon killed with SIGKILL leaves: a socket file nobody listens on.
    drop(UnixListener::bind(socket(&site)).expect("bind"));
    assert!(socket(&site).exists());
    let (code, _, _) = status(&site, &[]);
    assert_eq!(code, 3, "a stale socket is not a running daemon");

    let mut agent = site.spawn_agent();
    agent.wait_log("status socket listening", 1).await;
    assert!(agent.log_text().contains("replacing the status socket"));
    let (code, _, err) = status(&site, &[]);
    assert_eq!(code, 0, "{err}");
    let mode = std::fs::metadata(socket(&site))
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let second = Command::new(agent_bin())
        .arg("--config")
        .arg(site.agent_yaml())
        .stdin(Stdio::null())
        .output()
        .expect("run a second agent");
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{err}");
    assert!(err.contains("another xce-agent is running"), "{err}");
    let (code, _, _) = status(&site, &[]);
    assert_eq!(code, 0, "the first daemon still answers");

    agent.terminate().await;
    assert!(!socket(&site).exists(), "a clean stop removes the socket");
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

const NOBODY: u32 = 65534;

/// `status` as uid/gid nobody (no supplementary groups: std drops them with the uid).
fn status_as_nobody(site: &Site, gid: u32) -> (i32, String, String) {
    let mut cmd = status_cmd(site, &[]);
    cmd.uid(NOBODY).gid(gid);
    run(cmd)
}

#[tokio::test]
async fn an_unprivileged_user_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root to run the command as nobody");
        return;
    }
    let site = status_site(&[], "");
    let mut agent = site.spawn_agent();
    agent.wait_log("status socket listening", 1).await;
    let (code, _, err) = status_as_nobody(&site, NOBODY);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("permission denied: run as root or as a member of status_group"),
        "{err}"
    );

    // Made world-writable by hand, the socket still refuses: the daemon checks the peer.
    std::fs::set_permissions(socket(&site), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let (code, _, err) = status_as_nobody(&site, NOBODY);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("permission denied: run as root or as a member of status_group"),
        "{err}"
    );
}

/// A daemon whose status_group is gid 65534's group (nobody's), serving its socket.
async fn nobody_group_site() -> (Site, e2e_common::AgentProc) {
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(NOBODY))
        .ok()
        .flatten()
        .expect("a group with gid 65534");
    let site = status_site(&[], &format!("status_group: {}\n", group.name));
    let mut agent = site.spawn_agent();
    agent.wait_log("status socket listening", 1).await;
    (site, agent)
}

#[tokio::test]
async fn members_of_status_group_may_read() {
    if !is_root() {
        eprintln!("skipped: needs root to run the command as nobody");
        return;
    }
    let (site, _agent) = nobody_group_site().await;
    let meta = std::fs::metadata(socket(&site)).expect("socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let (code, out, err) = status_as_nobody(&site, NOBODY);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("HOST  node001"), "{out}");
    // Another group is refused.
    let (code, _, err) = status_as_nobody(&site, 1);
    assert_eq!(code, 2, "{err}");
}

/// A member of status_group who opens every connection the daemon answers at once and
/// holds them idle cannot lock root out: root's `status` is answered while they are held,
/// and the member's connections past the shared slots are told "busy" at once.
#[tokio::test]
async fn a_member_holding_every_slot_cannot_lock_root_out() {
    use xce_agent::status::server::{MAX_CONNECTIONS, RESERVED_FOR_ROOT};
    if !is_root() {
        eprintln!("skipped: needs root to run the holder as nobody");
        return;
    }
    let (site, mut agent) = nobody_group_site().await;
    // Connects MAX_CONNECTIONS times, says so, then (when told) reports how many of its
    // connections have been answered "busy" by then.
    let holder = format!(
        "import select, socket, sys\n\
         conns = []\n\
         for _ in range({MAX_CONNECTIONS}):\n\
         \x20   s = socket.socket(socket.AF_UNIX); s.connect({path:?}); conns.append(s)\n\
         print('held', flush=True)\n\
         sys.stdin.readline()\n\
         busy = 0\n\
         for s in conns:\n\
         \x20   if select.select([s], [], [], 0)[0] and b'busy' in s.recv(4096): busy += 1\n\
         print(busy, flush=True)\n",
        path = socket(&site).display().to_string()
    );
    let mut python = Command::new("python3");
    python
        .args(["-c", &holder])
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut holder = e2e_common::KillOnDrop(python.spawn().expect("python3"));
    let mut out = std::io::BufReader::new(holder.0.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let (code, text, err) = status(&site, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("HOST  node001"), "{text}");
    holder.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    // Each busy answer was written as its connection was accepted, before root's.
    assert_eq!(
        line.trim(),
        RESERVED_FOR_ROOT.to_string(),
        "connections told busy"
    );
    agent.assert_alive();
}

/// One raw exchange on the socket.
fn exchange(site: &Site, request: &[u8]) -> serde_json::Value {
    let mut s = UnixStream::connect(socket(site)).expect("connect");
    let _ = s.write_all(request);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read answer");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
}

#[tokio::test]
async fn bad_requests_get_an_error_and_idle_clients_do_not_stall_the_daemon() {
    let site = status_site(&[], "");
    let mut agent = site.spawn_agent();
    agent.wait_log("status socket listening", 1).await;

    let refused = |request: &[u8], needle: &str| {
        let v = exchange(&site, request);
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains(needle), "{v}");
    };
    refused(b"{\"version\": 2}\n", "version 2 not supported");
    refused(b"not json\n", "not JSON");
    refused(&[b' '; 8 * 1024], "longer than");
    // No request at all is the default request.
    let v = exchange(&site, b"");
    assert_eq!(v["version"], 1, "{v}");
    assert!(v["resources"].is_array(), "{v}");

    // Clients that connect and neither write nor read take every slot...
    let idle: Vec<UnixStream> = (0..xce_agent::status::server::MAX_CONNECTIONS + 4)
        .map(|_| UnixStream::connect(socket(&site)).expect("connect"))
        .collect();
    // ...and the daemon goes on probing meanwhile.
    let runs = site.runs("scratch");
    site.wait_runs("scratch", runs + 2).await;
    // Each is answered and dropped after the read timeout; then the command gets through.
    let (code, out, err) = status(&site, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("HOST  node001"));
    for mut s in idle {
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read");
        assert!(answer.contains("no request received in time"), "{answer}");
    }
    agent.assert_alive();
}

/// `listen --format table` with frames every 100 ms into a pipe.
fn table_listener(only: &str) -> ListenProc {
    ListenProc::spawn_with(&["--format", "table", "--refresh", "100ms", "--only", only])
}

#[tokio::test]
async fn listen_shows_several_agents_as_one_table() {
    let mut listen = table_listener("mode,scratch");
    let controller = listen.addr.to_string();
    let one = status_site(std::slice::from_ref(&controller), "");
    let two = status_site(std::slice::from_ref(&controller), "");
    let yaml = std::fs::read_to_string(two.agent_yaml()).expect("read");
    std::fs::write(
        two.agent_yaml(),
        yaml.replace("host: node001", "host: node002"),
    )
    .expect("write");
    two.write_atomic("mode", "busy\n");
    let _a = one.spawn_agent();
    let _b = two.spawn_agent();
    // Frames arrive as lines; read until one frame shows both hosts with their values.
    let mut frame: Vec<String> = Vec::new();
    let rows = loop {
        let line = listen
            .stdout
            .recv_timeout(e2e_common::HANG_GUARD)
            .expect("a table line from listen");
        if line.starts_with("--- ") {
            let rows: Vec<Vec<String>> = frame
                .iter()
                .map(|l| l.split_whitespace().map(str::to_owned).collect())
                .collect();
            let values_in = |host: &str, mode: &str| {
                rows.iter().any(|r| {
                    r.len() == 5 && r[0] == host && r[1] == "up" && r[3] == mode && r[4] != "?"
                })
            };
            if values_in("node001", "fine") && values_in("node002", "busy") {
                break rows;
            }
            frame.clear();
        } else {
            frame.push(line);
        }
    };
    assert_eq!(rows[0], ["HOST", "LINK", "AGE", "mode", "scratch"]);
    listen.assert_alive();
}

#[test]
fn status_socket_and_group_in_agent_yaml() {
    use xce_agent::config;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("agent.yaml");
    std::fs::write(&p, "run_as: nobody\n").expect("write");
    let (agent, _) = config::load_agent(&p).expect("valid");
    assert_eq!(agent.status_socket, None);
    std::fs::write(&p, "status_socket: run/s.sock\nstatus_group: adm\n").expect("write");
    let (agent, _) = config::load_agent(&p).expect("valid");
    assert_eq!(agent.status_socket_path(), dir.path().join("run/s.sock"));
    assert_eq!(agent.status_group.as_deref(), Some("adm"));
    std::fs::write(&p, "status_socket: \"\"\nstatus_group: \" \"\n").expect("write");
    let e = config::load_agent(&p).expect_err("empty").0;
    assert!(
        e[0].to_string()
            .ends_with("agent.yaml:1:16: status_socket is empty"),
        "{e:?}"
    );
    assert!(
        e[1].to_string()
            .ends_with("agent.yaml:2:15: status_group is empty"),
        "{e:?}"
    );
}

/// A reload that fails is seen in `status` (it exits 1: the daemon runs an older
/// configuration than the files hold), with the first line of why; the next good one clears it.
#[tokio::test]
async fn a_failed_reload_shows_in_status_until_one_succeeds() {
    let site = status_site(&[], "");
    let mut agent = site.spawn_agent();
    agent.wait_log("status socket listening", 1).await;
    let good = std::fs::read_to_string(site.file("resources.yaml")).unwrap();
    std::fs::write(
        site.file("resources.yaml"),
        "resources:\n  - name: [broken\n",
    )
    .unwrap();
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    agent.wait_log("reload failed", 1).await;
    let (code, out, err) = status(&site, &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("RELOAD  FAILED "), "{out}");
    assert!(out.contains("resources.yaml:2:"), "{out}");
    assert!(
        out.contains("still running the configuration above"),
        "{out}"
    );
    let (_, json, _) = status(&site, &["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["config"]["last_reload"]["ok"], false, "{json}");

    std::fs::write(site.file("resources.yaml"), good).unwrap();
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    agent.wait_log("configuration unchanged", 1).await;
    let (_, out, _) = status(&site, &[]);
    assert!(out.contains("RELOAD  ok "), "{out}");
    agent.assert_alive();
}

/// A daemon whose status socket is off (the directory systemd was to make is missing) is
/// running: `status` says so and why, not "not running".
#[tokio::test]
async fn status_tells_a_running_daemon_with_its_socket_off_from_no_daemon() {
    let site = Site::new(&[], RESOURCES);
    site.counter_script("scratch");
    site.script("mode.sh", "#!/bin/sh\necho fine\n");
    let absent = site.file("absent");
    let absent = absent.to_str().expect("utf-8");
    let mut agent = AgentProc::spawn_with_env(
        &site.agent_yaml(),
        &site.file("agent.log"),
        &[("RUNTIME_DIRECTORY", absent)],
    );
    agent.wait_log("status socket off", 1).await;
    assert!(
        agent.log_text().contains(" WARN "),
        "logged below WARN: {}",
        agent.log_text()
    );
    let (code, _, err) = run({
        let mut cmd = status_cmd(&site, &[]);
        cmd.env("RUNTIME_DIRECTORY", absent);
        cmd
    });
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the agent is running (pid "), "{err}");
    assert!(err.contains(&agent.pid().to_string()), "{err}");
    assert!(err.contains("its status socket is off"), "{err}");
    agent.assert_alive();
}

/// Issue 39, item 2: outside systemd (no RUNTIME_DIRECTORY), with no `status_socket:`, the
/// daemon makes its socket's directory and `status` (the README's example) reaches it: as
/// root /run/xce-agent (not touched here: this machine is shared), as another user
/// $XDG_RUNTIME_DIR/xce-agent, which is what this test runs, with root's rule by the unit
/// test of `default_status_socket`.
#[tokio::test]
async fn status_works_outside_systemd_without_status_socket() {
    if !is_root() {
        eprintln!("skipped: needs root to run the daemon as nobody");
        return;
    }
    let site = Site::new(&[], "resources: []\n");
    std::fs::write(
        site.agent_yaml(),
        format!(
            "host: node001\nresources: resources.yaml\nplugin_dir: {}\nrun_as: nobody\n",
            site.path().display()
        ),
    )
    .expect("write agent.yaml");
    // nobody's runtime directory, as pam_systemd would make it (0700, its own).
    let runtime = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(runtime.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    nix::unistd::chown(
        runtime.path(),
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(nix::unistd::Gid::from_raw(NOBODY)),
    )
    .expect("chown");
    let xdg = runtime.path().to_str().expect("utf-8").to_owned();
    let as_nobody = |cmd: &mut Command| {
        cmd.uid(NOBODY)
            .gid(NOBODY)
            .env_remove("RUNTIME_DIRECTORY")
            .env("XDG_RUNTIME_DIR", &xdg);
    };
    let log = std::fs::File::create(site.file("agent.log")).expect("log");
    let mut daemon = Command::new(agent_bin());
    daemon
        .arg("--config")
        .arg(site.agent_yaml())
        .env("XCE_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    as_nobody(&mut daemon);
    let mut child = daemon.spawn().expect("spawn");
    let sock = runtime.path().join("xce-agent/status.sock");
    let log_text = || std::fs::read_to_string(site.file("agent.log")).unwrap_or_default();
    wait_until("the status socket", || {
        sock.exists() || log_text().contains("status socket off")
    })
    .await;
    let mut cmd = status_cmd(&site, &[]);
    as_nobody(&mut cmd);
    let (code, out, err) = run(cmd);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    assert_eq!(code, 0, "{out}{err}\n{}", log_text());
    assert!(out.contains("LINK"), "{out}");
    assert_eq!(
        std::fs::metadata(runtime.path().join("xce-agent"))
            .expect("made")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
}

#[test]
fn the_default_status_socket_is_on_for_root_and_other_users() {
    use std::ffi::OsStr;
    use xce_agent::config::agent::default_status_socket as d;
    let root = d(0, None, Some(OsStr::new("/run/user/0")));
    assert_eq!(root.path, PathBuf::from("/run/xce-agent/status.sock"));
    assert_eq!(root.make_dir, Some(0o755));
    let user = d(1000, None, Some(OsStr::new("/run/user/1000")));
    assert_eq!(
        user.path,
        PathBuf::from("/run/user/1000/xce-agent/status.sock")
    );
    assert_eq!(user.make_dir, Some(0o700));
    assert_eq!(
        d(1000, None, None).path,
        PathBuf::from("/run/user/1000/xce-agent/status.sock")
    );
    let systemd = d(0, Some(OsStr::new("/run/xce-agent")), None);
    assert_eq!(systemd.path, PathBuf::from("/run/xce-agent/status.sock"));
    assert_eq!(systemd.make_dir, None, "systemd makes it");
}

#[tokio::test]
async fn an_explicit_status_socket_that_cannot_be_bound_stops_the_start() {
    let site = status_site(&[], "");
    let text = std::fs::read_to_string(site.agent_yaml()).expect("read");
    let text = text.replace(
        "status_socket: status.sock",
        "status_socket: no/such/dir/s.sock",
    );
    std::fs::write(site.agent_yaml(), text).expect("write");
    let out = Command::new(agent_bin())
        .arg("--config")
        .arg(site.agent_yaml())
        .stdin(Stdio::null())
        .output()
        .expect("run the agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("directory does not exist"), "{err}");
    // A regular file where the socket goes is never removed.
    let other = status_site(&[], "");
    std::fs::write(socket(&other), "precious").expect("write");
    let out = Command::new(agent_bin())
        .arg("--config")
        .arg(other.agent_yaml())
        .stdin(Stdio::null())
        .output()
        .expect("run the agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(
        std::fs::read_to_string(socket(&other)).expect("kept"),
        "precious"
    );
}

#[tokio::test]
async fn a_reload_shows_as_a_new_config_generation() {
    let site = status_site(&[], "");
    let mut agent = site.spawn_agent();
    let (before, _) = wait_status(&site, "the first answer", |_| true).await;
    assert_eq!(before.config.generation, 1);
    let more = format!(
        "{RESOURCES}  - name: extra\n    valtype: numeric\n    interval: 1s\n    \
         resourcemap: [{{location: [default]}}]\n    probe: {{kind: exec, command: [scratch.sh]}}\n"
    );
    site.write_atomic("resources.yaml", &more);
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    let (after, _) = wait_status(&site, "generation 2", |r| r.config.generation == 2).await;
    assert_ne!(after.config.digest, before.config.digest);
    assert!(after.config.loaded_ms >= before.config.loaded_ms);
    assert!(
        after.resources.iter().any(|r| r.name == "extra"),
        "{after:?}"
    );
    agent.assert_alive();
}

#[tokio::test]
async fn a_client_that_does_not_read_a_large_answer_is_dropped_and_stalls_nothing() {
    // 8,000 resources fed by 8 kv probes: an answer of megabytes, more than a unix socket
    // buffers, so a client that does not read leaves the daemon's write blocked.
    const PROBES: usize = 8;
    const EACH: usize = 1000;
    let mut yaml = String::from("resources:\n");
    for p in 0..PROBES {
        let provides: Vec<String> = (1..EACH).map(|i| format!("big{p}_{i}")).collect();
        yaml.push_str(&format!(
            "  - name: big{p}_0\n    interval: 2s\n    resourcemap: [{{location: [default]}}]\n    \
             probe: {{kind: exec, command: [big.sh, \"{p}\"], format: kv, provides: [{}]}}\n",
            provides.join(", ")
        ));
        for name in &provides {
            yaml.push_str(&format!("  - name: {name}\n    interval: 2s\n"));
        }
    }
    let site = Site::new(&[], &yaml);
    let d = site.path().display();
    site.script(
        "big.sh",
        &format!("#!/bin/sh\necho run >> {d}/big.runs\ni=0\nwhile [ $i -lt {EACH} ]; do echo \"big$1_$i = $i\"; i=$((i+1)); done\n"),
    );
    let mut agent = std::fs::OpenOptions::new()
        .append(true)
        .open(site.agent_yaml())
        .expect("open agent.yaml");
    writeln!(agent, "status_socket: status.sock").expect("append");
    let mut agent = site.spawn_agent();
    wait_status(&site, "every value ok", |r| {
        r.resources.len() == PROBES * EACH && r.resources.iter().all(|x| x.status.as_str() == "ok")
    })
    .await;

    let mut stuck = UnixStream::connect(socket(&site)).expect("connect");
    stuck.write_all(b"{}\n").expect("request");
    // The daemon answers others meanwhile and goes on probing.
    let (code, out, err) = status(&site, &["big0_0"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("big0_0"), "{out}");
    site.wait_runs("big", site.runs("big") + 2).await;
    // The stuck client is dropped (its peer hangs up while the answer is still unread)...
    {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd as _;
        // No events asked for: poll wakes on POLLHUP alone, which a unix socket reports
        // once its peer is gone (data still unread or not).
        let mut fds = [PollFd::new(stuck.as_fd(), PollFlags::empty())];
        let guard = PollTimeout::try_from(e2e_common::HANG_GUARD).expect("timeout");
        // A signal handled in this test process (SIGCHLD, for another test's child) ends a
        // poll with EINTR, as it ends any poll: ask again.
        while let Err(e) = poll(&mut fds, guard) {
            assert_eq!(e, nix::errno::Errno::EINTR, "poll");
        }
        let hung_up = fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP));
        assert!(
            hung_up,
            "the daemon never dropped the client that does not read"
        );
    }
    // ...and what it finally reads is a cut-off answer.
    stuck
        .set_read_timeout(Some(e2e_common::HANG_GUARD))
        .expect("read timeout");
    let mut body = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        match stuck.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the stuck client's answer: {e}"),
        }
    }
    assert!(!body.is_empty(), "the answer had started");
    assert!(
        serde_json::from_slice::<serde_json::Value>(&body).is_err(),
        "a whole answer of {} bytes: the daemon was not stuck on this client",
        body.len()
    );
    agent.assert_alive();
}

/// A value with 17 significant digits and a size in megabytes, from one probe in kv format.
const PRECISE: &str = r#"
resources:
  - name: r15s_x
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
    probe: {kind: exec, command: [precise.sh], format: kv, provides: [scratch_mb]}
  - name: scratch_mb
    valtype: numeric
    interval: 1s
    resourcemap: [{location: [default]}]
"#;

fn precise_site(controllers: &[String]) -> Site {
    let site = Site::new(controllers, PRECISE);
    site.script(
        "precise.sh",
        "#!/bin/sh\necho r15s_x=2.6275805558362759\necho scratch_mb=23311.64\n",
    );
    let mut agent = std::fs::OpenOptions::new()
        .append(true)
        .open(site.agent_yaml())
        .expect("open agent.yaml");
    writeln!(agent, "status_socket: status.sock").expect("append to agent.yaml");
    site
}

/// The cells of the table's row that starts with `name`.
fn table_row(table: &str, name: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|r| r.first().map(String::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no {name} row in\n{table}"))
}

#[tokio::test]
async fn tables_round_values_for_people_and_json_keeps_them_exact() {
    let mut listen = table_listener("r15s_x,scratch_mb");
    let controller = listen.addr.to_string();
    let site = precise_site(std::slice::from_ref(&controller));

    // --once: the table rounds, JSON is exact.
    let mut once = Command::new(agent_bin());
    once.args(["--once", "--config"]).arg(site.agent_yaml());
    let (code, table, err) = run(once);
    assert_eq!(code, 0, "{table}{err}");
    assert_eq!(table_row(&table, "r15s_x")[1], "2.63", "{table}");
    assert_eq!(table_row(&table, "scratch_mb")[1], "22.8G", "{table}");
    let mut once = Command::new(agent_bin());
    once.args(["--once", "--format", "json", "--config"])
        .arg(site.agent_yaml());
    let (code, json, err) = run(once);
    assert_eq!(code, 0, "{json}{err}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("--once json");
    let value = |name: &str| {
        json["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["value"].clone())
            .unwrap_or_else(|| panic!("no {name} in {json}"))
    };
    assert_eq!(value("r15s_x"), serde_json::json!(2.6275805558362759));
    assert_eq!(value("scratch_mb"), serde_json::json!(23311.64));

    // status: the table rounds, JSON is exact.
    let _agent = site.spawn_agent();
    let (report, _) = wait_status(&site, "both values ok", |r| {
        r.resources.len() == 2 && r.resources.iter().all(|x| x.status.as_str() == "ok")
    })
    .await;
    assert_eq!(
        resource(&report, "r15s_x").value.as_f64(),
        Some(2.6275805558362759)
    );
    assert_eq!(
        resource(&report, "scratch_mb").value.as_f64(),
        Some(23311.64)
    );
    let (code, table, err) = status(&site, &[]);
    assert_eq!(code, 0, "{table}{err}");
    assert_eq!(table_row(&table, "r15s_x")[1], "2.63", "{table}");
    assert_eq!(table_row(&table, "scratch_mb")[1], "22.8G", "{table}");

    // listen --format table: the same rule.
    let mut frame: Vec<String> = Vec::new();
    loop {
        let line = listen
            .stdout
            .recv_timeout(e2e_common::HANG_GUARD)
            .expect("a table line from listen");
        if line.starts_with("--- ") {
            if let Some(row) = frame.iter().find(|l| l.starts_with("node001 ")) {
                let cells: Vec<&str> = row.split_whitespace().collect();
                if cells.len() == 5 && cells[3] != "?" && cells[4] != "?" {
                    assert_eq!(cells[3..], ["2.63", "22.8G"], "{frame:?}");
                    break;
                }
            }
            frame.clear();
        } else {
            frame.push(line);
        }
    }
    listen.assert_alive();
}
