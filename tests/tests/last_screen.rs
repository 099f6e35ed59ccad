//! End-to-end: a stopped desktop's last screen, `GET …/screenshot?last=true`.
//!
//! A window of a colour nothing else on the desktop has is opened with
//! `docker exec` (the broker never hears of it); the broker stops the
//! desktop; the kept WebP fits 640×400, holds that window where the live
//! screen had it, is marked not live with a time inside the stop, and is
//! served while the container stays stopped (`docker inspect`: not running,
//! its start time unchanged). Removing the desktop forgets it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use chrono::{DateTime, Utc};
use dormouse_client::Error as ClientError;
use dormouse_e2e::broker::{with_broker, BrokerProcess, READY_TIMEOUT};
use dormouse_e2e::client::{create_ready, EventStream};
use dormouse_e2e::guest::{Guest, GuestUser};
use image::RgbImage;

/// The window's colour: pure magenta, which neither the wallpaper nor the
/// taskbar uses.
const MAGENTA: [u8; 3] = [255, 0, 255];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_desktop_shows_its_last_screen() -> Result<()> {
    with_broker("a_stopped_desktop_shows_its_last_screen", scenario).await
}

/// Where the magenta pixels are: their count and their bounding box as
/// fractions of the image.
fn magenta(img: &RgbImage) -> (u64, [f64; 4]) {
    let (mut n, mut x0, mut y0, mut x1, mut y1) = (0, u32::MAX, u32::MAX, 0, 0);
    for (x, y, p) in img.enumerate_pixels() {
        let near = p.0.iter().zip(MAGENTA).all(|(a, b)| a.abs_diff(b) < 24);
        if near {
            n += 1;
            (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
        }
    }
    let (w, h) = (f64::from(img.width()), f64::from(img.height()));
    let frac = [
        f64::from(x0) / w,
        f64::from(y0) / h,
        f64::from(x1) / w,
        f64::from(y1) / h,
    ];
    (n, frac)
}

/// The status and the headers of a GET of `url`, by curl.
async fn curl_headers(url: &str, token: &str) -> Result<(u16, String)> {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(url)
        .output()
        .await
        .context("curl")?;
    ensure!(out.status.success(), "curl {url}: {out:?}");
    let headers = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {headers:?}"))?;
    Ok((status, headers))
}

/// Header `name`'s value in curl's dump of an answer.
fn header(headers: &str, name: &str) -> Option<String> {
    headers.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

async fn container_state(guest: &Guest) -> Result<String> {
    let out = tokio::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.State.Running}} {{.State.StartedAt}}",
            guest.container(),
        ])
        .output()
        .await?;
    ensure!(out.status.success(), "docker inspect: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

// Over 100 lines on purpose: one desktop through open window, stop, kept
// screen and remove; each check needs what the one before it saw.
async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "last-screen", READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);

    // None is kept before the broker's first stop.
    match api.last_screenshot(id).await {
        Err(ClientError::Api { status, code, .. }) => {
            ensure!(status == 404 && code == "not_found", "{status} {code}");
        }
        other => anyhow::bail!("a last screen before any stop: {other:?}"),
    }

    guest
        .sh_detached(
            GuestUser::Desk,
            "DISPLAY=:1 exec xterm -bg '#ff00ff' -fg '#ff00ff' -geometry 60x20+200+150",
        )
        .await?;
    let mut live = None;
    for _ in 0..50 {
        let png = api.screenshot(id).await?;
        let img = image::load_from_memory(&png)?.to_rgb8();
        if magenta(&img).0 > 10_000 {
            live = Some(img);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let live = live.context("the magenta window never showed on the live screen")?;
    let (live_n, live_box) = magenta(&live);

    let before_stop = Utc::now();
    api.stop(id).await?;
    let after_stop = Utc::now();
    let stopped = container_state(&guest).await?;
    ensure!(stopped.starts_with("false "), "after the stop: {stopped}");

    let kept = api.last_screenshot(id).await?;
    ensure!(
        kept.image.starts_with(b"RIFF") && kept.image.get(8..12) == Some(b"WEBP"),
        "not a WebP: {:02x?}",
        &kept.image[..kept.image.len().min(16)]
    );
    let thumb =
        image::load_from_memory_with_format(&kept.image, image::ImageFormat::WebP)?.to_rgb8();
    let (w, h) = (thumb.width(), thumb.height());
    ensure!(
        w <= 640 && h <= 400 && (w == 640 || h == 400),
        "the kept screen is {w}x{h}, not fitted to 640x400"
    );
    ensure!(
        u64::from(w) * u64::from(live.height()) == u64::from(h) * u64::from(live.width()),
        "the aspect ratio changed: {w}x{h} of {}x{}",
        live.width(),
        live.height()
    );
    let (thumb_n, thumb_box) = magenta(&thumb);
    let scale = f64::from(live.width()) / f64::from(w);
    let expected = live_n as f64 / (scale * scale);
    ensure!(
        (thumb_n as f64) > expected * 0.8 && (thumb_n as f64) < expected * 1.2,
        "{thumb_n} magenta pixels kept, {expected:.0} expected from the live screen's {live_n}"
    );
    for (k, l) in thumb_box.iter().zip(live_box) {
        ensure!(
            (k - l).abs() < 0.02,
            "the window moved: {thumb_box:?} kept, {live_box:?} live"
        );
    }
    let taken_at: DateTime<Utc> = kept
        .taken_at
        .parse()
        .with_context(|| format!("Dormouse-Taken-At {:?}", kept.taken_at))?;
    let slack = chrono::Duration::seconds(1);
    ensure!(
        taken_at >= before_stop - slack && taken_at <= after_stop + slack,
        "taken at {taken_at}, the stop ran {before_stop}..{after_stop}"
    );

    // Served with its marks, and the desktop was not started for it.
    let url = format!("http://{}/v1/computers/{id}/screenshot", broker.addr());
    let (status, headers) = curl_headers(&format!("{url}?last=true"), broker.token()).await?;
    ensure!(status == 200, "{status}: {headers}");
    for (name, value) in [("content-type", "image/webp"), ("dormouse-live", "false")] {
        ensure!(
            header(&headers, name).as_deref() == Some(value),
            "{name}: {headers}"
        );
    }
    ensure!(header(&headers, "last-modified").is_some(), "{headers}");
    ensure!(
        container_state(&guest).await? == stopped,
        "reading the last screen changed the container"
    );
    // format= is for live screenshots only.
    let (status, _) = curl_headers(&format!("{url}?last=true&format=png"), broker.token()).await?;
    ensure!(status == 400, "last=true&format=png: {status}");

    // Removing the desktop (workspace kept) forgets its screen.
    let file = broker
        .data_dir()
        .join(format!("computers/{id}/last-screen.webp"));
    ensure!(
        file.exists(),
        "{} is where the store keeps it",
        file.display()
    );
    api.remove(id, false).await?;
    ensure!(!file.exists(), "{} survived the remove", file.display());
    Ok(())
}
