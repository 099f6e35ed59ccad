//! `dormouse-client` against the API router over a scripted core, on a real
//! loopback socket and on a unix socket: every route's method, the fencing
//! header, the typed errors, and the event stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::time::Duration;

use api_support::{Harness, TOKEN};
use dormouse_client::{Client, Endpoint, Error, StatusCode};
use dormouse_protocol::api::{
    BrokerEvent, ContainerState, CreateComputer, LeaseRequest, PatchComputer,
};
use dormouse_protocol::image::{ImageEncoding, ImageFormat};

/// Serves the harness's router on a fresh loopback port.
async fn serve_tcp(h: &Harness) -> Endpoint {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    let router = h.router();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Endpoint::tcp(addr)
}

/// Serves the harness's router on a unix socket in `dir`.
async fn serve_unix(h: &Harness, dir: &std::path::Path) -> Endpoint {
    let path = dir.join("api.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind unix socket");
    let router = h.router();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("unix:{}", path.display())
        .parse()
        .expect("a unix endpoint")
}

/// Every route, one call each, as a frontend would make them.
// Over 100 lines on purpose: one call per route, in the order of the
// route table, so a route missing here is easy to see.
async fn every_route(h: &Harness, endpoint: Endpoint) {
    let anonymous = Client::builder(endpoint.clone())
        .build()
        .expect("client without a token");
    anonymous.healthz().await.expect("healthz needs no token");
    let refused = anonymous.list().await.expect_err("no token, no list");
    assert_eq!(refused.status(), Some(StatusCode::UNAUTHORIZED));
    assert_eq!(refused.code(), Some("unauthorized"));

    let api = Client::new(endpoint, TOKEN).expect("client");
    assert!(api.healthy().await);
    assert!(api
        .metrics()
        .await
        .expect("metrics")
        .contains("dormouse_desktops"));
    let openapi = api.openapi().await.expect("openapi");
    assert!(openapi["paths"]["/v1/computers"].is_object());
    assert!(api.orphans().await.expect("orphans").is_empty());

    // Subscribe first, so the create below is seen.
    let mut events = api.events().await.expect("events");
    let created = api
        .create(&CreateComputer {
            name: Some("one".into()),
            ..CreateComputer::default()
        })
        .await
        .expect("create");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("the create is pushed")
            .expect("event stream")
            .expect("still open");
        if matches!(&event, BrokerEvent::Status { computer } if computer.id == created.id) {
            break;
        }
    }
    assert_eq!(api.get(created.id).await.expect("get").name, "one");
    assert!(api
        .list()
        .await
        .expect("list")
        .iter()
        .any(|c| c.id == created.id));
    let patched = api
        .patch(
            created.id,
            &PatchComputer {
                idle_timeout_ms: Some(60_000),
            },
        )
        .await
        .expect("patch");
    assert_eq!(patched.idle.expect("idle").timeout_ms, 60_000);
    assert_eq!(
        api.screenshot(created.id).await.expect("screenshot"),
        api_support::PNG
    );
    let jpeg = ImageEncoding::new(Some(ImageFormat::Jpeg), Some(30)).expect("an encoding");
    assert_eq!(
        api.screenshot_as(created.id, jpeg)
            .await
            .expect("a jpeg screenshot"),
        (
            api_support::image_of(ImageFormat::Jpeg).to_vec(),
            "image/jpeg".to_owned()
        )
    );
    api.touch(created.id).await.expect("touch");
    let stopped = api.stop(created.id).await.expect("stop");
    assert_eq!(stopped.container, ContainerState::Stopped);

    // Fencing: the generation goes with mutating calls, a stale one is
    // refused with the API's code.
    let grant = api
        .lease(
            created.id,
            &LeaseRequest {
                holder: "ctl".into(),
                ttl_ms: 30_000,
            },
        )
        .await
        .expect("lease");
    let stale = api.with_generation(Some(grant.generation - 1));
    match stale.start(created.id).await.expect_err("stale generation") {
        Error::Api {
            status, code, path, ..
        } => {
            assert_eq!(status, StatusCode::CONFLICT);
            assert_eq!(code, "stale_generation");
            assert_eq!(path, format!("/v1/computers/{}/start", created.id));
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    let fenced = api.with_generation(Some(grant.generation));
    fenced.start(created.id).await.expect("fenced start");

    fenced.remove(created.id, true).await.expect("remove");
    let gone = api.get(created.id).await.expect_err("removed");
    assert_eq!(gone.status(), Some(StatusCode::NOT_FOUND));
    assert_eq!(gone.code(), Some("not_found"));
    let calls = h.calls();
    assert!(
        calls.contains(&format!("remove {}", created.id)),
        "{calls:?}"
    );
}

#[tokio::test]
async fn every_route_over_tcp() {
    let h = Harness::new();
    let endpoint = serve_tcp(&h).await;
    every_route(&h, endpoint).await;
}

#[tokio::test]
async fn every_route_over_a_unix_socket() {
    let h = Harness::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let endpoint = serve_unix(&h, dir.path()).await;
    every_route(&h, endpoint).await;
}

#[tokio::test]
async fn the_stream_ends_when_the_broker_shuts_down() {
    let h = Harness::new();
    h.add("a", true);
    let endpoint = serve_tcp(&h).await;
    let api = Client::new(endpoint, TOKEN).expect("client");
    let mut events = api.events().await.expect("events");
    let first = events.next().await.expect("snapshot").expect("open");
    assert!(matches!(first, BrokerEvent::Status { .. }));
    assert!(events.next_buffered().expect("nothing broken").is_none());
    h.state.shutdown.cancel();
    let end = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the close arrives");
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert!(!events.is_open());
}

#[tokio::test]
async fn transport_and_contract_failures_are_typed() {
    // Nothing listens on port 9 (discard) on a test machine.
    let api = Client::new("http://127.0.0.1:9".parse().expect("endpoint"), TOKEN).expect("client");
    let err = api.list().await.expect_err("nobody there");
    assert!(err.is_transport(), "{err:?}");
    assert_eq!(err.status(), None);
    assert!(api.events().await.is_err());

    // A server that is not the broker: an error status without the API's
    // body, and a success whose body is not the contract.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Its fallback answers 502 with the fencing header it got, if any.
    let app = axum::Router::new()
        .route("/v1/computers", axum::routing::get(|| async { "not json" }))
        .fallback(|headers: axum::http::HeaderMap| async move {
            let generation = headers
                .get("dormouse-generation")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("upstream down")
                .to_owned();
            (axum::http::StatusCode::BAD_GATEWAY, generation)
        });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let api = Client::new(Endpoint::tcp(addr), TOKEN).expect("client");
    match api.list().await.expect_err("not the contract") {
        Error::Decode { path, .. } => assert_eq!(path, "/v1/computers"),
        other => panic!("expected a decode error, got {other:?}"),
    }
    match api.orphans().await.expect_err("no API error body") {
        Error::UnexpectedStatus { status, body, .. } => {
            assert_eq!(status, StatusCode::BAD_GATEWAY);
            assert_eq!(body, "upstream down");
        }
        other => panic!("expected an unexpected status, got {other:?}"),
    }
}

/// The body of the `UnexpectedStatus` a fake server answered with.
fn body_of(err: Error) -> String {
    match err {
        Error::UnexpectedStatus { body, .. } => body,
        other => panic!("expected an unexpected status, got {other:?}"),
    }
}

#[tokio::test]
async fn the_generation_goes_with_every_call_but_reads() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let generation = headers
            .get("dormouse-generation")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        (axum::http::StatusCode::BAD_GATEWAY, generation)
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let api = Client::builder(Endpoint::tcp(addr))
        .token(TOKEN)
        .generation(Some(7))
        .build()
        .expect("client");
    let id = uuid::Uuid::new_v4();
    assert_eq!(body_of(api.get(id).await.expect_err("502")), "none");
    assert_eq!(body_of(api.list().await.expect_err("502")), "none");
    assert_eq!(body_of(api.stop(id).await.expect_err("502")), "7");
    assert_eq!(body_of(api.touch(id).await.expect_err("502")), "7");
    assert_eq!(body_of(api.remove(id, false).await.expect_err("502")), "7");
    let unfenced = api.with_generation(None);
    assert_eq!(body_of(unfenced.stop(id).await.expect_err("502")), "none");
}

/// What the upload route below saw: the bytes it had when it first looked
/// back, and the `Content-Length` the client sent.
type Seen = tokio::sync::mpsc::UnboundedSender<(usize, Option<String>)>;

/// A stand-in for the broker's upload routes: reports how much of the body
/// arrived once `first` bytes did (or the body ended), reads the rest and
/// answers as the broker would.
async fn upload_route(
    axum::extract::State((seen, first)): axum::extract::State<(Seen, usize)>,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use futures_util::StreamExt as _;
    let length = request
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .map(ToOwned::to_owned);
    let workspace = request.uri().path().ends_with("/workspace");
    let mut body = request.into_body().into_data_stream();
    let mut n = 0usize;
    let mut reported = false;
    while let Some(chunk) = body.next().await {
        n += chunk.expect("body").len();
        if n >= first && !reported {
            reported = true;
            let _ = seen.send((n, length.clone()));
        }
    }
    if !reported {
        let _ = seen.send((n, length));
    }
    let bytes = u64::try_from(n).unwrap();
    if workspace {
        axum::Json(serde_json::json!({"files": 1, "dirs": 0, "bytes": bytes})).into_response()
    } else {
        axum::Json(serde_json::json!({"bytes": bytes, "created": true})).into_response()
    }
}

/// Uploads stream: the server holds the first MiB of an import while the
/// reader it comes from has not ended (a client that buffered the body
/// would send nothing yet), and a file goes with its size as
/// `Content-Length`.
#[tokio::test]
async fn uploads_stream_from_readers_and_files() {
    use tokio::io::AsyncWriteExt as _;
    const FIRST: usize = 1 << 20;
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let router = axum::Router::new()
        .route(
            "/v1/computers/{id}/workspace",
            axum::routing::put(upload_route),
        )
        .route(
            "/v1/computers/{id}/files/{*path}",
            axum::routing::put(upload_route),
        )
        .with_state((seen_tx, FIRST));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let api = Client::new(Endpoint::tcp(addr), TOKEN).unwrap();
    let id = uuid::Uuid::new_v4();

    let (mut writer, reader) = tokio::io::duplex(64 * 1024);
    let upload = tokio::spawn({
        let api = api.clone();
        async move {
            api.import(id, dormouse_client::Upload::reader(reader))
                .await
        }
    });
    writer.write_all(&vec![7u8; FIRST]).await.unwrap();
    let (arrived, length) = tokio::time::timeout(Duration::from_secs(20), seen.recv())
        .await
        .expect("the first MiB arrived while the reader was still open")
        .unwrap();
    assert!(arrived >= FIRST, "{arrived}");
    assert_eq!(length, None, "a reader's length is unknown: chunked");
    writer.write_all(&vec![8u8; 3 * FIRST]).await.unwrap();
    drop(writer);
    let imported = upload.await.unwrap().expect("import");
    assert_eq!(imported.bytes, 4 * u64::try_from(FIRST).unwrap());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.bin");
    std::fs::write(&file, vec![1u8; 300_000]).unwrap();
    let written = api
        .write_file(
            id,
            "inbox/report.bin",
            dormouse_client::Upload::file(&file).await.unwrap(),
            true,
        )
        .await
        .expect("write");
    assert_eq!(written.bytes, 300_000);
    let (_, length) = seen.recv().await.unwrap();
    assert_eq!(length.as_deref(), Some("300000"));
    assert!(dormouse_client::Upload::file(dir.path().join("missing"))
        .await
        .is_err());
}
