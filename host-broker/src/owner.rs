//! The one task that owns every computer's state (firecracker's split).
//!
//! The API layer sends [`Command`]s through a [`BrokerHandle`]; this task
//! decides, replies and broadcasts a [`BrokerEvent`] on every status change.
//! It is the only code that starts engine work or writes computer records.
//! Anything slow (engine calls, the guest socket) runs in per-computer tasks
//! that report back here as [`Internal`] messages, so one computer's
//! start→ready or quiesce never delays another computer's commands; at most
//! one mutating operation is in flight per computer.
//!
//! What it must never do: stop, remove or recreate a desktop because the
//! broker itself stops. Dropping every handle ends this task and aborts its
//! helpers; desktops keep running, and an interrupted stop is finished by the
//! next start-up's reconciliation (its intent is on disk).

mod computer;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dormouse_protocol::api::{
    BrokerEvent, ComputerStatus, CreateComputer, LeaseGrant, LeaseRequest, PatchComputer,
    StopReason,
};
use dormouse_protocol::{Activity, LABEL_COMPUTER};
use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use uuid::Uuid;

use self::computer::{
    materially_different, Computer, Follower, InFlight, OpKind, OpReply, PendingTakeover, ReadyWait,
};
use crate::command::{BrokerHandle, Command, Fence, Reply};
use crate::config::BrokerConfig;
use crate::engine::{ContainerInfo, ContainerSummary, Engine, EngineEvent, ImageInfo};
use crate::error::BrokerError;
use crate::guest::{self, GuestUpdate};
use crate::idle::{IdleTimer, Verdict, MAX_WINDOW, MIN_WINDOW};
use crate::lifecycle::{create, remove, resume, stop, stop_key, OpContext};
use crate::metrics::Metrics;
use crate::reconcile::{self, EngineView, IntentAction, Orphan};
use crate::store::{
    computer::RECORD_SCHEMA, ensure_dir, lease, ComputerRecord, ComputerStore, Lease, Paths,
    StopReasonStore,
};

const COMMAND_QUEUE: usize = 256;
const EVENT_QUEUE: usize = 1024;
const INTERNAL_QUEUE: usize = 1024;
/// Longest pause between attempts to reach a lost engine.
const ENGINE_RETRY_MAX: Duration = Duration::from_secs(10);

/// Messages from the owner's own tasks.
#[derive(Debug)]
enum Internal {
    /// The image of a create was resolved (or not).
    Resolved {
        request: CreateComputer,
        result: Result<ImageInfo, BrokerError>,
        reply: Reply<ComputerStatus>,
    },
    /// An operation ended.
    OpDone {
        id: Uuid,
        op_id: u64,
        outcome: Box<Outcome>,
    },
    /// A fresh engine view of one computer.
    Refreshed {
        id: Uuid,
        epoch: u64,
        view: EngineView,
        image_present: Option<bool>,
    },
    /// The guest follower of a computer reports.
    Guest {
        id: Uuid,
        epoch: u64,
        update: GuestUpdate,
    },
    /// The guest's activity for the idle timer (`None`: no answer).
    Activity {
        id: Uuid,
        epoch: u64,
        activity: Option<Activity>,
    },
    /// An engine event about a container labelled as ours.
    Engine(EngineEvent),
    /// The engine answers again; these containers carry our labels.
    EngineUp(Vec<ContainerSummary>),
    /// The engine's event stream broke.
    EngineDown(String),
}

/// What an operation found.
#[derive(Debug)]
enum Outcome {
    /// Create or start: the container after its start.
    Running(Result<ContainerInfo, BrokerError>),
    /// Stop.
    Stopped(Result<stop::Stopped, BrokerError>),
    /// Remove.
    Removed(Result<(), BrokerError>),
}

/// Starts the broker core: loads the records, reconciles them with the engine
/// (finishing stops that were begun but not confirmed, reporting containers
/// labelled as ours without a record) and only then returns the handle, so a
/// caller that signals readiness afterwards does so on a reconciled state.
///
/// A missing engine is not an error: computers show `container: unknown` and
/// commands answer `engine_unavailable` until it is back.
pub async fn spawn(
    config: BrokerConfig,
    engine: Arc<dyn Engine>,
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
    let paths = Paths::new(&config.data_dir);
    ensure_dir(paths.data())?;
    ensure_dir(&paths.computers())?;
    ensure_dir(&paths.stops())?;
    let store = ComputerStore::new(paths.clone());
    let (records, broken) = store.load_all()?;
    for e in broken {
        tracing::error!(error = %e, "skipping a computer record that cannot be read");
    }

    let config = Arc::new(config);
    let ctx = OpContext {
        engine,
        stops: StopReasonStore::new(&paths),
        paths,
        config,
    };
    let (command_tx, command_rx) = mpsc::channel(COMMAND_QUEUE);
    let (events, _) = broadcast::channel(EVENT_QUEUE);
    let (internal_tx, internal_rx) = mpsc::channel(INTERNAL_QUEUE);
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
        engine_lost: false,
    };
    owner.start_up(records).await;
    owner.watch_engine();
    let task = tokio::spawn(owner.run(command_rx, internal_rx));
    Ok((BrokerHandle::new(command_tx, events), task))
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
    /// The engine's event stream broke and has not come back yet.
    engine_lost: bool,
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

    fn window_of(&self, record: &ComputerRecord) -> Duration {
        record
            .idle_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.config().idle_timeout)
    }

    // ---- start-up -----------------------------------------------------------

    async fn start_up(&mut self, records: Vec<ComputerRecord>) {
        let engine = self.ctx.engine.clone();
        let views = futures_util::future::join_all(
            records
                .iter()
                .map(|r| reconcile::observe(engine.as_ref(), r)),
        )
        .await;
        let now = Instant::now();
        for (record, (view, image_present)) in records.into_iter().zip(views) {
            let id = record.id;
            let window = self.window_of(&record);
            let mut computer = Computer::new(record, IdleTimer::new(window, now));
            computer.stop_record = match self.ctx.stops.load(&stop_key(id)) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(computer = %id, error = %e, "unreadable stop record; ignoring it");
                    None
                }
            };
            tracing::info!(computer = %id, container = ?computer_state_of(&view), "reconciled");
            self.computers.insert(id, computer);
            self.apply_view(id, view, image_present);
        }
        let known: HashSet<Uuid> = self.computers.keys().copied().collect();
        match reconcile::find_orphans(engine.as_ref(), self.config(), &known).await {
            Ok(orphans) => self.orphans = orphans,
            Err(e) => tracing::warn!(error = %e, "cannot list containers to look for orphans"),
        }
    }

    /// Follows the engine's events; when the engine is lost, pings it until
    /// it answers again, then resubscribes.
    fn watch_engine(&mut self) {
        let engine = self.ctx.engine.clone();
        let labels = reconcile::our_labels(self.config());
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let mut pause = Duration::from_millis(250);
            let mut first = true;
            loop {
                if !first {
                    match engine.list(&labels).await {
                        Ok(listed) => {
                            if tx.send(Internal::EngineUp(listed)).await.is_err() {
                                return;
                            }
                            pause = Duration::from_millis(250);
                        }
                        Err(e) => {
                            if tx.send(Internal::EngineDown(e.to_string())).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(ENGINE_RETRY_MAX);
                            continue;
                        }
                    }
                }
                first = false;
                let mut events = engine.events(&labels);
                let why = loop {
                    match events.next().await {
                        Some(Ok(event)) => {
                            if tx.send(Internal::Engine(event)).await.is_err() {
                                return;
                            }
                        }
                        Some(Err(e)) => break e.to_string(),
                        None => break "the event stream ended".to_owned(),
                    }
                };
                if tx.send(Internal::EngineDown(why)).await.is_err() {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ENGINE_RETRY_MAX);
            }
        });
    }

    // ---- the loop -----------------------------------------------------------

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut internal: mpsc::Receiver<Internal>,
    ) {
        loop {
            while self.tasks.try_join_next().is_some() {}
            self.publish();
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
                [idle, ready, takeover]
            })
            .flatten()
            .min()
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let ids: Vec<Uuid> = self.computers.keys().copied().collect();
        for id in ids {
            let Some(c) = self.computers.get_mut(&id) else {
                continue;
            };
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
            let Some(c) = self.computers.get(&id) else {
                continue;
            };
            if idle_may_check(c) && c.idle.wake_at().is_some_and(|w| w <= now) {
                self.check_activity(id);
            }
        }
    }

    // ---- internal messages --------------------------------------------------

    fn on_internal(&mut self, message: Internal) {
        match message {
            Internal::Resolved {
                request,
                result,
                reply,
            } => self.on_resolved(request, result, reply),
            Internal::OpDone { id, op_id, outcome } => self.on_op_done(id, op_id, *outcome),
            Internal::Refreshed {
                id,
                epoch,
                view,
                image_present,
            } => {
                let Some(c) = self.computers.get_mut(&id) else {
                    return;
                };
                c.refresh.in_flight = false;
                let mut again = std::mem::take(&mut c.refresh.again);
                if epoch == c.refresh.epoch {
                    self.apply_view(id, view, image_present);
                } else {
                    // Older than an operation's own view: ask again instead.
                    again = true;
                }
                if again {
                    self.refresh(id);
                }
            }
            Internal::Guest { id, epoch, update } => self.on_guest(id, epoch, update),
            Internal::Activity {
                id,
                epoch,
                activity,
            } => self.on_activity(id, epoch, activity),
            Internal::Engine(event) => self.on_engine_event(event),
            Internal::EngineUp(listed) => {
                let was_lost = std::mem::replace(&mut self.engine_lost, false);
                self.update_orphans(listed);
                if was_lost {
                    tracing::info!("container engine reachable again; refreshing every computer");
                    self.refresh_all();
                }
            }
            Internal::EngineDown(why) => {
                if !self.engine_lost {
                    tracing::warn!(error = %why, "lost the container engine's events");
                    self.engine_lost = true;
                    self.refresh_all();
                }
            }
        }
    }

    fn refresh_all(&mut self) {
        let ids: Vec<Uuid> = self.computers.keys().copied().collect();
        for id in ids {
            self.refresh(id);
        }
    }

    /// Asks the engine about one computer (coalesced: one inspect at a time).
    fn refresh(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.refresh.in_flight {
            c.refresh.again = true;
            return;
        }
        c.refresh.in_flight = true;
        let epoch = c.refresh.epoch;
        let record = c.record.clone();
        let engine = self.ctx.engine.clone();
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let (view, image_present) = reconcile::observe(engine.as_ref(), &record).await;
            let _ = tx
                .send(Internal::Refreshed {
                    id,
                    epoch,
                    view,
                    image_present,
                })
                .await;
        });
    }

    /// Applies what the engine says. With no operation in flight, a container
    /// that came up arms the idle timer and gets a guest follower; one that
    /// went down disarms and drops them; an unconfirmed stop is settled.
    fn apply_view(&mut self, id: Uuid, view: EngineView, image_present: Option<bool>) {
        let now = Instant::now();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        self.dirty.insert(id);
        let was_up = c.last_up;
        let known = !matches!(view, EngineView::Unknown(_));
        let now_up = view.is_up();
        c.engine = view;
        if known {
            c.image_present = image_present;
            c.last_up = now_up;
        }
        if c.op.is_some() || !known {
            return;
        }
        if was_up && !now_up {
            tracing::info!(computer = %id, "container went down");
            disarm_idle(c);
            stop_follower(c);
            c.ready_wait = None;
        }
        let start_follower = !was_up && now_up;
        if start_follower {
            tracing::info!(computer = %id, "container is up");
            arm_idle(c, now);
        }
        let action = reconcile::settle_intent(c.stop_record.as_ref(), &c.engine);
        if start_follower {
            self.start_follower(id);
        }
        self.settle(id, action);
    }

    fn settle(&mut self, id: Uuid, action: IntentAction) {
        let key = stop_key(id);
        match action {
            IntentAction::Keep | IntentAction::Later => {}
            IntentAction::Finish(intent) => {
                tracing::warn!(computer = %id, reason = ?intent.reason, "finishing a stop that was begun but not confirmed");
                self.launch(
                    id,
                    OpKind::Stop {
                        reason: intent.reason,
                    },
                    OpReply::None,
                );
            }
            IntentAction::Confirm(record) => {
                tracing::info!(computer = %id, reason = ?record.reason, "confirmed an interrupted stop");
                if let Err(e) = self.ctx.stops.save(&key, &record) {
                    tracing::error!(computer = %id, error = %e, "cannot confirm the stop record");
                }
                if let Some(c) = self.computers.get_mut(&id) {
                    c.stop_record = Some(record);
                }
            }
            IntentAction::Drop => {
                tracing::info!(computer = %id, "dropping a stop intent that no stop matches");
                if let Err(e) = self.ctx.stops.clear(&key) {
                    tracing::error!(computer = %id, error = %e, "cannot drop the stop intent");
                }
                if let Some(c) = self.computers.get_mut(&id) {
                    c.stop_record = None;
                }
            }
        }
    }

    fn on_engine_event(&mut self, event: EngineEvent) {
        let id = event
            .labels
            .get(LABEL_COMPUTER)
            .and_then(|v| Uuid::parse_str(v).ok())
            .or_else(|| {
                event
                    .name
                    .strip_prefix("dormouse-")
                    .and_then(|v| Uuid::parse_str(v).ok())
            });
        tracing::debug!(action = %event.action, container = %event.name, "engine event");
        match id {
            Some(id) if self.computers.contains_key(&id) => self.refresh(id),
            _ => {
                if event.action == "destroy" {
                    self.orphans.retain(|o| o.container != event.name);
                } else if !self.orphans.iter().any(|o| o.container == event.name) {
                    // A container labelled as ours appeared without a record.
                    let computer = event
                        .labels
                        .get(LABEL_COMPUTER)
                        .cloned()
                        .unwrap_or_default();
                    tracing::warn!(container = %event.name, computer = %computer, "container labelled as a Dormouse computer has no record here; leaving it alone");
                    self.orphans.push(Orphan {
                        container: event.name.clone(),
                        computer,
                        owner: event.labels.get(dormouse_protocol::LABEL_OWNER).cloned(),
                        state: event.action.clone(),
                    });
                }
            }
        }
    }

    fn update_orphans(&mut self, listed: Vec<ContainerSummary>) {
        self.orphans = listed
            .into_iter()
            .filter_map(|c| {
                let computer = c.labels.get(LABEL_COMPUTER).cloned().unwrap_or_default();
                let known =
                    Uuid::parse_str(&computer).is_ok_and(|id| self.computers.contains_key(&id));
                (!known).then(|| Orphan {
                    container: c.name,
                    computer,
                    owner: c.labels.get(dormouse_protocol::LABEL_OWNER).cloned(),
                    state: c.state.to_string(),
                })
            })
            .collect();
    }

    // ---- the guest ----------------------------------------------------------

    fn start_follower(&mut self, id: Uuid) {
        let epoch = self.next();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        stop_follower(c);
        let socket = self.ctx.socket(id);
        let tx = self.internal.clone();
        let within = self.ctx.config.ready_timeout;
        let abort = self
            .tasks
            .spawn(guest::follow(socket, within, move |update| {
                let tx = tx.clone();
                async move { tx.send(Internal::Guest { id, epoch, update }).await.is_ok() }
            }));
        c.follower = Some(Follower { epoch, abort });
    }

    fn on_guest(&mut self, id: Uuid, epoch: u64, update: GuestUpdate) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.follower.as_ref().map(|f| f.epoch) != Some(epoch) {
            return;
        }
        self.dirty.insert(id);
        match update {
            GuestUpdate::Connected(hello) => {
                let since_start = c.ready_wait.as_ref().map(|w| w.started.elapsed());
                tracing::debug!(computer = %id, version = %guest::sanitize(&hello.supervisor_version), ?since_start, "guest supervisor connected");
                c.guest.hello = Some(hello);
                c.guest.problem = None;
            }
            GuestUpdate::Status(status) => {
                c.guest.problem = None;
                c.guest.status = Some(status);
                self.check_ready(id);
            }
            GuestUpdate::Closed => {
                tracing::debug!(computer = %id, "guest supervisor closed its stream");
                c.guest.status = None;
            }
            GuestUpdate::Lost(why) => {
                let why = guest::sanitize(&why);
                tracing::warn!(computer = %id, problem = %why, "guest supervisor connection lost");
                c.guest.problem = Some(why);
                c.guest.status = None;
            }
            GuestUpdate::GaveUp(why) => {
                let why = format!("not reachable: {}", guest::sanitize(&why));
                tracing::warn!(computer = %id, problem = %why, "guest supervisor");
                c.follower = None;
                c.guest.problem = Some(why.clone());
                c.guest.status = None;
                c.ready_wait = None;
            }
        }
    }

    /// Answers a waiting create/start once the guest says ready.
    fn check_ready(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if !c.is_ready() {
            return;
        }
        let Some(wait) = c.ready_wait.take() else {
            return;
        };
        // The idle window starts once the desktop is usable.
        c.idle.renew(Instant::now());
        let ms = u64::try_from(wait.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if wait.resume {
            self.metrics.observe_resume(ms);
            tracing::info!(computer = %id, ms, "resumed: ready");
        } else {
            tracing::info!(computer = %id, ms, "created: ready");
        }
    }

    fn check_activity(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        c.idle_check = true;
        let epoch = c.idle_epoch;
        let socket = self.ctx.socket(id);
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let bound = guest::CONNECT_TIMEOUT + guest::REQUEST_TIMEOUT;
            let activity = match tokio::time::timeout(bound, guest::activity(&socket)).await {
                Ok(Ok(activity)) => Some(activity),
                Ok(Err(e)) => {
                    tracing::debug!(computer = %id, error = %e, "no guest activity answer");
                    None
                }
                Err(_) => None,
            };
            let _ = tx
                .send(Internal::Activity {
                    id,
                    epoch,
                    activity,
                })
                .await;
        });
    }

    fn on_activity(&mut self, id: Uuid, epoch: u64, activity: Option<Activity>) {
        let now = Instant::now();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        c.idle_check = false;
        if epoch != c.idle_epoch || c.op.is_some() || !c.engine.is_up() {
            return;
        }
        self.dirty.insert(id);
        if c.idle.observe(activity.as_ref(), now) == Verdict::Stop {
            tracing::info!(computer = %id, window = ?c.idle.window(), "idle for a full window: stopping");
            self.launch(
                id,
                OpKind::Stop {
                    reason: StopReason::Idle,
                },
                OpReply::None,
            );
        }
    }

    // ---- operations ---------------------------------------------------------

    /// Runs a lifecycle verb as a task of its own; its outcome comes back as
    /// [`Internal::OpDone`].
    fn launch(&mut self, id: Uuid, kind: OpKind, reply: OpReply) {
        let op_id = self.next();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        let intent = match kind {
            // On disk before anyone hears that the stop is under way.
            OpKind::Stop { reason } => match stop::begin(&self.ctx, id, reason) {
                Ok(intent) => {
                    c.stop_record = Some(intent.clone());
                    Some(intent)
                }
                Err(e) => {
                    tracing::error!(computer = %id, error = %e, "cannot record the stop intent");
                    answer_error(reply, e);
                    return;
                }
            },
            _ => None,
        };
        let ctx = self.ctx.clone();
        let record = c.record.clone();
        let tx = self.internal.clone();
        let abort = self.tasks.spawn(async move {
            let outcome = match (kind, intent) {
                (OpKind::Create, _) => Outcome::Running(create::run(&ctx, &record.spec).await),
                (OpKind::Start, _) => Outcome::Running(resume::run(&ctx, &record).await),
                (OpKind::Stop { .. }, Some(intent)) => {
                    Outcome::Stopped(stop::run(&ctx, id, intent).await)
                }
                (OpKind::Stop { .. }, None) => Outcome::Stopped(Err(BrokerError::Internal(
                    "a stop without its intent".into(),
                ))),
                (OpKind::Remove { purge }, _) => {
                    Outcome::Removed(remove::run(&ctx, id, purge).await)
                }
            };
            let _ = tx
                .send(Internal::OpDone {
                    id,
                    op_id,
                    outcome: Box::new(outcome),
                })
                .await;
        });
        c.op = Some(InFlight {
            op_id,
            kind,
            started: Instant::now(),
            reply,
            abort,
        });
        self.dirty.insert(id);
    }

    fn on_op_done(&mut self, id: Uuid, op_id: u64, outcome: Outcome) {
        let now = Instant::now();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.op.as_ref().map(|o| o.op_id) != Some(op_id) {
            return;
        }
        let Some(op) = c.op.take() else {
            return;
        };
        // Whatever an inspect begun before now says is older than this.
        c.refresh.epoch += 1;
        self.dirty.insert(id);
        match (op.kind, outcome) {
            (kind, Outcome::Running(Ok(info))) if !info.state.is_up() => {
                let e = BrokerError::Guest(format!(
                    "the container exited right after its start (exit code {})",
                    info.exit_code.unwrap_or(-1)
                ));
                tracing::warn!(computer = %id, error = %e, "{} failed", kind.describe());
                c.engine = EngineView::Present(Box::new(info));
                c.last_up = false;
                c.op_problem = Some(e.to_string());
                answer_error(op.reply, e);
            }
            (kind, Outcome::Running(Ok(info))) => {
                tracing::debug!(computer = %id, ms = op.started.elapsed().as_millis() as u64, "{} reached the engine's running state", kind.describe());
                c.engine = EngineView::Present(Box::new(info));
                c.last_up = c.engine.is_up();
                c.image_present = Some(true);
                c.op_problem = None;
                if kind == OpKind::Start {
                    c.stop_record = None;
                }
                arm_idle(c, now);
                c.ready_wait = Some(ReadyWait {
                    started: op.started,
                    deadline: now + self.ctx.config.ready_timeout,
                    resume: kind == OpKind::Start,
                });
                self.start_follower(id);
                // The answer comes once the container runs; readiness follows
                // in the status and on the event stream.
                self.answer(id, op.reply);
            }
            (kind, Outcome::Running(Err(e))) => {
                tracing::warn!(computer = %id, error = %e, "{} failed", kind.describe());
                c.op_problem = Some(e.to_string());
                answer_error(op.reply, e);
                self.refresh(id);
            }
            (OpKind::Stop { reason }, Outcome::Stopped(Ok(stopped))) => {
                tracing::info!(computer = %id, ?reason, finished_at = ?stopped.record.finished_at, "stopped");
                c.engine = EngineView::Present(Box::new(stopped.info));
                c.last_up = c.engine.is_up();
                c.stop_record = Some(stopped.record);
                c.op_problem = None;
                disarm_idle(c);
                stop_follower(c);
                c.ready_wait = None;
                if reason == StopReason::Idle {
                    self.metrics.idle_stop();
                }
                self.answer(id, op.reply);
            }
            (OpKind::Stop { reason }, Outcome::Stopped(Err(e))) => {
                tracing::warn!(computer = %id, ?reason, error = %e, "stop failed");
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
                if reason == StopReason::Fenced && not_running {
                    // Not running: the fenced holder's work is stopped all the same.
                    answer_error(op.reply, e);
                } else {
                    if reason == StopReason::Fenced {
                        let takeovers = std::mem::take(&mut c.takeovers);
                        for t in takeovers {
                            let _ = t.reply.send(Err(e.clone()));
                        }
                    }
                    answer_error(op.reply, e);
                }
                self.refresh(id);
            }
            (OpKind::Remove { purge }, Outcome::Removed(Ok(()))) => {
                self.finish_remove(id, purge, op.reply);
                return;
            }
            (_, Outcome::Removed(Err(e))) => {
                tracing::warn!(computer = %id, error = %e, "remove failed");
                c.op_problem = Some(e.to_string());
                answer_error(op.reply, e);
                self.refresh(id);
            }
            (kind, _) => {
                tracing::error!(computer = %id, "{} reported a mismatched outcome", kind.describe());
                answer_error(
                    op.reply,
                    BrokerError::Internal("operation reported a mismatched outcome".into()),
                );
            }
        }
        self.check_ready(id);
        self.grant_takeovers(id);
    }

    fn answer(&self, id: Uuid, reply: OpReply) {
        match reply {
            OpReply::None => {}
            OpReply::Status(reply) => {
                let _ = reply.send(self.status(id));
            }
            OpReply::Unit(reply) => {
                let _ = reply.send(Ok(()));
            }
        }
    }

    fn finish_remove(&mut self, id: Uuid, purge: bool, reply: OpReply) {
        let Some(mut c) = self.computers.remove(&id) else {
            return;
        };
        stop_follower(&mut c);
        for t in c.takeovers.drain(..) {
            let _ = t.reply.send(Err(BrokerError::NotFound(id)));
        }
        c.ready_wait = None;
        let mut result = Ok(());
        if let Err(e) = self.store.delete(id, purge) {
            result = Err(BrokerError::from(e));
        }
        if let Err(e) = self.ctx.stops.clear(&stop_key(id)) {
            tracing::warn!(computer = %id, error = %e, "cannot clear the stop record");
        }
        tracing::info!(computer = %id, purge, "removed");
        let _ = self.events.send(BrokerEvent::Removed { id });
        match reply {
            OpReply::Unit(reply) => {
                let _ = reply.send(result);
            }
            OpReply::Status(reply) => {
                let _ = reply.send(Err(BrokerError::NotFound(id)));
            }
            OpReply::None => {}
        }
    }

    /// Grants lease takeovers that waited for an operation, now that none is
    /// in flight.
    fn grant_takeovers(&mut self, id: Uuid) {
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
    fn fence(&mut self, id: Uuid) {
        let grace = takeover_grace(self.config());
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        let Some(op) = c.op.take() else {
            return;
        };
        tracing::warn!(computer = %id, "{} outlived a lease takeover's grace; fencing it", op.kind.describe());
        op.abort.abort();
        answer_error(
            op.reply,
            BrokerError::StaleGeneration {
                given: "superseded".into(),
                current: c.record.generation,
            },
        );
        c.ready_wait = None;
        let later = Instant::now() + grace;
        for t in &mut c.takeovers {
            t.deadline = later;
        }
        disarm_idle(c);
        stop_follower(c);
        self.launch(
            id,
            OpKind::Stop {
                reason: StopReason::Fenced,
            },
            OpReply::None,
        );
    }

    // ---- commands -----------------------------------------------------------

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Create(request, reply) => self.create(request, reply),
            Command::List(reply) => {
                let mut all: Vec<&Computer> = self.computers.values().collect();
                all.sort_by_key(|c| (c.record.created_at, c.record.id));
                let statuses = all.into_iter().map(|c| self.status_of(c)).collect();
                let _ = reply.send(Ok(statuses));
            }
            Command::Get(id, reply) => {
                let _ = reply.send(self.status(id));
            }
            Command::Start(id, fence, reply) => {
                if let Err(e) = self.start(id, fence, reply) {
                    e.answer();
                }
            }
            Command::Stop(id, fence, reply) => {
                if let Err(e) = self.stop(id, fence, reply) {
                    e.answer();
                }
            }
            Command::Remove {
                id,
                purge,
                fence,
                reply,
            } => {
                if let Err(e) = self.remove(id, purge, fence, reply) {
                    e.answer();
                }
            }
            Command::Touch(id, fence, reply) => {
                let result = self.touch(id, fence);
                let _ = reply.send(result);
            }
            Command::Patch(id, patch, fence, reply) => {
                let result = self.patch(id, patch, fence);
                let _ = reply.send(result);
            }
            Command::Lease(id, request, reply) => self.lease(id, request, reply),
            Command::Screenshot(id, reply) => self.screenshot(id, reply),
            Command::Orphans(reply) => {
                let _ = reply.send(Ok(self.orphans.clone()));
            }
        }
    }

    /// The checks every mutating call on a computer passes first: it exists,
    /// is not being removed or taken over, and the caller's generation fences.
    /// A refusal changes nothing.
    fn admit(&mut self, id: Uuid, fence: Fence) -> Result<&mut Computer, BrokerError> {
        let c = self
            .computers
            .get_mut(&id)
            .ok_or(BrokerError::NotFound(id))?;
        if let Err(e) = lease::check_fence(
            c.record.lease.as_ref(),
            c.record.generation,
            fence,
            Utc::now(),
        ) {
            self.metrics.fencing_rejection();
            return Err(e);
        }
        if matches!(c.op.as_ref().map(|o| o.kind), Some(OpKind::Remove { .. })) {
            return Err(BrokerError::WrongState(
                "the computer is being removed".into(),
            ));
        }
        if !c.takeovers.is_empty() {
            return Err(BrokerError::WrongState(
                "a lease takeover is in progress".into(),
            ));
        }
        Ok(c)
    }

    /// Desktops running or about to run (creates and starts in flight,
    /// creates resolving their image).
    fn running_count(&self) -> u32 {
        let running = self
            .computers
            .values()
            .filter(|c| {
                c.last_up
                    || matches!(
                        c.op.as_ref().map(|o| o.kind),
                        Some(OpKind::Create | OpKind::Start)
                    )
            })
            .count();
        u32::try_from(running).unwrap_or(u32::MAX) + self.pending_creates
    }

    fn create(&mut self, request: CreateComputer, reply: Reply<ComputerStatus>) {
        if let Err(e) = create::validate(&request, Uuid::nil()) {
            let _ = reply.send(Err(e));
            return;
        }
        if let Some(from) = request.workspace_from {
            let problem = if self.computers.contains_key(&from) {
                Some(BrokerError::WrongState(format!(
                    "computer {from} still exists; remove it (without purge) first"
                )))
            } else if self.adopting.contains(&from) {
                Some(BrokerError::WrongState(format!(
                    "the workspace of {from} is being adopted already"
                )))
            } else if !self.ctx.paths.workspace(from).is_dir() {
                Some(BrokerError::BadRequest(format!(
                    "no kept workspace of computer {from}"
                )))
            } else {
                None
            };
            if let Some(e) = problem {
                let _ = reply.send(Err(e));
                return;
            }
        }
        let running = self.running_count();
        let max = self.config().max_instances;
        if running >= max {
            let _ = reply.send(Err(BrokerError::Capacity { running, max }));
            return;
        }
        self.pending_creates += 1;
        if let Some(from) = request.workspace_from {
            self.adopting.insert(from);
        }
        let engine = self.ctx.engine.clone();
        let image = self.config().image.clone();
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let result = create::resolve_image(engine.as_ref(), &image).await;
            let _ = tx
                .send(Internal::Resolved {
                    request,
                    result,
                    reply,
                })
                .await;
        });
    }

    fn on_resolved(
        &mut self,
        request: CreateComputer,
        result: Result<ImageInfo, BrokerError>,
        reply: Reply<ComputerStatus>,
    ) {
        self.pending_creates = self.pending_creates.saturating_sub(1);
        if let Some(from) = request.workspace_from {
            self.adopting.remove(&from);
        }
        let image = match result {
            Ok(image) => image,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let id = Uuid::new_v4();
        let naming = match create::validate(&request, id) {
            Ok(n) => n,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let paths = self.ctx.paths.clone();
        let spec = create::container_spec(self.config(), &paths, id, &naming.owner, &image.id);
        let record = ComputerRecord {
            schema: RECORD_SCHEMA,
            id,
            name: naming.name,
            owner: naming.owner,
            image_id: image.id,
            generation: 0,
            lease: None,
            workspace: paths.workspace(id),
            idle_timeout_ms: None,
            created_at: Utc::now(),
            spec,
        };
        let adopt = request.workspace_from.map(|from| paths.workspace(from));
        // Directories, then the record, and only then the container: a crash
        // leaves at worst a record whose container is missing.
        let prepared = create::prepare_dirs(&paths, id, adopt.as_deref())
            .and_then(|()| self.store.save(&record));
        if let Err(e) = prepared {
            let _ = reply.send(Err(e.into()));
            return;
        }
        tracing::info!(computer = %id, owner = %record.owner, image = %record.image_id, adopted = ?request.workspace_from, "creating");
        let window = self.window_of(&record);
        let mut computer = Computer::new(record, IdleTimer::new(window, Instant::now()));
        computer.engine = EngineView::Missing;
        computer.image_present = Some(true);
        self.computers.insert(id, computer);
        self.launch(id, OpKind::Create, OpReply::Status(reply));
    }

    fn start(
        &mut self,
        id: Uuid,
        fence: Fence,
        reply: Reply<ComputerStatus>,
    ) -> Result<(), Refused<ComputerStatus>> {
        let c = match self.admit(id, fence) {
            Ok(c) => c,
            Err(e) => return Err(Refused(reply, e)),
        };
        if let Some(op) = &c.op {
            let e = BrokerError::WrongState(format!("{} is in progress", op.kind.describe()));
            return Err(Refused(reply, e));
        }
        if c.engine.is_up() {
            return Err(Refused(
                reply,
                BrokerError::WrongState("the desktop is already running".into()),
            ));
        }
        stop_follower(c);
        self.launch(id, OpKind::Start, OpReply::Status(reply));
        Ok(())
    }

    fn stop(
        &mut self,
        id: Uuid,
        fence: Fence,
        reply: Reply<ComputerStatus>,
    ) -> Result<(), Refused<ComputerStatus>> {
        let c = match self.admit(id, fence) {
            Ok(c) => c,
            Err(e) => return Err(Refused(reply, e)),
        };
        if let Some(op) = &c.op {
            let e = BrokerError::WrongState(format!("{} is in progress", op.kind.describe()));
            return Err(Refused(reply, e));
        }
        let down = match &c.engine {
            EngineView::Missing => true,
            EngineView::Present(info) => !info.state.is_up(),
            EngineView::Unknown(_) => false,
        };
        if down {
            return Err(Refused(
                reply,
                BrokerError::WrongState("the desktop is not running".into()),
            ));
        }
        // A manual stop cancels the idle timer.
        disarm_idle(c);
        c.ready_wait = None;
        self.launch(
            id,
            OpKind::Stop {
                reason: StopReason::Manual,
            },
            OpReply::Status(reply),
        );
        Ok(())
    }

    fn remove(
        &mut self,
        id: Uuid,
        purge: bool,
        fence: Fence,
        reply: Reply<()>,
    ) -> Result<(), Refused<()>> {
        let c = match self.admit(id, fence) {
            Ok(c) => c,
            Err(e) => return Err(Refused(reply, e)),
        };
        if let Some(op) = &c.op {
            let e = BrokerError::WrongState(format!("{} is in progress", op.kind.describe()));
            return Err(Refused(reply, e));
        }
        disarm_idle(c);
        c.ready_wait = None;
        self.launch(id, OpKind::Remove { purge }, OpReply::Unit(reply));
        Ok(())
    }

    fn touch(&mut self, id: Uuid, fence: Fence) -> Result<ComputerStatus, BrokerError> {
        let c = self.admit(id, fence)?;
        c.idle.renew(Instant::now());
        self.dirty.insert(id);
        self.status(id)
    }

    fn patch(
        &mut self,
        id: Uuid,
        patch: PatchComputer,
        fence: Fence,
    ) -> Result<ComputerStatus, BrokerError> {
        // Validate before anything else, so a bad request changes nothing.
        let window = match patch.idle_timeout_ms {
            Some(ms) => {
                let window = Duration::from_millis(ms);
                if window < MIN_WINDOW || window > MAX_WINDOW {
                    return Err(BrokerError::BadRequest(format!(
                        "idle_timeout_ms must be between {} and {}",
                        MIN_WINDOW.as_millis(),
                        MAX_WINDOW.as_millis()
                    )));
                }
                Some(window)
            }
            None => None,
        };
        let c = self.admit(id, fence)?;
        if let (Some(window), Some(ms)) = (window, patch.idle_timeout_ms) {
            let mut record = c.record.clone();
            record.idle_timeout_ms = Some(ms);
            self.store.save(&record)?;
            let c = self
                .computers
                .get_mut(&id)
                .ok_or(BrokerError::NotFound(id))?;
            c.record = record;
            // Changing the window is measured from the last activity; it is
            // not itself activity (else it could never shorten the wait).
            c.idle.set_window(window);
            self.dirty.insert(id);
        }
        self.status(id)
    }

    fn lease(&mut self, id: Uuid, request: LeaseRequest, reply: Reply<LeaseGrant>) {
        if let Err(e) = lease::validate_request(&request.holder, request.ttl_ms) {
            let _ = reply.send(Err(e));
            return;
        }
        let grace = takeover_grace(self.config());
        let Some(c) = self.computers.get_mut(&id) else {
            let _ = reply.send(Err(BrokerError::NotFound(id)));
            return;
        };
        if matches!(c.op.as_ref().map(|o| o.kind), Some(OpKind::Remove { .. })) {
            let _ = reply.send(Err(BrokerError::WrongState(
                "the computer is being removed".into(),
            )));
            return;
        }
        let decision = lease::decide(c.record.lease.as_ref(), &request.holder, Utc::now());
        if decision == lease::LeaseDecision::TakeOver && (c.op.is_some() || !c.takeovers.is_empty())
        {
            // The previous holder's work must be confirmed finished first.
            tracing::info!(computer = %id, holder = %request.holder, "lease takeover waits for the operation in flight");
            c.takeovers.push(PendingTakeover {
                request,
                reply,
                deadline: Instant::now() + grace,
            });
            return;
        }
        let result = self.decide_lease(id, &request);
        let _ = reply.send(result);
    }

    /// Decides and (when granted) persists a lease, before answering.
    fn decide_lease(
        &mut self,
        id: Uuid,
        request: &LeaseRequest,
    ) -> Result<LeaseGrant, BrokerError> {
        let c = self
            .computers
            .get_mut(&id)
            .ok_or(BrokerError::NotFound(id))?;
        let now = Utc::now();
        let mut record = c.record.clone();
        match lease::decide(record.lease.as_ref(), &request.holder, now) {
            lease::LeaseDecision::Refuse { holder, expires_at } => {
                return Err(BrokerError::LeaseHeld {
                    holder,
                    expires_at: expires_at.to_rfc3339(),
                })
            }
            lease::LeaseDecision::Renew => {}
            lease::LeaseDecision::TakeOver => {
                record.generation = record
                    .generation
                    .checked_add(1)
                    .ok_or_else(|| BrokerError::Internal("generation overflow".into()))?;
            }
        }
        let granted = Lease {
            holder: request.holder.clone(),
            expires_at: lease::expiry(now, request.ttl_ms),
            generation: record.generation,
        };
        record.lease = Some(granted.clone());
        // Persisted (atomically, fsynced) before anyone hears of it.
        self.store.save(&record)?;
        c.record = record;
        self.dirty.insert(id);
        Ok(LeaseGrant {
            generation: granted.generation,
            holder: granted.holder,
            expires_at: granted.expires_at,
        })
    }

    fn screenshot(&mut self, id: Uuid, reply: Reply<Vec<u8>>) {
        let Some(c) = self.computers.get(&id) else {
            let _ = reply.send(Err(BrokerError::NotFound(id)));
            return;
        };
        if !c.engine.is_up() {
            let _ = reply.send(Err(BrokerError::WrongState(
                "the desktop is not running".into(),
            )));
            return;
        }
        // Reading the screen is not activity: the idle timer is left alone.
        let socket = self.ctx.socket(id);
        self.tasks.spawn(async move {
            let bound = guest::CONNECT_TIMEOUT + guest::SCREENSHOT_TIMEOUT;
            let result = match tokio::time::timeout(bound, guest::screenshot(&socket)).await {
                Ok(result) => result.map_err(BrokerError::from),
                Err(_) => Err(BrokerError::Guest("no screenshot in time".into())),
            };
            let _ = reply.send(result);
        });
    }
}

/// A refused command with the reply it still owes.
struct Refused<T>(Reply<T>, BrokerError);

impl<T> Refused<T> {
    fn answer(self) {
        let _ = self.0.send(Err(self.1));
    }
}

/// How long a lease takeover waits for an operation in flight before
/// fencing it: every engine call of an operation is bounded by these.
fn takeover_grace(config: &BrokerConfig) -> Duration {
    config.quiesce_timeout + config.stop_timeout + Duration::from_secs(10)
}

/// The idle timer looks at a desktop only when it runs, is not being
/// changed and is not still booting (a slow boot is not idleness).
fn idle_may_check(c: &Computer) -> bool {
    c.op.is_none() && c.ready_wait.is_none() && !c.idle_check && c.engine.is_up()
}

fn arm_idle(c: &mut Computer, now: Instant) {
    c.idle.arm(now);
    c.idle_epoch += 1;
    c.idle_check = false;
}

fn disarm_idle(c: &mut Computer) {
    c.idle.disarm();
    c.idle_epoch += 1;
    c.idle_check = false;
}

fn stop_follower(c: &mut Computer) {
    if let Some(f) = c.follower.take() {
        f.abort.abort();
    }
    c.guest = Default::default();
}

fn answer_error(reply: OpReply, error: BrokerError) {
    match reply {
        OpReply::None => {}
        OpReply::Status(reply) => {
            let _ = reply.send(Err(error));
        }
        OpReply::Unit(reply) => {
            let _ = reply.send(Err(error));
        }
    }
}

fn computer_state_of(view: &EngineView) -> String {
    match view {
        EngineView::Unknown(why) => format!("unknown ({why})"),
        EngineView::Missing => "missing".into(),
        EngineView::Present(info) => info.state.to_string(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
