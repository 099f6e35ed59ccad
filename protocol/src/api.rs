//! Types of the broker's public HTTP/WebSocket API (`/v1/...`).
//!
//! These names are a contract with every frontend; add fields, never rename.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::guest::Phase;
use crate::health::HealthReport;

/// Header carrying the caller's fencing generation on mutating calls.
pub const GENERATION_HEADER: &str = "Dormouse-Generation";

/// What the engine says of a computer's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    /// The container runs.
    Running,
    /// The container exists and is not running.
    Stopped,
    /// The engine has no such container.
    Missing,
    /// The engine could not be asked.
    Unknown,
}

/// Why a desktop was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The idle timer stopped it.
    Idle,
    /// Someone asked for a stop.
    Manual,
    /// The broker stopped it while shutting down a host.
    Shutdown,
    /// A fencing takeover stopped the previous holder's work.
    Fenced,
    /// The engine reports it was killed (not by the broker).
    Killed,
    /// The engine reports the kernel's OOM killer ended it.
    Oom,
}

/// The idle timer of one computer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleStatus {
    /// The quiet window after which the desktop is stopped.
    pub timeout_ms: u64,
    /// How long it has been quiet.
    pub idle_for_ms: u64,
    /// When it will be stopped; `null` while busy or stopped.
    pub stops_at: Option<DateTime<Utc>>,
}

/// What the broker serves about one computer; pushed on `/v1/events` too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputerStatus {
    /// The computer's UUID.
    pub id: Uuid,
    /// Human name.
    pub name: String,
    /// Owner key.
    pub owner: String,
    /// What the engine says of the container.
    pub container: ContainerState,
    /// `true` only when the guest's self-probe passed after this container start.
    pub ready: bool,
    /// The guest's phase while it runs.
    pub phase: Option<Phase>,
    /// Why it is not ready or degraded, for people.
    pub problem: Option<String>,
    /// Why it stopped, when the broker knows for sure.
    pub stop_reason: Option<StopReason>,
    /// When the engine says it stopped.
    pub stopped_at: Option<DateTime<Utc>>,
    /// Whether `start` would be allowed now.
    pub resumable: bool,
    /// Why `start` would be refused.
    pub resumable_problem: Option<String>,
    /// The current fencing generation.
    pub generation: u64,
    /// The guest's latest health report.
    pub health: Option<HealthReport>,
    /// The immutable image ID the container was created from.
    pub image_id: String,
    /// The idle timer.
    pub idle: Option<IdleStatus>,
    /// Whether the host limits what the guest may write to its workspace;
    /// `null` when the broker has not determined it (and from older brokers).
    #[serde(default)]
    pub workspace_limit: Option<WorkspaceLimit>,
    /// Height in desktop pixels of the taskbar at the bottom of the screen,
    /// as the guest reports it while it runs: the screen's lowest
    /// `taskbar_height` rows are the taskbar, and windows open above them.
    /// `null` while stopped, without a taskbar, or from older guests.
    #[serde(default)]
    pub taskbar_height: Option<u32>,
    /// When each step of the running container's start finished, in
    /// milliseconds after its supervisor started, as the guest reports it;
    /// `null` while stopped (and from older guests).
    #[serde(default)]
    pub start_phases: Option<crate::StartPhases>,
}

/// The host-side limit on one computer's workspace (a project quota on the
/// data directory's filesystem), or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceLimit {
    /// `true` when the filesystem enforces the limits below.
    pub enforced: bool,
    /// Most bytes the workspace may hold, when enforced.
    #[serde(default)]
    pub bytes: Option<u64>,
    /// Most files and directories the workspace may hold, when enforced.
    #[serde(default)]
    pub inodes: Option<u64>,
    /// Why no limit is enforced, for people.
    #[serde(default)]
    pub reason: Option<String>,
}

/// An item of the `/v1/events` WebSocket stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BrokerEvent {
    /// A computer's status changed (or is sent on connect).
    Status {
        /// The new status.
        computer: Box<ComputerStatus>,
    },
    /// A computer was removed.
    Removed {
        /// Its id.
        id: Uuid,
    },
    /// An egress connection was decided (at most ten a second per desktop;
    /// the audit log has every one).
    Egress {
        /// What was decided, as the audit records it (bytes and end not yet known).
        entry: Box<crate::egress_policy::EgressLogEntry>,
    },
    /// Something was done to a computer (its activity record's new entry).
    Activity {
        /// The computer.
        id: Uuid,
        /// The entry, as `GET /v1/computers/{id}/activity` answers it.
        entry: Box<crate::activity::ActivityEntry>,
    },
}

/// `POST /v1/computers`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateComputer {
    /// Human name; defaults to a short form of the id.
    pub name: Option<String>,
    /// Owner key; defaults to `default`.
    pub owner: Option<String>,
    /// Re-adopt the workspace a removed computer left behind.
    pub workspace_from: Option<Uuid>,
    /// The desktop's egress policy; the broker's default (`--egress-default`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress_policy::EgressPolicy>,
}

/// `PATCH /v1/computers/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchComputer {
    /// A new idle window for this computer, at least one second.
    pub idle_timeout_ms: Option<u64>,
}

/// `POST /v1/computers/{id}/lease`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who asks, e.g. a controller's instance name.
    pub holder: String,
    /// How long the lease lives unless renewed.
    pub ttl_ms: u64,
}

/// The answer to a lease request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// The fencing generation to send as `Dormouse-Generation`.
    pub generation: u64,
    /// The holder it was granted to.
    pub holder: String,
    /// When it expires.
    pub expires_at: DateTime<Utc>,
}

/// A container labelled as a Dormouse computer that the broker has no record
/// of (`GET /v1/orphans`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    /// Container name.
    pub container: String,
    /// The computer id its label names.
    pub computer: String,
    /// Its owner label.
    pub owner: Option<String>,
    /// Its run state.
    pub state: String,
}

/// Declares [`ErrorCode`]: each code once, with its wire name and HTTP
/// status, so a new code cannot be left without a status.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal => $status:literal,)+) => {
        /// Every stable code an API error carries (`error.code`), with the
        /// HTTP status the broker answers it with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ErrorCode {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)+
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(Self::$variant),+];

            /// The code on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }

            /// The HTTP status of an answer with this code.
            pub fn http_status(self) -> u16 {
                match self {
                    $(Self::$variant => $status,)+
                }
            }

            /// The code named `name` on the wire, if this version knows it.
            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

error_codes! {
    /// The request could not be understood.
    BadRequest = "bad_request" => 400,
    /// A batch of actions is malformed or invalid.
    InvalidActions = "invalid_actions" => 400,
    /// No token or a wrong one.
    Unauthorized = "unauthorized" => 401,
    /// A screen route without a screen token.
    ScreenTokenRequired = "screen_token_required" => 401,
    /// A screen token that is wrong, expired or revoked.
    InvalidScreenToken = "invalid_screen_token" => 401,
    /// No such computer (or file, or capability).
    NotFound = "not_found" => 404,
    /// Nothing is served at this path.
    NoRoute = "no_route" => 404,
    /// The route does not accept the method.
    MethodNotAllowed = "method_not_allowed" => 405,
    /// The request body did not arrive in time.
    RequestTimeout = "request_timeout" => 408,
    /// The computer's state does not allow the request.
    WrongState = "wrong_state" => 409,
    /// The desktop is not running and ready (live screen).
    NotReady = "not_ready" => 409,
    /// A stopped desktop that may not be resumed.
    NotResumable = "not_resumable" => 409,
    /// The caller's generation is not the lease's.
    StaleGeneration = "stale_generation" => 409,
    /// Another holder has the lease.
    LeaseHeld = "lease_held" => 409,
    /// The broker runs as many desktops as it may.
    Capacity = "capacity" => 409,
    /// The computer has as many screen capabilities as it may.
    TooManyScreens = "too_many_screens" => 409,
    /// The state changed between admission and the answer; ask again.
    StateChanged = "state_changed" => 409,
    /// The body is over the limit.
    PayloadTooLarge = "payload_too_large" => 413,
    /// The body is in a format (an encoding or a media type) the route cannot read.
    UnsupportedMediaType = "unsupported_media_type" => 415,
    /// The image is missing or not a Dormouse image.
    Image = "image" => 422,
    /// A WebSocket route asked without a WebSocket upgrade.
    WebsocketRequired = "websocket_required" => 426,
    /// A screen capability has as many connections as it may.
    TooManyConnections = "too_many_connections" => 429,
    /// The broker failed.
    Internal = "internal" => 500,
    /// The guest failed or misbehaved.
    Guest = "guest" => 502,
    /// The container engine cannot be reached.
    EngineUnavailable = "engine_unavailable" => 503,
    /// The desktop's screen cannot be reached.
    ScreenUnavailable = "screen_unavailable" => 503,
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every API error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// The error.
    pub error: ApiErrorBody,
}

/// Code and message of an API error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    /// Stable machine-readable code, e.g. `not_found`, `stale_generation`.
    pub code: String,
    /// For people.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_code_has_one_name_and_an_error_status() {
        let mut names = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(names.insert(code.as_str()), "{code} twice");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
            assert!((400..600).contains(&code.http_status()), "{code}");
            let wire = serde_json::to_value(code).unwrap();
            assert_eq!(wire, serde_json::Value::from(code.as_str()));
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
        assert_eq!(ErrorCode::StaleGeneration.http_status(), 409);
    }

    #[test]
    fn unknown_create_fields_are_refused() {
        assert!(serde_json::from_str::<CreateComputer>(r#"{"nmae":"x"}"#).is_err());
        assert!(serde_json::from_str::<CreateComputer>("{}").is_ok());
    }

    #[test]
    fn events_are_tagged() {
        let id = Uuid::nil();
        let json = serde_json::to_value(BrokerEvent::Removed { id }).expect("json");
        assert_eq!(json["type"], "removed");
    }
}
