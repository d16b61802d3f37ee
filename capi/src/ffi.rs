//! The C ABI: every `extern "C"` function of libxce_receiver, and the only module of the
//! crate with `unsafe` (each block says why it is sound).
//!
//! Rules every function keeps (rustls-ffi's): it returns an `xce_result` (the string
//! functions return a static string); a NULL pointer argument is `XCE_NULL_ARGUMENT`, never a
//! crash; a string that is not UTF-8 is `XCE_INVALID_ARGUMENT`; no panic unwinds into C (it
//! becomes `XCE_PANIC`); what went wrong in words is in `xce_last_error`, per thread. Objects
//! are opaque and owned by the caller between `*_new`/`*_start`/`*_pop` and their `*_free`.
//!
//! # Safety (what every function asks of its caller)
//! A pointer argument is NULL (an error, except where a function allows it) or valid: an
//! object from this library that was not freed, a NUL-terminated string, storage the
//! function may write, or an array of the stated length; it stays valid for the call.

#![allow(non_camel_case_types)]
// The functions are `unsafe extern "C"`: their pointer arguments must be valid as each one's
// comment says (C cannot be made to promise more). Inside them every unsafe operation still
// needs its own block and its own argument.
#![deny(unsafe_op_in_unsafe_fn)]
// One rule for all of them, written once in the module's "# Safety" section (and in the
// header's comment on each argument) rather than repeated on 18 functions.
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use xce_agent::config::agent::TlsPaths;

use crate::core::{Config, Receiver, StartError};
use crate::event::{xce_event, xce_reason, EventBox};
use crate::log::{xce_log_level, LogConfig};

/// What a function did.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xce_result {
    XCE_OK = 0,
    /// `xce_receiver_pop`: no event is queued.
    XCE_EMPTY = 1,
    /// A pointer argument was NULL.
    XCE_NULL_ARGUMENT = 2,
    /// An argument is out of range or not UTF-8, or a name breaks the naming rules.
    XCE_INVALID_ARGUMENT = 3,
    /// The configuration is incomplete or contradictory (no address, no TLS and no
    /// plaintext said in words, or both).
    XCE_CONFIG = 4,
    /// The TLS key material cannot be used (a file missing or unreadable, a key that others
    /// can read, a key that does not match the certificate, a bad CRL).
    XCE_TLS = 5,
    /// A listen address cannot be bound.
    XCE_BIND = 6,
    /// The library's runtime or its event pipe could not be made.
    XCE_RUNTIME = 7,
    /// `xce_receiver_snapshot` / `xce_receiver_local_addr`: no such host / address.
    XCE_NOT_FOUND = 8,
    /// The caller's buffer is too small (nothing was written but a terminating NUL).
    XCE_BUFFER_TOO_SMALL = 9,
    /// `xce_receiver_assign`: the receiver was stopped.
    XCE_STOPPED = 10,
    /// A bug in the library (a panic, caught at the boundary).
    XCE_PANIC = 11,
}

use xce_result::*;

/// Options for `xce_receiver_start`. Opaque.
pub struct xce_receiver_config {
    cfg: Config,
}

/// A running receiver. Opaque.
pub struct xce_receiver {
    inner: Mutex<Receiver>,
}

/// One (resource, instance) pair to assign to a host (`xce_receiver_assign`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xce_instance {
    pub name: *const c_char,
    pub instance: *const c_char,
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_error(text: impl Into<String>) {
    let text = text.into();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

fn fail(code: xce_result, text: impl Into<String>) -> xce_result {
    set_error(text);
    code
}

/// Run `f`, turning a panic into `XCE_PANIC`.
fn guard(what: &str, f: impl FnOnce() -> xce_result) -> xce_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(XCE_PANIC, format!("{what}: internal error: {msg}"))
        }
    }
}

fn lock(rx: &xce_receiver) -> MutexGuard<'_, Receiver> {
    rx.inner.lock().unwrap_or_else(|p| p.into_inner())
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid for `'a`.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, xce_result> {
    if p.is_null() {
        return Err(fail(XCE_NULL_ARGUMENT, format!("{what} is NULL")));
    }
    // SAFETY: not NULL (checked) and NUL-terminated and live for 'a (the caller's promise).
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map_err(|_| fail(XCE_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

macro_rules! arg {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

macro_rules! not_null {
    ($($p:ident),+) => {
        $(if $p.is_null() {
            return fail(XCE_NULL_ARGUMENT, concat!(stringify!($p), " is NULL"));
        })+
    };
}

// ---------------------------------------------------------------------------------------
// Configuration

/// Make a configuration with the defaults (no address, no TLS, queue of 4096 events, agent
/// heartbeat 10 s, no acks). `*out` receives it; free it with `xce_receiver_config_free`.
/// Any thread.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_new(out: *mut *mut xce_receiver_config) -> xce_result {
    guard("xce_receiver_config_new", || {
        not_null!(out);
        let cfg = Box::into_raw(Box::new(xce_receiver_config {
            cfg: Config::default(),
        }));
        // SAFETY: `out` is not NULL and points to writable storage for a pointer (the
        // caller's promise for every out-parameter).
        unsafe { out.write(cfg) };
        XCE_OK
    })
}

/// Free a configuration (a receiver started from it does not need it any more).
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_free(cfg: *mut xce_receiver_config) -> xce_result {
    guard("xce_receiver_config_free", || {
        not_null!(cfg);
        // SAFETY: `cfg` came from xce_receiver_config_new (Box::into_raw) and is freed once.
        drop(unsafe { Box::from_raw(cfg) });
        XCE_OK
    })
}

/// Borrow a configuration for the length of one call.
///
/// # Safety
/// `cfg` is not NULL and came from `xce_receiver_config_new`, not yet freed, and no other
/// thread uses it during the call.
unsafe fn config<'a>(cfg: *mut xce_receiver_config) -> &'a mut Config {
    // SAFETY: the function's contract.
    unsafe { &mut (*cfg).cfg }
}

/// Listen on `addr` (`HOST:PORT`, `[V6]:PORT`; port 0 picks a free one, see
/// `xce_receiver_local_addr`). Call once per address; at least once.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_add_listen(
    cfg: *mut xce_receiver_config,
    addr: *const c_char,
) -> xce_result {
    guard("xce_receiver_config_add_listen", || {
        not_null!(cfg);
        // SAFETY: `addr` is NULL (checked inside) or a C string live for this call.
        let addr = arg!(unsafe { text(addr, "addr") });
        if addr.is_empty() {
            return fail(XCE_INVALID_ARGUMENT, "addr is empty");
        }
        // SAFETY: `cfg` is not NULL and a live configuration (the caller's promise).
        unsafe { config(cfg) }.listen.push(addr.to_owned());
        XCE_OK
    })
}

/// The worker's door: also take agents on the unix socket `path` (made, mode 0666, a stale
/// one replaced; a live one is an error at start), with the same protocol and no TLS. A
/// peer is known by its uid (SO_PEERCRED): only `uid` may feed it (call again with the
/// same path to allow another uid; root is 0); everything it sends is for this host (the
/// library's own host name, canonical), whatever its hello names. For sites that feed xce's
/// worker daemon on the node rather than open a port on the controller
/// (`controllers: ["unix:/run/xce/worker.sock"]` in the agent's agent.yaml). With only unix
/// sockets, no TLS material is needed.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_add_unix(
    cfg: *mut xce_receiver_config,
    path: *const c_char,
    uid: u32,
) -> xce_result {
    guard("xce_receiver_config_add_unix", || {
        not_null!(cfg);
        // SAFETY: NULL (checked inside) or a C string live for this call.
        let path = arg!(unsafe { text(path, "path") });
        if !path.starts_with('/') || path.len() >= 108 {
            return fail(
                XCE_INVALID_ARGUMENT,
                format!("path {path:?} is not an absolute socket path of at most 107 bytes"),
            );
        }
        // SAFETY: `cfg` is not NULL and a live configuration.
        let c = unsafe { config(cfg) };
        match c.unix.iter_mut().find(|u| u.path.as_os_str() == path) {
            Some(u) if !u.uids.contains(&uid) => u.uids.push(uid),
            Some(_) => {}
            None => c.unix.push(crate::core::UnixConfig {
                path: path.into(),
                uids: vec![uid],
            }),
        }
        XCE_OK
    })
}

/// The four paths of TLS material (`crl` may be NULL).
///
/// # Safety
/// Each pointer is NULL or a NUL-terminated string live for the call.
unsafe fn tls_paths(
    ca: *const c_char,
    cert: *const c_char,
    key: *const c_char,
    crl: *const c_char,
) -> Result<TlsPaths, xce_result> {
    // SAFETY (all four): the function's contract; NULL is checked inside `text`.
    let ca = unsafe { text(ca, "ca") }?;
    let cert = unsafe { text(cert, "cert") }?;
    let key = unsafe { text(key, "key") }?;
    let crl = if crl.is_null() {
        None
    } else {
        Some(PathBuf::from(unsafe { text(crl, "crl") }?))
    };
    Ok(TlsPaths {
        ca: ca.into(),
        cert: cert.into(),
        key: key.into(),
        crl,
    })
}

/// TLS 1.3 with required client certificates: `ca` signs the agents' certificates (and
/// this receiver's), `cert`/`key` are the receiver's own (the key readable by its owner
/// only), `crl` is NULL or a CRL of `ca`. The files are read by `xce_receiver_start`.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_tls(
    cfg: *mut xce_receiver_config,
    ca: *const c_char,
    cert: *const c_char,
    key: *const c_char,
    crl: *const c_char,
) -> xce_result {
    guard("xce_receiver_config_set_tls", || {
        not_null!(cfg);
        // SAFETY: the four are NULL (checked inside) or C strings live for this call.
        let paths = arg!(unsafe { tls_paths(ca, cert, key, crl) });
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.tls = Some(paths);
        XCE_OK
    })
}

/// INSECURE: accept agents in plaintext, without certificates. Anyone who can reach the
/// address can report values for any host. For a demo or a test only; never together with
/// `xce_receiver_config_set_tls`.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_insecure_plaintext(
    cfg: *mut xce_receiver_config,
) -> xce_result {
    guard("xce_receiver_config_set_insecure_plaintext", || {
        not_null!(cfg);
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.insecure_plaintext = true;
        XCE_OK
    })
}

/// At most `capacity` (>= 1) events wait for `xce_receiver_pop`; while that many wait, the
/// library stops reading agents' sockets (TCP pushes back on them). Default 4096.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_queue_capacity(
    cfg: *mut xce_receiver_config,
    capacity: usize,
) -> xce_result {
    guard("xce_receiver_config_set_queue_capacity", || {
        not_null!(cfg);
        if capacity == 0 {
            return fail(XCE_INVALID_ARGUMENT, "capacity is 0");
        }
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.queue_capacity = capacity;
        XCE_OK
    })
}

/// The receiver's memory budget in bytes (`total`, default 2 GiB: 100,000 hosts at rest)
/// and one host's share of it (`per_host`, default 8 MiB; at most `total`). Every
/// connection, frame being read, queued event and host's state is charged to it; a host
/// over its share is cut off (GONE, XCE_REASON_OVER_BUDGET) and nobody else notices.
/// Connections without an accepted hello together hold at most 1/8 of `total`. When the
/// whole budget is spent, a host above its fair part (total / hosts) is refused and the
/// largest is cut off, so the process stays within about `total` whatever its peers send.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_memory_budget(
    cfg: *mut xce_receiver_config,
    total: usize,
    per_host: usize,
) -> xce_result {
    guard("xce_receiver_config_set_memory_budget", || {
        not_null!(cfg);
        if total < MIN_MEMORY_BUDGET || per_host == 0 || per_host > total {
            return fail(
                XCE_INVALID_ARGUMENT,
                format!(
                    "memory budget {total} with a share of {per_host}: the total must be at \
                     least {MIN_MEMORY_BUDGET} bytes and the share within 1..=total"
                ),
            );
        }
        // SAFETY: `cfg` is not NULL and a live configuration.
        let c = unsafe { config(cfg) };
        c.memory_budget = total;
        c.host_share = per_host;
        XCE_OK
    })
}

/// The smallest budget that holds one host's largest hello and its snapshot.
const MIN_MEMORY_BUDGET: usize = 16 << 20;

/// The agents' heartbeat interval in ms (1 ms .. 1 day; the agent's is 10000, the default).
/// A host is stale after `2 * heartbeat_ms + 1000` ms without a batch or heartbeat.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_agent_heartbeat_ms(
    cfg: *mut xce_receiver_config,
    heartbeat_ms: u64,
) -> xce_result {
    guard("xce_receiver_config_set_agent_heartbeat_ms", || {
        not_null!(cfg);
        if heartbeat_ms == 0 || heartbeat_ms > 86_400_000 {
            return fail(
                XCE_INVALID_ARGUMENT,
                format!("heartbeat_ms {heartbeat_ms} is not within 1..=86400000"),
            );
        }
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.heartbeat = Duration::from_millis(heartbeat_ms);
        XCE_OK
    })
}

/// Add one of the cluster's DNS domains ("cluster.example"): a hello's short name
/// `node001` is then named by a certificate SAN `node001.cluster.example`. Without any, a
/// SAN must equal the hello's host (ASCII case ignored); nothing else names a host.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_add_domain(
    cfg: *mut xce_receiver_config,
    domain: *const c_char,
) -> xce_result {
    guard("xce_receiver_config_add_domain", || {
        not_null!(cfg);
        // SAFETY: `domain` is NULL (checked inside) or a C string live for this call.
        let domain = arg!(unsafe { text(domain, "domain") });
        let d = domain.trim_end_matches('.');
        if d.is_empty() || xce_agent::config::hostlist::validate_host_name(d).is_err() {
            return fail(
                XCE_INVALID_ARGUMENT,
                format!("{domain:?} is not a DNS domain"),
            );
        }
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.domains.push(d.to_owned());
        XCE_OK
    })
}

/// Send `ack(seq)` to the agent after each batch (default: no).
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_ack(
    cfg: *mut xce_receiver_config,
    ack: bool,
) -> xce_result {
    guard("xce_receiver_config_set_ack", || {
        not_null!(cfg);
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.ack = ack;
        XCE_OK
    })
}

/// A log callback (`xce_receiver_config_set_log`): `userdata` as given there, the line's
/// `level`, and the line itself: `message` is one NUL-terminated UTF-8 line of `len` bytes
/// (NUL not counted, at most 1024), the message then its fields as `key=value`, control
/// characters written out (`\n`, `\u{1b}`), e.g.
/// `dropping agent connection: over its memory budget peer=10.0.0.7:41000 host="node001"
/// used=8388608 total=2147483648 share=8388608 error=...`. It is the library's, valid only
/// during the call: copy what you keep.
pub type xce_log_callback = Option<
    unsafe extern "C" fn(
        userdata: *mut c_void,
        level: xce_log_level,
        message: *const c_char,
        len: usize,
    ),
>;

/// The C callback and its userdata, called from the library's threads.
struct CallbackLog {
    callback: unsafe extern "C" fn(*mut c_void, xce_log_level, *const c_char, usize),
    userdata: *mut c_void,
}

// SAFETY: the library only passes `userdata` back to the callback; the header tells the
// caller that the callback runs on the library's threads (one call at a time per receiver),
// so whatever `userdata` points to is the caller's to make safe to use from there.
unsafe impl Send for CallbackLog {}
// SAFETY: as for Send: the pointer is never dereferenced by the library.
unsafe impl Sync for CallbackLog {}

impl CallbackLog {
    fn call(&self, level: xce_log_level, line: &CStr) {
        // SAFETY: the callback is the caller's function of this signature, and `userdata`
        // what the caller gave with it, valid until the receiver is stopped (the header's
        // rules); `line` is a NUL-terminated string live for the call, `len` its length.
        unsafe { (self.callback)(self.userdata, level, line.as_ptr(), line.to_bytes().len()) }
    }
}

/// Send the receiver's log to `callback` (NULL: no log, the default): why a connection was
/// dropped or refused, a host cut off over its memory share, pending connections evicted,
/// TLS failures and revocations, a low open-file limit. Lines at `min_level` (an
/// xce_log_level) or more severe are passed; XCE_LOG_WARN suits an operator's log,
/// XCE_LOG_INFO adds every connect and disconnect. Each receiver started from this
/// configuration logs through it, each with a log of its own.
///
/// Threads: the callback is called from the library's own threads (named xce-receiver), and
/// during xce_receiver_start and xce_receiver_reload_tls from the calling thread; one call
/// at a time per receiver (receivers sharing a callback may call it at once). It must return
/// quickly (the receiver's connections wait on it), must not call any xce_* function (it may
/// run while the library holds its locks), and must not unwind or longjmp out. `userdata`
/// must stay valid until xce_receiver_stop or xce_receiver_free of every such receiver has
/// returned: after that no call comes.
///
/// Bounds, whatever the agents or a hostile peer send: a line is at most 1024 bytes (longer
/// ones are cut and end in "..."); a receiver passes at most 100 lines at once and 10 a
/// second on average after that (a token bucket). Lines over that are dropped and counted,
/// and the next line that passes ends in ` suppressed=N` (the lines dropped before it).
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_config_set_log(
    cfg: *mut xce_receiver_config,
    callback: xce_log_callback,
    userdata: *mut c_void,
    min_level: c_int,
) -> xce_result {
    guard("xce_receiver_config_set_log", || {
        not_null!(cfg);
        let Some(min_level) = xce_log_level::from_code(min_level) else {
            return fail(
                XCE_INVALID_ARGUMENT,
                format!("min_level {min_level} is not an xce_log_level (1..=5)"),
            );
        };
        let log = callback.map(|callback| {
            let c = CallbackLog { callback, userdata };
            LogConfig {
                sink: std::sync::Arc::new(move |level, line: &CStr| c.call(level, line)),
                min_level,
            }
        });
        // SAFETY: `cfg` is not NULL and a live configuration.
        unsafe { config(cfg) }.log = log;
        XCE_OK
    })
}

// ---------------------------------------------------------------------------------------
// The receiver

/// Read the key material, bind every address and start receiving on the library's own
/// threads. Raises the process's open-file soft limit to its hard limit (a descriptor per
/// agent). `*out` receives the receiver; free it with `xce_receiver_free`. On error
/// nothing was started and `xce_last_error` says why. Any thread.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_start(
    cfg: *const xce_receiver_config,
    out: *mut *mut xce_receiver,
) -> xce_result {
    guard("xce_receiver_start", || {
        not_null!(cfg, out);
        // SAFETY: `cfg` is not NULL and a live configuration; only read here.
        let cfg = unsafe { &(*cfg).cfg };
        match Receiver::start(cfg) {
            Ok(r) => {
                let rx = Box::into_raw(Box::new(xce_receiver {
                    inner: Mutex::new(r),
                }));
                // SAFETY: `out` is not NULL and writable (out-parameter contract).
                unsafe { out.write(rx) };
                XCE_OK
            }
            Err(e) => {
                let code = match &e {
                    StartError::Config(_) => XCE_CONFIG,
                    StartError::Tls(_) => XCE_TLS,
                    StartError::Bind(_) => XCE_BIND,
                    StartError::Runtime(_) => XCE_RUNTIME,
                };
                fail(code, e.text())
            }
        }
    })
}

/// Borrow a receiver for one call.
///
/// # Safety
/// `rx` is not NULL and came from `xce_receiver_start`, not yet freed.
unsafe fn receiver<'a>(rx: *const xce_receiver) -> &'a xce_receiver {
    // SAFETY: the function's contract.
    unsafe { &*rx }
}

/// `*fd` receives a descriptor that is readable (POLLIN) exactly while events are queued:
/// poll it, then call `xce_receiver_pop` until XCE_EMPTY. Owned by the receiver: do not
/// read, write or close it.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_fd(rx: *const xce_receiver, fd: *mut c_int) -> xce_result {
    guard("xce_receiver_fd", || {
        not_null!(rx, fd);
        // SAFETY: `rx` is not NULL and a live receiver.
        let raw = lock(unsafe { receiver(rx) }).fd();
        // SAFETY: `fd` is not NULL and writable.
        unsafe { fd.write(raw) };
        XCE_OK
    })
}

/// The address listen address number `index` (in the order added) is bound to, as
/// "ADDR:PORT" into `buf` of `len` bytes (NUL-terminated; 64 bytes always suffice).
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_local_addr(
    rx: *const xce_receiver,
    index: usize,
    buf: *mut c_char,
    len: usize,
) -> xce_result {
    guard("xce_receiver_local_addr", || {
        not_null!(rx, buf);
        if len == 0 {
            return fail(XCE_BUFFER_TOO_SMALL, "len is 0");
        }
        // SAFETY: `rx` is not NULL and a live receiver.
        let addr = match lock(unsafe { receiver(rx) }).local_addrs().get(index) {
            Some(a) => a.to_string(),
            None => return fail(XCE_NOT_FOUND, format!("no listen address number {index}")),
        };
        let bytes = addr.as_bytes();
        // SAFETY: `buf` is not NULL and points to `len` (> 0) writable bytes; at most `len`
        // are written (the text and its NUL, or a lone NUL).
        unsafe {
            if bytes.len() + 1 > len {
                buf.write(0);
                return fail(
                    XCE_BUFFER_TOO_SMALL,
                    format!("{} bytes needed", bytes.len() + 1),
                );
            }
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
            buf.add(bytes.len()).write(0);
        }
        XCE_OK
    })
}

/// Swap the receiver's TLS material (as `xce_receiver_config_set_tls` names it: `ca`,
/// `cert`, `key`, `crl` or NULL) without dropping live sessions: connections from now on are
/// checked against it. A live session whose certificate the new CRL revokes is ended (GONE,
/// XCE_REASON_REVOKED). XCE_TLS (nothing changed) when a file is missing, unreadable, not
/// PEM, a key others can read, or a CRL the CA did not sign; XCE_CONFIG for a receiver
/// started in plaintext; `*revoked` (may be NULL) gets the number of sessions ended. Any
/// thread; it reads the four files (blocking I/O, as `xce_receiver_start` does), so call it
/// outside a latency-sensitive loop: for a rotated certificate or a new CRL (e.g. on SIGHUP).
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_reload_tls(
    rx: *const xce_receiver,
    ca: *const c_char,
    cert: *const c_char,
    key: *const c_char,
    crl: *const c_char,
    revoked: *mut usize,
) -> xce_result {
    guard("xce_receiver_reload_tls", || {
        not_null!(rx);
        // SAFETY: the four are NULL (checked inside) or C strings live for this call.
        let paths = arg!(unsafe { tls_paths(ca, cert, key, crl) });
        // SAFETY: `rx` is not NULL and a live receiver.
        let rx = lock(unsafe { receiver(rx) });
        if rx.is_stopped() {
            return fail(XCE_STOPPED, "the receiver was stopped");
        }
        match rx.reload_tls(&paths) {
            Ok(n) => {
                if !revoked.is_null() {
                    // SAFETY: `revoked` is not NULL and points to a writable usize.
                    unsafe { revoked.write(n) };
                }
                XCE_OK
            }
            Err(StartError::Tls(e)) => fail(XCE_TLS, e),
            Err(e) => fail(XCE_CONFIG, e.text().to_owned()),
        }
    })
}

/// What the receiver holds and has done, for the controller's own monitoring.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xce_stats {
    /// Events waiting for `xce_receiver_pop`, and the bytes they hold.
    pub queued_events: usize,
    pub queued_bytes: usize,
    /// Values replaced while waiting by a newer value of the same (host, resource): the
    /// controller got the newer one instead of both (resvals are gauges).
    pub replaced: u64,
    /// Bytes charged to the memory budget now, and the budget.
    pub budget_used: usize,
    pub budget_total: usize,
    /// Hosts the receiver knows (accepted at least once).
    pub hosts: usize,
}

/// Fill `*out` with the receiver's figures now. Any thread.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_stats(
    rx: *const xce_receiver,
    out: *mut xce_stats,
) -> xce_result {
    guard("xce_receiver_stats", || {
        not_null!(rx, out);
        // SAFETY: `rx` is not NULL and a live receiver.
        let s = lock(unsafe { receiver(rx) }).stats();
        let stats = xce_stats {
            queued_events: s.queued_events,
            queued_bytes: s.queued_bytes,
            replaced: s.replaced,
            budget_used: s.budget_used,
            budget_total: s.budget_total,
            hosts: s.hosts,
        };
        // SAFETY: `out` is not NULL and points to a writable xce_stats.
        unsafe { out.write(stats) };
        XCE_OK
    })
}

/// Take the next event without waiting: XCE_OK and `*ev` set (free it with
/// `xce_event_free`), or XCE_EMPTY and `*ev` NULL. Popping makes room: a full queue had
/// stopped the library reading sockets. Any thread; events come out in order.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_pop(
    rx: *const xce_receiver,
    ev: *mut *mut xce_event,
) -> xce_result {
    guard("xce_receiver_pop", || {
        not_null!(rx, ev);
        // SAFETY: `rx` is not NULL and a live receiver.
        let next = lock(unsafe { receiver(rx) }).pop();
        let out = match next {
            Some(e) => Box::into_raw(EventBox::new(&e)).cast::<xce_event>(),
            None => std::ptr::null_mut(),
        };
        // SAFETY: `ev` is not NULL and writable.
        unsafe { ev.write(out) };
        if out.is_null() {
            XCE_EMPTY
        } else {
            XCE_OK
        }
    })
}

/// Free one event (from `xce_receiver_pop`) and every string it points to.
#[no_mangle]
pub unsafe extern "C" fn xce_event_free(ev: *mut xce_event) -> xce_result {
    guard("xce_event_free", || {
        not_null!(ev);
        // SAFETY: `ev` came from xce_receiver_pop, which boxed an EventBox whose first field
        // (repr(C)) is the xce_event: the pointer is the box's. Freed once (the caller's
        // promise).
        drop(unsafe { Box::from_raw(ev.cast::<EventBox>()) });
        XCE_OK
    })
}

/// Assign shared instances to `host` (what `welcome` carries: the complete list,
/// replacing the previous one; `n` = 0 withdraws them all). A connected host is told now,
/// one that connects later after its hello. `instances` may be NULL when `n` is 0.
/// Failover: assign a dead host's instances to another host.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_assign(
    rx: *const xce_receiver,
    host: *const c_char,
    instances: *const xce_instance,
    n: usize,
) -> xce_result {
    guard("xce_receiver_assign", || {
        not_null!(rx);
        // SAFETY: NULL (checked inside) or a C string live for this call.
        let host = arg!(unsafe { text(host, "host") });
        if n > 0 && instances.is_null() {
            return fail(XCE_NULL_ARGUMENT, "instances is NULL");
        }
        if n > xce_agent::link::frame_limits::MAX_ASSIGNED as usize {
            return fail(XCE_INVALID_ARGUMENT, format!("{n} instances is too many"));
        }
        let list: &[xce_instance] = if n == 0 {
            &[]
        } else {
            // SAFETY: `instances` is not NULL and points to `n` xce_instance (the caller's
            // promise), bounded above so the length fits.
            unsafe { std::slice::from_raw_parts(instances, n) }
        };
        let mut pairs = Vec::with_capacity(n);
        for (i, inst) in list.iter().enumerate() {
            // SAFETY: each is NULL (checked inside) or a C string live for this call.
            let name = arg!(unsafe { text(inst.name, &format!("instances[{i}].name")) });
            let instance =
                arg!(unsafe { text(inst.instance, &format!("instances[{i}].instance")) });
            pairs.push((name.to_owned(), instance.to_owned()));
        }
        // SAFETY: `rx` is not NULL and a live receiver.
        let rx = lock(unsafe { receiver(rx) });
        if rx.is_stopped() {
            return fail(XCE_STOPPED, "the receiver was stopped");
        }
        match rx.assign(host, pairs) {
            Ok(()) => XCE_OK,
            Err(e) => fail(XCE_INVALID_ARGUMENT, e),
        }
    })
}

/// The current state of `host` (or of every host when `host` is NULL) as an array of
/// events: per host one ACCEPTED (connected), STALE or GONE (not connected, not yet stale)
/// event, then a RESVAL per value (unknown while stale). `*events` and `*n` receive it
/// (NULL and 0 when there is nothing); free it with `xce_events_free`. XCE_NOT_FOUND: the
/// library never accepted that host. Reflects events that may still be queued.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_snapshot(
    rx: *const xce_receiver,
    host: *const c_char,
    events: *mut *mut *mut xce_event,
    n: *mut usize,
) -> xce_result {
    guard("xce_receiver_snapshot", || {
        not_null!(rx, events, n);
        let host = if host.is_null() {
            None
        } else {
            // SAFETY: not NULL, a C string live for this call.
            Some(arg!(unsafe { text(host, "host") }))
        };
        // SAFETY: `rx` is not NULL and a live receiver.
        let snap = lock(unsafe { receiver(rx) }).snapshot(host);
        let Some(snap) = snap else {
            return fail(XCE_NOT_FOUND, format!("no host {:?}", host.unwrap_or("")));
        };
        let count = snap.len();
        let array: *mut *mut xce_event = if snap.is_empty() {
            std::ptr::null_mut()
        } else {
            let boxed: Box<[*mut xce_event]> = snap
                .iter()
                .map(|e| Box::into_raw(EventBox::new(e)).cast::<xce_event>())
                .collect();
            Box::into_raw(boxed).cast::<*mut xce_event>()
        };
        // SAFETY: `events` and `n` are not NULL and writable.
        unsafe {
            events.write(array);
            n.write(count);
        }
        XCE_OK
    })
}

/// Free an array from `xce_receiver_snapshot` (`n` as it returned) and its events.
#[no_mangle]
pub unsafe extern "C" fn xce_events_free(events: *mut *mut xce_event, n: usize) -> xce_result {
    guard("xce_events_free", || {
        not_null!(events);
        // SAFETY: `events` and `n` are what xce_receiver_snapshot returned: a boxed slice of
        // `n` pointers, each an EventBox from Box::into_raw; all freed once.
        let all = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(events, n)) };
        for ev in all.iter() {
            // SAFETY: as above, one box per element.
            drop(unsafe { Box::from_raw(ev.cast::<EventBox>()) });
        }
        XCE_OK
    })
}

/// Stop: close every agent connection (TLS close_notify), stop the library's threads.
/// Waits at most a few seconds. Events already queued can still be popped; no new ones
/// come, and no log callback once it returns. Calling it again does nothing. Never from the
/// log callback (it runs on the threads this stops).
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_stop(rx: *const xce_receiver) -> xce_result {
    guard("xce_receiver_stop", || {
        not_null!(rx);
        // SAFETY: `rx` is not NULL and a live receiver.
        lock(unsafe { receiver(rx) }).stop();
        XCE_OK
    })
}

/// Stop (if not yet stopped) and free the receiver and every event still queued. The last
/// call on it: no other thread may be using it.
#[no_mangle]
pub unsafe extern "C" fn xce_receiver_free(rx: *mut xce_receiver) -> xce_result {
    guard("xce_receiver_free", || {
        not_null!(rx);
        // SAFETY: `rx` came from xce_receiver_start (Box::into_raw), freed once, and no other
        // thread uses it (the caller's promise).
        drop(unsafe { Box::from_raw(rx) });
        XCE_OK
    })
}

// ---------------------------------------------------------------------------------------
// Words

/// The thread's last error in words (from the last call on this thread that did not return
/// XCE_OK or XCE_EMPTY) into `buf` of `len` bytes, NUL-terminated and cut to fit. `*needed`
/// (may be NULL) receives the bytes the whole text needs, NUL included.
#[no_mangle]
pub unsafe extern "C" fn xce_last_error(
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> xce_result {
    // Not through `guard`/`fail`: reading the error must not replace it.
    let r = catch_unwind(AssertUnwindSafe(|| {
        if buf.is_null() {
            return XCE_NULL_ARGUMENT;
        }
        if len == 0 {
            return XCE_BUFFER_TOO_SMALL;
        }
        LAST_ERROR.with(|e| {
            let e = e.borrow();
            let bytes = e.as_bytes();
            let n = bytes.len().min(len - 1);
            // SAFETY: `buf` is not NULL and holds `len` (> 0) writable bytes; n + 1 <= len
            // are written. `needed` is NULL (skipped) or writable.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, n);
                buf.add(n).write(0);
                if !needed.is_null() {
                    needed.write(bytes.len() + 1);
                }
            }
            if n < bytes.len() {
                XCE_BUFFER_TOO_SMALL
            } else {
                XCE_OK
            }
        })
    }));
    r.unwrap_or(XCE_PANIC)
}

/// A result code's name ("XCE_OK", ...); "unknown result" for a code not in `xce_result`.
/// Static: never freed. Any thread.
#[no_mangle]
pub extern "C" fn xce_result_str(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        0 => c"XCE_OK",
        1 => c"XCE_EMPTY",
        2 => c"XCE_NULL_ARGUMENT",
        3 => c"XCE_INVALID_ARGUMENT",
        4 => c"XCE_CONFIG",
        5 => c"XCE_TLS",
        6 => c"XCE_BIND",
        7 => c"XCE_RUNTIME",
        8 => c"XCE_NOT_FOUND",
        9 => c"XCE_BUFFER_TOO_SMALL",
        10 => c"XCE_STOPPED",
        11 => c"XCE_PANIC",
        _ => c"unknown result",
    };
    s.as_ptr()
}

/// A reason's label, the one `xce-agent listen` prints ("not_tls", "identity", ...;
/// "closed" for XCE_REASON_CLOSED, "unknown" for a code not in `xce_reason`). Static.
#[no_mangle]
pub extern "C" fn xce_reason_str(code: c_int) -> *const c_char {
    let label = u32::try_from(code).map_or("unknown", xce_reason::label);
    // The labels are a fixed set: find its static C string.
    let s: &'static CStr = match label {
        "closed" => c"closed",
        "not_tls" => c"not_tls",
        "unknown_ca" => c"unknown_ca",
        "expired" => c"expired",
        "revoked" => c"revoked",
        "no_certificate" => c"no_certificate",
        "handshake" => c"handshake",
        "identity" => c"identity",
        "protocol" => c"protocol",
        "limit" => c"limit",
        "io" => c"io",
        "displaced" => c"displaced",
        "stopped" => c"stopped",
        "timeout" => c"timeout",
        "over_budget" => c"over_budget",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_label_has_its_static_string() {
        for code in 0..xce_agent::receiver::session::Reason::ALL.len() as c_int {
            // SAFETY: xce_reason_str returns a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(xce_reason_str(code)) };
            assert_eq!(
                s.to_str().unwrap(),
                xce_reason::label(code as u32),
                "code {code}"
            );
            assert_ne!(s.to_str().unwrap(), "unknown", "code {code}");
        }
    }
}
