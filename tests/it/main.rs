//! The integration tests, one binary (`cargo test --test it`; a module's tests:
//! `cargo test --test it exec::`). One module per file, and `support` for what they share.
//!
//! One process runs them all, so what a process has once is handled here, not per file:
//! a test that makes the process the child subreaper, sets its SIGCHLD disposition or moves
//! it into a cgroup runs in a copy of this binary of its own (`support::in_own_process!`,
//! with a line saying why; what a child's spec or a handle carries needs none); `fuzz_wire`'s counting
//! allocator is the binary's global allocator, and counts per thread, so each test sees only
//! its own allocations.

mod support;

mod admission;
mod builtin;
mod capi;
mod capture;
mod cli;
mod config_errors;
mod config_limits;
mod config_trust;
mod containment;
mod daemon;
mod daemon_flush;
mod daemon_link;
mod daemon_own_pages;
mod daemon_welcome;
mod declared_state;
mod disk_full;
mod drive;
mod escapes;
mod exec;
mod exec_output_log;
mod exec_privileges;
mod exec_reaper;
mod exec_supervision;
mod file_probe;
mod formats;
mod fuzz_config;
mod fuzz_names;
mod fuzz_output;
mod fuzz_wire;
mod hostile_link;
mod hung_reads;
mod link;
mod link_failures;
mod link_receiver;
mod metrics;
mod monitoring;
mod open_files;
mod packaging;
mod peer_formats;
mod plan;
mod plugins;
mod ports;
mod probe_cmd;
mod program_text;
mod receiver_core;
mod schedule;
mod script_rule;
mod security_checks;
mod shared_feed;
mod spawn;
mod spawn_legacy;
mod status;
mod stream;
mod tls;
mod tls_cli;
mod worker_feed;
