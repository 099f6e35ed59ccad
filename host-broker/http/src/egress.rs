//! Handlers of `/v1/computers/{id}/egress` (the policy, read and replaced
//! live) and `/v1/computers/{id}/egress/log` (the audit, a page after
//! `since`) and `/v1/computers/{id}/egress/refused` (its last refusals,
//! newest first). They parse and call: the policy goes through the owner,
//! the log is read from the egress service's ring.

use axum::extract::State;
use axum::http::request::Parts;
use axum::Json;
use dormouse_protocol::egress_policy::{EgressLogPage, EgressPolicy, EgressRefusals, LogSince};

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
        for (key, value) in pairs(parts)? {
            match key {
                "since" => {
                    query.since = Some(value.parse().map_err(
                        |e: dormouse_protocol::egress_policy::RuleError| {
                            HttpError::bad_request(e.why)
                        },
                    )?);
                }
                "limit" => query.limit = Some(limit(&value, dormouse_egress::audit::PAGE)?),
                other => return Err(unknown(other)),
            }
        }
        Ok(query)
    }
}

/// Most refusals one `egress/refused` read answers.
pub const MAX_REFUSALS: usize = 100;
/// Refusals answered when `limit` is left out.
const DEFAULT_REFUSALS: usize = 5;

/// The query of a refusals read: `limit` only.
#[derive(Debug)]
pub struct RefusedQuery {
    limit: usize,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RefusedQuery {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut query = Self {
            limit: DEFAULT_REFUSALS,
        };
        for (key, value) in pairs(parts)? {
            match key {
                "limit" => query.limit = limit(&value, MAX_REFUSALS)?,
                other => return Err(unknown(other)),
            }
        }
        Ok(query)
    }
}

/// The query's `key=value` pairs, values percent-decoded.
fn pairs(parts: &Parts) -> Result<Vec<(&str, String)>, HttpError> {
    let mut out = Vec::new();
    for pair in parts.uri.query().unwrap_or("").split('&') {
        if pair.is_empty() {
            continue;
        }
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)
            .ok_or_else(|| HttpError::bad_request("a query value is not valid UTF-8"))?;
        out.push((key, value));
    }
    Ok(out)
}

/// A `limit` from 1 to `max`.
fn limit(value: &str, max: usize) -> Result<usize, HttpError> {
    value
        .parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| HttpError::bad_request(format!("limit is a number from 1 to {max}")))
}

fn unknown(key: &str) -> HttpError {
    let shown: String = key.chars().take(64).collect();
    HttpError::bad_request(format!("unknown query parameter {shown:?}"))
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

/// `GET /v1/computers/{id}/egress/refused?limit=…`: the last refused or
/// failed connections, newest first.
pub async fn refused(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    query: RefusedQuery,
) -> Result<Json<EgressRefusals>, HttpError> {
    state.broker.egress(id, None, None).await?;
    let entries = match &state.egress {
        Some(egress) => egress.log(id).last_refused(query.limit),
        None => Vec::new(),
    };
    Ok(Json(EgressRefusals { entries }))
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
