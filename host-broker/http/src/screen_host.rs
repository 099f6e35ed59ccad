//! The broker's [`ScreenHost`]: admission by the owner through the one
//! admission of guest calls ([`dormouse_core::relay`]; the task that decides leases,
//! so the fence and the generation it answers cannot be raced), and
//! connections to a computer's VNC server over the ticket's guest channel
//! ([`relay::vnc`]): the run directory's `vnc.sock`, opened race-free and
//! owner-checked like the supervisor socket, or the engine's exec bridge.
//!
//! It never decides anything itself and never opens a guest path another
//! way.

use dormouse_protocol::activity::Actor;
use dormouse_protocol::screen::ScreenMode;
use futures_util::future::BoxFuture;
use tokio::net::UnixStream;
use uuid::Uuid;

use crate::screen::{Refusal, ScreenHost};
use crate::HttpError;
use dormouse_core::command::BrokerHandle;
use dormouse_core::error::BrokerError;
use dormouse_core::relay::{self, Purpose};

/// [`ScreenHost`] over the owner.
#[derive(Debug, Clone)]
pub struct OwnerScreenHost {
    broker: BrokerHandle,
}

impl OwnerScreenHost {
    /// Admission and guest channels through `broker`.
    pub fn new(broker: BrokerHandle) -> Self {
        Self { broker }
    }
}

/// The owner's refusal as the gateway's: a desktop that is not running or
/// ready is `not_ready`; the rest keep their API code (and message).
fn refusal(e: BrokerError) -> Refusal {
    if let BrokerError::WrongState(why) = &e {
        return Refusal::not_ready(why.clone());
    }
    let http = HttpError::from(e);
    Refusal::new(http.error_code(), http.message())
}

impl ScreenHost for OwnerScreenHost {
    fn exists(&self, computer: Uuid) -> BoxFuture<'_, Result<(), Refusal>> {
        Box::pin(async move { self.broker.get(computer).await.map(|_| ()).map_err(refusal) })
    }

    fn admit(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        generation: Option<u64>,
    ) -> BoxFuture<'_, Result<u64, Refusal>> {
        Box::pin(async move {
            self.admit_as(computer, mode, generation)
                .await
                .map(|(generation, _)| generation)
        })
    }

    fn admit_as(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        generation: Option<u64>,
    ) -> BoxFuture<'_, Result<(u64, Actor), Refusal>> {
        Box::pin(async move {
            self.broker
                .admit_guest(computer, generation, Purpose::Screen(mode))
                .await
                .map(|ticket| (ticket.generation, ticket.actor))
                .map_err(refusal)
        })
    }

    fn connect_vnc(&self, computer: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>> {
        Box::pin(async move {
            let unreachable = || Refusal::unavailable("the desktop's screen cannot be reached");
            let ticket = self
                .broker
                .admit_guest(computer, None, Purpose::ScreenConnection)
                .await
                .map_err(|e| {
                    tracing::debug!(computer = %computer, error = %e, "vnc connection not admitted");
                    unreachable()
                })?;
            relay::vnc(&ticket).await.map_err(|e| {
                tracing::debug!(computer = %computer, error = %e, "vnc socket unreachable");
                unreachable()
            })
        })
    }
}
