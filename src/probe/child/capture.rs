//! The agent's end of a child's capture pipe (`capture:`): what the stand-ins of the
//! captured commands write on [`super::spawn::CAPTURE_FD`], read beside stdout and stderr and
//! kept up to a cap. Past the cap the pipe is closed: a stand-in's next write fails (EPIPE),
//! so a probe that reports without end costs the agent [`CAPTURE_CAP`] bytes, no more, and
//! never blocks on a full pipe until its timeout.

use std::io;
use std::os::fd::OwnedFd;

use tokio::net::unix::pipe;

/// What one run's stand-ins may write in all: a health check reports a state or two and a
/// few metrics, each call well under a kilobyte.
pub const CAPTURE_CAP: usize = 64 * 1024;

/// What a run's stand-ins wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first [`CAPTURE_CAP`] bytes.
    pub bytes: Vec<u8>,
    /// More came; the pipe was closed on the writers.
    pub overflowed: bool,
}

/// The read end of one run's capture pipe.
#[derive(Debug)]
pub struct CaptureReader {
    pipe: Option<pipe::Receiver>,
    got: Captured,
    cap: usize,
    chunk: Vec<u8>,
}

impl CaptureReader {
    /// `fd`: the agent's non-blocking read end.
    pub fn new(fd: OwnedFd, cap: usize) -> io::Result<Self> {
        Ok(Self {
            pipe: Some(pipe::Receiver::from_owned_fd_unchecked(fd)?),
            got: Captured::default(),
            cap,
            chunk: vec![0; 4096],
        })
    }

    /// Whether the pipe is still open (poll [`CaptureReader::next`] only then).
    pub fn open(&self) -> bool {
        self.pipe.is_some()
    }

    /// Read the next chunk. Cancel-safe: a read that did not complete read nothing.
    pub async fn next(&mut self) {
        let Some(pipe) = &mut self.pipe else {
            return std::future::pending().await;
        };
        let read = async {
            pipe.readable().await?;
            pipe.try_read(&mut self.chunk)
        };
        match read.await {
            Ok(n) if n > 0 => self.took(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(_) | Err(_) => self.pipe = None,
        }
    }

    /// What is already in the pipe, read without waiting: when the run has ended, the
    /// calls its stand-ins completed are all there.
    pub fn drain_now(&mut self) {
        // A plain read(2): the reactor's readiness may not have seen the last write yet.
        while let Some(pipe) = &self.pipe {
            match nix::unistd::read(pipe, &mut self.chunk) {
                Ok(n) if n > 0 => self.took(n),
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Ok(_) | Err(_) => self.pipe = None,
            }
        }
    }

    fn took(&mut self, n: usize) {
        let room = self.cap - self.got.bytes.len();
        self.got.bytes.extend_from_slice(&self.chunk[..n.min(room)]);
        if n > room {
            self.got.overflowed = true;
            self.pipe = None;
        }
    }

    /// What was read; the pipe closes.
    pub fn finish(self) -> Captured {
        self.got
    }
}
