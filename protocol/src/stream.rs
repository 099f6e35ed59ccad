//! Reading and writing frames on an async stream (feature `tokio`): the one
//! frame reader and writer that the supervisor and the broker share.
//!
//! Owns the deadlines and the order of checks of one frame: the wait for
//! its first byte, one deadline for the rest of it (a peer cannot trickle
//! bytes to hold a connection), the reader's own length limits applied to
//! the header *before* anything is allocated, and a payload accepted only on
//! a message that may carry one, refused before the payload is read. It
//! never decides what a frame means or what to answer; every failure is a
//! [`StreamError`], never a panic.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::time::{timeout, timeout_at, Instant};

use crate::frame::{self, Frame, FrameError, FrameHeader, Message, HEADER_LEN};

/// What one read may wait for and take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// How long to wait for the first byte of the frame; `None`: as long as
    /// it takes (a `watch` stream).
    pub first_byte: Option<Duration>,
    /// From the first byte on, the whole frame must arrive within this.
    pub rest: Duration,
    /// Largest JSON part this reader takes (at most the protocol's
    /// [`crate::MAX_HEADER_LEN`], which is always checked too).
    pub max_message: u32,
    /// Largest payload this reader takes (at most the protocol's
    /// [`crate::MAX_PAYLOAD_LEN`]).
    pub max_payload: u32,
    /// Bounds on the strings and lists of the message, for a reader that
    /// keeps or shows what a hostile peer sends.
    pub taming: Option<crate::frame::Taming>,
}

impl ReadLimits {
    /// The protocol's own limits, with the given waits.
    pub fn new(first_byte: Option<Duration>, rest: Duration) -> Self {
        Self {
            first_byte,
            rest,
            max_message: crate::MAX_HEADER_LEN,
            max_payload: crate::MAX_PAYLOAD_LEN,
            taming: None,
        }
    }
}

/// Why a frame could not be read or written on a stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The frame itself is bad, the peer closed, or the socket failed
    /// (including the reader's own length limits:
    /// [`FrameError::MessageTooLarge`], [`FrameError::PayloadTooLarge`]).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Nothing arrived within [`ReadLimits::first_byte`].
    #[error("nothing arrived within {0:?}")]
    Idle(Duration),
    /// The frame began but did not end within [`ReadLimits::rest`].
    #[error("the rest of the frame did not arrive within {0:?}")]
    Stalled(Duration),
    /// The peer did not take a written frame within the bound.
    #[error("the peer did not take the frame within {0:?}")]
    WriteStalled(Duration),
    /// A payload came with a message that carries none.
    #[error("a {kind} message carries no payload, this one announced {len} bytes")]
    UnexpectedPayload {
        /// The message's kind.
        kind: &'static str,
        /// The announced payload length.
        len: u32,
    },
}

/// Reads one frame within `limits`. A clean end of stream before the first
/// byte is [`FrameError::Closed`]; inside a frame, [`FrameError::Truncated`].
pub async fn read_frame<M: Message, R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &ReadLimits,
) -> Result<Frame<M>, StreamError> {
    let mut head = [0u8; HEADER_LEN];
    let first = match limits.first_byte {
        Some(wait) => timeout(wait, r.read(&mut head))
            .await
            .map_err(|_| StreamError::Idle(wait))?,
        None => r.read(&mut head).await,
    }
    .map_err(FrameError::Io)?;
    if first == 0 {
        return Err(FrameError::Closed.into());
    }
    let deadline = Instant::now() + limits.rest;
    fill(r, &mut head, first, deadline, limits.rest).await?;
    let header = FrameHeader::parse(head)?;
    if header.message_len > limits.max_message {
        return Err(FrameError::MessageTooLarge {
            len: header.message_len,
            max: limits.max_message,
        }
        .into());
    }
    if header.payload_len > limits.max_payload {
        return Err(FrameError::PayloadTooLarge {
            len: header.payload_len,
            max: limits.max_payload,
        }
        .into());
    }
    let mut json = vec![0u8; to_len(header.message_len)?];
    fill(r, &mut json, 0, deadline, limits.rest).await?;
    let message: M = frame::decode_message_tamed(&json, limits.taming.as_ref())?;
    if header.payload_len > 0 && !message.payload_allowed() {
        return Err(StreamError::UnexpectedPayload {
            kind: message.kind(),
            len: header.payload_len,
        });
    }
    let mut payload = vec![0u8; to_len(header.payload_len)?];
    fill(r, &mut payload, 0, deadline, limits.rest).await?;
    Ok(Frame { message, payload })
}

fn to_len(len: u32) -> Result<usize, FrameError> {
    usize::try_from(len).map_err(|_| FrameError::Malformed(format!("length {len} too large")))
}

/// Fills `buf` from `filled` on, by `deadline`.
async fn fill<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
    mut filled: usize,
    deadline: Instant,
    bound: Duration,
) -> Result<(), StreamError> {
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else {
            break;
        };
        match timeout_at(deadline, r.read(rest)).await {
            Err(_) => return Err(StreamError::Stalled(bound)),
            Ok(Ok(0)) => {
                return Err(FrameError::Truncated {
                    expected: buf.len(),
                    got: filled,
                }
                .into())
            }
            Ok(Ok(n)) => filled += n,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(FrameError::Io(e).into()),
        }
    }
    Ok(())
}

/// Writes one frame within `within`. The payload is written after the
/// message rather than copied into one buffer with it (a screenshot is the
/// largest thing a peer holds). Lengths are checked before a byte is
/// written, so a [`FrameError::MessageTooLarge`] or
/// [`FrameError::PayloadTooLarge`] leaves the stream usable.
pub async fn write_frame<M: Message, W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &M,
    payload: &[u8],
    within: Duration,
) -> Result<(), StreamError> {
    let head = frame::encode_head(message, payload.len())?;
    let write = async {
        w.write_all(&head).await?;
        if !payload.is_empty() {
            w.write_all(payload).await?;
        }
        w.flush().await
    };
    match timeout(within, write).await {
        Ok(result) => Ok(result.map_err(FrameError::Io)?),
        Err(_) => Err(StreamError::WriteStalled(within)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::frame_unchecked;
    use crate::{Activity, Request, Response};

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn frames_round_trip_with_their_payload() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let shot = Response::Screenshot {
            width: 3,
            height: 2,
            format: crate::image::ImageFormat::Png,
        };
        write_frame(&mut a, &shot, b"\x89PNG", WAIT)
            .await
            .expect("write");
        write_frame(&mut a, &Request::Quiesce { timeout_ms: 9 }, &[], WAIT)
            .await
            .expect("write");
        let got: Frame<Response> = read_frame(&mut b, &ReadLimits::new(Some(WAIT), WAIT))
            .await
            .expect("read");
        assert_eq!(got.message, shot);
        assert_eq!(got.payload, b"\x89PNG");
        let got: Frame<Request> = read_frame(&mut b, &ReadLimits::new(Some(WAIT), WAIT))
            .await
            .expect("read");
        assert_eq!(got.message, Request::Quiesce { timeout_ms: 9 });
        drop(a);
        assert!(matches!(
            read_frame::<Request, _>(&mut b, &ReadLimits::new(None, WAIT)).await,
            Err(StreamError::Frame(FrameError::Closed))
        ));
    }

    #[tokio::test]
    async fn a_payload_on_a_message_without_one_is_refused_before_reading_it() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let activity = Response::Activity(Activity {
            input_idle_ms: None,
            busy: false,
            busy_processes: vec![],
        });
        // Announces a payload it never sends: refused on the message alone.
        let bytes = frame::encode_head(&activity, 1000).expect("head");
        a.write_all(&bytes).await.expect("write");
        let err = read_frame::<Response, _>(&mut b, &ReadLimits::new(Some(WAIT), WAIT))
            .await
            .expect_err("refused");
        assert!(
            matches!(
                err,
                StreamError::UnexpectedPayload {
                    kind: "activity",
                    len: 1000
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_readers_own_limits_apply_to_the_header() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&frame_unchecked(br#"{"v":1,"kind":"hello"}"#, b"xy"))
            .await
            .expect("write");
        let limits = ReadLimits {
            max_message: 8,
            ..ReadLimits::new(Some(WAIT), WAIT)
        };
        assert!(matches!(
            read_frame::<Request, _>(&mut b, &limits).await,
            Err(StreamError::Frame(FrameError::MessageTooLarge {
                max: 8,
                ..
            }))
        ));
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&frame_unchecked(br#"{"v":1,"kind":"hello"}"#, b"xy"))
            .await
            .expect("write");
        let limits = ReadLimits {
            max_payload: 0,
            ..ReadLimits::new(Some(WAIT), WAIT)
        };
        assert!(matches!(
            read_frame::<Request, _>(&mut b, &limits).await,
            Err(StreamError::Frame(FrameError::PayloadTooLarge {
                len: 2,
                max: 0
            }))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_and_trickling_meet_their_deadlines() {
        let (_a, mut b) = tokio::io::duplex(64);
        assert!(matches!(
            read_frame::<Request, _>(&mut b, &ReadLimits::new(Some(WAIT), WAIT)).await,
            Err(StreamError::Idle(_))
        ));
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[0, 0, 0]).await.expect("partial");
        assert!(matches!(
            read_frame::<Request, _>(&mut b, &ReadLimits::new(Some(WAIT), WAIT)).await,
            Err(StreamError::Stalled(_))
        ));
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[0, 0]).await.expect("partial");
        drop(a);
        assert!(matches!(
            read_frame::<Request, _>(&mut b, &ReadLimits::new(Some(WAIT), WAIT)).await,
            Err(StreamError::Frame(FrameError::Truncated {
                expected: 8,
                got: 2
            }))
        ));
    }
}
