//! Descriptors the agent opens for its children — the pipes and pty of their stdio, the
//! `/dev/null` of their stdin, their cgroup's directory and `cgroup.procs`, a checked
//! program — are close-on-exec and never 0, 1 or 2: the child `dup3`s its stdio onto 0..2,
//! which must never meet a source of its own, even where the agent was started with 0..2
//! closed. Below both the child engine (`child/`) and `cgroup/`, which open them; its one
//! `unsafe` takes ownership of the descriptor the kernel just made.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::fcntl::OFlag;

/// A pipe whose ends are both close-on-exec and not 0, 1 or 2 (so that `dup3` onto 0..2 in
/// the child never meets its own source, even when the agent was started with 0..2 closed).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    pipe_with(OFlag::empty())
}

/// [`pipe`], both ends non-blocking from the start: for a child's output, which the agent
/// reads without blocking; the child makes its end blocking again before its exec
/// ([`super::child::spawn::Plan::unblock`]). One `pipe2` instead of a `pipe2` and an
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
/// directory and `cgroup.events`, two a probe) go, where the open-file limit allows. A child
/// shares the agent's descriptor table at the clone and copies only the part below its own
/// highest descriptor (`child/spawn.rs`): the runs' pipes, numbered from the lowest free one,
/// stay below these, so a child's copy holds tens of descriptors, not two per probe, and its
/// exec has none of them to close. 1024: above what the agent's few other descriptors and
/// its runs in flight take, and a table of a few pages.
pub const HELD_FROM: std::os::raw::c_int = 1024;

/// `fd` moved to [`HELD_FROM`] or above; as it is where the limit (or anything else) says no.
pub fn held_high(fd: OwnedFd) -> OwnedFd {
    duplicate_from(&fd, HELD_FROM).unwrap_or(fd)
}

fn duplicate_from(fd: &OwnedFd, lowest: std::os::raw::c_int) -> io::Result<OwnedFd> {
    let raw = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(lowest))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moved high where the limit leaves room, kept (open, the same file) where it does not.
    #[test]
    fn a_held_descriptor_goes_high_where_the_limit_allows() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let before = OwnedFd::from(file);
        let number = before.as_raw_fd();
        let soft = crate::probe::open_files::current().soft;
        let held = held_high(before);
        if soft > HELD_FROM as u64 {
            assert!(held.as_raw_fd() >= HELD_FROM, "{}", held.as_raw_fd());
        } else {
            eprintln!("open-file limit {soft}: no room above {HELD_FROM}, kept");
            assert_eq!(held.as_raw_fd(), number);
        }
        let flags = nix::fcntl::fcntl(&held, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "close-on-exec");
    }
}
