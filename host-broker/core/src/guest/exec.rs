//! The broker's side of the guest's `exec` and `pty_open`: one connection
//! per exec or terminal session, whose lifetime is the caller's.
//!
//! Owns the framing of both on the guest connection (stdin as the request's
//! payload, output as the answer's; [`PtyInput`] out and [`PtyEvent`] in)
//! and the bounds on what the guest sends back. Dropping a connection while
//! an exec or a session runs is how the caller cancels it: the supervisor
//! sees the end and kills and confirms. It never decides whether a desktop
//! may run a command (the owner admits) and never retries.

use std::time::Duration;

use dormouse_protocol::exec::{
    ExecRequest, ExecResult, ExecResultHead, PtyEvent, PtyInput, PtyOpen, MAX_PTY_DATA,
};
use dormouse_protocol::frame::Taming;
use dormouse_protocol::guest::PtyOpened;
use dormouse_protocol::stream::{self, ReadLimits};
use dormouse_protocol::{Call as _, FrameError, Request};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::{sanitize, typed, GuestConnection, GuestError, FRAME_BODY_TIMEOUT, REQUEST_TIMEOUT};

/// Time beyond an exec's own timeout that its answer may take: the guest
/// kills and confirms within 5 s, drains output within 1 s, then writes.
pub const EXEC_KILL_MARGIN: Duration = Duration::from_secs(10);

/// Time to send a request carrying up to 8 MiB of stdin.
const EXEC_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest JSON part of a terminal event (64 KiB of output in base64).
const MAX_PTY_EVENT: u32 = 128 * 1024;

/// What the broker keeps of a terminal event: the base64 output whole (it
/// has no character to escape), every other string as for any guest text.
const PTY_TAMING: Taming = Taming {
    max_bytes: MAX_PTY_DATA.div_ceil(3) * 4 + 4,
    max_items: 32,
};

impl GuestConnection {
    /// Runs `request` in the guest and waits for its confirmed end: up to
    /// its timeout plus [`EXEC_KILL_MARGIN`]. Dropping the future drops the
    /// connection, which cancels the exec in the guest.
    pub async fn exec(mut self, request: ExecRequest) -> Result<ExecResult, GuestError> {
        let wait = Duration::from_millis(request.timeout_ms) + EXEC_KILL_MARGIN;
        // Both streams at their cap, and no more: what the broker holds of
        // an answer is bounded by what was asked, whatever the guest sends.
        let most = u32::try_from(request.max_output_bytes.saturating_mul(2)).unwrap_or(u32::MAX);
        let (head, stdin) = request.into_frame();
        let message = Request::Exec(head);
        stream::write_frame(&mut self.stream, &message, &stdin, EXEC_SEND_TIMEOUT)
            .await
            .map_err(GuestError::from_stream)?;
        drop(stdin);
        let answer = self.receive_bounded(Some(wait), most).await?;
        let kind = <dormouse_protocol::call::Exec as dormouse_protocol::Call>::KIND;
        let head: ExecResultHead = typed(kind, answer.message)?;
        let mut result = head
            .join(answer.payload)
            .map_err(|e| GuestError::Frame(FrameError::Malformed(e.to_string())))?;
        result.signal = result.signal.as_deref().map(sanitize);
        Ok(result)
    }

    /// Opens a terminal session; the connection then belongs to it.
    pub async fn open_pty(mut self, open: PtyOpen) -> Result<(PtyOpened, GuestPty), GuestError> {
        self.send(&Request::PtyOpen(open)).await?;
        let answer = self.receive(Some(REQUEST_TIMEOUT)).await?;
        let opened: PtyOpened = typed(dormouse_protocol::call::PtyOpen::KIND, answer.message)?;
        let (read, write) = self.stream.into_split();
        Ok((opened, GuestPty { read, write }))
    }
}

/// An open terminal session in the guest. Split it to move both directions
/// at once; dropping either half ends the session in the guest (its
/// processes killed and confirmed gone).
#[derive(Debug)]
pub struct GuestPty {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
}

impl GuestPty {
    /// The two directions.
    pub fn split(self) -> (GuestPtyEvents, GuestPtyInput) {
        (
            GuestPtyEvents { read: self.read },
            GuestPtyInput { write: self.write },
        )
    }
}

/// What the guest sends on a session.
#[derive(Debug)]
pub struct GuestPtyEvents {
    read: OwnedReadHalf,
}

impl GuestPtyEvents {
    /// The next event; waits as long as the terminal is quiet. After
    /// `pty_exit` the guest closes the connection.
    pub async fn next(&mut self) -> Result<PtyEvent, GuestError> {
        let limits = ReadLimits {
            max_message: MAX_PTY_EVENT,
            max_payload: 0,
            taming: Some(PTY_TAMING),
            ..ReadLimits::new(None, FRAME_BODY_TIMEOUT)
        };
        let frame = stream::read_frame::<PtyEvent, _>(&mut self.read, &limits)
            .await
            .map_err(GuestError::from_stream)?;
        Ok(match frame.message {
            PtyEvent::PtyOutput { data } if data.len() > MAX_PTY_DATA => {
                return Err(GuestError::Frame(FrameError::Malformed(format!(
                    "{} bytes of terminal output in one frame",
                    data.len()
                ))))
            }
            PtyEvent::PtyExit {
                exit_code,
                signal,
                duration_ms,
            } => PtyEvent::PtyExit {
                exit_code,
                signal: signal.as_deref().map(sanitize),
                duration_ms,
            },
            other => other,
        })
    }
}

/// What the broker sends on a session.
#[derive(Debug)]
pub struct GuestPtyInput {
    write: OwnedWriteHalf,
}

impl GuestPtyInput {
    /// Sends one frame; keystrokes over [`MAX_PTY_DATA`] are split.
    pub async fn send(&mut self, input: &PtyInput) -> Result<(), GuestError> {
        if let PtyInput::PtyData { data } = input {
            for chunk in data.chunks(MAX_PTY_DATA) {
                let part = PtyInput::PtyData {
                    data: chunk.to_vec(),
                };
                stream::write_frame(&mut self.write, &part, &[], REQUEST_TIMEOUT)
                    .await
                    .map_err(GuestError::from_stream)?;
            }
            return Ok(());
        }
        stream::write_frame(&mut self.write, input, &[], REQUEST_TIMEOUT)
            .await
            .map_err(GuestError::from_stream)
    }
}
