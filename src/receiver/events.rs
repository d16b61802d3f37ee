//! What the controller is told: one event per change of a host's state or value. The C
//! library hands these to the controller (`xce_event`), `listen --format table` folds them
//! into its table; both get them from the one fold in [`super::hosts`].

use super::identity::Peer;
use std::sync::Arc;
use std::time::Duration;

use crate::link::wire::Hello;
use crate::receiver::session::{Identity, Reason};
use crate::value::Resval;

/// A host as accepted: who its certificate says it is and what its hello declared.
#[derive(Debug)]
pub struct Accepted {
    /// The canonical name (lower case, the cluster's domain folded).
    pub host: String,
    pub identity: Option<Arc<Identity>>,
    /// Shared with the session that received it: the declared names are held once.
    pub hello: Arc<Hello>,
}

/// One event for the controller.
#[derive(Debug, Clone)]
pub enum Ev {
    /// A host passed the identity check and sent its hello (again after a reload, and when
    /// a stale host reports again).
    Accepted {
        peer: Option<Peer>,
        accepted: Arc<Accepted>,
    },
    Resval {
        host: Arc<str>,
        resval: Resval,
    },
    /// Nothing from the host for longer than `grace`: its values are unknown.
    Stale {
        host: Arc<str>,
        grace: Duration,
    },
    /// The host's connection ended, and why (`Reason::Closed` at an end of stream).
    Gone {
        host: Arc<str>,
        peer: Option<Peer>,
        reason: Reason,
        text: String,
    },
    /// A connection that never got as far as an accepted hello.
    Refused {
        peer: Peer,
        reason: Reason,
        text: String,
    },
}

impl Ev {
    /// The host an event is about (none for a refusal).
    pub fn host(&self) -> Option<&str> {
        match self {
            Ev::Accepted { accepted, .. } => Some(&accepted.host),
            Ev::Resval { host, .. } | Ev::Stale { host, .. } | Ev::Gone { host, .. } => Some(host),
            Ev::Refused { .. } => None,
        }
    }

    /// The bytes the event holds of its own (what the queue charges for it): a resval's
    /// texts; a state event shares its hello with the host table and costs its overhead.
    pub fn cost(&self) -> usize {
        use super::budget::{text_cost, ENTRY_OVERHEAD};
        match self {
            Ev::Resval { resval, .. } => resval_cost(resval),
            Ev::Gone { text, .. } | Ev::Refused { text, .. } => text_cost(text),
            Ev::Accepted { .. } | Ev::Stale { .. } => ENTRY_OVERHEAD,
        }
    }
}

/// What a resval holds: its texts and an entry's overhead.
pub fn resval_cost(r: &Resval) -> usize {
    let value = match &r.value {
        crate::value::Value::String(s) => s.len(),
        _ => 0,
    };
    // Clipped to MAX_ERROR_TEXT when decoded.
    let error = r.error.as_ref().map_or(0, |e| e.to_string().len());
    super::budget::text_cost(&r.name) + r.instance.len() + value + error
}
