//! `dormouse-http`: the broker's HTTP and WebSocket API (axum), the live
//! screen's gateway ([`screen`]) and the panel. Every HTTP status the
//! broker answers with is chosen here ([`error`]), and nowhere in the core.
//!
//! This layer only parses and answers (firecracker's split): every handler
//! turns a request into one call on [`BrokerHandle`] and maps the result to
//! HTTP. It must never touch the engine, and a request it refuses (bad
//! JSON, bad id, no token, too large) never reaches the core, so it changes
//! nothing. The disk is touched only by the workspace handlers
//! (`workspace`), after the core authorised the request, and only on the
//! blocking pool.
//!
//! Routes are declared once, in [`route_table`]'s builder, which both mounts
//! them and lists them, so the OpenAPI document can be checked against what
//! is actually served.

#![forbid(unsafe_code)]

mod actions;
mod activity;
pub mod auth;
pub mod body;
mod computers;
mod egress;
pub mod error;
mod events;
pub mod extract;
/// Entry points of the fuzz targets (`tests/fuzz`) into this crate's
/// private parsers; only with the feature `fuzzing`, never in the daemon.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod panel;
mod processes;
pub use processes::ExecOutputBudget;
pub mod screen;
pub mod screen_host;
pub mod screen_routes;
pub mod screen_state;
pub mod screen_viewer;
mod workspace;
pub mod xterm;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::handler::Handler;
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::Router;
use dormouse_protocol::api::ContainerState;
use tokio_util::sync::CancellationToken;

pub use auth::ApiToken;
pub use error::{ApiStatus, HttpError};

use dormouse_core::command::BrokerHandle;
use dormouse_core::metrics::Metrics;

/// Largest request body accepted; larger ones get 413 and change nothing.
pub const BODY_LIMIT: usize = 64 * 1024;

/// The OpenAPI 3 document of this API, served at `GET /v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// What every handler can reach: the core's handle and nothing that does I/O
/// on its own.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The seam to the one task that owns state.
    pub broker: BrokerHandle,
    /// Counters rendered by `GET /metrics`.
    pub metrics: Arc<Metrics>,
    /// The accepted bearer token.
    pub token: ApiToken,
    /// Cancelled when the daemon stops; open WebSockets then close with 1001.
    pub shutdown: CancellationToken,
    /// Which container engine answered at start-up (`Podman Engine 4.3.1
    /// (API 1.41)`), for `/healthz`; `None` when it did not answer.
    pub engine: Option<String>,
    /// The live-screen gateway (its host refuses until the daemon wires it).
    pub screens: crate::screen::ScreenGateway,
    /// Where the panel's noVNC library is served from.
    pub novnc: crate::screen_viewer::NovncDir,
    /// Where the panel's terminal library (xterm.js) is served from.
    pub xterm: crate::xterm::XtermDir,
    /// The egress service, for its audit (none: the log reads empty).
    pub egress: Option<Arc<dormouse_egress::Egress>>,
    /// The broker's own listener, which the `/mcp` tools call with the
    /// request's token; `/mcp` is not served without it.
    pub mcp: Option<dormouse_client::Endpoint>,
    /// Room for exec output the broker holds, every exec together
    /// ([`ExecOutputBudget`]).
    pub exec_output: ExecOutputBudget,
}

impl ApiState {
    /// State around a broker handle, with a shutdown signal of its own.
    pub fn new(broker: BrokerHandle, metrics: Arc<Metrics>, token: ApiToken) -> Self {
        Self {
            screens: screen_state::unwired(&broker),
            novnc: crate::screen_viewer::NovncDir(None),
            xterm: crate::xterm::XtermDir::none(),
            broker,
            metrics,
            token,
            shutdown: CancellationToken::new(),
            engine: None,
            egress: None,
            mcp: None,
            exec_output: ExecOutputBudget::default(),
        }
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Needs the bearer token.
    Token,
    /// Served to anyone: the health check and the panel's static files.
    Public,
}

/// One route the API serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// HTTP method.
    pub method: Method,
    /// Path in OpenAPI/axum syntax, e.g. `/v1/computers/{id}`.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

/// Builds the router and the list of its routes in one pass.
#[derive(Default)]
struct Routes {
    protected: Router<ApiState>,
    public: Router<ApiState>,
    table: Vec<RouteSpec>,
}

impl Routes {
    fn add<H, T>(self, access: Access, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, ApiState>,
        T: 'static,
    {
        self.add_as(access, method, path, path, handler)
    }

    /// [`Routes::add`] where the documented path differs from axum's (a
    /// `{*rest}` wildcard is `{rest}` in OpenAPI).
    fn add_as<H, T>(
        mut self,
        access: Access,
        method: Method,
        path: &'static str,
        documented: &'static str,
        handler: H,
    ) -> Self
    where
        H: Handler<T, ApiState>,
        T: 'static,
    {
        // Only standard methods are used below; a route that could not be
        // mounted is left out of the table too, so the OpenAPI check fails.
        let Ok(filter) = MethodFilter::try_from(method.clone()) else {
            tracing::error!(%method, path, "not a standard method; route not mounted");
            return self;
        };
        match access {
            Access::Token => self.protected = self.protected.route(path, on(filter, handler)),
            Access::Public => self.public = self.public.route(path, on(filter, handler)),
        }
        self.table.push(RouteSpec {
            method,
            path: documented,
            access,
        });
        self
    }

    // Over 100 lines on purpose: the route table, one `.add` line per route;
    // the tests compare it whole with the OpenAPI document and docs/api.md.
    fn all() -> Self {
        use Access::{Public, Token};
        Self::default()
            .add(Public, Method::GET, "/healthz", healthz)
            .add(Public, Method::GET, "/", panel::index)
            .add(Public, Method::GET, "/panel/panel.css", panel::css)
            .add(Public, Method::GET, "/panel/panel.js", panel::js)
            .add(Public, Method::GET, "/panel/dock.js", panel::dock_js)
            .add(
                Public,
                Method::GET,
                crate::xterm::SCRIPT_PATH,
                crate::xterm::script,
            )
            .add(
                Public,
                Method::GET,
                crate::xterm::STYLE_PATH,
                crate::xterm::style,
            )
            .add(Token, Method::GET, "/metrics", metrics)
            .add(Token, Method::GET, "/v1/openapi.json", openapi)
            .add(Token, Method::GET, "/v1/events", events::events)
            .add(Token, Method::GET, "/v1/orphans", computers::orphans)
            .add(Token, Method::POST, "/v1/computers", workspace::create)
            .add(Token, Method::GET, "/v1/computers", computers::list)
            .add(Token, Method::GET, "/v1/computers/{id}", computers::get)
            .add(Token, Method::PATCH, "/v1/computers/{id}", computers::patch)
            .add(Token, Method::GET, "/v1/computers/{id}/egress", egress::get)
            .add(Token, Method::PUT, "/v1/computers/{id}/egress", egress::put)
            .add(
                Token,
                Method::GET,
                "/v1/computers/{id}/egress/log",
                egress::log,
            )
            .add(
                Token,
                Method::GET,
                "/v1/computers/{id}/egress/refused",
                egress::refused,
            )
            .add(
                Token,
                Method::GET,
                "/v1/computers/{id}/activity",
                activity::get,
            )
            .add(
                Token,
                Method::DELETE,
                "/v1/computers/{id}",
                computers::remove,
            )
            .add(
                Token,
                Method::POST,
                "/v1/computers/{id}/start",
                computers::start,
            )
            .add(
                Token,
                Method::POST,
                "/v1/computers/{id}/stop",
                computers::stop,
            )
            .add(
                Token,
                Method::POST,
                "/v1/computers/{id}/touch",
                computers::touch,
            )
            .add(
                Token,
                Method::POST,
                "/v1/computers/{id}/lease",
                computers::lease,
            )
            .add(
                Token,
                Method::GET,
                "/v1/computers/{id}/screenshot",
                computers::screenshot,
            )
            .add(
                Token,
                Method::POST,
                "/v1/computers/{id}/actions",
                actions::run.layer(DefaultBodyLimit::max(actions::BODY_LIMIT)),
            )
            .add(
                Token,
                Method::DELETE,
                "/v1/computers/{id}/lease",
                computers::release_lease,
            )
            .add(
                Token,
                Method::POST,
                crate::screen_routes::SCREENS_PATH,
                crate::screen_routes::create,
            )
            .add(
                Token,
                Method::GET,
                crate::screen_routes::SCREENS_PATH,
                crate::screen_routes::list,
            )
            .add(
                Token,
                Method::DELETE,
                crate::screen_routes::SCREEN_PATH,
                crate::screen_routes::revoke,
            )
            .add(
                Public,
                Method::GET,
                crate::screen_routes::RFB_PATH,
                crate::screen_routes::rfb,
            )
            .add(
                Public,
                Method::GET,
                crate::screen_viewer::PAGE_PATH,
                crate::screen_viewer::page,
            )
            .add(
                Public,
                Method::GET,
                crate::screen_viewer::SCRIPT_PATH,
                crate::screen_viewer::script,
            )
            .add_as(
                Public,
                Method::GET,
                crate::screen_viewer::NOVNC_ROUTE,
                crate::screen_viewer::NOVNC_DOC,
                crate::screen_viewer::novnc,
            )
            .add(
                Token,
                Method::POST,
                "/v1/computers/{id}/exec",
                processes::exec.layer(DefaultBodyLimit::max(processes::EXEC_BODY_LIMIT)),
            )
            .add(
                Token,
                Method::GET,
                "/v1/computers/{id}/exec/ws",
                processes::exec_ws,
            )
            .workspace_routes()
    }

    /// The workspace routes ([`workspace`]).
    fn workspace_routes(self) -> Self {
        use Access::Token;
        const FILES: &str = "/v1/computers/{id}/files/{*path}";
        const FILES_DOC: &str = "/v1/computers/{id}/files/{path}";
        const ROOT: &str = "/v1/computers/{id}/files";
        const ARCHIVE: &str = "/v1/computers/{id}/workspace";
        self.add(Token, Method::GET, ROOT, workspace::get_file)
            .add_as(Token, Method::GET, FILES, FILES_DOC, workspace::get_file)
            .add_as(Token, Method::PUT, FILES, FILES_DOC, workspace::put_file)
            .add_as(
                Token,
                Method::DELETE,
                FILES,
                FILES_DOC,
                workspace::delete_file,
            )
            .add(
                Token,
                Method::GET,
                "/v1/computers/{id}/disk",
                workspace::disk,
            )
            .add(Token, Method::GET, ARCHIVE, workspace::export)
            .add(Token, Method::PUT, ARCHIVE, workspace::import)
    }
}

/// Where the MCP server is served (not a REST route: not in the table).
pub const MCP_PATH: &str = "/mcp";

/// Every route [`router`] serves.
pub fn route_table() -> Vec<RouteSpec> {
    Routes::all().table
}

/// The whole API as one router.
pub fn router(state: ApiState) -> Router {
    let routes = Routes::all();
    let mut protected = routes.protected;
    // `/mcp`: the MCP tools over streamable HTTP, behind the same token
    // (see `dormouse_mcp::http`).
    if let Some(endpoint) = state.mcp.clone() {
        let service = dormouse_mcp::http::service(endpoint, dormouse_mcp::Settings::default());
        protected = protected.route_service(MCP_PATH, service);
    }
    protected
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .merge(routes.public)
        .fallback(|| async { HttpError::no_route() })
        .method_not_allowed_fallback(|| async { HttpError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(close_after_refusal))
        .layer(middleware::from_fn(access_log))
        .with_state(state)
}

/// A request with a body that is refused (a wrong token, a foreign `Host`,
/// a body too large) may be answered before its body is read; the server
/// then closes the connection after the answer, so the answer says so
/// (`Connection: close`) and a client does not send its next request into
/// a connection that is going away.
async fn close_after_refusal(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let mut response = next.run(request).await;
    if has_body && (response.status().is_client_error() || response.status().is_server_error()) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// `GET /healthz`: the process serves (first line `ok`, whatever the
/// engine does), which engine it found at start-up (`engine: …`), and,
/// while the engine is lost, since when and why in fixed words
/// (`engine: unavailable since <time>: <reason>`), or after its last return
/// how long it was away and how long reconciling every desktop took; no
/// token needed, nothing else said.
async fn healthz(State(state): State<ApiState>) -> String {
    let mut out = String::from("ok\n");
    if let Some(engine) = &state.engine {
        out.push_str(&format!("engine: {engine}\n"));
    }
    for line in state.broker.engine_availability().health_lines() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `GET /v1/openapi.json`.
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

/// `GET /metrics`: Prometheus text, with desktops counted by container state.
async fn metrics(State(state): State<ApiState>) -> Result<Response, HttpError> {
    let computers = state.broker.list().await?;
    let count =
        |wanted: ContainerState| computers.iter().filter(|c| c.container == wanted).count() as u64;
    let by_state = [
        ("running", count(ContainerState::Running)),
        ("stopped", count(ContainerState::Stopped)),
        ("missing", count(ContainerState::Missing)),
        ("unknown", count(ContainerState::Unknown)),
    ];
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(&by_state),
    )
        .into_response())
}

/// One line per request: method, path, status, duration. The query string is
/// never logged (it may carry a token on `/v1/events`).
async fn access_log(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status();
    let ms = format!("{:.3}", started.elapsed().as_secs_f64() * 1000.0);
    if status == StatusCode::UNAUTHORIZED || status.is_server_error() {
        tracing::warn!(target: "dormouse::access", %method, path, status = status.as_u16(), %ms, "request");
    } else {
        tracing::info!(target: "dormouse::access", %method, path, status = status.as_u16(), %ms, "request");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormouse_core::availability::{AvailabilityCell, LossReason};

    #[tokio::test]
    async fn healthz_says_ok_first_and_since_when_the_engine_is_unavailable() {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let (events, _) = tokio::sync::broadcast::channel(1);
        let cell = AvailabilityCell::default();
        let broker = BrokerHandle::new(tx, events).with_engine(cell.clone());
        let mut state = ApiState::new(broker, Arc::default(), ApiToken::new("t"));
        state.engine = Some("Docker Engine 20.10.24 (API 1.41)".into());
        assert_eq!(
            healthz(State(state.clone())).await,
            "ok\nengine: Docker Engine 20.10.24 (API 1.41)\n"
        );
        let since = chrono::DateTime::parse_from_rfc3339("2026-12-03T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        cell.update(|a| a.lost = Some((since, LossReason::StreamEnded)));
        assert_eq!(
            healthz(State(state)).await,
            "ok\nengine: Docker Engine 20.10.24 (API 1.41)\n\
             engine: unavailable since 2026-12-03T10:00:00.000Z: its event stream ended\n"
        );
    }
}
