//! Handlers of `/v1/computers/{id}/egress` (the policy, read and replaced
//! live) and `/v1/computers/{id}/egress/log` (the audit, a page after
//! `since`). They parse and call: the policy goes through the owner, the
//! log is read from the egress service's ring.

use axum::extract::State;
use axum::http::request::Parts;
use axum::Json;
use dormouse_protocol::egress_policy::{EgressLogPage, EgressPolicy, LogSince};

use super::error::HttpError;
use super::extract::{ComputerId, Generation, JsonBody};
use super::ApiState;

/// `GET /v1/computers/{id}/egress`: the computer's policy.
pub async fn get(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
) -> Result<Json<EgressPolicy>, HttpError> {
    Ok(Json(state.broker.egress(id, None, None).await?))
}

/// `PUT /v1/computers/{id}/egress`: replace the policy (fenced); open
/// connections it denies are closed within a second.
pub async fn put(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
    JsonBody(policy): JsonBody<EgressPolicy>,
) -> Result<Json<EgressPolicy>, HttpError> {
    policy
        .validate()
        .map_err(|e| HttpError::bad_request(e.to_string()))?;
    Ok(Json(state.broker.egress(id, Some(policy), fence).await?))
}

/// The query of a log read: `since` (a `seq` or an RFC 3339 time), `limit`.
#[derive(Debug, Default)]
pub struct LogQuery {
    since: Option<LogSince>,
    limit: Option<usize>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for LogQuery {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut query = Self::default();
        for pair in parts.uri.query().unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)
                .ok_or_else(|| HttpError::bad_request("a query value is not valid UTF-8"))?;
            match key {
                "since" => {
                    query.since = Some(value.parse().map_err(
                        |e: dormouse_protocol::egress_policy::RuleError| {
                            HttpError::bad_request(e.why)
                        },
                    )?);
                }
                "limit" => {
                    let n: usize = value.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                        HttpError::bad_request("limit is a number from 1 to 1000")
                    })?;
                    query.limit = Some(n.min(dormouse_egress::audit::PAGE));
                }
                other => {
                    let shown: String = other.chars().take(64).collect();
                    return Err(HttpError::bad_request(format!(
                        "unknown query parameter {shown:?}"
                    )));
                }
            }
        }
        Ok(query)
    }
}

/// `%XX` escapes and `+` as a space, if the result is UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'%' => return None,
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `GET /v1/computers/{id}/egress/log?since=…&limit=…`: audit entries
/// after `since`, oldest first.
pub async fn log(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    query: LogQuery,
) -> Result<Json<EgressLogPage>, HttpError> {
    // The computer must exist (404 otherwise), whatever the ring holds.
    state.broker.egress(id, None, None).await?;
    let page = match &state.egress {
        Some(egress) => egress.log(id).page(query.since, query.limit),
        None => EgressLogPage {
            entries: Vec::new(),
            next: 0,
            more: false,
        },
    };
    Ok(Json(page))
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            percent_decode("2026-12-01T10%3A00%3A00%2B01%3A00").as_deref(),
            Some("2026-12-01T10:00:00+01:00")
        );
        assert_eq!(percent_decode("42").as_deref(), Some("42"));
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}
