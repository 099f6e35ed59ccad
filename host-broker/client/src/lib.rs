//! `dormouse-client`: a typed client of the Dormouse broker's public API,
//! JSON over HTTP with a bearer token, and the `/v1/events` WebSocket, over
//! TCP or a unix socket.
//!
//! It speaks only the API (the types are [`dormouse_protocol::api`]'s): it
//! never reads the broker's state files (only, on request, its token file)
//! and never asks the container engine. Every route is one method of
//! [`Client`], written in one line over [`Client::call`]: a new route is a
//! new method.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dormouse_client::Error> {
//! use dormouse_client::{Client, Endpoint};
//! let endpoint: Endpoint = "http://127.0.0.1:7480".parse().map_err(dormouse_client::SetupError::from)?;
//! let client = Client::builder(endpoint).token("…").build()?;
//! for computer in client.list().await? {
//!     println!("{} {}", computer.id, computer.name);
//! }
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod actions;
mod body;
mod endpoint;
mod error;
mod events;
mod exec;
mod files;
mod screens;
pub mod token;

use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::activity::ActivityPage;
use dormouse_protocol::api::{
    ApiError as ApiErrorBody, ComputerStatus, CreateComputer, LeaseGrant, LeaseRequest, Orphan,
    PatchComputer, GENERATION_HEADER,
};
use dormouse_protocol::egress_policy::{EgressLogPage, EgressPolicy, EgressRefusals};
use dormouse_protocol::image::ImageEncoding;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

pub use body::MAX_ANSWER_BYTES;
pub use endpoint::{Endpoint, EndpointError};
pub use error::{Error, EventsError, SetupError};
pub use events::EventStream;
pub use exec::{Terminal, TerminalEvent, TerminalInput, TerminalOutput, EXEC_MARGIN};
pub use files::{Fetched, Saved, Upload, STREAM_TIMEOUT};
pub use reqwest::{Method, StatusCode};

use error::MAX_BODY_IN_ERROR;

/// Default bound of one request: a start or a stop may wait on the engine
/// (a stop quiesces the guest, then waits out the engine's stop timeout).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(180);

/// Default bound of connecting.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A request without a body.
const NO_BODY: Option<&()> = None;

/// Settings of a [`Client`] before it is built.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoint: Endpoint,
    token: Option<String>,
    generation: Option<u64>,
    request_timeout: Duration,
    connect_timeout: Duration,
    user_agent: String,
}

impl ClientBuilder {
    /// The bearer token (without one, only `/healthz` and the panel answer).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The fencing generation sent as `Dormouse-Generation` with every call
    /// that is not a `GET`.
    pub fn generation(mut self, generation: Option<u64>) -> Self {
        self.generation = generation;
        self
    }

    /// Bound of one whole request ([`DEFAULT_REQUEST_TIMEOUT`] unless set).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Bound of connecting ([`DEFAULT_CONNECT_TIMEOUT`] unless set).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The `User-Agent` header.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, SetupError> {
        if let Some(token) = &self.token {
            reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| SetupError::InvalidToken)?;
        }
        let mut http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .user_agent(self.user_agent);
        if let Endpoint::Unix(path) = &self.endpoint {
            http = http.unix_socket(path.as_path());
        }
        Ok(Client {
            http: http.build().map_err(SetupError::Http)?,
            endpoint: Arc::new(self.endpoint),
            token: self.token.map(Arc::from),
            generation: self.generation,
            connect_timeout: self.connect_timeout,
        })
    }
}

/// A client of one broker, with its token and (optionally) a fencing
/// generation. Cloning is cheap and shares connections.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoint: Arc<Endpoint>,
    token: Option<Arc<str>>,
    generation: Option<u64>,
    connect_timeout: Duration,
}

impl Client {
    /// Settings for a client of the broker at `endpoint`.
    pub fn builder(endpoint: Endpoint) -> ClientBuilder {
        ClientBuilder {
            endpoint,
            token: None,
            generation: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            user_agent: concat!("dormouse-client/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }

    /// A client of the broker at `endpoint` with `token` and the defaults.
    pub fn new(endpoint: Endpoint, token: impl Into<String>) -> Result<Self, SetupError> {
        Self::builder(endpoint).token(token).build()
    }

    /// The same client, sending `generation` as `Dormouse-Generation` (or
    /// none) from now on.
    pub fn with_generation(&self, generation: Option<u64>) -> Self {
        Self {
            generation,
            ..self.clone()
        }
    }

    /// Where the broker listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    // ---- routes: one method each -------------------------------------

    /// `GET /healthz` (no token needed): `Ok` when the broker serves.
    pub async fn healthz(&self) -> Result<(), Error> {
        self.call_bytes(Method::GET, "/healthz", NO_BODY)
            .await
            .map(drop)
    }

    /// `GET /healthz` as its text: `ok`, the engine, and whether the
    /// engine answers (see the API reference).
    pub async fn health(&self) -> Result<String, Error> {
        self.call_text(Method::GET, "/healthz").await
    }

    /// `GET /healthz`, as a yes or no.
    pub async fn healthy(&self) -> bool {
        self.healthz().await.is_ok()
    }

    /// `GET /metrics`: Prometheus text.
    pub async fn metrics(&self) -> Result<String, Error> {
        self.call_text(Method::GET, "/metrics").await
    }

    /// `GET /v1/openapi.json`: the API's OpenAPI 3 document.
    pub async fn openapi(&self) -> Result<serde_json::Value, Error> {
        self.call(Method::GET, "/v1/openapi.json", NO_BODY).await
    }

    /// `GET /v1/orphans`: containers labelled as ours without a record.
    pub async fn orphans(&self) -> Result<Vec<Orphan>, Error> {
        self.call(Method::GET, "/v1/orphans", NO_BODY).await
    }

    /// `POST /v1/computers`: create and start a computer.
    pub async fn create(&self, request: &CreateComputer) -> Result<ComputerStatus, Error> {
        self.call(Method::POST, "/v1/computers", Some(request))
            .await
    }

    /// `GET /v1/computers`: every computer's status.
    pub async fn list(&self) -> Result<Vec<ComputerStatus>, Error> {
        self.call(Method::GET, "/v1/computers", NO_BODY).await
    }

    /// `GET /v1/computers/{id}`.
    pub async fn get(&self, id: Uuid) -> Result<ComputerStatus, Error> {
        self.call(Method::GET, &computer(id, ""), NO_BODY).await
    }

    /// `PATCH /v1/computers/{id}`: change its settings (fenced).
    pub async fn patch(&self, id: Uuid, request: &PatchComputer) -> Result<ComputerStatus, Error> {
        self.call(Method::PATCH, &computer(id, ""), Some(request))
            .await
    }

    /// `DELETE /v1/computers/{id}[?purge=true]`: remove it; the workspace is
    /// kept unless `purge` (fenced).
    pub async fn remove(&self, id: Uuid, purge: bool) -> Result<(), Error> {
        let query = if purge { "?purge=true" } else { "" };
        self.call_bytes(Method::DELETE, &computer(id, query), NO_BODY)
            .await
            .map(drop)
    }

    /// `POST /v1/computers/{id}/start`: resume it; the answer may come
    /// before it is ready (follow [`Client::events`]) (fenced).
    pub async fn start(&self, id: Uuid) -> Result<ComputerStatus, Error> {
        self.call(Method::POST, &computer(id, "/start"), NO_BODY)
            .await
    }

    /// `POST /v1/computers/{id}/stop` (fenced).
    pub async fn stop(&self, id: Uuid) -> Result<ComputerStatus, Error> {
        self.call(Method::POST, &computer(id, "/stop"), NO_BODY)
            .await
    }

    /// `POST /v1/computers/{id}/touch`: renew its idle timer (fenced).
    pub async fn touch(&self, id: Uuid) -> Result<ComputerStatus, Error> {
        self.call(Method::POST, &computer(id, "/touch"), NO_BODY)
            .await
    }

    /// `GET /v1/computers/{id}/egress`: its egress policy.
    pub async fn egress(&self, id: Uuid) -> Result<EgressPolicy, Error> {
        self.call(Method::GET, &computer(id, "/egress"), NO_BODY)
            .await
    }

    /// `PUT /v1/computers/{id}/egress`: replace its egress policy (fenced);
    /// open connections the new one denies are closed within a second.
    pub async fn set_egress(&self, id: Uuid, policy: &EgressPolicy) -> Result<EgressPolicy, Error> {
        self.call(Method::PUT, &computer(id, "/egress"), Some(policy))
            .await
    }

    /// `GET /v1/computers/{id}/egress/log?since=SEQ`: audit entries after
    /// `since` (all kept ones when `None`), oldest first, one page.
    pub async fn egress_log(&self, id: Uuid, since: Option<u64>) -> Result<EgressLogPage, Error> {
        let query = since.map_or(String::new(), |s| format!("?since={s}"));
        self.call(
            Method::GET,
            &computer(id, &format!("/egress/log{query}")),
            NO_BODY,
        )
        .await
    }

    /// `GET /v1/computers/{id}/egress/refused?limit=N`: its last refused
    /// or failed connections, newest first.
    pub async fn egress_refused(&self, id: Uuid, limit: usize) -> Result<EgressRefusals, Error> {
        self.call(
            Method::GET,
            &computer(id, &format!("/egress/refused?limit={limit}")),
            NO_BODY,
        )
        .await
    }

    /// `GET /v1/computers/{id}/activity?limit=N`: what was done to it and
    /// by whom, newest first (`limit` 1 to 500).
    pub async fn activity(&self, id: Uuid, limit: usize) -> Result<ActivityPage, Error> {
        self.call(
            Method::GET,
            &computer(id, &format!("/activity?limit={limit}")),
            NO_BODY,
        )
        .await
    }

    /// `POST /v1/computers/{id}/lease`: take or renew its fencing lease.
    pub async fn lease(&self, id: Uuid, request: &LeaseRequest) -> Result<LeaseGrant, Error> {
        self.call(Method::POST, &computer(id, "/lease"), Some(request))
            .await
    }

    /// `GET /v1/computers/{id}/screenshot`: PNG bytes.
    pub async fn screenshot(&self, id: Uuid) -> Result<Vec<u8>, Error> {
        self.call_bytes(Method::GET, &computer(id, "/screenshot"), NO_BODY)
            .await
    }

    /// `GET /v1/computers/{id}/screenshot?format=…&quality=…`: the image's
    /// bytes and the `Content-Type` the broker answered with.
    pub async fn screenshot_as(
        &self,
        id: Uuid,
        encoding: ImageEncoding,
    ) -> Result<(Vec<u8>, String), Error> {
        let mut path = format!("{}?format={}", computer(id, "/screenshot"), encoding.format);
        if let Some(q) = encoding.quality {
            path.push_str(&format!("&quality={q}"));
        }
        let (bytes, content_type) = self.exchange(Method::GET, &path, NO_BODY, None).await?;
        Ok((bytes, content_type.unwrap_or_default()))
    }

    /// `GET /v1/computers/{id}/screenshot?last=true`: the WebP the broker
    /// kept at its last stop of the desktop, with when it was taken; nothing
    /// is started. `not_found` when none is kept.
    pub async fn last_screenshot(&self, id: Uuid) -> Result<LastScreenshot, Error> {
        let method = Method::GET;
        let path = format!("{}?last=true", computer(id, "/screenshot"));
        let mut response = self
            .request(method.clone(), &path)
            .send()
            .await
            .map_err(|e| transport(&method, &path, e))?;
        if !response.status().is_success() {
            return Err(body::error_of(response, &method, &path).await);
        }
        let taken_at = response
            .headers()
            .get("dormouse-taken-at")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_default();
        let image = body::answer_body(&mut response, &method, &path).await?;
        Ok(LastScreenshot { image, taken_at })
    }

    /// `GET /v1/events`: the WebSocket stream, opened with the token in the
    /// `Authorization` header. Open it before a call whose effect you want
    /// to see, so no change between the two is missed.
    pub async fn events(&self) -> Result<EventStream, Error> {
        EventStream::connect(&self.endpoint, self.token.as_deref(), self.connect_timeout).await
    }

    // ---- the one request path ----------------------------------------

    /// One call whose answer is JSON: `path` with an optional JSON `body`,
    /// decoded as `T`.
    pub async fn call<T, B>(&self, method: Method, path: &str, body: Option<&B>) -> Result<T, Error>
    where
        T: DeserializeOwned,
        B: Serialize + ?Sized,
    {
        let bytes = self.call_bytes(method.clone(), path, body).await?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
            method,
            path: path.to_owned(),
            source,
        })
    }

    /// One call whose answer is text.
    async fn call_text(&self, method: Method, path: &str) -> Result<String, Error> {
        let bytes = self.call_bytes(method, path, NO_BODY).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// One call, answered with the raw body of a 2xx; the token, the
    /// generation (on anything but `GET`) and the mapping of error answers
    /// happen here and nowhere else.
    pub async fn call_bytes<B>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Vec<u8>, Error>
    where
        B: Serialize + ?Sized,
    {
        self.call_bytes_within(method, path, body, None).await
    }

    /// [`Client::call`] with its own bound instead of the client's.
    pub async fn call_within<T, B>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        within: Duration,
    ) -> Result<T, Error>
    where
        T: DeserializeOwned,
        B: Serialize + ?Sized,
    {
        let bytes = self
            .call_bytes_within(method.clone(), path, body, Some(within))
            .await?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
            method,
            path: path.to_owned(),
            source,
        })
    }

    async fn call_bytes_within<B>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        within: Option<Duration>,
    ) -> Result<Vec<u8>, Error>
    where
        B: Serialize + ?Sized,
    {
        let (bytes, _) = self.exchange(method, path, body, within).await?;
        Ok(bytes)
    }

    /// One call: the raw body of a 2xx and its `Content-Type`, or the
    /// answer's error.
    async fn exchange<B>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        within: Option<Duration>,
    ) -> Result<(Vec<u8>, Option<String>), Error>
    where
        B: Serialize + ?Sized,
    {
        let mut request = self.request(method.clone(), path);
        if let Some(within) = within {
            request = request.timeout(within);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| transport(&method, path, e))?;
        if !response.status().is_success() {
            return Err(body::error_of(response, &method, path).await);
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = body::answer_body(&mut response, &method, path).await?;
        Ok((bytes, content_type))
    }

    /// A request to `path` with the token and (on anything but `GET`) the
    /// generation.
    pub(crate) fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method.clone(), self.endpoint.http_url(path));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let (Some(generation), false) = (self.generation, method == Method::GET) {
            request = request.header(GENERATION_HEADER, generation.to_string());
        }
        request
    }
}

/// The screen a desktop had when the broker last stopped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastScreenshot {
    /// A WebP.
    pub image: Vec<u8>,
    /// When it was taken (RFC 3339, UTC), as the broker said.
    pub taken_at: String,
}

/// No answer, or a body that could not be read.
pub(crate) fn transport(method: &Method, path: &str, source: reqwest::Error) -> Error {
    Error::Transport {
        method: method.clone(),
        path: path.to_owned(),
        source,
    }
}

/// The error an answer that is not a 2xx means.
pub(crate) fn answer_error(method: Method, path: &str, status: StatusCode, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<ApiErrorBody>(bytes) {
        Ok(e) => Error::Api {
            method,
            path: path.to_owned(),
            status,
            code: e.error.code,
            message: e.error.message,
        },
        Err(_) => Error::UnexpectedStatus {
            method,
            path: path.to_owned(),
            status,
            body: cut(&String::from_utf8_lossy(bytes), MAX_BODY_IN_ERROR).to_owned(),
        },
    }
}

/// `/v1/computers/{id}` with `rest` appended (a sub-path or a query).
fn computer(id: Uuid, rest: &str) -> String {
    format!("/v1/computers/{id}{rest}")
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
