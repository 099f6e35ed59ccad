//! What can go wrong talking to a broker, typed so that callers can act on
//! it: the API's own refusal (status, code, message), an answer outside the
//! contract, no answer at all, or a broken event stream.
//!
//! It owns the error types and nothing else; it never retries and never
//! flattens a cause into a string.

use reqwest::{Method, StatusCode};
use tokio_tungstenite::tungstenite;

use crate::endpoint::EndpointError;

/// Longest part of an unexpected answer's body kept in an error.
pub(crate) const MAX_BODY_IN_ERROR: usize = 4096;

/// A failed call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker refused with the API's JSON error body.
    #[error("{method} {path}: {code}: {message}")]
    Api {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// HTTP status.
        status: StatusCode,
        /// The API's stable code (`not_found`, `stale_generation`, ...).
        code: String,
        /// Its message, for people (from the broker: may hold anything).
        message: String,
    },
    /// An error status whose body is not the API's error object (a proxy,
    /// or not a Dormouse broker).
    #[error("{method} {path}: unexpected answer {status}")]
    UnexpectedStatus {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// HTTP status.
        status: StatusCode,
        /// The body as text, cut at 4 KiB.
        body: String,
    },
    /// No HTTP answer (refused, reset, timed out) or a body that could not
    /// be read.
    #[error("{method} {path}: no answer from the broker")]
    Transport {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// The transport's error.
        #[source]
        source: reqwest::Error,
    },
    /// A successful answer that does not parse as the API says.
    #[error("{method} {path}: the answer does not match the API")]
    Decode {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A local reader or writer failed while streaming a body (an export
    /// into a file, say).
    #[error("{method} {path}: local I/O")]
    Io {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The answer's body is longer than the caller can take: it was
    /// refused at its first byte past `limit` (or by its `Content-Length`),
    /// the rest never read.
    #[error("{method} {path}: the answer is over the limit of {limit} bytes")]
    TooLarge {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// The bound it went past.
        limit: u64,
    },
    /// The `/v1/events` stream.
    #[error("event stream")]
    Events(#[from] EventsError),
    /// The client could not be built.
    #[error(transparent)]
    Setup(#[from] SetupError),
}

impl Error {
    /// The HTTP status, when the broker answered one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Api { status, .. } | Self::UnexpectedStatus { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The API's error code, when the broker refused with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the broker could not be reached at all.
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Transport { .. })
    }
}

/// What went wrong on `/v1/events`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventsError {
    /// The connection to a unix socket failed.
    #[error("cannot connect to {path}")]
    Connect {
        /// The socket.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The WebSocket handshake, a read, or the connection failed (boxed:
    /// the WebSocket's error is large and errors travel by value).
    #[error(transparent)]
    WebSocket(Box<tungstenite::Error>),
    /// A message that is not a [`BrokerEvent`](dormouse_protocol::api::BrokerEvent).
    #[error("unexpected event")]
    Decode(#[source] serde_json::Error),
    /// Connecting took longer than the client's connect timeout.
    #[error("connecting timed out")]
    ConnectTimeout,
}

impl From<tungstenite::Error> for EventsError {
    fn from(e: tungstenite::Error) -> Self {
        Self::WebSocket(Box::new(e))
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The address.
    #[error("broker address")]
    Endpoint(#[from] EndpointError),
    /// The token cannot be sent as a header value.
    #[error("the token is not a valid header value")]
    InvalidToken,
    /// The HTTP client refused its settings.
    #[error("cannot set up the HTTP client")]
    Http(#[source] reqwest::Error),
}
