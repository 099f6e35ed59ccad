//! `start` (resume): the same desktop started again, only when every check
//! passes against the record of how it was created.
//!
//! The checks fail closed: backend reachable, desktop present and stopped,
//! and everything the backend judges of how it was made ([`Desktop::check`],
//! the backend's [`crate::engine::Provenance`]). Anything unknown is
//! a refusal with a reason. Resume never creates, removes or recreates
//! anything.

use super::{stop_key, OpContext};
use crate::engine::{Desktop, Refusal};
use crate::error::BrokerError;
use crate::faults;
use crate::store::ComputerRecord;

impl From<Refusal> for BrokerError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Running => BrokerError::WrongState(r.message()),
            Refusal::Problem(p) => BrokerError::NotResumable(p),
        }
    }
}

/// Every resume check, on what the backend says now. `image_present` is
/// `None` when unknown (which fails closed).
pub fn check(
    record: &ComputerRecord,
    desktop: Option<&Desktop>,
    image_present: Option<bool>,
) -> Result<(), Refusal> {
    match desktop {
        None => Err(Refusal::Problem(format!(
            "{} is missing",
            record.spec.describe()
        ))),
        Some(desktop) => desktop.check(record.origin(), image_present),
    }
}

/// Checks everything afresh, clears the previous stop reason and starts the
/// same desktop. Returns what the backend says after the start.
pub async fn run(ctx: &OpContext, record: &ComputerRecord) -> Result<Desktop, BrokerError> {
    let backend = ctx.backend.as_ref();
    faults::step("resume: begun");
    let desktop = backend.observe(record.id).await?;
    faults::step("resume: observed");
    let image = backend.image(&record.image_id).await?;
    faults::step("resume: image inspected");
    let image_present = Some(image.is_some_and(|i| i.id == record.image_id));
    check(record, desktop.as_ref(), image_present)?;
    backend.resume(record.id).await?;
    faults::step("resume: engine started");
    // A start clears the reason of the previous stop: only once it
    // happened, so a start that never came keeps it. One left by a crash
    // in between names a stop whose `FinishedAt` the next stop replaces,
    // so it is never shown for another stop.
    if let Err(e) = ctx.stops.clear(&stop_key(record.id)) {
        tracing::warn!(computer = %record.id, error = %e, "started, but the previous stop reason cannot be cleared");
    }
    faults::step("resume: stop reason cleared");
    let seen = backend.observe(record.id).await?;
    faults::step("resume: observed after start");
    seen.ok_or_else(|| BrokerError::Internal("the desktop vanished right after its start".into()))
}
