//! Accepting on the guest socket and reading its requests: capped
//! connections, bounded frames with deadlines, and the loop that hands each
//! request to the generated dispatcher ([`dormouse_protocol::serve`]) and
//! writes what it answers. It never decides what a request does; that is
//! [`super::dispatch`]'s.

use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::frame::{self, FrameError, FrameHeader, HEADER_LEN};
use dormouse_protocol::stream::{self, ReadLimits, StreamError};
use dormouse_protocol::{After, Request, Response, Served};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{timeout_at, Instant};

use super::dispatch::{write_response, Conn, Service};
use crate::config::Config;
use crate::exec::ExecRunner;
use crate::exec_socket::{ExecService, Reservation, MAX_EXEC_MESSAGE, MAX_EXEC_PAYLOAD};
use crate::status::{QuiesceRequest, StatusCell};

/// Largest request message the supervisor reads. Requests are a few dozen
/// bytes; the protocol's general limit ([`dormouse_protocol::MAX_HEADER_LEN`])
/// would let 64 clients pin 16 MiB of a 4 MiB supervisor. Only `exec`,
/// `pty_open` and `actions` (a batch carries up to
/// [`dormouse_protocol::actions::MAX_BATCH_TEXT_BYTES`] of text) may be larger (up to [`MAX_EXEC_MESSAGE`], stdin up to
/// [`MAX_EXEC_PAYLOAD`]), and only within the exec budget, reserved from
/// the frame's header before its body is read.
pub const MAX_REQUEST_LEN: u32 = 4 * 1024;

/// Accepts until dropped. Connections live in a [`JoinSet`] owned here, so
/// dropping this future ends them all.
pub async fn accept_loop(
    listener: &UnixListener,
    config: Arc<Config>,
    cell: StatusCell,
    quiesce: mpsc::Sender<QuiesceRequest>,
    exec: ExecRunner,
    egress: crate::egress::Hub,
) {
    let config_max = config.socket_max_connections;
    let shared = Arc::new(Service {
        config,
        cell,
        quiesce,
        exec: ExecService::new(exec),
        egress,
    });
    accept_capped(
        listener,
        config_max,
        "guest socket",
        move |stream, slot| {
            let shared = Arc::clone(&shared);
            async move { serve_connection(stream, slot, &shared).await }
        },
        refuse_busy,
    )
    .await;
}

/// Accepts on `listener` until dropped, serving at most `max` connections
/// at once with `serve`, each in a [`JoinSet`] owned here (dropping this
/// future ends them all). `serve` is handed the connection's slot and holds
/// it while it needs it (an egress connection gives it back once parked). An over-limit client is given to `refuse`, then
/// closed; a failed accept (EMFILE and friends) backs off briefly instead
/// of spinning, as the condition clears when connections end.
pub async fn accept_capped<F, Fut>(
    listener: &UnixListener,
    max: usize,
    what: &'static str,
    serve: F,
    refuse: impl Fn(&UnixStream),
) where
    F: Fn(UnixStream, OwnedSemaphorePermit) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max.max(1)));
    let mut connections = JoinSet::new();
    let mut accept_errors = 0u32;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_errors = 0;
                    match Arc::clone(&slots).try_acquire_owned() {
                        Ok(permit) => {
                            connections.spawn(serve(stream, permit));
                        }
                        Err(_) => {
                            tracing::warn!(socket = what, "connection limit reached; refusing a client");
                            refuse(&stream);
                        }
                    }
                }
                Err(e) => {
                    accept_errors = accept_errors.saturating_add(1);
                    let pause = Duration::from_millis(10u64 << accept_errors.min(6));
                    tracing::warn!(socket = what, error = %e, ?pause, "accept failed");
                    tokio::time::sleep(pause).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Tells an over-limit client why it is closed, without ever waiting on it.
fn refuse_busy(stream: &UnixStream) {
    if let Ok(bytes) = frame::encode(
        &Response::error("busy", "too many connections; try again"),
        &[],
    ) {
        // A fresh socket's send buffer is empty, so this either writes the
        // whole small frame or nothing; never blocks.
        let _ = stream.try_write(&bytes);
    }
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("requests carry no payload, this one announced {0} bytes")]
    UnexpectedPayload(u32),
    #[error("the rest of the frame did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("the memory for running commands is in use; try again")]
    Busy,
}

impl ReadError {
    /// The stable code sent in [`Response::Error`].
    fn code(&self) -> &'static str {
        match self {
            Self::Frame(FrameError::MessageTooLarge { .. }) => "message_too_large",
            Self::Frame(FrameError::PayloadTooLarge { .. }) | Self::UnexpectedPayload(_) => {
                "payload_too_large"
            }
            Self::Frame(FrameError::UnsupportedVersion { .. }) => "unsupported_version",
            Self::Frame(FrameError::UnknownKind(_)) => "unknown_kind",
            Self::Frame(FrameError::Truncated { .. }) => "truncated",
            Self::Timeout(_) => "timeout",
            Self::Busy => "busy",
            Self::Frame(_) => "bad_frame",
        }
    }
}

/// One request as read: the message, its payload, and the budget held for
/// a large frame.
type Incoming = (Request, Vec<u8>, Option<Reservation>);

/// Reads one request. `Ok(None)`: the client hung up between frames or was
/// silent for the whole idle timeout.
///
/// The header is read first: a frame over [`MAX_REQUEST_LEN`] or with a
/// payload is read only within the exec budget (refused `busy` when it is
/// spent), and must then turn out to be `exec`, `pty_open` or `actions`.
async fn read_request<R: AsyncRead + Unpin>(
    r: &mut R,
    idle: Duration,
    io: Duration,
    exec: &ExecService,
) -> Result<Option<Incoming>, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    let first = match tokio::time::timeout(idle, r.read(&mut head)).await {
        Err(_) | Ok(Ok(0)) => return Ok(None),
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(FrameError::Io(e).into()),
    };
    // From the first byte on, the whole frame has one deadline: a client
    // cannot trickle bytes to hold the connection.
    let deadline = Instant::now() + io;
    if let Some(rest) = head.get_mut(first..) {
        match timeout_at(deadline, r.read_exact(rest)).await {
            Err(_) => return Err(ReadError::Timeout(io)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(FrameError::Truncated {
                    expected: HEADER_LEN,
                    got: first,
                }
                .into())
            }
            Ok(Err(e)) => return Err(FrameError::Io(e).into()),
        }
    }
    let header = FrameHeader::parse(head)?;
    let large = header.message_len > MAX_REQUEST_LEN || header.payload_len > 0;
    let hold = if large {
        if header.message_len > MAX_EXEC_MESSAGE {
            return Err(FrameError::MessageTooLarge {
                len: header.message_len,
                max: MAX_EXEC_MESSAGE,
            }
            .into());
        }
        if header.payload_len > MAX_EXEC_PAYLOAD {
            return Err(ReadError::UnexpectedPayload(header.payload_len));
        }
        let bytes = u64::from(header.message_len) + u64::from(header.payload_len);
        Some(exec.reserve(bytes).ok_or(ReadError::Busy)?)
    } else {
        None
    };
    let limits = ReadLimits {
        max_message: if large {
            MAX_EXEC_MESSAGE
        } else {
            MAX_REQUEST_LEN
        },
        max_payload: if large { MAX_EXEC_PAYLOAD } else { 0 },
        ..ReadLimits::new(Some(io), deadline.saturating_duration_since(Instant::now()))
    };
    let mut whole = (&head[..]).chain(&mut *r);
    match stream::read_frame::<Request, _>(&mut whole, &limits).await {
        Ok(frame) => {
            let may_be_large = matches!(
                frame.message,
                Request::Exec(_) | Request::PtyOpen(_) | Request::Actions { .. }
            );
            if header.message_len > MAX_REQUEST_LEN && !may_be_large {
                return Err(FrameError::MessageTooLarge {
                    len: header.message_len,
                    max: MAX_REQUEST_LEN,
                }
                .into());
            }
            Ok(Some((frame.message, frame.payload, hold)))
        }
        Err(StreamError::Idle(_) | StreamError::Frame(FrameError::Closed)) => Ok(None),
        Err(StreamError::Frame(e)) => Err(e.into()),
        Err(StreamError::Stalled(_) | StreamError::WriteStalled(_)) => Err(ReadError::Timeout(io)),
        Err(StreamError::UnexpectedPayload { len, .. }) => Err(ReadError::UnexpectedPayload(len)),
    }
}

/// Serves one connection: reads a request, hands it to the table's
/// dispatcher, writes an `answer` request's reply, and goes on until the
/// client hangs up, a frame is bad, or a request served on the connection
/// closes it.
async fn serve_connection(stream: UnixStream, slot: OwnedSemaphorePermit, service: &Service) {
    let idle = Duration::from_millis(service.config.socket_idle_timeout_ms);
    let io = Duration::from_millis(service.config.socket_io_timeout_ms);
    let (rd, wr) = stream.into_split();
    let mut conn = Conn {
        rd,
        wr,
        io,
        reservation: None,
        slot: Some(slot),
    };
    loop {
        let incoming = read_request(&mut conn.rd, idle, io, &service.exec).await;
        let (request, payload, hold) = match incoming {
            Ok(Some(incoming)) => incoming,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "closing a guest socket client after a bad frame");
                let reply = Response::error(e.code(), e.to_string());
                let _ = write_response(&mut conn.wr, &reply, &[], io).await;
                return;
            }
        };
        // Held while the request is served (a request served on the
        // connection may take it over), released after its answer.
        conn.reservation = hold;
        let (response, payload) =
            match dormouse_protocol::serve(service, request, payload, &mut conn).await {
                Served::Answer(response, payload) => (response, payload),
                Served::Done(After::Continue) => continue,
                Served::Done(After::Close) => return,
            };
        let written = write_response(&mut conn.wr, &response, &payload, io).await;
        conn.reservation = None;
        match written {
            Ok(()) => {}
            // Refused before a byte was written: the client can still be told.
            Err(e @ (FrameError::MessageTooLarge { .. } | FrameError::PayloadTooLarge { .. })) => {
                tracing::warn!(error = %e, "response too large for a frame");
                let reply = Response::error("response_too_large", e.to_string());
                if write_response(&mut conn.wr, &reply, &[], io).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "guest socket client gone");
                return;
            }
        }
    }
}
