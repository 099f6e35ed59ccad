//! End-to-end: screenshots in PNG, JPEG and WebP from a real desktop,
//! through `GET …/screenshot?format=` and the `screenshot`/`zoom` actions.
//!
//! Each image is checked by its signature, decoded with the `image` crate,
//! and measured against the screen's size as the status reports it and as
//! the guest's X server has it (`xwininfo -root` through `docker exec`);
//! the lossless WebP holds the very pixels of the PNG of the same still
//! screen; JPEG at quality 30 is smaller than at 90. A bad format or
//! quality is a 400 and nothing runs: the pointer, read with `xdotool`
//! through `docker exec`, stays where it was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_client::Error as ClientError;
use dormouse_e2e::broker::{with_broker, BrokerProcess};
use dormouse_e2e::client::{ApiClient, EventStream, Waits as _};
use dormouse_e2e::desk::base64_decode;
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::image::{ImageEncoding, ImageFormat};
use serde_json::{json, Value};
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_come_in_each_format() -> Result<()> {
    with_broker("screenshots_come_in_each_format", scenario).await
}

/// `bytes` decoded, which must be of `format` by its signature and decode
/// as one.
fn decoded(format: ImageFormat, bytes: &[u8]) -> Result<image::DynamicImage> {
    // The signatures written out here, not taken from the code under test.
    let signature_ok = match format {
        ImageFormat::Png => bytes.starts_with(b"\x89PNG"),
        ImageFormat::Jpeg => bytes.starts_with(&[0xff, 0xd8, 0xff]),
        ImageFormat::Webp => bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP"),
    };
    ensure!(
        signature_ok,
        "{format}: {:02x?}",
        &bytes[..bytes.len().min(16)]
    );
    let kind = match format {
        ImageFormat::Png => image::ImageFormat::Png,
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::Webp => image::ImageFormat::WebP,
    };
    image::load_from_memory_with_format(bytes, kind).with_context(|| format!("decoding a {format}"))
}

fn size(img: &image::DynamicImage) -> (u32, u32) {
    (img.width(), img.height())
}

/// `WxH` after `word ` in `text`.
fn size_after(text: &str, word: &str) -> Option<(u32, u32)> {
    let rest = text.split(word).nth(1)?;
    let token = rest.split_whitespace().next()?;
    let (w, h) = token.split_once('x')?;
    Some((w.parse().ok()?, h.parse().ok()?))
}

/// The screen size from the status's `x_display` check.
async fn status_screen(api: &ApiClient, id: Uuid) -> Result<(u32, u32)> {
    let status = api.get(id).await?;
    let health = status
        .health
        .context("a ready desktop has a health report")?;
    let check = health.check("x_display").context("an x_display check")?;
    size_after(&check.detail, "root ").with_context(|| format!("no size in {:?}", check.detail))
}

/// The screen size as the guest's X server has it.
async fn x_screen(guest: &Guest) -> Result<(u32, u32)> {
    let out = guest.sh_ok(GuestUser::Desk, "xwininfo -root").await?;
    let field = |name: &str| -> Result<u32> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no {name} in {out}"))
    };
    Ok((field("Width:")?, field("Height:")?))
}

/// The pointer's position, read with `xdotool` in the guest.
async fn pointer(guest: &Guest) -> Result<String> {
    let out = guest
        .sh_ok(GuestUser::Desk, "xdotool getmouselocation --shell")
        .await?;
    Ok(out
        .lines()
        .filter(|l| l.starts_with('X') || l.starts_with('Y'))
        .collect::<Vec<_>>()
        .join(" "))
}

/// One batch; its results (every one `ok`).
async fn run(api: &ApiClient, id: Uuid, batch: Value) -> Result<Vec<Value>> {
    let path = format!("/v1/computers/{id}/actions");
    let answer: Value = api
        .call(dormouse_client::Method::POST, &path, Some(&batch))
        .await
        .with_context(|| format!("{batch}"))?;
    let results = answer["results"].as_array().cloned().unwrap_or_default();
    ensure!(
        !results.is_empty() && results.iter().all(|r| r["ok"] == true),
        "{batch}: {answer}"
    );
    Ok(results)
}

/// The image of a result, of `format` by its media type, decoded.
fn result_image(result: &Value, format: ImageFormat) -> Result<(Vec<u8>, image::DynamicImage)> {
    ensure!(
        result["image"]["media_type"] == format.media_type(),
        "{format}: {}",
        result["image"]["media_type"]
    );
    let bytes = base64_decode(result["image"]["data"].as_str().unwrap_or_default())
        .context("an image is base64")?;
    let img = decoded(format, &bytes)?;
    let declared = (
        result["size"][0].as_u64().unwrap_or(0),
        result["size"][1].as_u64().unwrap_or(0),
    );
    ensure!(
        declared == (u64::from(img.width()), u64::from(img.height())),
        "{format}: declared {declared:?}, decoded {:?}",
        size(&img)
    );
    Ok((bytes, img))
}

// Over 100 lines on purpose: one desktop, every format through both ways
// in turn, then the refusals; the checks share the screen size they learnt
// first.
async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = api
        .create(&CreateComputer {
            name: Some("shots".into()),
            ..CreateComputer::default()
        })
        .await?
        .id;
    api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);
    let screen = status_screen(&api, id).await?;
    ensure!(
        x_screen(&guest).await? == screen,
        "the status and X disagree on the screen"
    );

    for format in ImageFormat::ALL {
        let (bytes, media_type) = api
            .screenshot_as(id, ImageEncoding::new(Some(format), None)?)
            .await?;
        ensure!(media_type == format.media_type(), "{format}: {media_type}");
        let img = decoded(format, &bytes)?;
        ensure!(
            size(&img) == screen,
            "GET {format}: {:?} on {screen:?}",
            size(&img)
        );

        let results = run(
            &api,
            id,
            json!({"actions": [
                {"action": "screenshot", "format": format},
                {"action": "zoom", "region": [0, 0, 200, 100], "format": format},
            ]}),
        )
        .await?;
        let (_, full) = result_image(&results[0], format)?;
        ensure!(size(&full) == screen, "action {format}: {:?}", size(&full));
        let (_, zoomed) = result_image(&results[1], format)?;
        ensure!(
            size(&zoomed) == (200, 100),
            "zoom {format}: {:?}",
            size(&zoomed)
        );

        let results = run(
            &api,
            id,
            json!({"actions": [{"action": "screenshot", "format": format}],
                   "scale": {"width": 1024, "height": 640}}),
        )
        .await?;
        let (_, scaled) = result_image(&results[0], format)?;
        let (sw, sh) = size(&scaled);
        ensure!(
            sw <= 1024 && sh <= 640 && (sw == 1024 || sh == 640),
            "scaled {format}: {sw}x{sh}"
        );
    }

    // Lossless WebP holds the PNG's pixels, on a screen that stood still
    // between two PNGs taken around it.
    let mut same = false;
    for _ in 0..5 {
        let png = |api: ApiClient| async move {
            let (b, _) = api.screenshot_as(id, ImageEncoding::default()).await?;
            decoded(ImageFormat::Png, &b).map(|i| i.to_rgb8())
        };
        let before = png(api.clone()).await?;
        let webp_encoding = ImageEncoding::new(Some(ImageFormat::Webp), Some(100))?;
        let (w, _) = api.screenshot_as(id, webp_encoding).await?;
        let webp = decoded(ImageFormat::Webp, &w)?.to_rgb8();
        let after = png(api.clone()).await?;
        if before == after {
            ensure!(webp == before, "the WebP's pixels differ from the PNG's");
            same = true;
            break;
        }
    }
    ensure!(
        same,
        "the screen never stood still across three screenshots"
    );

    // JPEG quality trades bytes, through both ways.
    let jpeg = |q| ImageEncoding::new(Some(ImageFormat::Jpeg), Some(q));
    let (low, _) = api.screenshot_as(id, jpeg(30)?).await?;
    let (high, _) = api.screenshot_as(id, jpeg(90)?).await?;
    ensure!(
        low.len() < high.len(),
        "GET jpeg q30 {} bytes, q90 {} bytes",
        low.len(),
        high.len()
    );
    let results = run(
        &api,
        id,
        json!({"actions": [
            {"action": "screenshot", "format": "jpeg", "quality": 30},
            {"action": "screenshot", "format": "jpeg", "quality": 90},
        ]}),
    )
    .await?;
    let (low, _) = result_image(&results[0], ImageFormat::Jpeg)?;
    let (high, _) = result_image(&results[1], ImageFormat::Jpeg)?;
    ensure!(
        low.len() < high.len(),
        "action jpeg q30 {} bytes, q90 {}",
        low.len(),
        high.len()
    );

    refusals(&api, id, &guest).await
}

/// Bad formats and qualities: 400 with a message that names the fault,
/// and the pointer move before them in the batch never happens.
async fn refusals(api: &ApiClient, id: Uuid, guest: &Guest) -> Result<()> {
    run(
        api,
        id,
        json!({"actions": [{"action": "mouse_move", "coordinate": [100, 100]}]}),
    )
    .await?;
    let before = pointer(guest).await?;
    ensure!(before == "X=100 Y=100", "the pointer is at {before}");
    for (query, words) in [
        ("format=gif", "unknown image format \"gif\""),
        ("format=jpeg&quality=0", "quality 0 is not within 1..=100"),
        (
            "format=webp&quality=101",
            "quality 101 is not within 1..=100",
        ),
        ("quality=50", "not png"),
    ] {
        let path = format!("/v1/computers/{id}/screenshot?{query}");
        match api
            .call_bytes::<()>(dormouse_client::Method::GET, &path, None)
            .await
        {
            Err(ClientError::Api {
                status,
                code,
                message,
                ..
            }) => ensure!(
                status.as_u16() == 400 && code == "bad_request" && message.contains(words),
                "{query}: {status} {code} {message}"
            ),
            other => bail!("{query}: {:?}", other.map(|b| b.len())),
        }
    }
    for (shot, words) in [
        (json!({"action": "screenshot", "format": "gif"}), "gif"),
        (
            json!({"action": "screenshot", "format": "jpeg", "quality": 0}),
            "quality 0",
        ),
        (
            json!({"action": "zoom", "region": [0, 0, 10, 10], "quality": 80}),
            "not png",
        ),
    ] {
        let batch = json!({"actions": [
            {"action": "mouse_move", "coordinate": [300, 300]}, shot]});
        let path = format!("/v1/computers/{id}/actions");
        match api
            .call::<Value, Value>(dormouse_client::Method::POST, &path, Some(&batch))
            .await
        {
            Err(ClientError::Api {
                status, message, ..
            }) => ensure!(
                status.as_u16() == 400 && message.contains(words),
                "{batch}: {status} {message}"
            ),
            other => bail!("{batch}: {other:?}"),
        }
    }
    let after = pointer(guest).await?;
    ensure!(
        after == before,
        "a refused batch moved the pointer: {after}"
    );
    Ok(())
}
