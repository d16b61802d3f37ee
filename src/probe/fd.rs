//! Descriptors the agent opens for its children — the pipes and pty of their stdio, the
//! `/dev/null` of their stdin, their cgroup's directory and `cgroup.procs`, a checked
//! program — are close-on-exec and never 0, 1 or 2: the child `dup3`s its stdio onto 0..2,
//! which must never meet a source of its own, even where the agent was started with 0..2
//! closed. Below both the child engine (`child/`) and `cgroup/`, which open them; its one
//! `unsafe` takes ownership of the descriptor the kernel just made.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::fcntl::OFlag;

/// A pipe whose ends are both close-on-exec and not 0, 1 or 2 (so that `dup3` onto 0..2 in
/// the child never meets its own source, even when the agent was started with 0..2 closed).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    pipe_with(OFlag::empty())
}

/// [`pipe`], both ends non-blocking from the start: for a child's output, which the agent
/// reads without blocking; the child makes its end blocking again before its exec
/// (`child::spawn::Plan::unblock`). One `pipe2` instead of a `pipe2` and an
/// `fcntl` in the agent for every run.
pub fn pipe_nonblocking() -> io::Result<(OwnedFd, OwnedFd)> {
    pipe_with(OFlag::O_NONBLOCK)
}

fn pipe_with(flags: OFlag) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | flags)?;
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// The same open file on a descriptor >= 3, close-on-exec.
pub fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    above(fd, 3)
}

/// The same open file on a new descriptor >= `lowest`, close-on-exec (a capture pipe's
/// descriptor keeps the ones below it free).
pub fn above(fd: OwnedFd, lowest: std::os::raw::c_int) -> io::Result<OwnedFd> {
    duplicate_from(&fd, lowest)
}

/// Where the descriptors the agent holds for long (each contained probe's leaf cgroup: its
/// directory and `cgroup.events`) go once [`many_held`], where the open-file limit allows.
/// A child that shares the agent's descriptor table at the clone copies only the part below
/// its own highest descriptor (`child/spawn.rs`): the runs' pipes, numbered from the lowest
/// free one, stay below these, so a child's copy holds tens of descriptors, not two per
/// probe, and its exec has none of them to close. 1024: above what the agent's few other
/// descriptors and its runs in flight take, and a table of a few pages.
pub const HELD_FROM: std::os::raw::c_int = 1024;

/// How many [`Held`] descriptors are open now, in the whole process.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// A descriptor held for long ([`held_high`]), counted ([`many_held`]) while open.
#[derive(Debug)]
pub struct Held<T>(T);

/// From this many held descriptors on (256 contained probes), a child shares the agent's
/// table at the clone (`child/spawn.rs`), and the next ones are placed at [`HELD_FROM`] and
/// above, out of its copy. The copy the sharing saves grows with the held descriptors, the
/// child's unshare costs the agent about the same whatever their number: at 1018 held the
/// agent spent 6 % less a run and its children 7-8 % less, at 118 the agent 6-13 % more
/// (BENCHMARKS.md 23l), at 518 level (23k). Below it nothing moves: a table with its held
/// descriptors high is copied whole by a clone that does not share it.
pub const MANY_HELD: usize = 256 * super::open_files::HELD_PER_PROBE as usize;

/// Whether the agent holds [`MANY_HELD`] descriptors or more now.
pub fn many_held() -> bool {
    HELD.load(Ordering::Relaxed) >= MANY_HELD
}

/// `fd` counted as held for long, and moved to [`HELD_FROM`] or above once [`many_held`]
/// (as it is where the limit, or anything else, says no); as a `T` (an [`OwnedFd`], a
/// [`std::fs::File`]).
pub fn held_high<T: From<OwnedFd>>(fd: OwnedFd) -> Held<T> {
    let fd = placed(fd, many_held());
    HELD.fetch_add(1, Ordering::Relaxed);
    Held(T::from(fd))
}

/// `fd`, moved to [`HELD_FROM`] or above where `high` and the limit allows.
fn placed(fd: OwnedFd, high: bool) -> OwnedFd {
    match high {
        true => duplicate_from(&fd, HELD_FROM).unwrap_or(fd),
        false => fd,
    }
}

impl<T> std::ops::Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

fn duplicate_from(fd: &OwnedFd, lowest: std::os::raw::c_int) -> io::Result<OwnedFd> {
    let raw = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(lowest))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placed high where the limit leaves room, and kept (open, the same file) where it does
    /// not; left where it is below the count. (The count itself is the process's: other
    /// tests open leaves beside this one, so `open_files.rs` checks it through an agent.)
    #[test]
    fn past_many_held_descriptors_the_next_goes_high_where_the_limit_allows() {
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let before = null();
        let number = before.as_raw_fd();
        let soft = crate::probe::open_files::current().soft;
        let high = placed(before, true);
        if soft > HELD_FROM as u64 {
            assert!(high.as_raw_fd() >= HELD_FROM, "{}", high.as_raw_fd());
        } else {
            eprintln!("open-file limit {soft}: no room above {HELD_FROM}, kept");
            assert_eq!(high.as_raw_fd(), number);
        }
        let flags = nix::fcntl::fcntl(&high, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "close-on-exec");
        let low = null();
        let number = low.as_raw_fd();
        assert_eq!(placed(low, false).as_raw_fd(), number);
    }
}
