//! This process's own CPU, utime + stime from getrusage, for the benches.

use std::time::Duration;

pub use nix::sys::resource::UsageWho;

/// utime + stime of `who` (this process, its reaped children, or the calling thread).
pub fn cpu(who: UsageWho) -> Duration {
    let usage = nix::sys::resource::getrusage(who).expect("getrusage");
    let time =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    time(usage.user_time()) + time(usage.system_time())
}
