//! The one reader of a child's output: stdout kept up to a cap, the tail of stderr, both
//! pipes read by one future that every supervising loop polls as a single `select!` arm.

use std::io;

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

/// What one read brought.
#[derive(Debug)]
pub enum Got {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// One of the pipes reached its end.
    Closed,
}

/// Both pipes of a child, and what was read from them.
#[derive(Debug)]
pub struct Reader {
    out: Option<pipe::Receiver>,
    err: Option<pipe::Receiver>,
    /// The first `stdout_cap` bytes of stdout.
    pub stdout: Vec<u8>,
    stdout_cap: usize,
    /// More than `stdout_cap` bytes arrived.
    pub overflow: bool,
    pub stderr: Tail,
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
    pub fn new(
        out: pipe::Receiver,
        err: pipe::Receiver,
        stdout_cap: usize,
        stderr_tail: usize,
    ) -> Self {
        Self {
            out: Some(out),
            err: Some(err),
            stdout: Vec::new(),
            stdout_cap,
            overflow: false,
            stderr: Tail::new(stderr_tail),
            out_chunk: vec![0u8; FIRST_CHUNK],
            err_chunk: vec![0u8; FIRST_CHUNK],
        }
    }

    /// Whether a pipe is still open (poll [`Reader::next`] only then).
    pub fn open(&self) -> bool {
        self.out.is_some() || self.err.is_some()
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
        let (n, from_stdout) = tokio::select! {
            r = read_opt(out, out_chunk) => (r, true),
            r = read_opt(err, err_chunk) => (r, false),
        };
        match n {
            Ok(0) | Err(_) => {
                if from_stdout {
                    self.out = None;
                } else {
                    self.err = None;
                }
                Got::Closed
            }
            Ok(n) => {
                let (chunk, max) = if from_stdout {
                    (&mut self.out_chunk, OUT_CHUNK_MAX)
                } else {
                    (&mut self.err_chunk, ERR_CHUNK_MAX)
                };
                let bytes = chunk[..n].to_vec();
                if n == chunk.len() && n < max {
                    chunk.resize((n * 2).min(max), 0);
                }
                if from_stdout {
                    let room = self.stdout_cap.saturating_sub(self.stdout.len());
                    self.stdout.extend_from_slice(&bytes[..n.min(room)]);
                    self.overflow |= n > room;
                    Got::Stdout(bytes)
                } else {
                    self.stderr.push(&bytes);
                    Got::Stderr(bytes)
                }
            }
        }
    }
}

async fn read_opt(r: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}
