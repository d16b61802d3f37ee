//! The daemon's status socket. Who may connect is decided twice: by the file's mode (0600,
//! or 0660 with `status_group:`), and by the peer's credentials on each connection, so a
//! socket made world-writable by hand still answers only root, the agent's user and the
//! group. Every connection is bounded: one request of at most [`MAX_REQUEST_BYTES`] read
//! within [`READ_TIMEOUT`], one answer written within [`WRITE_TIMEOUT`], at most
//! [`MAX_CONNECTIONS`] at once; a client that does not read costs one task until then and
//! never holds anything the daemon needs. [`RESERVED_FOR_ROOT`] of those slots serve only
//! root and the agent's own user: members of `status_group` holding every other slot are
//! answered "busy" at once, and cannot lock root's own `status` out.

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::unistd::{Gid, Uid};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{snapshot, ErrorReply, Request, Response, Sources, PROTOCOL_VERSION};
use crate::config::AgentConfig;

/// A request is a few names at most; anything longer is refused.
pub const MAX_REQUEST_BYTES: usize = 4 * 1024;
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections answered at once. Root's past this wait in the listen backlog; others get
/// "busy".
pub const MAX_CONNECTIONS: usize = 8;
/// Of those, the slots only root and the agent's own user may take.
pub const RESERVED_FOR_ROOT: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{}: directory does not exist (under systemd the unit's RuntimeDirectory= creates it)", .0.display())]
    NoDirectory(PathBuf),
    #[error("{}: another xce-agent is running and serving this socket", .0.display())]
    InUse(PathBuf),
    #[error("{}: exists and is not a socket; not replacing it", .0.display())]
    NotASocket(PathBuf),
    #[error("status_group {0:?}: no such group")]
    NoSuchGroup(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A bound status socket, removed again when the server stops.
pub struct StatusListener {
    listener: UnixListener,
    path: PathBuf,
    /// (dev, ino) of our socket file: at exit we remove only our own.
    file_id: (u64, u64),
    group: Option<Gid>,
}

impl StatusListener {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Open the socket agent.yaml asks for. When `status_socket:` is not written, the default
/// ([`crate::config::agent::default_status_socket`]) is used, its directory made outside
/// systemd (`/run/xce-agent` as root, `$XDG_RUNTIME_DIR/xce-agent` as another user), and a
/// failure is logged and the daemon runs without it; when it is written, a failure is the
/// caller's error.
pub fn open(agent: &AgentConfig) -> Result<Option<StatusListener>, BindError> {
    let (path, make_dir) = match &agent.status_socket {
        Some(p) => (p.clone(), None),
        None => {
            let d = crate::config::agent::DefaultSocket::here();
            (d.path, d.make_dir)
        }
    };
    let bound =
        make_socket_dir(&path, make_dir).and_then(|()| bind(&path, agent.status_group.as_deref()));
    match bound {
        Ok(l) => Ok(Some(l)),
        Err(e) if agent.status_socket.is_none() => {
            // WARN, also for a missing directory: `xce-agent status` will not reach this
            // daemon, and the admin asking will look here for why.
            tracing::warn!("status socket off: {e}; `xce-agent status` cannot reach this daemon (set status_socket: in agent.yaml to a path in a directory this user may write)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Make the default socket's own directory (not its parents) with `mode` where it is
/// missing; one that exists is used as it is (systemd's, or this daemon's last run's).
fn make_socket_dir(path: &Path, mode: Option<u32>) -> Result<(), BindError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let (Some(mode), Some(dir)) = (mode, path.parent()) else {
        return Ok(());
    };
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(BindError::NoDirectory(dir.to_owned()))
        }
        Err(source) => Err(BindError::Io {
            path: dir.to_owned(),
            source,
        }),
    }
}

/// Bind `path` with mode 0600 (0660 and group `group` when given). A socket file nobody
/// answers on (a crashed daemon's) is replaced; a live one is not.
pub fn bind(path: &Path, group: Option<&str>) -> Result<StatusListener, BindError> {
    let io = |source| BindError::Io {
        path: path.to_owned(),
        source,
    };
    let gid = match group {
        None => None,
        Some(name) => match nix::unistd::Group::from_name(name) {
            Ok(Some(g)) => Some(g.gid),
            _ => return Err(BindError::NoSuchGroup(name.to_owned())),
        },
    };
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    let listener = bind_socket(path, gid, mode)?;
    let meta = std::fs::symlink_metadata(path).map_err(io)?;
    Ok(StatusListener {
        listener,
        path: path.to_owned(),
        file_id: (meta.dev(), meta.ino()),
        group: gid,
    })
}

/// Bind a unix socket at `path` with `mode` (and group `gid`): a socket file nobody answers
/// on is replaced, a live one is not; the socket is made under a temporary name and renamed
/// into place once its mode is set. The status socket and the worker's feed
/// (`listen --unix`, `xce_receiver_config_add_unix`) are bound so.
pub fn bind_socket(path: &Path, gid: Option<Gid>, mode: u32) -> Result<UnixListener, BindError> {
    let io = |source| BindError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        return Err(BindError::NoDirectory(dir.to_owned()));
    }
    remove_if_stale(path)?;
    // Bound under a temporary name and renamed into place once its mode and group are
    // set: the final name never points at a socket others may connect to.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{}.{}",
        name.unwrap_or_else(|| "status.sock".into()),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io)?;
    let set_up = || -> std::io::Result<()> {
        if let Some(gid) = gid {
            nix::unistd::chown(&tmp, None, Some(gid)).map_err(std::io::Error::from)?;
        }
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = set_up() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(listener)
}

fn remove_if_stale(path: &Path) -> Result<(), BindError> {
    let io = |source| BindError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(BindError::NotASocket(path.to_owned()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(BindError::InUse(path.to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "replacing the status socket a stopped agent left behind");
            std::fs::remove_file(path).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}

/// Answer status requests until `shutdown`, then remove the socket file.
pub async fn serve(listener: StatusListener, src: Sources, shutdown: CancellationToken) {
    tracing::info!(path = %listener.path.display(), "status socket listening");
    let slots = Slots::new();
    let group = listener.group;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let privileged = stream
                    .peer_cred()
                    .is_ok_and(|c| privileged(Uid::from_raw(c.uid())));
                let permit = match slots.try_take(privileged) {
                    Some(p) => p,
                    None if privileged => tokio::select! {
                        _ = shutdown.cancelled() => break,
                        p = slots.take_privileged() => p,
                    },
                    None => {
                        refuse_busy(&stream);
                        continue;
                    }
                };
                let src = src.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = answer(stream, &src, group).await {
                        tracing::debug!(error = %e, "status request failed");
                    }
                });
            }
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "status socket: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let ours = std::fs::symlink_metadata(&listener.path)
        .is_ok_and(|m| (m.dev(), m.ino()) == listener.file_id);
    if ours {
        let _ = std::fs::remove_file(&listener.path);
    }
}

async fn answer(mut stream: UnixStream, src: &Sources, group: Option<Gid>) -> std::io::Result<()> {
    let request = match stream.peer_cred() {
        Ok(cred) if allowed(Uid::from_raw(cred.uid()), cred.pid(), group) => {
            match tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await {
                Err(_) => Err(error_reply("no request received in time")),
                Ok(Err(e)) => Err(error_reply(e)),
                Ok(Ok(req)) => Ok(req),
            }
        }
        _ => Err(error_reply(PERMISSION_DENIED)),
    };
    // Building and encoding the answer is tens of milliseconds for 10,000 resources: off
    // the runtime's workers, so probe timers and the link do not wait for it.
    let src = src.clone();
    let body = tokio::task::spawn_blocking(move || {
        let reply = match request {
            Ok(req) => respond(&src, req),
            Err(e) => Response::Error(e),
        };
        let mut body = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
        body.push(b'\n');
        Ok::<_, std::io::Error>(body)
    })
    .await
    .map_err(std::io::Error::other)??;
    let written = tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(&body).await?;
        stream.shutdown().await
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "client did not read the answer",
            ))
        }
    }
    // Closing with unread bytes queued (a refused or oversized request) would make the
    // kernel reset the connection, and the client lose the answer: take what is left, within
    // the same bounds, until the client closes.
    let mut rest = (&mut stream).take(MAX_REQUEST_BYTES as u64 * 4);
    let _ = tokio::time::timeout(
        READ_TIMEOUT,
        tokio::io::copy(&mut rest, &mut tokio::io::sink()),
    )
    .await;
    Ok(())
}

/// The connection slots (see the module's doc).
struct Slots {
    shared: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
}

impl Slots {
    fn new() -> Self {
        Self {
            shared: Arc::new(Semaphore::new(MAX_CONNECTIONS - RESERVED_FOR_ROOT)),
            reserved: Arc::new(Semaphore::new(RESERVED_FOR_ROOT)),
        }
    }

    /// A shared slot for anyone, else (root and the agent's user) a reserved one.
    fn try_take(&self, privileged: bool) -> Option<OwnedSemaphorePermit> {
        self.shared.clone().try_acquire_owned().ok().or_else(|| {
            privileged
                .then(|| self.reserved.clone().try_acquire_owned().ok())
                .flatten()
        })
    }

    /// The first slot of either kind to come free.
    async fn take_privileged(&self) -> OwnedSemaphorePermit {
        // Neither semaphore is ever closed, so neither acquire fails.
        loop {
            let taken = tokio::select! {
                p = self.shared.clone().acquire_owned() => p,
                p = self.reserved.clone().acquire_owned() => p,
            };
            if let Ok(p) = taken {
                return p;
            }
        }
    }
}

/// The text a client over its slots gets, at once and without blocking the accept loop (it
/// fits in the socket's buffer; if it does not, the client sees the connection close).
pub const BUSY: &str = "busy: every status connection open to group members is in use; try again (root always gets through)";

fn refuse_busy(stream: &UnixStream) {
    if let Ok(mut body) = serde_json::to_vec(&Response::Error(error_reply(BUSY))) {
        body.push(b'\n');
        let _ = stream.try_write(&body);
    }
}

/// The text of the refusal; the client recognises it and says what to do.
pub const PERMISSION_DENIED: &str = "permission denied";

fn error_reply(e: impl ToString) -> ErrorReply {
    ErrorReply {
        version: PROTOCOL_VERSION,
        error: e.to_string(),
    }
}

fn respond(src: &Sources, req: Request) -> Response {
    match req.version {
        Some(v) if v != PROTOCOL_VERSION => Response::Error(error_reply(format!(
            "protocol version {v} not supported (this agent speaks {PROTOCOL_VERSION})"
        ))),
        _ => Response::Status(Box::new(snapshot(src, &req.names))),
    }
}

/// Root and the agent's own user always; members of `group` (primary or supplementary,
/// as the connecting process holds them now) when one is configured.
fn allowed(uid: Uid, pid: Option<i32>, group: Option<Gid>) -> bool {
    if privileged(uid) {
        return true;
    }
    let (Some(gid), Some(pid)) = (group, pid) else {
        return false;
    };
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    process_in_group(&status, gid.as_raw())
}

/// Root and the agent's own user.
fn privileged(uid: Uid) -> bool {
    uid.is_root() || uid == Uid::effective()
}

/// Whether a /proc/PID/status text lists `gid` as its real/effective or a supplementary gid.
fn process_in_group(status: &str, gid: u32) -> bool {
    status
        .lines()
        .filter_map(|l| l.strip_prefix("Gid:").or_else(|| l.strip_prefix("Groups:")))
        .flat_map(str::split_whitespace)
        .any(|g| g.parse::<u32>().ok() == Some(gid))
}

#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("request longer than {MAX_REQUEST_BYTES} bytes")]
    TooLong,
    #[error("request is not JSON of protocol version {PROTOCOL_VERSION}: {0}")]
    Json(#[from] serde_json::Error),
    #[error("reading the request: {0}")]
    Io(#[from] std::io::Error),
}

/// One line (or everything up to EOF) of at most MAX_REQUEST_BYTES; empty = the default.
async fn read_request(stream: &mut UnixStream) -> Result<Request, RequestError> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.iter().position(|b| *b == b'\n') {
            buf.truncate(end);
            break;
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return Err(RequestError::TooLong);
        }
        if n == 0 {
            break;
        }
    }
    if buf.len() > MAX_REQUEST_BYTES {
        return Err(RequestError::TooLong);
    }
    if buf.iter().all(u8::is_ascii_whitespace) {
        return Ok(Request::default());
    }
    Ok(serde_json::from_slice(&buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_membership_reads_gid_and_supplementary_lines() {
        let status = "Name:\tsh\nUid:\t65534\t65534\t65534\t65534\n\
                      Gid:\t65534\t65534\t65534\t65534\nGroups:\t27 100 \n";
        assert!(process_in_group(status, 100));
        assert!(process_in_group(status, 65534));
        assert!(!process_in_group(status, 0));
        assert!(!process_in_group("Groups:\n", 100));
    }

    #[tokio::test]
    async fn the_last_slots_are_kept_for_root() {
        let slots = Slots::new();
        let mut held: Vec<_> = (0..MAX_CONNECTIONS - RESERVED_FOR_ROOT)
            .map(|_| slots.try_take(false).expect("a shared slot"))
            .collect();
        assert!(
            slots.try_take(false).is_none(),
            "a member took a reserved slot"
        );
        let root: Vec<_> = (0..RESERVED_FOR_ROOT)
            .map(|_| slots.try_take(true).expect("a reserved slot"))
            .collect();
        assert!(slots.try_take(true).is_none());
        // Root waits for the next slot to come free, of either kind.
        held.pop();
        let _next = slots.take_privileged().await;
        drop(root);
        assert!(
            slots.try_take(false).is_none(),
            "reserved slots went to a member"
        );
    }
}
