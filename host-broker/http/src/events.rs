//! `GET /v1/events`: the WebSocket stream of status changes.
//!
//! On connect the client gets the status of every computer, then every
//! [`BrokerEvent`] the core broadcasts. A client too slow to keep up is not
//! dropped: it gets a fresh full snapshot (and `removed` for computers that
//! vanished meanwhile), so its view converges. This module only relays; it
//! never asks for anything that renews an idle timer.

use std::collections::HashSet;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use dormouse_protocol::api::BrokerEvent;
use dormouse_protocol::api::ErrorCode;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

use super::auth::EVENTS_SUBPROTOCOL;
use super::error::HttpError;
use super::ApiState;

/// Largest message accepted from a client (clients have nothing to say).
const MAX_CLIENT_MESSAGE: usize = 4096;

/// How often an idle connection is pinged, so dead peers are noticed.
const PING_INTERVAL: Duration = Duration::from_secs(30);

/// Close codes (RFC 6455).
const CLOSE_GOING_AWAY: u16 = 1001;
const CLOSE_INTERNAL: u16 = 1011;

/// Upgrades to a WebSocket; a plain GET gets a 400 that says so.
pub async fn events(
    State(state): State<ApiState>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, HttpError> {
    let upgrade = upgrade.map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::WebsocketRequired,
            format!("/v1/events is a WebSocket: {rejection}"),
        )
    })?;
    Ok(upgrade
        .protocols([EVENTS_SUBPROTOCOL])
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| relay(socket, state)))
}

/// Why a relay ended.
enum End {
    /// The client went away or the socket failed.
    Client,
    /// The broker is shutting down.
    Shutdown,
    /// The core is gone or refused the snapshot.
    Core(String),
}

async fn relay(socket: WebSocket, state: ApiState) {
    let (mut tx, mut rx) = socket.split();
    // Subscribe before the snapshot so no change between the two is lost;
    // a change seen twice is harmless (the newest status wins).
    let mut events = state.broker.subscribe();
    let mut known = HashSet::new();
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.tick().await;

    let end = match send_snapshot(&mut tx, &state, &mut known).await {
        Err(end) => end,
        Ok(()) => loop {
            tokio::select! {
                () = state.shutdown.cancelled() => break End::Shutdown,
                event = events.recv() => match event {
                    Ok(event) => {
                        match &event {
                            BrokerEvent::Status { computer } => known.insert(computer.id),
                            BrokerEvent::Removed { id } => known.remove(id),
                            BrokerEvent::Egress { .. } | BrokerEvent::Activity { .. } => false,
                        };
                        if send(&mut tx, &event).await.is_err() {
                            break End::Client;
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "event stream lagged; resending a snapshot");
                        if let Err(end) = send_snapshot(&mut tx, &state, &mut known).await {
                            break end;
                        }
                    }
                    Err(RecvError::Closed) => break End::Core("the broker core stopped".into()),
                },
                incoming = rx.next() => match incoming {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break End::Client,
                    // Pings are answered by the socket itself; text from a
                    // client has no meaning here.
                    Some(Ok(_)) => {}
                },
                _ = ping.tick() => {
                    if tx.send(Message::Ping(Default::default())).await.is_err() {
                        break End::Client;
                    }
                }
            }
        },
    };

    let close = match end {
        End::Client => None,
        End::Shutdown => Some((CLOSE_GOING_AWAY, "the broker is shutting down".to_owned())),
        End::Core(reason) => Some((CLOSE_INTERNAL, reason)),
    };
    if let Some((code, reason)) = close {
        let _ = tx
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: Utf8Bytes::from(reason),
            })))
            .await;
    }
}

/// Sends every computer's status, and `removed` for those the client knew
/// that no longer exist.
async fn send_snapshot<S>(
    tx: &mut S,
    state: &ApiState,
    known: &mut HashSet<Uuid>,
) -> Result<(), End>
where
    S: SinkExt<Message> + Unpin,
{
    let computers = state
        .broker
        .list()
        .await
        .map_err(|e| End::Core(format!("no snapshot: {e}")))?;
    let now: HashSet<Uuid> = computers.iter().map(|c| c.id).collect();
    for id in known.difference(&now) {
        send(tx, &BrokerEvent::Removed { id: *id })
            .await
            .map_err(|()| End::Client)?;
    }
    for computer in computers {
        send(
            tx,
            &BrokerEvent::Status {
                computer: Box::new(computer),
            },
        )
        .await
        .map_err(|()| End::Client)?;
    }
    *known = now;
    Ok(())
}

async fn send<S>(tx: &mut S, event: &BrokerEvent) -> Result<(), ()>
where
    S: SinkExt<Message> + Unpin,
{
    let text = serde_json::to_string(event).map_err(|e| {
        tracing::error!(error = %e, "an event could not be serialised");
    })?;
    tx.send(Message::Text(Utf8Bytes::from(text)))
        .await
        .map_err(|_| ())
}
