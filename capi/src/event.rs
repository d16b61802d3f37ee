//! Controller events as the C side sees them: `xce_event`, a plain struct whose pointers
//! point into storage that the event owns (its strings, its SAN and resource arrays). The
//! struct is the first field of a private box, so `xce_event_free` gets the whole back.
//! Building one needs no `unsafe`: taking a pointer is safe, reading through it is C's.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, CString};
use xce_agent::receiver::identity::Peer;

use xce_agent::receiver::session::Reason;
use xce_agent::value::{Status, Valtype, Value};

use crate::core::Ev;

/// What an event reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xce_event_kind {
    /// A host passed the identity check and sent its hello: `host`, `peer`, `subject`,
    /// `sans`, `agent_version`, `boot_id`, `config_digest`, `resources`. Sent again when the
    /// agent reloads (a new declared set) and when a stale host reports again.
    XCE_EVENT_ACCEPTED = 1,
    /// One value: `host`, `name`, `instance`, `value`, `status`, `last_report_ms`, `error`.
    XCE_EVENT_RESVAL = 2,
    /// Nothing from `host` for longer than `grace_ms`: every value of it is unknown until it
    /// reports again (then ACCEPTED and all its values come again).
    XCE_EVENT_STALE = 3,
    /// The host's connection ended: `host`, `peer`, `reason`, `reason_text`. Its values stay
    /// until it reconnects or goes stale by the same grace.
    XCE_EVENT_GONE = 4,
    /// A connection refused before an accepted hello: `peer`, `reason`, `reason_text`
    /// (`host` is "").
    XCE_EVENT_REFUSED = 5,
}

/// Why a connection ended or was refused.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xce_reason {
    /// The agent's end of the stream, with or without TLS close_notify (a power cut, kill -9
    /// or a cable look alike: `reason_text` says which was seen).
    XCE_REASON_CLOSED = 0,
    /// The peer does not speak TLS (a plaintext client).
    XCE_REASON_NOT_TLS = 1,
    /// The client certificate is not from the configured CA.
    XCE_REASON_UNKNOWN_CA = 2,
    /// The client certificate expired or is not valid yet.
    XCE_REASON_EXPIRED = 3,
    /// The client certificate is revoked (CRL).
    XCE_REASON_REVOKED = 4,
    /// No client certificate.
    XCE_REASON_NO_CERTIFICATE = 5,
    /// Another TLS handshake failure (stalled, cut short, the peer's alert).
    XCE_REASON_HANDSHAKE = 6,
    /// The hello names a host that the certificate does not name.
    XCE_REASON_IDENTITY = 7,
    /// A protocol violation (order, malformed frame, version, names).
    XCE_REASON_PROTOCOL = 8,
    /// A frame or list over the limits.
    XCE_REASON_LIMIT = 9,
    /// The connection failed (reset, write timeout).
    XCE_REASON_IO = 10,
    /// A newer session for the same host, or with the same certificate, took its place
    /// (never reported as GONE: the host is still there).
    XCE_REASON_DISPLACED = 11,
    /// The receiver is stopping.
    XCE_REASON_STOPPED = 12,
    /// Nothing from the agent for three heartbeats (a half-open connection).
    XCE_REASON_TIMEOUT = 13,
    /// The host held more than its share of the receiver's memory budget
    /// (xce_receiver_config_set_memory_budget): cut off, the process unharmed.
    XCE_REASON_OVER_BUDGET = 14,
}

impl xce_reason {
    pub fn of(r: Reason) -> Self {
        use xce_reason::*;
        match r {
            Reason::Closed => XCE_REASON_CLOSED,
            Reason::NotTls => XCE_REASON_NOT_TLS,
            Reason::UnknownCa => XCE_REASON_UNKNOWN_CA,
            Reason::Expired => XCE_REASON_EXPIRED,
            Reason::Revoked => XCE_REASON_REVOKED,
            Reason::NoCertificate => XCE_REASON_NO_CERTIFICATE,
            Reason::Handshake => XCE_REASON_HANDSHAKE,
            Reason::Identity => XCE_REASON_IDENTITY,
            Reason::Protocol => XCE_REASON_PROTOCOL,
            Reason::Limit => XCE_REASON_LIMIT,
            Reason::Io => XCE_REASON_IO,
            Reason::Displaced => XCE_REASON_DISPLACED,
            Reason::Stopped => XCE_REASON_STOPPED,
            Reason::Timeout => XCE_REASON_TIMEOUT,
            Reason::OverBudget => XCE_REASON_OVER_BUDGET,
        }
    }

    /// The label `listen` uses for the same reason.
    pub fn label(code: u32) -> &'static str {
        Reason::ALL
            .into_iter()
            .find(|r| xce_reason::of(*r) as u32 == code)
            .map_or("unknown", Reason::as_str)
    }
}

/// Which member of `xce_value` holds the value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xce_value_type {
    /// No value the agent vouches for (LSF's "-").
    XCE_VALUE_UNKNOWN = 0,
    XCE_VALUE_NUMERIC = 1,
    XCE_VALUE_STRING = 2,
    XCE_VALUE_BOOLEAN = 3,
}

/// A resource's declared type.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xce_valtype {
    XCE_VALTYPE_NUMERIC = 1,
    XCE_VALTYPE_STRING = 2,
    XCE_VALTYPE_BOOLEAN = 3,
}

/// How much the agent trusts a value (docs/protocol.md).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xce_status {
    XCE_STATUS_OK = 0,
    XCE_STATUS_FAILED = 1,
    /// The agent's own staleness, or (set by the library) the host is stale.
    XCE_STATUS_STALE = 2,
    XCE_STATUS_PENDING = 3,
}

/// A typed value: `kind` says which member holds it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xce_value {
    pub kind: xce_value_type,
    pub numeric: f64,
    /// Never NULL ("" unless `kind` is XCE_VALUE_STRING).
    pub string: *const c_char,
    pub boolean: bool,
}

/// One resource instance a host declared in its hello.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xce_declared {
    pub name: *const c_char,
    /// "" for the host's own instance; else the shared instance's location.
    pub instance: *const c_char,
    pub valtype: xce_valtype,
    pub interval_ms: u64,
    pub shared: bool,
}

/// One event. Every `const char *` is a NUL-terminated UTF-8 string, never NULL ("" where a
/// field does not apply to the kind); the event owns them all, and everything it points to
/// lives until `xce_event_free`. Read-only for the caller.
#[repr(C)]
#[derive(Debug)]
pub struct xce_event {
    pub kind: xce_event_kind,
    pub host: *const c_char,
    /// "ADDR:PORT" of the agent's connection ("" where not known).
    pub peer: *const c_char,
    /// ACCEPTED: the client certificate's subject ("" on a plaintext connection).
    pub subject: *const c_char,
    /// ACCEPTED: the certificate's SANs (DNS names, then IP addresses).
    pub sans: *const *const c_char,
    pub n_sans: usize,
    pub agent_version: *const c_char,
    pub boot_id: *const c_char,
    pub config_digest: *const c_char,
    /// ACCEPTED: what the hello declared.
    pub resources: *const xce_declared,
    pub n_resources: usize,
    /// RESVAL: resource name and instance ("" for the host's own).
    pub name: *const c_char,
    pub instance: *const c_char,
    pub value: xce_value,
    pub status: xce_status,
    /// RESVAL: unix ms of the last good reading; 0 = never.
    pub last_report_ms: u64,
    /// RESVAL: why the status is not ok ("" when ok).
    pub error: *const c_char,
    /// STALE: the grace that passed without a message.
    pub grace_ms: u64,
    /// GONE, REFUSED: why, as a class and as text.
    pub reason: xce_reason,
    pub reason_text: *const c_char,
}

/// The event and the storage its pointers point into. `public` first: a pointer to the box
/// is a pointer to the event.
#[repr(C)]
pub struct EventBox {
    pub public: xce_event,
    strings: Vec<CString>,
    sans: Vec<*const c_char>,
    resources: Vec<xce_declared>,
}

/// A C string of `s`; a NUL inside (which no name may hold, but free text might) becomes
/// U+FFFD rather than cutting the string short.
fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "\u{fffd}")).unwrap_or_default()
}

/// Strings owned by one event: each pointer stays valid as long as the Vec's elements live
/// (a CString's buffer does not move when the Vec grows).
#[derive(Default)]
struct Strings(Vec<CString>);

impl Strings {
    fn add(&mut self, s: &str) -> *const c_char {
        let c = cstring(s);
        let p = c.as_ptr();
        self.0.push(c);
        p
    }
}

fn peer_text(p: Option<Peer>) -> String {
    p.map(|p| p.to_string()).unwrap_or_default()
}

impl EventBox {
    pub fn new(ev: &Ev) -> Box<EventBox> {
        let mut st = Strings::default();
        let empty = st.add("");
        let mut e = xce_event {
            kind: xce_event_kind::XCE_EVENT_RESVAL,
            host: empty,
            peer: empty,
            subject: empty,
            sans: std::ptr::null(),
            n_sans: 0,
            agent_version: empty,
            boot_id: empty,
            config_digest: empty,
            resources: std::ptr::null(),
            n_resources: 0,
            name: empty,
            instance: empty,
            value: xce_value {
                kind: xce_value_type::XCE_VALUE_UNKNOWN,
                numeric: 0.0,
                string: empty,
                boolean: false,
            },
            status: xce_status::XCE_STATUS_OK,
            last_report_ms: 0,
            error: empty,
            grace_ms: 0,
            reason: xce_reason::XCE_REASON_CLOSED,
            reason_text: empty,
        };
        let mut sans = Vec::new();
        let mut resources = Vec::new();
        match ev {
            Ev::Accepted { peer, accepted } => {
                e.kind = xce_event_kind::XCE_EVENT_ACCEPTED;
                e.host = st.add(&accepted.host);
                e.peer = st.add(&peer_text(*peer));
                if let Some(id) = &accepted.identity {
                    e.subject = st.add(&id.subject);
                    sans = id.sans.iter().map(|s| st.add(s)).collect();
                }
                let h = &accepted.hello;
                e.agent_version = st.add(&h.agent_version);
                e.boot_id = st.add(&h.boot_id);
                e.config_digest = st.add(&h.config_digest);
                resources = h
                    .resources
                    .iter()
                    .map(|d| xce_declared {
                        name: st.add(&d.name),
                        instance: st.add(&d.instance),
                        valtype: match d.valtype {
                            Valtype::Numeric => xce_valtype::XCE_VALTYPE_NUMERIC,
                            Valtype::String => xce_valtype::XCE_VALTYPE_STRING,
                            Valtype::Boolean => xce_valtype::XCE_VALTYPE_BOOLEAN,
                        },
                        interval_ms: d.interval_ms,
                        shared: d.shared,
                    })
                    .collect();
            }
            Ev::Resval { host, resval: r } => {
                e.kind = xce_event_kind::XCE_EVENT_RESVAL;
                e.host = st.add(host);
                e.name = st.add(&r.name);
                e.instance = st.add(&r.instance);
                match &r.value {
                    Value::Unknown => {}
                    Value::Numeric(x) => {
                        e.value.kind = xce_value_type::XCE_VALUE_NUMERIC;
                        e.value.numeric = *x;
                    }
                    Value::String(s) => {
                        e.value.kind = xce_value_type::XCE_VALUE_STRING;
                        e.value.string = st.add(s);
                    }
                    Value::Boolean(b) => {
                        e.value.kind = xce_value_type::XCE_VALUE_BOOLEAN;
                        e.value.boolean = *b;
                    }
                }
                e.status = match r.status {
                    Status::Ok => xce_status::XCE_STATUS_OK,
                    Status::Failed => xce_status::XCE_STATUS_FAILED,
                    Status::Stale => xce_status::XCE_STATUS_STALE,
                    Status::Pending => xce_status::XCE_STATUS_PENDING,
                };
                e.last_report_ms = r.last_report_ms.unwrap_or(0);
                if let Some(err) = &r.error {
                    e.error = st.add(&err.to_string());
                }
            }
            Ev::Stale { host, grace } => {
                e.kind = xce_event_kind::XCE_EVENT_STALE;
                e.host = st.add(host);
                e.grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
            }
            Ev::Gone {
                host,
                peer,
                reason,
                text,
            } => {
                e.kind = xce_event_kind::XCE_EVENT_GONE;
                e.host = st.add(host);
                e.peer = st.add(&peer_text(*peer));
                e.reason = xce_reason::of(*reason);
                e.reason_text = st.add(text);
            }
            Ev::Refused { peer, reason, text } => {
                e.kind = xce_event_kind::XCE_EVENT_REFUSED;
                e.peer = st.add(&peer.to_string());
                e.reason = xce_reason::of(*reason);
                e.reason_text = st.add(text);
            }
        }
        e.n_sans = sans.len();
        e.sans = if sans.is_empty() {
            std::ptr::null()
        } else {
            sans.as_ptr()
        };
        e.n_resources = resources.len();
        e.resources = if resources.is_empty() {
            std::ptr::null()
        } else {
            resources.as_ptr()
        };
        // Moving the Vecs into the box moves their headers, not their heap buffers: the
        // pointers taken above stay valid.
        Box::new(EventBox {
            public: e,
            strings: st.0,
            sans,
            resources,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use xce_agent::value::Resval;

    #[test]
    fn every_reason_has_its_code_and_listens_label() {
        // The codes are 0.. in Reason::ALL's order: a new reason takes the next code.
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(xce_reason::of(*r) as u32, i as u32);
            assert_eq!(xce_reason::label(i as u32), r.as_str());
        }
        assert_eq!(xce_reason::label(0), "closed");
        assert_eq!(xce_reason::label(14), "over_budget");
        assert_eq!(xce_reason::label(999), "unknown");
    }

    #[test]
    fn an_event_owns_its_strings_and_a_nul_does_not_cut_them() {
        let b = EventBox::new(&Ev::Resval {
            host: Arc::from("node001"),
            resval: Resval {
                name: "note".into(),
                instance: String::new(),
                value: Value::String("a\0b".into()),
                status: Status::Failed,
                last_report_ms: Some(5),
                error: Some("exit 3".into()),
            },
        });
        assert_eq!(b.public.kind, xce_event_kind::XCE_EVENT_RESVAL);
        assert_eq!(b.public.value.kind, xce_value_type::XCE_VALUE_STRING);
        let texts: Vec<&str> = b.strings.iter().map(|c| c.to_str().unwrap()).collect();
        assert!(texts.contains(&"a\u{fffd}b"), "{texts:?}");
        assert!(texts.contains(&"exit 3"), "{texts:?}");
        assert_eq!(b.public.last_report_ms, 5);
        assert!(b.public.sans.is_null() && b.public.n_sans == 0);
    }
}
