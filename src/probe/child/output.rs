//! The one reader of a child's output: stdout kept up to a cap, the tail of stderr, both
//! pipes read by one future that every supervising loop polls as a single `select!` arm.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// Stderr: only the tail matters for the error message.
#[derive(Debug)]
pub struct Tail {
    pub buf: Vec<u8>,
    pub keep: usize,
    pub total: u64,
}

impl Tail {
    pub fn new(keep: usize) -> Self {
        Self {
            buf: Vec::new(),
            keep,
            total: 0,
        }
    }

    /// The kept tail as text, `…` first when older output was dropped.
    pub fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.buf);
        let text = text.trim();
        if self.total > self.buf.len() as u64 {
            format!("…{text}")
        } else {
            text.to_owned()
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        self.buf.extend_from_slice(chunk);
        if self.buf.len() > self.keep {
            let cut = self.buf.len() - self.keep;
            self.buf.drain(..cut);
        }
    }
}

/// What one read brought: how many bytes, to be had from [`Reader::stdout_chunk`] or
/// [`Reader::stderr_chunk`] until the next read (no allocation per read).
#[derive(Debug)]
pub enum Got {
    Stdout(usize),
    Stderr(usize),
    /// One of the pipes reached its end.
    Closed,
}

/// One pipe of a child. It is read without the reactor until a read would block, and only
/// then registered with it: a short run's output is whole in the pipe when it exits, and
/// read so it costs no epoll registration.
#[derive(Debug)]
enum Pipe {
    /// Not registered yet (non-blocking).
    Raw(OwnedFd),
    Registered(pipe::Receiver),
    Closed,
}

/// Both pipes of a child, and what was read from them.
#[derive(Debug)]
pub struct Reader {
    out: Pipe,
    err: Pipe,
    /// The first `stdout_cap` bytes of stdout.
    pub stdout: Vec<u8>,
    stdout_cap: usize,
    /// More than `stdout_cap` bytes arrived.
    pub overflow: bool,
    pub stderr: Tail,
    /// Each pipe's read buffer, made at its first read that brings bytes (a pipe that
    /// only reports its end, as most runs' stderr, never gets one).
    out_chunk: Vec<u8>,
    err_chunk: Vec<u8>,
}

/// The first read buffer of each pipe: most probes print a line or two, and a buffer this
/// small is served from malloc's small bins (a buffer of a kilobyte or more makes glibc
/// consolidate its free lists on every run: measurable at 50 runs a second). A read that
/// fills it doubles it, up to the `_MAX` size, so large output still takes few reads.
const FIRST_CHUNK: usize = 512;
const OUT_CHUNK_MAX: usize = 8192;
const ERR_CHUNK_MAX: usize = 4096;

impl Reader {
    /// `out` and `err` are the agent's non-blocking read ends.
    pub fn new(out: OwnedFd, err: OwnedFd, stdout_cap: usize, stderr_tail: usize) -> Self {
        Self {
            out: Pipe::Raw(out),
            err: Pipe::Raw(err),
            stdout: Vec::new(),
            stdout_cap,
            overflow: false,
            stderr: Tail::new(stderr_tail),
            out_chunk: Vec::new(),
            err_chunk: Vec::new(),
        }
    }

    /// Whether a pipe is still open (poll [`Reader::next`] only then).
    pub fn open(&self) -> bool {
        !matches!((&self.out, &self.err), (Pipe::Closed, Pipe::Closed))
    }

    /// A chunk already waiting in a pipe not yet registered, read without waiting; `None`
    /// when each such pipe would block (or none is left unregistered).
    pub fn read_ready(&mut self) -> Option<Got> {
        for from_stdout in [true, false] {
            let (pipe, buf) = if from_stdout {
                (&mut self.out, &mut self.out_chunk)
            } else {
                (&mut self.err, &mut self.err_chunk)
            };
            let Pipe::Raw(fd) = pipe else { continue };
            // A pipe without its buffer yet reads onto the stack first.
            let mut first = [0u8; FIRST_CHUNK];
            let read = loop {
                let into: &mut [u8] = if buf.is_empty() { &mut first } else { buf };
                match nix::unistd::read(&*fd, into) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other,
                }
            };
            return Some(match read {
                Err(nix::errno::Errno::EAGAIN) => continue,
                Ok(0) | Err(_) => {
                    *pipe = Pipe::Closed;
                    Got::Closed
                }
                Ok(n) => {
                    if buf.is_empty() {
                        buf.extend_from_slice(&first);
                    }
                    self.took(n, from_stdout)
                }
            });
        }
        None
    }

    /// The next chunk from either pipe. Cancel-safe: a read that did not complete read
    /// nothing.
    pub async fn next(&mut self) -> Got {
        let Reader {
            out,
            err,
            out_chunk,
            err_chunk,
            ..
        } = self;
        for (pipe, chunk) in [(&*out, &mut *out_chunk), (&*err, &mut *err_chunk)] {
            if chunk.is_empty() && !matches!(pipe, Pipe::Closed) {
                chunk.resize(FIRST_CHUNK, 0);
            }
        }
        let (n, from_stdout) = tokio::select! {
            r = read_pipe(out, out_chunk) => (r, true),
            r = read_pipe(err, err_chunk) => (r, false),
        };
        match n {
            Ok(0) | Err(_) => {
                if from_stdout {
                    self.out = Pipe::Closed;
                } else {
                    self.err = Pipe::Closed;
                }
                Got::Closed
            }
            Ok(n) => self.took(n, from_stdout),
        }
    }

    /// Keep what `n` bytes just read into a chunk add to stdout (up to its cap) or stderr.
    /// A read that filled its chunk doubles it (the bytes read stay at its start).
    fn took(&mut self, n: usize, from_stdout: bool) -> Got {
        let (chunk, max) = if from_stdout {
            (&mut self.out_chunk, OUT_CHUNK_MAX)
        } else {
            (&mut self.err_chunk, ERR_CHUNK_MAX)
        };
        if n == chunk.len() && n < max {
            chunk.resize((n * 2).min(max), 0);
        }
        if from_stdout {
            let room = self.stdout_cap.saturating_sub(self.stdout.len());
            self.stdout
                .extend_from_slice(&self.out_chunk[..n.min(room)]);
            self.overflow |= n > room;
            Got::Stdout(n)
        } else {
            self.stderr.push(&self.err_chunk[..n]);
            Got::Stderr(n)
        }
    }

    /// The bytes of the last [`Got::Stdout`].
    pub fn stdout_chunk(&self, n: usize) -> &[u8] {
        &self.out_chunk[..n.min(self.out_chunk.len())]
    }

    /// The bytes of the last [`Got::Stderr`].
    pub fn stderr_chunk(&self, n: usize) -> &[u8] {
        &self.err_chunk[..n.min(self.err_chunk.len())]
    }
}

/// Read a pipe through the reactor, registering it with the first read that must wait.
async fn read_pipe(pipe: &mut Pipe, buf: &mut [u8]) -> io::Result<usize> {
    if let Pipe::Raw(_) = pipe {
        let Pipe::Raw(fd) = std::mem::replace(pipe, Pipe::Closed) else {
            return Ok(0);
        };
        // A pipe that cannot be registered reads as ended: the deadline still ends the run.
        *pipe = Pipe::Registered(pipe::Receiver::from_owned_fd_unchecked(fd)?);
    }
    match pipe {
        Pipe::Registered(r) => r.read(buf).await,
        Pipe::Raw(_) | Pipe::Closed => std::future::pending().await,
    }
}
