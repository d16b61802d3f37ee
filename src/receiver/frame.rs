//! Reading one agent frame within the budget: its size is known from the segment table
//! before its body is read, so the bytes are charged (and a host over its share cut off)
//! before they are allocated. And how a connection ended, said as what happened: an end of
//! stream is `closed` (with or without TLS close_notify, at a frame's boundary or inside
//! one), a failed read is `io`, bytes that are not the protocol are `protocol`.

use capnp::message::{self, SegmentArray};
use capnp::Word;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::budget::{Charge, OverBudget};
use crate::link::frame_limits::FrameLimits;
use crate::link::wire::{self, Envelope, WireError};

/// Most segments a frame may have (capnp-futures' own bound).
const MAX_SEGMENTS: usize = 512;

/// One frame read whole, and what it is charged.
pub struct Frame {
    words: Vec<Word>,
    /// Each segment's (start, end) in words.
    segments: Vec<(usize, usize)>,
    _charge: Charge,
}

impl Frame {
    /// Decode the frame as an agent's message within `limits`.
    pub fn decode(&self, limits: FrameLimits) -> Result<Envelope, WireError> {
        let bytes = Word::words_to_bytes(&self.words);
        let slices: Vec<&[u8]> = self
            .segments
            .iter()
            .map(|&(a, b)| &bytes[a * 8..b * 8])
            .collect();
        let reader = message::Reader::new(SegmentArray::new(&slices), wire::reader_options());
        wire::decode_envelope_within(&reader, limits)
    }

    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

/// Why no frame came.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer ended the stream: a power cut, kill -9 or a cable looks the same as a
    /// close without TLS close_notify.
    #[error("{}", closed_text(*close_notify, *mid_frame))]
    Closed { close_notify: bool, mid_frame: bool },
    #[error("read failed: {0}")]
    Io(std::io::Error),
    #[error("frame of {size} bytes too large: the limit is {max} bytes{}", if *before_hello { " before an accepted hello" } else { "" })]
    TooLarge {
        size: usize,
        max: usize,
        before_hello: bool,
    },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("over its memory budget: {0}")]
    OverBudget(OverBudget),
}

fn closed_text(close_notify: bool, mid_frame: bool) -> String {
    match (close_notify, mid_frame) {
        (true, false) => "the agent closed the connection".into(),
        (false, false) => {
            "the connection ended without TLS close_notify (the agent was killed, or the host or the network went down)".into()
        }
        (_, true) => "the connection ended in the middle of a frame".into(),
    }
}

/// Read the next frame: `Ok(None)` at a clean end of stream between frames. `max` bounds
/// its size (small before an accepted hello); `charge(bytes)` pays for it before its body
/// is allocated.
pub async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    max: usize,
    before_hello: bool,
    charge: impl FnOnce(usize) -> Result<Charge, OverBudget>,
) -> Result<Option<Frame>, FrameError> {
    let mut head = [0u8; 8];
    match rd.read(&mut head).await {
        Ok(0) => return Ok(None),
        Ok(n) => fill(rd, &mut head[n..]).await?,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(FrameError::Closed {
                close_notify: false,
                mid_frame: false,
            })
        }
        Err(e) => return Err(FrameError::Io(e)),
    }
    let count = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize + 1;
    if count > MAX_SEGMENTS {
        return Err(FrameError::Malformed(format!(
            "{count} segments, more than {MAX_SEGMENTS}"
        )));
    }
    let mut lengths = Vec::with_capacity(count);
    lengths.push(u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize);
    if count > 1 {
        // The rest of the table, padded to a word.
        let mut rest = vec![0u8; (count & !1) * 4];
        fill(rd, &mut rest).await?;
        lengths.extend(
            rest.chunks_exact(4)
                .take(count - 1)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize),
        );
    }
    let words: usize = lengths.iter().sum();
    let size = words.saturating_mul(8);
    if size > max {
        return Err(FrameError::TooLarge {
            size,
            max,
            before_hello,
        });
    }
    let charge = charge(size).map_err(FrameError::OverBudget)?;
    let mut body = Word::allocate_zeroed_vec(words);
    fill(rd, Word::words_to_bytes_mut(&mut body)).await?;
    let mut segments = Vec::with_capacity(count);
    let mut at = 0;
    for len in lengths {
        segments.push((at, at + len));
        at += len;
    }
    Ok(Some(Frame {
        words: body,
        segments,
        _charge: charge,
    }))
}

/// Fill `buf`: the stream ending first is a frame cut short.
async fn fill<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    match rd.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Closed {
            close_notify: true,
            mid_frame: true,
        }),
        Err(e) => Err(FrameError::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::wire::{encode_envelope, Heartbeat};
    use crate::receiver::budget::{Budget, Payer};

    fn heartbeat() -> Vec<u8> {
        encode_envelope(&Envelope::Heartbeat(Heartbeat {
            seq: 3,
            sent_at_ms: 9,
        }))
        .expect("encode")
    }

    #[tokio::test]
    async fn a_frame_is_read_whole_and_charged_while_held() {
        let budget = Budget::new(1 << 20, 1 << 20);
        let mut bytes: &[u8] = &[heartbeat(), heartbeat()].concat();
        let f = read_frame(&mut bytes, 1 << 16, false, |n| {
            budget.charge(&Payer::PreAuth, n)
        })
        .await
        .expect("read")
        .expect("a frame");
        assert_eq!(budget.used(), f.bytes());
        assert!(matches!(
            f.decode(FrameLimits::default()),
            Ok(Envelope::Heartbeat(Heartbeat { seq: 3, .. }))
        ));
        drop(f);
        assert_eq!(budget.used(), 0);
        assert!(read_frame(&mut bytes, 1 << 16, false, |n| budget
            .charge(&Payer::PreAuth, n))
        .await
        .expect("read")
        .is_some());
        assert!(read_frame(&mut bytes, 1 << 16, false, |n| budget
            .charge(&Payer::PreAuth, n))
        .await
        .expect("clean end")
        .is_none());
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_or_the_budget_is_refused_before_its_body_is_read() {
        let budget = Budget::new(1 << 20, 1 << 20);
        // A segment table announcing 100 MiB, and no body.
        let mut table: &[u8] = &[0, 0, 0, 0, 0, 0, 0x20, 0x03];
        let e = read_frame(&mut table, 1 << 16, true, |n| {
            budget.charge(&Payer::PreAuth, n)
        })
        .await
        .err()
        .expect("refused");
        assert!(
            matches!(e, FrameError::TooLarge { size, before_hello: true, .. } if size > 100 << 20),
            "{e:?}"
        );
        let small = Budget::new(8, 8);
        let mut bytes: &[u8] = &heartbeat();
        let e = read_frame(&mut bytes, 1 << 16, false, |n| {
            small.charge(&Payer::PreAuth, n)
        })
        .await
        .err()
        .expect("refused");
        assert!(matches!(e, FrameError::OverBudget(_)), "{e:?}");
    }

    #[tokio::test]
    async fn an_end_inside_a_frame_is_a_close_mid_frame() {
        let budget = Budget::new(1 << 20, 1 << 20);
        let whole = heartbeat();
        let mut cut: &[u8] = &whole[..whole.len() - 3];
        let e = read_frame(&mut cut, 1 << 16, false, |n| {
            budget.charge(&Payer::PreAuth, n)
        })
        .await
        .err()
        .expect("cut");
        assert!(
            matches!(
                e,
                FrameError::Closed {
                    mid_frame: true,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(budget.used(), 0, "the charge went with the frame");
    }
}
