//! The link to the engine: following its change stream, noticing that it
//! went away, reaching it again with a bounded, jittered backoff, and on its
//! return reconciling every desktop against what it says (not only what its
//! events say).
//!
//! While the engine is lost the broker keeps serving: every desktop's
//! container state is `unknown` with a problem naming the engine and since
//! when, calls that need the engine's truth (start, stop, remove, import,
//! exec, actions, screenshots, new screens) answer `engine_unavailable`,
//! and what rides the guest channel alone (open screens, exec streams,
//! exports, file access) goes on: nothing is revoked for a desktop the
//! engine has not said stopped. On the engine's return each desktop is
//! observed afresh and what it says is applied — a desktop that stopped
//! meanwhile is `stopped`/`killed` and its screens revoked, one that runs
//! keeps everything — and the time that took is recorded
//! ([`crate::availability`]).
//!
//! What it must never do: start, stop or remove a desktop because the
//! engine came or went.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::time::Instant;
use uuid::Uuid;

use super::{Internal, Owner};
use crate::availability::{LossReason, Return};
use crate::engine::{EngineError, Listed, Observed};
use crate::error::BrokerError;

/// The first pause before the engine is asked again.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(5);
/// Each pause is its nominal length times a factor drawn from
/// `1 ± RETRY_JITTER`, so brokers sharing an engine do not knock in step.
pub const RETRY_JITTER: f64 = 0.2;
/// A change stream that lived this long was a working link: the backoff
/// starts afresh after it breaks.
const STREAM_LIVED: Duration = RETRY_MAX;

/// Doubling pauses from [`RETRY_FIRST`] to [`RETRY_MAX`], jittered.
#[derive(Debug, Clone)]
pub struct Backoff {
    nominal: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            nominal: RETRY_FIRST,
        }
    }
}

impl Backoff {
    /// The next pause; `unit` is a number in `[0, 1)` (random in use, fixed
    /// in tests) that places it within the jitter.
    pub fn next_with(&mut self, unit: f64) -> Duration {
        let factor = 1.0 - RETRY_JITTER + 2.0 * RETRY_JITTER * unit.clamp(0.0, 1.0);
        let pause = self.nominal.mul_f64(factor);
        self.nominal = (self.nominal * 2).min(RETRY_MAX);
        pause
    }

    /// The next pause, jittered at random.
    pub fn pause(&mut self) -> Duration {
        let unit: f64 = rand::random();
        self.next_with(unit)
    }

    /// Back to the first pause.
    pub fn reset(&mut self) {
        self.nominal = RETRY_FIRST;
    }
}

/// Why the link broke, for the owner.
#[derive(Debug)]
pub(super) struct Loss {
    /// In fixed words.
    pub reason: LossReason,
    /// The engine's own words, for the log only.
    pub detail: String,
}

impl Loss {
    fn of(e: &EngineError, stream: bool) -> Self {
        let reason = match e {
            EngineError::Unavailable(_) => LossReason::Unreachable,
            _ if stream => LossReason::StreamFailed,
            _ => LossReason::Unreachable,
        };
        Self {
            reason,
            detail: e.to_string(),
        }
    }

    fn ended() -> Self {
        Self {
            reason: LossReason::StreamEnded,
            detail: "the event stream ended".into(),
        }
    }
}

/// A reconciliation after the engine's return: the desktops not yet
/// observed afresh.
#[derive(Debug)]
pub(super) struct Reconciling {
    started: Instant,
    pending: HashSet<Uuid>,
}

/// The words every desktop's status carries while the engine is lost.
fn unknown_while_lost(since: chrono::DateTime<Utc>, reason: LossReason) -> String {
    format!(
        "unavailable since {} ({reason}); the desktop's state is unknown until the engine answers",
        since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

/// Refuses a call that needs the engine's truth about a desktop whose
/// state is unknown.
pub(super) fn require_known(engine: &Observed) -> Result<(), BrokerError> {
    match engine {
        Observed::Unknown(why) => Err(BrokerError::Engine(EngineError::Unavailable(why.clone()))),
        _ => Ok(()),
    }
}

impl Owner {
    /// [`require_known`] for computer `id`; a refusal also asks the engine
    /// afresh, so a call made just after its return is not refused for long.
    pub(super) fn require_known(&mut self, id: Uuid) -> Result<(), BrokerError> {
        let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
        let known = require_known(&c.engine);
        if known.is_err() {
            self.refresh(id);
        }
        known
    }

    /// Follows the backend's changes; when the backend is lost, asks it
    /// again on a [`Backoff`] until it answers, then resubscribes.
    pub(super) fn watch_backend(&mut self) {
        let backend = self.ctx.backend.clone();
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let mut backoff = Backoff::default();
            let mut first = true;
            loop {
                if !first {
                    match backend.inventory().await {
                        Ok(listed) => {
                            if tx.send(Internal::BackendUp(listed)).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let loss = Loss::of(&e, false);
                            if tx.send(Internal::BackendDown(loss)).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(backoff.pause()).await;
                            continue;
                        }
                    }
                }
                first = false;
                let subscribed = Instant::now();
                let mut changes = backend.changes();
                let loss = loop {
                    match changes.next().await {
                        Some(Ok(change)) => {
                            if tx.send(Internal::Changed(change)).await.is_err() {
                                return;
                            }
                        }
                        Some(Err(e)) => break Loss::of(&e, true),
                        None => break Loss::ended(),
                    }
                };
                if subscribed.elapsed() >= STREAM_LIVED {
                    backoff.reset();
                }
                if tx.send(Internal::BackendDown(loss)).await.is_err() {
                    return;
                }
                tokio::time::sleep(backoff.pause()).await;
            }
        });
    }

    /// The engine cannot be asked: every desktop's state becomes unknown
    /// (said once, with since when), and each is asked anyway, in case only
    /// the stream broke.
    pub(super) fn on_backend_down(&mut self, loss: Loss) {
        self.reconciling = None;
        if self.engine_lost.is_some() {
            tracing::debug!(error = %loss.detail, "the container engine still does not answer");
            return;
        }
        let since = Utc::now();
        tracing::warn!(error = %loss.detail, reason = %loss.reason, "lost the container engine; desktops show `unknown` until it answers");
        self.engine_lost = Some((Instant::now(), since, loss.reason));
        self.metrics.engine_lost();
        self.availability.update(|a| {
            a.lost = Some((since, loss.reason));
            a.losses += 1;
        });
        let why = unknown_while_lost(since, loss.reason);
        for (id, c) in &mut self.computers {
            // Whatever happens to it now happens unwatched (a host or
            // engine going down): see `--resume-after-restart`.
            c.engine_gap = true;
            // An operation observes the container itself and says so.
            if c.op.is_none() {
                c.engine = Observed::Unknown(why.clone());
                self.dirty.insert(*id);
            }
        }
        self.refresh_all();
    }

    /// The engine answers again: every desktop is observed afresh (the
    /// reconciliation), the orphans listed anew.
    pub(super) fn on_backend_up(&mut self, listed: Vec<Listed>) {
        self.update_orphans(listed);
        let Some((lost_at, _, _)) = self.engine_lost.take() else {
            return;
        };
        let away = lost_at.elapsed();
        let desktops = self.computers.len();
        tracing::info!(
            away_ms = u64::try_from(away.as_millis()).unwrap_or(u64::MAX),
            desktops,
            "container engine reachable again; reconciling every desktop"
        );
        self.metrics.engine_back();
        self.availability.update(|a| {
            a.lost = None;
            a.last_return = Some(Return {
                at: Utc::now(),
                away,
                desktops,
                reconciled_in: None,
            });
        });
        self.reconciling = Some(Reconciling {
            started: Instant::now(),
            pending: self.computers.keys().copied().collect(),
        });
        self.refresh_all();
        // The periodic resync follows from here, not from before the loss.
        self.next_resync = Instant::now() + self.config().resync_interval;
        self.reconciled(None);
    }

    /// A refresh of `id` was applied (or `id` is gone): once every desktop
    /// has been observed since the engine returned, the reconciliation is
    /// over.
    pub(super) fn reconciled(&mut self, id: Option<Uuid>) {
        let Some(r) = self.reconciling.as_mut() else {
            return;
        };
        if let Some(id) = id {
            let known = self
                .computers
                .get(&id)
                .is_none_or(|c| !matches!(c.engine, Observed::Unknown(_)));
            if !known {
                return;
            }
            r.pending.remove(&id);
            if let Some(c) = self.computers.get_mut(&id) {
                // A failure only the engine's absence caused is over.
                let unreachable =
                    BrokerError::Engine(EngineError::Unavailable(String::new())).to_string();
                if c.op_problem.as_deref() == Some(unreachable.as_str()) {
                    c.op_problem = None;
                    self.dirty.insert(id);
                }
            }
        }
        let Some(r) = self.reconciling.as_mut() else {
            return;
        };
        r.pending.retain(|id| self.computers.contains_key(id));
        if !r.pending.is_empty() {
            return;
        }
        let took = r.started.elapsed();
        self.reconciling = None;
        tracing::info!(
            ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            desktops = self.computers.len(),
            "every desktop reconciled after the engine's return"
        );
        self.availability.update(|a| {
            if let Some(back) = a.last_return.as_mut() {
                back.reconciled_in = Some(took);
            }
        });
    }

    /// While the engine is lost, an observation that failed says so in the
    /// same words for every desktop.
    pub(super) fn while_lost(&self, view: Observed) -> Observed {
        match (&view, self.engine_lost) {
            (Observed::Unknown(_), Some((_, since, reason))) => {
                Observed::Unknown(unknown_while_lost(since, reason))
            }
            _ => view,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_100_ms_to_5_s_within_its_jitter() {
        let mut b = Backoff::default();
        let nominal: Vec<Duration> = (0..10).map(|_| b.next_with(0.5)).collect();
        let ms: Vec<u128> = nominal.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_with(0.5), RETRY_FIRST);
        let mut low = Backoff::default();
        let mut high = Backoff::default();
        for _ in 0..10 {
            let (l, h) = (low.next_with(0.0), high.next_with(0.999_999));
            assert!(l < h, "{l:?} {h:?}");
            assert!(h <= RETRY_MAX.mul_f64(1.0 + RETRY_JITTER));
            assert!(l >= RETRY_FIRST.mul_f64(1.0 - RETRY_JITTER));
        }
        assert_eq!(Backoff::default().next_with(0.0), Duration::from_millis(80));
        // Drawn at random: always within the bounds.
        let mut r = Backoff::default();
        for _ in 0..50 {
            let p = r.pause();
            assert!(p >= Duration::from_millis(80) && p <= Duration::from_millis(6000));
        }
    }
}
