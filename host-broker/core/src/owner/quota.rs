//! The workspace limit of each computer: applied (by the quota tools, in a
//! task of its own) when a workspace comes into being or is replaced (create,
//! adoption, import) and once per computer at start-up, and kept on the
//! [`Computer`](super::computer::Computer) so every status shows it.
//!
//! It never runs a quota tool on the owner task, and never on a status
//! poll: a status only reads what the last application found.

use dormouse_protocol::api::WorkspaceLimit;
use uuid::Uuid;

use super::{Internal, Owner};
use crate::quota;

/// Most workspace limits applied at once: a broker start with many
/// computers runs a few `chattr -R` at a time, not one per computer.
pub(super) const CONCURRENT: usize = 4;

impl Owner {
    /// Sets the workspace limit of computer `id` again; its result arrives
    /// as [`Internal::WorkspaceLimit`]. An application still running for an
    /// older workspace is outdated by this one (its answer is discarded).
    pub(super) fn apply_workspace_limit(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        c.limit_epoch += 1;
        let epoch = c.limit_epoch;
        let workspace = c.record.workspace.clone();
        let wanted = self.ctx.config.workspace_quota;
        let tx = self.internal.clone();
        let slots = self.quota_slots.clone();
        self.tasks.spawn(async move {
            // Never closed: the owner holds the semaphore as long as its tasks.
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            let limit = quota::apply_workspace_limit(id, &workspace, wanted).await;
            let _ = tx.send(Internal::WorkspaceLimit { id, epoch, limit }).await;
        });
    }

    pub(super) fn on_workspace_limit(&mut self, id: Uuid, epoch: u64, limit: WorkspaceLimit) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if epoch != c.limit_epoch {
            return;
        }
        if limit.enforced {
            tracing::info!(computer = %id, bytes = ?limit.bytes, inodes = ?limit.inodes, "workspace limit enforced");
        }
        c.workspace_limit = Some(limit);
        self.dirty.insert(id);
    }
}
