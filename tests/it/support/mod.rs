//! What the tests share: a site builder (`site`), processes — the agent binary as a child,
//! /proc reads, a test in its own process (`process`), both ends of the link in this process
//! with the project's receiver as the fake controller (`controller`), hand-made frames
//! (`frames`), probes run in this process (`probe`), waits with one hang guard (`wait`), and
//! the TLS key material (`tls`, by its own name: its `client`/`server` are too generic to
//! stand beside the rest).

mod controller;
mod frames;
mod probe;
mod process;
mod site;
pub mod tls;
mod wait;

pub use controller::*;
pub use frames::*;
pub use probe::*;
pub use process::*;
pub use site::*;
pub use wait::*;

/// Where proptest keeps a test's failing cases: beside its file, as
/// `tests/it/<module>.proptest-regressions` (proptest's default would put them under a
/// `tests/proptest-regressions/` tree, because `tests/it/` holds a `main.rs`).
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..proptest::test_runner::Config::default()
    }
}
