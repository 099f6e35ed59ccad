//! The API's one error type: every failure a client sees is
//! `{"error": {"code": "...", "message": "..."}}` with a fitting status.
//!
//! It owns the mapping from [`BrokerError`] and from request rejections to
//! HTTP; it must never put internal detail (paths, engine replies) into a
//! message that the broker core did not already deem safe to show.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormouse_protocol::api::{ApiError as ApiErrorDto, ApiErrorBody};

use crate::error::BrokerError;

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// An error with an explicit status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 `bad_request`: the request could not be understood.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401 `unauthorized`: no token or a wrong one.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required (Authorization: Bearer <token>)",
        )
    }

    /// 413 `payload_too_large`: the body is over the limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 404 `no_route`: nothing is served at this path.
    pub fn no_route() -> Self {
        Self::new(StatusCode::NOT_FOUND, "no_route", "no such route")
    }

    /// 405 `method_not_allowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not accept that method",
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message for people.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<BrokerError> for ApiError {
    fn from(err: BrokerError) -> Self {
        let status =
            StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, err.code(), err.to_string())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code, message = %self.message, "request failed");
        }
        let body = ApiErrorDto {
            error: ApiErrorBody {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"dormouse\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn broker_errors_keep_their_code_and_status() {
        let err = ApiError::from(BrokerError::NotFound(Uuid::nil()));
        assert_eq!(err.status(), StatusCode::NOT_FOUND);
        assert_eq!(err.code(), "not_found");
        let err = ApiError::from(BrokerError::StaleGeneration {
            given: "3".into(),
            current: 4,
        });
        assert_eq!(err.status(), StatusCode::CONFLICT);
        assert_eq!(err.code(), "stale_generation");
        let err = ApiError::from(BrokerError::EngineUnavailable("down".into()));
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
