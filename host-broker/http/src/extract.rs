//! Extractors that turn the parts of a request into typed values or a 400.
//!
//! Everything a handler receives has been parsed here: ids are UUIDs before
//! they go anywhere, the fencing generation is a number, JSON bodies match
//! their schema exactly (unknown fields are refused). A rejected request never
//! reaches the broker core, so it changes nothing.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use dormouse_protocol::api::{ErrorCode, GENERATION_HEADER};
use dormouse_protocol::image::ImageEncoding;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::body::BodyTimedOut;
use super::error::HttpError;
use super::BODY_LIMIT;
use dormouse_core::command::Fence;

/// The `{id}` of a computer route, parsed as a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputerId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for ComputerId {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| HttpError::bad_request("the computer id in the path is missing"))?;
        Uuid::try_parse(&raw).map(ComputerId).map_err(|_| {
            HttpError::bad_request(format!(
                "{:?} is not a computer id (a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8)",
                truncate(&raw, 64)
            ))
        })
    }
}

/// The caller's fencing generation from the `Dormouse-Generation` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(pub Fence);

impl<S: Send + Sync> FromRequestParts<S> for Generation {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parse_generation(&parts.headers).map(Self)
    }
}

/// `Dormouse-Generation`, if sent: once, and nothing but ASCII digits
/// (around them, only whitespace; no sign). The one parser of the header,
/// for every route that takes it (the screen routes too).
pub fn parse_generation(headers: &HeaderMap) -> Result<Fence, HttpError> {
    let mut values = headers.get_all(GENERATION_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(HttpError::bad_request(format!(
            "{GENERATION_HEADER} was sent more than once"
        )));
    }
    value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            HttpError::bad_request(format!(
                "{GENERATION_HEADER} must be a non-negative integer"
            ))
        })
}

/// A JSON body parsed strictly into `T`.
///
/// Unlike `axum::Json` it does not insist on a `Content-Type` (so `curl -d`
/// works), answers 400 for every malformed body (axum says 422 for a schema
/// mismatch), 413 over [`BODY_LIMIT`], and reads an empty body as `{}` when
/// `T` allows it.
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                HttpError::payload_too_large(BODY_LIMIT)
            } else if let Some(late) = body_timed_out(&rejection) {
                HttpError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "the request body did not arrive within {}",
                        humantime::format_duration(late.0)
                    ),
                )
            } else {
                HttpError::bad_request("the request body could not be read")
            }
        })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text)
            .map(JsonBody)
            .map_err(|e| HttpError::bad_request(format!("malformed JSON body: {e}")))
    }
}

/// The body deadline of the server, if that is why the body could not be read.
fn body_timed_out<'a>(
    rejection: &'a (dyn std::error::Error + 'static),
) -> Option<&'a BodyTimedOut> {
    let mut cause = Some(rejection);
    while let Some(error) = cause {
        if let Some(late) = error.downcast_ref::<BodyTimedOut>() {
            return Some(late);
        }
        cause = error.source();
    }
    None
}

/// The query of `DELETE /v1/computers/{id}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoveQuery {
    /// Delete the workspace too.
    pub purge: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for RemoveQuery {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut query = Self::default();
        for pair in parts.uri.query().unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
            match (key, value) {
                ("purge", "true" | "1") => query.purge = true,
                ("purge", "false" | "0") => query.purge = false,
                ("purge", _) => {
                    return Err(HttpError::bad_request("purge must be true or false"));
                }
                _ => {
                    return Err(HttpError::bad_request(format!(
                        "unknown query parameter {:?}",
                        truncate(key, 64)
                    )));
                }
            }
        }
        Ok(query)
    }
}

/// The query of `GET /v1/computers/{id}/screenshot`: `format=png|jpeg|webp`
/// and `quality=1..100` (jpeg and webp), checked before the guest is asked;
/// or `last=true` for the screen kept at the last stop, which comes as it
/// was kept and so takes neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScreenshotQuery {
    /// The screen now, in this encoding.
    Live(ImageEncoding),
    /// The screen kept at the last stop.
    Last,
}

impl Default for ScreenshotQuery {
    fn default() -> Self {
        Self::Live(ImageEncoding::default())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ScreenshotQuery {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let (mut format, mut quality, mut last) = (None, None, None);
        for pair in parts.uri.query().unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "format" => &mut format,
                "quality" => &mut quality,
                "last" => &mut last,
                _ => {
                    return Err(HttpError::bad_request(format!(
                        "unknown query parameter {:?}",
                        truncate(key, 64)
                    )));
                }
            };
            if slot.replace(truncate(value, 64)).is_some() {
                return Err(HttpError::bad_request(format!("{key} given twice")));
            }
        }
        let last = match last {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(HttpError::bad_request(format!(
                    "last must be true or false, not {other:?}"
                )));
            }
        };
        if last {
            if format.is_some() || quality.is_some() {
                return Err(HttpError::bad_request(
                    "the last screen comes as it was kept (WebP): format and quality are for a live screenshot",
                ));
            }
            return Ok(Self::Last);
        }
        ImageEncoding::parse(format, quality)
            .map(Self::Live)
            .map_err(|e| HttpError::bad_request(e.to_string()))
    }
}

/// Cuts what a client sent before echoing it in a message.
fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
