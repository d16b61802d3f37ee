//! xce-agent: the worker-side dynamic resource agent of the xce cluster scheduler.
//!
//! Layers, each importing only those below it:
//! `value` -> `config` -> `plan` -> `store`, `stats` -> `probe` -> `schedule` -> `link` ->
//! `daemon`, `metrics`, `report` -> `cli` and the binary.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod link;
pub mod metrics;
pub mod plan;
pub mod probe;
pub mod report;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod tls_ca;
pub mod value;
