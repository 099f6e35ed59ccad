//! The live policy of every desktop, as one `watch` each: the broker's
//! owner sets a desktop's policy here whenever it loads, creates or
//! changes it (so the order of changes is the owner's), and every pool and
//! open connection of that desktop watches it. Removing a desktop drops
//! its sender, which ends whatever watches it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dormouse_protocol::egress_policy::EgressPolicy;
use tokio::sync::watch;
use uuid::Uuid;

/// Every desktop's live policy.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    inner: Arc<Mutex<HashMap<Uuid, watch::Sender<EgressPolicy>>>>,
}

impl Policies {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, watch::Sender<EgressPolicy>>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets computer `id`'s policy (watchers see it at once).
    pub fn set(&self, id: Uuid, policy: EgressPolicy) {
        let mut map = self.lock();
        match map.get(&id) {
            Some(tx) => {
                tx.send_replace(policy);
            }
            None => {
                map.insert(id, watch::Sender::new(policy));
            }
        }
    }

    /// Computer `id`'s policy now.
    pub fn get(&self, id: Uuid) -> Option<EgressPolicy> {
        self.lock().get(&id).map(|tx| tx.borrow().clone())
    }

    /// A watch of computer `id`'s policy.
    pub fn watch(&self, id: Uuid) -> Option<watch::Receiver<EgressPolicy>> {
        self.lock().get(&id).map(watch::Sender::subscribe)
    }

    /// Forgets computer `id` (its watchers end).
    pub fn remove(&self, id: Uuid) {
        self.lock().remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormouse_protocol::egress_policy::EgressMode;

    #[tokio::test]
    async fn watchers_see_changes_and_removal() {
        let p = Policies::default();
        let id = Uuid::new_v4();
        assert!(p.watch(id).is_none());
        p.set(id, EgressPolicy::of_mode(EgressMode::Off));
        let mut rx = p.watch(id).expect("watch");
        p.set(id, EgressPolicy::of_mode(EgressMode::Open));
        rx.changed().await.expect("changed");
        assert_eq!(rx.borrow().mode, EgressMode::Open);
        assert_eq!(p.get(id).map(|x| x.mode), Some(EgressMode::Open));
        p.remove(id);
        assert!(rx.changed().await.is_err());
    }
}
