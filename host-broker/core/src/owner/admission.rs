//! The owner's one admission of guest calls ([`crate::relay`]), and the one
//! fence check every fenced call of the API passes.
//!
//! For each [`Purpose`] it decides, on the task that decides leases (so no
//! generation change can slip in between), whether the call may be made
//! now, renews the idle timer where the call is use, and hands back a
//! [`Ticket`]: the guest channel the backend names and the generation the
//! call was admitted under, with the revocation that fires when that
//! generation is fenced off ([`super::revocation`]). It never makes the
//! call: the caller's own task does, so a long call never blocks this task.

use chrono::Utc;
use dormouse_protocol::screen::ScreenMode;
use tokio::time::Instant;
use uuid::Uuid;

use super::commands::{Answer, Fenced};
use super::computer::Computer;
use super::engine_link::require_known;
use super::Owner;
use crate::activity::actor_of;
use crate::command::{Fence, Reply};
use crate::error::BrokerError;
use crate::metrics::Metrics;
use crate::relay::{Purpose, Ticket};
use crate::store::lease;

/// The fence of computer `c` against the caller's generation (a stale one,
/// or none under a live lease, is refused and counted): the one fence check
/// of every fenced call.
pub(super) fn check_fence(
    metrics: &Metrics,
    c: &Computer,
    fence: Fence,
) -> Result<(), BrokerError> {
    let checked = lease::check_fence(
        c.record.lease.as_ref(),
        c.record.generation,
        fence,
        Utc::now(),
    );
    if checked.is_err() {
        metrics.fencing_rejection();
    }
    checked
}

impl Owner {
    pub(super) fn admit_guest(
        &mut self,
        (id, fence, purpose): Fenced<Purpose>,
        reply: Reply<Ticket>,
    ) -> Answer<Ticket> {
        Answer::Now(reply, self.decide_guest(id, fence, purpose))
    }

    /// The checks of one purpose, then the ticket.
    pub(super) fn decide_guest(
        &mut self,
        id: Uuid,
        fence: Fence,
        purpose: Purpose,
    ) -> Result<Ticket, BrokerError> {
        match purpose {
            Purpose::Actions { busy_for } => {
                let c = self.admit(id, fence)?;
                require_known(&c.engine)?;
                if !c.is_ready() {
                    return Err(BrokerError::WrongState("the desktop is not ready".into()));
                }
                // The call is activity, and so is the time its own waits
                // take: the quiet window begins after them at the earliest.
                // The input it injects counts as the guest's input on top.
                c.idle.renew(Instant::now() + busy_for);
                self.dirty.insert(id);
            }
            Purpose::Exec => {
                let c = self.admit(id, fence)?;
                require_known(&c.engine)?;
                if !c.is_ready() {
                    return Err(BrokerError::WrongState(
                        "the desktop is not running and ready".into(),
                    ));
                }
                c.idle.renew(Instant::now());
                self.dirty.insert(id);
            }
            Purpose::Screenshot => {
                let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                // Reading the screen is not activity: the timer is left alone.
                require_known(&c.engine)?;
                if !c.engine.is_up() {
                    return Err(BrokerError::WrongState("the desktop is not running".into()));
                }
            }
            Purpose::Screen(mode) => {
                let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                if let Some(op) = &c.op {
                    return Err(BrokerError::WrongState(format!(
                        "{} is in progress",
                        op.kind().describe()
                    )));
                }
                require_known(&c.engine)?;
                if !c.engine.is_up() {
                    return Err(BrokerError::WrongState("the desktop is not running".into()));
                }
                if !c.is_ready() {
                    return Err(BrokerError::WrongState("the desktop is not ready".into()));
                }
                if mode == ScreenMode::Control {
                    check_fence(&self.metrics, c, fence)?;
                }
            }
            Purpose::Egress => {
                let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                // While the engine cannot say, its last word stands: a
                // desktop's web access does not stop because its engine is
                // away (the guest, which asks, still answers).
                let lost = matches!(c.engine, crate::engine::Observed::Unknown(_));
                let up = c.engine.is_up() || (lost && c.last_up);
                if !up || !c.guest_ready() {
                    return Err(BrokerError::WrongState(
                        "the desktop is not running and ready".into(),
                    ));
                }
            }
            Purpose::ScreenConnection | Purpose::ExportQuiesce => {
                self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
            }
        }
        self.ticket(id, fence, purpose)
    }

    /// The ticket of an admitted call.
    fn ticket(&mut self, id: Uuid, fence: Fence, purpose: Purpose) -> Result<Ticket, BrokerError> {
        let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
        let generation = c.record.generation;
        let actor = actor_of(c.record.lease.as_ref(), fence);
        let answers = self.answer_report(id, c.follower.as_ref().map(|f| f.epoch));
        // Egress is revoked by a generation change too, though no lease fences it.
        let revoked = if purpose.fenced() || purpose == Purpose::Egress {
            self.revocations.fenced(id, generation)
        } else {
            self.revocations.unfenced(id)
        };
        Ok(Ticket {
            computer: id,
            guest: self.ctx.socket(id),
            generation,
            actor,
            revoked,
            answers,
        })
    }
}
