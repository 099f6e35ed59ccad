//! The panel's live screen without an engine: the scripted broker core of
//! the router tests, the real screen gateway and noVNC serving, and a fake
//! VNC server that streams a changing grey screen.
//!
//! `DORMOUSE_DEMO_ADDR=127.0.0.1:7498 cargo test -p dormouse-broker --test
//! screen_panel_demo -- --ignored --nocapture` serves until interrupted
//! (token: `api_support::TOKEN`); `tests/browser/panel_test.py --url
//! http://127.0.0.1:7498 --token <TOKEN>` then checks the panel on it,
//! live screen included. Status changes revoke screens here the way the
//! broker's owner will: not ready revokes all (reason "stopped"), a new
//! generation revokes older control.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::sync::Arc;
use std::time::Duration;

use api_support::{Harness, TOKEN};
use dormouse_broker::api::screen_viewer as viewer;
use dormouse_broker::screen::{Refusal, ScreenGateway, ScreenHost};
use dormouse_e2e::rfb::FakeVncServer;
use dormouse_protocol::api::BrokerEvent;
use dormouse_protocol::screen::{RevokeReason, ScreenMode};
use futures_util::future::BoxFuture;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

struct DemoHost {
    broker: dormouse_broker::BrokerHandle,
    vnc: std::path::PathBuf,
}

impl ScreenHost for DemoHost {
    fn exists(&self, computer: Uuid) -> BoxFuture<'_, Result<(), Refusal>> {
        Box::pin(async move {
            self.broker
                .get(computer)
                .await
                .map(|_| ())
                .map_err(|_| Refusal::not_found())
        })
    }

    fn admit(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        generation: Option<u64>,
    ) -> BoxFuture<'_, Result<u64, Refusal>> {
        Box::pin(async move {
            let c = self
                .broker
                .get(computer)
                .await
                .map_err(|_| Refusal::not_found())?;
            if !c.ready {
                return Err(Refusal::not_ready("the desktop is not ready"));
            }
            if mode == ScreenMode::Control && c.generation > 0 && generation != Some(c.generation) {
                return Err(Refusal::stale_generation(c.generation));
            }
            Ok(c.generation)
        })
    }

    fn connect_vnc(&self, _computer: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>> {
        Box::pin(async move {
            UnixStream::connect(&self.vnc)
                .await
                .map_err(|e| Refusal::unavailable(e.to_string()))
        })
    }
}

#[tokio::test]
#[ignore = "serves the panel with a live screen until interrupted"]
async fn serve_screen_panel_demo() {
    let addr = std::env::var("DORMOUSE_DEMO_ADDR").unwrap_or_else(|_| "127.0.0.1:7498".into());
    let novnc = std::env::var("DORMOUSE_NOVNC_DIR")
        .unwrap_or_else(|_| viewer::DEFAULT_NOVNC_DIR.to_owned());
    let dir = dormouse_e2e::TempDir::new("dormouse-screen-demo");
    let vnc = dir.path().join("vnc.sock");
    let _fake = FakeVncServer::start(&vnc, Some(Duration::from_millis(200))).unwrap();

    let h = Harness::new();
    h.lock().boot_time = Duration::from_secs(3);
    h.add("stopped-idle", false);
    h.add("running", true);
    let gateway = ScreenGateway::new(
        Arc::new(DemoHost {
            broker: h.state.broker.clone(),
            vnc,
        }),
        CancellationToken::new(),
    );
    // The owner's hooks, played from the event stream.
    let mut events = h.state.broker.subscribe();
    let registry = gateway.registry.clone();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            match event {
                BrokerEvent::Status { computer } => {
                    if !computer.ready {
                        registry.revoke_all(computer.id, RevokeReason::Stopped);
                    }
                    registry.revoke_control_except(computer.id, computer.generation);
                }
                BrokerEvent::Removed { id } => {
                    registry.revoke_all(id, RevokeReason::Removed);
                }
                BrokerEvent::Egress { .. } | BrokerEvent::Activity { .. } => {}
            }
        }
    });
    // The broker's own route table serves the screen and noVNC routes;
    // only its state is swapped for the demo's.
    let mut state = h.state.clone();
    state.screens = gateway;
    state.novnc = viewer::NovncDir(Some(novnc.into()));
    let app = dormouse_broker::api::router(state);
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    println!("screen panel demo on http://{addr}/ token {TOKEN}");
    axum::serve(listener, app).await.expect("serve");
}
