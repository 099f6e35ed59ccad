//! Types of the live-screen API: capabilities to watch or control one
//! desktop over RFB-in-WebSocket (`/v1/computers/{id}/screens`,
//! `/v1/screens/{screen_id}`, `/v1/screens/{screen_id}/rfb`).
//!
//! This module owns the wire shape of those calls and the close codes a
//! viewer can be told; it holds no policy and never sees a token's hash.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// File name of the desktop's VNC socket in the run directory (beside
/// [`crate::SOCKET_FILE_NAME`]): `/run/dormouse/vnc.sock` in the guest.
pub const VNC_SOCKET_FILE_NAME: &str = "vnc.sock";

/// Prefix of the WebSocket subprotocol that carries a screen token:
/// `Sec-WebSocket-Protocol: binary, dormouse.screen.<token>`.
pub const SCREEN_SUBPROTOCOL_PREFIX: &str = "dormouse.screen.";

/// The subprotocol the gateway answers with (what noVNC speaks).
pub const RFB_SUBPROTOCOL: &str = "binary";

/// Shortest lifetime a capability may be minted with.
pub const MIN_SCREEN_TTL_MS: u64 = 1_000;
/// Longest lifetime a capability may be minted with (one day).
pub const MAX_SCREEN_TTL_MS: u64 = 24 * 60 * 60 * 1_000;
/// Lifetime of a capability when `ttl_ms` is left out (ten minutes).
pub const DEFAULT_SCREEN_TTL_MS: u64 = 10 * 60 * 1_000;

/// WebSocket close code: the capability was revoked (the reason says why).
pub const CLOSE_REVOKED: u16 = 4001;
/// WebSocket close code: the capability expired.
pub const CLOSE_EXPIRED: u16 = 4002;
/// WebSocket close code: the viewer sent RFB the gateway refuses.
pub const CLOSE_PROTOCOL: u16 = 4003;
/// WebSocket close code: the viewer did not read its updates in time.
pub const CLOSE_TOO_SLOW: u16 = 4004;
/// WebSocket close code: the desktop's VNC server closed the connection.
pub const CLOSE_DESKTOP_GONE: u16 = 4005;
/// WebSocket close code: the desktop's screen carries all the connections
/// it can of this mode ([`MAX_SCREEN_CONNECTIONS`], [`CONTROL_RESERVE`]).
pub const CLOSE_SCREEN_FULL: u16 = 4006;
/// WebSocket close code: the desktop's VNC server sent a view connection
/// RFB the gateway cannot frame (so it cannot keep the desktop's clipboard
/// out of it).
pub const CLOSE_DESKTOP_PROTOCOL: u16 = 4007;

/// Most VNC connections one desktop's screen carries at once: the guest
/// splices no more, and the broker admits no more (every mode, every
/// capability together).
pub const MAX_SCREEN_CONNECTIONS: usize = 64;
/// Of [`MAX_SCREEN_CONNECTIONS`] (and of the capabilities a computer may
/// have), how many view may never take: kept for control, so the lease
/// holder can always open its control screen however many watch.
pub const CONTROL_RESERVE: usize = 8;

/// What a capability allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScreenMode {
    /// Watch only: the gateway drops every input message.
    View,
    /// Watch and send keyboard, pointer and clipboard input.
    Control,
}

impl ScreenMode {
    /// `view` or `control`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::View => "view",
            Self::Control => "control",
        }
    }
}

/// Why a capability stopped working. Its [`close_reason`](Self::close_reason)
/// is what an open connection is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevokeReason {
    /// `DELETE /v1/screens/{screen_id}`.
    Deleted,
    /// The desktop was stopped (by the broker, its idle timer or a shutdown).
    Stopped,
    /// The desktop's container died without the broker stopping it.
    Killed,
    /// The computer was removed.
    Removed,
    /// A new container start: the screen of the old one is gone.
    Restarted,
    /// The lease generation changed: control passed to another holder.
    GenerationChanged,
    /// The capability's lifetime ran out.
    Expired,
    /// The broker is shutting down.
    Shutdown,
}

impl RevokeReason {
    /// The WebSocket close code for this reason.
    pub fn close_code(self) -> u16 {
        match self {
            Self::Expired => CLOSE_EXPIRED,
            Self::Shutdown => 1001,
            _ => CLOSE_REVOKED,
        }
    }

    /// The close reason a viewer can show (well under the 123 bytes a close
    /// frame allows).
    pub fn close_reason(self) -> &'static str {
        match self {
            Self::Deleted => "revoked: capability deleted",
            Self::Stopped => "revoked: desktop stopped",
            Self::Killed => "revoked: desktop killed",
            Self::Removed => "revoked: desktop removed",
            Self::Restarted => "revoked: desktop restarted",
            Self::GenerationChanged => "revoked: the lease changed hands",
            Self::Expired => "expired",
            Self::Shutdown => "the broker is shutting down",
        }
    }
}

/// `POST /v1/computers/{id}/screens`. A `control` request on a computer
/// with a live lease also carries `Dormouse-Generation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateScreen {
    /// What the capability allows.
    pub mode: ScreenMode,
    /// Lifetime, [`MIN_SCREEN_TTL_MS`]..=[`MAX_SCREEN_TTL_MS`];
    /// [`DEFAULT_SCREEN_TTL_MS`] when left out.
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// Why a person is asked to look (an agent's "log in to the bank, then
    /// press Done"): one line of at most [`MAX_SCREEN_REASON`] characters,
    /// shown on the desktop's card in the panel while the capability lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Longest [`CreateScreen::reason`], in characters.
pub const MAX_SCREEN_REASON: usize = 200;

impl CreateScreen {
    /// Checks what the registry does not: the reason is one line of
    /// printable text within [`MAX_SCREEN_REASON`] characters.
    pub fn validate(&self) -> Result<(), String> {
        let Some(reason) = &self.reason else {
            return Ok(());
        };
        if reason.trim().is_empty() {
            return Err("reason is empty".into());
        }
        if reason.chars().count() > MAX_SCREEN_REASON {
            return Err(format!(
                "reason is longer than {MAX_SCREEN_REASON} characters"
            ));
        }
        if reason.chars().any(char::is_control) {
            return Err("reason has a control character (it is one line of text)".into());
        }
        Ok(())
    }
}

/// The `201` answer to [`CreateScreen`]: the only time the token is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScreenGrant {
    /// The capability's id (not secret).
    pub screen_id: Uuid,
    /// What it allows.
    pub mode: ScreenMode,
    /// The secret: 256 random bits, hex. The broker keeps only its SHA-256.
    pub token: String,
    /// When it stops working.
    pub expires_at: DateTime<Utc>,
    /// Path of its WebSocket, `/v1/screens/<screen_id>/rfb`.
    pub websocket: String,
}

/// One live capability in `GET /v1/computers/{id}/screens` (never its token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScreenInfo {
    /// The capability's id.
    pub screen_id: Uuid,
    /// The computer it is bound to.
    pub computer_id: Uuid,
    /// What it allows.
    pub mode: ScreenMode,
    /// The lease generation a control capability is bound to.
    pub generation: Option<u64>,
    /// When it was minted.
    pub created_at: DateTime<Utc>,
    /// When it stops working.
    pub expires_at: DateTime<Utc>,
    /// Open WebSocket connections using it.
    pub connections: u32,
    /// Why a person was asked to look, as minted.
    pub reason: Option<String>,
}

/// The WebSocket path of a capability.
pub fn websocket_path(screen_id: Uuid) -> String {
    format!("/v1/screens/{screen_id}/rfb")
}

/// Path of the panel's viewer page for a capability, the link a person
/// opens: `/panel/screen.html#screen=<id>&token=<token>&mode=<mode>`. The
/// capability rides in the fragment, which browsers never send to a server.
pub fn viewer_link(grant: &ScreenGrant) -> String {
    format!(
        "/panel/screen.html#screen={}&token={}&mode={}",
        grant.screen_id,
        grant.token,
        grant.mode.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_screen_parses_the_contract_and_refuses_extras() {
        let req: CreateScreen = serde_json::from_str(r#"{"mode":"control","ttl_ms":60000}"#)
            .unwrap_or_else(|e| {
                panic!("parses: {e}");
            });
        assert_eq!(req.mode, ScreenMode::Control);
        assert_eq!(req.ttl_ms, Some(60_000));
        let req: CreateScreen =
            serde_json::from_str(r#"{"mode":"view"}"#).unwrap_or_else(|e| panic!("parses: {e}"));
        assert_eq!(req.ttl_ms, None);
        assert_eq!(req.reason, None);
        assert!(serde_json::from_str::<CreateScreen>(r#"{"mode":"admin"}"#).is_err());
        assert!(serde_json::from_str::<CreateScreen>(r#"{"mode":"view","x":1}"#).is_err());
    }

    #[test]
    fn close_reasons_fit_a_close_frame() {
        for reason in [
            RevokeReason::Deleted,
            RevokeReason::Stopped,
            RevokeReason::Killed,
            RevokeReason::Removed,
            RevokeReason::Restarted,
            RevokeReason::GenerationChanged,
            RevokeReason::Expired,
            RevokeReason::Shutdown,
        ] {
            assert!(reason.close_reason().len() <= 123);
            assert!(reason.close_code() == 1001 || (4000..5000).contains(&reason.close_code()));
        }
        assert_eq!(RevokeReason::Stopped.close_code(), 4001);
        assert_eq!(
            RevokeReason::Stopped.close_reason(),
            "revoked: desktop stopped"
        );
    }
}
