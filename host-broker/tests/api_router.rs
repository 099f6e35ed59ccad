//! In-process tests of the API router against a scripted broker core
//! (`tower::ServiceExt::oneshot`, through `api_support::call`): authentication, every class of bad input
//! (and that it reaches no command), error codes, and the OpenAPI document.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use std::collections::BTreeSet;

use api_support::{call, empty, req, with_json, Harness, PNG, TOKEN};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use dormouse_broker::api::{route_table, Access, OPENAPI_JSON};
use dormouse_broker::engine::EngineError;
use dormouse_broker::error::BrokerError;
use dormouse_protocol::api::{ContainerState, GENERATION_HEADER};
use serde_json::{json, Value};
use uuid::Uuid;

/// Asserts a request was refused with `status`/`code` before reaching the core.
async fn refused(h: &Harness, request: Request<Body>, status: StatusCode, code: &str) {
    let before = h.computers();
    let answer = call(h, request).await;
    assert_eq!(
        answer.status,
        status,
        "body: {}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.code(), code);
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "an error has a message"
    );
    assert_eq!(
        h.calls(),
        Vec::<String>::new(),
        "a bad request reached the core"
    );
    assert_eq!(h.computers(), before, "a bad request changed state");
}

fn concrete(path: &str, id: Uuid) -> String {
    path.replace("{id}", &id.to_string())
}

#[tokio::test]
async fn every_route_but_healthz_and_panel_needs_the_token() {
    let h = Harness::new();
    let id = h.add("a", true);
    for route in route_table() {
        let uri = concrete(route.path, id);
        let anonymous = Request::builder()
            .method(route.method.clone())
            .uri(&uri)
            .body(Body::empty())
            .expect("request");
        let answer = call(&h, anonymous).await;
        match route.access {
            // The screen's RFB route takes only a screen token, and noVNC and
            // xterm.js are not installed here: public, but not 200 without them.
            Access::Public
                if uri.starts_with("/v1/screens/")
                    || uri.starts_with("/novnc/")
                    || uri.starts_with("/xterm/") =>
            {
                assert_ne!(answer.code(), "unauthorized", "{uri}");
            }
            Access::Public => assert_eq!(answer.status, StatusCode::OK, "{uri}"),
            Access::Token => {
                assert_eq!(
                    answer.status,
                    StatusCode::UNAUTHORIZED,
                    "{} {uri}",
                    route.method
                );
                assert_eq!(answer.code(), "unauthorized");
                assert!(answer.headers.contains_key(header::WWW_AUTHENTICATE));
                let wrong = Request::builder()
                    .method(route.method.clone())
                    .uri(&uri)
                    .header(header::AUTHORIZATION, format!("Bearer {TOKEN}x"))
                    .body(Body::empty())
                    .expect("request");
                assert_eq!(call(&h, wrong).await.status, StatusCode::UNAUTHORIZED);
            }
        }
    }
    assert_eq!(h.calls(), Vec::<String>::new());
    let healthz = call(
        &h,
        Request::get("/healthz").body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(healthz.body, b"ok\n");
}

#[tokio::test]
async fn query_token_is_accepted_only_on_events() {
    let h = Harness::new();
    let anonymous = |uri: &str| Request::get(uri).body(Body::empty()).expect("request");
    let list = call(&h, anonymous(&format!("/v1/computers?token={TOKEN}"))).await;
    assert_eq!(list.status, StatusCode::UNAUTHORIZED);
    // Authorised, but not an upgrade: the token got it past authentication.
    let events = call(&h, anonymous(&format!("/v1/events?token={TOKEN}"))).await;
    assert_ne!(events.status, StatusCode::UNAUTHORIZED);
    assert_eq!(events.code(), "websocket_required");
    let wrong = call(&h, anonymous("/v1/events?token=nope")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_refused_request_with_a_body_says_the_connection_closes() {
    let h = Harness::new();
    let with_body = Request::post("/v1/computers")
        .header(header::AUTHORIZATION, "Bearer wrong")
        .header(header::CONTENT_LENGTH, "2")
        .body(Body::from("{}"))
        .expect("request");
    let refused = call(&h, with_body).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers[header::CONNECTION], "close");
    // Without a body the connection stays usable, and so does a success.
    let bare = Request::get("/v1/computers")
        .body(Body::empty())
        .expect("request");
    let refused = call(&h, bare).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert!(refused.headers.get(header::CONNECTION).is_none());
    let created = call(&h, with_json(Method::POST, "/v1/computers", "{}")).await;
    assert!(created.status.is_success(), "{}", created.status);
    assert!(created.headers.get(header::CONNECTION).is_none());
    assert!(
        h.calls().iter().filter(|c| c.starts_with("create")).count() == 1,
        "{:?}",
        h.calls()
    );
}

#[tokio::test]
async fn malformed_json_is_400_and_changes_nothing() {
    let h = Harness::new();
    let id = h.add("a", true);
    for body in ["{", "[]", "null", "{\"name\": 3}", "\u{0}"] {
        refused(
            &h,
            with_json(Method::POST, "/v1/computers", body),
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    let lease = format!("/v1/computers/{id}/lease");
    refused(
        &h,
        with_json(Method::POST, &lease, "{\"holder\":\"a\"}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        with_json(Method::POST, &lease, "{\"holder\":\"a\",\"ttl_ms\":-1}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        with_json(Method::POST, &lease, "{\"holder\":\"\",\"ttl_ms\":1000}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let patch = format!("/v1/computers/{id}");
    refused(
        &h,
        with_json(Method::PATCH, &patch, "{\"idle_timeout_ms\":\"soon\"}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        with_json(Method::PATCH, &patch, "{\"idle_timeout_ms\":999}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        with_json(Method::POST, "/v1/computers", "{\"name\":\"a\\nb\"}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let long = format!("{{\"name\":\"{}\"}}", "x".repeat(300));
    refused(
        &h,
        with_json(Method::POST, "/v1/computers", &long),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
}

#[tokio::test]
async fn unknown_fields_are_400() {
    let h = Harness::new();
    let id = h.add("a", true);
    refused(
        &h,
        with_json(Method::POST, "/v1/computers", "{\"nmae\":\"x\"}"),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        with_json(
            Method::POST,
            &format!("/v1/computers/{id}/lease"),
            "{\"holder\":\"a\",\"ttl_ms\":1000,\"force\":true}",
        ),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        with_json(
            Method::PATCH,
            &format!("/v1/computers/{id}"),
            "{\"idle\":5}",
        ),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        empty(Method::DELETE, &format!("/v1/computers/{id}?force=1")),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    refused(
        &h,
        empty(Method::DELETE, &format!("/v1/computers/{id}?purge=maybe")),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
}

#[tokio::test]
async fn bad_ids_are_400_before_anything_else() {
    let h = Harness::new();
    for bad in [
        "not-a-uuid",
        "..%2F..%2Fetc",
        "123",
        "67e55044-10b1-426f-9247-bb680e5fe0c",
    ] {
        for route in route_table().iter().filter(|r| r.path.contains("{id}")) {
            let uri = route.path.replace("{id}", bad);
            let request = if route.method == Method::POST || route.method == Method::PATCH {
                with_json(
                    route.method.clone(),
                    &uri,
                    "{\"holder\":\"a\",\"ttl_ms\":1}",
                )
            } else {
                empty(route.method.clone(), &uri)
            };
            refused(&h, request, StatusCode::BAD_REQUEST, "bad_request").await;
        }
    }
}

#[tokio::test]
async fn oversized_bodies_are_413_and_change_nothing() {
    let h = Harness::new();
    let id = h.add("a", true);
    let big = format!("{{\"name\":\"{}\"}}", "x".repeat(200 * 1024));
    refused(
        &h,
        with_json(Method::POST, "/v1/computers", &big),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    refused(
        &h,
        with_json(Method::PATCH, &format!("/v1/computers/{id}"), &big),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    // Without a Content-Length (a stream), the limit still holds.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..100).map(|_| Ok(vec![b' '; 4096])).collect();
    let streamed = req(Method::POST, "/v1/computers")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .expect("request");
    refused(
        &h,
        streamed,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
}

#[tokio::test]
async fn generation_header_must_be_a_number() {
    let h = Harness::new();
    let id = h.add("a", true);
    for bad in ["abc", "-1", "1.5", "", "99999999999999999999999"] {
        let request = req(Method::POST, &format!("/v1/computers/{id}/stop"))
            .header(GENERATION_HEADER, bad)
            .body(Body::empty())
            .expect("request");
        refused(&h, request, StatusCode::BAD_REQUEST, "bad_request").await;
    }
}

#[tokio::test]
async fn unknown_id_is_404() {
    let h = Harness::new();
    let id = Uuid::new_v4();
    let answer = call(&h, empty(Method::GET, &format!("/v1/computers/{id}"))).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.code(), "not_found");
    let answer = call(
        &h,
        empty(Method::POST, &format!("/v1/computers/{id}/start")),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let answer = call(&h, empty(Method::GET, "/v1/nothing")).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.code(), "no_route");
    let answer = call(&h, empty(Method::PUT, "/v1/computers")).await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.code(), "method_not_allowed");
}

#[tokio::test]
async fn stale_generation_is_409_and_changes_nothing() {
    let h = Harness::new();
    let id = h.add("a", true);
    let lease = call(
        &h,
        with_json(
            Method::POST,
            &format!("/v1/computers/{id}/lease"),
            "{\"holder\":\"ctl-1\",\"ttl_ms\":60000}",
        ),
    )
    .await;
    assert_eq!(lease.status, StatusCode::OK);
    let generation = lease.json()["generation"].as_u64().expect("generation");
    assert_eq!(generation, 2);
    let before = h.computers();
    let stale = req(Method::POST, &format!("/v1/computers/{id}/stop"))
        .header(GENERATION_HEADER, "1")
        .body(Body::empty())
        .expect("request");
    let answer = call(&h, stale).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(answer.code(), "stale_generation");
    assert_eq!(h.computers(), before);
    let current = req(Method::POST, &format!("/v1/computers/{id}/stop"))
        .header(GENERATION_HEADER, generation.to_string())
        .body(Body::empty())
        .expect("request");
    let answer = call(&h, current).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["container"], "stopped");
    assert_eq!(answer.json()["stop_reason"], "manual");
}

#[tokio::test]
async fn engine_unreachable_is_503() {
    let h = Harness::new();
    h.lock().fail_with = Some(BrokerError::Engine(EngineError::Unavailable(
        "connection refused".into(),
    )));
    let answer = call(&h, empty(Method::GET, "/v1/computers")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.code(), "engine_unavailable");
    // The API keeps serving.
    h.lock().fail_with = None;
    assert_eq!(
        call(&h, empty(Method::GET, "/v1/computers")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn happy_paths_answer_with_status_objects() {
    let h = Harness::new();
    let created = call(
        &h,
        with_json(
            Method::POST,
            "/v1/computers",
            "{\"name\":\"desk\",\"owner\":\"team-a\"}",
        ),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let id: Uuid = created.json()["id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("uuid");
    assert_eq!(created.json()["owner"], "team-a");
    // An empty body is an empty create request.
    let bare = call(&h, empty(Method::POST, "/v1/computers")).await;
    assert_eq!(bare.status, StatusCode::CREATED);

    let list = call(&h, empty(Method::GET, "/v1/computers")).await;
    assert_eq!(list.json().as_array().map(Vec::len), Some(2));

    let shot = call(
        &h,
        empty(Method::GET, &format!("/v1/computers/{id}/screenshot")),
    )
    .await;
    assert_eq!(shot.status, StatusCode::OK);
    assert_eq!(shot.headers[header::CONTENT_TYPE], "image/png");
    assert_eq!(shot.body, PNG);

    let touched = call(
        &h,
        empty(Method::POST, &format!("/v1/computers/{id}/touch")),
    )
    .await;
    assert_eq!(touched.status, StatusCode::OK);
    let patched = call(
        &h,
        with_json(
            Method::PATCH,
            &format!("/v1/computers/{id}"),
            "{\"idle_timeout_ms\":5000}",
        ),
    )
    .await;
    assert_eq!(patched.json()["idle"]["timeout_ms"], 5000);

    let stopped = call(&h, empty(Method::POST, &format!("/v1/computers/{id}/stop"))).await;
    assert_eq!(stopped.json()["container"], "stopped");
    let started = call(
        &h,
        empty(Method::POST, &format!("/v1/computers/{id}/start")),
    )
    .await;
    assert_eq!(started.json()["container"], "running");
    let again = call(
        &h,
        empty(Method::POST, &format!("/v1/computers/{id}/start")),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.code(), "wrong_state");

    let removed = call(
        &h,
        empty(Method::DELETE, &format!("/v1/computers/{id}?purge=true")),
    )
    .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    assert!(!h.computers().contains_key(&id));
}

#[tokio::test]
async fn metrics_count_desktops_by_state() {
    let h = Harness::new();
    h.add("a", true);
    h.add("b", false);
    h.add("c", false);
    let answer = call(&h, empty(Method::GET, "/metrics")).await;
    assert_eq!(answer.status, StatusCode::OK);
    let text = String::from_utf8(answer.body).expect("utf-8");
    assert!(
        text.contains("dormouse_desktops{state=\"running\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("dormouse_desktops{state=\"stopped\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("dormouse_desktops{state=\"missing\"} 0"),
        "{text}"
    );
    assert!(text.contains("dormouse_resume_seconds_count"));
}

#[tokio::test]
async fn panel_is_served_with_a_strict_policy() {
    let h = Harness::new();
    let page = call(&h, Request::get("/").body(Body::empty()).expect("req")).await;
    assert_eq!(page.status, StatusCode::OK);
    let csp = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .expect("ascii");
    assert!(csp.contains("script-src 'self'"));
    let html = String::from_utf8(page.body).expect("utf-8");
    assert!(html.contains("/panel/panel.js"));
    assert!(html.contains("/panel/panel.css"));
    let js = call(
        &h,
        Request::get("/panel/panel.js")
            .body(Body::empty())
            .expect("req"),
    )
    .await;
    assert!(js.headers[header::CONTENT_TYPE]
        .to_str()
        .expect("ascii")
        .starts_with("text/javascript"));
    let js = String::from_utf8(js.body).expect("utf-8");
    // The panel uses only the public API.
    assert!(js.contains("/v1/events"));
    assert!(js.contains("sessionStorage"));
}

/// Every route the router serves is in the OpenAPI document and vice versa,
/// with the right security.
#[test]
fn openapi_documents_exactly_the_routes() {
    let doc: Value = serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    let mut documented = BTreeSet::new();
    let mut public_in_doc = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            documented.insert((method.to_uppercase(), path.clone()));
            if op.get("security") == Some(&json!([])) {
                public_in_doc.insert((method.to_uppercase(), path.clone()));
            }
            assert!(
                op["operationId"].is_string(),
                "{method} {path} has an operationId"
            );
            assert!(op["responses"].is_object(), "{method} {path} has responses");
        }
    }
    let served: BTreeSet<(String, String)> = route_table()
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    let public: BTreeSet<(String, String)> = route_table()
        .iter()
        .filter(|r| r.access == Access::Public)
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(missing.is_empty(), "served but not documented: {missing:?}");
    assert!(extra.is_empty(), "documented but not served: {extra:?}");
    assert_eq!(
        public, public_in_doc,
        "public routes say `security: []`, others do not"
    );
    // Every $ref resolves.
    let text = OPENAPI_JSON;
    for reference in text.split("\"$ref\"").skip(1) {
        let target = reference.split('"').nth(1).expect("a $ref value");
        let pointer = target.trim_start_matches('#');
        assert!(doc.pointer(pointer).is_some(), "unresolved $ref {target}");
    }
}

#[tokio::test]
async fn status_objects_use_contract_names() {
    let h = Harness::new();
    let id = h.add("a", false);
    let answer = call(&h, empty(Method::GET, &format!("/v1/computers/{id}"))).await;
    let status = answer.json();
    for field in [
        "id",
        "name",
        "owner",
        "container",
        "ready",
        "phase",
        "problem",
        "stop_reason",
        "stopped_at",
        "resumable",
        "resumable_problem",
        "generation",
        "health",
        "image_id",
        "idle",
    ] {
        assert!(status.get(field).is_some(), "status has {field}");
    }
    assert_eq!(h.computers()[&id].container, ContainerState::Stopped);
}

/// docs/api.md's route table lists exactly the routes the router serves
/// (each row: its methods, then its paths, query parts aside), and the rows
/// that need no bearer token ("no token", "screen token only") are exactly
/// the public ones. The table is the first after its header row and ends at
/// the first line that is not a row, so a blank line inside it fails here.
#[test]
fn the_route_table_of_the_docs_is_the_router() {
    const API_MD: &str = include_str!("../../docs/api.md");
    let mut lines = API_MD
        .lines()
        .skip_while(|l| l.trim() != "| method | path | what |")
        .skip(2);
    let mut documented = BTreeSet::new();
    let mut public_in_doc = BTreeSet::new();
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    for row in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
        assert_eq!(cells.len(), 3, "a row of three cells: {row}");
        let methods = ticked(cells[0]);
        let paths = ticked(cells[1]);
        assert!(!methods.is_empty() && !paths.is_empty(), "{row}");
        let public = cells[2].contains("no token") || cells[2].contains("screen token only");
        for method in &methods {
            for path in &paths {
                let path = path.split(['?', '[']).next().unwrap_or_default().to_owned();
                documented.insert((method.clone(), path.clone()));
                if public {
                    public_in_doc.insert((method.clone(), path));
                }
            }
        }
    }
    assert!(!documented.is_empty(), "docs/api.md has its route table");
    let served: BTreeSet<(String, String)> = route_table()
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    let public: BTreeSet<(String, String)> = route_table()
        .iter()
        .filter(|r| r.access == Access::Public)
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "served but not in docs/api.md: {missing:?}"
    );
    assert!(extra.is_empty(), "in docs/api.md but not served: {extra:?}");
    assert_eq!(public, public_in_doc, "the rows without a bearer token");
}

/// `Dormouse-Generation` has one parser: a sign is refused on the computer
/// routes and on the screen routes alike, before anything is asked.
#[tokio::test]
async fn a_signed_generation_is_refused_on_every_route() {
    let h = Harness::new();
    let id = h.add("a", true);
    for bad in ["+5", "-5", " +5 "] {
        let stop = req(Method::POST, &format!("/v1/computers/{id}/stop"))
            .header(GENERATION_HEADER, bad)
            .body(Body::empty())
            .expect("request");
        refused(&h, stop, StatusCode::BAD_REQUEST, "bad_request").await;
        let screen = req(Method::POST, &format!("/v1/computers/{id}/screens"))
            .header(GENERATION_HEADER, bad)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"mode":"control"}"#))
            .expect("request");
        refused(&h, screen, StatusCode::BAD_REQUEST, "bad_request").await;
    }
}
