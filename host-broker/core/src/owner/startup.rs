//! Start-up and reconciliation: loading the records against what the
//! backend says, following the backend's changes, refreshing one computer's
//! view, settling unconfirmed stop intents, and the orphans (desktops marked
//! as ours without a record, reported and never removed).
//!
//! The backend's change stream is one witness of its state, never the only
//! one: it is probed once at start-up ([`Owner::probe_changes`]), the guest
//! channel is a second witness ([`super::follow`]), and every
//! `resync_interval` each desktop believed running is observed afresh
//! ([`Owner::resync`]); a belief the engine contradicts is corrected, logged
//! and counted (`dormouse_state_divergence_total`).

use std::collections::HashSet;

use tokio::time::Instant;
use uuid::Uuid;

use super::computer::Computer;
use super::{arm_idle, disarm_idle, stop_follower, Internal, Owner};
use crate::engine::Observed;
use crate::engine::{Change, ChangeProbe, Listed};
use crate::error::BrokerError;
use crate::idle::IdleTimer;
use crate::lifecycle::stop_key;
use crate::reconcile::{self, IntentAction, Orphan};
use crate::store::intent::{self, Intent};
use crate::store::{remove_tree, ComputerRecord};
use dormouse_protocol::activity::{Actor, Happened};

impl Owner {
    pub(super) async fn start_up(&mut self, records: Vec<ComputerRecord>) {
        // Imports cut short by a crash are settled first (on the blocking
        // pool: a staging tree may be large).
        // So are creates and removes cut short before or after their
        // record ([`intent`]).
        let paths = self.ctx.paths.clone();
        let recovered = tokio::task::spawn_blocking(move || {
            let temps = crate::store::remove_stale_temps(&paths);
            if temps > 0 {
                tracing::warn!(temps, "removed the temp files of writes cut short");
            }
            let settled = intent::settle_without_record(&paths);
            super::workspace::recover_all(&paths);
            settled
        })
        .await;
        match recovered {
            Ok(settled) => {
                for (id, intent) in settled {
                    tracing::warn!(computer = %id, ?intent, "settled an operation cut short before its record existed or after it was deleted");
                }
            }
            Err(e) => tracing::error!(error = %e, "workspace recovery did not finish"),
        }
        for record in &records {
            // An adoption cut short by a crash is finished before anything
            // else can ask for that workspace.
            match self.store.finish_adoption(record) {
                Ok(true) => {
                    tracing::warn!(computer = %record.id, from = ?record.workspace_from, "finished adopting a workspace after a crash");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(computer = %record.id, error = %e, "cannot finish adopting a workspace");
                }
            }
        }
        let backend = self.ctx.backend.clone();
        let views = futures_util::future::join_all(
            records
                .iter()
                .map(|r| reconcile::observe(backend.as_ref(), r)),
        )
        .await;
        let now = Instant::now();
        for (record, (view, image_present)) in records.into_iter().zip(views) {
            let id = record.id;
            let settled = self.settle_intent(&record, &view).await;
            if settled == Settled::Gone {
                self.activity.remove(id);
                continue;
            }
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
            if settled == Settled::Start {
                // A create cut short between the engine's create and start:
                // it is made whole, started as it would have been. Nobody
                // waits for the answer.
                let (reply, _) = tokio::sync::oneshot::channel();
                self.launch_start(id, reply);
            }
            // Once per computer and broker start: a limit set by an earlier
            // broker holds on disk, but the status must say so again (and
            // flags may have changed).
            self.apply_workspace_limit(id);
        }
        let known: HashSet<Uuid> = self.computers.keys().copied().collect();
        match reconcile::find_orphans(backend.as_ref(), &known).await {
            Ok(orphans) => self.orphans = orphans,
            Err(e) => tracing::warn!(error = %e, "cannot list containers to look for orphans"),
        }
    }

    /// Settles the create or remove of `record` that a crash cut short
    /// ([`intent`]). With the engine unknown nothing is decided: the next
    /// start-up settles it.
    async fn settle_intent(&mut self, record: &ComputerRecord, view: &Observed) -> Settled {
        let id = record.id;
        let paths = self.ctx.paths.clone();
        let left = match intent::load(&paths, id) {
            Ok(Some(left)) => left,
            Ok(None) => return Settled::Keep,
            Err(e) => {
                tracing::error!(computer = %id, error = %e, "unreadable intent; ignoring it");
                return Settled::Keep;
            }
        };
        match (left, view) {
            (_, Observed::Unknown(_)) => Settled::Keep,
            (Intent::Create, Observed::Missing) => {
                match intent::undo_create(&paths, id, record.workspace_from) {
                    Ok(()) => {
                        tracing::warn!(computer = %id, adopted = ?record.workspace_from, "undid a create cut short before its desktop was made");
                        Settled::Gone
                    }
                    Err(e) => {
                        tracing::error!(computer = %id, error = %e, "cannot undo a create cut short");
                        Settled::Keep
                    }
                }
            }
            (Intent::Create, Observed::Present(info)) => {
                tracing::warn!(computer = %id, state = %info.state, "a create cut short after its desktop was made: kept");
                if let Err(e) = intent::clear(&paths, id) {
                    tracing::error!(computer = %id, error = %e, "cannot clear a create's intent");
                }
                if info.state.is_up() {
                    Settled::Keep
                } else {
                    Settled::Start
                }
            }
            (Intent::Remove { purge }, view) => {
                match self.finish_remove_cut_short(id, purge, view.is_up()).await {
                    Ok(()) => {
                        tracing::warn!(computer = %id, purge, "finished a remove cut short");
                        Settled::Gone
                    }
                    Err(e) => {
                        tracing::error!(computer = %id, error = %e.detail(), "cannot finish a remove cut short; it stays to be removed again");
                        Settled::Keep
                    }
                }
            }
        }
    }

    /// The rest of a remove cut short: the desktop stopped (by the engine,
    /// within the stop timeout) and destroyed, the workspace purged if
    /// asked, the record, run directory and stop reason deleted.
    async fn finish_remove_cut_short(
        &mut self,
        id: Uuid,
        purge: bool,
        up: bool,
    ) -> Result<(), BrokerError> {
        let backend = self.ctx.backend.clone();
        if up {
            if let Err(e) = backend.suspend(id, self.ctx.config.stop_timeout).await {
                tracing::warn!(computer = %id, error = %e, "stopping before the removal failed; destroying anyway");
            }
        }
        backend.destroy(id).await?;
        if purge {
            remove_tree("purge workspace", &backend.workspace(id))?;
        }
        self.store.delete(id, purge)?;
        self.ctx.stops.clear(&stop_key(id))?;
        Ok(())
    }

    /// Checks once, off the owner task, that the backend's change stream
    /// delivers; only logs and sets `dormouse_engine_events_verified`.
    pub(super) fn probe_changes(&mut self) {
        let backend = self.ctx.backend.clone();
        let image = self.config().image.clone();
        let metrics = self.metrics.clone();
        self.tasks.spawn(async move {
            match backend.probe_changes(&image).await {
                ChangeProbe::Delivered(after) => {
                    metrics.events_verified(true);
                    tracing::info!(ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX), "the engine's event stream delivers (a probe container's end arrived)");
                }
                ChangeProbe::Silent(waited) => {
                    metrics.events_verified(false);
                    tracing::error!(waited = ?waited, "the engine's event stream did not deliver a probe container's end: the broker learns of stops from the guest channel and the periodic resync only");
                }
                ChangeProbe::NotChecked(why) => {
                    metrics.events_verified(false);
                    tracing::warn!(reason = %why, "could not check the engine's event stream with a probe container");
                }
            }
        });
    }

    /// Observes afresh every desktop believed running, booting or of an
    /// unknown state (none with an operation in flight: that observes by
    /// itself), so whatever the events missed is corrected.
    pub(super) fn resync(&mut self) {
        let now = Instant::now();
        let ids: Vec<(Uuid, super::ContainerState)> = self
            .computers
            .iter()
            .filter(|(_, c)| {
                c.op.is_none()
                    && (c.engine.is_up()
                        || c.ready_wait.is_some()
                        || matches!(c.engine, Observed::Unknown(_)))
            })
            .map(|(id, c)| (*id, c.container_state()))
            .collect();
        for (id, believed) in ids {
            self.resyncing.insert(id, (believed, now));
            self.refresh(id);
        }
    }

    /// After a resync's observation was applied: a belief the engine
    /// contradicted, with no engine event in between, is a divergence.
    fn after_resync(&mut self, id: Uuid) {
        let Some((believed, since)) = self.resyncing.remove(&id) else {
            return;
        };
        let Some(c) = self.computers.get(&id) else {
            return;
        };
        let now = c.container_state();
        let told = self.last_change.get(&id).is_some_and(|t| *t >= since);
        if believed == super::ContainerState::Unknown
            || now == super::ContainerState::Unknown
            || now == believed
            || told
            || c.op.is_some()
        {
            return;
        }
        self.metrics.divergence();
        tracing::warn!(computer = %id, believed = ?believed, engine = ?now, "the engine's state differed from the broker's; corrected by the resync");
    }

    pub(super) fn refresh_all(&mut self) {
        let ids: Vec<Uuid> = self.computers.keys().copied().collect();
        for id in ids {
            self.refresh(id);
        }
    }

    /// Asks the backend about one computer (coalesced: one at a time).
    pub(super) fn refresh(&mut self, id: Uuid) {
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
        let backend = self.ctx.backend.clone();
        let tx = self.internal.clone();
        self.tasks.spawn(async move {
            let (view, image_present) = reconcile::observe(backend.as_ref(), &record).await;
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

    pub(super) fn on_refreshed(
        &mut self,
        id: Uuid,
        epoch: u64,
        view: Observed,
        image_present: Option<bool>,
    ) {
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        c.refresh.in_flight = false;
        let mut again = std::mem::take(&mut c.refresh.again);
        if epoch == c.refresh.epoch {
            let view = self.while_lost(view);
            self.apply_view(id, view, image_present);
            self.witnessed(id);
            self.after_resync(id);
            self.reconciled(Some(id));
        } else {
            // Older than an operation's own view: ask again instead.
            again = true;
        }
        if again {
            self.refresh(id);
        }
    }

    /// Applies what the backend says. With no operation in flight, a desktop
    /// that came up arms the idle timer and gets a guest follower; one that
    /// went down disarms and drops them; an unconfirmed stop is settled.
    pub(super) fn apply_view(&mut self, id: Uuid, view: Observed, image_present: Option<bool>) {
        let now = Instant::now();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        self.dirty.insert(id);
        let was_up = c.last_up;
        let known = !matches!(view, Observed::Unknown(_));
        let now_up = view.is_up();
        c.engine = view;
        let changed = c.engine_seen;
        let mut gap = false;
        if known {
            c.image_present = image_present;
            c.last_up = now_up;
            c.engine_seen = true;
            gap = std::mem::take(&mut c.engine_gap);
        } else {
            // The engine cannot say: whatever happens now happens unwatched.
            c.engine_gap = true;
        }
        if c.op.is_some() || !known {
            return;
        }
        self.watched_run(id, now_up, was_up && !now_up, gap);
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if was_up && !now_up {
            tracing::info!(computer = %id, "container went down");
            if changed {
                let oom = c.engine.info().is_some_and(|d| d.oom_killed);
                let reason = if oom { "oom" } else { "killed" }.to_owned();
                self.activity
                    .record(id, Actor::Broker, &Happened::Stopped { reason });
            }
            disarm_idle(c);
            stop_follower(c);
            c.ready_wait = None;
        }
        let start_follower = !was_up && now_up;
        if start_follower {
            tracing::info!(computer = %id, "container is up");
            if changed {
                self.activity.record(id, Actor::Broker, &Happened::Started);
            }
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
                self.launch_stop(id, intent.reason, None);
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

    pub(super) fn on_change(&mut self, change: Change) {
        match change.computer {
            Some(id) if self.computers.contains_key(&id) => {
                if change.ended {
                    self.last_change.insert(id, Instant::now());
                }
                self.refresh(id);
            }
            _ => {
                let name = &change.listed.name;
                if change.gone {
                    self.orphans.retain(|o| &o.container != name);
                } else if !self.orphans.iter().any(|o| &o.container == name) {
                    // A desktop marked as ours appeared without a record.
                    tracing::warn!(container = %name, computer = %change.listed.computer, "container labelled as a Dormouse computer has no record here; leaving it alone");
                    self.orphans.push(orphan(change.listed));
                }
            }
        }
    }

    pub(super) fn update_orphans(&mut self, listed: Vec<Listed>) {
        self.orphans = listed
            .into_iter()
            .filter(|l| {
                !Uuid::parse_str(&l.computer).is_ok_and(|id| self.computers.contains_key(&id))
            })
            .map(orphan)
            .collect();
    }
}

fn orphan(listed: Listed) -> Orphan {
    Orphan {
        container: listed.name,
        computer: listed.computer,
        owner: listed.owner,
        state: listed.state,
    }
}

/// What settling a computer's intent left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// The computer stays as it is.
    Keep,
    /// It stays, and its desktop, made but never started, is started.
    Start,
    /// The computer is gone (a create undone, a remove finished).
    Gone,
}

fn computer_state_of(view: &Observed) -> String {
    match view {
        Observed::Unknown(why) => format!("unknown ({why})"),
        Observed::Missing => "missing".into(),
        Observed::Present(info) => info.state.to_string(),
    }
}
