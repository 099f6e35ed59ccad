//! Entry points of the fuzz targets (`tests/fuzz`) into the parsers of
//! this crate that take a caller's bytes: the bearer token's places (header,
//! query, WebSocket subprotocol), the screen token's, the generation (header
//! and query) and a files route's path and query. Each calls the parser the
//! routes call, not a copy. Compiled only with the feature `fuzzing`.

use axum::extract::{Query, Request};
use axum::http::{HeaderMap, Uri};
use dormouse_core::workspace::WorkspacePath;

/// What the authentication layer finds in a request: the bearer token of
/// the `Authorization` header, the `?token=` of `/v1/events`, the
/// subprotocol token of a browser's socket, and whether `path` is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTokens {
    /// From `Authorization: Bearer …`.
    pub bearer: Option<String>,
    /// From `?token=` (percent-decoded).
    pub query: Option<String>,
    /// From `Sec-WebSocket-Protocol: dormouse.bearer.…`.
    pub subprotocol: Option<String>,
    /// Whether `path` takes the token as a subprotocol.
    pub browser_socket: bool,
}

/// Every place the broker's bearer token is read from, as
/// [`crate::auth::require_token`] reads them.
pub fn api_tokens(headers: &HeaderMap, path: &str, query: Option<&str>) -> ApiTokens {
    ApiTokens {
        bearer: crate::auth::bearer_from_header(headers).map(str::to_owned),
        query: crate::auth::token_from_query(query),
        subprotocol: crate::auth::token_from_subprotocol(headers).map(str::to_owned),
        browser_socket: crate::auth::browser_socket(path),
    }
}

/// The screen token of an RFB request (subprotocol, else `?token=`).
pub fn screen_token(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    crate::screen_routes::screen_token(headers, query)
}

/// The `Dormouse-Generation` header, as every fenced route reads it; the
/// error is the answer's status.
pub fn generation_header(headers: &HeaderMap) -> Result<Option<u64>, u16> {
    crate::extract::parse_generation(headers).map_err(|e| e.status().as_u16())
}

/// The `generation=` of `exec/ws` with the query parsed as the route's
/// extractor parses it; `None` when the extractor refuses the query.
pub fn generation_query(uri: &Uri) -> Option<Result<Option<u64>, u16>> {
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri).ok()?;
    Some(
        crate::processes::terminal_request(&pairs)
            .map(|(_, generation)| generation)
            .map_err(|e| e.status().as_u16()),
    )
}

/// The workspace path and query of a files route (`/v1/computers/{id}/files/…`),
/// as the workspace handlers read them; the error is the answer's status.
pub fn files_target(request: &Request) -> Result<(WorkspacePath, Vec<(String, String)>), u16> {
    crate::workspace::target(request)
        .map(|(_, path, query)| (path, query))
        .map_err(|e| e.status().as_u16())
}

/// `%XX` escapes of a files route's path to bytes; `None` on a malformed
/// escape.
pub fn files_percent_decode(raw: &[u8]) -> Option<Vec<u8>> {
    crate::workspace::percent_decode(raw)
}
