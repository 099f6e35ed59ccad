//! Screenshot formats through the API router over a scripted core: `GET
//! …/screenshot?format=&quality=` answers the format's bytes under its
//! media type, a batch's `screenshot` and `zoom` (and the OpenAI dialect's
//! `computer_call_output`) carry the media type asked for, and a bad
//! `format` or `quality` is a 400 that reaches no command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_support;

use api_support::{call, empty, image_of, with_json, Harness};
use axum::http::{header, Method, StatusCode};
use dormouse_protocol::image::ImageFormat;
use serde_json::{json, Value};

/// Status, `Content-Type` and body of one request to the router.
async fn send(
    h: &Harness,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, String, Vec<u8>) {
    let request = match body {
        Some(v) => with_json(method, uri, &v.to_string()),
        None => empty(method, uri),
    };
    let answer = call(h, request).await;
    let content_type = answer
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (answer.status, content_type, answer.body)
}

/// The base64 a file of `format` begins with (its signature's first bytes).
fn base64_start(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "iVBORw0KGgo",
        ImageFormat::Jpeg => "/9j/",
        ImageFormat::Webp => "UklGR",
    }
}

#[tokio::test]
async fn each_format_is_answered_under_its_media_type() {
    let h = Harness::new();
    let id = h.add("a", true);
    for (query, format) in [
        ("", ImageFormat::Png),
        ("?format=png", ImageFormat::Png),
        ("?format=jpeg&quality=30", ImageFormat::Jpeg),
        ("?format=jpeg", ImageFormat::Jpeg),
        ("?quality=100&format=webp", ImageFormat::Webp),
    ] {
        let uri = format!("/v1/computers/{id}/screenshot{query}");
        let (status, content_type, body) = send(&h, Method::GET, &uri, None).await;
        assert_eq!(status, StatusCode::OK, "{query}");
        assert_eq!(content_type, format.media_type(), "{query}");
        assert_eq!(body, image_of(format), "{query}");
    }
    assert_eq!(h.calls().len(), 5, "each screenshot asked the guest once");
}

#[tokio::test]
async fn a_bad_format_or_quality_is_400_and_asks_nothing() {
    let h = Harness::new();
    let id = h.add("a", true);
    for (query, words) in [
        ("?format=gif", "unknown image format \"gif\""),
        ("?format=PNG", "unknown image format"),
        ("?format=", "unknown image format"),
        ("?format=jpeg&quality=0", "quality 0 is not within 1..=100"),
        (
            "?format=webp&quality=101",
            "quality 101 is not within 1..=100",
        ),
        ("?format=jpeg&quality=9999999999", "not within 1..=100"),
        ("?format=jpeg&quality=high", "not within 1..=100"),
        ("?quality=50", "quality applies to jpeg and webp, not png"),
        ("?format=png&quality=50", "not png"),
        ("?format=jpeg&format=png", "format given twice"),
        ("?size=big", "unknown query parameter \"size\""),
        ("?last=yes", "last must be true or false"),
        (
            "?last=true&format=png",
            "format and quality are for a live screenshot",
        ),
        (
            "?quality=9&last=true",
            "format and quality are for a live screenshot",
        ),
        ("?last=true&last=true", "last given twice"),
    ] {
        let uri = format!("/v1/computers/{id}/screenshot{query}");
        let (status, _, body) = send(&h, Method::GET, &uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        let error: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error["error"]["code"], "bad_request", "{query}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{query}: {message}");
    }
    assert_eq!(
        h.calls(),
        Vec::<String>::new(),
        "a bad query reached the core"
    );
}

#[tokio::test]
async fn the_last_screen_is_asked_of_the_core_and_marked_not_live() {
    let h = Harness::new();
    let id = h.add("a", false);
    let uri = format!("/v1/computers/{id}/screenshot?last=true");
    let (status, _, body) = send(&h, Method::GET, &uri, None).await;
    // The scripted core keeps none: the answer says so in words.
    assert_eq!(status, StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "not_found");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no last screen is kept"), "{message}");
    assert_eq!(h.calls(), vec![format!("last_screen {id}")]);
    // `last=false` is a live screenshot, marked as one.
    let h = Harness::new();
    let id = h.add("a", true);
    let answer = call(
        &h,
        empty(
            Method::GET,
            &format!("/v1/computers/{id}/screenshot?last=false"),
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["dormouse-live"], "true");
}

#[tokio::test]
async fn batch_images_carry_the_format_they_asked_for() {
    let h = Harness::new();
    let id = h.add("a", true);
    let uri = format!("/v1/computers/{id}/actions");
    let batch = json!({"actions": [
        {"action": "screenshot"},
        {"action": "screenshot", "format": "jpeg", "quality": 40},
        {"action": "zoom", "region": [0, 0, 1, 1], "format": "webp"},
    ]});
    let (status, _, body) = send(&h, Method::POST, &uri, Some(batch)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let results: Value = serde_json::from_slice(&body).unwrap();
    let formats = [ImageFormat::Png, ImageFormat::Jpeg, ImageFormat::Webp];
    for (i, format) in formats.into_iter().enumerate() {
        let image = &results["results"][i]["image"];
        assert_eq!(image["media_type"], format.media_type(), "result {i}");
        let data = image["data"].as_str().unwrap_or_default();
        assert!(data.starts_with(base64_start(format)), "result {i}: {data}");
    }

    let openai = json!({"openai_actions": [
        {"type": "screenshot"},
        {"type": "screenshot", "format": "jpeg", "quality": 60},
        {"type": "screenshot", "format": "webp"},
    ]});
    let (status, _, body) = send(&h, Method::POST, &uri, Some(openai)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let results: Value = serde_json::from_slice(&body).unwrap();
    for (i, format) in formats.into_iter().enumerate() {
        let output = &results["results"][i]["output"];
        assert_eq!(output["type"], "computer_screenshot", "result {i}");
        let url = output["image_url"].as_str().unwrap_or_default();
        let start = format!(
            "data:{};base64,{}",
            format.media_type(),
            base64_start(format)
        );
        assert!(url.starts_with(&start), "result {i}: {url}");
    }
}

#[tokio::test]
async fn a_bad_encoding_in_a_batch_runs_nothing() {
    let h = Harness::new();
    let id = h.add("a", true);
    let uri = format!("/v1/computers/{id}/actions");
    for (batch, words) in [
        (
            json!({"actions": [{"action": "left_click", "coordinate": [0, 0]},
                               {"action": "screenshot", "format": "gif"}]}),
            "unknown variant `gif`",
        ),
        (
            json!({"actions": [{"action": "left_click", "coordinate": [0, 0]},
                               {"action": "screenshot", "format": "jpeg", "quality": 0}]}),
            "quality 0 is not within 1..=100",
        ),
        (
            json!({"actions": [{"action": "zoom", "region": [0, 0, 1, 1], "quality": 50}]}),
            "not png",
        ),
        (
            json!({"openai_actions": [{"type": "screenshot", "format": "bmp"}]}),
            "bmp",
        ),
    ] {
        let (status, _, body) = send(&h, Method::POST, &uri, Some(batch.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{batch}");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(words), "{batch}: {text}");
    }
    assert_eq!(
        h.calls(),
        Vec::<String>::new(),
        "a bad batch reached the core"
    );
}
