//! The API's commands, one handler each, all of one signature:
//! `fn(&mut Owner, input, Reply<T>) -> Answer<T>`. A handler either answers
//! at once ([`Answer::Now`], sent by [`Owner::on_command`]) or has handed the
//! reply to whatever answers later — an operation, a waiting lease takeover,
//! a guest request ([`Answer::Later`]). Refusals change nothing.

use std::time::Duration;

use chrono::Utc;
use dormouse_protocol::api::{
    ComputerStatus, CreateComputer, LeaseGrant, LeaseRequest, PatchComputer, StopReason,
};
use tokio::time::Instant;
use uuid::Uuid;

use super::admission::check_fence;
use super::computer::{Computer, PendingTakeover};
use super::ops::OpKind;
use super::{disarm_idle, stop_follower, takeover_grace, Internal, Owner};
use crate::activity::actor_of;
use crate::command::{Command, Fence, Reply};
use crate::engine::Image;
use crate::engine::Observed;
use crate::error::BrokerError;
use crate::faults;
use crate::idle::{IdleTimer, MAX_WINDOW, MIN_WINDOW};
use crate::lifecycle::create;
use crate::reconcile::Orphan;
use crate::store::intent::{self, Intent};
use crate::store::{computer::RECORD_SCHEMA, lease, ComputerRecord, Lease};
use dormouse_protocol::activity::{Actor, Happened};

/// What a command handler did with its reply.
#[must_use]
pub(super) enum Answer<T> {
    /// Answer this now.
    Now(Reply<T>, Result<T, BrokerError>),
    /// The reply was handed on; someone answers later.
    Later,
}

impl<T> Answer<T> {
    pub(super) fn send(self) {
        if let Self::Now(reply, result) = self {
            let _ = reply.send(result);
        }
    }
}

/// Fencing generation and the command's own input.
pub(super) type Fenced<T> = (Uuid, Fence, T);

impl Owner {
    pub(super) fn on_command(&mut self, command: Command) {
        match command {
            Command::Create(request, reply) => self.create(request, reply).send(),
            Command::List(reply) => self.list((), reply).send(),
            Command::Get(id, reply) => self.get(id, reply).send(),
            Command::Start(id, fence, reply) => self.start((id, fence, ()), reply).send(),
            Command::Stop(id, fence, reply) => self.stop((id, fence, ()), reply).send(),
            Command::Remove {
                id,
                purge,
                fence,
                reply,
            } => self.remove((id, fence, purge), reply).send(),
            Command::Touch(id, fence, reply) => self.touch((id, fence, ()), reply).send(),
            Command::Patch(id, patch, fence, reply) => self.patch((id, fence, patch), reply).send(),
            Command::Lease(id, request, reply) => self.lease((id, request), reply).send(),
            Command::Orphans(reply) => self.orphans((), reply).send(),
            Command::AdmitGuest(id, fence, purpose, reply) => {
                self.admit_guest((id, fence, purpose), reply).send();
            }
            Command::Workspace(id, access, reply) => self.workspace((id, access), reply).send(),
            Command::Disk(id, reply) => self.disk(id, reply).send(),
            Command::Import(id, fence, body, reply) => self.import((id, fence, body), reply).send(),
            Command::ImportSlot(request, reply) => self.import_slot(request, reply).send(),
            Command::ReleaseLease(id, fence, reply) => {
                self.release_lease((id, fence, ()), reply).send()
            }
            Command::Egress(id, set, fence, reply) => self.egress((id, fence, set), reply).send(),
            Command::EgressActivity(id, reply) => self.egress_activity(id, reply).send(),
            Command::LastScreen(id, reply) => self.last_screen(id, reply).send(),
        }
    }

    fn list(&mut self, (): (), reply: Reply<Vec<ComputerStatus>>) -> Answer<Vec<ComputerStatus>> {
        let mut all: Vec<&Computer> = self.computers.values().collect();
        all.sort_by_key(|c| (c.record.created_at, c.record.id));
        let statuses = all.into_iter().map(|c| self.status_of(c)).collect();
        Answer::Now(reply, Ok(statuses))
    }

    fn get(&mut self, id: Uuid, reply: Reply<ComputerStatus>) -> Answer<ComputerStatus> {
        Answer::Now(reply, self.status(id))
    }

    fn orphans(&mut self, (): (), reply: Reply<Vec<Orphan>>) -> Answer<Vec<Orphan>> {
        Answer::Now(reply, Ok(self.orphans.clone()))
    }

    /// The checks every mutating call on a computer passes first: it exists,
    /// is not being removed or taken over, and the caller's generation fences.
    pub(super) fn admit(&mut self, id: Uuid, fence: Fence) -> Result<&mut Computer, BrokerError> {
        let c = self
            .computers
            .get_mut(&id)
            .ok_or(BrokerError::NotFound(id))?;
        check_fence(&self.metrics, c, fence)?;
        if matches!(c.op.as_ref().map(|o| o.kind()), Some(OpKind::Remove { .. })) {
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

    /// [`Owner::admit`], and no operation in flight.
    pub(super) fn admit_idle_op(
        &mut self,
        id: Uuid,
        fence: Fence,
    ) -> Result<&mut Computer, BrokerError> {
        let c = self.admit(id, fence)?;
        if let Some(op) = &c.op {
            return Err(BrokerError::WrongState(format!(
                "{} is in progress",
                op.kind().describe()
            )));
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
                        c.op.as_ref().map(|o| o.kind()),
                        Some(OpKind::Create | OpKind::Start)
                    )
            })
            .count();
        u32::try_from(running).unwrap_or(u32::MAX) + self.pending_creates
    }

    fn create(
        &mut self,
        request: CreateComputer,
        reply: Reply<ComputerStatus>,
    ) -> Answer<ComputerStatus> {
        if let Err(e) = self.admit_create(&request) {
            return Answer::Now(reply, Err(e));
        }
        let _op = faults::scope(faults::op::CREATE);
        faults::step("create: admitted");
        self.pending_creates += 1;
        if let Some(from) = request.workspace_from {
            self.adopting.insert(from);
        }
        let backend = self.ctx.backend.clone();
        let image = self.config().image.clone();
        let tx = self.internal.clone();
        self.tasks
            .spawn(faults::within(faults::op::CREATE, async move {
                let result = create::resolve_image(backend.as_ref(), &image).await;
                faults::step("create: image resolved");
                let _ = tx
                    .send(Internal::Resolved {
                        request,
                        result,
                        reply,
                    })
                    .await;
            }));
        Answer::Later
    }

    pub(super) fn admit_create(&self, request: &CreateComputer) -> Result<(), BrokerError> {
        create::validate(request, Uuid::nil())?;
        if let Some(from) = request.workspace_from {
            if self.computers.contains_key(&from) {
                return Err(BrokerError::WrongState(format!(
                    "computer {from} still exists; remove it (without purge) first"
                )));
            } else if self.adopting.contains(&from) {
                return Err(BrokerError::WrongState(format!(
                    "the workspace of {from} is being adopted already"
                )));
            } else if !self.ctx.backend.workspace(from).is_dir() {
                return Err(BrokerError::BadRequest(format!(
                    "no kept workspace of computer {from}"
                )));
            }
        }
        let running = self.running_count();
        let max = self.config().max_instances;
        if running >= max {
            return Err(BrokerError::Capacity { running, max });
        }
        Ok(())
    }

    /// The image of a create is resolved: persist, then provision.
    pub(super) fn on_resolved(
        &mut self,
        request: CreateComputer,
        result: Result<Image, BrokerError>,
        reply: Reply<ComputerStatus>,
    ) {
        self.pending_creates = self.pending_creates.saturating_sub(1);
        if let Some(from) = request.workspace_from {
            self.adopting.remove(&from);
        }
        let _op = faults::scope(faults::op::CREATE);
        match result.and_then(|image| self.persist_new(&request, image)) {
            Ok(record) => {
                let id = record.id;
                tracing::info!(computer = %id, owner = %record.owner, image = %record.image_id, adopted = ?request.workspace_from, "creating");
                let window = self.window_of(&record);
                let mut computer = Computer::new(record, IdleTimer::new(window, Instant::now()));
                computer.engine = Observed::Missing;
                computer.engine_seen = true;
                computer.image_present = Some(true);
                self.computers.insert(id, computer);
                self.activity.add(id);
                self.launch_create(id, reply);
                self.op_by(id, Actor::Api);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Directories, then the record (naming the workspace it adopts), then
    /// the adopted workspace, and only then the desktop: a crash leaves at
    /// worst a record whose desktop is missing, and an adoption the next
    /// start-up finishes.
    fn persist_new(
        &mut self,
        request: &CreateComputer,
        image: Image,
    ) -> Result<ComputerRecord, BrokerError> {
        let id = Uuid::new_v4();
        let naming = create::validate(request, id)?;
        let paths = self.ctx.paths.clone();
        let spec = self.ctx.backend.spec(id, &naming.owner, &image);
        let record = ComputerRecord {
            schema: RECORD_SCHEMA,
            id,
            name: naming.name,
            owner: naming.owner,
            image_id: image.id,
            generation: 0,
            lease: None,
            workspace: self.ctx.backend.workspace(id),
            idle_timeout_ms: None,
            created_at: Utc::now(),
            spec,
            workspace_from: request.workspace_from,
            egress: Some(self.create_egress(request)?),
            // Created to run: wanted running before the engine is asked.
            wanted_running_since: Some(Utc::now()),
        };
        let fresh = request
            .workspace_from
            .is_none()
            .then_some(record.workspace.as_path());
        // Before anything of it exists: a crash from here on is settled at
        // start-up (undone unless its desktop was made).
        intent::save(&paths, id, Intent::Create)?;
        faults::step("create: intent saved");
        create::prepare_dirs(&paths, id, fresh)?;
        faults::step("create: directories made");
        self.store.save(&record)?;
        faults::step("create: record saved");
        self.publish_egress(&record);
        if let Some(from) = request.workspace_from {
            if let Err(e) = create::adopt(&paths, id, &self.ctx.backend.workspace(from)) {
                // Nothing moved: take the record back so no computer names a
                // workspace it does not have.
                if let Err(undo) = self.store.delete(id, false) {
                    tracing::error!(computer = %id, error = %undo, "cannot take back the record of a failed adoption");
                }
                return Err(e.into());
            }
            faults::step("create: workspace adopted");
        }
        Ok(record)
    }

    pub(super) fn start(
        &mut self,
        (id, fence, ()): Fenced<()>,
        reply: Reply<ComputerStatus>,
    ) -> Answer<ComputerStatus> {
        let c = match self.admit_idle_op(id, fence) {
            Ok(c) => c,
            Err(e) => return Answer::Now(reply, Err(e)),
        };
        // A desktop believed running may have stopped unseen (an event the
        // engine never sent): the start observes first and is refused only
        // if the engine says it runs; otherwise it is a resume.
        if !c.engine.is_up() {
            stop_follower(c);
        }
        let actor = actor_of(c.record.lease.as_ref(), fence);
        self.launch_start(id, reply);
        self.op_by(id, actor);
        Answer::Later
    }

    fn stop(
        &mut self,
        (id, fence, ()): Fenced<()>,
        reply: Reply<ComputerStatus>,
    ) -> Answer<ComputerStatus> {
        if let Err(e) = self.admit_idle_op(id, fence).map(drop) {
            return Answer::Now(reply, Err(e));
        }
        // No intent is written for a desktop the engine cannot say runs.
        if let Err(e) = self.require_known(id) {
            return Answer::Now(reply, Err(e));
        }
        let Some(c) = self.computers.get_mut(&id) else {
            return Answer::Now(reply, Err(BrokerError::NotFound(id)));
        };
        let down = match &c.engine {
            Observed::Missing => true,
            Observed::Present(info) => !info.state.is_up(),
            Observed::Unknown(_) => false,
        };
        if down {
            let e = BrokerError::WrongState("the desktop is not running".into());
            return Answer::Now(reply, Err(e));
        }
        // A manual stop cancels the idle timer.
        disarm_idle(c);
        c.ready_wait = None;
        let actor = actor_of(c.record.lease.as_ref(), fence);
        self.launch_stop(id, StopReason::Manual, Some(reply));
        self.op_by(id, actor);
        Answer::Later
    }

    fn remove(&mut self, (id, fence, purge): Fenced<bool>, reply: Reply<()>) -> Answer<()> {
        if let Err(e) = self
            .admit_idle_op(id, fence)
            .map(drop)
            .and_then(|()| self.require_known(id))
        {
            return Answer::Now(reply, Err(e));
        }
        // Before anything is stopped or destroyed: a crash from here on is
        // finished at start-up.
        let saved = {
            let _op = faults::scope(faults::op::REMOVE);
            intent::save(&self.ctx.paths, id, Intent::Remove { purge })
        };
        if let Err(e) = saved {
            return Answer::Now(reply, Err(e.into()));
        }
        let Some(c) = self.computers.get_mut(&id) else {
            return Answer::Now(reply, Err(BrokerError::NotFound(id)));
        };
        disarm_idle(c);
        c.ready_wait = None;
        self.launch_remove(id, purge, reply);
        Answer::Later
    }

    fn touch(
        &mut self,
        (id, fence, ()): Fenced<()>,
        reply: Reply<ComputerStatus>,
    ) -> Answer<ComputerStatus> {
        let result = self.admit(id, fence).map(|c| c.idle.renew(Instant::now()));
        if result.is_ok() {
            self.dirty.insert(id);
        }
        Answer::Now(reply, result.and_then(|()| self.status(id)))
    }

    fn patch(
        &mut self,
        (id, fence, patch): Fenced<PatchComputer>,
        reply: Reply<ComputerStatus>,
    ) -> Answer<ComputerStatus> {
        let result = self.apply_patch(id, fence, patch);
        Answer::Now(reply, result)
    }

    fn apply_patch(
        &mut self,
        id: Uuid,
        fence: Fence,
        patch: PatchComputer,
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

    fn lease(
        &mut self,
        (id, request): (Uuid, LeaseRequest),
        reply: Reply<LeaseGrant>,
    ) -> Answer<LeaseGrant> {
        if let Err(e) = lease::validate_request(&request.holder, request.ttl_ms) {
            return Answer::Now(reply, Err(e));
        }
        let grace = takeover_grace(self.config());
        let Some(c) = self.computers.get_mut(&id) else {
            return Answer::Now(reply, Err(BrokerError::NotFound(id)));
        };
        if matches!(c.op.as_ref().map(|o| o.kind()), Some(OpKind::Remove { .. })) {
            let e = BrokerError::WrongState("the computer is being removed".into());
            return Answer::Now(reply, Err(e));
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
            return Answer::Later;
        }
        let result = self.decide_lease(id, &request);
        Answer::Now(reply, result)
    }

    /// Decides and (when granted) persists a lease, before answering.
    pub(super) fn decide_lease(
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
        let decision = lease::decide(record.lease.as_ref(), &request.holder, now);
        let _op = (decision == lease::LeaseDecision::TakeOver)
            .then(|| faults::scope(faults::op::LEASE_TAKEOVER));
        faults::step("lease: decided");
        match &decision {
            lease::LeaseDecision::Refuse { holder, expires_at } => {
                return Err(BrokerError::LeaseHeld {
                    holder: holder.clone(),
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
        let previous = c.record.lease.as_ref().map(|l| l.holder.clone());
        self.store.save(&record)?;
        faults::step("lease: persisted");
        c.record = record;
        self.dirty.insert(id);
        if decision == lease::LeaseDecision::TakeOver {
            // A renewal is not recorded (holders renew often); a new holder is.
            let (holder, generation) = (granted.holder.clone(), granted.generation);
            let what = match previous {
                Some(before) if before != holder => Happened::LeaseTakenOver { holder, generation },
                _ => Happened::LeaseAcquired { holder, generation },
            };
            self.record(id, Actor::Lease(granted.holder.clone()), &what);
            faults::step("lease: activity recorded");
        }
        Ok(LeaseGrant {
            generation: granted.generation,
            holder: granted.holder,
            expires_at: granted.expires_at,
        })
    }
}
