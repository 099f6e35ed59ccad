//! A client of the broker's public API as any frontend would speak it: JSON
//! over HTTP with the bearer token, and the `/v1/events` WebSocket.
//!
//! It owns nothing but connections. It never reads the broker's data
//! directory or asks the engine: what it reports is what a frontend sees.

use std::time::Duration;

use dormouse_protocol::api::{
    ApiError, BrokerEvent, ComputerStatus, ContainerState, CreateComputer,
};
use futures_util::{FutureExt, StreamExt};
use reqwest::{Method, StatusCode};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use uuid::Uuid;

/// Longest a single HTTP request may take; a stop quiesces the guest and
/// waits out the engine's stop timeout, so this is generous.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How often [`ApiClient::wait_for`] also asks with a GET, in case an event
/// was lost (a lagging subscriber, a broker restart).
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// What went wrong talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No HTTP answer at all (connection refused, reset, timed out).
    #[error("{method} {path}: no answer: {source}")]
    Transport {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The broker answered with an error status.
    #[error("{method} {path} answered {status}: {code}: {message}")]
    Api {
        /// HTTP method.
        method: Method,
        /// Request path.
        path: String,
        /// HTTP status.
        status: StatusCode,
        /// The API error code (`not_found`, `conflict`, ...), or `?` when the
        /// body was not an API error.
        code: String,
        /// The message, or the raw body.
        message: String,
    },
    /// The answer did not parse as the contract says.
    #[error("{path}: answer does not match the API contract: {detail}")]
    Contract {
        /// Request path.
        path: String,
        /// What did not parse.
        detail: String,
    },
    /// The event WebSocket failed or closed.
    #[error("event stream: {0}")]
    Events(String),
    /// A wait ran out of time.
    #[error("timed out after {waited:?} waiting until {what}; last status seen: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The last status seen, as JSON, for the failure message.
        last: String,
    },
}

impl ClientError {
    /// The HTTP status, when the broker answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the broker could not be reached at all.
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Transport { .. })
    }
}

/// An HTTP client bound to one broker address and token.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// A status that satisfied a wait, and how it was learnt.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The status.
    pub status: ComputerStatus,
    /// When it arrived.
    pub at: Instant,
    /// `true` when it was pushed on `/v1/events`, `false` when a fallback
    /// GET found it.
    pub pushed: bool,
}

impl ApiClient {
    /// A client of the broker listening on `addr` (`host:port`).
    pub fn new(addr: &str, token: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("a plain HTTP client with a timeout always builds");
        Self {
            http,
            base: format!("http://{addr}"),
            token: token.to_owned(),
        }
    }

    /// Sends one request and returns status and body; error statuses become
    /// [`ClientError::Api`].
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(body);
        }
        let transport = |source| ClientError::Transport {
            method: method.clone(),
            path: path.to_owned(),
            source,
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(transport)?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let (code, message) = match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => (e.error.code, e.error.message),
            Err(_) => ("?".to_owned(), String::from_utf8_lossy(&bytes).into_owned()),
        };
        Err(ClientError::Api {
            method,
            path: path.to_owned(),
            status,
            code,
            message,
        })
    }

    async fn send_json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<T, ClientError> {
        let bytes = self.send(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Contract {
            path: path.to_owned(),
            detail: format!("{e}: {}", String::from_utf8_lossy(&bytes)),
        })
    }

    /// `GET /healthz` (no token needed); `true` when it answers 2xx.
    pub async fn healthy(&self) -> bool {
        match self.http.get(format!("{}/healthz", self.base)).send().await {
            Ok(resp) => resp.status().is_success(),
            Err(_) => false,
        }
    }

    /// `POST /v1/computers`.
    pub async fn create(&self, req: &CreateComputer) -> Result<ComputerStatus, ClientError> {
        let body = serde_json::to_value(req).expect("CreateComputer always serializes");
        self.send_json(Method::POST, "/v1/computers", Some(&body))
            .await
    }

    /// `GET /v1/computers`.
    pub async fn list(&self) -> Result<Vec<ComputerStatus>, ClientError> {
        self.send_json(Method::GET, "/v1/computers", None).await
    }

    /// `GET /v1/computers/{id}`.
    pub async fn get(&self, id: Uuid) -> Result<ComputerStatus, ClientError> {
        self.send_json(Method::GET, &format!("/v1/computers/{id}"), None)
            .await
    }

    /// `POST /v1/computers/{id}/start`; returns the status the broker answered
    /// with (it may answer before the desktop is ready).
    pub async fn start(&self, id: Uuid) -> Result<ComputerStatus, ClientError> {
        self.verb(id, "start").await
    }

    /// `POST /v1/computers/{id}/stop`.
    pub async fn stop(&self, id: Uuid) -> Result<ComputerStatus, ClientError> {
        self.verb(id, "stop").await
    }

    /// `POST /v1/computers/{id}/touch`.
    pub async fn touch(&self, id: Uuid) -> Result<ComputerStatus, ClientError> {
        self.verb(id, "touch").await
    }

    /// A `POST` verb on a computer. The status in the answer is read when
    /// there is one; an empty or non-status answer is followed by a GET, so
    /// callers always get the status after the verb.
    async fn verb(&self, id: Uuid, verb: &str) -> Result<ComputerStatus, ClientError> {
        let path = format!("/v1/computers/{id}/{verb}");
        let bytes = self.send(Method::POST, &path, None).await?;
        match serde_json::from_slice::<ComputerStatus>(&bytes) {
            Ok(status) => Ok(status),
            Err(_) => self.get(id).await,
        }
    }

    /// `DELETE /v1/computers/{id}[?purge=true]`.
    pub async fn remove(&self, id: Uuid, purge: bool) -> Result<(), ClientError> {
        let query = if purge { "?purge=true" } else { "" };
        self.send(Method::DELETE, &format!("/v1/computers/{id}{query}"), None)
            .await
            .map(drop)
    }

    /// `GET /v1/computers/{id}/screenshot` (PNG bytes).
    pub async fn screenshot(&self, id: Uuid) -> Result<Vec<u8>, ClientError> {
        self.send(Method::GET, &format!("/v1/computers/{id}/screenshot"), None)
            .await
    }

    /// Opens `GET /v1/events`.
    pub async fn events(&self) -> Result<EventStream, ClientError> {
        let url = format!("{}/v1/events", self.base.replacen("http://", "ws://", 1));
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| ClientError::Events(format!("bad url {url}: {e}")))?;
        let auth = HeaderValue::from_str(&format!("Bearer {}", self.token))
            .map_err(|e| ClientError::Events(format!("token is not a header value: {e}")))?;
        req.headers_mut().insert("authorization", auth);
        let (ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .map_err(|e| ClientError::Events(format!("connect {url}: {e}")))?;
        Ok(EventStream {
            ws: Some(ws),
            trace: None,
        })
    }

    /// Waits until `pred` holds for computer `id`: first by a GET (the state
    /// may already hold), then on pushed events, with a slow GET as a safety
    /// net. A broken event stream degrades to the GET alone; a broker that
    /// stops answering GETs ends the wait with that error.
    pub async fn wait_for(
        &self,
        events: &mut EventStream,
        id: Uuid,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&ComputerStatus) -> bool,
    ) -> Result<Seen, ClientError> {
        let started = Instant::now();
        let deadline = started + timeout;
        // Events already delivered are history: the GET answers with the
        // state now, and anything pushed before that answer is older than it
        // (on loopback the push is in our socket before the GET's answer).
        events.discard_buffered();
        let now = self.get(id).await?;
        events.discard_buffered();
        if pred(&now) {
            return Ok(Seen {
                status: now,
                at: Instant::now(),
                pushed: false,
            });
        }
        let mut last = Some(now);
        let mut poll = tokio::time::interval_at(started + FALLBACK_POLL, FALLBACK_POLL);
        loop {
            tokio::select! {
                event = events.next_event(), if events.is_open() => match event {
                    Ok(BrokerEvent::Status { computer }) if computer.id == id => {
                        if pred(&computer) {
                            return Ok(Seen { status: *computer, at: Instant::now(), pushed: true });
                        }
                        last = Some(*computer);
                    }
                    Ok(_) => {}
                    // The GET below keeps the wait going without events.
                    Err(_) => events.close(),
                },
                _ = poll.tick() => {
                    let status = self.get(id).await?;
                    if pred(&status) {
                        return Ok(Seen { status, at: Instant::now(), pushed: false });
                    }
                    last = Some(status);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(ClientError::Timeout {
                        what: what.to_owned(),
                        waited: started.elapsed(),
                        last: last
                            .map(|s| serde_json::to_string(&s).unwrap_or_default())
                            .unwrap_or_else(|| "none".to_owned()),
                    });
                }
            }
        }
    }

    /// Waits until the desktop is running and its self-probe passed.
    pub async fn wait_ready(
        &self,
        events: &mut EventStream,
        id: Uuid,
        timeout: Duration,
    ) -> Result<Seen, ClientError> {
        self.wait_for(events, id, "ready", timeout, is_ready).await
    }

    /// Waits until the engine reports the container stopped.
    pub async fn wait_stopped(
        &self,
        events: &mut EventStream,
        id: Uuid,
        timeout: Duration,
    ) -> Result<Seen, ClientError> {
        self.wait_for(events, id, "the container is stopped", timeout, |s| {
            s.container == ContainerState::Stopped
        })
        .await
    }
}

/// Running and ready: what a frontend may hand to a user.
pub fn is_ready(status: &ComputerStatus) -> bool {
    status.container == ContainerState::Running && status.ready
}

/// The `/v1/events` WebSocket.
#[derive(Debug)]
pub struct EventStream {
    ws: Option<WebSocketStream<MaybeTlsStream<TcpStream>>>,
    /// When set, every event is printed to stderr with the time since this
    /// instant (for harnesses that need a timeline).
    trace: Option<Instant>,
}

impl EventStream {
    /// Prints every event received from now on to stderr, stamped with the
    /// milliseconds since `epoch`.
    pub fn trace_since(&mut self, epoch: Instant) {
        self.trace = Some(epoch);
    }

    /// Whether the stream still delivers.
    pub fn is_open(&self) -> bool {
        self.ws.is_some()
    }

    /// Forgets the connection (after an error or a broker restart).
    pub fn close(&mut self) {
        self.ws = None;
    }

    /// Drops every event that has already arrived, without waiting.
    pub fn discard_buffered(&mut self) {
        while let Some(ws) = self.ws.as_mut() {
            match ws.next().now_or_never() {
                Some(Some(Ok(Message::Text(text)))) => {
                    if let (Some(epoch), Ok(event)) = (
                        self.trace,
                        serde_json::from_str::<BrokerEvent>(text.as_str()),
                    ) {
                        eprintln!(
                            "  {:>7} ms  (history) {}",
                            epoch.elapsed().as_millis(),
                            summarize(&event)
                        );
                    }
                }
                Some(Some(Ok(_))) => {}
                Some(Some(Err(_)) | None) => self.ws = None,
                None => return,
            }
        }
    }

    /// The next event; pings and other control frames are skipped. Once it
    /// has failed the stream stays closed.
    pub async fn next_event(&mut self) -> Result<BrokerEvent, ClientError> {
        loop {
            let Some(ws) = self.ws.as_mut() else {
                return Err(ClientError::Events("closed".into()));
            };
            let message = match ws.next().await {
                Some(Ok(message)) => message,
                Some(Err(e)) => {
                    self.ws = None;
                    return Err(ClientError::Events(e.to_string()));
                }
                None => {
                    self.ws = None;
                    return Err(ClientError::Events("the broker closed the stream".into()));
                }
            };
            let text = match &message {
                Message::Text(text) => text.as_str(),
                Message::Close(frame) => {
                    self.ws = None;
                    return Err(ClientError::Events(format!(
                        "closed by the broker: {frame:?}"
                    )));
                }
                _ => continue,
            };
            let event = serde_json::from_str(text).map_err(|e| ClientError::Contract {
                path: "/v1/events".into(),
                detail: format!("{e}: {text}"),
            });
            if let (Some(epoch), Ok(event)) = (self.trace, &event) {
                eprintln!(
                    "  {:>7} ms  event {}",
                    epoch.elapsed().as_millis(),
                    summarize(event)
                );
            }
            return event;
        }
    }
}

/// One line about an event, for traces.
pub fn summarize(event: &BrokerEvent) -> String {
    match event {
        BrokerEvent::Status { computer: c } => format!(
            "status {} container={:?} ready={} phase={:?} stop_reason={:?} resumable={} {}",
            c.id,
            c.container,
            c.ready,
            c.phase,
            c.stop_reason,
            c.resumable,
            c.resumable_problem.as_deref().unwrap_or("")
        ),
        BrokerEvent::Removed { id } => format!("removed {id}"),
    }
}
