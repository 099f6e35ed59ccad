//! Commands in a computer: `POST /v1/computers/{id}/exec` and the terminal
//! WebSocket `GET /v1/computers/{id}/exec/ws`.
//!
//! It owns the client side of the terminal's framing (binary messages are
//! terminal bytes, text messages JSON [`TerminalMessage`]s) and nothing
//! else: it never interprets what goes through the terminal. Dropping a
//! [`Terminal`] (or both of its halves) closes the socket, which kills the
//! session's processes in the desktop.

use std::pin::Pin;
use std::time::Duration;

use dormouse_protocol::api::{ApiError as ApiErrorBody, GENERATION_HEADER};
use dormouse_protocol::exec::{ExecRequest, ExecResultBody, TerminalMessage, MAX_PTY_DATA};
use futures_util::{Sink, SinkExt as _, Stream, StreamExt as _};
use tokio::net::UnixStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};
use uuid::Uuid;

use crate::endpoint::Endpoint;
use crate::error::{EventsError, SetupError};
use crate::{computer, Client, Error, Method};

/// Time the broker may take beyond a command's own timeout to confirm it
/// ended (the guest's kill bound and margins).
pub const EXEC_MARGIN: Duration = Duration::from_secs(30);

type WsError = tungstenite::Error;
type BoxSink = Pin<Box<dyn Sink<Message, Error = WsError> + Send>>;
type BoxStream = Pin<Box<dyn Stream<Item = Result<Message, WsError>> + Send>>;

/// What the terminal sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    /// Terminal output.
    Output(Vec<u8>),
    /// The session ended, every process of it confirmed gone.
    Exit {
        /// Exit code; `None` when a signal ended it.
        exit_code: Option<i32>,
        /// The signal that ended it.
        signal: Option<String>,
        /// How long it lasted.
        duration_ms: u64,
    },
    /// The session failed.
    Error {
        /// Stable code.
        code: String,
        /// For people.
        message: String,
    },
}

/// An open terminal session: the two halves of its WebSocket.
pub struct Terminal {
    /// Keystrokes, resizes, close.
    pub input: TerminalInput,
    /// Output and the end.
    pub output: TerminalOutput,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal").finish_non_exhaustive()
    }
}

/// The sending half of a [`Terminal`].
pub struct TerminalInput {
    sink: BoxSink,
}

/// The receiving half of a [`Terminal`].
pub struct TerminalOutput {
    stream: BoxStream,
    ended: bool,
}

impl std::fmt::Debug for TerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalInput").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TerminalOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalOutput")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl TerminalInput {
    /// Sends keystrokes (split into frames of at most 64 KiB).
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), EventsError> {
        for chunk in bytes.chunks(MAX_PTY_DATA) {
            self.sink
                .send(Message::Binary(chunk.to_vec().into()))
                .await?;
        }
        Ok(())
    }

    /// Tells the terminal its new size.
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), EventsError> {
        self.control(&TerminalMessage::Resize { rows, cols }).await
    }

    /// Ends the session; [`TerminalEvent::Exit`] follows on the output.
    pub async fn close(&mut self) -> Result<(), EventsError> {
        self.control(&TerminalMessage::Close).await
    }

    async fn control(&mut self, message: &TerminalMessage) -> Result<(), EventsError> {
        let text = serde_json::to_string(message).map_err(EventsError::Decode)?;
        self.sink.send(Message::Text(text.into())).await?;
        Ok(())
    }
}

impl TerminalOutput {
    /// The next event; `Ok(None)` once the socket closed.
    pub async fn next(&mut self) -> Result<Option<TerminalEvent>, EventsError> {
        while !self.ended {
            match self.stream.next().await {
                Some(Ok(Message::Binary(bytes))) => {
                    return Ok(Some(TerminalEvent::Output(bytes.to_vec())))
                }
                Some(Ok(Message::Text(text))) => {
                    let event =
                        match serde_json::from_str(text.as_str()).map_err(EventsError::Decode)? {
                            TerminalMessage::Exit {
                                exit_code,
                                signal,
                                duration_ms,
                            } => TerminalEvent::Exit {
                                exit_code,
                                signal,
                                duration_ms,
                            },
                            TerminalMessage::Error { code, message } => {
                                TerminalEvent::Error { code, message }
                            }
                            TerminalMessage::Resize { .. } | TerminalMessage::Close => continue,
                        };
                    return Ok(Some(event));
                }
                Some(Ok(Message::Close(_))) | None => self.ended = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    self.ended = true;
                    return Err(e.into());
                }
            }
        }
        Ok(None)
    }
}

impl Client {
    /// `POST /v1/computers/{id}/exec[?encoding=base64]`: runs a command to
    /// its confirmed end (fenced). The request's bound is the command's
    /// timeout plus [`EXEC_MARGIN`].
    pub async fn exec(
        &self,
        id: Uuid,
        request: &ExecRequest,
        base64: bool,
    ) -> Result<ExecResultBody, Error> {
        let query = if base64 { "?encoding=base64" } else { "" };
        let path = computer(id, &format!("/exec{query}"));
        let wait = Duration::from_millis(request.timeout_ms) + EXEC_MARGIN;
        self.call_within(Method::POST, &path, Some(request), wait)
            .await
    }

    /// `GET /v1/computers/{id}/exec/ws`: an interactive process on a
    /// pseudo-terminal of `rows` × `cols` (the login shell when `argv` is
    /// empty), fenced like every mutating call.
    pub async fn exec_ws(
        &self,
        id: Uuid,
        rows: u16,
        cols: u16,
        argv: &[String],
    ) -> Result<Terminal, Error> {
        let mut query = format!("?rows={rows}&cols={cols}");
        for arg in argv {
            query.push_str("&argv=");
            query.push_str(&percent(arg));
        }
        let path = computer(id, &format!("/exec/ws{query}"));
        let mut request = self
            .endpoint
            .ws_url(&path)
            .into_client_request()
            .map_err(EventsError::from)?;
        if let Some(token) = &self.token {
            let auth = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| SetupError::InvalidToken)?;
            request.headers_mut().insert("Authorization", auth);
        }
        if let Some(generation) = self.generation {
            if let Ok(value) = HeaderValue::from_str(&generation.to_string()) {
                request.headers_mut().insert(GENERATION_HEADER, value);
            }
        }
        let connecting = async {
            match &*self.endpoint {
                Endpoint::Http { .. } => {
                    tokio_tungstenite::connect_async(request)
                        .await
                        .map(|(ws, _)| {
                            let (sink, stream) = ws.split();
                            (Box::pin(sink) as BoxSink, Box::pin(stream) as BoxStream)
                        })
                }
                Endpoint::Unix(socket) => {
                    let stream = UnixStream::connect(socket).await.map_err(WsError::Io)?;
                    tokio_tungstenite::client_async(request, stream)
                        .await
                        .map(|(ws, _)| {
                            let (sink, stream) = ws.split();
                            (Box::pin(sink) as BoxSink, Box::pin(stream) as BoxStream)
                        })
                }
            }
        };
        let (sink, stream) = tokio::time::timeout(self.connect_timeout * 3, connecting)
            .await
            .map_err(|_| EventsError::ConnectTimeout)?
            .map_err(|e| refused(e, &path))?;
        Ok(Terminal {
            input: TerminalInput { sink },
            output: TerminalOutput {
                stream,
                ended: false,
            },
        })
    }
}

/// A refused handshake as the API error it carries, when it carries one.
fn refused(e: WsError, path: &str) -> Error {
    if let WsError::Http(response) = &e {
        let body = response.body().as_deref().unwrap_or_default();
        if let Ok(api) = serde_json::from_slice::<ApiErrorBody>(body) {
            if let Ok(status) = crate::StatusCode::from_u16(response.status().as_u16()) {
                return Error::Api {
                    method: Method::GET,
                    path: path.to_owned(),
                    status,
                    code: api.error.code,
                    message: api.error.message,
                };
            }
        }
    }
    Error::Events(e.into())
}

/// `text` percent-encoded for a query value (unreserved characters kept).
fn percent(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(percent("ls -l /tmp&x=1"), "ls%20-l%20%2Ftmp%26x%3D1");
        assert_eq!(percent("é"), "%C3%A9");
    }
}
