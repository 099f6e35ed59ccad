//! The screen gateway in process: the real screen routes, registry, RFB
//! filter and relay over real sockets, against a fake VNC server on a unix
//! socket that records what reaches it. The broker's core is replaced by a
//! `ScreenHost` that admits known computers and connects to the fake.
//!
//! Real-engine tests (x11vnc in a desktop, `xdotool getmouselocation` as the
//! witness) come with the wiring into the broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use dormouse_broker::api::screen_routes;
use dormouse_broker::screen::{Refusal, ScreenGateway, ScreenHost};
use dormouse_e2e::rfb::{
    cut_text, key_event, pointer_event, set_encodings, update_request, FakeVncServer, RfbViewer,
    TokenIn, FAKE_HEIGHT, FAKE_WIDTH,
};
use dormouse_e2e::TempDir;
use dormouse_protocol::screen::{RevokeReason, ScreenGrant, ScreenInfo, ScreenMode};
use futures_util::future::BoxFuture;
use tokio::net::UnixStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Admits every computer it knows; control needs `generation` when set.
struct FakeHost {
    sockets: Mutex<HashMap<Uuid, PathBuf>>,
    lease: Mutex<Option<u64>>,
}

impl ScreenHost for FakeHost {
    fn exists(&self, computer: Uuid) -> BoxFuture<'_, Result<(), Refusal>> {
        let known = self.sockets.lock().unwrap().contains_key(&computer);
        Box::pin(async move { known.then_some(()).ok_or_else(Refusal::not_found) })
    }

    fn admit(
        &self,
        computer: Uuid,
        mode: ScreenMode,
        generation: Option<u64>,
    ) -> BoxFuture<'_, Result<u64, Refusal>> {
        let known = self.sockets.lock().unwrap().contains_key(&computer);
        let lease = *self.lease.lock().unwrap();
        Box::pin(async move {
            if !known {
                return Err(Refusal::not_found());
            }
            match (mode, lease) {
                (ScreenMode::Control, Some(current)) if generation != Some(current) => {
                    Err(Refusal::stale_generation(current))
                }
                (_, current) => Ok(current.unwrap_or(0)),
            }
        })
    }

    fn connect_vnc(&self, computer: Uuid) -> BoxFuture<'_, Result<UnixStream, Refusal>> {
        let path = self.sockets.lock().unwrap().get(&computer).cloned();
        Box::pin(async move {
            let path = path.ok_or_else(Refusal::not_found)?;
            UnixStream::connect(&path)
                .await
                .map_err(|e| Refusal::unavailable(format!("vnc socket: {e}")))
        })
    }
}

struct Harness {
    base: String,
    ws_base: String,
    gateway: ScreenGateway,
    host: Arc<FakeHost>,
    http: reqwest::Client,
    _dir: TempDir,
    desktops: Vec<(Uuid, FakeVncServer)>,
}

impl Harness {
    async fn new(desktops: usize, stream_every: Option<Duration>) -> Self {
        Self::saying(desktops, stream_every, Vec::new()).await
    }

    /// Desktops whose servers also send `said` after each ServerInit.
    async fn saying(desktops: usize, stream_every: Option<Duration>, said: Vec<u8>) -> Self {
        let dir = TempDir::new("dormouse-screen");
        let host = Arc::new(FakeHost {
            sockets: Mutex::default(),
            lease: Mutex::default(),
        });
        let mut servers = Vec::new();
        for i in 0..desktops {
            let id = Uuid::new_v4();
            let path = dir.path().join(format!("vnc-{i}.sock"));
            let server = FakeVncServer::start_saying(&path, stream_every, said.clone()).unwrap();
            host.sockets.lock().unwrap().insert(id, path);
            servers.push((id, server));
        }
        let mut gateway = ScreenGateway::new(host.clone(), CancellationToken::new());
        gateway.limits.send_stall = Duration::from_secs(1);
        let app = screen_routes::router(gateway.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base: format!("http://{addr}"),
            ws_base: format!("ws://{addr}"),
            gateway,
            host,
            http: reqwest::Client::new(),
            _dir: dir,
            desktops: servers,
        }
    }

    fn id(&self, i: usize) -> Uuid {
        self.desktops[i].0
    }

    fn fake(&self, i: usize) -> &FakeVncServer {
        &self.desktops[i].1
    }

    async fn mint_raw(
        &self,
        computer: Uuid,
        body: serde_json::Value,
        generation: Option<u64>,
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/v1/computers/{computer}/screens", self.base))
            .json(&body);
        if let Some(g) = generation {
            req = req.header("Dormouse-Generation", g.to_string());
        }
        req.send().await.unwrap()
    }

    async fn mint(&self, computer: Uuid, mode: &str, ttl_ms: u64) -> ScreenGrant {
        let resp = self
            .mint_raw(
                computer,
                serde_json::json!({"mode": mode, "ttl_ms": ttl_ms}),
                None,
            )
            .await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        resp.json().await.unwrap()
    }

    fn ws_url(&self, grant: &ScreenGrant) -> String {
        format!("{}{}", self.ws_base, grant.websocket)
    }

    async fn viewer(&self, grant: &ScreenGrant) -> RfbViewer {
        let mut v = RfbViewer::connect(&self.ws_url(grant), &grant.token, TokenIn::Subprotocol)
            .await
            .unwrap();
        let init = v.handshake().await.unwrap();
        assert_eq!((init.width, init.height), (FAKE_WIDTH, FAKE_HEIGHT));
        assert_eq!(init.name, "fake");
        v
    }
}

/// Input and a trailing update request, so the fake knows when all arrived.
fn input_then_marker() -> (Vec<u8>, Vec<u8>) {
    let mut input = Vec::new();
    input.extend_from_slice(&pointer_event(1, 10, 20));
    input.extend_from_slice(&pointer_event(0, 10, 20));
    input.extend_from_slice(&key_event(true, 0x61));
    input.extend_from_slice(&key_event(false, 0x61));
    input.extend_from_slice(&cut_text(b"from the viewer"));
    let marker = update_request(false, 0, 0, FAKE_WIDTH, FAKE_HEIGHT);
    (input, marker)
}

#[tokio::test]
async fn the_contract_mint_list_and_revoke() {
    let h = Harness::new(1, None).await;
    let id = h.id(0);
    let resp = h
        .mint_raw(
            id,
            serde_json::json!({"mode": "view", "ttl_ms": 60000}),
            None,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: serde_json::Value = resp.json().await.unwrap();
    let keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys.len(),
        5,
        "screen_id, mode, token, expires_at, websocket: {body}"
    );
    let grant: ScreenGrant = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(
        grant.websocket,
        format!("/v1/screens/{}/rfb", grant.screen_id)
    );
    assert_eq!(grant.token.len(), 64);
    assert!(chrono::DateTime::parse_from_rfc3339(body["expires_at"].as_str().unwrap()).is_ok());

    let listed: Vec<ScreenInfo> = h
        .http
        .get(format!("{}/v1/computers/{id}/screens", h.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].screen_id, grant.screen_id);
    let text = h
        .http
        .get(format!("{}/v1/computers/{id}/screens", h.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains(&grant.token), "a list never shows tokens");

    // Bad requests change nothing.
    for bad in [
        serde_json::json!({"mode": "admin"}),
        serde_json::json!({"mode": "view", "ttl_ms": 10}),
        serde_json::json!({"mode": "view", "extra": 1}),
    ] {
        assert_eq!(
            h.mint_raw(id, bad, None).await.status(),
            StatusCode::BAD_REQUEST
        );
    }
    assert_eq!(
        h.mint_raw(Uuid::new_v4(), serde_json::json!({"mode": "view"}), None)
            .await
            .status(),
        StatusCode::NOT_FOUND
    );

    let del = |sid: Uuid| h.http.delete(format!("{}/v1/screens/{sid}", h.base)).send();
    assert_eq!(
        del(grant.screen_id).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        del(grant.screen_id).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    let err = RfbViewer::connect(&h.ws_url(&grant), &grant.token, TokenIn::Subprotocol)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
}

#[tokio::test]
async fn control_is_fenced_by_the_lease_generation() {
    let h = Harness::new(1, None).await;
    let id = h.id(0);
    *h.host.lease.lock().unwrap() = Some(5);
    let body = serde_json::json!({"mode": "control", "ttl_ms": 60000});
    assert_eq!(
        h.mint_raw(id, body.clone(), None).await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        h.mint_raw(id, body.clone(), Some(4)).await.status(),
        StatusCode::CONFLICT
    );
    let resp = h.mint_raw(id, body, Some(5)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let grant: ScreenGrant = resp.json().await.unwrap();
    let listed = h.gateway.registry.list(id);
    assert_eq!(listed[0].generation, Some(5));
    // View needs no fence.
    h.mint(id, "view", 60000).await;

    // A new generation revokes the old control, within a second.
    let mut v = h.viewer(&grant).await;
    let started = Instant::now();
    assert_eq!(h.gateway.registry.revoke_control_except(id, 6), 1);
    let closed = v.closed(Duration::from_secs(1)).await.unwrap();
    assert_eq!(closed.code, Some(4001));
    assert_eq!(closed.reason, "revoked: the lease changed hands");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(h.gateway.registry.list(id).len(), 1, "the view stays");
}

#[tokio::test]
async fn a_view_capability_cannot_send_input() {
    let h = Harness::new(1, None).await;
    let grant = h.mint(h.id(0), "view", 60000).await;
    let mut v = h.viewer(&grant).await;
    assert_eq!(v.protocol.as_deref(), Some("binary"));
    let (input, marker) = input_then_marker();
    let encodings = set_encodings(&[0, -223]);
    v.send(&encodings).await.unwrap();
    // In pieces that split messages, as a network would.
    let mut all = input.clone();
    all.extend_from_slice(&marker);
    for piece in all.chunks(5) {
        v.send(piece).await.unwrap();
    }
    let fake = h.fake(0);
    fake.wait_for(0, Duration::from_secs(5), |c| c.received.ends_with(&marker))
        .await
        .unwrap();
    let conn = fake.connection(0).unwrap();
    let conn = conn.lock().unwrap();
    let mut expected = vec![1u8, 1];
    expected.extend_from_slice(&encodings);
    expected.extend_from_slice(&marker);
    assert_eq!(
        conn.received, expected,
        "the desktop got only the handshake, the encodings and the update request"
    );
    assert_eq!(conn.version, b"RFB 003.008\n");
}

#[tokio::test]
async fn a_control_capability_passes_input_and_the_token_may_come_as_a_query() {
    let h = Harness::new(1, None).await;
    let grant = h.mint(h.id(0), "control", 60000).await;
    let mut v = RfbViewer::connect(&h.ws_url(&grant), &grant.token, TokenIn::Query)
        .await
        .unwrap();
    v.handshake().await.unwrap();
    let (input, marker) = input_then_marker();
    let mut all = input.clone();
    all.extend_from_slice(&marker);
    for piece in all.chunks(7) {
        v.send(piece).await.unwrap();
    }
    let fake = h.fake(0);
    fake.wait_for(0, Duration::from_secs(5), |c| c.received.ends_with(&marker))
        .await
        .unwrap();
    let conn = fake.connection(0).unwrap();
    let mut expected = vec![1u8, 1];
    expected.extend_from_slice(&all);
    assert_eq!(conn.lock().unwrap().received, expected);
}

#[tokio::test]
async fn tokens_are_bound_to_their_screen_and_the_bearer_is_not_accepted() {
    let h = Harness::new(2, None).await;
    let a = h.mint(h.id(0), "control", 60000).await;
    let b = h.mint(h.id(1), "view", 60000).await;
    // A's token on B's screen.
    let err = RfbViewer::connect(&h.ws_url(&b), &a.token, TokenIn::Subprotocol)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
    // No screen token, only a bearer (header and subprotocol).
    let mut req = h.ws_url(&b).into_client_request().unwrap();
    req.headers_mut().insert(
        "Authorization",
        HeaderValue::from_str(&format!("Bearer {}", b.token)).unwrap(),
    );
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_str(&format!("binary, dormouse.bearer.{}", b.token)).unwrap(),
    );
    let err = RfbViewer::open(req).await.unwrap_err();
    assert!(
        err.to_string().contains("401") && err.to_string().contains("screen_token_required"),
        "{err}"
    );
    // A plain GET with a good token is told it is a WebSocket.
    let resp = h
        .http
        .get(format!("{}{}?token={}", h.base, b.websocket, b.token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(h.fake(1).accepted(), 0, "nothing reached B's desktop");
}

#[tokio::test]
async fn malformed_handshakes_and_garbage_close_with_4003() {
    let h = Harness::new(1, None).await;
    let grant = h.mint(h.id(0), "view", 60000).await;

    let mut v = RfbViewer::connect(&h.ws_url(&grant), &grant.token, TokenIn::Subprotocol)
        .await
        .unwrap();
    v.read_exact(12).await.unwrap();
    v.send(b"RFB 003.889\n").await.unwrap();
    let closed = v.closed(Duration::from_secs(2)).await.unwrap();
    assert_eq!(closed.code, Some(4003));
    assert!(closed.reason.contains("version"), "{}", closed.reason);

    let mut v = RfbViewer::connect(&h.ws_url(&grant), &grant.token, TokenIn::Subprotocol)
        .await
        .unwrap();
    v.send_text("hello").await.unwrap();
    assert_eq!(
        v.closed(Duration::from_secs(2)).await.unwrap().code,
        Some(4003)
    );

    // 10 MiB of garbage after a good handshake, in 64 KiB messages.
    let mut v = h.viewer(&grant).await;
    let junk = vec![0xA5u8; 64 * 1024];
    let started = Instant::now();
    let mut sent = 0usize;
    while sent < 10 * 1024 * 1024 {
        if v.send(&junk).await.is_err() {
            break;
        }
        sent += junk.len();
    }
    let closed = v.closed(Duration::from_secs(5)).await.unwrap();
    assert_eq!(closed.code, Some(4003), "{closed:?}");
    let fake = h.fake(0);
    let conn = fake.connection(2).unwrap();
    h.fake(0)
        .wait_for(2, Duration::from_secs(2), |c| c.closed)
        .await
        .unwrap();
    assert_eq!(
        conn.lock().unwrap().received,
        vec![1, 1],
        "not one byte of garbage reached the desktop"
    );
    eprintln!(
        "garbage: {sent} bytes sent before the close, closed after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn revocation_closes_open_connections_within_a_second() {
    let h = Harness::new(1, Some(Duration::from_millis(50))).await;
    let id = h.id(0);
    let g1 = h.mint(id, "view", 60000).await;
    let g2 = h.mint(id, "control", 60000).await;
    let mut v1 = h.viewer(&g1).await;
    let mut v2 = h.viewer(&g2).await;
    v1.read_update().await.unwrap();

    // DELETE one.
    let started = Instant::now();
    let resp = h
        .http
        .delete(format!("{}/v1/screens/{}", h.base, g1.screen_id))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let closed = v1.closed(Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        (closed.code, closed.reason.as_str()),
        (Some(4001), "revoked: capability deleted")
    );
    eprintln!("DELETE closed the viewer in {:?}", started.elapsed());

    // The desktop stops: everything of the computer goes.
    let started = Instant::now();
    assert_eq!(h.gateway.registry.revoke_all(id, RevokeReason::Stopped), 1);
    let closed = v2.closed(Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        (closed.code, closed.reason.as_str()),
        (Some(4001), "revoked: desktop stopped")
    );
    eprintln!("a stop closed the viewer in {:?}", started.elapsed());
    let err = RfbViewer::connect(&h.ws_url(&g2), &g2.token, TokenIn::Subprotocol)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
    // The desktop side of both connections is closed too.
    for i in 0..2 {
        h.fake(0)
            .wait_for(i, Duration::from_secs(1), |c| c.closed)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn expiry_closes_with_4002() {
    let h = Harness::new(1, None).await;
    let grant = h.mint(h.id(0), "view", 1000).await;
    let mut v = h.viewer(&grant).await;
    let closed = v.closed(Duration::from_secs(3)).await.unwrap();
    assert_eq!(
        (closed.code, closed.reason.as_str()),
        (Some(4002), "expired")
    );
    assert!(h.gateway.registry.list(h.id(0)).is_empty());
}

#[tokio::test]
async fn a_shutdown_closes_with_1001() {
    let h = Harness::new(1, None).await;
    let grant = h.mint(h.id(0), "view", 60000).await;
    let mut v = h.viewer(&grant).await;
    h.gateway.shutdown.cancel();
    let closed = v.closed(Duration::from_secs(1)).await.unwrap();
    assert_eq!(closed.code, Some(1001));
}

#[tokio::test]
async fn twenty_viewers_one_never_reading_the_others_keep_receiving() {
    // Each connection gets a 12 KiB update every 5 ms (~2.4 MB/s).
    let h = Harness::new(1, Some(Duration::from_millis(5))).await;
    let id = h.id(0);
    let grant = h.mint(id, "view", 60000).await;
    let mut stalled = h.viewer(&grant).await;
    // The stalled viewer asked for nothing more and never reads again.
    stalled
        .send(&update_request(true, 0, 0, 1, 1))
        .await
        .unwrap();
    let mut viewers = Vec::new();
    for _ in 0..19 {
        viewers.push(h.viewer(&grant).await);
    }
    let readers: Vec<_> = viewers
        .into_iter()
        .map(|mut v| {
            tokio::spawn(async move {
                let started = Instant::now();
                let mut updates = 0u32;
                while started.elapsed() < Duration::from_secs(4) {
                    let rects = v.read_update().await.unwrap();
                    assert_eq!(rects.len(), 1);
                    updates += 1;
                }
                (updates, v)
            })
        })
        .collect();
    let mut counts = Vec::new();
    let mut alive = Vec::new();
    for r in readers {
        let (n, v) = r.await.unwrap();
        counts.push(n);
        alive.push(v);
    }
    // The never-reading viewer was dropped by the gateway (its VNC
    // connection closed) while the others kept going.
    h.fake(0)
        .wait_for(0, Duration::from_secs(15), |c| c.closed)
        .await
        .unwrap();
    let still_open = (1..20)
        .filter(|i| !h.fake(0).connection(*i).unwrap().lock().unwrap().closed)
        .count();
    eprintln!("updates per reading viewer in 4 s: {counts:?}; still open: {still_open}");
    assert!(
        counts.iter().all(|c| *c >= 100),
        "every reading viewer kept receiving: {counts:?}"
    );
    assert_eq!(still_open, 19);
    drop((stalled, alive));
}

/// The desktop's clipboard, a bell, an empty update and then a message type
/// no RFB server sends.
fn desktop_says() -> (Vec<u8>, Vec<u8>) {
    let mut said = vec![3, 0, 0, 0];
    said.extend_from_slice(&11u32.to_be_bytes());
    said.extend_from_slice(b"desk-secret");
    let framed = vec![2, 0, 0, 0, 0];
    said.extend_from_slice(&framed);
    said.push(77);
    (said, framed)
}

#[tokio::test]
async fn view_never_gets_the_desktops_clipboard_and_unframeable_rfb_closes_with_4007() {
    let (said, framed) = desktop_says();
    let h = Harness::saying(1, None, said.clone()).await;
    let view = h.mint(h.id(0), "view", 60000).await;
    let control = h.mint(h.id(0), "control", 60000).await;

    let mut v = h.viewer(&view).await;
    // Everything framed before the unknown type arrives, the clipboard cut.
    assert_eq!(v.read_exact(framed.len()).await.unwrap(), framed);
    let closed = v.closed(Duration::from_secs(5)).await.unwrap();
    assert_eq!(closed.code, Some(4007), "{closed:?}");
    assert_eq!(
        closed.reason,
        "the desktop's rfb refused: unknown server message type 77"
    );

    // Control's server side is not parsed: it gets every byte as sent.
    let mut c = h.viewer(&control).await;
    assert_eq!(c.read_exact(said.len()).await.unwrap(), said);
    c.close().await;

    // A view's SetEncodings reaches the desktop rewritten.
    let h = Harness::new(1, None).await;
    let view = h.mint(h.id(0), "view", 60000).await;
    let mut v = h.viewer(&view).await;
    v.send(&set_encodings(&[
        7,
        16,
        5,
        -239,
        i32::from_be_bytes(0xC0A1_E5CE_u32.to_be_bytes()),
        0,
    ]))
    .await
    .unwrap();
    let want = set_encodings(&[16, 5, -239, 0]);
    let fake = h.fake(0);
    fake.wait_for(0, Duration::from_secs(5), |c| c.received.ends_with(&want))
        .await
        .unwrap();
}
