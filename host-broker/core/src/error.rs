//! The broker core's one error type: its own refusals, and the engine, guest
//! and store errors rolled up with `#[from]`.
//!
//! The `Display` of every variant is safe to show a client: the roll-ups say
//! only which part failed and how (engine unreachable, socket refused, state
//! directory unwritable). Their detail — host paths, engine replies, guest
//! words — stays in the wrapped error ([`std::error::Error::source`]) and goes
//! to the log. The HTTP status and code are decided in
//! `dormouse-http`'s `error` module, nowhere else.

use uuid::Uuid;

use crate::engine::EngineError;
use crate::guest::GuestError;
use crate::store::lease::Fenced;
use crate::store::StoreError;
use crate::workspace::{ErrorClass, WorkspaceError};

/// What can go wrong with a broker command.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No computer with this id.
    #[error("no computer with id {0}")]
    NotFound(Uuid),
    /// The request is malformed or out of range.
    #[error("{0}")]
    BadRequest(String),
    /// A batch of actions refused before anything ran; the message names
    /// the action's index and field.
    #[error("{0}")]
    InvalidActions(String),
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
    /// The backend (container engine) failed or could not be reached.
    #[error("{}", engine_message(.0))]
    Engine(#[from] EngineError),
    /// The guest channel failed or the supervisor misbehaved.
    #[error("guest supervisor: {}", guest_message(.0))]
    Guest(#[from] GuestError),
    /// The desktop did not behave (exited at once, no answer in time).
    #[error("guest supervisor: {0}")]
    GuestFailed(String),
    /// The state directory could not be read or written.
    #[error("the state directory could not be read or written")]
    Store(#[from] StoreError),
    /// A workspace request failed: a refused path or archive, or host I/O.
    #[error("{}", workspace_message(.0))]
    Workspace(#[from] WorkspaceError),
    /// Anything else; details are in the log.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<Fenced> for BrokerError {
    fn from(refusal: Fenced) -> Self {
        match refusal {
            Fenced::BadRequest(why) => Self::BadRequest(why),
            Fenced::StaleGeneration { given, current } => Self::StaleGeneration { given, current },
            Fenced::LeaseHeld { holder, expires_at } => Self::LeaseHeld { holder, expires_at },
        }
    }
}

impl BrokerError {
    /// The same failure again, for a second party waiting on it (the
    /// roll-ups keep their kind and safe message; their detail was logged).
    pub fn duplicate(&self) -> BrokerError {
        match self {
            Self::NotFound(id) => Self::NotFound(*id),
            Self::BadRequest(m) => Self::BadRequest(m.clone()),
            Self::InvalidActions(m) => Self::InvalidActions(m.clone()),
            Self::WrongState(m) => Self::WrongState(m.clone()),
            Self::NotResumable(m) => Self::NotResumable(m.clone()),
            Self::StaleGeneration { given, current } => Self::StaleGeneration {
                given: given.clone(),
                current: *current,
            },
            Self::LeaseHeld { holder, expires_at } => Self::LeaseHeld {
                holder: holder.clone(),
                expires_at: expires_at.clone(),
            },
            Self::Capacity { running, max } => Self::Capacity {
                running: *running,
                max: *max,
            },
            Self::Image(m) => Self::Image(m.clone()),
            Self::Engine(e) => Self::Engine(e.clone()),
            Self::Guest(_) | Self::GuestFailed(_) => Self::GuestFailed(guest_tail(self)),
            Self::Store(_) => {
                Self::Internal("the state directory could not be read or written".into())
            }
            Self::Workspace(e) => match e.class() {
                ErrorClass::BadRequest | ErrorClass::TooLarge | ErrorClass::TimedOut => {
                    Self::BadRequest(workspace_message(e))
                }
                ErrorClass::NotFound | ErrorClass::Conflict => {
                    Self::WrongState(workspace_message(e))
                }
                ErrorClass::Internal => Self::Internal(workspace_message(e)),
            },
            Self::Internal(m) => Self::Internal(m.clone()),
        }
    }

    /// The full detail for the log: the safe message and every source.
    pub fn detail(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            out.push_str(": ");
            out.push_str(&s.to_string());
            source = s.source();
        }
        out
    }
}

/// Two errors are equal when they say the same: same kind, same safe
/// message (the wrapped detail is not compared).
impl PartialEq for BrokerError {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

fn guest_tail(e: &BrokerError) -> String {
    let text = e.to_string();
    text.strip_prefix("guest supervisor: ")
        .map(str::to_owned)
        .unwrap_or(text)
}

/// What an engine failure may tell a client.
fn engine_message(e: &EngineError) -> &'static str {
    match e {
        EngineError::Unavailable(_) => "container engine unreachable",
        EngineError::NotFound(_) => "the container engine does not know the container or image",
        EngineError::Conflict(_) => "the container engine refused: it conflicts with its state",
        EngineError::Failed(_) => "the container engine failed the request",
    }
}

/// What a workspace failure may tell a client: its own words where they
/// name only workspace-relative paths, fixed words where they would name a
/// host path (I/O failures, the workspace directory itself).
fn workspace_message(e: &WorkspaceError) -> String {
    match e {
        WorkspaceError::Io { .. } => "the workspace could not be read or written".into(),
        WorkspaceError::Exists { .. } => "the workspace exists already".into(),
        WorkspaceError::NotFound { path } if path.starts_with('/') => {
            "the computer has no workspace".into()
        }
        other => other.to_string(),
    }
}

/// What a guest-channel failure may tell a client (never the socket's path).
fn guest_message(e: &GuestError) -> String {
    match e {
        GuestError::Missing(_) => "no supervisor socket".into(),
        GuestError::Symlink(_) => "the supervisor socket is a symlink, refused".into(),
        GuestError::NotASocket(_) => "the supervisor socket is not a socket, refused".into(),
        GuestError::WrongOwner { .. } => {
            "the supervisor socket has the wrong owner, refused".into()
        }
        GuestError::Connect(_) => "cannot connect to the supervisor".into(),
        GuestError::Timeout(d, what) => format!("no answer within {d:?} ({what})"),
        GuestError::Frame(_) => "bad frame from the supervisor".into(),
        GuestError::Unexpected { to, .. } => format!("unexpected answer to {to}"),
        // Both were tamed on arrival (escaped, shortened): the guest's own
        // reason, so a client can tell a display that did not answer from
        // one that refused a request.
        GuestError::Refused { code, message } => format!("supervisor refused: {code}: {message}"),
        GuestError::Incompatible(v) => format!("supervisor speaks protocol {v}"),
    }
}
