//! The API router over the real broker core and the real engine: a desktop
//! created through `POST /v1/computers` becomes ready, every class of bad
//! request gets its error and leaves the desktop exactly as it was (the
//! engine saw no event for it), the screenshot is a PNG, and stop/start over
//! HTTP resume the same container (the engine saw `stop`/`start` only).

#![allow(clippy::unwrap_used)]

mod engine_support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use dormouse_broker::api::{self, ApiState, ApiToken};
use dormouse_broker::docker::{DockerBackend, DockerEngine};
use dormouse_broker::metrics::Metrics;
use dormouse_broker::owner;
use dormouse_e2e::{desktop_image, docker_available, TempDir};
use dormouse_protocol::api::GENERATION_HEADER;
use engine_support::{broker_config, engine_events, engine_now, RunGuard};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

const TOKEN: &str = "real-engine-test-token-0123456789abcdef0123456789";

/// A bound on hangs, not a speed claim.
const READY_BOUND: Duration = Duration::from_secs(180);

async fn call(
    router: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, Value, Vec<u8>) {
    call_with(router, method, uri, body, None).await
}

async fn call_with(
    router: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<&str>,
    generation: Option<&str>,
) -> (StatusCode, Value, Vec<u8>) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    if let Some(g) = generation {
        request = request.header(GENERATION_HEADER, g);
    }
    let request = request
        .body(body.map(|b| Body::from(b.to_owned())).unwrap_or_default())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, json, bytes)
}

async fn wait_until(
    router: &axum::Router,
    id: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + READY_BOUND;
    loop {
        let (status, json, _) =
            call(router, Method::GET, &format!("/v1/computers/{id}"), None).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        if check(&json) {
            return json;
        }
        assert!(tokio::time::Instant::now() < deadline, "not {what}: {json}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A refused request: method, path, body, `Dormouse-Generation`, the status
/// and error code it must get.
type BadRequest = (
    Method,
    String,
    Option<String>,
    Option<&'static str>,
    StatusCode,
    &'static str,
);

/// What must not change when a request is refused.
fn fingerprint(status: &Value) -> Value {
    serde_json::json!({
        "container": status["container"],
        "ready": status["ready"],
        "generation": status["generation"],
        "stop_reason": status["stop_reason"],
        "timeout_ms": status["idle"]["timeout_ms"],
        "image_id": status["image_id"],
        "name": status["name"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// act, witness, clean up); its steps share the desktop and the witnesses,
// and apart the order a reader must check would be spread over helpers.
async fn bad_requests_change_nothing_on_a_real_desktop() {
    let test = "bad_requests_change_nothing_on_a_real_desktop";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    engine_support::log();
    let guard = RunGuard::new("dm-api");
    let data = TempDir::new("dm-api");
    let config = broker_config(&data.path().join("state"), &image, &guard);
    let engine = DockerEngine::connect().await.unwrap();
    let backend = Arc::new(DockerBackend::for_broker(Arc::new(engine), &config));
    let (broker, _core) = owner::spawn_backend(config, backend, Arc::new(Metrics::default()))
        .await
        .unwrap();
    let router = api::router(ApiState::new(
        broker,
        Arc::new(Metrics::default()),
        ApiToken::new(TOKEN),
    ));

    let (status, created, _) = call(
        &router,
        Method::POST,
        "/v1/computers",
        Some(r#"{"name":"api-real"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let ready = wait_until(&router, &id, "ready", |s| s["ready"] == true).await;
    let before = fingerprint(&ready);

    let (status, _, png) = call(
        &router,
        Method::GET,
        &format!("/v1/computers/{id}/screenshot"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");

    // Every class of bad input, against the live desktop.
    let since = engine_now();
    let big = format!(
        r#"{{"idle_timeout_ms": 5000, "pad": "{}"}}"#,
        "x".repeat(100 * 1024)
    );
    let cases: Vec<BadRequest> = vec![
        (
            Method::PATCH,
            format!("/v1/computers/{id}"),
            Some("{".into()),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::PATCH,
            format!("/v1/computers/{id}"),
            Some(r#"{"idle_timeout_ms":5000,"x":1}"#.into()),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::PATCH,
            format!("/v1/computers/{id}"),
            Some(r#"{"idle_timeout_ms":10}"#.into()),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::PATCH,
            format!("/v1/computers/{id}"),
            Some(big),
            None,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            Method::POST,
            format!("/v1/computers/{id}/stop"),
            None,
            Some("soon"),
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::POST,
            "/v1/computers/not-a-uuid/stop".into(),
            None,
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::DELETE,
            format!("/v1/computers/{id}?purge=perhaps"),
            None,
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::POST,
            format!("/v1/computers/{id}/lease"),
            Some(r#"{"holder":"a"}"#.into()),
            None,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            Method::POST,
            format!("/v1/computers/{id}/start"),
            None,
            None,
            StatusCode::CONFLICT,
            "wrong_state",
        ),
        (
            Method::POST,
            "/v1/computers/67e55044-10b1-426f-9247-bb680e5fe0c8/stop".into(),
            None,
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    for (method, uri, body, generation, want, code) in cases {
        let (status, json, _) =
            call_with(&router, method.clone(), &uri, body.as_deref(), generation).await;
        assert_eq!(status, want, "{method} {uri}: {json}");
        assert_eq!(json["error"]["code"], code, "{method} {uri}: {json}");
        let now = call(&router, Method::GET, &format!("/v1/computers/{id}"), None)
            .await
            .1;
        assert_eq!(
            fingerprint(&now),
            before,
            "{method} {uri} changed the desktop"
        );
    }
    // A lease makes older generations stale; a stale stop changes nothing.
    let (status, grant, _) = call(
        &router,
        Method::POST,
        &format!("/v1/computers/{id}/lease"),
        Some(r#"{"holder":"t","ttl_ms":600000}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let generation = grant["generation"].as_u64().unwrap();
    let stale = (generation - 1).to_string();
    let (status, json, _) = call_with(
        &router,
        Method::POST,
        &format!("/v1/computers/{id}/stop"),
        None,
        Some(&stale),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{json}");
    assert_eq!(json["error"]["code"], "stale_generation");
    let now = call(&router, Method::GET, &format!("/v1/computers/{id}"), None)
        .await
        .1;
    assert_eq!(now["container"], "running");
    assert_eq!(now["ready"], true);
    let until = engine_now();
    let events = engine_events(&guard, &since, &until);
    assert!(
        events.is_empty(),
        "refused requests reached the engine: {events:?}"
    );

    // Stop and start over HTTP resume the same container.
    let current = generation.to_string();
    let since = engine_now();
    let (status, stopped, _) = call_with(
        &router,
        Method::POST,
        &format!("/v1/computers/{id}/stop"),
        None,
        Some(&current),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["container"], "stopped");
    assert_eq!(stopped["stop_reason"], "manual");
    let (status, started, _) = call_with(
        &router,
        Method::POST,
        &format!("/v1/computers/{id}/start"),
        None,
        Some(&current),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{started}");
    wait_until(&router, &id, "ready again", |s| s["ready"] == true).await;
    let until = engine_now();
    let actions: Vec<String> = engine_events(&guard, &since, &until)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert!(
        actions.iter().any(|a| a == "stop" || a == "die"),
        "{actions:?}"
    );
    assert!(actions.iter().any(|a| a == "start"), "{actions:?}");
    for forbidden in ["create", "destroy"] {
        assert!(
            !actions.iter().any(|a| a == forbidden),
            "the engine saw {forbidden}: {actions:?}"
        );
    }

    let (status, _, _) = call_with(
        &router,
        Method::DELETE,
        &format!("/v1/computers/{id}?purge=true"),
        None,
        Some(&current),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}
