//! Commands in a desktop through the guest channel (`exec`, terminal
//! sessions), for the API.
//!
//! Owns the order of an exec: the request is checked first (a bad one
//! changes nothing), then the owner admits it under the fence (running and
//! ready; the idle timer renewed), then the guest runs it, on a connection
//! of the caller's own task. The caller's future is the exec's lifetime:
//! dropping it (the HTTP client went away) drops the guest connection, and
//! the supervisor kills the command and confirms every process gone. It
//! never blocks the owner task and never runs a command the fence refused.

use dormouse_protocol::exec::{ExecRequest, ExecResult, PtyOpen};
use dormouse_protocol::guest::PtyOpened;
use uuid::Uuid;

use crate::command::{BrokerHandle, Fence};
use crate::error::BrokerError;
use crate::guest::exec::{GuestPty, EXEC_KILL_MARGIN};
use crate::guest::{GuestError, CONNECT_TIMEOUT};

impl BrokerHandle {
    /// Runs `request` in computer `id` to its confirmed end.
    pub async fn exec(
        &self,
        id: Uuid,
        fence: Fence,
        request: ExecRequest,
    ) -> Result<ExecResult, BrokerError> {
        request
            .validate()
            .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
        let socket = self.admit_exec(id, fence).await?;
        // The guest answers within the exec's timeout and its kill bound;
        // this bound only guards against a guest that does not.
        let bound = CONNECT_TIMEOUT
            + std::time::Duration::from_millis(request.timeout_ms)
            + EXEC_KILL_MARGIN;
        let run = async { socket.connect().await?.exec(request).await };
        match tokio::time::timeout(bound, run).await {
            Ok(result) => result.map_err(refusal),
            Err(_) => Err(BrokerError::GuestFailed(
                "the command was not confirmed ended in time".into(),
            )),
        }
    }

    /// Opens a terminal session in computer `id`; dropping the session ends
    /// it (its processes killed and confirmed gone in the guest).
    pub async fn open_terminal(
        &self,
        id: Uuid,
        fence: Fence,
        open: PtyOpen,
    ) -> Result<(PtyOpened, GuestPty), BrokerError> {
        open.validate()
            .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
        let socket = self.admit_exec(id, fence).await?;
        let conn = socket.connect().await.map_err(BrokerError::from)?;
        conn.open_pty(open).await.map_err(refusal)
    }
}

/// A guest refusal that is about the request is the caller's error (`400`),
/// a full guest `409`; anything else is the guest's failure.
fn refusal(e: GuestError) -> BrokerError {
    match &e {
        GuestError::Refused { code, message } => match code.as_str() {
            "bad_request" | "not_found" | "not_executable" | "bad_cwd" => {
                BrokerError::BadRequest(format!("{code}: {message}"))
            }
            "busy" => BrokerError::WrongState(format!(
                "the desktop runs as many commands as it may: {message}"
            )),
            _ => e.into(),
        },
        _ => e.into(),
    }
}
