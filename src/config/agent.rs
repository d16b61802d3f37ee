//! agent.yaml: how this agent runs. It is the agent's own file, so every field is strict.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::error::{ConfigErrors, Errors, Pos};
use super::hostlist;
use super::limits::{
    check_duration, Between, Bound, Bounds, COALESCE, DEFAULT_COALESCE, DEFAULT_MAX_INTERVAL,
    DEFAULT_MAX_STUCK_READS, DEFAULT_PROBE_PIDS_MAX, DEFAULT_RELEASE_CODE_AFTER, MAX_INTERVAL,
    MAX_PARALLEL, MAX_STUCK_READS, PROCESSES, RELEASE_CODE_AFTER, TLS_EXPIRY_WARNING,
};
use super::names::{field_names, Field};
use super::recover::{self, Items};
use super::scalar::format_duration;
use super::scalar::Scalar;
use super::yaml::parse_yaml;

/// The controller's port when a `controllers:` entry gives none.
pub const DEFAULT_PORT: u16 = 6870;
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/libexec/xce-agent/plugins";
pub const DEFAULT_RUN_AS: &str = "nobody";
pub const DEFAULT_MAX_PARALLEL: usize = 8;
/// A root daemon's status socket: under the unit's `RuntimeDirectory=xce-agent`, or the
/// directory the daemon makes outside systemd.
pub const DEFAULT_STATUS_SOCKET: &str = "/run/xce-agent/status.sock";

/// Where the status socket is when `status_socket:` is not written, for a process of
/// `euid` with these environment variables: systemd's `$RUNTIME_DIRECTORY` (the unit's
/// `RuntimeDirectory=`) when set; otherwise [`DEFAULT_STATUS_SOCKET`] as root and
/// `$XDG_RUNTIME_DIR/xce-agent/status.sock` (`/run/user/UID` without it) as another user,
/// whose directory the daemon makes. Outside systemd the socket is on all the same.
pub fn default_status_socket(
    euid: u32,
    runtime_directory: Option<&std::ffi::OsStr>,
    xdg_runtime_dir: Option<&std::ffi::OsStr>,
) -> DefaultSocket {
    let absolute = |v: Option<&std::ffi::OsStr>| {
        v.map(Path::new)
            .filter(|p| p.is_absolute())
            .map(Path::to_owned)
    };
    // systemd lists several directories separated by spaces when the unit names several.
    let systemd = runtime_directory
        .and_then(|v| v.to_str())
        .and_then(|v| v.split(' ').next())
        .map(std::ffi::OsStr::new);
    if let Some(dir) = absolute(systemd) {
        return DefaultSocket {
            path: dir.join("status.sock"),
            make_dir: None,
        };
    }
    let dir = if euid == 0 {
        PathBuf::from("/run/xce-agent")
    } else {
        absolute(xdg_runtime_dir)
            .unwrap_or_else(|| PathBuf::from(format!("/run/user/{euid}")))
            .join("xce-agent")
    };
    DefaultSocket {
        path: dir.join("status.sock"),
        // Root's like systemd's RuntimeDirectoryMode=0755; a user's private.
        make_dir: Some(if euid == 0 { 0o755 } else { 0o700 }),
    }
}

/// The default status socket, and whether the daemon makes its directory (with this mode)
/// where it is missing: not where systemd makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultSocket {
    pub path: PathBuf,
    pub make_dir: Option<u32>,
}

impl DefaultSocket {
    /// This process's default.
    pub fn here() -> Self {
        default_status_socket(
            nix::unistd::geteuid().as_raw(),
            std::env::var_os("RUNTIME_DIRECTORY").as_deref(),
            std::env::var_os("XDG_RUNTIME_DIR").as_deref(),
        )
    }
}

/// agent.yaml's fields, one line each, in `RawAgent`'s order: the man page
/// `xce-agent.yaml(5)` is written from it, and a test holds it to the struct serde reads.
pub const FIELD_DOCS: &[Field] = &[
    Field::new("host", "This host's name as resources.yaml and the controller know it (default: the machine's host name)."),
    Field::new("controllers", "The controllers to report to, `HOST[:PORT]` (port 6870 by default), tried in order; empty: report to none."),
    Field::new("resources", "resources.yaml, relative to this file's directory (default /etc/xce/resources.yaml)."),
    Field::new("plugin_dir", "Where a probe's relative `command` is looked up (default /usr/libexec/xce-agent/plugins)."),
    Field::new("run_as", "The user probes run as when the agent is root (default nobody); a probe's own `run_as` wins."),
    Field::new("max_parallel", "How many probes may run at once (default 8).").bounded(Bound::Count(MAX_PARALLEL)),
    Field::new("spread", "Where a host's probes fall in their intervals: `host` (the default), all at one offset of the host's, so probes whose intervals divide one another's run together, in one wake-up, and a node is interrupted once per interval for all its probes (runs beyond max_parallel wait their turn); `probes`, each probe at an offset of its own, so heavy probes (ipmitool, nvidia-smi) do not run at once."),
    Field::new("metrics", "ADDR:PORT to serve Prometheus metrics on (`/metrics`); off when absent."),
    Field::new("status_socket", "The unix socket `xce-agent status` reads (default /run/xce-agent/status.sock as root, $XDG_RUNTIME_DIR/xce-agent/status.sock as another user, $RUNTIME_DIRECTORY/status.sock under systemd)."),
    Field::new("status_group", "A group whose members may read the status socket (else root only)."),
    Field::new("tls", "The link's key material: `ca`, `cert`, `key`, optional `crl` and `expiry_warning` (below); required once controllers are listed, unless insecure_plaintext."),
    Field::new("insecure_plaintext", "true: report to the controllers without TLS, unauthenticated and readable on the network."),
    Field::new("max_stuck_reads", "File reads stuck in a hung filesystem before reads of new paths fail at once (default 32).").bounded(Bound::Count(MAX_STUCK_READS)),
    Field::new("max_interval", "The longest `interval` resources.yaml may give, a duration (default 1d).").bounded(Bound::Duration(MAX_INTERVAL)),
    Field::new("trust_config_files_of_any_owner", "true: a root agent believes resources.yaml, the CA bundle and the CRL whoever owns them (shared storage); never agent.yaml."),
    Field::new("probe_pids_max", "pids.max of each exec and stream probe's cgroup unless its `limits:` say otherwise; 0: none (default 128).").bounded(Bound::Count(PROCESSES)),
    Field::new("coalesce", "After a value changes, how long the link waits for more changes before it sends them in one batch, a duration or milliseconds (`200ms`, the default); 0: each change is sent at once, at more CPU and more frames.").bounded(Bound::Duration(COALESCE)),
    Field::new("release_code_after", "How long after the start, and after each reload, the agent hands back the pages of its own binary and of the never-written mappings of its shared libraries, a duration or milliseconds (`30s`, the default): what the start-up ran (the command line, the YAML parser, the checks) stops counting in its RSS, and the code it keeps running comes back at its next use; 0: never.").bounded(Bound::Duration(RELEASE_CODE_AFTER)),
];

/// `tls:`'s fields, in `RawTls`'s order.
pub const TLS_FIELD_DOCS: &[Field] = &[
    Field::new(
        "ca",
        "CA bundle (PEM) that signs the controllers' and the hosts' certificates.",
    ),
    Field::new(
        "cert",
        "This host's certificate (chain), PEM; a DNS SAN names the host.",
    ),
    Field::new(
        "key",
        "Its private key: PKCS#8, SEC1 or RSA PEM, mode 0600.",
    ),
    Field::new("crl", "Revoked certificates, PEM (optional)."),
    Field::new(
        "expiry_warning",
        "Warn this long before the host certificate expires, a duration (default 30d).",
    )
    .bounded(Bound::Duration(TLS_EXPIRY_WARNING)),
];

/// The fields serde reads from agent.yaml and from its `tls:` section.
pub fn parsed_fields() -> (&'static [&'static str], &'static [&'static str]) {
    (field_names::<RawAgent>(), field_names::<RawTls>())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    host: Option<Spanned<String>>,
    #[serde(default)]
    controllers: Vec<Spanned<String>>,
    resources: Option<Spanned<String>>,
    plugin_dir: Option<Spanned<String>>,
    run_as: Option<Spanned<String>>,
    max_parallel: Option<Spanned<i64>>,
    spread: Option<Spanned<String>>,
    metrics: Option<Spanned<String>>,
    status_socket: Option<Spanned<String>>,
    status_group: Option<Spanned<String>>,
    tls: Option<Spanned<RawTls>>,
    insecure_plaintext: Option<Spanned<bool>>,
    max_stuck_reads: Option<Spanned<i64>>,
    max_interval: Option<Spanned<Scalar>>,
    trust_config_files_of_any_owner: Option<Spanned<bool>>,
    probe_pids_max: Option<Spanned<Scalar>>,
    coalesce: Option<Spanned<Scalar>>,
    release_code_after: Option<Spanned<Scalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: String,
    cert: String,
    key: String,
    crl: Option<String>,
    expiry_warning: Option<Spanned<Scalar>>,
}

/// The link's key material (`tls:` in agent.yaml), paths resolved against agent.yaml's
/// directory. Loaded and checked by `link::tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    /// CA bundle that signs the controllers' and the hosts' certificates.
    pub ca: PathBuf,
    /// This host's certificate (chain), PEM.
    pub cert: PathBuf,
    /// Its private key: PKCS#8, SEC1 or RSA PEM.
    pub key: PathBuf,
    /// Revoked certificates, PEM.
    pub crl: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub path: PathBuf,
    /// Host name override; `None` = the machine's host name.
    pub host: Option<String>,
    /// `host:port`, tried in order.
    pub controllers: Vec<String>,
    /// Absolute (resolved against agent.yaml's directory).
    pub resources: PathBuf,
    pub plugin_dir: PathBuf,
    pub run_as: String,
    pub max_parallel: usize,
    /// `spread`: how this host's probes are placed in their intervals (`plan::splay`).
    pub spread: Spread,
    /// Prometheus endpoint, e.g. `127.0.0.1:9477`.
    pub metrics: Option<String>,
    /// The `xce-agent status` socket; `None` = [`DEFAULT_STATUS_SOCKET`] (not written).
    pub status_socket: Option<PathBuf>,
    /// A group whose members may read the status socket besides root and the agent's user.
    pub status_group: Option<String>,
    /// `None` only with `insecure_plaintext` or without controllers.
    pub tls: Option<TlsPaths>,
    /// Plaintext to the controllers, chosen in words.
    pub insecure_plaintext: bool,
    /// File reads stuck in the kernel (hung filesystem) before new reads are refused.
    pub max_stuck_reads: usize,
    /// The longest `interval` resources.yaml may give.
    pub max_interval: std::time::Duration,
    /// A root agent reads resources.yaml, the CA bundle and the CRL whoever owns them and
    /// whoever may write them (a site with another trust model, e.g. shared storage with
    /// root_squash): chosen in words, warned about at every load. Never agent.yaml itself.
    pub trust_config_files_of_any_owner: bool,
    /// `pids.max` of a probe's cgroup where its `limits:` give none (`None`: no limit).
    pub probe_pids_max: Option<u64>,
    /// `tls.expiry_warning`: how long before this host's certificate expires the agent
    /// starts warning (at start, at each reload, and in `check`).
    pub tls_expiry_warning: std::time::Duration,
    /// `coalesce`: after a change, how long the link waits for more before sending (zero:
    /// at once).
    pub coalesce: std::time::Duration,
    /// `release_code_after`: when the daemon pages out its own binary after the start and
    /// after each reload (zero: never; `own_pages`).
    pub release_code_after: std::time::Duration,
}

impl AgentConfig {
    /// The status socket: `status_socket:`, or this process's [`default_status_socket`].
    pub fn status_socket_path(&self) -> PathBuf {
        match &self.status_socket {
            Some(p) => p.clone(),
            None => DefaultSocket::here().path,
        }
    }

    /// Where `xce-agent status` looks: `status_socket:`, or this user's default, then (for
    /// a user who is not root, e.g. a member of `status_group`) a root daemon's; the first
    /// that exists, else the first.
    pub fn status_socket_to_ask(&self) -> PathBuf {
        let own = self.status_socket_path();
        if self.status_socket.is_some() || own.exists() {
            return own;
        }
        let roots = Path::new(DEFAULT_STATUS_SOCKET);
        if roots.exists() {
            roots.to_owned()
        } else {
            own
        }
    }

    /// What resources.yaml is validated against.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_interval: self.max_interval,
            probe_pids_max: self.probe_pids_max,
        }
    }
}

/// Where agent.yaml at `path` says resources.yaml is, read leniently (whatever else in it is
/// wrong): so that a broken agent.yaml does not hide resources.yaml's errors. `None` when it
/// cannot be read or is not YAML.
pub fn resources_path_of(path: &Path) -> Option<PathBuf> {
    #[derive(Deserialize)]
    struct JustResources {
        resources: Option<String>,
    }
    let text = std::fs::read_to_string(path).ok()?;
    let just: JustResources = serde_saphyr::from_str(&text).ok()?;
    let named = PathBuf::from(just.resources.as_deref().unwrap_or("resources.yaml"));
    Some(match named.is_absolute() {
        true => named,
        false => path.parent().unwrap_or(Path::new(".")).join(named),
    })
}

pub fn parse(path: &Path, text: &str) -> Result<AgentConfig, ConfigErrors> {
    let (raw, shape_errors): (RawAgent, _) = if text.trim().is_empty() {
        (RawAgent::default(), Vec::new())
    } else {
        recover::parse_all(text, Items::TopLevelKeys, |t| parse_yaml(path, t))?
    };
    let mut errs = Errors::new(path);
    errs.list.extend(shape_errors);
    // Children run in `/`, so every path must be absolute, whatever the agent's cwd.
    let parent = path.parent().unwrap_or(Path::new("."));
    let base = if parent.is_absolute() {
        parent.to_owned()
    } else {
        std::env::current_dir().unwrap_or_default().join(parent)
    };
    if let Some(h) = &raw.host {
        if let Err(e) = hostlist::validate_host_name(&h.value) {
            errs.at(Pos::of(h), e);
        }
    }
    let mut controllers = Vec::new();
    for c in &raw.controllers {
        match normalize_controller(&c.value) {
            Ok(addr) => controllers.push(addr),
            Err(e) => errs.at(Pos::of(c), e),
        }
    }
    let max_parallel = counted(
        &mut errs,
        raw.max_parallel.as_ref(),
        "max_parallel",
        MAX_PARALLEL,
    )
    .unwrap_or(DEFAULT_MAX_PARALLEL);
    let spread = spread(&mut errs, raw.spread.as_ref());
    let (max_stuck_reads, max_interval) = stuck_and_interval(&mut errs, &raw);
    let probe_pids_max = probe_pids_max(&mut errs, raw.probe_pids_max.as_ref());
    let coalesce = coalesce(&mut errs, raw.coalesce.as_ref());
    let release_code_after = bounded_duration(
        &mut errs,
        raw.release_code_after.as_ref(),
        "release_code_after",
        Scalar::to_duration_or_ms,
        RELEASE_CODE_AFTER,
    )
    .unwrap_or(DEFAULT_RELEASE_CODE_AFTER);
    let tls_expiry_warning = tls_expiry_warning(
        &mut errs,
        raw.tls
            .as_ref()
            .and_then(|t| t.value.expiry_warning.as_ref()),
    );
    if let Some(m) = &raw.metrics {
        if m.value.parse::<std::net::SocketAddr>().is_err() {
            errs.at(
                Pos::of(m),
                format!(
                    "metrics must be an address like 127.0.0.1:9477, got {:?}",
                    m.value
                ),
            );
        }
    }
    if let Some(u) = &raw.run_as {
        if u.value.trim().is_empty() {
            errs.at(Pos::of(u), "run_as is empty");
        }
    }
    for (field, v) in [
        ("status_socket", &raw.status_socket),
        ("status_group", &raw.status_group),
    ] {
        if let Some(v) = v {
            if v.value.trim().is_empty() {
                errs.at(Pos::of(v), format!("{field} is empty"));
            }
        }
    }
    let insecure_plaintext = raw.insecure_plaintext.as_ref().is_some_and(|i| i.value);
    match (&raw.tls, &raw.insecure_plaintext) {
        (Some(_), Some(i)) if i.value => errs.at(
            Pos::of(i),
            "insecure_plaintext: true contradicts the tls: section; keep one of them",
        ),
        (None, _) if !insecure_plaintext && controllers.iter().any(|c| unix_path(c).is_none()) => {
            errs.at(
                Pos::of(&raw.controllers[0]),
                "controllers are listed but there is no tls: section (ca, cert, key); add one, \
                 or say `insecure_plaintext: true` to send values unauthenticated and readable \
                 (a unix: controller, the worker's socket on this node, needs neither)",
            )
        }
        _ => {}
    }
    errs.finish()?;
    let resolve = |p: &str| {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_owned()
        } else {
            base.join(p)
        }
    };
    Ok(AgentConfig {
        path: path.to_owned(),
        host: raw.host.map(|h| h.value),
        controllers,
        resources: resolve(
            raw.resources
                .as_ref()
                .map_or("resources.yaml", |r| r.value.as_str()),
        ),
        plugin_dir: resolve(
            raw.plugin_dir
                .as_ref()
                .map_or(DEFAULT_PLUGIN_DIR, |p| p.value.as_str()),
        ),
        run_as: raw
            .run_as
            .map_or_else(|| DEFAULT_RUN_AS.to_owned(), |u| u.value),
        max_parallel,
        spread,
        metrics: raw.metrics.map(|m| m.value),
        status_socket: raw.status_socket.map(|p| resolve(&p.value)),
        status_group: raw.status_group.map(|g| g.value),
        tls: raw.tls.map(|t| TlsPaths {
            ca: resolve(&t.value.ca),
            cert: resolve(&t.value.cert),
            key: resolve(&t.value.key),
            crl: t.value.crl.as_deref().map(resolve),
        }),
        insecure_plaintext,
        max_stuck_reads,
        max_interval,
        trust_config_files_of_any_owner: raw
            .trust_config_files_of_any_owner
            .is_some_and(|t| t.value),
        probe_pids_max,
        tls_expiry_warning,
        coalesce,
        release_code_after,
    })
}

/// `spread`: where a host's probes fall in their intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spread {
    /// Every probe at the host's one offset (taken modulo its interval): the probes whose
    /// intervals divide one another's fall due at the same instants and share a wake-up.
    #[default]
    Host,
    /// Each probe at an offset of its own, a slot of the host's run grid chosen by its name.
    Probes,
}

impl Spread {
    pub fn as_str(self) -> &'static str {
        match self {
            Spread::Host => "host",
            Spread::Probes => "probes",
        }
    }
}

/// `spread`: `host` or `probes`; absent or refused, the default.
fn spread(errs: &mut Errors, raw: Option<&Spanned<String>>) -> Spread {
    let Some(s) = raw else {
        return Spread::default();
    };
    match s.value.as_str() {
        "host" => Spread::Host,
        "probes" => Spread::Probes,
        other => {
            errs.at(
                Pos::of(s),
                format!("spread must be `host` (the default) or `probes`, got {other:?}"),
            );
            Spread::default()
        }
    }
}

/// Default of `tls.expiry_warning`.
pub const DEFAULT_TLS_EXPIRY_WARNING: std::time::Duration =
    std::time::Duration::from_secs(30 * 86_400);

/// `tls.expiry_warning`: a duration of at most a year.
fn tls_expiry_warning(errs: &mut Errors, raw: Option<&Spanned<Scalar>>) -> std::time::Duration {
    let read = |s: &Scalar| s.to_duration();
    bounded_duration(errs, raw, "tls.expiry_warning", read, TLS_EXPIRY_WARNING)
        .unwrap_or(DEFAULT_TLS_EXPIRY_WARNING)
}

/// `coalesce`: a duration or milliseconds, up to [`COALESCE`]'s bound.
fn coalesce(errs: &mut Errors, raw: Option<&Spanned<Scalar>>) -> std::time::Duration {
    let read = |s: &Scalar| s.to_duration_or_ms();
    bounded_duration(errs, raw, "coalesce", read, COALESCE).unwrap_or(DEFAULT_COALESCE)
}

/// A duration field read with `read` and checked against `bound`'s largest; `None` when
/// absent or refused (the error is in `errs`).
fn bounded_duration(
    errs: &mut Errors,
    raw: Option<&Spanned<Scalar>>,
    field: &str,
    read: impl Fn(&Scalar) -> Result<std::time::Duration, super::scalar::ScalarError>,
    bound: Between<std::time::Duration>,
) -> Option<std::time::Duration> {
    let w = raw?;
    let checked = read(&w.value)
        .map_err(|e| e.to_string())
        .and_then(|d| check_duration(field, d, bound.max).map_err(|e| e.to_string()));
    checked.map_err(|e| errs.at(Pos::of(w), e)).ok()
}

/// `probe_pids_max`: a count up to the pid ceiling, or 0 for no default limit.
fn probe_pids_max(errs: &mut Errors, raw: Option<&Spanned<Scalar>>) -> Option<u64> {
    let Some(m) = raw else {
        return Some(DEFAULT_PROBE_PIDS_MAX);
    };
    let bound = PROCESSES.max;
    match m.value.to_count() {
        Ok(0) => None,
        Ok(n) if PROCESSES.contains(&n) => Some(n),
        Ok(n) => {
            errs.at(
                Pos::of(m),
                format!("probe_pids_max {n} is larger than the limit of {bound} (0 sets no default limit)"),
            );
            Some(DEFAULT_PROBE_PIDS_MAX)
        }
        Err(e) => {
            errs.at(Pos::of(m), format!("bad probe_pids_max: {e}"));
            Some(DEFAULT_PROBE_PIDS_MAX)
        }
    }
}

/// `max_stuck_reads` and `max_interval`, range-checked (the bounds in the messages).
fn stuck_and_interval(errs: &mut Errors, raw: &RawAgent) -> (usize, std::time::Duration) {
    let stuck = counted(
        errs,
        raw.max_stuck_reads.as_ref(),
        "max_stuck_reads",
        MAX_STUCK_READS,
    )
    .unwrap_or(DEFAULT_MAX_STUCK_READS);
    let interval = match &raw.max_interval {
        None => DEFAULT_MAX_INTERVAL,
        Some(m) => match m
            .value
            .to_duration()
            .map_err(|e| e.to_string())
            .and_then(|d| {
                check_duration("max_interval", d, MAX_INTERVAL.max).map_err(|e| e.to_string())
            }) {
            Ok(d) if d >= MAX_INTERVAL.min => d,
            Ok(_) => {
                errs.at(
                    Pos::of(m),
                    format!(
                        "max_interval must be at least {}",
                        format_duration(MAX_INTERVAL.min)
                    ),
                );
                DEFAULT_MAX_INTERVAL
            }
            Err(e) => {
                errs.at(Pos::of(m), e);
                DEFAULT_MAX_INTERVAL
            }
        },
    };
    (stuck, interval)
}

/// A whole number within `bound`, else the error that names it and `None` (the caller's
/// default then stands).
fn counted(
    errs: &mut Errors,
    raw: Option<&Spanned<i64>>,
    field: &str,
    bound: Between<u64>,
) -> Option<usize> {
    let m = raw?;
    match u64::try_from(m.value) {
        Ok(n) if bound.contains(&n) => usize::try_from(n).ok(),
        _ => {
            errs.at(
                Pos::of(m),
                format!(
                    "{field} must be between {} and {}, got {}",
                    bound.min, bound.max, m.value
                ),
            );
            None
        }
    }
}

/// A `controllers:` entry that is not `host[:port]` or `unix:/ABSOLUTE/PATH` (as written,
/// trimmed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("controller {0:?} is not host[:port] or unix:/absolute/path")]
pub struct BadController(pub String);

/// The worker's door on this node: `unix:/run/xce/worker.sock` (no TLS: the worker
/// authenticates the agent by its uid, SO_PEERCRED).
pub const UNIX_PREFIX: &str = "unix:";

/// The socket path of a `unix:` controller entry.
pub fn unix_path(entry: &str) -> Option<&Path> {
    entry.strip_prefix(UNIX_PREFIX).map(Path::new)
}

/// `host`, `host:port`, `v4`, `v6`, `[v6]`, `[v6]:port` -> `host:port` (`[v6]:port`) with
/// the default port filled in: the one place a controller address gets its port.
pub fn normalize_controller(s: &str) -> Result<String, BadController> {
    let s = s.trim();
    let bad = || BadController(s.to_owned());
    if s.is_empty() {
        return Err(bad());
    }
    if let Some(path) = s.strip_prefix(UNIX_PREFIX) {
        // sun_path holds 107 bytes and a NUL.
        return if path.starts_with('/') && path.len() < 108 && !path.contains('\0') {
            Ok(s.to_owned())
        } else {
            Err(bad())
        };
    }
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(s.to_owned());
    }
    let unbracketed = s.strip_prefix('[').and_then(|v6| v6.strip_suffix(']'));
    let bare_ip = match unbracketed {
        Some(v6) => v6
            .parse::<std::net::Ipv6Addr>()
            .map(std::net::IpAddr::V6)
            .ok(),
        None => s.parse::<std::net::IpAddr>().ok(),
    };
    if let Some(ip) = bare_ip {
        return Ok(std::net::SocketAddr::new(ip, DEFAULT_PORT).to_string());
    }
    match s.rsplit_once(':') {
        Some((host, port)) => {
            let port: u16 = port.parse().map_err(|_| bad())?;
            hostlist::validate_host_name(host).map_err(|_| bad())?;
            Ok(format!("{host}:{port}"))
        }
        None => {
            hostlist::validate_host_name(s).map_err(|_| bad())?;
            Ok(format!("{s}:{DEFAULT_PORT}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{normalize_controller, parse, Spread};
    use super::{parsed_fields, FIELD_DOCS, TLS_FIELD_DOCS};
    use crate::config::names::names_of;

    #[test]
    fn the_field_docs_are_the_structs_serde_reads() {
        let (agent, tls) = parsed_fields();
        assert_eq!(names_of(FIELD_DOCS), agent);
        assert_eq!(names_of(TLS_FIELD_DOCS), tls);
    }

    /// `spread`: `host` unless written, `probes` when asked; any other value is refused at
    /// its line and column, with the two it may be.
    #[test]
    fn spread_is_host_or_probes_and_anything_else_is_refused_where_written() {
        let spread = |text: &str| parse(Path::new("agent.yaml"), text).map(|a| a.spread);
        assert_eq!(spread("").unwrap(), Spread::Host);
        assert_eq!(spread("spread: host\n").unwrap(), Spread::Host);
        assert_eq!(spread("spread: probes\n").unwrap(), Spread::Probes);
        for (text, says) in [
            (
                "max_parallel: 4\nspread: probe\n",
                "agent.yaml:2:9: spread must be `host` (the default) or `probes`, got \"probe\"",
            ),
            ("spread: Host\n", "agent.yaml:1:9: spread must be"),
            ("spread: ''\n", "agent.yaml:1:9: spread must be"),
            ("spread: [host]\n", "agent.yaml:1:"),
        ] {
            let e = spread(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_default_port_is_added_only_where_an_entry_gives_none() {
        let table = [
            ("ctl1", "ctl1:6870"),
            ("ctl1:7000", "ctl1:7000"),
            (" ctl1.example.org ", "ctl1.example.org:6870"),
            ("10.0.0.1", "10.0.0.1:6870"),
            ("10.0.0.1:7000", "10.0.0.1:7000"),
            ("fe80::1", "[fe80::1]:6870"),
            ("[::1]", "[::1]:6870"),
            ("[::1]:7000", "[::1]:7000"),
            ("unix:/run/xce/worker.sock", "unix:/run/xce/worker.sock"),
        ];
        for (entry, dialled) in table {
            assert_eq!(
                normalize_controller(entry).as_deref(),
                Ok(dialled),
                "{entry:?}"
            );
        }
    }

    #[test]
    fn an_entry_that_is_not_host_and_port_is_refused() {
        for entry in [
            "",
            "ctl1:",
            "ctl1:99999",
            "ctl1:x",
            "[ctl1]",
            "[::1]:",
            "[::g]",
            "bad name",
            "unix:relative.sock",
            "unix:",
        ] {
            let err = normalize_controller(entry).expect_err(entry);
            assert!(
                err.to_string().contains("is not host[:port]"),
                "{entry:?}: {err}"
            );
        }
    }
}
