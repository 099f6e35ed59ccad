//! The `/v1/events` WebSocket: every computer's status on connect, then
//! every change, decoded into [`BrokerEvent`]s.
//!
//! It owns one connection, over TCP or a unix socket. It never reconnects on
//! its own (a new connection starts with a fresh snapshot, which the caller
//! must know about) and never sends anything but the protocol's own replies.

use std::time::Duration;

use dormouse_protocol::api::BrokerEvent;
use futures_util::{FutureExt as _, StreamExt as _};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::endpoint::Endpoint;
use crate::error::{EventsError, SetupError};
use crate::Error;

/// The path of the stream.
pub(crate) const EVENTS_PATH: &str = "/v1/events";

/// One open socket, whichever transport carries it.
#[derive(Debug)]
enum Socket {
    Tcp(WebSocketStream<MaybeTlsStream<TcpStream>>),
    Unix(WebSocketStream<UnixStream>),
}

impl Socket {
    async fn next(&mut self) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
        match self {
            Self::Tcp(ws) => ws.next().await,
            Self::Unix(ws) => ws.next().await,
        }
    }

    fn next_now(
        &mut self,
    ) -> Option<Option<Result<Message, tokio_tungstenite::tungstenite::Error>>> {
        match self {
            Self::Tcp(ws) => ws.next().now_or_never(),
            Self::Unix(ws) => ws.next().now_or_never(),
        }
    }
}

/// The decoded `/v1/events` stream. Once it has ended (the broker closed it,
/// or it failed) it stays ended: [`EventStream::next`] answers `Ok(None)`.
#[derive(Debug)]
pub struct EventStream {
    socket: Option<Socket>,
}

impl EventStream {
    /// Connects and authenticates with the `Authorization` header.
    pub(crate) async fn connect(
        endpoint: &Endpoint,
        token: Option<&str>,
        connect_timeout: Duration,
    ) -> Result<Self, Error> {
        let mut request = endpoint
            .ws_url(EVENTS_PATH)
            .into_client_request()
            .map_err(EventsError::from)?;
        if let Some(token) = token {
            let auth = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| SetupError::InvalidToken)?;
            request.headers_mut().insert("Authorization", auth);
        }
        let connecting = async {
            match endpoint {
                Endpoint::Http { .. } => tokio_tungstenite::connect_async(request)
                    .await
                    .map(|(ws, _)| Socket::Tcp(ws))
                    .map_err(EventsError::from),
                Endpoint::Unix(path) => {
                    let stream =
                        UnixStream::connect(path)
                            .await
                            .map_err(|source| EventsError::Connect {
                                path: path.clone(),
                                source,
                            })?;
                    tokio_tungstenite::client_async(request, stream)
                        .await
                        .map(|(ws, _)| Socket::Unix(ws))
                        .map_err(EventsError::from)
                }
            }
        };
        let socket = tokio::time::timeout(connect_timeout, connecting)
            .await
            .map_err(|_| EventsError::ConnectTimeout)??;
        Ok(Self {
            socket: Some(socket),
        })
    }

    /// The next event; `Ok(None)` once the broker has closed the stream.
    /// Pings and other control frames are handled underneath. After a
    /// WebSocket error the stream is ended; after a message that does not
    /// decode it goes on.
    pub async fn next(&mut self) -> Result<Option<BrokerEvent>, EventsError> {
        loop {
            let Some(socket) = self.socket.as_mut() else {
                return Ok(None);
            };
            let message = socket.next().await;
            if let Some(event) = self.take(message)? {
                return Ok(Some(event));
            }
        }
    }

    /// The next event that has already arrived, without waiting: `Ok(None)`
    /// when nothing is buffered (or the stream has ended).
    pub fn next_buffered(&mut self) -> Result<Option<BrokerEvent>, EventsError> {
        loop {
            let Some(socket) = self.socket.as_mut() else {
                return Ok(None);
            };
            let Some(message) = socket.next_now() else {
                return Ok(None);
            };
            if let Some(event) = self.take(message)? {
                return Ok(Some(event));
            }
        }
    }

    /// Whether the stream may still deliver.
    pub fn is_open(&self) -> bool {
        self.socket.is_some()
    }

    /// Ends the stream (the connection is dropped).
    pub fn close(&mut self) {
        self.socket = None;
    }

    /// Decodes one received item; `Ok(None)` for frames that carry no event
    /// (and when the stream ended, which also forgets the socket).
    fn take(
        &mut self,
        message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    ) -> Result<Option<BrokerEvent>, EventsError> {
        match message {
            Some(Ok(Message::Text(text))) => serde_json::from_str(text.as_str())
                .map(Some)
                .map_err(EventsError::Decode),
            Some(Ok(Message::Close(_))) | None => {
                self.socket = None;
                Ok(None)
            }
            Some(Ok(_)) => Ok(None),
            Some(Err(e)) => {
                self.socket = None;
                Err(EventsError::from(e))
            }
        }
    }
}
