//! The screen gateway: carries RFB between a viewer's WebSocket and the
//! desktop's VNC socket (`<run dir>/vnc.sock`).
//!
//! - [`rfb`] parses what a viewer sends and keeps a view capability's input
//!   away from the desktop;
//! - [`rfb_server`] parses what the desktop sends a view capability and
//!   keeps the desktop's clipboard away from it;
//! - [`relay`] moves the bytes, bounded, and closes on revocation.
//!
//! The capabilities themselves and the admission seam are the core's
//! ([`dormouse_core::screen`]); the routes are [`crate::screen_routes`], the
//! noVNC files [`crate::screen_viewer`]'s, and the owner's [`ScreenHost`] is
//! [`crate::screen_host`]. It never logs a token.

pub mod relay;
pub mod rfb;
pub mod rfb_server;

use std::sync::Arc;

pub use dormouse_core::screen::{Mint, Refusal, RegistryError, ScreenHost, ScreenRegistry, Ticket};
use tokio_util::sync::CancellationToken;

pub use relay::{RelayEnd, RelayLimits};
pub use rfb::{RfbFilter, RfbViolation};
pub use rfb_server::{RfbServerFilter, RfbServerViolation};

/// The gateway's state: the registry, the seam to the core, the bounds.
/// Cheap to clone.
#[derive(Clone)]
pub struct ScreenGateway {
    /// Every live capability.
    pub registry: ScreenRegistry,
    /// Admission and VNC connections.
    pub host: Arc<dyn ScreenHost>,
    /// Bounds of every relay.
    pub limits: RelayLimits,
    /// Cancelled when the broker stops; open screens close with 1001.
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for ScreenGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScreenGateway")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ScreenGateway {
    /// A gateway with an empty registry and default bounds.
    pub fn new(host: Arc<dyn ScreenHost>, shutdown: CancellationToken) -> Self {
        Self {
            registry: ScreenRegistry::new(),
            host,
            limits: RelayLimits::default(),
            shutdown,
        }
    }
}
