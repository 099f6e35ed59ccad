//! One computer as the owner task holds it: its record, what the engine and
//! the guest last said, its idle timer, its in-flight operation, and the
//! status derived from all of that.
//!
//! Only the owner task touches a [`Computer`]; it has no I/O of its own.

use chrono::{DateTime, Utc};
use dormouse_protocol::api::{ComputerStatus, ContainerState, IdleStatus, WorkspaceLimit};
use dormouse_protocol::{GuestStatus, Hello, Phase};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::follow::GuestThrottle;
use super::ops::{InFlight, OpKind};
use crate::command::Reply;
use crate::engine::Observed;
use crate::idle::IdleTimer;
use crate::lifecycle::resume;
use crate::store::{stop_reason::effective_reason, ComputerRecord, StopRecord};

/// A create or start whose container runs, until the guest says `ready`
/// (for the resume-latency metric, the readiness deadline, and to keep the
/// idle timer off a desktop that is still booting).
#[derive(Debug)]
pub struct ReadyWait {
    /// When the operation began.
    pub started: Instant,
    /// Give up at.
    pub deadline: Instant,
    /// A resume (counts in the resume-latency metric).
    pub resume: bool,
}

/// The follower task streaming the guest's status.
#[derive(Debug)]
pub struct Follower {
    /// Distinguishes it from its predecessors.
    pub epoch: u64,
    /// To stop it when the container stops.
    pub abort: AbortHandle,
}

/// What the guest last said.
#[derive(Debug, Default, Clone)]
pub struct GuestView {
    /// Its greeting on the current connection.
    pub hello: Option<Hello>,
    /// Its latest pushed status.
    pub status: Option<GuestStatus>,
    /// Why the broker cannot trust or reach it, if so.
    pub problem: Option<String>,
    /// Why the last call made to it failed on its channel, until it answers
    /// again ([`super::answers`]). The status stream does not clear it: a
    /// stream opened before the channel broke may well go on.
    pub calls: Option<String>,
    /// The probe asking whether it answers again, while `calls` stands.
    pub probe: Option<AbortHandle>,
}

/// A lease request waiting for an in-flight operation to end.
#[derive(Debug)]
pub struct PendingTakeover {
    /// The request.
    pub request: dormouse_protocol::api::LeaseRequest,
    /// Whom to answer.
    pub reply: Reply<dormouse_protocol::api::LeaseGrant>,
    /// When the broker stops waiting and fences the operation.
    pub deadline: Instant,
}

/// Coalesced engine refreshes: at most one inspect in flight per computer.
#[derive(Debug, Default)]
pub struct Refresh {
    /// An inspect is running.
    pub in_flight: bool,
    /// Another was asked for meanwhile.
    pub again: bool,
    /// Bumped whenever an operation's own view of the container is applied;
    /// an inspect begun before that is older than what the operation saw and
    /// is discarded instead of applied.
    pub epoch: u64,
}

/// One computer.
#[derive(Debug)]
pub struct Computer {
    /// The persisted record.
    pub record: ComputerRecord,
    /// What the engine last said.
    pub engine: Observed,
    /// Whether the container was up the last time the engine could say.
    pub last_up: bool,
    /// Whether the engine has said anything of it yet (its first answer
    /// at start-up is no change of state, for the activity record).
    pub engine_seen: bool,
    /// Whether the recorded image is present (`None`: unknown).
    pub image_present: Option<bool>,
    /// The stop-reason record, as last read or written.
    pub stop_record: Option<StopRecord>,
    /// What the guest last said.
    pub guest: GuestView,
    /// The guest follower, while the container runs.
    pub follower: Option<Follower>,
    /// The mutating operation in flight.
    pub op: Option<InFlight>,
    /// A create/start waiting for ready.
    pub ready_wait: Option<ReadyWait>,
    /// The idle timer.
    pub idle: IdleTimer,
    /// Bumped on every arm/disarm, so a late activity answer is ignored.
    pub idle_epoch: u64,
    /// An activity query is running.
    pub idle_check: bool,
    /// Engine refreshes.
    pub refresh: Refresh,
    /// Lease takeovers waiting for the in-flight operation.
    pub takeovers: Vec<PendingTakeover>,
    /// The last operation's failure, until the next one succeeds.
    pub op_problem: Option<String>,
    /// The status last broadcast.
    pub last_sent: Option<ComputerStatus>,
    /// Since when the desktop runs without a break (for the running limit).
    pub up_since: Option<Instant>,
    /// How often what the guest pushes may be broadcast.
    pub guest_throttle: GuestThrottle,
    /// The host-side limit on the workspace, once determined
    /// ([`super::quota`]).
    pub workspace_limit: Option<WorkspaceLimit>,
    /// Bumped whenever the limit is (re)applied, so an older answer is
    /// discarded.
    pub limit_epoch: u64,
    /// The engine was lost since the broker last saw this desktop's state:
    /// a stop seen next happened unwatched ([`super::restart`]).
    pub engine_gap: bool,
}

impl Computer {
    /// A computer with nothing known yet about its container.
    pub fn new(record: ComputerRecord, idle: IdleTimer) -> Self {
        Self {
            record,
            engine: Observed::Unknown("not inspected yet".into()),
            last_up: false,
            engine_seen: false,
            image_present: None,
            stop_record: None,
            guest: GuestView::default(),
            follower: None,
            op: None,
            ready_wait: None,
            idle,
            idle_epoch: 0,
            idle_check: false,
            refresh: Refresh::default(),
            takeovers: Vec::new(),
            op_problem: None,
            last_sent: None,
            up_since: None,
            guest_throttle: GuestThrottle::default(),
            workspace_limit: None,
            limit_epoch: 0,
            engine_gap: false,
        }
    }

    /// The container state for the API.
    pub fn container_state(&self) -> ContainerState {
        match &self.engine {
            Observed::Unknown(_) => ContainerState::Unknown,
            Observed::Missing => ContainerState::Missing,
            Observed::Present(info) if info.state.is_up() => ContainerState::Running,
            Observed::Present(_) => ContainerState::Stopped,
        }
    }

    /// Whether the guest's self-probe passed on this container start (and
    /// the desktop is not being stopped or removed).
    pub fn is_ready(&self) -> bool {
        let leaving = matches!(
            self.op.as_ref().map(|o| o.kind()),
            Some(OpKind::Stop { .. } | OpKind::Remove { .. })
        );
        !leaving && self.engine.is_up() && self.guest_ready()
    }

    /// Whether the guest says it is ready and answers, whatever the engine
    /// says (or cannot say).
    pub fn guest_ready(&self) -> bool {
        self.guest.problem.is_none()
            && self.guest.calls.is_none()
            && self.guest.status.as_ref().is_some_and(|s| s.ready)
    }

    /// The status every frontend sees. `to_wall` turns a monotonic instant
    /// into wall-clock time.
    pub fn status(
        &self,
        now: Instant,
        to_wall: impl Fn(Instant) -> DateTime<Utc>,
    ) -> ComputerStatus {
        let container = self.container_state();
        let running = container == ContainerState::Running;
        let stopped = container == ContainerState::Stopped;
        let info = self.engine.info();

        let phase = if !running {
            None
        } else if matches!(
            self.op.as_ref().map(|o| o.kind()),
            Some(OpKind::Stop { .. })
        ) {
            Some(Phase::Stopping)
        } else if self.guest.problem.is_some() || self.guest.calls.is_some() {
            Some(Phase::Degraded)
        } else {
            self.guest.status.as_ref().map(|s| s.phase)
        };

        let problem = self
            .op_problem
            .clone()
            .or_else(|| {
                running
                    .then(|| {
                        self.guest
                            .problem
                            .as_ref()
                            .map(|p| format!("guest supervisor: {p}"))
                            .or_else(|| {
                                self.guest
                                    .calls
                                    .as_ref()
                                    .map(|p| format!("guest supervisor does not answer calls: {p}"))
                            })
                            .or_else(|| self.guest.status.as_ref().and_then(|s| s.problem.clone()))
                    })
                    .flatten()
            })
            .or_else(|| match &self.engine {
                Observed::Unknown(why) => Some(format!("container engine: {why}")),
                Observed::Missing => Some(format!("{} is missing", self.record.spec.describe())),
                Observed::Present(_) => None,
            });

        let (resumable, resumable_problem) = match &self.op {
            Some(op) => (
                false,
                Some(format!("{} is in progress", op.kind().describe())),
            ),
            None => match &self.engine {
                Observed::Unknown(why) => (false, Some(format!("container engine: {why}"))),
                _ => match resume::check(&self.record, info, self.image_present) {
                    Ok(()) => (true, None),
                    Err(refusal) => (false, Some(refusal.message())),
                },
            },
        };

        let idle_status = IdleStatus {
            timeout_ms: u64::try_from(self.idle.window().as_millis()).unwrap_or(u64::MAX),
            idle_for_ms: u64::try_from(self.idle.idle_for(now).as_millis()).unwrap_or(u64::MAX),
            stops_at: if running && self.op.is_none() {
                self.idle.stops_at().map(&to_wall)
            } else {
                None
            },
        };

        ComputerStatus {
            id: self.record.id,
            name: self.record.name.clone(),
            owner: self.record.owner.clone(),
            container,
            ready: self.is_ready(),
            phase,
            problem,
            stop_reason: if stopped {
                info.and_then(|i| effective_reason(self.stop_record.as_ref(), i))
            } else {
                None
            },
            stopped_at: if stopped {
                info.and_then(|i| i.finished_at)
            } else {
                None
            },
            resumable,
            resumable_problem,
            generation: self.record.generation,
            health: if running {
                self.guest.status.as_ref().and_then(|s| s.health.clone())
            } else {
                None
            },
            image_id: self.record.image_id.clone(),
            idle: Some(idle_status),
            workspace_limit: self.workspace_limit.clone(),
            taskbar_height: if running {
                self.guest.status.as_ref().and_then(|s| s.taskbar_height)
            } else {
                None
            },
            start_phases: if running {
                self.guest.status.as_ref().map(|s| *s.start_phases)
            } else {
                None
            },
        }
    }
}

/// Whether two statuses differ in anything but the ever-growing `idle_for_ms`.
pub fn materially_different(a: &ComputerStatus, b: &ComputerStatus) -> bool {
    let strip = |s: &ComputerStatus| {
        let mut s = s.clone();
        if let Some(idle) = s.idle.as_mut() {
            idle.idle_for_ms = 0;
        }
        s
    };
    strip(a) != strip(b)
}
