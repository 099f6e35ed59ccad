//! `GET /v1/computers/{id}/activity[?limit=N]`: a desktop's activity
//! record, newest first ([`ActivityPage`]). It parses the query and reads
//! the core's ring; it records nothing itself.

use axum::extract::State;
use axum::http::request::Parts;
use axum::Json;
use dormouse_protocol::activity::{ActivityPage, DEFAULT_ACTIVITY_LIMIT, MAX_ACTIVITY_LIMIT};

use super::error::HttpError;
use super::extract::ComputerId;
use super::ApiState;

/// The query of an activity read: `limit`, 1 to 500 (100 when absent).
#[derive(Debug)]
pub struct ActivityQuery {
    limit: usize,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ActivityQuery {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut query = Self {
            limit: DEFAULT_ACTIVITY_LIMIT,
        };
        for pair in parts.uri.query().unwrap_or("").split('&') {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "limit" => {
                    query.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_ACTIVITY_LIMIT).contains(n))
                        .ok_or_else(|| {
                            HttpError::bad_request(format!(
                                "limit is a number from 1 to {MAX_ACTIVITY_LIMIT}"
                            ))
                        })?;
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

/// `GET /v1/computers/{id}/activity`: the last `limit` entries, newest first.
pub async fn get(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    query: ActivityQuery,
) -> Result<Json<ActivityPage>, HttpError> {
    let entries = state.broker.activity(id, query.limit)?;
    Ok(Json(ActivityPage { entries }))
}
