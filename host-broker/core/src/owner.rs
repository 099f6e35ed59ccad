//! The one task that owns every computer's state (firecracker's split).
//!
//! The API layer sends [`Command`]s through a [`BrokerHandle`]; this task
//! decides, replies and broadcasts a [`BrokerEvent`] on every status change.
//! It is the only code that starts backend work or writes computer records.
//! Anything slow (backend calls, the guest channel, deleting directories)
//! runs in per-computer tasks that report back here as [`Internal`]
//! messages, so one computer's start→ready or quiesce never delays another
//! computer's commands; at most one mutating operation is in flight per
//! computer. It speaks only [`Backend`] verbs.
//!
//! By concern: [`startup`] (start-up, reconciliation, backend changes),
//! [`follow`] (the guest: status, readiness, activity), [`ops`] (the
//! operations in flight and what their results do), [`commands`] (one
//! handler per API command), [`restart`] (bringing back, after the start-up
//! reconcile, the desktops that went down with the host). This file holds
//! the state and the loop.
//!
//! What it must never do: stop, remove or recreate a desktop because the
//! broker itself stops. Dropping every handle ends this task and aborts its
//! helpers; desktops keep running, and an interrupted stop is finished by the
//! next start-up's reconciliation (its intent is on disk).

mod admission;
mod answers;
mod commands;
mod computer;
mod egress;
mod engine_link;
mod follow;
mod ops;
mod quota;
mod restart;
mod revocation;
mod startup;
pub mod workspace;

pub use engine_link::{Backoff, RETRY_FIRST, RETRY_JITTER, RETRY_MAX};
pub use follow::EVENT_GRACE;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dormouse_protocol::activity::{Actor, Happened};
use dormouse_protocol::api::{
    BrokerEvent, ComputerStatus, ContainerState, CreateComputer, StopReason,
};
use dormouse_protocol::Activity;
use tokio::sync::{broadcast, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use uuid::Uuid;

use self::computer::{materially_different, Computer};
use crate::activity::ActivityLog;
use crate::command::{BrokerHandle, Command, Reply};
use crate::config::BrokerConfig;
use crate::engine::Observed;
use crate::engine::{Backend, Change, Image, Listed};
use crate::error::BrokerError;
use crate::guest::GuestUpdate;
use crate::idle::{MAX_WINDOW, MIN_WINDOW};
use crate::lifecycle::OpContext;
use crate::metrics::Metrics;
use crate::reconcile::Orphan;
use crate::store::{ensure_dir, ComputerRecord, ComputerStore, Paths, StopReasonStore};

const COMMAND_QUEUE: usize = 256;
/// Events kept for slow subscribers; one that falls further behind gets a
/// fresh snapshot instead. With guest-driven statuses throttled per
/// computer ([`follow`]), this bounds the memory a status flood can take to
/// this many statuses, whatever the flood's rate.
pub const EVENT_QUEUE: usize = 256;
const INTERNAL_QUEUE: usize = 1024;
/// How soon a failed stop for the running limit is tried again.
const LIMIT_RETRY: Duration = Duration::from_secs(30);

/// Messages from the owner's own tasks.
#[derive(Debug)]
enum Internal {
    /// The image of a create was resolved (or not).
    Resolved {
        request: CreateComputer,
        result: Result<Image, BrokerError>,
        reply: Reply<ComputerStatus>,
    },
    /// An operation ended; its result waits in its [`ops::InFlight`].
    OpDone { id: Uuid, op_id: u64 },
    /// A fresh backend view of one computer.
    Refreshed {
        id: Uuid,
        epoch: u64,
        view: Observed,
        image_present: Option<bool>,
    },
    /// The guest follower of a computer reports.
    Guest {
        id: Uuid,
        epoch: u64,
        update: GuestUpdate,
    },
    /// A guest call (or the probe after one failed) says whether the guest
    /// answered it (`None`) or why not, under follower `epoch`.
    CallAnswered {
        id: Uuid,
        epoch: u64,
        problem: Option<String>,
    },
    /// The guest's activity for the idle timer (`None`: no answer).
    Activity {
        id: Uuid,
        epoch: u64,
        activity: Option<Activity>,
    },
    /// The workspace limit of a computer was applied (or found impossible).
    WorkspaceLimit {
        id: Uuid,
        epoch: u64,
        limit: dormouse_protocol::api::WorkspaceLimit,
    },
    /// Something happened to a desktop carrying our marks.
    Changed(Change),
    /// The backend answers again; these desktops carry our marks.
    BackendUp(Vec<Listed>),
    /// The backend's change stream broke, or it still does not answer.
    BackendDown(engine_link::Loss),
}

/// Starts the broker core: loads the records, reconciles them with the
/// backend (finishing stops that were begun but not confirmed, adoptions cut
/// short, reporting desktops marked as ours without a record) and only then
/// returns the handle, so a caller that signals readiness afterwards does so
/// on a reconciled state.
///
/// A missing engine is not an error: computers show `container: unknown` and
/// commands answer `engine_unavailable` until it is back.
pub async fn spawn_backend(
    config: BrokerConfig,
    backend: Arc<dyn Backend>,
    metrics: Arc<Metrics>,
) -> Result<(BrokerHandle, JoinHandle<()>), BrokerError> {
    if !(1..=64).contains(&config.max_instances) {
        return Err(BrokerError::BadRequest(
            "max instances must be between 1 and 64".into(),
        ));
    }
    if config.idle_timeout < MIN_WINDOW || config.idle_timeout > MAX_WINDOW {
        return Err(BrokerError::BadRequest(
            "the idle timeout must be at least one second".into(),
        ));
    }
    if config.resync_interval < MIN_WINDOW {
        return Err(BrokerError::BadRequest(
            "the resync interval must be at least one second".into(),
        ));
    }
    if config.max_run.is_some_and(|m| m < MIN_WINDOW) {
        return Err(BrokerError::BadRequest(
            "the running limit must be at least one second".into(),
        ));
    }
    let paths = Paths::new(&config.data_dir);
    ensure_dir(paths.data())?;
    ensure_dir(&paths.computers())?;
    ensure_dir(&paths.stops())?;
    let store = ComputerStore::new(paths.clone());
    let (records, broken) = store.load_all()?;
    for e in broken {
        tracing::error!(error = %e, "skipping a computer record that cannot be read");
    }
    let (events, _) = broadcast::channel(EVENT_QUEUE);
    let activity = ActivityLog::open_with(
        &paths,
        records.iter().map(|r| r.id),
        events.clone(),
        crate::activity::RING,
        config.activity_argv,
    );

    let resync_interval = config.resync_interval;
    let config = Arc::new(config);
    let ctx = OpContext {
        backend,
        stops: StopReasonStore::new(&paths),
        paths,
        config,
    };
    let (command_tx, command_rx) = mpsc::channel(COMMAND_QUEUE);
    let (internal_tx, internal_rx) = mpsc::channel(INTERNAL_QUEUE);
    let screens = crate::screen::ScreenRegistry::recording(activity.clone());
    let egress = dormouse_egress::Policies::default();
    let availability = crate::availability::AvailabilityCell::default();
    let mut owner = Owner {
        ctx,
        store,
        metrics,
        computers: BTreeMap::new(),
        events: events.clone(),
        internal: internal_tx,
        tasks: JoinSet::new(),
        pending_creates: 0,
        adopting: HashSet::new(),
        orphans: Vec::new(),
        next_id: 0,
        anchor: (Instant::now(), Utc::now()),
        dirty: BTreeSet::new(),
        engine_lost: None,
        availability: availability.clone(),
        reconciling: None,
        screens: screens.clone(),
        revocations: revocation::Revocations::default(),
        quota_slots: Arc::new(tokio::sync::Semaphore::new(quota::CONCURRENT)),
        witnesses: BTreeMap::new(),
        last_change: HashMap::new(),
        next_resync: Instant::now() + resync_interval,
        resyncing: HashMap::new(),
        egress: egress.clone(),
        activity: activity.clone(),
        restart: None,
    };
    owner.start_up(records).await;
    owner.plan_restart();
    owner.publish_egress_all();
    owner.watch_backend();
    if owner.config().probe_changes {
        owner.probe_changes();
    }
    let task = tokio::spawn(owner.run(command_rx, internal_rx));
    Ok((
        BrokerHandle::new(command_tx, events)
            .with_screens(screens)
            .with_egress(egress)
            .with_activity(activity)
            .with_engine(availability),
        task,
    ))
}

/// The owner's state.
struct Owner {
    ctx: OpContext,
    store: ComputerStore,
    metrics: Arc<Metrics>,
    computers: BTreeMap<Uuid, Computer>,
    events: broadcast::Sender<BrokerEvent>,
    internal: mpsc::Sender<Internal>,
    /// Every helper task; dropping the set (the owner ends) aborts them.
    tasks: JoinSet<()>,
    /// Creates whose image is being resolved (they hold a capacity slot).
    pending_creates: u32,
    /// Removed computers whose workspace a pending create adopts.
    adopting: HashSet<Uuid>,
    orphans: Vec<Orphan>,
    next_id: u64,
    /// A fixed (monotonic, wall-clock) pair, so statuses convert instants
    /// to the same wall-clock time every time.
    anchor: (Instant, DateTime<Utc>),
    /// Computers whose status may have changed since the last broadcast.
    dirty: BTreeSet<Uuid>,
    /// Since when (monotonic, wall clock) and why the backend's change
    /// stream is broken, until it answers again ([`engine_link`]).
    engine_lost: Option<(Instant, DateTime<Utc>, crate::availability::LossReason)>,
    /// What `/healthz` reads of the engine's availability.
    availability: crate::availability::AvailabilityCell,
    /// The reconciliation after the engine's return, while it runs.
    reconciling: Option<engine_link::Reconciling>,
    /// Every live screen capability (revoked from here, [`revocation`]).
    screens: crate::screen::ScreenRegistry,
    /// What [`Owner::sync_revocations`] keeps between turns.
    revocations: revocation::Revocations,
    /// Workspace limits being applied at once ([`quota`]).
    quota_slots: Arc<tokio::sync::Semaphore>,
    /// Computers whose guest channel dropped (or said it stops): the engine
    /// is asked on a short schedule what became of them ([`follow`]).
    witnesses: BTreeMap<Uuid, follow::Witness>,
    /// When the engine last said each computer's run ended, to tell a
    /// correction the events missed from one they merely raced.
    last_change: HashMap<Uuid, Instant>,
    /// When every desktop believed running is next observed afresh.
    next_resync: Instant,
    /// Computers a resync asked about: what was believed, and since when.
    resyncing: HashMap<Uuid, (ContainerState, Instant)>,
    /// Every computer's live egress policy ([`egress`]).
    egress: dormouse_egress::Policies,
    /// Every computer's activity record: the owner records what it decides
    /// and what its operations did, on their outcome.
    activity: ActivityLog,
    /// Desktops still to bring back after a host restart ([`restart`]).
    restart: Option<restart::RestartPlan>,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("computers", &self.computers.len())
            .finish_non_exhaustive()
    }
}

impl Owner {
    fn config(&self) -> &BrokerConfig {
        &self.ctx.config
    }

    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn to_wall(&self, at: Instant) -> DateTime<Utc> {
        let (i0, w0) = self.anchor;
        match at.checked_duration_since(i0) {
            Some(d) => w0 + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX),
            None => w0 - chrono::Duration::from_std(i0 - at).unwrap_or(chrono::Duration::zero()),
        }
    }

    fn status_of(&self, c: &Computer) -> ComputerStatus {
        c.status(Instant::now(), |i| self.to_wall(i))
    }

    fn status(&self, id: Uuid) -> Result<ComputerStatus, BrokerError> {
        self.computers
            .get(&id)
            .map(|c| self.status_of(c))
            .ok_or(BrokerError::NotFound(id))
    }

    /// Records `what`, done by `actor`, in computer `id`'s activity.
    fn record(&self, id: Uuid, actor: Actor, what: &Happened) {
        self.activity.record(id, actor, what);
    }

    fn window_of(&self, record: &ComputerRecord) -> Duration {
        record
            .idle_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.config().idle_timeout)
    }

    // ---- the loop -----------------------------------------------------------

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut internal: mpsc::Receiver<Internal>,
    ) {
        loop {
            while self.tasks.try_join_next().is_some() {}
            self.advance_restart();
            self.publish();
            self.sync_revocations();
            let wake = self.next_wake();
            tokio::select! {
                message = internal.recv() => {
                    if let Some(message) = message {
                        self.on_internal(message);
                    }
                }
                command = commands.recv() => match command {
                    Some(command) => self.on_command(command),
                    None => break,
                },
                () = sleep_until(wake) => self.on_tick(),
            }
        }
        tracing::info!("broker core stopping; desktops keep running");
    }

    /// Broadcasts the status of every computer that changed.
    fn publish(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for id in dirty {
            let Some(c) = self.computers.get(&id) else {
                continue;
            };
            let status = self.status_of(c);
            let changed = c
                .last_sent
                .as_ref()
                .is_none_or(|last| materially_different(last, &status));
            if changed {
                let _ = self.events.send(BrokerEvent::Status {
                    computer: Box::new(status.clone()),
                });
                if let Some(c) = self.computers.get_mut(&id) {
                    c.last_sent = Some(status);
                }
            }
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let max_run = self.config().max_run;
        self.computers
            .values()
            .flat_map(|c| {
                let idle = if idle_may_check(c) {
                    c.idle.wake_at()
                } else {
                    None
                };
                let ready = c.ready_wait.as_ref().map(|w| w.deadline);
                let takeover = c.takeovers.iter().map(|t| t.deadline).min();
                let limit = run_limit_at(c, max_run);
                let guest = c.guest_throttle.wake_at();
                [idle, ready, takeover, limit, guest]
            })
            .flatten()
            .chain(self.witnesses.values().map(follow::Witness::wake_at))
            .chain([self.next_resync])
            .min()
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        self.witness_tick(now);
        if self.next_resync <= now {
            self.next_resync = now + self.config().resync_interval;
            self.resync();
        }
        let max_run = self.config().max_run;
        let ids: Vec<Uuid> = self.computers.keys().copied().collect();
        for id in ids {
            let Some(c) = self.computers.get_mut(&id) else {
                continue;
            };
            if c.guest_throttle.release(now) {
                self.dirty.insert(id);
            }
            if c.ready_wait.as_ref().is_some_and(|w| w.deadline <= now) {
                let why = c
                    .guest
                    .problem
                    .clone()
                    .or_else(|| c.guest.status.as_ref().and_then(|s| s.problem.clone()))
                    .unwrap_or_else(|| "the guest did not report ready".into());
                let problem = format!(
                    "not ready within {:?}: {why}",
                    self.ctx.config.ready_timeout
                );
                tracing::warn!(computer = %id, %problem, "desktop did not get ready");
                c.op_problem = Some(problem);
                c.ready_wait = None;
                self.dirty.insert(id);
            }
            let Some(c) = self.computers.get_mut(&id) else {
                continue;
            };
            if c.op.is_some() && c.takeovers.iter().any(|t| t.deadline <= now) {
                self.fence(id);
            }
            let Some(c) = self.computers.get_mut(&id) else {
                continue;
            };
            if let (Some(limit), true) = (
                max_run,
                run_limit_at(c, max_run).is_some_and(|at| at <= now),
            ) {
                tracing::info!(computer = %id, ?limit, "ran for the longest time allowed: stopping");
                // Should this stop fail, the limit tries again a while later.
                c.up_since = (now + LIMIT_RETRY).checked_sub(limit);
                self.launch_stop(id, StopReason::Idle, None);
                continue;
            }
            let Some(c) = self.computers.get(&id) else {
                continue;
            };
            if idle_may_check(c) && c.idle.wake_at().is_some_and(|w| w <= now) {
                self.check_activity(id);
            }
        }
    }

    fn on_internal(&mut self, message: Internal) {
        match message {
            Internal::Resolved {
                request,
                result,
                reply,
            } => self.on_resolved(request, result, reply),
            Internal::OpDone { id, op_id } => self.on_op_done(id, op_id),
            Internal::Refreshed {
                id,
                epoch,
                view,
                image_present,
            } => self.on_refreshed(id, epoch, view, image_present),
            Internal::Guest { id, epoch, update } => self.on_guest(id, epoch, update),
            Internal::CallAnswered { id, epoch, problem } => {
                self.on_call_answered(id, epoch, problem);
            }
            Internal::Activity {
                id,
                epoch,
                activity,
            } => self.on_activity(id, epoch, activity),
            Internal::WorkspaceLimit { id, epoch, limit } => {
                self.on_workspace_limit(id, epoch, limit);
            }
            Internal::Changed(change) => self.on_change(change),
            Internal::BackendUp(listed) => self.on_backend_up(listed),
            Internal::BackendDown(loss) => self.on_backend_down(loss),
        }
    }
}

/// How long a lease takeover waits for an operation in flight before
/// fencing it: every backend call of an operation is bounded by these.
fn takeover_grace(config: &BrokerConfig) -> Duration {
    config.quiesce_timeout + config.stop_timeout + Duration::from_secs(10)
}

/// The idle timer looks at a desktop only when it runs, is not being
/// changed and is not still booting (a slow boot is not idleness).
fn idle_may_check(c: &Computer) -> bool {
    c.op.is_none() && c.ready_wait.is_none() && !c.idle_check && c.engine.is_up()
}

/// When the hard running limit stops a desktop: counted from when it came
/// up, never renewed by anything the guest (or a client) says.
fn run_limit_at(c: &Computer, max_run: Option<Duration>) -> Option<Instant> {
    let limit = max_run?;
    if c.op.is_some() || !c.engine.is_up() {
        return None;
    }
    c.up_since.map(|since| since + limit)
}

fn arm_idle(c: &mut Computer, now: Instant) {
    c.idle.arm(now);
    c.idle_epoch += 1;
    c.idle_check = false;
    c.up_since = Some(now);
}

fn disarm_idle(c: &mut Computer) {
    c.idle.disarm();
    c.idle_epoch += 1;
    c.idle_check = false;
    c.up_since = None;
}

fn stop_follower(c: &mut Computer) {
    if let Some(f) = c.follower.take() {
        f.abort.abort();
    }
    if let Some(probe) = c.guest.probe.take() {
        probe.abort();
    }
    c.guest = Default::default();
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
