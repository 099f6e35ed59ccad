//! The web panel: four static files served at `/`, embedded in the binary.
//!
//! The panel uses only the public API (it is the reference frontend), so it
//! holds no secret and needs no token to load; it asks the user for the token
//! and keeps it in the browser's sessionStorage. This module must never
//! render data into the page on the server side.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("panel/index.html");
const PANEL_CSS: &str = include_str!("panel/panel.css");
const PANEL_JS: &str = include_str!("panel/panel.js");
const DOCK_JS: &str = include_str!("panel/dock.js");

/// Only our own script and style (the live screen's noVNC is served from
/// here too, by [`crate::screen_viewer`]); screenshots arrive as `blob:`
/// URLs, noVNC's cursor as a `data:` image.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' blob: data:; connect-src 'self' ws: wss:; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// A static asset of the panel or the viewer page, with the headers every
/// page of the broker carries (a strict CSP, no sniffing, no referrer).
pub(super) fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /panel/panel.css`.
pub async fn css() -> Response {
    asset("text/css; charset=utf-8", PANEL_CSS)
}

/// `GET /panel/panel.js`.
pub async fn js() -> Response {
    asset("text/javascript; charset=utf-8", PANEL_JS)
}

/// `GET /panel/dock.js`: the dock (files, terminal, clipboard, activity).
pub async fn dock_js() -> Response {
    asset("text/javascript; charset=utf-8", DOCK_JS)
}
