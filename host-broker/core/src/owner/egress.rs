//! The owner's part of egress: each computer's policy lives in its record
//! (set at create, replaced by `PUT /v1/computers/{id}/egress`, fenced),
//! and the owner publishes it to the live policies
//! ([`dormouse_egress::Policies`]) on every load and change, so changes
//! reach open connections in the owner's order. Egress bytes renew the idle
//! timer here, like any other activity.
//!
//! It never relays a byte nor decides a connection (`dormouse-egress` does).

use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::egress_policy::EgressPolicy;
use tokio::time::Instant;
use uuid::Uuid;

use super::commands::{Answer, Fenced};
use super::Owner;
use crate::command::{Fence, Reply};
use crate::error::BrokerError;
use crate::store::computer::ComputerRecord;

impl Owner {
    /// The policy a record stands for: its own, or the broker's default.
    fn effective_egress(&self, record: &ComputerRecord) -> EgressPolicy {
        record
            .egress
            .clone()
            .unwrap_or_else(|| EgressPolicy::of_mode(self.config().egress_default))
    }

    /// Publishes `record`'s policy to the live policies.
    pub(super) fn publish_egress(&self, record: &ComputerRecord) {
        self.egress.set(record.id, self.effective_egress(record));
    }

    /// Publishes every loaded computer's policy (at start-up).
    pub(super) fn publish_egress_all(&self) {
        for c in self.computers.values() {
            self.publish_egress(&c.record);
        }
    }

    /// The policy of a new computer: the request's (checked), or the default.
    pub(super) fn create_egress(
        &self,
        request: &CreateComputer,
    ) -> Result<EgressPolicy, BrokerError> {
        match &request.egress {
            Some(policy) => {
                policy
                    .validate()
                    .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
                Ok(policy.clone())
            }
            None => Ok(EgressPolicy::of_mode(self.config().egress_default)),
        }
    }

    /// Reads, or replaces (fenced, persisted first) and then reads, a
    /// computer's policy.
    pub(super) fn egress(
        &mut self,
        (id, fence, set): Fenced<Option<EgressPolicy>>,
        reply: Reply<EgressPolicy>,
    ) -> Answer<EgressPolicy> {
        Answer::Now(reply, self.change_egress(id, fence, set))
    }

    fn change_egress(
        &mut self,
        id: Uuid,
        fence: Fence,
        set: Option<EgressPolicy>,
    ) -> Result<EgressPolicy, BrokerError> {
        let Some(policy) = set else {
            let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
            return Ok(self.effective_egress(&c.record));
        };
        policy
            .validate()
            .map_err(|e| BrokerError::BadRequest(e.to_string()))?;
        let c = self.admit(id, fence)?;
        let mut record = c.record.clone();
        record.egress = Some(policy.clone());
        self.store.save(&record)?;
        let c = self
            .computers
            .get_mut(&id)
            .ok_or(BrokerError::NotFound(id))?;
        c.record = record;
        self.egress.set(id, policy.clone());
        tracing::info!(computer = %id, mode = %policy.mode, allow = policy.allow.len(), deny = policy.deny.len(), "egress policy changed");
        Ok(policy)
    }

    /// Egress bytes moved: activity for a ready desktop's idle timer.
    pub(super) fn egress_activity(&mut self, id: Uuid, reply: Reply<()>) -> Answer<()> {
        if let Some(c) = self.computers.get_mut(&id) {
            if c.is_ready() {
                c.idle.renew(Instant::now());
                self.dirty.insert(id);
            }
        }
        Answer::Now(reply, Ok(()))
    }
}
