//! `stdin: signal`: the agent writes one newline to a stream child's stdin at each interval
//! and the child answers with one batch (Telegraf execd's `signal = "STDIN"`).
//!
//! The write end is non-blocking: a child that never reads must not block the agent. When the
//! pipe is full (the child has not read the ticks already sent) the tick is dropped; the
//! caller counts and logs it. `EPIPE` once the child has exited (or closed its stdin) is
//! normal; the exit is noticed by the supervisor, not here.

use std::io;
use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// The agent's end of a child's stdin pipe.
#[derive(Debug)]
pub struct TickWriter {
    pipe: OwnedFd,
}

/// What sending one tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    Sent,
    /// The pipe is full: the child is not reading; this tick is dropped.
    Dropped,
    /// Nobody reads the pipe any more (the child exited or closed its stdin).
    Closed,
}

impl TickWriter {
    pub fn new(pipe: OwnedFd) -> io::Result<Self> {
        fcntl(&pipe, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        Ok(Self { pipe })
    }

    /// Write one newline without ever blocking.
    pub fn send(&self) -> Tick {
        self.write(b"\n")
    }

    /// Write `bytes` (a tick, a goodbye) without ever blocking; [`Tick::Dropped`] when the
    /// pipe has no room for them.
    pub fn write(&self, bytes: &[u8]) -> Tick {
        loop {
            return match nix::unistd::write(&self.pipe, bytes) {
                Ok(0) | Err(Errno::EAGAIN) => Tick::Dropped,
                Ok(_) => Tick::Sent,
                Err(Errno::EINTR) => continue,
                // EPIPE, or the pipe is otherwise unusable: nothing more will be read.
                Err(_) => Tick::Closed,
            };
        }
    }
}
