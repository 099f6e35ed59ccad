//! The seam between the API layer and the one task that owns the broker's
//! state (firecracker's split): handlers parse a request into a [`Command`],
//! send it over a channel and await the reply. No handler touches the engine
//! or the disk itself.

use dormouse_protocol::activity::{ActivityEntry, Actor, Happened, MAX_ACTIVITY_LIMIT};
use dormouse_protocol::api::{
    BrokerEvent, ComputerStatus, CreateComputer, LeaseGrant, LeaseRequest, PatchComputer,
};
use dormouse_protocol::egress_policy::EgressPolicy;
use dormouse_protocol::screen::ScreenMode;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use uuid::Uuid;

use crate::activity::ActivityLog;
use crate::availability::{AvailabilityCell, EngineAvailability};
use crate::config::WorkspaceLimits;
use crate::error::BrokerError;
use crate::guest::{GuestSocket, QuiesceHold};
use crate::reconcile::Orphan;
use crate::screen::ScreenRegistry;
use crate::store::LastScreen;
use crate::workspace::{ChannelReader, DiskUsage, ImportSummary};

/// Reply channel of a command.
pub type Reply<T> = oneshot::Sender<Result<T, BrokerError>>;

/// A fencing generation sent by the caller (`Dormouse-Generation`), if any.
pub type Fence = Option<u64>;

/// Everything a client can ask the broker core to do.
#[derive(Debug)]
pub enum Command {
    /// Create and start a new computer.
    Create(CreateComputer, Reply<ComputerStatus>),
    /// Every computer's status.
    List(Reply<Vec<ComputerStatus>>),
    /// One computer's status (never renews the idle timer).
    Get(Uuid, Reply<ComputerStatus>),
    /// Resume a stopped computer.
    Start(Uuid, Fence, Reply<ComputerStatus>),
    /// Stop a running computer (reason `manual`).
    Stop(Uuid, Fence, Reply<ComputerStatus>),
    /// Remove a computer; `purge` also deletes its workspace.
    Remove {
        /// Which computer.
        id: Uuid,
        /// Delete the workspace too.
        purge: bool,
        /// Caller's generation.
        fence: Fence,
        /// Reply.
        reply: Reply<()>,
    },
    /// Renew the idle timer.
    Touch(Uuid, Fence, Reply<ComputerStatus>),
    /// Change per-computer settings.
    Patch(Uuid, PatchComputer, Fence, Reply<ComputerStatus>),
    /// Take or renew the fencing lease.
    Lease(Uuid, LeaseRequest, Reply<LeaseGrant>),
    /// Containers labelled as Dormouse computers that have no record here
    /// (reported, never removed).
    Orphans(Reply<Vec<Orphan>>),
    /// May the caller make a guest call of this purpose now? The one
    /// admission of every guest call ([`crate::relay`]): the fence and
    /// readiness as the purpose needs them, the idle timer renewed where it
    /// is activity; answers the ticket the caller relays the call over.
    AdmitGuest(Uuid, Fence, Purpose, Reply<Ticket>),
    /// Authorises a workspace request and says where the workspace is; the
    /// API does the blocking work off the owner task.
    Workspace(Uuid, WorkspaceAccess, Reply<WorkspaceGrant>),
    /// Disk usage, measured now (never starts or renews anything).
    Disk(Uuid, Reply<DiskUsage>),
    /// Replace a stopped desktop's workspace from a tar, as its operation.
    Import(Uuid, Fence, ChannelReader, Reply<ImportSummary>),
    /// A fresh place to stage the workspace of a create from a tar.
    ImportSlot(CreateComputer, Reply<WorkspaceGrant>),
    /// Give the lease back (fenced).
    ReleaseLease(Uuid, Fence, Reply<()>),
    /// A computer's egress policy; with a policy, replace it (fenced) first.
    Egress(Uuid, Option<EgressPolicy>, Fence, Reply<EgressPolicy>),
    /// Egress bytes moved for a computer: activity for its idle timer.
    EgressActivity(Uuid, Reply<()>),
    /// The screen kept at the broker's last stop of a computer, if any
    /// (read from the disk; never starts or renews anything).
    LastScreen(Uuid, Reply<Option<LastScreen>>),
}

/// Clonable handle the API layer and the CLI-in-process tests use.
#[derive(Debug, Clone)]
pub struct BrokerHandle {
    tx: mpsc::Sender<Command>,
    events: broadcast::Sender<BrokerEvent>,
    screens: ScreenRegistry,
    egress: dormouse_egress::Policies,
    activity: ActivityLog,
    engine: AvailabilityCell,
}

impl BrokerHandle {
    /// A handle over the owner's command channel and event broadcast.
    pub fn new(tx: mpsc::Sender<Command>, events: broadcast::Sender<BrokerEvent>) -> Self {
        Self {
            tx,
            activity: ActivityLog::in_memory(events.clone()),
            events,
            screens: ScreenRegistry::new(),
            egress: dormouse_egress::Policies::default(),
            engine: AvailabilityCell::default(),
        }
    }

    /// The same handle over the owner's view of the engine's availability.
    pub fn with_engine(mut self, engine: AvailabilityCell) -> Self {
        self.engine = engine;
        self
    }

    /// Whether the container engine answers, as the owner last learnt it
    /// (read without asking the owner task).
    pub fn engine_availability(&self) -> EngineAvailability {
        self.engine.get()
    }

    /// The same handle over the owner's activity records.
    pub fn with_activity(mut self, activity: ActivityLog) -> Self {
        self.activity = activity;
        self
    }

    /// Every computer's activity record.
    pub fn activity_log(&self) -> &ActivityLog {
        &self.activity
    }

    /// The last `limit` (1 to 500) activity entries of computer `id`,
    /// newest first.
    pub fn activity(&self, id: Uuid, limit: usize) -> Result<Vec<ActivityEntry>, BrokerError> {
        if !(1..=MAX_ACTIVITY_LIMIT).contains(&limit) {
            return Err(BrokerError::BadRequest(format!(
                "limit is a number from 1 to {MAX_ACTIVITY_LIMIT}"
            )));
        }
        self.activity
            .recent(id, limit)
            .ok_or(BrokerError::NotFound(id))
    }

    /// Records `what`, done by `actor`, in computer `id`'s activity (what
    /// the API's own tasks did: files written, an export streamed).
    pub fn record_activity(&self, id: Uuid, actor: Actor, what: &Happened) {
        self.activity.record(id, actor, what);
    }

    /// The same handle over the owner's live egress policies.
    pub fn with_egress(mut self, egress: dormouse_egress::Policies) -> Self {
        self.egress = egress;
        self
    }

    /// Every desktop's live egress policy (the owner sets them).
    pub fn egress_policies(&self) -> &dormouse_egress::Policies {
        &self.egress
    }

    /// See [`Command::Egress`]: the policy, after replacing it with `set`.
    pub async fn egress(
        &self,
        id: Uuid,
        set: Option<EgressPolicy>,
        fence: Fence,
    ) -> Result<EgressPolicy, BrokerError> {
        self.ask(|r| Command::Egress(id, set, fence, r)).await
    }

    /// See [`Command::EgressActivity`].
    pub async fn egress_activity(&self, id: Uuid) -> Result<(), BrokerError> {
        self.ask(|r| Command::EgressActivity(id, r)).await
    }

    /// The same handle over the owner's screen registry.
    pub fn with_screens(mut self, screens: ScreenRegistry) -> Self {
        self.screens = screens;
        self
    }

    /// The screen capabilities the owner revokes.
    pub fn screens(&self) -> &ScreenRegistry {
        &self.screens
    }

    /// See [`Command::ReleaseLease`].
    pub async fn release_lease(&self, id: Uuid, fence: Fence) -> Result<(), BrokerError> {
        self.ask(|r| Command::ReleaseLease(id, fence, r)).await
    }

    /// Sends `event` to every `/v1/events` subscriber (egress decisions).
    pub fn publish(&self, event: BrokerEvent) {
        let _ = self.events.send(event);
    }

    /// Every status change of every computer, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<BrokerEvent> {
        self.events.subscribe()
    }

    pub(crate) async fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, BrokerError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| BrokerError::Internal("broker core is not running".into()))?;
        rx.await
            .map_err(|_| BrokerError::Internal("broker core dropped the request".into()))?
    }

    /// See [`Command::Create`].
    pub async fn create(&self, req: CreateComputer) -> Result<ComputerStatus, BrokerError> {
        self.ask(|r| Command::Create(req, r)).await
    }

    /// See [`Command::List`].
    pub async fn list(&self) -> Result<Vec<ComputerStatus>, BrokerError> {
        self.ask(Command::List).await
    }

    /// See [`Command::Get`].
    pub async fn get(&self, id: Uuid) -> Result<ComputerStatus, BrokerError> {
        self.ask(|r| Command::Get(id, r)).await
    }

    /// See [`Command::Start`].
    pub async fn start(&self, id: Uuid, fence: Fence) -> Result<ComputerStatus, BrokerError> {
        self.ask(|r| Command::Start(id, fence, r)).await
    }

    /// See [`Command::Stop`].
    pub async fn stop(&self, id: Uuid, fence: Fence) -> Result<ComputerStatus, BrokerError> {
        self.ask(|r| Command::Stop(id, fence, r)).await
    }

    /// See [`Command::Remove`].
    pub async fn remove(&self, id: Uuid, purge: bool, fence: Fence) -> Result<(), BrokerError> {
        self.ask(|reply| Command::Remove {
            id,
            purge,
            fence,
            reply,
        })
        .await
    }

    /// See [`Command::Touch`].
    pub async fn touch(&self, id: Uuid, fence: Fence) -> Result<ComputerStatus, BrokerError> {
        self.ask(|r| Command::Touch(id, fence, r)).await
    }

    /// See [`Command::Patch`].
    pub async fn patch(
        &self,
        id: Uuid,
        patch: PatchComputer,
        fence: Fence,
    ) -> Result<ComputerStatus, BrokerError> {
        self.ask(|r| Command::Patch(id, patch, fence, r)).await
    }

    /// See [`Command::Lease`].
    pub async fn lease(&self, id: Uuid, req: LeaseRequest) -> Result<LeaseGrant, BrokerError> {
        self.ask(|r| Command::Lease(id, req, r)).await
    }

    /// See [`Command::Orphans`].
    pub async fn orphans(&self) -> Result<Vec<Orphan>, BrokerError> {
        self.ask(Command::Orphans).await
    }

    /// See [`Command::Workspace`].
    pub async fn workspace(
        &self,
        id: Uuid,
        access: WorkspaceAccess,
    ) -> Result<WorkspaceGrant, BrokerError> {
        self.ask(|r| Command::Workspace(id, access, r)).await
    }

    /// See [`Command::Disk`].
    pub async fn disk(&self, id: Uuid) -> Result<DiskUsage, BrokerError> {
        self.ask(|r| Command::Disk(id, r)).await
    }

    /// See [`Command::LastScreen`].
    pub async fn last_screen(&self, id: Uuid) -> Result<Option<LastScreen>, BrokerError> {
        self.ask(|r| Command::LastScreen(id, r)).await
    }

    /// See [`Command::Import`].
    pub async fn import(
        &self,
        id: Uuid,
        fence: Fence,
        body: ChannelReader,
    ) -> Result<ImportSummary, BrokerError> {
        self.ask(|r| Command::Import(id, fence, body, r)).await
    }

    /// See [`Command::ImportSlot`].
    pub async fn import_slot(&self, req: CreateComputer) -> Result<WorkspaceGrant, BrokerError> {
        self.ask(|r| Command::ImportSlot(req, r)).await
    }
}

/// What a workspace request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceAccess {
    /// Read or list files: any state, never fenced.
    Read,
    /// Write or delete files: fenced like every mutating call; refused
    /// while an import or a remove is under way.
    Write(Fence),
    /// Export the whole workspace; with `quiesce` a running desktop's
    /// browsers are closed first.
    Export {
        /// Close a running desktop's browsers first.
        quiesce: bool,
    },
}

/// Where a workspace request may do its work.
#[derive(Debug)]
pub struct WorkspaceGrant {
    /// The computer (or, for a create from a tar, the staging slot).
    pub id: Uuid,
    /// The workspace's host path (never shown to a client).
    pub path: PathBuf,
    /// Who asked (the lease's holder when the call carried its generation).
    pub actor: Actor,
    /// The limits to apply.
    pub limits: WorkspaceLimits,
    /// For an export: the running desktop's browsers were quiesced.
    pub quiesced: bool,
    /// For an export: the guest keeps the browsers closed while this lives
    /// (drop it when the archive is done, or given up).
    pub hold: Option<QuiesceHold>,
}

/// What a guest call is for; the owner's checks depend on it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Purpose {
    /// A batch of computer-use actions whose own waits take `busy_for`:
    /// fenced, ready; the idle timer renewed past the waits.
    Actions {
        /// The batch's `wait` and `hold_key` time.
        busy_for: Duration,
    },
    /// A command or a terminal session: fenced, ready; the timer renewed.
    Exec,
    /// A still screenshot: running is enough, never fenced, not activity.
    Screenshot,
    /// Minting a live-screen capability of this mode: ready, nothing in
    /// flight; `control` fenced. Not activity.
    Screen(ScreenMode),
    /// A connection of a capability already minted (whose registry entry
    /// carries its own revocation): the computer exists. Not activity.
    ScreenConnection,
    /// The quiesce an export of a running desktop holds: the computer
    /// exists (the workspace grant decided the rest). Not activity.
    ExportQuiesce,
    /// The egress connections of a ready desktop: running and ready, never
    /// fenced by a lease (the desktop's own traffic), revoked when the
    /// generation changes or the computer goes. Not activity (bytes are,
    /// [`Command::EgressActivity`]).
    Egress,
}

impl Purpose {
    /// Whether the caller's generation must fence the call.
    pub fn fenced(self) -> bool {
        matches!(
            self,
            Self::Actions { .. } | Self::Exec | Self::Screen(ScreenMode::Control)
        )
    }
}

/// An admitted guest call.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// The computer.
    pub computer: Uuid,
    /// Its guest channel, as the backend names it.
    pub guest: GuestSocket,
    /// The generation the call was admitted under.
    pub generation: u64,
    /// Who asked (the lease's holder when the call carried its generation).
    pub actor: Actor,
    /// Fires when that generation is fenced off or the computer goes (for
    /// a fenced purpose; otherwise never, until the computer is removed).
    pub revoked: CancellationToken,
    /// Where the call tells the owner whether the guest answered.
    pub answers: AnswerReport,
}

/// Where a guest call tells the owner whether the guest's channel answered
/// it ([`crate::relay`]): one that failed degrades the computer's status
/// (not ready, `degraded`, the reason) until the guest answers again. The
/// default tells no one.
#[derive(Clone, Default)]
pub struct AnswerReport(Option<std::sync::Arc<dyn Fn(Option<String>) + Send + Sync>>);

impl AnswerReport {
    /// A report that hands each outcome to `tell` (`None`: answered; else
    /// why not). `tell` must not block: calls report from their own tasks.
    pub fn new(tell: impl Fn(Option<String>) + Send + Sync + 'static) -> Self {
        Self(Some(std::sync::Arc::new(tell)))
    }

    /// The guest answered (an answer that refuses is an answer).
    pub fn answered(&self) {
        if let Some(tell) = &self.0 {
            tell(None);
        }
    }

    /// The guest's channel failed the call: `why`.
    pub fn failed(&self, why: String) {
        if let Some(tell) = &self.0 {
            tell(Some(why));
        }
    }
}

impl std::fmt::Debug for AnswerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnswerReport")
            .field(&self.0.is_some())
            .finish()
    }
}
