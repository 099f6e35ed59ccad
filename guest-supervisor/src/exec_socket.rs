//! The guest socket's exec requests, `exec` and `pty_open`, each served on
//! its own connection until the exec is confirmed gone or the session ended.
//!
//! Owns two things: the memory bound of everything the socket runs (a byte
//! budget, reserved before a large request frame is read and before anything
//! is started; over it the answer is `busy`), and what the connection means
//! while an exec runs. For `exec`, the connection's end or any byte from the
//! client is the cancellation (the caller went away), and no idle bound
//! applies. For a terminal session, the connection carries
//! [`PtyInput`] frames in and [`PtyEvent`] frames out, without an idle
//! bound, until `pty_exit`; its end closes the session.
//!
//! It never starts, signals or reaps a process itself (that is
//! [`crate::exec`]'s), and never answers an exec before the runner confirmed
//! its processes gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::exec::{ExecRequest, PtyEvent, PtyInput, PtyOpen, MAX_PTY_DATA};
use dormouse_protocol::guest::PtyOpened;
use dormouse_protocol::stream::{self, ReadLimits, StreamError};
use dormouse_protocol::{Answer as _, FrameError, Response};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::exec::{ExecError, ExecRunner};

/// Memory the socket may hold for execs and sessions at once: request
/// frames, captured output and answers (96 MiB).
pub const EXEC_BUDGET_BYTES: u64 = 96 * 1024 * 1024;
/// Largest JSON part of an `exec` or `pty_open` request (the protocol's
/// limit: `command`, `env` and `cwd` at their bounds fit).
pub const MAX_EXEC_MESSAGE: u32 = dormouse_protocol::MAX_HEADER_LEN;
/// Largest payload of an `exec` request: its stdin
/// ([`dormouse_protocol::exec::MAX_STDIN_BYTES`]).
pub const MAX_EXEC_PAYLOAD: u32 = 8 * 1024 * 1024;
/// Largest JSON part of a [`PtyInput`] frame: 64 KiB of data in base64.
pub const MAX_PTY_MESSAGE: u32 = 128 * 1024;
/// What one terminal session reserves (its frames both ways).
const SESSION_BYTES: u64 = 512 * 1024;
/// Budget accounting is in KiB, so a semaphore's `u32` permits cover it.
const UNIT: u64 = 1024;

/// Execs and sessions of the guest socket: the runner and the budget.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct ExecService {
    runner: ExecRunner,
    budget: Arc<Semaphore>,
    units: u32,
}

/// Bytes of the budget held until dropped.
#[derive(Debug)]
pub struct Reservation {
    _permits: Vec<OwnedSemaphorePermit>,
}

impl Reservation {
    fn join(mut self, other: Reservation) -> Reservation {
        self._permits.extend(other._permits);
        self
    }
}

fn units_of(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT).max(1)
}

impl ExecService {
    /// Serves with `runner` under [`EXEC_BUDGET_BYTES`].
    pub fn new(runner: ExecRunner) -> Self {
        Self::with_budget(runner, EXEC_BUDGET_BYTES)
    }

    /// Serves with `runner` under a budget of `bytes`.
    pub fn with_budget(runner: ExecRunner, bytes: u64) -> Self {
        let units = u32::try_from(units_of(bytes)).unwrap_or(u32::MAX);
        Self {
            runner,
            budget: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Reserves `bytes` of the budget, or `None` when that much is not free
    /// now (the caller answers `busy`, never waits).
    pub fn reserve(&self, bytes: u64) -> Option<Reservation> {
        let units = u32::try_from(units_of(bytes))
            .ok()
            .filter(|u| *u <= self.units)?;
        let permit = Arc::clone(&self.budget)
            .try_acquire_many_owned(units)
            .ok()?;
        Some(Reservation {
            _permits: vec![permit],
        })
    }

    /// Serves one `exec` on its connection: runs it (the connection's end or
    /// any byte cancels it), then writes `exec_result` with stdout and
    /// stderr as the payload, or an error. `frame` is what was reserved for
    /// a large request frame. Returns whether the connection may serve
    /// further requests (not after a cancellation or a failed write).
    pub async fn exec<R, W>(
        &self,
        request: ExecRequest,
        payload: Vec<u8>,
        frame: Option<Reservation>,
        rd: &mut R,
        wr: &mut W,
        io: Duration,
    ) -> bool
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let request = match request.from_frame(payload) {
            Ok(request) => request,
            Err(e) => return write(wr, &Response::error("bad_request", e.to_string()), io).await,
        };
        // The two captured streams and the answer's copy of them.
        let output = request.max_output_bytes.saturating_mul(3);
        let Some(held) = self.reserve(output) else {
            let busy = Response::error("busy", "the memory for running commands is in use");
            return write(wr, &busy, io).await;
        };
        let _held = match frame {
            Some(frame) => frame.join(held),
            None => held,
        };
        let cancelled = AtomicBool::new(false);
        let cancel = async {
            let mut byte = [0u8; 1];
            // End of stream, an error or any byte: the caller is gone or
            // gives up.
            let _ = rd.read(&mut byte).await;
            cancelled.store(true, Ordering::Relaxed);
        };
        let (response, payload) = match self.runner.run(request, cancel).await {
            Ok(finished) => {
                let (head, payload) = finished.result.into_frame();
                (head.into_response(), payload)
            }
            Err(e) => (error_response(&e), Vec::new()),
        };
        let written = stream::write_frame(wr, &response, &payload, io).await;
        if let Err(e) = &written {
            tracing::debug!(error = %e, "exec answer not delivered");
        }
        written.is_ok() && !cancelled.load(Ordering::Relaxed)
    }

    /// Serves one terminal session on its connection, to its end: opens it,
    /// answers `pty_opened`, then moves [`PtyInput`] frames in and
    /// [`PtyEvent`] frames out until the process is gone, the client sends
    /// `pty_close` or goes away; then closes the session (every process of
    /// it confirmed gone) and sends `pty_exit`. The connection ends after.
    pub async fn pty<R, W>(&self, open: PtyOpen, rd: &mut R, wr: &mut W, io: Duration)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let Some(_held) = self.reserve(SESSION_BYTES) else {
            let busy = Response::error("busy", "the memory for running commands is in use");
            let _ = write(wr, &busy, io).await;
            return;
        };
        let session = match self.runner.open_pty(&open).await {
            Ok(session) => session,
            Err(e) => {
                let _ = write(wr, &error_response(&e), io).await;
                return;
            }
        };
        let opened = PtyOpened {
            id: session.id(),
            pid: session.pid(),
        };
        let mut client_there = write(wr, &opened.into_response(), io).await;
        if client_there {
            let output = async {
                let mut buf = vec![0u8; MAX_PTY_DATA];
                loop {
                    match session.read(&mut buf).await {
                        // Every process on the terminal is gone.
                        Ok(0) => return true,
                        Ok(n) => {
                            let data = buf.get(..n).unwrap_or_default().to_vec();
                            let event = PtyEvent::PtyOutput { data };
                            if stream::write_frame(wr, &event, &[], io).await.is_err() {
                                return false;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(session = session.id(), error = %e, "reading the terminal failed");
                            return true;
                        }
                    }
                }
            };
            let input = async {
                let limits = ReadLimits {
                    max_message: MAX_PTY_MESSAGE,
                    max_payload: 0,
                    ..ReadLimits::new(None, io)
                };
                loop {
                    let frame = match stream::read_frame::<PtyInput, _>(rd, &limits).await {
                        Ok(frame) => frame.message,
                        Err(StreamError::Frame(FrameError::Closed | FrameError::Io(_))) => {
                            return false
                        }
                        Err(e) => {
                            tracing::debug!(session = session.id(), error = %e, "bad terminal frame; closing the session");
                            return true;
                        }
                    };
                    if let Err(e) = frame.validate() {
                        tracing::debug!(session = session.id(), error = %e, "bad terminal frame; closing the session");
                        return true;
                    }
                    match frame {
                        PtyInput::PtyData { data } => {
                            if let Err(e) = session.write_all(&data).await {
                                tracing::debug!(session = session.id(), error = %e, "terminal input not taken");
                            }
                        }
                        PtyInput::PtyResize { rows, cols } => {
                            if let Err(e) = session.resize(rows, cols) {
                                tracing::debug!(session = session.id(), error = %e, "resize failed");
                            }
                        }
                        PtyInput::PtyClose => return true,
                    }
                }
            };
            client_there = tokio::select! {
                there = output => there,
                there = input => there,
            };
        }
        let id = session.id();
        match session.close().await {
            Ok(ended) => {
                if client_there {
                    let _ = stream::write_frame(wr, &ended.to_event(), &[], io).await;
                }
            }
            // No `pty_exit`: the client sees the connection end without one,
            // which says the end was not confirmed.
            Err(e) => {
                tracing::error!(session = id, error = %e, "terminal session not confirmed gone")
            }
        }
    }
}

fn error_response(e: &ExecError) -> Response {
    Response::error(e.code(), e.to_string())
}

/// Writes one message without payload; whether it went out.
async fn write<W: AsyncWrite + Unpin>(wr: &mut W, response: &Response, io: Duration) -> bool {
    stream::write_frame(wr, response, &[], io).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_bound_is_the_stdin_bound() {
        assert_eq!(
            usize::try_from(MAX_EXEC_PAYLOAD).ok(),
            Some(dormouse_protocol::exec::MAX_STDIN_BYTES)
        );
    }

    #[test]
    fn the_budget_refuses_beyond_what_is_free() {
        let service =
            ExecService::with_budget(ExecRunner::new(Default::default()), 4 * 1024 * 1024);
        let a = service.reserve(3 * 1024 * 1024).expect("fits");
        assert!(
            service.reserve(2 * 1024 * 1024).is_none(),
            "over the budget"
        );
        assert!(service.reserve(5 * 1024 * 1024).is_none(), "never fits");
        drop(a);
        assert!(service.reserve(4 * 1024 * 1024).is_some(), "freed");
    }
}
