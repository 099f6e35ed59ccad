//! The one road of every guest call the API makes: admission by the owner,
//! then the call itself, relayed on a connection of the caller's own task.
//!
//! 1. [`BrokerHandle::admit_guest`] sends the one admission command
//!    ([`crate::command::Command::AdmitGuest`]). The owner checks, for the
//!    call's [`Purpose`], that the computer exists, its state allows it and
//!    the caller's generation fences; it renews the idle timer where the call
//!    is activity, and hands back a [`Ticket`]: the guest channel the backend
//!    names ([`crate::engine::Backend::guest`], a run-directory socket or the
//!    engine's exec bridge) and the generation the call was admitted under.
//! 2. The functions of this module run the call over that ticket: actions,
//!    exec, terminal, screenshot, the live screen's VNC stream, the quiesce
//!    hold of an export. Dropping the caller's future drops the connection,
//!    and the guest ends what it was doing.
//! 3. Each call tells the owner whether the guest's channel answered it
//!    ([`Ticket::answers`]): a refusal is an answer, a connection that
//!    fails, hangs or speaks nonsense is not, and degrades the computer's
//!    status until the guest answers again (`owner/answers.rs`).
//! 4. A fenced ticket's [`Ticket::revoked`] fires when the generation it was
//!    admitted under is no longer the computer's (a lease takeover), or the
//!    computer is removed: the owner decides both in one place
//!    (`owner/revocation.rs`), after every turn of its loop, for every open
//!    relay alike (the live screen's capabilities are revoked there too).
//!
//! This module never decides admission and never reaches a guest any way but
//! through the ticket's channel.

pub mod actions;

use std::time::Duration;

use dormouse_protocol::actions::{ActionBatch, ActionResults};
use dormouse_protocol::activity::argv::Argv;
use dormouse_protocol::activity::Happened;
use dormouse_protocol::call;
use dormouse_protocol::exec::{ExecRequest, ExecResult, PtyOpen};
use dormouse_protocol::guest::PtyOpened;
use dormouse_protocol::image::{ImageEncoding, ImageFormat};
use tokio::net::UnixStream;
use uuid::Uuid;

use crate::command::{BrokerHandle, Command, Fence};
use crate::error::BrokerError;
use crate::guest::exec::{GuestPty, EXEC_KILL_MARGIN};
use crate::guest::{self, GuestError, QuiesceHold, CONNECT_TIMEOUT};

pub use crate::command::{AnswerReport, Purpose, Ticket};

impl Ticket {
    /// Runs `call` unless (or until) the ticket is revoked.
    async fn unless_revoked<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        tokio::select! {
            result = call => result,
            () = self.revoked.cancelled() => Err(revoked(self.generation)),
        }
    }

    /// Tells the owner how the guest's channel took a call, and passes its
    /// result on: a refusal is the guest answering; any other failure is
    /// the channel's.
    fn told<T>(&self, result: Result<T, GuestError>) -> Result<T, GuestError> {
        match &result {
            Ok(_) | Err(GuestError::Refused { .. }) => self.answers.answered(),
            Err(e) => self.answers.failed(e.to_string()),
        }
        result
    }

    /// A call the guest did not answer within its bound: the channel's
    /// failure, told as such.
    fn unanswered(&self, why: &str) -> BrokerError {
        self.answers.failed(why.to_owned());
        BrokerError::GuestFailed(why.to_owned())
    }
}

/// The answer to a call whose ticket was revoked while it ran.
fn revoked(generation: u64) -> BrokerError {
    BrokerError::WrongState(format!(
        "the lease generation {generation} this call was admitted under was fenced off"
    ))
}

impl BrokerHandle {
    /// See [`Command::AdmitGuest`].
    pub async fn admit_guest(
        &self,
        id: Uuid,
        fence: Fence,
        purpose: Purpose,
    ) -> Result<Ticket, BrokerError> {
        self.ask(|r| Command::AdmitGuest(id, fence, purpose, r))
            .await
    }

    /// Runs `request` in computer `id` to its confirmed end: checked first
    /// (a bad one changes nothing), admitted, then run by the guest.
    pub async fn exec(
        &self,
        id: Uuid,
        fence: Fence,
        request: ExecRequest,
    ) -> Result<ExecResult, BrokerError> {
        request
            .validate()
            .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
        let argv = match (&request.argv, &request.command) {
            (Some(argv), _) => argv.clone(),
            (None, Some(command)) => vec!["sh".into(), "-c".into(), command.clone()],
            (None, None) => Vec::new(),
        };
        let ticket = self.admit_guest(id, fence, Purpose::Exec).await?;
        let result = exec(&ticket, request).await;
        // Recorded on its outcome (an exec given up has no exit code), by
        // its output's sizes, never its bytes; the log keeps of the argv
        // what `--activity-argv` says.
        let size = |bytes: &[u8]| u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        let what = Happened::Exec {
            argv: Argv::given(argv),
            exit_code: result.as_ref().ok().and_then(|r| r.exit_code),
            timed_out: result.as_ref().is_ok_and(|r| r.timed_out),
            stdout_bytes: result.as_ref().map_or(0, |r| size(&r.stdout)),
            stderr_bytes: result.as_ref().map_or(0, |r| size(&r.stderr)),
        };
        self.record_activity(id, ticket.actor.clone(), &what);
        result
    }

    /// A PNG of computer `id`'s screen (running is enough; not activity).
    pub async fn screenshot(&self, id: Uuid) -> Result<Vec<u8>, BrokerError> {
        self.screenshot_as(id, ImageEncoding::default())
            .await
            .map(|(image, _)| image)
    }

    /// An image of computer `id`'s screen in `encoding` (checked first: a
    /// bad one asks nothing of the guest), with the format it is in.
    pub async fn screenshot_as(
        &self,
        id: Uuid,
        encoding: ImageEncoding,
    ) -> Result<(Vec<u8>, ImageFormat), BrokerError> {
        encoding
            .check()
            .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
        let ticket = self.admit_guest(id, None, Purpose::Screenshot).await?;
        screenshot(&ticket, encoding).await
    }

    /// Runs a batch of computer-use actions in computer `id`: checked first
    /// (a bad batch changes nothing), admitted (fenced, ready; the idle
    /// timer renewed past the batch's own waits), then relayed.
    pub async fn actions(
        &self,
        id: Uuid,
        fence: Fence,
        batch: ActionBatch,
    ) -> Result<ActionResults, BrokerError> {
        let busy_for = actions::check(&batch)?;
        let ticket = self
            .admit_guest(id, fence, Purpose::Actions { busy_for })
            .await?;
        // Names and counts only: never a text or a key of the batch.
        let count = batch.actions.len();
        let mut names = std::collections::BTreeMap::new();
        for action in &batch.actions {
            *names.entry(action.name().to_string()).or_insert(0u64) += 1;
        }
        let result = run_actions(&ticket, batch).await;
        let ok = result
            .as_ref()
            .is_ok_and(|r| r.results.len() == count && r.results.iter().all(|a| a.ok));
        self.record_activity(id, ticket.actor.clone(), &Happened::Actions { names, ok });
        result
    }

    /// Opens a terminal session in computer `id`; dropping the session ends
    /// it (its processes killed and confirmed gone in the guest). The
    /// ticket's [`Ticket::revoked`] says when the caller must drop it.
    pub async fn open_terminal(
        &self,
        id: Uuid,
        fence: Fence,
        open: PtyOpen,
    ) -> Result<(PtyOpened, GuestPty, Ticket), BrokerError> {
        open.validate()
            .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
        let argv = open.argv.clone().map(Argv::given);
        let ticket = self.admit_guest(id, fence, Purpose::Exec).await?;
        let (opened, pty) = terminal(&ticket, open).await?;
        self.record_activity(id, ticket.actor.clone(), &Happened::Terminal { argv });
        Ok((opened, pty, ticket))
    }
}

/// Runs an admitted command to its confirmed end.
pub async fn exec(ticket: &Ticket, request: ExecRequest) -> Result<ExecResult, BrokerError> {
    // The guest answers within the exec's timeout and its kill bound; this
    // bound only guards against a guest that does not.
    let bound = CONNECT_TIMEOUT + Duration::from_millis(request.timeout_ms) + EXEC_KILL_MARGIN;
    let run = async { ticket.guest.connect().await?.exec(request).await };
    ticket
        .unless_revoked(async {
            match tokio::time::timeout(bound, run).await {
                Ok(result) => ticket.told(result).map_err(refusal),
                Err(_) => Err(ticket.unanswered("the command was not confirmed ended in time")),
            }
        })
        .await
}

/// Opens an admitted terminal session.
pub async fn terminal(
    ticket: &Ticket,
    open: PtyOpen,
) -> Result<(PtyOpened, GuestPty), BrokerError> {
    let conn = ticket.told(ticket.guest.connect().await)?;
    ticket.told(conn.open_pty(open).await).map_err(refusal)
}

/// An image of the admitted desktop's screen in `encoding`, with its
/// format. The guest's answer is checked to be of the format it declares;
/// a declared format other than the one asked for is the guest's failure.
pub async fn screenshot(
    ticket: &Ticket,
    encoding: ImageEncoding,
) -> Result<(Vec<u8>, ImageFormat), BrokerError> {
    let bound = guest::CONNECT_TIMEOUT + guest::SCREENSHOT_TIMEOUT;
    let shot = ticket
        .guest
        .call_within(call::Screenshot { encoding }, guest::SCREENSHOT_TIMEOUT);
    match tokio::time::timeout(bound, shot).await {
        Ok(result) => {
            let frame = ticket.told(result).map_err(BrokerError::from)?;
            if frame.message.format == encoding.format {
                Ok((frame.payload, encoding.format))
            } else {
                Err(BrokerError::GuestFailed(format!(
                    "asked for a {} screenshot, the guest answered {}",
                    encoding.format, frame.message.format
                )))
            }
        }
        Err(_) => Err(ticket.unanswered("no screenshot in time")),
    }
}

/// Relays an admitted (and validated) batch of actions and checks what the
/// guest answers against it.
pub async fn run_actions(
    ticket: &Ticket,
    batch: ActionBatch,
) -> Result<ActionResults, BrokerError> {
    ticket
        .unless_revoked(actions::relay(&ticket.guest, &ticket.answers, batch))
        .await
}

/// A fresh stream to the admitted desktop's VNC server, through the same
/// guest channel as every other call (so the live screen works wherever the
/// guest does, over the run directory or the engine's exec bridge).
pub async fn vnc(ticket: &Ticket) -> Result<UnixStream, GuestError> {
    ticket.told(ticket.guest.connect_vnc().await)
}

/// Quiesces an admitted running desktop for an export, bounded like a
/// stop's quiesce: held ([`QuiesceHold`]) when the guest knows
/// `quiesce_hold`, the plain quiesce (browsers stay closed) when it is
/// older. `false`: not quiesced (the export goes on regardless).
pub async fn hold_quiesce(ticket: &Ticket, limit: Duration) -> (bool, Option<QuiesceHold>) {
    let id = ticket.computer;
    let bound = guest::CONNECT_TIMEOUT + limit + Duration::from_secs(1);
    let held = async { ticket.guest.connect().await?.quiesce_hold(limit).await };
    let held = async { ticket.told(held.await) };
    match tokio::time::timeout(bound, held).await {
        Ok(Ok((done, hold))) => {
            tracing::info!(computer = %id, closed = ?done.closed, complete = done.complete, ms = done.elapsed_ms, "guest quiesced for an export, held until it ends");
            (true, Some(hold))
        }
        Ok(Err(GuestError::Refused { code, .. })) if code == "unknown_kind" => {
            tracing::info!(computer = %id, "the guest cannot hold a quiesce; its browsers stay closed after the export");
            let plain = limit + Duration::from_secs(1);
            match tokio::time::timeout(plain, guest::quiesce(&ticket.guest, limit)).await {
                Ok(Ok(done)) => {
                    tracing::info!(computer = %id, closed = ?done.closed, complete = done.complete, ms = done.elapsed_ms, "guest quiesced");
                    (true, None)
                }
                Ok(Err(e)) => {
                    tracing::warn!(computer = %id, error = %e, "quiesce for an export failed; exporting anyway");
                    (false, None)
                }
                Err(_) => {
                    tracing::warn!(computer = %id, "quiesce for an export did not answer in {plain:?}; exporting anyway");
                    (false, None)
                }
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(computer = %id, error = %e, "quiesce for an export failed; exporting anyway");
            (false, None)
        }
        Err(_) => {
            tracing::warn!(computer = %id, "quiesce for an export did not answer in {bound:?}; exporting anyway");
            (false, None)
        }
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
