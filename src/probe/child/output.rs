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

/// What one read brought: how many bytes, to be had from [`Reader::stdout_chunk`] or
/// [`Reader::stderr_chunk`] until the next read (no allocation per read).
#[derive(Debug)]
pub enum Got {
    Stdout(usize),
    Stderr(usize),
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
    out_chunk: Box<[u8]>,
    err_chunk: Box<[u8]>,
}

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
            out_chunk: vec![0u8; 8192].into_boxed_slice(),
            err_chunk: vec![0u8; 4096].into_boxed_slice(),
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
            Ok(n) if from_stdout => {
                let room = self.stdout_cap.saturating_sub(self.stdout.len());
                self.stdout
                    .extend_from_slice(&self.out_chunk[..n.min(room)]);
                self.overflow |= n > room;
                Got::Stdout(n)
            }
            Ok(n) => {
                self.stderr.push(&self.err_chunk[..n]);
                Got::Stderr(n)
            }
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

async fn read_opt(r: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}
