//! The client's bounded reads against a server that sends more than asked
//! for: a file read within a bound (what MCP `read_file` does with 8 MiB)
//! stops at the first byte past it, or at once when the length says so,
//! and the server is not left producing the rest; error answers are read
//! only as far as the error needs. The sender counts every byte it made,
//! so "stopped" is measured, not assumed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use dormouse_client::{Client, Endpoint, Error, Fetched};
use futures_util::stream;
use uuid::Uuid;

/// What MCP `read_file` asks for.
const LIMIT: u64 = 8 * 1024 * 1024;
/// One chunk of the server's endless bodies.
const CHUNK: usize = 64 * 1024;
/// What the server may have made past the bound before the client's close
/// reached it: loopback socket buffers and hyper's, generously.
const SLACK: u64 = 24 * 1024 * 1024;

/// A server whose bodies are zeros made on demand, counted in `made`:
/// `…/files/endless` (chunked, no end), `…/files/long` (a `Content-Length`
/// of 4 GiB), `…/files/small` (1000 bytes), and `…/files/error` (a 500
/// with an endless body).
async fn server(made: Arc<AtomicU64>) -> SocketAddr {
    let app = axum::Router::new().fallback(move |request: Request<Body>| {
        let made = made.clone();
        async move {
            let zeros = move || {
                let made = made.clone();
                Body::from_stream(stream::repeat_with(move || {
                    made.fetch_add(CHUNK as u64, Ordering::Relaxed);
                    Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![0u8; CHUNK]))
                }))
            };
            let path = request.uri().path().to_owned();
            let octets = (header::CONTENT_TYPE, "application/octet-stream");
            if path.ends_with("/endless") {
                ([octets], zeros()).into_response()
            } else if path.ends_with("/long") {
                let mut r = ([octets], zeros()).into_response();
                r.headers_mut()
                    .insert(header::CONTENT_LENGTH, (4u64 << 30).into());
                r
            } else if path.ends_with("/small") {
                ([octets], vec![7u8; 1000]).into_response()
            } else {
                let mut r: Response = ([octets], zeros()).into_response();
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                r
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn client(addr: SocketAddr) -> Client {
    Client::builder(Endpoint::tcp(addr))
        .token("t")
        .build()
        .unwrap()
}

/// What the server made once it has had time to notice the close.
async fn settled(made: &AtomicU64) -> u64 {
    let mut last = made.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = made.load(Ordering::Relaxed);
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test]
async fn an_endless_file_is_refused_at_the_bound_and_the_sender_stops() {
    let made = Arc::new(AtomicU64::default());
    let api = client(server(made.clone()).await);
    let id = Uuid::new_v4();
    let e = api.fetch_within(id, "endless", LIMIT).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { limit: LIMIT, .. }), "{e:?}");
    assert!(e.to_string().contains("over the limit"), "{e}");
    let sent = settled(&made).await;
    eprintln!("endless body: the server made {sent} bytes before the refusal stopped it");
    assert!(
        sent > LIMIT,
        "the client read up to the bound first: {sent}"
    );
    assert!(
        sent < LIMIT + SLACK,
        "the server went on making bytes after the refusal: {sent}"
    );
}

#[tokio::test]
async fn a_length_over_the_bound_is_refused_before_the_body() {
    let made = Arc::new(AtomicU64::default());
    let api = client(server(made.clone()).await);
    let e = api
        .fetch_within(Uuid::new_v4(), "long", LIMIT)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
    let sent = settled(&made).await;
    eprintln!("a Content-Length of 4 GiB: the server made {sent} bytes");
    assert!(sent < SLACK, "{sent}");
}

#[tokio::test]
async fn a_file_within_the_bound_is_read_whole() {
    let made = Arc::new(AtomicU64::default());
    let api = client(server(made).await);
    let id = Uuid::new_v4();
    assert_eq!(
        api.fetch_within(id, "small", 1000).await.unwrap(),
        Fetched::File(vec![7; 1000])
    );
    assert!(matches!(
        api.fetch_within(id, "small", 999).await.unwrap_err(),
        Error::TooLarge { limit: 999, .. }
    ));
    assert_eq!(
        api.fetch(id, "small").await.unwrap(),
        Fetched::File(vec![7; 1000])
    );
}

#[tokio::test]
async fn an_endless_error_body_is_read_only_as_far_as_the_error_needs() {
    let made = Arc::new(AtomicU64::default());
    let api = client(server(made.clone()).await);
    let e = api.fetch(Uuid::new_v4(), "error").await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::INTERNAL_SERVER_ERROR), "{e:?}");
    // Every other route's answers go through the same bound.
    let e = api.list().await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::INTERNAL_SERVER_ERROR), "{e:?}");
    let sent = settled(&made).await;
    eprintln!("two endless error bodies: the server made {sent} bytes");
    assert!(sent < 2 * SLACK, "{sent}");
}
