//! The `/v1/events` WebSocket over a real loopback socket: a snapshot on
//! connect, then every event; a lagging client gets a fresh snapshot; the
//! token is accepted in the header, the subprotocol or the query.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::time::Duration;

use api_support::{sample, Harness, TOKEN};
use dormouse_broker::daemon::{serve, ApiListener, ServeLimits};
use dormouse_protocol::api::BrokerEvent;
use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn serve(h: &Harness) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    let router = h.router();
    // Through the daemon's own serving layer, so WebSocket upgrades are
    // proven to survive its connection guard.
    tokio::spawn(serve::serve(
        ApiListener::Tcp(listener),
        router,
        ServeLimits::default(),
        CancellationToken::new(),
    ));
    addr
}

async fn connect(addr: std::net::SocketAddr) -> Socket {
    let mut request = format!("ws://{addr}/v1/events")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "Authorization",
        HeaderValue::from_str(&format!("Bearer {TOKEN}")).expect("header"),
    );
    tokio_tungstenite::connect_async(request)
        .await
        .expect("WebSocket handshake")
        .0
}

/// The next event; fails the test after 10 s (a bound on a hang, not a speed claim).
async fn next_event(socket: &mut Socket) -> BrokerEvent {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("an event within 10 s")
            .expect("stream open")
            .expect("message");
        match message {
            Message::Text(text) => return serde_json::from_str(&text).expect("a BrokerEvent"),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected message {other:?}"),
        }
    }
}

fn status_of(event: &BrokerEvent) -> (Uuid, bool) {
    match event {
        BrokerEvent::Status { computer } => (computer.id, computer.ready),
        BrokerEvent::Removed { id } => panic!("expected a status, got removed {id}"),
        BrokerEvent::Egress { entry } => panic!("expected a status, got egress {entry:?}"),
        BrokerEvent::Activity { entry, .. } => panic!("expected a status, got activity {entry:?}"),
    }
}

#[tokio::test]
async fn snapshot_then_every_event() {
    let h = Harness::new();
    let a = h.add("a", true);
    let b = h.add("b", false);
    let addr = serve(&h).await;
    let mut socket = connect(addr).await;

    let mut seen = vec![status_of(&next_event(&mut socket).await).0];
    seen.push(status_of(&next_event(&mut socket).await).0);
    seen.sort();
    let mut expected = vec![a, b];
    expected.sort();
    assert_eq!(seen, expected, "the snapshot has every computer");

    // A change made through the API arrives as an event.
    let client = reqwest::Client::new();
    let answer = client
        .post(format!("http://{addr}/v1/computers/{b}/start"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("start");
    assert_eq!(answer.status(), 200);
    let event = next_event(&mut socket).await;
    assert_eq!(status_of(&event), (b, true));

    let answer = client
        .delete(format!("http://{addr}/v1/computers/{a}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("remove");
    assert_eq!(answer.status(), 204);
    assert_eq!(
        next_event(&mut socket).await,
        BrokerEvent::Removed { id: a }
    );
    // Watching asked for nothing but the snapshot.
    assert!(h.calls().iter().filter(|c| c.starts_with("list")).count() == 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_lagging_client_gets_a_fresh_snapshot() {
    let h = Harness::with_capacity(2);
    let kept = h.add("kept", true);
    let gone = h.add("gone", true);
    let addr = serve(&h).await;
    let mut socket = connect(addr).await;
    next_event(&mut socket).await;
    next_event(&mut socket).await;

    // Behind the relay's back: one computer vanishes, then a burst of events
    // overflows the channel before the relay task can run.
    h.lock().computers.remove(&gone);
    for _ in 0..10 {
        let _ = h.events.send(BrokerEvent::Status {
            computer: Box::new(sample(kept, "kept", true)),
        });
    }
    let mut removed = false;
    let mut statuses = 0;
    for _ in 0..4 {
        match next_event(&mut socket).await {
            BrokerEvent::Removed { id } => {
                assert_eq!(id, gone);
                removed = true;
            }
            BrokerEvent::Status { computer } => {
                assert_eq!(computer.id, kept);
                statuses += 1;
            }
            BrokerEvent::Egress { entry } => panic!("no egress here: {entry:?}"),
            BrokerEvent::Activity { entry, .. } => panic!("no activity here: {entry:?}"),
        }
        if removed && statuses >= 1 {
            break;
        }
    }
    assert!(removed, "the resnapshot says what vanished");
    assert_eq!(
        h.calls().iter().filter(|c| c.starts_with("list")).count(),
        2
    );
}

#[tokio::test]
async fn browsers_authenticate_by_subprotocol_or_query() {
    let h = Harness::new();
    h.add("a", true);
    let addr = serve(&h).await;

    let mut request = format!("ws://{addr}/v1/events")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_str(&format!("dormouse.v1, dormouse.bearer.{TOKEN}")).expect("header"),
    );
    let (mut socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("subprotocol handshake");
    assert_eq!(
        response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .map(|v| v.as_bytes()),
        Some(&b"dormouse.v1"[..]),
        "the broker selects dormouse.v1, never echoes the token"
    );
    next_event(&mut socket).await;

    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/events?token={TOKEN}"))
            .await
            .expect("query handshake");
    next_event(&mut socket).await;

    let refused =
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/events?token=wrong")).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401);
        }
        other => panic!("expected 401, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_closes_streams_with_going_away() {
    let h = Harness::new();
    let addr = serve(&h).await;
    let mut socket = connect(addr).await;
    h.state.shutdown.cancel();
    let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("a close within 10 s")
        .expect("stream open")
        .expect("message");
    match message {
        Message::Close(Some(frame)) => assert_eq!(u16::from(frame.code), 1001),
        other => panic!("expected a close frame, got {other:?}"),
    }
}
