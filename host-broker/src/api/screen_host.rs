//! The broker's [`ScreenHost`]: admission by the owner (the one task that
//! decides leases, so the fence and the generation it answers cannot be
//! raced), and connections to a computer's `vnc.sock` through
//! [`RunDir::connect`], the same race-free, no-follow, owner-checked connect
//! as the supervisor socket.
//!
//! It never decides anything itself and never opens a guest path another
//! way.

use dormouse_protocol::screen::ScreenMode;
use futures_util::future::BoxFuture;
use tokio::net::UnixStream;
use uuid::Uuid;

use crate::api::HttpError;
use crate::command::BrokerHandle;
use crate::error::BrokerError;
use crate::guest::RunDir;
use crate::screen::{Refusal, ScreenHost, VNC_SOCKET_FILE_NAME};
use crate::store::Paths;

/// [`ScreenHost`] over the owner and the data directory.
#[derive(Debug, Clone)]
pub struct OwnerScreenHost {
    broker: BrokerHandle,
    paths: Paths,
}

impl OwnerScreenHost {
    /// Admission through `broker`; run directories beneath `paths`.
    pub fn new(broker: BrokerHandle, paths: Paths) -> Self {
        Self { broker, paths }
    }
}

/// The owner's refusal as the gateway's: a desktop that is not running or
/// ready is `not_ready`; the rest keep their API status and code.
fn refusal(e: BrokerError) -> Refusal {
    if let BrokerError::WrongState(why) = &e {
        return Refusal::not_ready(why.clone());
    }
    let http = HttpError::from(e);
    Refusal::new(http.status(), http.code(), http.message())
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
            self.broker
                .screen_admit(computer, mode, generation)
                .await
                .map_err(refusal)
        })
    }

    fn connect_vnc(&self, computer: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>> {
        Box::pin(async move {
            RunDir::new(self.paths.run_dir(computer))
                .connect(VNC_SOCKET_FILE_NAME)
                .await
                .map_err(|e| {
                    tracing::debug!(computer = %computer, error = %e, "vnc socket unreachable");
                    Refusal::unavailable("the desktop's screen cannot be reached")
                })
        })
    }
}
