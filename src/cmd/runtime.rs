//! The runtime every command runs on.

use std::io;

use tokio::runtime::Runtime;

/// One worker thread (beside the main thread, which runs the command's own loop). A probe
/// run is a few system calls and waits, so a second worker buys no throughput; it costs
/// wake-ups, a spawned task or a readiness event landing on the other, idle, thread
/// (BENCHMARKS.md section 21: context switches and CPU per exec run).
pub fn build() -> io::Result<Runtime> {
    // Before any thread exists, so that every thread inherits it.
    crate::probe::reaper::hold_child_signals();
    // Before any probe runs: two descriptors a contained probe, past systemd's soft 1024 at
    // about 500 probes; probes get the limit the agent was started with.
    crate::probe::open_files::raise();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
}
