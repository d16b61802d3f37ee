//! xce-agent: the worker-side dynamic resource agent of the xce cluster scheduler.
//!
//! Layers, each importing only those below it:
//! `value`, `text` -> `output` (the parsers of what probes print) -> `config` -> `plan`, `reload` -> `store`, `stats` -> `probe` -> `schedule` -> `link` -> `receiver` ->
//! `checks`, `trust`, `render`, `status`, `daemon`, `metrics`, `cluster_table` -> `cli`, `logging` -> `cmd`
//! (one module per command, the runtime, the dispatch) -> the binary (parse, log, run).

pub mod checks;
pub mod cli;
pub mod cluster_table;
pub mod cmd;
pub mod config;
pub mod daemon;
pub mod link;
pub mod logging;
pub mod metrics;
pub mod output;
pub mod own_pages;
pub mod plan;
pub mod probe;
pub mod receiver;
pub mod reload;
pub mod render;
pub mod schedule;
pub mod stats;
pub mod status;
pub mod store;
pub mod text;
pub mod timer;
pub mod tls_ca;
pub mod trust;
pub mod value;
