//! Revocation of open guest relays and live-screen capabilities as the
//! owner's own view of each computer changes, and giving a lease back.
//!
//! Revocation is derived, not sprinkled over every code path: after every
//! turn of the owner's loop, [`Owner::sync_revocations`] compares what it
//! last saw of each computer (a stop being decided, the container up, its
//! start, the guest's start identity, the generation, a removal) with what
//! it holds now and revokes accordingly, so a new path that changes one of
//! these cannot forget to. A generation change fires the revocation of
//! every fenced [`Ticket`](crate::relay::Ticket) admitted under the old one
//! (exec, terminal, actions) and revokes the control screens bound to it;
//! a removal ends every ticket and every screen of the computer. It never
//! mints, never opens a socket, and never sees a token.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use dormouse_protocol::activity::{Actor, Happened};
use dormouse_protocol::screen::RevokeReason;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::admission::check_fence;
use super::commands::Answer;
use super::ops::OpKind;
use super::Owner;
use crate::command::{Fence, Reply};
use crate::error::BrokerError;

/// What the owner last saw of one computer, as far as screens care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ScreenSeen {
    up: bool,
    started_at: Option<DateTime<Utc>>,
    identity: Option<String>,
    generation: u64,
    stopping: bool,
    removing: bool,
}

/// What the revocation pass keeps between turns.
#[derive(Debug, Default)]
pub(super) struct Revocations {
    /// Every computer's [`ScreenSeen`].
    seen: HashMap<Uuid, ScreenSeen>,
    /// Per computer: the generation fenced tickets were admitted under and
    /// the revocation they share.
    fenced: HashMap<Uuid, (u64, CancellationToken)>,
    /// Per computer: the revocation unfenced tickets share (the removal).
    unfenced: HashMap<Uuid, CancellationToken>,
}

impl Revocations {
    /// The revocation of a fenced ticket admitted under `generation`.
    pub(super) fn fenced(&mut self, id: Uuid, generation: u64) -> CancellationToken {
        match self.fenced.get(&id) {
            Some((g, token)) if *g == generation && !token.is_cancelled() => token.clone(),
            _ => {
                let token = CancellationToken::new();
                if let Some((_, old)) = self.fenced.insert(id, (generation, token.clone())) {
                    old.cancel();
                }
                token
            }
        }
    }

    /// The revocation of an unfenced ticket (fires when the computer goes).
    pub(super) fn unfenced(&mut self, id: Uuid) -> CancellationToken {
        self.unfenced.entry(id).or_default().clone()
    }

    /// Fires the fenced tickets of `id` not admitted under `generation`;
    /// answers whether there were any.
    fn fence_off(&mut self, id: Uuid, generation: u64) -> bool {
        match self.fenced.get(&id) {
            Some((g, _)) if *g != generation => {
                if let Some((_, token)) = self.fenced.remove(&id) {
                    token.cancel();
                }
                true
            }
            _ => false,
        }
    }

    /// Fires every ticket of a computer that is gone.
    fn forget(&mut self, id: Uuid) {
        self.seen.remove(&id);
        if let Some((_, token)) = self.fenced.remove(&id) {
            token.cancel();
        }
        if let Some(token) = self.unfenced.remove(&id) {
            token.cancel();
        }
    }
}

impl Owner {
    fn screen_seen(&self, id: Uuid) -> Option<ScreenSeen> {
        let c = self.computers.get(&id)?;
        let kind = c.op.as_ref().map(|o| o.kind());
        // An engine that cannot be asked says nothing of the desktop: what
        // it said last stands, so a lost engine revokes no screen.
        let (up, started_at) = match (&c.engine, self.revocations.seen.get(&id)) {
            (crate::engine::Observed::Unknown(_), Some(before)) => (before.up, before.started_at),
            (crate::engine::Observed::Unknown(_), None) => (c.last_up, None),
            (engine, _) => (engine.is_up(), engine.info().and_then(|d| d.started_at)),
        };
        Some(ScreenSeen {
            up,
            started_at,
            identity: c.guest.hello.as_ref().map(|h| h.identity.fingerprint()),
            generation: c.record.generation,
            stopping: matches!(kind, Some(OpKind::Stop { .. })),
            removing: matches!(kind, Some(OpKind::Remove { .. })),
        })
    }

    /// Revokes what the latest changes affect; called after every turn of
    /// the loop (a map lookup per computer when nothing changed).
    pub(super) fn sync_revocations(&mut self) {
        let ids: Vec<Uuid> = self.computers.keys().copied().collect();
        for id in ids {
            let Some(now) = self.screen_seen(id) else {
                continue;
            };
            let generation = now.generation;
            let before = self.revocations.seen.insert(id, now.clone());
            if self.revocations.fence_off(id, generation) {
                tracing::info!(computer = %id, generation, "guest calls of older generations revoked");
            }
            let Some(before) = before else {
                continue;
            };
            if before == now {
                continue;
            }
            if let Some(reason) = revocation(&before, &now) {
                let n = self.screens.revoke_all(id, reason);
                tracing::info!(computer = %id, reason = reason.close_reason(), revoked = n, "screens revoked");
            }
            if before.generation != now.generation {
                let n = self.screens.revoke_control_except(id, now.generation);
                tracing::info!(computer = %id, generation = now.generation, revoked = n, "control screens of older generations revoked");
            }
        }
        let r = &self.revocations;
        let known = |id: &Uuid| self.computers.contains_key(id);
        let gone: Vec<Uuid> = r
            .seen
            .keys()
            .chain(r.fenced.keys())
            .chain(r.unfenced.keys())
            .filter(|id| !known(id))
            .copied()
            .collect();
        for id in gone {
            self.revocations.forget(id);
            self.screens.revoke_all(id, RevokeReason::Removed);
        }
    }

    /// Gives the lease back (`DELETE /v1/computers/{id}/lease`): fenced by
    /// the generation; no live lease is not an error. The generation stays;
    /// the next holder's takeover moves it on (and revokes older control).
    pub(super) fn release_lease(
        &mut self,
        (id, fence, ()): (Uuid, Fence, ()),
        reply: Reply<()>,
    ) -> Answer<()> {
        Answer::Now(reply, self.decide_release(id, fence))
    }

    fn decide_release(&mut self, id: Uuid, fence: Fence) -> Result<(), BrokerError> {
        let c = self.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
        let now = Utc::now();
        if !c.record.lease.as_ref().is_some_and(|l| l.is_live(now)) {
            return Ok(());
        }
        check_fence(&self.metrics, c, fence)?;
        let mut record = c.record.clone();
        let released = record.lease.take();
        self.store.save(&record)?;
        if let Some(lease) = released {
            let what = Happened::LeaseReleased {
                holder: lease.holder.clone(),
                generation: lease.generation,
            };
            self.record(id, Actor::Lease(lease.holder), &what);
        }
        if let Some(c) = self.computers.get_mut(&id) {
            c.record = record;
        }
        // Control capabilities bound to this generation are not revoked
        // here: without a lease, control needs no fence anyway, and the
        // next holder's takeover moves the generation on and revokes them.
        // (The panel revokes its own before releasing.)
        tracing::info!(computer = %id, "lease released");
        self.dirty.insert(id);
        Ok(())
    }
}

/// Why every screen of a computer goes, if the change says so.
fn revocation(before: &ScreenSeen, now: &ScreenSeen) -> Option<RevokeReason> {
    if now.removing && !before.removing {
        return Some(RevokeReason::Removed);
    }
    if now.stopping && !before.stopping {
        return Some(RevokeReason::Stopped);
    }
    if before.up && !now.up {
        // Down without a stop of the broker's own: killed behind its back
        // (a broker stop was already revoked when it was decided).
        return Some(if before.stopping || now.stopping {
            RevokeReason::Stopped
        } else {
            RevokeReason::Killed
        });
    }
    let restarted_container = now.up
        && (!before.up
            || matches!((before.started_at, now.started_at), (Some(a), Some(b)) if a != b));
    let new_identity = matches!((&before.identity, &now.identity), (Some(a), Some(b)) if a != b);
    if restarted_container || new_identity {
        return Some(RevokeReason::Restarted);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> ScreenSeen {
        ScreenSeen {
            up: true,
            started_at: Some(Utc::now()),
            identity: Some("a".into()),
            generation: 1,
            stopping: false,
            removing: false,
        }
    }

    #[test]
    fn a_generation_change_or_a_removal_fires_the_tickets_it_fences_off() {
        let id = Uuid::new_v4();
        let mut r = Revocations::default();
        let first = r.fenced(id, 1);
        let again = r.fenced(id, 1);
        let unfenced = r.unfenced(id);
        assert!(
            !r.fence_off(id, 1),
            "the same generation fences nothing off"
        );
        assert!(!first.is_cancelled() && !again.is_cancelled());
        assert!(r.fence_off(id, 2));
        assert!(first.is_cancelled() && again.is_cancelled());
        assert!(
            !unfenced.is_cancelled(),
            "a generation change leaves unfenced calls"
        );
        let second = r.fenced(id, 2);
        assert!(!second.is_cancelled());
        // A ticket of a newer generation admitted before the pass saw it
        // replaces (and fires) the older one at once.
        let third = r.fenced(id, 3);
        assert!(second.is_cancelled() && !third.is_cancelled());
        r.forget(id);
        assert!(third.is_cancelled() && unfenced.is_cancelled());
    }

    #[test]
    fn changes_map_to_reasons() {
        let s = seen();
        assert_eq!(revocation(&s, &s), None);
        let stopping = ScreenSeen {
            stopping: true,
            ..s.clone()
        };
        assert_eq!(revocation(&s, &stopping), Some(RevokeReason::Stopped));
        let down = ScreenSeen {
            up: false,
            ..s.clone()
        };
        assert_eq!(revocation(&s, &down), Some(RevokeReason::Killed));
        assert_eq!(revocation(&stopping, &down), Some(RevokeReason::Stopped));
        let removing = ScreenSeen {
            removing: true,
            ..s.clone()
        };
        assert_eq!(revocation(&s, &removing), Some(RevokeReason::Removed));
        let restarted = ScreenSeen {
            started_at: Some(Utc::now() + chrono::Duration::seconds(5)),
            ..s.clone()
        };
        assert_eq!(revocation(&s, &restarted), Some(RevokeReason::Restarted));
        let other = ScreenSeen {
            identity: Some("b".into()),
            ..s.clone()
        };
        assert_eq!(revocation(&s, &other), Some(RevokeReason::Restarted));
        let fenced = ScreenSeen {
            generation: 2,
            ..s.clone()
        };
        assert_eq!(revocation(&s, &fenced), None);
    }
}
