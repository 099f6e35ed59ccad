//! The exec routes of the API router against a scripted broker core: a bad
//! body or query is refused before anything is asked of the core, an
//! unknown computer is 404, one that is not running and ready 409, and the
//! body bound is the exec route's own (larger than the API's default).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use api_support::{Harness, TOKEN};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use uuid::Uuid;

async fn post(h: &Harness, uri: &str, body: impl Into<Body>) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(body.into())
        .unwrap();
    let response = h.router().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<none>")
}

#[tokio::test]
async fn bad_exec_requests_never_reach_the_core() {
    let h = Harness::new();
    let id = h.add("desk", true);
    let uri = format!("/v1/computers/{id}/exec");
    for (body, what) in [
        (r#"{}"#, "no command"),
        (r#"{"argv": ["a"], "command": "b"}"#, "both"),
        (r#"{"argv": []}"#, "empty argv"),
        (r#"{"command": "x", "timeout_ms": 0}"#, "zero timeout"),
        (
            r#"{"command": "x", "max_output_bytes": 999999999}"#,
            "huge cap",
        ),
        (r#"{"command": "x", "stdin": "***"}"#, "bad base64"),
        (r#"{"command": "x", "nope": 1}"#, "unknown field"),
        ("not json", "garbage"),
    ] {
        let (status, v) = post(&h, &uri, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {v}");
        assert_eq!(code(&v), "bad_request", "{what}");
    }
    let (status, _) = post(&h, &format!("{uri}?encoding=hex"), r#"{"command": "x"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        !h.calls().iter().any(|c| c.starts_with("admit_exec")),
        "a refused request reached the core: {:?}",
        h.calls()
    );
}

#[tokio::test]
async fn exec_needs_a_known_ready_computer() {
    let h = Harness::new();
    let (status, v) = post(
        &h,
        &format!("/v1/computers/{}/exec", Uuid::new_v4()),
        r#"{"argv": ["true"]}"#,
    )
    .await;
    assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let stopped = h.add("stopped", false);
    let (status, v) = post(
        &h,
        &format!("/v1/computers/{stopped}/exec"),
        r#"{"argv": ["true"]}"#,
    )
    .await;
    assert_eq!((status, code(&v)), (StatusCode::CONFLICT, "wrong_state"));
    // Admitted, but no guest answers behind the scripted core: 502.
    let running = h.add("running", true);
    let (status, v) = post(
        &h,
        &format!("/v1/computers/{running}/exec"),
        r#"{"argv": ["true"]}"#,
    )
    .await;
    assert_eq!(
        (status, code(&v)),
        (StatusCode::BAD_GATEWAY, "guest"),
        "{v}"
    );
}

#[tokio::test]
async fn the_exec_body_may_carry_megabytes_of_stdin() {
    let h = Harness::new();
    let id = h.add("desk", true);
    let uri = format!("/v1/computers/{id}/exec");
    // 1 MiB of stdin: past the API's 64 KiB default, within the route's bound.
    let stdin = "A".repeat(1024 * 1024 / 3 * 4);
    let body = format!(r#"{{"command": "wc -c", "stdin": "{stdin}"}}"#);
    let (status, v) = post(&h, &uri, body).await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "reached the guest call: {v}"
    );
    // Past the route's bound: 413.
    let huge = "A".repeat(13 * 1024 * 1024);
    let (status, v) = post(
        &h,
        &uri,
        format!(r#"{{"command": "x", "stdin": "{huge}"}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
}

/// The terminal route is a WebSocket: a plain GET, or a handshake it
/// cannot take (a WebSocket version other than 13), is answered in the
/// API's own error shape (JSON, `websocket_required`), as `/v1/events` is,
/// and opens nothing. Before, axum's plain-text rejection came back, a
/// content type the OpenAPI document did not name.
#[tokio::test]
async fn a_terminal_request_that_is_no_websocket_gets_a_json_400() {
    let h = Harness::new();
    let id = h.add("desk", true);
    let uri = format!("/v1/computers/{id}/exec/ws");
    let plain = Request::get(&uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let old_version = Request::get(&uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "8")
        .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Body::empty())
        .unwrap();
    for (request, what) in [(plain, "plain GET"), (old_version, "version 8")] {
        let response = h.router().oneshot(request).await.unwrap();
        let status = response.status();
        let kind = response.headers()[header::CONTENT_TYPE].clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {v}");
        assert_eq!(kind, "application/json", "{what}");
        assert_eq!(code(&v), "websocket_required", "{what}: {v}");
    }
    assert!(
        !h.calls()
            .iter()
            .any(|c| c.contains("terminal") || c.contains("pty")),
        "a refused request reached the core: {:?}",
        h.calls()
    );
}
