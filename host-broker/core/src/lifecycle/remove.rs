//! `remove`: only on explicit request. A running desktop is stopped gracefully
//! first (so its browser profiles flush into the workspace), then the desktop
//! is destroyed. The workspace outlives removal unless `purge`; it can be
//! re-adopted by a new computer with `workspace_from`. The record and run
//! directory are deleted by the owner after this returns.
//!
//! Deleting a workspace may take seconds (a guest can fill it with many
//! files): it runs on the blocking pool, never on the owner task.

use dormouse_protocol::api::StopReason;
use uuid::Uuid;

use super::{stop, OpContext};
use crate::error::BrokerError;
use crate::faults;
use crate::store::{remove_tree, StoreError};

/// Removes the desktop of a computer (stopping it first if it runs) and,
/// with `purge`, its workspace.
pub async fn run(ctx: &OpContext, id: Uuid, purge: bool) -> Result<(), BrokerError> {
    faults::step("remove: begun");
    let desktop = ctx.backend.observe(id).await?;
    faults::step("remove: observed");
    if desktop.is_some_and(|d| d.state.is_up()) {
        let intent = stop::begin(ctx, id, StopReason::Manual)?;
        match stop::run(ctx, id, intent).await {
            Ok(_) | Err(BrokerError::WrongState(_)) => {}
            Err(e) => return Err(e),
        }
    }
    ctx.backend.destroy(id).await?;
    faults::step("remove: desktop destroyed");
    if purge {
        let workspace = ctx.backend.workspace(id);
        if let Err(e) = blocking(move || remove_tree("purge workspace", &workspace)).await {
            tracing::error!(computer = %id, error = %e, "purging the workspace failed");
            return Err(e.into());
        }
        faults::step("remove: workspace purged");
    }
    Ok(())
}

/// Runs file-system work on the blocking pool.
pub async fn blocking(
    work: impl FnOnce() -> Result<(), StoreError> + Send + 'static,
) -> Result<(), StoreError> {
    let op = faults::current();
    tokio::task::spawn_blocking(move || {
        let _op = faults::scope_of(op);
        work()
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))?
}
