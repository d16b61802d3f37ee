//! The receiving side's core: what the C library (`capi/`) and `xce-agent listen` wrap. It
//! runs inside xce's controller, the one process a cluster cannot lose, so everything a
//! peer can make it hold is bounded and charged:
//!
//! - [`session`]: the sessions (the controller's TCP + TLS door and the worker's unix
//!   door, the hello/batch/heartbeat state machine, GONE reasons), what `listen` runs;
//! - [`admission`]: which connections wait for authentication, and which are evicted;
//! - [`budget`]: the memory budget in bytes, with a share per host;
//! - [`frame`]: a frame read within the budget, and how a connection ended;
//! - [`identity`]: one canonical name per host, one live host per certificate;
//! - [`events`]: what the controller is told;
//! - [`hosts`]: the one fold of connection events into per-host state;
//! - [`queue`]: the controller's queue, newest-wins per (host, resource).
//!
//! The sessions themselves (TLS, admission, the hello/batch/heartbeat state machine) are
//! `receiver::session`.

pub mod admission;
pub mod budget;
pub mod events;
pub mod frame;
pub mod hosts;
pub mod identity;
pub mod queue;
pub mod session;
