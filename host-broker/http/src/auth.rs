//! Bearer-token authentication of every route but `GET /healthz` and the
//! panel's static files.
//!
//! It owns the comparison of a presented token with the broker's token and
//! must never log a token or compare in time that depends on where the first
//! differing byte is. The token itself comes from the daemon (which reads the
//! file); this module never touches the disk.

use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;

use super::error::HttpError;
use super::ApiState;
use dormouse_core::secret::SecretDigest;

/// Route that also accepts the token outside the `Authorization` header
/// (as a query parameter or a subprotocol; the terminal, as a subprotocol),
/// because a browser's `WebSocket` cannot set headers.
pub const EVENTS_PATH: &str = "/v1/events";

/// WebSocket subprotocol a browser offers to carry the token:
/// `Sec-WebSocket-Protocol: dormouse.v1, dormouse.bearer.<token>`.
pub const BEARER_SUBPROTOCOL_PREFIX: &str = "dormouse.bearer.";

/// The subprotocol the broker selects on `/v1/events`.
pub const EVENTS_SUBPROTOCOL: &str = "dormouse.v1";

/// The broker's API token, replaceable at run time (SIGHUP re-reads the file).
///
/// Only its digest is kept ([`SecretDigest`]), compared in constant time.
#[derive(Clone)]
pub struct ApiToken {
    digest: Arc<RwLock<SecretDigest>>,
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(..)")
    }
}

impl ApiToken {
    /// A token that accepts exactly `token`.
    pub fn new(token: &str) -> Self {
        Self {
            digest: Arc::new(RwLock::new(SecretDigest::of(token))),
        }
    }

    /// Replaces the accepted token; requests in flight finish with the old one.
    pub fn replace(&self, token: &str) {
        let new = SecretDigest::of(token);
        match self.digest.write() {
            Ok(mut guard) => *guard = new,
            // A poisoned lock only means a panic elsewhere while holding it;
            // the array inside is always whole, so take it over.
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    /// Whether `presented` is the token, in constant time.
    pub fn verify(&self, presented: &str) -> bool {
        let current = match self.digest.read() {
            Ok(guard) => *guard,
            Err(poisoned) => *poisoned.into_inner(),
        };
        current.matches(presented)
    }
}

/// Middleware: refuses a request without the right token with 401.
pub async fn require_token(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Result<Response, HttpError> {
    let headers = request.headers();
    let path = request.uri().path();
    let authorised = bearer_from_header(headers).is_some_and(|t| state.token.verify(t))
        || (path == EVENTS_PATH
            && token_from_query(request.uri().query()).is_some_and(|t| state.token.verify(&t)))
        || (browser_socket(path)
            && token_from_subprotocol(headers).is_some_and(|t| state.token.verify(t)));
    if authorised {
        Ok(next.run(request).await)
    } else {
        Err(HttpError::unauthorized())
    }
}

/// Whether `path` is a WebSocket a browser opens, which may carry the token
/// as a subprotocol: `/v1/events` and a desktop's terminal
/// (`/v1/computers/{id}/exec/ws`).
pub(crate) fn browser_socket(path: &str) -> bool {
    path == EVENTS_PATH
        || path
            .strip_prefix("/v1/computers/")
            .and_then(|rest| rest.strip_suffix("/exec/ws"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive).
pub(crate) fn bearer_from_header(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The `token` query parameter (`/v1/events?token=...`).
pub(crate) fn token_from_query(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "token")
        .map(|(_, value)| percent_decode(value))
        .filter(|t| !t.is_empty())
}

/// `dormouse.bearer.<token>` among the offered WebSocket subprotocols.
pub(crate) fn token_from_subprotocol(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix(BEARER_SUBPROTOCOL_PREFIX))
        .filter(|t| is_subprotocol_token(t))
}

/// Whether `t` can be what follows a subprotocol's prefix: a subprotocol is
/// an HTTP token, so not empty and without whitespace (found by fuzzing:
/// `dormouse.bearer. x` yielded the token " x").
pub(crate) fn is_subprotocol_token(t: &str) -> bool {
    !t.is_empty() && !t.contains(char::is_whitespace)
}

/// Minimal `application/x-www-form-urlencoded` decoding; a malformed escape
/// is kept literally (it then simply fails to match the token).
pub(crate) fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn verify_accepts_only_the_token() {
        let token = ApiToken::new("abc123");
        assert!(token.verify("abc123"));
        assert!(!token.verify("abc124"));
        assert!(!token.verify(""));
        assert!(!token.verify("abc1234"));
        token.replace("new");
        assert!(token.verify("new"));
        assert!(!token.verify("abc123"));
    }

    #[test]
    fn only_browser_sockets_take_the_token_as_a_subprotocol() {
        assert!(browser_socket("/v1/events"));
        assert!(browser_socket("/v1/computers/abc/exec/ws"));
        for other in [
            "/v1/computers",
            "/v1/computers//exec/ws",
            "/v1/computers/a/b/exec/ws",
            "/v1/computers/abc/exec",
            "/v1/computers/abc/files/exec/ws",
        ] {
            assert!(!browser_socket(other), "{other}");
        }
    }

    #[test]
    fn bearer_header_is_parsed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  t0k "),
        );
        assert_eq!(bearer_from_header(&headers), Some("t0k"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic t0k"));
        assert_eq!(bearer_from_header(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_from_header(&headers), None);
    }

    #[test]
    fn query_and_subprotocol_tokens_are_found() {
        assert_eq!(
            token_from_query(Some("a=1&token=ab%2Fc")).as_deref(),
            Some("ab/c")
        );
        assert_eq!(token_from_query(Some("tokens=x")), None);
        assert_eq!(token_from_query(Some("token=%zz")).as_deref(), Some("%zz"));
        assert_eq!(token_from_query(Some("token=%4")).as_deref(), Some("%4"));
        let mut headers = HeaderMap::new();
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("dormouse.v1, dormouse.bearer.s3cret"),
        );
        assert_eq!(token_from_subprotocol(&headers), Some("s3cret"));
        // Found by fuzzing: a space after the prefix is no part of a token.
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("dormouse.v1, dormouse.bearer. s3cret"),
        );
        assert_eq!(token_from_subprotocol(&headers), None);
    }
}
