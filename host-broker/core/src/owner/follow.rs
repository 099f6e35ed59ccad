//! Following the guest: the supervisor's status stream, readiness, the
//! activity the idle timer asks for, and the guest channel as a second
//! witness of the engine's state.
//!
//! The witness: when the supervisor's connection drops, or the guest says it
//! is stopping, the container is observed at once and again on a short
//! schedule ([`WITNESS_SCHEDULE`]), and the engine's answer is applied as the
//! truth. A kill is so seen within a second even when the engine's event
//! stream says nothing; when it indeed said nothing, that is counted as a
//! divergence.
//!
//! Everything here comes from the guest and is hostile: a status only ever
//! replaces the one before it (one per computer is kept), and what the
//! guest pushes reaches the event stream at a bounded rate per computer
//! ([`GuestThrottle`]), so a flood costs bounded memory and CPU.

use std::time::Duration;

use dormouse_protocol::api::StopReason;
use dormouse_protocol::{call, Activity, Phase};
use tokio::time::Instant;
use uuid::Uuid;

use super::computer::Follower;
use super::{stop_follower, Internal, Owner};
use crate::guest::{self, GuestUpdate};
use crate::idle::Verdict;
use crate::store::Paths;

/// Statuses a guest may push back to back before the throttle holds them.
const GUEST_BURST: u32 = 4;
/// Then at most one broadcast per this long, carrying the latest status.
const GUEST_EVERY: Duration = Duration::from_millis(250);

/// A token bucket for the broadcasts a guest's statuses cause: the first few
/// go out at once (starting → ready is never delayed), a flood is coalesced
/// into one broadcast of the latest status per [`GUEST_EVERY`].
#[derive(Debug)]
pub struct GuestThrottle {
    tokens: u32,
    refilled: Option<Instant>,
    /// A status arrived that is not broadcast yet.
    held: bool,
}

impl Default for GuestThrottle {
    fn default() -> Self {
        Self {
            tokens: GUEST_BURST,
            refilled: None,
            held: false,
        }
    }
}

impl GuestThrottle {
    fn refill(&mut self, now: Instant) {
        let since = self.refilled.get_or_insert(now);
        let elapsed = now.saturating_duration_since(*since);
        let earned = elapsed.as_millis() / GUEST_EVERY.as_millis();
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(GUEST_BURST);
            *since = now;
        }
    }

    /// Whether a status arriving now may be broadcast at once; if not it is
    /// held for [`GuestThrottle::release`].
    pub fn admit(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens > 0 {
            self.tokens -= 1;
            self.held = false;
            true
        } else {
            self.held = true;
            false
        }
    }

    /// Whether a held status may go out now.
    pub fn release(&mut self, now: Instant) -> bool {
        self.held && self.admit(now)
    }

    /// When a held status may go out.
    pub fn wake_at(&self) -> Option<Instant> {
        if !self.held {
            return None;
        }
        Some(self.refilled.map_or_else(Instant::now, |r| r + GUEST_EVERY))
    }
}

/// When the engine is asked, counted from the moment the guest channel
/// dropped: at once, then with a growing pause (an engine may record a
/// container's exit a moment after its processes are gone).
pub const WITNESS_SCHEDULE: [Duration; 8] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// While the engine cannot be asked, the witness asks this often…
pub const WITNESS_UNREACHABLE_EVERY: Duration = Duration::from_millis(250);
/// …for at most this long after the guest channel dropped (then the
/// reconnect to the engine and the resync take over).
pub const WITNESS_UNREACHABLE_FOR: Duration = Duration::from_secs(120);

/// How long after the guest channel dropped the engine's own event about
/// the desktop may still arrive before its absence counts as a divergence
/// (once the engine says the desktop is down).
pub const EVENT_GRACE: Duration = Duration::from_secs(2);

/// One computer being witnessed after its guest channel dropped.
#[derive(Debug)]
pub struct Witness {
    /// When the guest channel dropped.
    armed: Instant,
    /// The next step of [`WITNESS_SCHEDULE`].
    step: usize,
    /// When the owner looks again.
    next_at: Instant,
    /// The engine was seen to say the desktop is down.
    down: bool,
}

impl Witness {
    /// When the owner looks again.
    pub fn wake_at(&self) -> Instant {
        self.next_at
    }
}

/// A guest-channel problem as a status may show it: the host paths (which
/// the log keeps) become the names a client knows.
pub(super) fn without_paths(text: &str, paths: &Paths, id: Uuid) -> String {
    let socket = paths.socket(id).display().to_string();
    let data = paths.data().display().to_string();
    let text = text.replace(&socket, "the supervisor socket");
    if data.is_empty() {
        text
    } else {
        text.replace(&data, "<data dir>")
    }
}

impl Owner {
    pub(super) fn start_follower(&mut self, id: Uuid) {
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

    pub(super) fn on_guest(&mut self, id: Uuid, epoch: u64, update: GuestUpdate) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.follower.as_ref().map(|f| f.epoch) != Some(epoch) {
            return;
        }
        match update {
            GuestUpdate::Connected(hello) => {
                self.dirty.insert(id);
                let since_start = c.ready_wait.as_ref().map(|w| w.started.elapsed());
                tracing::debug!(computer = %id, version = %guest::sanitize(&hello.supervisor_version), ?since_start, "guest supervisor connected");
                c.guest.hello = Some(hello);
                c.guest.problem = None;
                // A fresh connection was greeted: the channel answers.
                super::answers::answered_again(c);
            }
            GuestUpdate::Status(status) => {
                if c.guest_throttle.admit(Instant::now()) {
                    self.dirty.insert(id);
                }
                let stopping = status.phase == Phase::Stopping;
                let was_stopping = c
                    .guest
                    .status
                    .as_ref()
                    .is_some_and(|s| s.phase == Phase::Stopping);
                c.guest.problem = None;
                c.guest.status = Some(status);
                self.check_ready(id);
                if stopping && !was_stopping {
                    self.witness(id, "the guest says it is stopping");
                }
            }
            GuestUpdate::Closed => {
                self.dirty.insert(id);
                tracing::debug!(computer = %id, "guest supervisor closed its stream");
                c.guest.status = None;
                self.witness(id, "the guest closed its stream");
            }
            GuestUpdate::Lost(why) => {
                self.dirty.insert(id);
                let why = guest::sanitize(&why);
                tracing::warn!(computer = %id, problem = %why, "guest supervisor connection lost");
                c.guest.problem = Some(without_paths(&why, &self.ctx.paths, id));
                c.guest.status = None;
                self.witness(id, "the guest connection was lost");
            }
            GuestUpdate::GaveUp(why) => {
                self.dirty.insert(id);
                let why = format!("not reachable: {}", guest::sanitize(&why));
                tracing::warn!(computer = %id, problem = %why, "guest supervisor");
                c.follower = None;
                c.guest.problem = Some(without_paths(&why, &self.ctx.paths, id));
                c.guest.status = None;
                c.ready_wait = None;
                self.witness(id, "the guest is not reachable");
            }
        }
    }

    /// Asks the engine about `id` now and on [`WITNESS_SCHEDULE`], because
    /// its guest channel suggests it may have stopped. Only with no
    /// operation in flight: an operation observes the container itself.
    pub(super) fn witness(&mut self, id: Uuid, why: &str) {
        let Some(c) = self.computers.get(&id) else {
            return;
        };
        if c.op.is_some() {
            return;
        }
        let now = Instant::now();
        tracing::debug!(computer = %id, %why, "asking the engine what became of the desktop");
        self.witnesses.insert(
            id,
            Witness {
                armed: now,
                step: 1,
                next_at: now + WITNESS_SCHEDULE[1],
                down: false,
            },
        );
        self.refresh(id);
    }

    /// After an observation of `id` was applied: whether its witness has now
    /// seen the desktop down (kept, whatever happens to it next).
    pub(super) fn witnessed(&mut self, id: Uuid) {
        let (Some(c), Some(w)) = (self.computers.get(&id), self.witnesses.get_mut(&id)) else {
            return;
        };
        let known = !matches!(c.engine, crate::engine::Observed::Unknown(_));
        w.down |= c.op.is_none() && known && !c.engine.is_up();
    }

    /// The witnesses' next looks: ask again, or end once the engine says the
    /// desktop is down (counting a divergence when no engine event said so).
    pub(super) fn witness_tick(&mut self, now: Instant) {
        let due: Vec<Uuid> = self
            .witnesses
            .iter()
            .filter(|(_, w)| w.next_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let (Some(c), Some(w)) = (self.computers.get(&id), self.witnesses.get_mut(&id)) else {
                self.witnesses.remove(&id);
                continue;
            };
            let known = !matches!(c.engine, crate::engine::Observed::Unknown(_));
            // Once seen down, a start that follows does not undo what the
            // events failed to say; before that an operation takes over.
            w.down |= c.op.is_none() && known && !c.engine.is_up();
            if !w.down && c.op.is_some() {
                self.witnesses.remove(&id);
                continue;
            }
            if w.down {
                let told = self.last_change.get(&id).is_some_and(|t| *t >= w.armed);
                let grace_ends = w.armed + EVENT_GRACE;
                if told {
                    self.witnesses.remove(&id);
                } else if now >= grace_ends {
                    self.witnesses.remove(&id);
                    self.metrics.divergence();
                    tracing::warn!(computer = %id, "the desktop stopped and the engine's events did not say so; learnt through the guest channel");
                } else {
                    w.next_at = grace_ends;
                }
                continue;
            }
            // An engine that cannot answer (restarting) is asked briskly
            // until it can: its first answer is the one that matters.
            if !known && now < w.armed + WITNESS_UNREACHABLE_FOR {
                w.next_at = now + WITNESS_UNREACHABLE_EVERY;
                self.refresh(id);
                continue;
            }
            match WITNESS_SCHEDULE.get(w.step) {
                Some(offset) => {
                    w.step += 1;
                    w.next_at = WITNESS_SCHEDULE
                        .get(w.step)
                        .map_or(now + *offset, |next| w.armed + *next);
                    self.refresh(id);
                }
                None => {
                    self.witnesses.remove(&id);
                }
            }
        }
    }

    /// Answers a waiting create/start once the guest says ready.
    pub(super) fn check_ready(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if !c.is_ready() {
            return;
        }
        let Some(wait) = c.ready_wait.take() else {
            return;
        };
        // Becoming ready is always told at once.
        self.dirty.insert(id);
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

    pub(super) fn check_activity(&mut self, id: Uuid) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        c.idle_check = true;
        let epoch = c.idle_epoch;
        let socket = self.ctx.socket(id);
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let bound = guest::CONNECT_TIMEOUT + guest::REQUEST_TIMEOUT;
            let activity = socket.call(call::Activity);
            let activity = match tokio::time::timeout(bound, activity).await {
                Ok(Ok(activity)) => Some(activity.message),
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

    pub(super) fn on_activity(&mut self, id: Uuid, epoch: u64, activity: Option<Activity>) {
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
            self.launch_stop(id, StopReason::Idle, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_is_coalesced_and_a_quiet_guest_is_never_held() {
        let mut t = GuestThrottle::default();
        let start = Instant::now();
        let admitted = (0..1000).filter(|_| t.admit(start)).count();
        assert_eq!(
            admitted, GUEST_BURST as usize,
            "only the burst goes out at once"
        );
        assert!(t.wake_at().is_some());
        assert!(!t.release(start));
        assert!(
            t.release(start + GUEST_EVERY),
            "the held status goes out later"
        );
        assert_eq!(t.wake_at(), None);
        // A status every second is never held.
        for s in 1..10 {
            assert!(t.admit(start + Duration::from_secs(s)));
        }
    }
}
