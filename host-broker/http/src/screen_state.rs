//! The API state's screen parts: the gateway an [`ApiState`] starts with
//! (refusing everything until the daemon wires the owner's in) and the
//! extraction of the gateway and the noVNC directory from the state. The
//! screen routes themselves are [`crate::screen_routes`]'s. It decides
//! nothing.

use std::sync::Arc;

use axum::extract::FromRef;
use dormouse_protocol::screen::ScreenMode;
use futures_util::future::BoxFuture;
use tokio::net::UnixStream;
use uuid::Uuid;

use super::ApiState;
use crate::screen::{Refusal, ScreenGateway, ScreenHost};
use crate::screen_viewer::NovncDir;
use dormouse_core::command::BrokerHandle;

/// A gateway whose host refuses everything (503): what an [`ApiState`]
/// starts with until the daemon wires the owner's host in.
pub fn unwired(broker: &BrokerHandle) -> ScreenGateway {
    let mut gateway = ScreenGateway::new(
        Arc::new(Unwired),
        tokio_util::sync::CancellationToken::new(),
    );
    gateway.registry = broker.screens().clone();
    gateway
}

struct Unwired;

fn not_served() -> Refusal {
    Refusal::unavailable("this broker does not serve live screens")
}

impl ScreenHost for Unwired {
    fn exists(&self, _: Uuid) -> BoxFuture<'_, Result<(), Refusal>> {
        Box::pin(async { Err(not_served()) })
    }

    fn admit(&self, _: Uuid, _: ScreenMode, _: Option<u64>) -> BoxFuture<'_, Result<u64, Refusal>> {
        Box::pin(async { Err(not_served()) })
    }

    fn connect_vnc(&self, _: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>> {
        Box::pin(async { Err(not_served()) })
    }
}

impl FromRef<ApiState> for ScreenGateway {
    fn from_ref(state: &ApiState) -> Self {
        state.screens.clone()
    }
}

impl FromRef<ApiState> for NovncDir {
    fn from_ref(state: &ApiState) -> Self {
        state.novnc.clone()
    }
}
