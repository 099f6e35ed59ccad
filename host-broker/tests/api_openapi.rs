//! The OpenAPI document's own correctness, beyond listing the routes
//! (`api_router.rs` compares those with the router): valid path templates,
//! the statuses every kind of route answers, the WebSocket handshake, tar
//! bodies a client can serialise, and request bodies that refuse unknown
//! fields as the server does. `scripts/schemathesis` checks the document
//! against a running broker; these are the parts that need none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use dormouse_broker::api::OPENAPI_JSON;
use serde_json::Value;

fn doc() -> Value {
    serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
}

/// Follows a local `$ref` (once is enough in this document).
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str() {
        Some(target) => doc
            .pointer(target.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("unresolved $ref {target}")),
        None => v,
    }
}

/// Every operation: (method, path, the operation, its parameters resolved,
/// the path item's included).
fn operations(doc: &Value) -> Vec<(String, String, &Value, Vec<&Value>)> {
    let mut all = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let shared: Vec<&Value> = item["parameters"]
            .as_array()
            .map(|ps| ps.iter().map(|p| resolve(doc, p)).collect())
            .unwrap_or_default();
        for (method, op) in item.as_object().expect("path item") {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            let mut params = shared.clone();
            if let Some(own) = op["parameters"].as_array() {
                params.extend(own.iter().map(|p| resolve(doc, p)));
            }
            all.push((method.clone(), path.clone(), op, params));
        }
    }
    all
}

/// Each `{name}` of a path is a whole segment with a plain name (no axum
/// wildcard such as `{*path}`), declared as a required path parameter; and
/// every path parameter appears in the path.
#[test]
fn path_templates_are_valid_openapi() {
    let doc = doc();
    for (method, path, _, params) in operations(&doc) {
        let in_path: Vec<&str> = path
            .split('/')
            .filter(|s| s.contains('{') || s.contains('}'))
            .map(|s| {
                let name = s
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .unwrap_or_else(|| panic!("{path}: {s:?} is not a whole segment"));
                assert!(
                    !name.is_empty()
                        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                    "{path}: {{{name}}} is not a valid template name"
                );
                name
            })
            .collect();
        let declared: Vec<&str> = params
            .iter()
            .filter(|p| p["in"] == "path")
            .map(|p| {
                assert_eq!(
                    p["required"], true,
                    "{method} {path}: path parameters are required"
                );
                p["name"].as_str().expect("a name")
            })
            .collect();
        let mut a = in_path.clone();
        let mut b = declared.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "{method} {path}: template names and path parameters");
    }
}

/// A route with a path parameter answers 400 for a malformed one; a route
/// behind the token answers 401 without it; a route with a body answers
/// 413 past its bound. The document names each.
#[test]
fn every_operation_names_the_refusals_it_answers() {
    let doc = doc();
    for (method, path, op, params) in operations(&doc) {
        let responses = &op["responses"];
        let public = op.get("security") == Some(&Value::Array(Vec::new()));
        if params.iter().any(|p| p["in"] == "path") && !path.starts_with("/novnc/") {
            assert!(responses.get("400").is_some(), "{method} {path}: 400");
        }
        if !public {
            assert!(responses.get("401").is_some(), "{method} {path}: 401");
        }
        if op.get("requestBody").is_some() {
            assert!(responses.get("413").is_some(), "{method} {path}: 413");
        }
    }
}

/// A WebSocket route (one that documents 101) requires the handshake's
/// headers, so a generated request is a handshake; its 101 carries no HTTP
/// body to describe.
#[test]
fn websocket_routes_require_the_handshake() {
    let doc = doc();
    let mut seen = 0;
    for (method, path, op, params) in operations(&doc) {
        let Some(switching) = op["responses"].get("101") else {
            continue;
        };
        seen += 1;
        assert!(
            switching.get("content").is_none(),
            "{method} {path}: 101 has no body"
        );
        for header in [
            "Connection",
            "Upgrade",
            "Sec-WebSocket-Version",
            "Sec-WebSocket-Key",
        ] {
            assert!(
                params
                    .iter()
                    .any(|p| p["in"] == "header" && p["name"] == header && p["required"] == true),
                "{method} {path}: the required header {header}"
            );
        }
    }
    assert_eq!(seen, 3, "/v1/events, the terminal and the screen's RFB");
}

/// Every request body's media type has a schema; tar bodies are binary
/// strings, which a client can send as bytes.
#[test]
fn request_bodies_have_schemas_a_client_can_serialise() {
    let doc = doc();
    for (method, path, op, _) in operations(&doc) {
        let Some(content) = op["requestBody"]["content"].as_object() else {
            continue;
        };
        for (media, body) in content {
            let schema = resolve(&doc, &body["schema"]);
            assert!(schema.is_object(), "{method} {path} {media}: a schema");
            if media != "application/json" {
                assert_eq!(schema["type"], "string", "{method} {path} {media}");
                assert_eq!(schema["format"], "binary", "{method} {path} {media}");
            }
        }
    }
}

/// The server refuses unknown fields in every JSON body it parses
/// (`deny_unknown_fields`); the document says so of each, and of each
/// action in a batch.
#[test]
fn json_bodies_refuse_unknown_fields_as_the_server_does() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let mut names = vec![
        "CreateComputer",
        "PatchComputer",
        "LeaseRequest",
        "ExecRequest",
        "CreateScreen",
        "EgressPolicy",
        "ActionBatch",
        "OpenAiBatch",
    ];
    let actions: Vec<String> = schemas["Action"]["oneOf"]
        .as_array()
        .expect("Action is one schema per action")
        .iter()
        .map(|r| {
            r["$ref"]
                .as_str()
                .expect("a $ref")
                .rsplit('/')
                .next()
                .expect("a name")
                .to_owned()
        })
        .collect();
    assert_eq!(actions.len(), 19, "one schema per action");
    names.extend(actions.iter().map(String::as_str));
    for name in names {
        assert_eq!(
            schemas[name]["additionalProperties"], false,
            "{name} refuses unknown fields"
        );
    }
}
