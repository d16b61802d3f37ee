//! libxce_receiver: receive what xce agents send, from C.
//!
//! The receiver core of `xce-agent listen` (TLS 1.3 with required client certificates, the
//! hello's host bound to the certificate, frame and list limits, the hello/batch/heartbeat
//! state machine, newest connection wins per host) on a runtime of its own, with staleness,
//! an event queue and a C ABI on top. The C header is generated from this crate by cbindgen
//! (`scripts/regen-header.sh`) into `capi/include/xce_receiver.h`; docs/controller.md shows
//! the API with the example controller in `examples/c/`.
//!
//! - [`core`]: the receiver, its event queue and host table (safe Rust).
//! - [`event`]: controller events as C structs that own their strings (safe Rust).
//! - [`log`]: the receiver's tracing events as lines for the controller's callback.
//! - [`ffi`]: the `extern "C"` functions: the only module with `unsafe`.
//! - [`version`]: `xce_receiver_version()` (constants only; no `unsafe`).

#![deny(unsafe_code)]

pub mod core;
pub mod event;
#[allow(unsafe_code)]
pub mod ffi;
pub mod log;
pub mod version;
