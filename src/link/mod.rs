//! The stream of resvals to the controller (Cap'n Proto over TCP or a node's unix socket):
//! the agent's side, and what both sides share (the wire, its limits, TLS). The receiving
//! side is `crate::receiver`.
//!
//! - [`wire`]: plain Rust messages <-> capnp, framing and its limits.
//! - [`assignment`]: when a welcome's assignment takes effect (coalesced, once per second).
//! - [`client`]: the agent's connection loop (hello, snapshot, deltas, heartbeats, reconnect).
//! - [`frame_limits`]: what a frame may carry (list bounds, text lengths).
//! - [`name_rules`]: a frame's names against the rules resources.yaml is held to.
//! - [`warning_throttle`]: a connection's repeated warnings, one summary per interval.
//! - [`pace`]: how fast the agent reads a controller's messages.
//! - [`tls`]: TLS 1.3 with a certificate on both ends; the hello's host bound to the SANs.
//!
//! The schema is `schema/agent.capnp`; `agent_capnp` is generated from it by
//! `scripts/regen-schema.sh` and committed, so building needs no capnp tool.

#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, unused, missing_docs)]
pub mod agent_capnp;

pub mod assignment;
pub mod client;
pub mod frame_limits;
pub mod name_rules;
pub mod pace;
pub mod tls;
pub mod warning_throttle;
pub mod wire;
