//! Workspace requests as the owner sees them: it authorises (the computer
//! exists, its state allows it, the caller's generation fences) and says
//! where the workspace is. The blocking work — reading, writing, walking,
//! archiving — runs on the blocking pool, in the API handler or in a task of
//! the owner, never on the owner task itself.
//!
//! Nothing here starts a desktop or renews its idle timer: reading files,
//! measuring the disk and exporting are not activity. The one guest request
//! is the quiesce before an export of a running desktop (browsers closed so
//! their profiles are consistent), held for as long as the export's grant
//! lives: dropping the grant (the archive is written, the export failed or
//! its client went away) releases it and the guest reopens the browsers. A
//! guest too old to hold one gets the stop's plain quiesce instead, and one
//! that does not answer in time leaves the export unquiesced. An import is
//! the computer's operation in flight ([`super::ops`]), so no start, stop or
//! remove can run beside it, and it only begins on a stopped desktop.

use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dormouse_protocol::activity::Actor;
use dormouse_protocol::api::CreateComputer;
use uuid::Uuid;

use super::commands::Answer;
use super::ops::{OpKind, Pending};
use super::Owner;
use crate::activity::actor_of;
use crate::command::{Fence, Reply};
use crate::engine::Observed;
use crate::error::BrokerError;
use crate::relay::{self, Purpose};
use crate::store::{last_screen, LastScreen, Paths};
use crate::workspace::{
    self, disk_usage, replace_from_tar, ChannelReader, DiskUsage, ImportSummary, WorkspaceRoot,
};

pub use crate::command::{WorkspaceAccess, WorkspaceGrant};

impl Owner {
    fn grant(&self, id: Uuid) -> WorkspaceGrant {
        WorkspaceGrant {
            id,
            path: self.ctx.backend.workspace(id),
            actor: Actor::Api,
            limits: self.config().workspace.clone(),
            quiesced: false,
            hold: None,
        }
    }

    pub(super) fn workspace(
        &mut self,
        (id, access): (Uuid, WorkspaceAccess),
        reply: Reply<WorkspaceGrant>,
    ) -> Answer<WorkspaceGrant> {
        let importing = |op: Option<OpKind>| {
            if op == Some(OpKind::Import) {
                Err(BrokerError::WrongState(
                    "a workspace import is in progress".into(),
                ))
            } else {
                Ok(())
            }
        };
        let checked = match access {
            WorkspaceAccess::Read => self
                .computers
                .get(&id)
                .map(|_| ())
                .ok_or(BrokerError::NotFound(id)),
            WorkspaceAccess::Write(fence) => self
                .admit(id, fence)
                .and_then(|c| importing(c.op.as_ref().map(|o| o.kind()))),
            WorkspaceAccess::Export { .. } => self
                .computers
                .get(&id)
                .ok_or(BrokerError::NotFound(id))
                .and_then(|c| importing(c.op.as_ref().map(|o| o.kind()))),
        };
        if let Err(e) = checked {
            return Answer::Now(reply, Err(e));
        }
        let mut grant = self.grant(id);
        if let (WorkspaceAccess::Write(fence), Some(c)) = (access, self.computers.get(&id)) {
            grant.actor = actor_of(c.record.lease.as_ref(), fence);
        }
        let running = self.computers.get(&id).is_some_and(|c| c.engine.is_up());
        match access {
            WorkspaceAccess::Export { quiesce: true } if running => {
                let ticket = match self.decide_guest(id, None, Purpose::ExportQuiesce) {
                    Ok(ticket) => ticket,
                    Err(e) => return Answer::Now(reply, Err(e)),
                };
                let limit = self.ctx.config.quiesce_timeout;
                self.tasks.spawn(async move {
                    let (quiesced, hold) = relay::hold_quiesce(&ticket, limit).await;
                    // A caller that went away drops the grant: the hold ends.
                    let _ = reply.send(Ok(WorkspaceGrant {
                        quiesced,
                        hold,
                        ..grant
                    }));
                });
                Answer::Later
            }
            _ => Answer::Now(reply, Ok(grant)),
        }
    }

    /// Measures the workspace (bounded by the configured deadline) and asks
    /// the backend for the writable layer (bounded the same), in a task.
    pub(super) fn disk(&mut self, id: Uuid, reply: Reply<DiskUsage>) -> Answer<DiskUsage> {
        if !self.computers.contains_key(&id) {
            return Answer::Now(reply, Err(BrokerError::NotFound(id)));
        }
        let grant = self.grant(id);
        let deadline = grant.limits.disk_deadline;
        let backend = self.ctx.backend.clone();
        self.tasks.spawn(async move {
            let layer = async {
                match tokio::time::timeout(deadline, backend.layer_bytes(id)).await {
                    Ok(Ok(bytes)) => bytes,
                    Ok(Err(e)) => {
                        tracing::warn!(computer = %id, error = %e, "the backend did not measure the writable layer");
                        None
                    }
                    Err(_) => {
                        tracing::warn!(computer = %id, ?deadline, "the backend did not measure the writable layer in time");
                        None
                    }
                }
            };
            let path = grant.path;
            let walk = tokio::task::spawn_blocking(move || {
                disk_usage(&WorkspaceRoot::open(&path)?, deadline)
            });
            let (layer_bytes, walked) = tokio::join!(layer, walk);
            let result = match walked {
                Ok(Ok(usage)) => Ok(DiskUsage {
                    layer_bytes,
                    ..usage
                }),
                Ok(Err(e)) => Err(BrokerError::from(e)),
                Err(e) => Err(BrokerError::Internal(format!("disk usage task: {e}"))),
            };
            let _ = reply.send(result);
        });
        Answer::Later
    }

    /// The screen kept at the last stop ([`crate::store::last_screen`]),
    /// read on the blocking pool. One that cannot be read is logged and
    /// answered as none: it is never served.
    pub(super) fn last_screen(
        &mut self,
        id: Uuid,
        reply: Reply<Option<LastScreen>>,
    ) -> Answer<Option<LastScreen>> {
        if !self.computers.contains_key(&id) {
            return Answer::Now(reply, Err(BrokerError::NotFound(id)));
        }
        let paths = self.ctx.paths.clone();
        self.tasks.spawn(async move {
            let result = match tokio::task::spawn_blocking(move || last_screen::load(&paths, id)).await {
                Ok(Ok(kept)) => Ok(kept),
                Ok(Err(e)) => {
                    tracing::warn!(computer = %id, error = %e, "the last screen cannot be read; none is served");
                    Ok(None)
                }
                Err(e) => Err(BrokerError::Internal(format!("last screen task: {e}"))),
            };
            let _ = reply.send(result);
        });
        Answer::Later
    }

    /// Replaces the workspace of a stopped desktop from a tar read from
    /// `body`, as the computer's operation.
    pub(super) fn import(
        &mut self,
        (id, fence, body): (Uuid, Fence, ChannelReader),
        reply: Reply<ImportSummary>,
    ) -> Answer<ImportSummary> {
        if let Err(e) = self
            .admit_idle_op(id, fence)
            .map(drop)
            .and_then(|()| self.require_known(id))
        {
            return Answer::Now(reply, Err(e));
        }
        let Some(c) = self.computers.get(&id) else {
            return Answer::Now(reply, Err(BrokerError::NotFound(id)));
        };
        let down = match &c.engine {
            Observed::Missing => true,
            Observed::Present(info) => info.state.is_down(),
            Observed::Unknown(_) => false,
        };
        if !down {
            let e = BrokerError::WrongState(
                "the desktop must be stopped to replace its workspace (its mount holds the old one)"
                    .into(),
            );
            return Answer::Now(reply, Err(e));
        }
        let actor = actor_of(c.record.lease.as_ref(), fence);
        let grant = self.grant(id);
        self.launch(
            id,
            move |_, _| async move {
                // Aborting this task (a lease takeover fences it) drops the
                // guard, and the import's next read fails: nothing is swapped.
                let guard = Cancel::default();
                let reader = Cancellable {
                    inner: body,
                    cancelled: guard.0.clone(),
                };
                let limits = grant.limits.import;
                let path = grant.path;
                let op = crate::faults::current();
                let done = tokio::task::spawn_blocking(move || {
                    let _op = crate::faults::scope_of(op);
                    replace_from_tar(&path, reader, &limits)
                })
                .await;
                drop(guard);
                match done {
                    Ok(result) => result.map_err(BrokerError::from),
                    Err(e) => Err(BrokerError::Internal(format!("import task: {e}"))),
                }
            },
            |done| Pending::Import { reply, done },
        );
        self.op_by(id, actor);
        Answer::Later
    }

    /// A fresh, unused id whose workspace path a create from a tar stages
    /// into, after the create's own checks (name, owner, capacity) passed.
    /// The create that follows adopts it with `workspace_from`.
    pub(super) fn import_slot(
        &mut self,
        request: CreateComputer,
        reply: Reply<WorkspaceGrant>,
    ) -> Answer<WorkspaceGrant> {
        if request.workspace_from.is_some() {
            let e = BrokerError::BadRequest(
                "workspace_from and a workspace archive exclude each other".into(),
            );
            return Answer::Now(reply, Err(e));
        }
        if let Err(e) = self.admit_create(&request) {
            return Answer::Now(reply, Err(e));
        }
        let mut slot = Uuid::new_v4();
        while self.computers.contains_key(&slot) {
            slot = Uuid::new_v4();
        }
        Answer::Now(reply, Ok(self.grant(slot)))
    }
}

/// Sets its flag when dropped.
#[derive(Debug, Default)]
struct Cancel(Arc<AtomicBool>);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A reader that fails once its flag is set.
struct Cancellable<R> {
    inner: R,
    cancelled: Arc<AtomicBool>,
}

impl<R: Read> Read for Cancellable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(io::Error::other("the import was abandoned"));
        }
        self.inner.read(buf)
    }
}

/// Makes every workspace under the data directory whole after a crash
/// during an import or a create from a tar ([`workspace::recover`]): those
/// of computers with records, kept workspaces of removed ones, and staging
/// slots of creates that never finished (whose directories, empty after
/// recovery, are removed). Blocking: run it on the blocking pool.
///
/// It walks the data directory's own layout (`paths`), not
/// [`Backend::workspace`](crate::engine::Backend::workspace): it runs at
/// start-up before the backend is asked anything, and what it must find
/// includes kept workspaces and staging slots of computers no record (and
/// so no backend) knows any more; only the directory names them.
pub fn recover_all(paths: &Paths) {
    let root = paths.computers();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = Paths::computer_of(&entry) else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir {
            continue;
        }
        match workspace::journal::recover(&paths.workspace(id)) {
            Ok(0) => {}
            Ok(removed) => {
                tracing::warn!(computer = %id, removed, "removed the temp files of file writes cut short");
            }
            Err(e) => {
                tracing::error!(computer = %id, error = %e, "cannot finish the journal of file writes");
            }
        }
        match workspace::recover(&paths.workspace(id)) {
            Ok(done) if done.acted() => {
                tracing::warn!(computer = %id, ?done, "recovered a workspace after an interrupted import");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(computer = %id, error = %e, "cannot recover the workspace");
            }
        }
        remove_if_empty(&paths.computer_dir(id));
    }
}

/// Removes a computer directory that holds nothing (a staging slot whose
/// create never finished); anything else stays.
fn remove_if_empty(dir: &Path) {
    let empty = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if empty {
        let _ = std::fs::remove_dir(dir);
    }
}
