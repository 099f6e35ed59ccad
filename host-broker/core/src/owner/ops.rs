//! The operations in flight: at most one per computer, each run as a task
//! of its own that carries its own payload and delivers its own result
//! type, and what the owner does with that result.
//!
//! An operation is one [`Pending`] variant holding whom to answer and a
//! receiver of exactly its result type; a stop carries the intent that was
//! persisted before it began. So a result can only meet the operation that
//! produced it, and no stop can run without its intent.

use dormouse_protocol::activity::{Actor, Happened};
use dormouse_protocol::api::{BrokerEvent, ComputerStatus, StopReason};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::computer::ReadyWait;
use super::{arm_idle, disarm_idle, stop_follower, takeover_grace, Internal, Owner};
use crate::command::Reply;
use crate::engine::Desktop;
use crate::engine::Observed;
use crate::error::BrokerError;
use crate::faults;
use crate::lifecycle::remove::blocking;
use crate::lifecycle::{create, remove, resume, stop, stop_key, OpContext};
use crate::store::{intent, ComputerRecord, StopRecord};
use crate::workspace::ImportSummary;

/// Which operation is in flight, for messages and for the rules that
/// depend only on its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Create and first start.
    Create,
    /// Resume.
    Start,
    /// Stop, for a reason.
    Stop {
        /// Why (`idle`, `manual`, `fenced`, or an interrupted stop's reason).
        reason: StopReason,
    },
    /// Remove.
    Remove {
        /// Also delete the workspace.
        purge: bool,
    },
    /// Replace the workspace from a tar (desktop stopped).
    Import,
}

impl OpKind {
    /// For messages.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Create => "a create",
            Self::Start => "a start",
            Self::Stop { .. } => "a stop",
            Self::Remove { .. } => "a remove",
            Self::Import => "a workspace import",
        }
    }

    /// Its name for the crash points ([`faults::op`]).
    pub fn fault_name(self) -> &'static str {
        match self {
            Self::Create => faults::op::CREATE,
            Self::Start => faults::op::RESUME,
            Self::Stop { .. } => faults::op::STOP,
            Self::Remove { .. } => faults::op::REMOVE,
            Self::Import => faults::op::IMPORT,
        }
    }
}

/// An operation in flight: whom it answers and where its result arrives.
#[derive(Debug)]
pub enum Pending {
    /// Create and first start: answered with the status once it runs.
    Create {
        /// Whom to answer.
        reply: Reply<ComputerStatus>,
        /// The desktop after its start.
        done: oneshot::Receiver<Result<Desktop, BrokerError>>,
    },
    /// Resume: answered with the status once it runs.
    Start {
        /// Whom to answer.
        reply: Reply<ComputerStatus>,
        /// The desktop after its start.
        done: oneshot::Receiver<Result<Desktop, BrokerError>>,
    },
    /// Stop, for a reason; nobody waits when the broker itself stops it.
    Stop {
        /// Why.
        reason: StopReason,
        /// Whom to answer.
        reply: Option<Reply<ComputerStatus>>,
        /// What the stop found.
        done: oneshot::Receiver<Result<stop::Stopped, BrokerError>>,
    },
    /// Remove, answered when the record is gone.
    Remove {
        /// Whether the workspace goes too.
        purge: bool,
        /// Whom to answer.
        reply: Reply<()>,
        /// Whether it worked.
        done: oneshot::Receiver<Result<(), BrokerError>>,
    },
    /// Workspace import, answered once swapped in (or refused).
    Import {
        /// Whom to answer.
        reply: Reply<ImportSummary>,
        /// What was imported.
        done: oneshot::Receiver<Result<ImportSummary, BrokerError>>,
    },
}

impl Pending {
    /// Its kind.
    pub fn kind(&self) -> OpKind {
        match self {
            Self::Create { .. } => OpKind::Create,
            Self::Start { .. } => OpKind::Start,
            Self::Stop { reason, .. } => OpKind::Stop { reason: *reason },
            Self::Remove { purge, .. } => OpKind::Remove { purge: *purge },
            Self::Import { .. } => OpKind::Import,
        }
    }

    /// Answers whoever waits with a failure (the operation is abandoned).
    fn fail(self, error: BrokerError) {
        match self {
            Self::Create { reply, .. } | Self::Start { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Stop { reply, .. } => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(error));
                }
            }
            Self::Remove { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Import { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// The mutating operation in flight on a computer (at most one).
#[derive(Debug)]
pub struct InFlight {
    /// Distinguishes it from an aborted predecessor.
    pub op_id: u64,
    /// What it does and whom it answers.
    pub pending: Pending,
    /// When it began (resume latency is measured from here).
    pub started: Instant,
    /// To abandon it (fencing takeover of a hung operation).
    pub abort: AbortHandle,
    /// Who asked for it, for the activity record (the broker unless a
    /// command says otherwise, [`Owner::op_by`]).
    pub actor: Actor,
}

impl InFlight {
    /// Its kind.
    pub fn kind(&self) -> OpKind {
        self.pending.kind()
    }
}

impl Owner {
    /// Runs `work` as the computer's operation; `pending` is built around the
    /// receiver of its result.
    pub(super) fn launch<T: Send + 'static, F>(
        &mut self,
        id: Uuid,
        work: impl FnOnce(OpContext, ComputerRecord) -> F,
        pending: impl FnOnce(oneshot::Receiver<T>) -> Pending,
    ) where
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let op_id = self.next();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        let (tx, rx) = oneshot::channel();
        let pending = pending(rx);
        let run = work(self.ctx.clone(), c.record.clone());
        let internal = self.internal.clone();
        let op = pending.kind().fault_name();
        let abort = self.tasks.spawn(faults::within(op, async move {
            let result = run.await;
            faults::step("owner: result sent back");
            // The result first, then the notice: it is there when the notice is.
            if tx.send(result).is_ok() {
                let _ = internal.send(Internal::OpDone { id, op_id }).await;
            }
        }));
        c.op = Some(InFlight {
            op_id,
            pending,
            started: Instant::now(),
            abort,
            actor: Actor::Broker,
        });
        self.dirty.insert(id);
    }

    /// Says who asked for the operation just launched on `id`.
    pub(super) fn op_by(&mut self, id: Uuid, actor: Actor) {
        if let Some(op) = self.computers.get_mut(&id).and_then(|c| c.op.as_mut()) {
            op.actor = actor;
        }
    }

    pub(super) fn launch_create(&mut self, id: Uuid, reply: Reply<ComputerStatus>) {
        self.launch(
            id,
            |ctx, record| async move { create::run(&ctx, &record).await },
            |done| Pending::Create { reply, done },
        );
    }

    /// Wanted running from here on (on disk before the engine is asked,
    /// [`super::restart`]), then the resume.
    pub(super) fn launch_start(&mut self, id: Uuid, reply: Reply<ComputerStatus>) {
        self.want_running(id, true);
        self.launch(
            id,
            |ctx, record| async move { resume::run(&ctx, &record).await },
            |done| Pending::Start { reply, done },
        );
    }

    /// Records the intent (on disk before anyone hears that the stop is
    /// under way), then stops with it.
    ///
    /// An intent that cannot be written (a full disk) does not keep the
    /// desktop running: the stop goes ahead with the intent held in memory
    /// only, and says so in the log. What is lost is only the crash safety of
    /// this one stop (a broker killed before it ends does not finish it); the
    /// records on disk stay whole, since a failed write never replaces one.
    pub(super) fn launch_stop(
        &mut self,
        id: Uuid,
        reason: StopReason,
        reply: Option<Reply<ComputerStatus>>,
    ) {
        // Whatever the reason, a stop the broker makes is not undone by a
        // restart ([`super::restart`]).
        self.want_running(id, false);
        let scope = faults::scope(faults::op::STOP);
        let intent = match stop::begin(&self.ctx, id, reason) {
            Ok(intent) => intent,
            Err(e) => {
                tracing::error!(computer = %id, error = %e.detail(), "cannot record the stop intent; stopping without it");
                StopRecord::intent(reason, chrono::Utc::now())
            }
        };
        if let Some(c) = self.computers.get_mut(&id) {
            c.stop_record = Some(intent.clone());
        }
        drop(scope);
        self.launch(
            id,
            move |ctx, _| async move { stop::run(&ctx, id, intent).await },
            |done| Pending::Stop {
                reason,
                reply,
                done,
            },
        );
    }

    pub(super) fn launch_remove(&mut self, id: Uuid, purge: bool, reply: Reply<()>) {
        let store = self.store.clone();
        self.launch(
            id,
            move |ctx, _| async move {
                remove::run(&ctx, id, purge).await?;
                // The record and run directory (which the guest may have
                // filled) go on the blocking pool, never on the owner task.
                blocking(move || store.delete(id, purge)).await?;
                Ok(())
            },
            |done| Pending::Remove { purge, reply, done },
        );
    }

    pub(super) fn on_op_done(&mut self, id: Uuid, op_id: u64) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.op.as_ref().map(|o| o.op_id) != Some(op_id) {
            return;
        }
        let Some(op) = c.op.take() else {
            return;
        };
        // Whatever an observation begun before now says is older than this.
        c.refresh.epoch += 1;
        self.dirty.insert(id);
        let started = op.started;
        let kind = op.kind();
        let actor = op.actor;
        let _op = faults::scope(kind.fault_name());
        faults::step("owner: result received");
        match op.pending {
            Pending::Create { reply, mut done } => {
                let result = received(done.try_recv());
                // Its caller is answered now, whatever the result.
                self.forget_intent(id);
                // The workspace (new or adopted) exists from here on, even
                // when the container's start failed.
                self.apply_workspace_limit(id);
                if result.as_ref().is_ok_and(|d| d.state.is_up()) {
                    self.record(id, actor, &Happened::Started);
                }
                self.on_running(id, kind, started, result, reply);
            }
            Pending::Start { reply, mut done } => {
                let result = received(done.try_recv());
                if result.as_ref().is_ok_and(|d| d.state.is_up()) {
                    self.record(id, actor, &Happened::Started);
                }
                self.on_running(id, kind, started, result, reply);
            }
            Pending::Stop {
                reason,
                reply,
                mut done,
            } => {
                let result = received(done.try_recv());
                if result.is_ok() {
                    let reason = stop_reason_name(reason);
                    self.record(id, actor, &Happened::Stopped { reason });
                }
                self.on_stopped(id, reason, result, reply);
            }
            Pending::Remove {
                purge,
                reply,
                mut done,
            } => match received(done.try_recv()) {
                Ok(()) => {
                    self.finish_remove(id, purge, reply);
                    return;
                }
                Err(e) => {
                    tracing::warn!(computer = %id, error = %e.detail(), "remove failed");
                    self.forget_intent(id);
                    if let Some(c) = self.computers.get_mut(&id) {
                        c.op_problem = Some(e.to_string());
                    }
                    let _ = reply.send(Err(e));
                    self.refresh(id);
                }
            },
            Pending::Import { reply, mut done } => {
                let result = received(done.try_recv());
                match &result {
                    // A new tree was swapped in: it carries no project id yet.
                    Ok(summary) => {
                        let entries = summary
                            .files
                            .saturating_add(summary.dirs)
                            .saturating_add(summary.symlinks)
                            .saturating_add(summary.hard_links);
                        let what = Happened::Import {
                            bytes: summary.bytes,
                            entries,
                        };
                        self.record(id, actor, &what);
                        self.apply_workspace_limit(id);
                    }
                    Err(e) => {
                        tracing::info!(computer = %id, error = %e.detail(), "workspace import refused or failed; the old workspace stays");
                    }
                }
                let _ = reply.send(result);
            }
        }
        faults::step("owner: answered");
        self.check_ready(id);
        self.grant_takeovers(id);
    }

    /// A create or start ended.
    fn on_running(
        &mut self,
        id: Uuid,
        kind: OpKind,
        started: Instant,
        result: Result<Desktop, BrokerError>,
        reply: Reply<ComputerStatus>,
    ) {
        let now = Instant::now();
        // A create or start that did not leave the desktop running (other
        // than finding it running already) is no longer wanted running.
        let failed = match &result {
            Ok(info) => !info.state.is_up(),
            Err(e) => !matches!(e, BrokerError::WrongState(_)),
        };
        if failed {
            self.want_running(id, false);
        }
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        match result {
            Ok(info) if !info.state.is_up() => {
                let e = BrokerError::GuestFailed(format!(
                    "the container exited right after its start (exit code {})",
                    info.exit_code.unwrap_or(-1)
                ));
                tracing::warn!(computer = %id, error = %e, "{} failed", kind.describe());
                c.engine = Observed::Present(Box::new(info));
                c.last_up = false;
                c.op_problem = Some(e.to_string());
                let _ = reply.send(Err(e));
            }
            Ok(info) => {
                tracing::debug!(computer = %id, ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "{} reached the engine's running state", kind.describe());
                c.engine = Observed::Present(Box::new(info));
                c.last_up = c.engine.is_up();
                c.image_present = Some(true);
                c.op_problem = None;
                if kind == OpKind::Start {
                    c.stop_record = None;
                }
                arm_idle(c, now);
                c.ready_wait = Some(ReadyWait {
                    started,
                    deadline: now + self.ctx.config.ready_timeout,
                    resume: kind == OpKind::Start,
                });
                self.start_follower(id);
                // The answer comes once the container runs; readiness follows
                // in the status and on the event stream.
                let _ = reply.send(self.status(id));
            }
            Err(e) => {
                tracing::warn!(computer = %id, error = %e.detail(), "{} failed", kind.describe());
                // A start that found the desktop running (the engine
                // confirmed the belief) is a refusal, not a problem.
                if !matches!(e, BrokerError::WrongState(_)) {
                    c.op_problem = Some(e.to_string());
                }
                // An engine that failed the start may have started the
                // container all the same (Podman answers an error for one
                // killed at once): what was known before the start is no
                // longer known, and must not be shown (a stop reason of the
                // run before) until the engine has been asked again.
                if matches!(e, BrokerError::Engine(_) | BrokerError::Internal(_)) {
                    c.engine = Observed::Unknown(format!(
                        "asking the engine again after {} failed",
                        kind.describe()
                    ));
                }
                let _ = reply.send(Err(e));
                self.refresh(id);
            }
        }
    }

    /// A stop ended.
    fn on_stopped(
        &mut self,
        id: Uuid,
        reason: StopReason,
        result: Result<stop::Stopped, BrokerError>,
        reply: Option<Reply<ComputerStatus>>,
    ) {
        let now = Instant::now();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        match result {
            Ok(stopped) => {
                tracing::info!(computer = %id, ?reason, finished_at = ?stopped.record.finished_at, "stopped");
                c.engine = Observed::Present(Box::new(stopped.info));
                c.last_up = c.engine.is_up();
                c.stop_record = Some(stopped.record);
                c.op_problem = stopped.unsaved.map(|why| {
                    format!(
                        "stopped, but the stop reason could not be saved ({why}); a broker \
                         restarted before the desktop's next start will not know why it \
                         stopped"
                    )
                });
                disarm_idle(c);
                stop_follower(c);
                c.ready_wait = None;
                if reason == StopReason::Idle {
                    self.metrics.idle_stop();
                }
                if let Some(reply) = reply {
                    let _ = reply.send(self.status(id));
                }
            }
            Err(e) => {
                tracing::warn!(computer = %id, ?reason, error = %e.detail(), "stop failed");
                let not_running = matches!(e, BrokerError::WrongState(_));
                if reason == StopReason::Idle && !not_running {
                    c.idle.stop_failed(now);
                    c.op_problem = Some(format!(
                        "idle stop failed ({} so far): {e}",
                        c.idle.failures()
                    ));
                } else if !not_running {
                    c.op_problem = Some(e.to_string());
                }
                // An unknown outcome leaves the intent on disk to be settled.
                c.stop_record = self.ctx.stops.load(&stop_key(id)).unwrap_or(None);
                if reason == StopReason::Fenced && !not_running {
                    // The fenced holder's work may still run: no takeover.
                    for t in std::mem::take(&mut c.takeovers) {
                        let _ = t.reply.send(Err(e.duplicate()));
                    }
                }
                if let Some(reply) = reply {
                    let _ = reply.send(Err(e));
                }
                self.refresh(id);
            }
        }
    }

    fn finish_remove(&mut self, id: Uuid, purge: bool, reply: Reply<()>) {
        let Some(mut c) = self.computers.remove(&id) else {
            return;
        };
        self.witnesses.remove(&id);
        self.last_change.remove(&id);
        self.resyncing.remove(&id);
        self.egress.remove(id);
        self.activity.remove(id);
        stop_follower(&mut c);
        for t in c.takeovers.drain(..) {
            let _ = t.reply.send(Err(BrokerError::NotFound(id)));
        }
        c.ready_wait = None;
        if let Err(e) = self.ctx.stops.clear(&stop_key(id)) {
            tracing::warn!(computer = %id, error = %e, "cannot clear the stop record");
        }
        faults::step("remove: stop record cleared");
        tracing::info!(computer = %id, purge, "removed");
        let _ = self.events.send(BrokerEvent::Removed { id });
        let _ = reply.send(Ok(()));
        faults::step("owner: answered");
    }

    /// The create or remove of `id` ended and its caller is answered: its
    /// intent goes ([`crate::store::intent`]).
    fn forget_intent(&self, id: Uuid) {
        match intent::clear(&self.ctx.paths, id) {
            Ok(()) => faults::step("owner: intent cleared"),
            Err(e) => {
                tracing::error!(computer = %id, error = %e, "cannot clear the operation's intent; the next start-up settles it");
            }
        }
    }

    /// Grants lease takeovers that waited for an operation, now that none is
    /// in flight.
    pub(super) fn grant_takeovers(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.op.is_some() || c.takeovers.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut c.takeovers);
        for t in waiting {
            let result = self.decide_lease(id, &t.request);
            let _ = t.reply.send(result);
        }
    }

    /// A takeover waited too long for the previous holder's operation:
    /// abandon that operation and stop the container (reason `fenced`); the
    /// takeover is granted once the stop is confirmed.
    pub(super) fn fence(&mut self, id: Uuid) {
        let grace = takeover_grace(self.config());
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        let Some(op) = c.op.take() else {
            return;
        };
        tracing::warn!(computer = %id, "{} outlived a lease takeover's grace; fencing it", op.kind().describe());
        op.abort.abort();
        if matches!(op.kind(), OpKind::Create | OpKind::Remove { .. }) {
            // Its caller hears it failed: no later start-up may finish it.
            if let Err(e) = intent::clear(&self.ctx.paths, id) {
                tracing::error!(computer = %id, error = %e, "cannot clear a fenced operation's intent");
            }
        }
        op.pending.fail(BrokerError::StaleGeneration {
            given: "superseded".into(),
            current: c.record.generation,
        });
        c.ready_wait = None;
        let later = Instant::now() + grace;
        for t in &mut c.takeovers {
            t.deadline = later;
        }
        disarm_idle(c);
        stop_follower(c);
        self.launch_stop(id, StopReason::Fenced, None);
    }
}

/// A stop reason as the API spells it (`idle`, `manual`, …).
pub(super) fn stop_reason_name(reason: StopReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{reason:?}").to_lowercase())
}

/// An operation's result, which its task sent before it said it was done.
fn received<T>(
    got: Result<Result<T, BrokerError>, oneshot::error::TryRecvError>,
) -> Result<T, BrokerError> {
    got.unwrap_or_else(|_| {
        Err(BrokerError::Internal(
            "the operation ended without its result".into(),
        ))
    })
}
