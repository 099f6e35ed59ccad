//! `remove`: only on explicit request. A running desktop is stopped gracefully
//! first (so its browser profiles flush into the workspace), then the
//! container is removed. The workspace outlives removal unless `purge`; it can
//! be re-adopted by a new computer with `workspace_from`. The record and run
//! directory are deleted by the owner after this returns.

use dormouse_protocol::api::StopReason;
use uuid::Uuid;

use super::{container_name, engine_error, stop, OpContext};
use crate::engine::EngineError;
use crate::error::BrokerError;

/// Removes the container of a computer (stopping it first if it runs) and,
/// with `purge`, its workspace.
pub async fn run(ctx: &OpContext, id: Uuid, purge: bool) -> Result<(), BrokerError> {
    let name = container_name(id);
    let info = ctx.engine.inspect(&name).await.map_err(engine_error)?;
    if info.is_some_and(|i| i.state.is_up()) {
        let intent = stop::begin(ctx, id, StopReason::Manual)?;
        match stop::run(ctx, id, intent).await {
            Ok(_) | Err(BrokerError::WrongState(_)) => {}
            Err(e) => return Err(e),
        }
    }
    match ctx.engine.remove(&name).await {
        Ok(()) | Err(EngineError::NotFound(_)) => {}
        Err(e) => return Err(engine_error(e)),
    }
    if purge {
        let workspace = ctx.paths.workspace(id);
        let result =
            tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&workspace) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            })
            .await
            .map_err(|e| BrokerError::Internal(format!("purge task: {e}")))?;
        if let Err(e) = result {
            tracing::error!(computer = %id, error = %e, "purging the workspace failed");
            return Err(BrokerError::Internal(
                "the workspace could not be deleted".into(),
            ));
        }
    }
    Ok(())
}
