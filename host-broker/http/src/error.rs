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
use dormouse_protocol::api::{ApiError as ApiErrorDto, ApiErrorBody, ErrorCode};

use dormouse_core::engine::EngineError;
use dormouse_core::error::BrokerError;
use dormouse_core::workspace::ErrorClass as WorkspaceClass;

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

/// The HTTP status of `code` ([`ErrorCode::http_status`], the one table).
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl HttpError {
    /// An error with `code`, answered with the code's status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            code,
            message: message.into(),
        }
    }

    /// An error whose status a rejection of the HTTP library decided (a
    /// WebSocket upgrade refused as `400`, `405` or `426`).
    pub fn with_status(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 `bad_request`: the request could not be understood.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    /// 401 `unauthorized`: no token or a wrong one.
    pub fn unauthorized() -> Self {
        Self::new(
            ErrorCode::Unauthorized,
            "a valid bearer token is required (Authorization: Bearer <token>)",
        )
    }

    /// 413 `payload_too_large`: the body is over the limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            ErrorCode::PayloadTooLarge,
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 404 `no_route`: nothing is served at this path.
    pub fn no_route() -> Self {
        Self::new(ErrorCode::NoRoute, "no such route")
    }

    /// 405 `method_not_allowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            ErrorCode::MethodNotAllowed,
            "this route does not accept that method",
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code.as_str()
    }

    /// The stable code, typed.
    pub fn error_code(&self) -> ErrorCode {
        self.code
    }

    /// The message for people.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// What the API answers for an error of the core: its stable code and, from
/// the code, its HTTP status. The core's errors know nothing of HTTP; this
/// is the one place they are mapped.
pub trait ApiStatus {
    /// Stable machine-readable code, typed.
    fn error_code(&self) -> ErrorCode;

    /// Stable machine-readable code.
    fn code(&self) -> &'static str {
        self.error_code().as_str()
    }

    /// The HTTP status the API answers with.
    fn http_status(&self) -> u16 {
        self.error_code().http_status()
    }
}

impl ApiStatus for BrokerError {
    fn error_code(&self) -> ErrorCode {
        match self {
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::InvalidActions(_) => ErrorCode::InvalidActions,
            Self::WrongState(_) => ErrorCode::WrongState,
            Self::NotResumable(_) => ErrorCode::NotResumable,
            Self::StaleGeneration { .. } => ErrorCode::StaleGeneration,
            Self::LeaseHeld { .. } => ErrorCode::LeaseHeld,
            Self::Capacity { .. } => ErrorCode::Capacity,
            Self::Image(_) => ErrorCode::Image,
            Self::Engine(EngineError::Unavailable(_)) => ErrorCode::EngineUnavailable,
            Self::Engine(EngineError::NotFound(_) | EngineError::Conflict(_)) => {
                ErrorCode::WrongState
            }
            Self::Engine(EngineError::Failed(_)) => ErrorCode::Internal,
            Self::Guest(_) | Self::GuestFailed(_) => ErrorCode::Guest,
            Self::Store(_) | Self::Internal(_) => ErrorCode::Internal,
            Self::Workspace(e) => match e.class() {
                WorkspaceClass::BadRequest => ErrorCode::BadRequest,
                WorkspaceClass::NotFound => ErrorCode::NotFound,
                WorkspaceClass::Conflict => ErrorCode::WrongState,
                WorkspaceClass::TooLarge => ErrorCode::PayloadTooLarge,
                WorkspaceClass::TimedOut => ErrorCode::RequestTimeout,
                WorkspaceClass::Internal => ErrorCode::Internal,
            },
        }
    }
}

impl From<BrokerError> for HttpError {
    fn from(err: BrokerError) -> Self {
        if std::error::Error::source(&err).is_some() {
            // The detail stays here; the client gets the safe message.
            tracing::warn!(code = err.code(), detail = %err.detail(), "request failed");
        }
        Self::new(err.error_code(), err.to_string())
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code.as_str(),
            self.message
        )
    }
}

impl std::error::Error for HttpError {}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = self.code.as_str(), message = %self.message, "request failed");
        }
        let body = ApiErrorDto {
            error: ApiErrorBody {
                code: self.code.as_str().to_owned(),
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
            BrokerError::Guest(dormouse_core::guest::GuestError::Symlink(path.clone())),
            BrokerError::Guest(dormouse_core::guest::GuestError::Missing(path.clone())),
            BrokerError::Guest(dormouse_core::guest::GuestError::NotASocket(path.clone())),
            BrokerError::Store(dormouse_core::store::StoreError::Io {
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
        let symlink = HttpError::from(BrokerError::Guest(
            dormouse_core::guest::GuestError::Symlink(path),
        ));
        assert_eq!(symlink.code(), "guest");
        assert!(symlink.message().contains("symlink"));
    }
}
