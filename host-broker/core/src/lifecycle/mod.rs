//! The lifecycle verbs, one file each (youki style): [`create`], [`resume`],
//! [`stop`] and [`remove`].
//!
//! Each verb is an async function over an [`OpContext`] that speaks
//! [`Backend`] verbs, the guest channel and the stop-reason store, and
//! returns what it found. The verbs never hold the broker's state: the owner task runs them as
//! per-computer tasks (at most one at a time per computer) and applies their
//! results. They never decide policy (idle, capacity, fencing) either.

pub mod create;
pub mod remove;
pub mod resume;
pub mod stop;

use std::sync::Arc;

use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::engine::Backend;
use crate::guest::GuestSocket;
use crate::store::{Paths, StopReasonStore};

/// What a lifecycle verb may use.
#[derive(Debug, Clone)]
pub struct OpContext {
    /// Whatever keeps the desktops.
    pub backend: Arc<dyn Backend>,
    /// The broker's configuration.
    pub config: Arc<BrokerConfig>,
    /// Paths under the data directory.
    pub paths: Paths,
    /// Where stop reasons go.
    pub stops: StopReasonStore,
}

impl OpContext {
    /// The supervisor socket of a computer.
    pub fn socket(&self, id: Uuid) -> GuestSocket {
        self.backend.guest(id)
    }
}

/// The key stop reasons are filed under (hashed by the store).
pub fn stop_key(id: Uuid) -> String {
    id.to_string()
}
