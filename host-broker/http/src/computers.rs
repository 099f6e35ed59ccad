//! Handlers of `/v1/computers/...`: each parses its request into one call on
//! the [`BrokerHandle`](dormouse_core::command::BrokerHandle) and answers with its
//! result.
//!
//! They never touch the engine or the disk, and never decide policy: a
//! handler may refuse input it cannot parse, nothing more.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormouse_core::store::last_screen::LAST_SCREEN_FORMAT;
use dormouse_protocol::api::{
    ComputerStatus, CreateComputer, ErrorCode, LeaseGrant, LeaseRequest, PatchComputer,
};

use super::error::HttpError;
use super::extract::{ComputerId, Generation, JsonBody, RemoveQuery, ScreenshotQuery};
use super::ApiState;
use dormouse_core::reconcile::Orphan;

/// Longest name, owner key or lease holder accepted.
const MAX_LABEL_LEN: usize = 256;

/// Shortest idle window (the daemon's `--idle-timeout` has the same floor).
const MIN_IDLE_TIMEOUT_MS: u64 = 1000;

/// `POST /v1/computers`: create and start a computer; 201 with its status.
pub async fn create(
    State(state): State<ApiState>,
    JsonBody(req): JsonBody<CreateComputer>,
) -> Result<(StatusCode, Json<ComputerStatus>), HttpError> {
    if let Some(name) = &req.name {
        check_label("name", name)?;
    }
    if let Some(owner) = &req.owner {
        check_label("owner", owner)?;
    }
    let status = state.broker.create(req).await?;
    Ok((StatusCode::CREATED, Json(status)))
}

/// `GET /v1/computers`: every computer's status.
pub async fn list(State(state): State<ApiState>) -> Result<Json<Vec<ComputerStatus>>, HttpError> {
    Ok(Json(state.broker.list().await?))
}

/// `GET /v1/computers/{id}`: one computer's status.
pub async fn get(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
) -> Result<Json<ComputerStatus>, HttpError> {
    Ok(Json(state.broker.get(id).await?))
}

/// `POST /v1/computers/{id}/start`: resume a stopped computer.
pub async fn start(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
) -> Result<Json<ComputerStatus>, HttpError> {
    Ok(Json(state.broker.start(id, fence).await?))
}

/// `POST /v1/computers/{id}/stop`: stop a running computer (reason `manual`).
pub async fn stop(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
) -> Result<Json<ComputerStatus>, HttpError> {
    Ok(Json(state.broker.stop(id, fence).await?))
}

/// `DELETE /v1/computers/{id}[?purge=true]`: remove; 204.
pub async fn remove(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
    query: RemoveQuery,
) -> Result<StatusCode, HttpError> {
    state.broker.remove(id, query.purge, fence).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/computers/{id}/screenshot[?format=png|jpeg|webp&quality=1..100]`:
/// an image of the screen, PNG unless asked otherwise, with its media type.
/// With `?last=true`: the WebP kept at the broker's last stop, with the time
/// it was taken, whatever the desktop's state (nothing is started); 404
/// when none is kept. Each answer says whether it is live
/// (`Dormouse-Live`).
pub async fn screenshot(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    query: ScreenshotQuery,
) -> Result<Response, HttpError> {
    let encoding = match query {
        ScreenshotQuery::Live(encoding) => encoding,
        ScreenshotQuery::Last => return last_screen(&state, id).await,
    };
    let (image, format) = state.broker.screenshot_as(id, encoding).await?;
    Ok((
        [
            (header::CONTENT_TYPE, format.media_type()),
            (header::CACHE_CONTROL, "no-store"),
            (header::HeaderName::from_static(LIVE_HEADER), "true"),
        ],
        image,
    )
        .into_response())
}

/// Whether a screenshot shows the screen now (`true`) or as it was kept at
/// the last stop (`false`).
pub const LIVE_HEADER: &str = "dormouse-live";

/// When a kept screen was taken (RFC 3339, milliseconds, UTC).
pub const TAKEN_AT_HEADER: &str = "dormouse-taken-at";

async fn last_screen(state: &ApiState, id: uuid::Uuid) -> Result<Response, HttpError> {
    let Some(kept) = state.broker.last_screen(id).await? else {
        return Err(HttpError::new(
            ErrorCode::NotFound,
            "no last screen is kept for this desktop: the broker keeps one when it stops a desktop",
        ));
    };
    let taken_at = kept
        .taken_at
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let modified = kept
        .taken_at
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    Ok((
        [
            (
                header::CONTENT_TYPE,
                LAST_SCREEN_FORMAT.media_type().to_owned(),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
            (header::LAST_MODIFIED, modified),
            (
                header::HeaderName::from_static(LIVE_HEADER),
                "false".to_owned(),
            ),
            (header::HeaderName::from_static(TAKEN_AT_HEADER), taken_at),
        ],
        kept.image,
    )
        .into_response())
}

/// `POST /v1/computers/{id}/touch`: renew the idle timer.
pub async fn touch(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
) -> Result<Json<ComputerStatus>, HttpError> {
    Ok(Json(state.broker.touch(id, fence).await?))
}

/// `PATCH /v1/computers/{id}`: change per-computer settings.
pub async fn patch(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
    JsonBody(req): JsonBody<PatchComputer>,
) -> Result<Json<ComputerStatus>, HttpError> {
    if let Some(ms) = req.idle_timeout_ms {
        if ms < MIN_IDLE_TIMEOUT_MS {
            return Err(HttpError::bad_request(format!(
                "idle_timeout_ms must be at least {MIN_IDLE_TIMEOUT_MS}"
            )));
        }
    }
    Ok(Json(state.broker.patch(id, req, fence).await?))
}

/// `POST /v1/computers/{id}/lease`: take or renew the fencing lease.
pub async fn lease(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    JsonBody(req): JsonBody<LeaseRequest>,
) -> Result<Json<LeaseGrant>, HttpError> {
    check_label("holder", &req.holder)?;
    if req.ttl_ms == 0 {
        return Err(HttpError::bad_request("ttl_ms must be greater than 0"));
    }
    Ok(Json(state.broker.lease(id, req).await?))
}

/// `GET /v1/orphans`: containers labelled as Dormouse computers that this
/// broker has no record of. Reported so an operator can decide; the broker
/// never removes them.
pub async fn orphans(State(state): State<ApiState>) -> Result<Json<Vec<Orphan>>, HttpError> {
    Ok(Json(state.broker.orphans().await?))
}

/// A name-like field: non-empty, bounded, printable.
fn check_label(field: &str, value: &str) -> Result<(), HttpError> {
    if value.trim().is_empty() {
        return Err(HttpError::bad_request(format!("{field} must not be empty")));
    }
    if value.chars().count() > MAX_LABEL_LEN {
        return Err(HttpError::bad_request(format!(
            "{field} is longer than {MAX_LABEL_LEN} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(HttpError::bad_request(format!(
            "{field} must not contain control characters"
        )));
    }
    Ok(())
}

/// `DELETE /v1/computers/{id}/lease`: gives the lease back (fenced by
/// `Dormouse-Generation`); `204`, also when no live lease exists.
pub async fn release_lease(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
) -> Result<StatusCode, HttpError> {
    state.broker.release_lease(id, fence).await?;
    Ok(StatusCode::NO_CONTENT)
}
