//! The API's one error type: every failure a client sees is
//! `{"error": {"code": "...", "message": "..."}}` with a fitting status.
//! (The wire shape is the protocol's DTO `dormouse_protocol::api::ApiError`;
//! this is the broker's HTTP answer that renders it.)
//!
//! It owns the mapping from [`BrokerError`] (status and code, here and
//! nowhere else) and from request rejections to HTTP. It must never put
//! internal detail (host paths, engine replies, guest words) into a message:
//! the message is the error's safe `Display`; the detail (its sources) is
//! logged.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormouse_protocol::api::{ApiError as ApiErrorDto, ApiErrorBody};

use crate::engine::EngineError;
use crate::error::BrokerError;
use crate::workspace::ErrorClass as WorkspaceClass;

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl HttpError {
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

impl BrokerError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::BadRequest(_) => "bad_request",
            Self::InvalidActions(_) => dormouse_protocol::actions::BatchError::CODE,
            Self::WrongState(_) => "wrong_state",
            Self::NotResumable(_) => "not_resumable",
            Self::StaleGeneration { .. } => "stale_generation",
            Self::LeaseHeld { .. } => "lease_held",
            Self::Capacity { .. } => "capacity",
            Self::Image(_) => "image",
            Self::Engine(EngineError::Unavailable(_)) => "engine_unavailable",
            Self::Engine(EngineError::NotFound(_) | EngineError::Conflict(_)) => "wrong_state",
            Self::Engine(EngineError::Failed(_)) => "internal",
            Self::Guest(_) | Self::GuestFailed(_) => "guest",
            Self::Store(_) | Self::Internal(_) => "internal",
            Self::Workspace(e) => match e.class() {
                WorkspaceClass::BadRequest => "bad_request",
                WorkspaceClass::NotFound => "not_found",
                WorkspaceClass::Conflict => "wrong_state",
                WorkspaceClass::TooLarge => "payload_too_large",
                WorkspaceClass::Internal => "internal",
            },
        }
    }

    /// The HTTP status the API answers with.
    pub fn http_status(&self) -> u16 {
        match self.code() {
            "not_found" => 404,
            "bad_request" | "invalid_actions" => 400,
            "wrong_state" | "not_resumable" | "stale_generation" | "lease_held" | "capacity" => 409,
            "image" => 422,
            "payload_too_large" => 413,
            "engine_unavailable" => 503,
            "guest" => 502,
            _ => 500,
        }
    }
}

impl From<BrokerError> for HttpError {
    fn from(err: BrokerError) -> Self {
        let status =
            StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if std::error::Error::source(&err).is_some() {
            // The detail stays here; the client gets the safe message.
            tracing::warn!(code = err.code(), detail = %err.detail(), "request failed");
        }
        Self::new(status, err.code(), err.to_string())
    }
}

impl std::fmt::Display for HttpError {
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

impl std::error::Error for HttpError {}

impl IntoResponse for HttpError {
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
        let err = HttpError::from(BrokerError::NotFound(Uuid::nil()));
        assert_eq!(err.status(), StatusCode::NOT_FOUND);
        assert_eq!(err.code(), "not_found");
        let err = HttpError::from(BrokerError::StaleGeneration {
            given: "3".into(),
            current: 4,
        });
        assert_eq!(err.status(), StatusCode::CONFLICT);
        assert_eq!(err.code(), "stale_generation");
        let err = HttpError::from(BrokerError::Engine(EngineError::Unavailable("down".into())));
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn messages_never_carry_host_paths_or_engine_words() {
        let path = std::path::PathBuf::from("/var/lib/dormouse/computers/x/run/supervisor.sock");
        let errors = [
            BrokerError::Guest(crate::guest::GuestError::Symlink(path.clone())),
            BrokerError::Guest(crate::guest::GuestError::Missing(path.clone())),
            BrokerError::Guest(crate::guest::GuestError::NotASocket(path.clone())),
            BrokerError::Store(crate::store::StoreError::Io {
                op: "write",
                path: path.clone(),
                source: std::io::Error::other("disk full"),
            }),
            BrokerError::Engine(EngineError::Failed(format!(
                "400: invalid mount config: bind source path does not exist: {}",
                path.display()
            ))),
            BrokerError::Engine(EngineError::Unavailable(
                "error trying to connect: /var/run/docker.sock".into(),
            )),
        ];
        for err in errors {
            let detail = err.detail();
            let answer = HttpError::from(err);
            assert!(
                !answer.message().contains('/'),
                "{}: {}",
                answer.code(),
                answer.message()
            );
            assert!(
                detail.contains("/var/"),
                "the log keeps the detail: {detail}"
            );
        }
        let symlink = HttpError::from(BrokerError::Guest(crate::guest::GuestError::Symlink(path)));
        assert_eq!(symlink.code(), "guest");
        assert!(symlink.message().contains("symlink"));
    }
}
