//! Errors of the broker core, each with a stable API code.
//!
//! The API layer maps them to HTTP statuses; the message is safe to show a
//! client (internal detail is logged where it happens, not put here).

use uuid::Uuid;

/// What can go wrong with a broker command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// No computer with this id.
    #[error("no computer with id {0}")]
    NotFound(Uuid),
    /// The request is malformed or out of range.
    #[error("{0}")]
    BadRequest(String),
    /// The computer is not in a state that allows this (e.g. start while running).
    #[error("{0}")]
    WrongState(String),
    /// A resume was refused by a check; the message says which.
    #[error("not resumable: {0}")]
    NotResumable(String),
    /// The caller's fencing generation is not the current one.
    #[error("stale generation {given}: the current generation is {current}")]
    StaleGeneration {
        /// What the caller sent (`None`: nothing while a lease is live).
        given: String,
        /// The current generation.
        current: u64,
    },
    /// A live lease is held by someone else.
    #[error("lease held by {holder} until {expires_at}")]
    LeaseHeld {
        /// Current holder.
        holder: String,
        /// RFC 3339 expiry.
        expires_at: String,
    },
    /// Too many running desktops for a create.
    #[error("capacity reached: {running} of {max} desktops are running")]
    Capacity {
        /// Running desktops.
        running: u32,
        /// The limit.
        max: u32,
    },
    /// The image is missing or speaks an incompatible protocol.
    #[error("image problem: {0}")]
    Image(String),
    /// The engine could not be reached.
    #[error("container engine unreachable: {0}")]
    EngineUnavailable(String),
    /// The guest supervisor misbehaved or is not there.
    #[error("guest supervisor: {0}")]
    Guest(String),
    /// Anything else; details are in the log.
    #[error("internal error: {0}")]
    Internal(String),
}

impl BrokerError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::BadRequest(_) => "bad_request",
            Self::WrongState(_) => "wrong_state",
            Self::NotResumable(_) => "not_resumable",
            Self::StaleGeneration { .. } => "stale_generation",
            Self::LeaseHeld { .. } => "lease_held",
            Self::Capacity { .. } => "capacity",
            Self::Image(_) => "image",
            Self::EngineUnavailable(_) => "engine_unavailable",
            Self::Guest(_) => "guest",
            Self::Internal(_) => "internal",
        }
    }

    /// The HTTP status the API answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::BadRequest(_) => 400,
            Self::WrongState(_)
            | Self::NotResumable(_)
            | Self::StaleGeneration { .. }
            | Self::LeaseHeld { .. }
            | Self::Capacity { .. } => 409,
            Self::Image(_) => 422,
            Self::EngineUnavailable(_) => 503,
            Self::Guest(_) => 502,
            Self::Internal(_) => 500,
        }
    }
}
