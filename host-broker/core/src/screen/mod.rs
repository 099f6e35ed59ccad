//! The live screen's core half: capabilities to watch or control one
//! desktop ([`registry`] mints, checks, lists, expires and revokes them) and
//! the seam the gateway admits and connects through ([`ScreenHost`]).
//!
//! The gateway that carries RFB between a viewer's WebSocket and the
//! desktop's VNC socket (`<run dir>/vnc.sock`), its RFB filter and the HTTP
//! side of the contract (`/v1/computers/{id}/screens`,
//! `/v1/screens/{screen_id}`, `/v1/screens/{screen_id}/rfb`) are
//! `dormouse-http`'s (`screen`, `screen_routes`, `screen_host`).
//!
//! This module never decides whether a computer may be watched, nor opens a
//! guest path itself: both go through [`ScreenHost`], which the broker's
//! owner implements (admission under the fence, and the race-free,
//! no-follow connect to `vnc.sock`). It never logs a token.

pub mod registry;

use dormouse_protocol::activity::Actor;
use dormouse_protocol::api::ErrorCode;
use dormouse_protocol::screen::ScreenMode;
use futures_util::future::BoxFuture;
use tokio::net::UnixStream;
use uuid::Uuid;

pub use registry::{Mint, RegistryError, ScreenRegistry, Ticket};

/// File name of the VNC server's socket inside a computer's run directory.
pub use dormouse_protocol::screen::VNC_SOCKET_FILE_NAME;

/// A refusal of the [`ScreenHost`]: a stable code and a message safe to
/// show (the owner's own errors map onto it one to one). Its HTTP status is
/// the code's ([`ErrorCode::http_status`]), chosen by the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// For people.
    pub message: String,
}

impl Refusal {
    /// Any refusal.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `not_found`: no such computer.
    pub fn not_found() -> Self {
        Self::new(ErrorCode::NotFound, "no such computer")
    }

    /// `not_ready`: the desktop is not running and ready.
    pub fn not_ready(why: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotReady, why)
    }

    /// `stale_generation`: the fence refused the caller.
    pub fn stale_generation(current: u64) -> Self {
        Self::new(
            ErrorCode::StaleGeneration,
            format!("the lease generation is {current}; send it as Dormouse-Generation"),
        )
    }

    /// `screen_unavailable`: the desktop's VNC socket cannot be reached.
    pub fn unavailable(why: impl Into<String>) -> Self {
        Self::new(ErrorCode::ScreenUnavailable, why)
    }
}

/// What the gateway needs from the broker's core. Implemented by the owner's
/// handle; the tests implement it over a fake VNC server.
pub trait ScreenHost: Send + Sync + 'static {
    /// Whether `computer` exists (for listing; a stopped one lists nothing).
    fn exists(&self, computer: Uuid) -> BoxFuture<'_, Result<(), Refusal>>;

    /// Admits a new capability: the computer exists, its container runs and
    /// it is ready; for `control`, the fence passes (`generation` is the
    /// caller's `Dormouse-Generation`, required when a live lease exists).
    /// Returns the current generation, which a control capability is bound
    /// to. Must be decided by the one task that owns leases, so a
    /// generation change cannot slip between this check and the mint
    /// (the owner revokes older control after every change anyway).
    fn admit(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        generation: Option<u64>,
    ) -> BoxFuture<'_, Result<u64, Refusal>>;

    /// [`admit`](Self::admit), with who asked for the activity record
    /// (the lease's holder when `generation` is the one it holds); a host
    /// that cannot tell says the token's caller.
    fn admit_as(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        generation: Option<u64>,
    ) -> BoxFuture<'_, Result<(u64, Actor), Refusal>> {
        Box::pin(async move {
            self.admit(computer, mode, generation)
                .await
                .map(|g| (g, Actor::Api))
        })
    }

    /// A fresh connection to the desktop's `vnc.sock`, opened with the same
    /// no-follow, owner-checked rules as the supervisor socket.
    fn connect_vnc(&self, computer: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>>;
}
