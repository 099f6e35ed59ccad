//! Coming back after a host restart: the persisted intent that says which
//! desktops were running when the host (or the engine) went down, and
//! starting those again once the start-up reconcile is done.
//!
//! Each record carries `wanted_running_since`. It is set when a create or a
//! start is launched (before the engine is asked) and when the broker sees
//! a desktop running; it is cleared when the broker launches a stop of its
//! own (manual, idle, running limit, fenced, an interrupted stop finished),
//! when a create or start fails, and when the broker *watches* the desktop
//! go down (a `docker kill` behind its back, a crash, the OOM killer): that
//! desktop was not running when the host went down, so it stays stopped. A
//! desktop that went down while the engine was lost to the broker (its
//! events broke: an engine restart, perhaps with the host) keeps it. So a
//! desktop found stopped at start-up with the intent set went down while no
//! broker watched: with the host, or with the engine while the broker was
//! not running.
//!
//! With [`ResumeAfterRestart::Running`] those are started through the API's
//! own start handler (every resume check, the fence at the record's
//! generation, the same operation and activity record), at most
//! `resume_concurrency` at a time; a slot is held from the start until the
//! desktop is ready, its start failed or its ready wait ran out. With
//! [`ResumeAfterRestart::None`] they stay stopped and their intent is
//! cleared, as if the broker had stopped them. Either way the activity
//! records `stopped` with reason `host_restart` for each, by the broker.
//!
//! What it must never do: start a desktop that the broker or a user
//! stopped, create or remove anything, or wait on the owner task.

use std::collections::{BTreeSet, VecDeque};

use chrono::Utc;
use dormouse_protocol::activity::{Actor, Happened};
use tokio::sync::oneshot;
use tokio::time::Instant;
use uuid::Uuid;

use super::commands::Answer;
use super::Owner;
use crate::config::ResumeAfterRestart;
use crate::engine::Observed;

/// The activity's stop reason of a desktop found down at start-up that no
/// stop of the broker explains.
pub const HOST_RESTART: &str = "host_restart";

/// The desktops still to bring back after a restart.
#[derive(Debug)]
pub(super) struct RestartPlan {
    /// Wanted running, not decided yet: an operation is in flight or the
    /// engine's state is not known yet.
    undecided: BTreeSet<Uuid>,
    /// Found down: to start, in the order found.
    queue: VecDeque<Uuid>,
    /// Started, not ready (nor failed) yet.
    active: BTreeSet<Uuid>,
    /// When the plan was made (for the log's total).
    began: Instant,
    /// How many starts were launched, and how many of those got ready.
    launched: usize,
    ready: usize,
}

/// What to do with one desktop that is wanted running.
enum Decision {
    /// Not yet: an operation is in flight, or the engine's state is unknown.
    Wait,
    /// Nothing: it runs, is gone, or its intent was cleared since.
    Drop,
    /// It went down unwatched.
    Down,
}

impl Owner {
    /// After the start-up reconcile: every desktop whose record says it is
    /// wanted running becomes part of the plan, decided as soon as the
    /// engine's state of it is known.
    pub(super) fn plan_restart(&mut self) {
        let undecided: BTreeSet<Uuid> = self
            .computers
            .iter()
            .filter(|(_, c)| c.record.wanted_running_since.is_some())
            .map(|(id, _)| *id)
            .collect();
        if undecided.is_empty() {
            return;
        }
        self.restart = Some(RestartPlan {
            undecided,
            queue: VecDeque::new(),
            active: BTreeSet::new(),
            began: Instant::now(),
            launched: 0,
            ready: 0,
        });
        self.advance_restart();
    }

    /// One turn of the plan (run on every turn of the loop while a plan
    /// exists): decide what can be decided, free the slots of desktops that
    /// are ready or failed, start the next ones.
    pub(super) fn advance_restart(&mut self) {
        let Some(mut plan) = self.restart.take() else {
            return;
        };
        let policy = self.config().resume_after_restart;
        for id in std::mem::take(&mut plan.undecided) {
            match self.restart_decision(id) {
                Decision::Wait => {
                    plan.undecided.insert(id);
                }
                Decision::Drop => {}
                Decision::Down => {
                    let reason = HOST_RESTART.to_owned();
                    self.record(id, Actor::Broker, &Happened::Stopped { reason });
                    match policy {
                        ResumeAfterRestart::Running => plan.queue.push_back(id),
                        ResumeAfterRestart::None => {
                            tracing::info!(computer = %id, "went down unwatched (host or engine restart); left stopped (--resume-after-restart none)");
                            self.want_running(id, false);
                        }
                    }
                }
            }
        }
        let done: Vec<Uuid> = plan
            .active
            .iter()
            .copied()
            .filter(|id| {
                self.computers
                    .get(id)
                    .is_none_or(|c| c.op.is_none() && c.ready_wait.is_none())
            })
            .collect();
        for id in done {
            plan.active.remove(&id);
            if self.computers.get(&id).is_some_and(|c| c.is_ready()) {
                plan.ready += 1;
            }
        }
        let most = self.config().resume_concurrency.max(1);
        while plan.active.len() < most {
            let Some(id) = plan.queue.pop_front() else {
                break;
            };
            if self.start_after_restart(id) {
                plan.launched += 1;
                plan.active.insert(id);
            }
        }
        if plan.undecided.is_empty() && plan.queue.is_empty() && plan.active.is_empty() {
            if plan.launched > 0 {
                let ms = u64::try_from(plan.began.elapsed().as_millis()).unwrap_or(u64::MAX);
                tracing::info!(
                    started = plan.launched,
                    ready = plan.ready,
                    ms,
                    "desktops that went down with the host are back"
                );
            }
            return;
        }
        self.restart = Some(plan);
    }

    fn restart_decision(&self, id: Uuid) -> Decision {
        let Some(c) = self.computers.get(&id) else {
            return Decision::Drop;
        };
        // A stop the broker recorded (begun or confirmed since the last
        // start) explains the stop: only a stop nobody recorded is the host's.
        if c.record.wanted_running_since.is_none() || c.stop_record.is_some() {
            return Decision::Drop;
        }
        if c.op.is_some() {
            return Decision::Wait;
        }
        match &c.engine {
            Observed::Unknown(_) => Decision::Wait,
            Observed::Missing => {
                tracing::warn!(computer = %id, "was running, but its desktop is missing: not started again");
                Decision::Drop
            }
            Observed::Present(info) if info.state.is_up() => Decision::Drop,
            Observed::Present(_) => Decision::Down,
        }
    }

    /// Starts `id` through the API's start handler, as the broker, under
    /// the record's generation; `false` when it was refused at once.
    fn start_after_restart(&mut self, id: Uuid) -> bool {
        let Some(generation) = self.computers.get(&id).map(|c| c.record.generation) else {
            return false;
        };
        tracing::info!(computer = %id, "went down unwatched (host or engine restart): starting it again");
        // Nobody waits for the answer: the outcome shows in the status, the
        // log and the activity.
        let (reply, _) = oneshot::channel();
        match self.start((id, Some(generation), ()), reply) {
            Answer::Later => {
                self.op_by(id, Actor::Broker);
                true
            }
            Answer::Now(_, result) => {
                if let Err(e) = result {
                    tracing::warn!(computer = %id, error = %e.detail(), "not started again after the restart");
                }
                false
            }
        }
    }

    /// Persists whether `id` is wanted running (a no-op when the record
    /// says so already). A write that fails is logged; the broker goes on
    /// (what is lost is only this desktop's return after a host restart).
    pub(super) fn want_running(&mut self, id: Uuid, wanted: bool) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.record.wanted_running_since.is_some() == wanted {
            return;
        }
        let mut record = c.record.clone();
        record.wanted_running_since = wanted.then(Utc::now);
        if let Err(e) = self.store.save(&record) {
            tracing::error!(computer = %id, wanted, error = %e, "cannot record whether the desktop is wanted running");
        }
        c.record = record;
    }

    /// The engine's view of `id` was applied with no operation in flight:
    /// a desktop seen running is wanted running; one seen going down while
    /// the broker watched is not, unless the engine was lost meanwhile.
    pub(super) fn watched_run(&mut self, id: Uuid, now_up: bool, went_down: bool, gap: bool) {
        if now_up {
            self.want_running(id, true);
        } else if went_down && gap {
            tracing::info!(computer = %id, "went down while the engine was lost: still wanted running");
        } else if went_down {
            self.want_running(id, false);
        }
    }
}
