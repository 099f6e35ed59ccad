//! Reconciling the broker's records with what the engine says, on start-up
//! and whenever the engine's event stream reconnects.
//!
//! - Each record's desktop and image are observed ([`observe`]).
//! - A stop that was begun but not confirmed (an intent in the stop-reason
//!   store) is settled ([`settle_intent`]): finished if the container still
//!   runs, confirmed with the engine's `FinishedAt` if it stopped after the
//!   intent, dropped otherwise.
//! - Containers labelled as ours with no record are reported as [`Orphan`]s
//!   (logged and listed), never removed: deleting a desktop is never the
//!   broker's guess.
//!
//! This module only observes and decides; the owner applies the decisions.

use std::collections::HashSet;

use chrono::Duration as ChronoDuration;
use uuid::Uuid;

use crate::engine::{Backend, EngineError, Observed};
use crate::store::{ComputerRecord, StopRecord};

/// How much earlier than the intent a `FinishedAt` may be and still count
/// as the end of that stop (the engine and the broker share one clock, this
/// only absorbs rounding).
const INTENT_SLACK_MS: i64 = 2000;

/// The API type of an orphan; defined with the other API types.
pub use dormouse_protocol::api::Orphan;

/// Observes a record's desktop and image. The image is "present" only when
/// the backend resolves the recorded ID to exactly that ID.
pub async fn observe(backend: &dyn Backend, record: &ComputerRecord) -> (Observed, Option<bool>) {
    let view = match backend.observe(record.id).await {
        Ok(Some(desktop)) => Observed::Present(Box::new(desktop)),
        Ok(None) => Observed::Missing,
        Err(e) => return (Observed::Unknown(e.to_string()), None),
    };
    let image = match backend.image(&record.image_id).await {
        Ok(image) => Some(image.is_some_and(|i| i.id == record.image_id)),
        Err(_) => None,
    };
    (view, image)
}

/// What to do about a stop-reason record at reconciliation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentAction {
    /// Nothing to settle (no record, or a confirmed one).
    Keep,
    /// The container still runs: finish the stop this intent began.
    Finish(StopRecord),
    /// The container stopped after the intent: confirm with its `FinishedAt`.
    Confirm(StopRecord),
    /// The intent cannot be matched to a stop (container gone, or stopped
    /// before the intent): forget it.
    Drop,
    /// The engine cannot be asked now; settle later.
    Later,
}

/// Decides what to do about a stop record given the engine's view.
pub fn settle_intent(record: Option<&StopRecord>, view: &Observed) -> IntentAction {
    let Some(record) = record.filter(|r| !r.confirmed) else {
        return IntentAction::Keep;
    };
    match view {
        Observed::Unknown(_) => IntentAction::Later,
        Observed::Missing => IntentAction::Drop,
        Observed::Present(info) if info.state.is_up() => IntentAction::Finish(record.clone()),
        Observed::Present(info) => match info.finished_at {
            Some(finished)
                if finished >= record.begun_at - ChronoDuration::milliseconds(INTENT_SLACK_MS) =>
            {
                IntentAction::Confirm(record.confirm(Some(finished)))
            }
            _ => IntentAction::Drop,
        },
    }
}

/// Containers labelled as ours that no record knows. Each is logged.
pub async fn find_orphans(
    backend: &dyn Backend,
    known: &HashSet<Uuid>,
) -> Result<Vec<Orphan>, EngineError> {
    let listed = backend.inventory().await?;
    let mut orphans = Vec::new();
    for c in listed {
        let ours = Uuid::parse_str(&c.computer).is_ok_and(|id| known.contains(&id));
        if ours {
            continue;
        }
        tracing::warn!(
            container = %c.name,
            computer = %c.computer,
            state = %c.state,
            "container labelled as a Dormouse computer has no record here; leaving it alone"
        );
        orphans.push(Orphan {
            container: c.name,
            computer: c.computer,
            owner: c.owner,
            state: c.state,
        });
    }
    Ok(orphans)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use dormouse_protocol::api::StopReason;

    use super::*;
    use crate::engine::{Desktop, RunState};

    fn info(state: RunState, finished_at: Option<chrono::DateTime<Utc>>) -> Observed {
        Observed::Present(Box::new(Desktop {
            state,
            ..Desktop::test_stopped(finished_at, 0)
        }))
    }

    #[test]
    fn intents_are_settled_by_what_the_engine_says() {
        let begun = Utc::now();
        let intent = StopRecord::intent(StopReason::Idle, begun);
        assert_eq!(
            settle_intent(Some(&intent), &info(RunState::Running, None)),
            IntentAction::Finish(intent.clone())
        );
        let after = begun + ChronoDuration::seconds(3);
        assert_eq!(
            settle_intent(Some(&intent), &info(RunState::Exited, Some(after))),
            IntentAction::Confirm(intent.confirm(Some(after)))
        );
        let long_before = begun - ChronoDuration::hours(1);
        assert_eq!(
            settle_intent(Some(&intent), &info(RunState::Exited, Some(long_before))),
            IntentAction::Drop
        );
        assert_eq!(
            settle_intent(Some(&intent), &info(RunState::Exited, None)),
            IntentAction::Drop
        );
        assert_eq!(
            settle_intent(Some(&intent), &Observed::Missing),
            IntentAction::Drop
        );
        assert_eq!(
            settle_intent(Some(&intent), &Observed::Unknown("down".into())),
            IntentAction::Later
        );
    }

    #[test]
    fn confirmed_records_and_no_record_are_kept() {
        let t = Utc::now();
        let confirmed = StopRecord::intent(StopReason::Manual, t).confirm(Some(t));
        assert_eq!(
            settle_intent(Some(&confirmed), &info(RunState::Running, None)),
            IntentAction::Keep
        );
        assert_eq!(
            settle_intent(None, &info(RunState::Running, None)),
            IntentAction::Keep
        );
    }
}
