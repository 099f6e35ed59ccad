//! `POST /v1/computers/{id}/actions`: a batch of computer-use actions.
//!
//! Parses the body strictly into an [`ActionBatch`] (a parse error is a
//! `400 invalid_actions` naming the action's index), or, when it holds
//! `openai_actions`, into an [`OpenAiBatch`] translated into one (errors
//! named by the dialect's index, screenshots answered with their
//! `computer_call_output`), and hands it to the core; it never validates beyond the shape (the core does, before
//! anything runs) and never talks to the guest.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use dormouse_protocol::actions::openai::OpenAiBatch;
use dormouse_protocol::actions::{ActionBatch, ActionResults};
use dormouse_protocol::api::ErrorCode;

use super::error::HttpError;
use super::extract::{ComputerId, Generation};
use super::ApiState;

/// Largest body of a batch: a hundred actions and their texts, escaped as
/// a client may escape them (`\u00fc` is six bytes for two).
pub const BODY_LIMIT: usize = 1024 * 1024;

/// `POST /v1/computers/{id}/actions` (fenced): the results of the actions
/// that ran, in order.
pub async fn run(
    State(state): State<ApiState>,
    ComputerId(id): ComputerId,
    Generation(fence): Generation,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ActionResults>, HttpError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::payload_too_large(BODY_LIMIT)
        } else {
            HttpError::bad_request("the request body could not be read")
        }
    })?;
    let malformed = |e: serde_json::Error| {
        HttpError::new(ErrorCode::InvalidActions, format!("malformed batch: {e}"))
    };
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(malformed)?;
    if value.get("openai_actions").is_none() {
        let batch: ActionBatch = serde_json::from_value(value).map_err(malformed)?;
        return Ok(Json(state.broker.actions(id, fence, batch).await?));
    }
    let dialect: OpenAiBatch = serde_json::from_value(value).map_err(malformed)?;
    let translated = dialect
        .translate()
        .map_err(|e| HttpError::new(ErrorCode::InvalidActions, e.to_string()))?;
    match state
        .broker
        .actions(id, fence, translated.batch.clone())
        .await
    {
        Ok(results) => Ok(Json(translated.answer(results))),
        Err(dormouse_core::error::BrokerError::InvalidActions(message)) => Err(HttpError::new(
            ErrorCode::InvalidActions,
            translated.rename_message(&message),
        )),
        Err(e) => Err(e.into()),
    }
}
