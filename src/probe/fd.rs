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
    let raw = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(lowest))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}
