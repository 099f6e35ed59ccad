//! `stop`: a thumbnail of the screen kept, quiesce through the supervisor
//! (both bounded), then the backend's suspend, with the reason recorded
//! against the desktop's `FinishedAt`.
//!
//! Order matters for crash safety: the *intent* is persisted ([`begin`])
//! before the stop is reported as under way or anything is asked of the guest
//! or the engine, so a broker that dies mid-stop finishes the stop on its next
//! start-up; the *confirmation* carries `FinishedAt` read by inspect
//! after the stop, which is what later tells our stop apart from a foreign
//! one. Stop never removes or recreates anything.

use std::time::Duration;

use chrono::Utc;
use dormouse_protocol::actions::{Action, ActionBatch, Scale};
use dormouse_protocol::api::StopReason;
use dormouse_protocol::Quiesced;
use uuid::Uuid;

use super::{stop_key, OpContext};
use crate::engine::Desktop;
use crate::error::BrokerError;
use crate::faults;
use crate::guest;
use crate::store::last_screen::{self, LAST_SCREEN_BOX, LAST_SCREEN_FORMAT};
use crate::store::{StopRecord, StoreError};

/// How long a stop waits for the screen's thumbnail (it takes 20–40 ms).
const LAST_SCREEN_WAIT: Duration = Duration::from_secs(1);

/// The thumbnail's WebP effort (lossless WebP: the pixels are exact at any).
const LAST_SCREEN_QUALITY: u8 = 70;

/// What a completed stop found.
#[derive(Debug, Clone)]
pub struct Stopped {
    /// The backend's view after the stop.
    pub info: Desktop,
    /// The confirmed stop record.
    pub record: StopRecord,
    /// What the guest said to `quiesce`, if it answered.
    pub quiesced: Option<Quiesced>,
    /// Why the confirmed record could not be saved (a full disk), if so:
    /// the stop happened all the same, and the record on disk is the one
    /// before it (the intent, or nothing), whole.
    pub unsaved: Option<String>,
}

/// Records the intent to stop for `reason` (atomically, fsynced) and returns
/// it. The owner calls this *before* it reports the stop as under way, so a
/// broker killed at any later moment finishes the stop on its next start-up.
pub fn begin(ctx: &OpContext, id: Uuid, reason: StopReason) -> Result<StopRecord, BrokerError> {
    let intent = StopRecord::intent(reason, Utc::now());
    ctx.stops.save(&stop_key(id), &intent)?;
    faults::step("stop: intent saved");
    Ok(intent)
}

/// Stops a running computer whose intent is recorded ([`begin`]).
pub async fn run(ctx: &OpContext, id: Uuid, intent: StopRecord) -> Result<Stopped, BrokerError> {
    faults::step("stop: begun");
    let info = ctx
        .backend
        .observe(id)
        .await?
        .ok_or_else(|| BrokerError::WrongState("the desktop is missing".into()))?;
    faults::step("stop: observed");
    if !info.state.is_up() {
        // Nothing to stop: the intent matches no stop.
        ctx.stops.clear(&stop_key(id))?;
        return Err(BrokerError::WrongState("the desktop is not running".into()));
    }
    // Before quiesce, which closes the browsers the thumbnail should show.
    keep_last_screen(ctx, id).await;
    faults::step("stop: last screen kept");
    let quiesced = quiesce(ctx, id).await;
    faults::step("stop: guest quiesced");
    let (info, record, unsaved) = finish(ctx, id, &intent).await?;
    Ok(Stopped {
        info,
        record,
        quiesced,
        unsaved,
    })
}

/// Keeps a thumbnail of the screen as it is now as the desktop's last
/// screen ([`last_screen`]), bounded by [`LAST_SCREEN_WAIT`]. A guest that
/// does not answer, or answers anything but one WebP, keeps the one before;
/// it is logged and never blocks the stop.
pub async fn keep_last_screen(ctx: &OpContext, id: Uuid) {
    let batch = ActionBatch {
        actions: vec![Action::Screenshot {
            format: Some(LAST_SCREEN_FORMAT),
            quality: Some(LAST_SCREEN_QUALITY),
        }],
        scale: Some(Scale {
            width: LAST_SCREEN_BOX.0,
            height: LAST_SCREEN_BOX.1,
        }),
        cursor: false,
    };
    let socket = ctx.socket(id);
    let shot = async {
        socket
            .connect()
            .await?
            .actions(batch, LAST_SCREEN_WAIT)
            .await
    };
    let image = match tokio::time::timeout(LAST_SCREEN_WAIT, shot).await {
        Ok(Ok(frame))
            if frame.message.results.first().is_some_and(|r| r.ok)
                && frame.message.image_lens == [frame.payload.len() as u64] =>
        {
            frame.payload
        }
        Ok(Ok(_)) => {
            tracing::warn!(computer = %id, "the guest's screenshot before the stop is not one image; the last screen is kept as it was");
            return;
        }
        Ok(Err(e)) => {
            tracing::info!(computer = %id, error = %e, "no screenshot before the stop; the last screen is kept as it was");
            return;
        }
        Err(_) => {
            tracing::info!(computer = %id, "no screenshot in {LAST_SCREEN_WAIT:?} before the stop; the last screen is kept as it was");
            return;
        }
    };
    let paths = ctx.paths.clone();
    let op = faults::current();
    let save = move || {
        let _op = faults::scope_of(op);
        last_screen::save(&paths, id, &image)
    };
    match tokio::task::spawn_blocking(save).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(computer = %id, error = %e, "the last screen cannot be kept");
        }
        Err(e) => {
            tracing::warn!(computer = %id, error = %e, "the last screen's write did not finish")
        }
    }
}

/// Asks the guest to close browsers cleanly, bounded by the configured
/// quiesce timeout. Failure is logged and never blocks the stop.
pub async fn quiesce(ctx: &OpContext, id: Uuid) -> Option<Quiesced> {
    let limit = ctx.config.quiesce_timeout;
    let socket = ctx.socket(id);
    let bound = limit + std::time::Duration::from_secs(1);
    match tokio::time::timeout(bound, guest::quiesce(&socket, limit)).await {
        Ok(Ok(done)) => {
            tracing::info!(computer = %id, closed = ?done.closed, complete = done.complete, ms = done.elapsed_ms, "guest quiesced");
            Some(done)
        }
        Ok(Err(e)) => {
            tracing::warn!(computer = %id, error = %e, "quiesce failed; stopping anyway");
            None
        }
        Err(_) => {
            tracing::warn!(computer = %id, "quiesce did not answer in {bound:?}; stopping anyway");
            None
        }
    }
}

/// The backend half of a stop whose intent is recorded: suspend, observe,
/// then confirm (or drop) the intent according to what the backend says.
///
/// Once the backend says the desktop is down the stop has happened, so a
/// confirmation that cannot be saved (a full disk) does not turn it into a
/// failure: it comes back as the third value, the reason it was not saved.
pub async fn finish(
    ctx: &OpContext,
    id: Uuid,
    intent: &StopRecord,
) -> Result<(Desktop, StopRecord, Option<String>), BrokerError> {
    let key = stop_key(id);
    let stopped = ctx.backend.suspend(id, ctx.config.stop_timeout).await;
    faults::step("stop: engine stopped");
    let after = ctx.backend.observe(id).await;
    faults::step("stop: observed after the stop");
    match (stopped, after) {
        (_, Ok(Some(info))) if !info.state.is_up() => {
            let record = intent.confirm(info.finished_at);
            let unsaved = match ctx.stops.save(&key, &record) {
                Ok(()) => {
                    faults::step("stop: confirmed");
                    None
                }
                Err(e) => {
                    tracing::error!(computer = %id, error = %e, "stopped, but the stop record cannot be saved");
                    Some(why_unsaved(&e))
                }
            };
            Ok((info, record, unsaved))
        }
        (Ok(()), Ok(Some(info))) => {
            ctx.stops.clear(&key)?;
            Err(BrokerError::Internal(format!(
                "the backend stopped the desktop but it is {}",
                info.state
            )))
        }
        (Err(e), Ok(Some(_))) => {
            // Definitely still running: the stop did not happen.
            ctx.stops.clear(&key)?;
            Err(e.into())
        }
        (_, Ok(None)) => {
            ctx.stops.clear(&key)?;
            Err(BrokerError::WrongState("the desktop vanished".into()))
        }
        (Err(e), Err(_)) | (Ok(()), Err(e)) => {
            // Unknown outcome: keep the intent; reconciliation finishes it.
            Err(e.into())
        }
    }
}

/// Why a record was not saved, in words a status may carry (the store's own
/// message names host paths; those stay in the log).
pub fn why_unsaved(e: &StoreError) -> String {
    match e {
        StoreError::Io { source, .. } => source.to_string(),
        StoreError::Corrupt { .. } => "the stop record is not valid".to_owned(),
        StoreError::Task(why) => why.clone(),
    }
}
