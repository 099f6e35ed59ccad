//! Handlers of `POST /v1/computers/{id}/exec` and the terminal WebSocket
//! `GET /v1/computers/{id}/exec/ws`.
//!
//! They parse and answer; admission, the fence and the guest call are the
//! relay's ([`dormouse_core::relay`]): one admission, then the call on a connection
//! of this handler's own task. The handler's own future carries the
//! command: when the HTTP client goes away, hyper drops it, the guest
//! connection closes and the supervisor kills the command and confirms it
//! gone. The WebSocket's end does the same for a terminal, and so does a
//! lease takeover (the ticket's revocation).
//!
//! The terminal WebSocket's framing: binary messages are the terminal's
//! bytes (keystrokes from the client, output to it); text messages are JSON
//! [`TerminalMessage`]s (`resize` and `close` from the client, `exit` or
//! `error` as the broker's last message before it closes the socket).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use dormouse_protocol::api::ErrorCode;
use dormouse_protocol::exec::{
    ExecRequest, OutputEncoding, PtyEvent, PtyInput, PtyOpen, TerminalMessage,
    MAX_OUTPUT_BYTES_LIMIT, MAX_PTY_DATA, MAX_STDIN_BYTES,
};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::body::stream_from;
use super::error::HttpError;
use super::extract::{ComputerId, Generation};
use super::ApiState;
use dormouse_core::guest::exec::GuestPty;

/// Largest body of `POST …/exec`: stdin at its bound in base64, with room
/// for the command, its environment and the rest.
pub const EXEC_BODY_LIMIT: usize = MAX_STDIN_BYTES / 3 * 4 + 1024 * 1024;

/// Terminal size when the query names none.
const DEFAULT_ROWS: u16 = 24;
const DEFAULT_COLS: u16 = 80;

/// `POST /v1/computers/{id}/exec[?encoding=base64]`: runs a command to its
/// confirmed end; `200` with its result.
pub async fn exec(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
    Query(query): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let mut encoding = OutputEncoding::Utf8;
    for (key, value) in &query {
        match (key.as_str(), value.as_str()) {
            ("encoding", "base64") => encoding = OutputEncoding::Base64,
            ("encoding", "utf8" | "utf-8") => encoding = OutputEncoding::Utf8,
            ("encoding", _) => {
                return Err(HttpError::bad_request("encoding must be utf8 or base64"))
            }
            _ => return Err(HttpError::bad_request("unknown query parameter")),
        }
    }
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::payload_too_large(EXEC_BODY_LIMIT)
        } else {
            HttpError::bad_request("the request body could not be read")
        }
    })?;
    let request: ExecRequest = serde_json::from_slice(&body)
        .map_err(|e| HttpError::bad_request(format!("malformed exec request: {e}")))?;
    drop(body);
    // A bad request is answered at once, never queued behind the budget.
    request
        .validate()
        .map_err(|e| HttpError::bad_request(e.to_string()))?;
    let room = state.exec_output.reserve(request.max_output_bytes).await?;
    let result = state.broker.exec(id, fence, request).await?;
    // The answer streams from the result; the room is given back once it
    // is sent (or its client went away).
    let body = stream_from(move |w| {
        let written = serde_json::to_writer(w, &result.streamed_body(encoding));
        drop(room);
        written.map_err(std::io::Error::from)
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// What the broker holds of exec output, every exec together: each exec
/// reserves [`RESERVED_PER_OUTPUT_BYTE`] times its `max_output_bytes`
/// (the guest's answer holds both streams, and splitting them copies one)
/// before it runs, and gives it back once its answer is sent. An exec that
/// finds no room waits for it (its command has not started; a client that
/// goes away stops waiting). The default room, [`EXEC_OUTPUT_BUDGET`],
/// holds two execs at the largest cap at once, or forty-two at the default
/// one. The answer is streamed, escaped as it is written, so the JSON (up to
/// six times the output: a NUL is `\u0000`) is never held whole.
#[derive(Debug, Clone)]
pub struct ExecOutputBudget(Arc<Semaphore>);

/// Room for exec output, in bytes (128 MiB).
pub const EXEC_OUTPUT_BUDGET: u64 = 128 << 20;
/// How many bytes an exec reserves per byte of its `max_output_bytes`.
pub const RESERVED_PER_OUTPUT_BYTE: u64 = 3;
/// The semaphore counts KiB.
const PERMIT_BYTES: u64 = 1024;

impl Default for ExecOutputBudget {
    fn default() -> Self {
        Self::new(EXEC_OUTPUT_BUDGET)
    }
}

impl ExecOutputBudget {
    /// Room for `bytes` of exec output (at least one exec at the largest
    /// cap).
    pub fn new(bytes: u64) -> Self {
        let most = RESERVED_PER_OUTPUT_BYTE * MAX_OUTPUT_BYTES_LIMIT;
        let permits = bytes.max(most).div_ceil(PERMIT_BYTES);
        Self(Arc::new(Semaphore::new(
            usize::try_from(permits).unwrap_or(usize::MAX),
        )))
    }

    /// Waits for room for an exec capped at `max_output_bytes` a stream.
    async fn reserve(&self, max_output_bytes: u64) -> Result<OwnedSemaphorePermit, HttpError> {
        let bytes = RESERVED_PER_OUTPUT_BYTE * max_output_bytes.min(MAX_OUTPUT_BYTES_LIMIT);
        let permits = u32::try_from(bytes.div_ceil(PERMIT_BYTES).max(1)).unwrap_or(u32::MAX);
        self.0
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| HttpError::new(ErrorCode::Internal, "the exec output budget is closed"))
    }
}

/// `GET /v1/computers/{id}/exec/ws[?rows=&cols=&argv=…&cwd=&generation=]`: a process on
/// a pseudo-terminal (the desktop user's login shell unless `argv` items
/// are given, one parameter each), carried over a WebSocket.
pub async fn exec_ws(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
    Query(query): Query<Vec<(String, String)>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, HttpError> {
    // A plain GET is told so in the API's own error shape (JSON, code
    // `websocket_required`), as on `/v1/events`, before anything is opened.
    let ws = ws.map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::WebsocketRequired,
            format!("the terminal is a WebSocket: {rejection}"),
        )
    })?;
    let (open, in_query) = terminal_request(&query)?;
    let fence = match (fence, in_query) {
        (Some(_), Some(_)) => {
            return Err(HttpError::bad_request(
                "the generation was given both as a header and as a query parameter",
            ))
        }
        (header, query) => header.or(query),
    };
    let (_opened, pty, ticket) = state.broker.open_terminal(id, fence, open).await?;
    let shutdown = state.shutdown.clone();
    let revoked = ticket.revoked;
    // A browser carries the token as a subprotocol and needs one chosen.
    // A message or frame past the terminal's own bound is refused as its
    // header arrives, before its payload is read (not after axum's 64 MiB
    // default was buffered).
    let ws = ws
        .protocols([crate::auth::EVENTS_SUBPROTOCOL])
        .max_message_size(MAX_PTY_DATA)
        .max_frame_size(MAX_PTY_DATA);
    Ok(ws.on_upgrade(move |socket| bridge(socket, pty, shutdown, revoked)))
}

/// The terminal's parameters, and the generation given as `generation=`
/// (a browser's WebSocket cannot send the `Dormouse-Generation` header).
pub(crate) fn terminal_request(
    query: &[(String, String)],
) -> Result<(PtyOpen, Option<u64>), HttpError> {
    let size = |v: &str, what: &str| {
        v.parse::<u16>()
            .map_err(|_| HttpError::bad_request(format!("{what} must be a number")))
    };
    let mut open = PtyOpen {
        argv: None,
        cwd: None,
        env: BTreeMap::new(),
        rows: DEFAULT_ROWS,
        cols: DEFAULT_COLS,
    };
    let mut generation = None;
    for (key, value) in query {
        match key.as_str() {
            "rows" => open.rows = size(value, "rows")?,
            "cols" => open.cols = size(value, "cols")?,
            "argv" => open.argv.get_or_insert_with(Vec::new).push(value.clone()),
            "cwd" => open.cwd = Some(value.clone()),
            // The token may come as a query parameter (browsers cannot set
            // headers on a WebSocket); the auth layer checked it already.
            "token" => {}
            "generation" if generation.is_none() => {
                generation = Some(
                    Some(value.as_str())
                        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| {
                            HttpError::bad_request("generation must be a non-negative integer")
                        })?,
                );
            }
            "generation" => return Err(HttpError::bad_request("generation was given twice")),
            _ => return Err(HttpError::bad_request("unknown query parameter")),
        }
    }
    open.validate()
        .map_err(|e| HttpError::bad_request(e.to_string()))?;
    Ok((open, generation))
}

/// Moves the terminal both ways until the session ends, the client leaves,
/// the broker stops or the session's generation is fenced off (`revoked`).
/// Returning drops the guest connection, which ends the session in the
/// guest.
// Over 100 lines on purpose: the session's two directions and the
// `select!` that ends it (the client leaves, the session ends, shutdown,
// revocation) share both streams; apart, each helper would need them all.
async fn bridge(
    socket: WebSocket,
    pty: GuestPty,
    shutdown: CancellationToken,
    revoked: CancellationToken,
) {
    let (mut events, mut input) = pty.split();
    let (mut sink, mut stream) = socket.split();
    let to_guest = async {
        while let Some(Ok(message)) = stream.next().await {
            let frame = match message {
                Message::Binary(bytes) => PtyInput::PtyData {
                    data: bytes.to_vec(),
                },
                Message::Text(text) => match serde_json::from_str(text.as_str()) {
                    Ok(TerminalMessage::Resize { rows, cols }) => {
                        PtyInput::PtyResize { rows, cols }
                    }
                    Ok(TerminalMessage::Close) => PtyInput::PtyClose,
                    Ok(_) | Err(_) => {
                        return Some(("bad_message", "not a resize or close message"))
                    }
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if let Err(e) = frame.validate() {
                tracing::debug!(error = %e, "bad terminal message");
                return Some(("bad_message", "terminal size out of range"));
            }
            let closing = frame == PtyInput::PtyClose;
            if input.send(&frame).await.is_err() {
                return None;
            }
            if closing {
                // Keep the guest side open: `pty_exit` is on its way.
                std::future::pending::<()>().await;
            }
        }
        None
    };
    let from_guest = async {
        loop {
            match events.next().await {
                Ok(PtyEvent::PtyOutput { data }) => {
                    if sink.send(Message::Binary(data.into())).await.is_err() {
                        return None;
                    }
                }
                Ok(PtyEvent::PtyExit {
                    exit_code,
                    signal,
                    duration_ms,
                }) => {
                    return Some(TerminalMessage::Exit {
                        exit_code,
                        signal,
                        duration_ms,
                    })
                }
                Err(e) => {
                    tracing::warn!(error = %e, "terminal session ended without a confirmed exit");
                    return Some(TerminalMessage::Error {
                        code: "guest".into(),
                        message: "the session ended without a confirmed exit".into(),
                    });
                }
            }
        }
    };
    let last = tokio::select! {
        refused = to_guest => refused.map(|(code, message)| TerminalMessage::Error {
            code: code.into(),
            message: message.into(),
        }),
        last = from_guest => last,
        () = shutdown.cancelled() => Some(TerminalMessage::Error {
            code: "shutting_down".into(),
            message: "the broker is stopping".into(),
        }),
        () = revoked.cancelled() => Some(TerminalMessage::Error {
            code: "revoked".into(),
            message: "the lease generation of this session was fenced off".into(),
        }),
    };
    // The guest connection goes first: the session ends there whatever the
    // client does next.
    drop(events);
    drop(input);
    if let Some(last) = last {
        if let Ok(text) = serde_json::to_string(&last) {
            let _ = sink.send(Message::Text(text.into())).await;
        }
    }
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "".into(),
        })))
        .await;
}
