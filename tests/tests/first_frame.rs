//! End-to-end: the first whole update any RFB client gets through the
//! screen gateway is the desktop's screen, never the VNC server's unpainted
//! (black) framebuffer, on view and on control.
//!
//! A plain RFB client (no library: [`dormouse_e2e::rfb::RfbViewer`]) opens
//! a connection, asks once for the whole screen (non-incremental, Raw, with
//! the cursor as a pseudo-encoding so the server does not paint the pointer
//! into the pixels), takes the first update and closes, as a capture tool
//! such as vncdotool does. Its pixels are compared with the API's
//! screenshot, a witness independent of the gateway and of x11vnc (the
//! supervisor reads the X server itself).
//!
//! x11vnc reads the screen only while a viewer is connected, so what it
//! holds between viewers is what it read last: nothing at all (black) on a
//! desktop just started, the screen as the previous viewer left it
//! otherwise. Each mode's connections therefore begin on a desktop just
//! (re)started, and before every further one a window is moved while no
//! viewer is connected; the screen is then still (checked: the same
//! screenshot before and after the connection, else it is taken again; the
//! taskbar's clock turns once a minute) while the connection takes its
//! frame.
//!
//! Needs Docker and the desktop image (`DORMOUSE_TEST_IMAGE`); skips with a
//! visible message without them (fails under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{with_broker, BrokerProcess, READY_TIMEOUT};
use dormouse_e2e::client::{create_ready, start_retrying, ApiClient, EventStream, Waits as _};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::rfb::{set_encodings, set_pixel_format_bgrx, update_request, RfbViewer, TokenIn};
use dormouse_protocol::screen::{CreateScreen, ScreenGrant, ScreenMode};
use uuid::Uuid;

const WIDTH: u16 = 1280;
const HEIGHT: u16 = 800;
/// Connections per mode.
const CONNECTIONS: usize = 50;
/// Raw pixels, and the cursor as a pseudo-encoding (x11vnc then leaves the
/// pointer out of the framebuffer it sends, as the X server's image does).
const ENCODINGS: [i32; 2] = [0, -239];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_first_frame_is_the_screen() -> Result<()> {
    with_broker("every_first_frame_is_the_screen", scenario).await
}

/// RGB pixels of a PNG screenshot.
fn rgb(png: &[u8]) -> Result<Vec<u8>> {
    let img = image::load_from_memory(png)?.to_rgb8();
    ensure!(
        img.dimensions() == (u32::from(WIDTH), u32::from(HEIGHT)),
        "screenshot {:?}",
        img.dimensions()
    );
    Ok(img.into_raw())
}

/// Pixels that are not black.
fn lit(rgb: &[u8]) -> usize {
    rgb.chunks(3).filter(|p| p[0] | p[1] | p[2] != 0).count()
}

/// What one connection saw.
#[derive(Debug)]
struct First {
    /// The first whole update, as RGB.
    rgb: Vec<u8>,
    /// From the WebSocket's opening to the update's last byte.
    took: Duration,
    /// Updates it took to cover the screen (one: a whole-screen answer).
    updates: usize,
}

/// One connection: the handshake, one whole-screen request, the update
/// that answers it (its rectangles until the screen is covered).
async fn first_frame(broker: &BrokerProcess, grant: &ScreenGrant) -> Result<First> {
    let opened = Instant::now();
    let mut v = RfbViewer::connect(
        &format!("ws://{}{}", broker.addr(), grant.websocket),
        &grant.token,
        TokenIn::Subprotocol,
    )
    .await?;
    let init = v.handshake().await?;
    ensure!((init.width, init.height) == (WIDTH, HEIGHT), "{init:?}");
    v.send(&set_pixel_format_bgrx()).await?;
    v.send(&set_encodings(&ENCODINGS)).await?;
    v.send(&update_request(false, 0, 0, WIDTH, HEIGHT)).await?;
    let mut out = vec![0u8; usize::from(WIDTH) * usize::from(HEIGHT) * 3];
    let mut covered = 0usize;
    let mut updates = 0;
    while covered < usize::from(WIDTH) * usize::from(HEIGHT) {
        let rects = tokio::time::timeout(Duration::from_secs(10), v.read_update())
            .await
            .context("no update within 10 s")??;
        updates += 1;
        for r in rects.iter().filter(|r| r.encoding == 0) {
            for row in 0..usize::from(r.h) {
                for col in 0..usize::from(r.w) {
                    let src = (row * usize::from(r.w) + col) * 4;
                    let dst =
                        ((usize::from(r.y) + row) * usize::from(WIDTH) + usize::from(r.x) + col)
                            * 3;
                    // BGRX on the wire.
                    out[dst] = r.pixels[src + 2];
                    out[dst + 1] = r.pixels[src + 1];
                    out[dst + 2] = r.pixels[src];
                }
            }
            covered += usize::from(r.w) * usize::from(r.h);
        }
    }
    let took = opened.elapsed();
    v.close().await;
    Ok(First {
        rgb: out,
        took,
        updates,
    })
}

/// Pixels of `a` that differ from `b`.
fn differing(a: &[u8], b: &[u8]) -> usize {
    a.chunks(3).zip(b.chunks(3)).filter(|(p, q)| p != q).count()
}

async fn mint(api: &ApiClient, id: Uuid, mode: ScreenMode) -> Result<ScreenGrant> {
    Ok(api
        .create_screen(
            id,
            &CreateScreen {
                mode,
                ttl_ms: Some(600_000),
                reason: None,
            },
        )
        .await?)
}

/// Tally of one mode's connections.
#[derive(Debug, Default)]
struct Tally {
    matched: usize,
    black: usize,
    other: usize,
    times: Vec<Duration>,
}

/// The window moved between connections: its background, pure magenta.
const MAGENTA: &str = "#ff00ff";

/// Opens the window and waits until the screen shows it and is still.
async fn open_window(api: &ApiClient, id: Uuid, guest: &Guest) -> Result<Vec<u8>> {
    let before = rgb(&api.screenshot(id).await?)?;
    guest
        .sh_detached(
            GuestUser::Desk,
            &format!("DISPLAY=:1 exec xterm -bg '{MAGENTA}' -geometry 40x10+100+100 -e sleep 3600"),
        )
        .await?;
    still_after(api, id, &before).await
}

/// Waits (at most 10 s) until the screen differs from `old` and two
/// screenshots in a row are the same; that screen.
async fn still_after(api: &ApiClient, id: Uuid, old: &[u8]) -> Result<Vec<u8>> {
    let started = Instant::now();
    let mut last = rgb(&api.screenshot(id).await?)?;
    loop {
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "the screen did not change and settle within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        let now = rgb(&api.screenshot(id).await?)?;
        if now == last && now != old {
            return Ok(now);
        }
        last = now;
    }
}

/// `CONNECTIONS` connections of one mode, one after another, each compared
/// with the screenshots taken just before and just after it; between two,
/// the window moves while no viewer is connected.
async fn connections(
    broker: &BrokerProcess,
    api: &ApiClient,
    id: Uuid,
    mode: ScreenMode,
) -> Result<Tally> {
    let guest = Guest::for_computer(id);
    let grant = mint(api, id, mode).await?;
    let mut tally = Tally::default();
    let mut screen = open_window(api, id, &guest).await?;
    let mut n = 0;
    let mut moves = 0;
    while n < CONNECTIONS {
        if n > 0 {
            moves += 1;
            let (x, y) = if moves % 2 == 0 {
                (100, 100)
            } else {
                (600, 350)
            };
            guest
                .sh_ok(
                    GuestUser::Desk,
                    &format!("DISPLAY=:1 xdotool search --class xterm windowmove %@ {x} {y}"),
                )
                .await?;
            screen = still_after(api, id, &screen).await?;
        }
        let first = first_frame(broker, &grant).await?;
        let after = rgb(&api.screenshot(id).await?)?;
        if screen != after {
            // The clock turned: this connection proves nothing either way.
            eprintln!("{mode:?} #{n}: the screen changed meanwhile (the clock); again");
            screen = after;
            continue;
        }
        let off = differing(&first.rgb, &after);
        if off == 0 {
            tally.matched += 1;
        } else if lit(&first.rgb) == 0 {
            tally.black += 1;
            eprintln!(
                "{mode:?} #{n}: black ({} update(s), {:?})",
                first.updates, first.took
            );
        } else {
            tally.other += 1;
            eprintln!(
                "{mode:?} #{n}: {off} pixels differ from the screenshot ({} update(s), {:?})",
                first.updates, first.took
            );
        }
        tally.times.push(first.took);
        n += 1;
    }
    Ok(tally)
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "first-frame", READY_TIMEOUT).await?;
    let mut report = Vec::new();
    for mode in [ScreenMode::View, ScreenMode::Control] {
        if mode == ScreenMode::Control {
            // A new x11vnc, whose framebuffer nobody has read yet.
            api.stop(id).await?;
            api.wait_stopped(&mut events, id, READY_TIMEOUT).await?;
            start_retrying(&api, id).await?;
            api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
        }
        let mut tally = connections(broker, &api, id, mode).await?;
        tally.times.sort();
        let median = tally.times[tally.times.len() / 2];
        let max = tally.times.last().copied().unwrap_or_default();
        eprintln!(
            "{mode:?}: {} of {CONNECTIONS} first frames are the screen ({} black, {} another screen); \
             open to frame median {median:?}, max {max:?}",
            tally.matched, tally.black, tally.other
        );
        report.push((mode, tally));
    }
    for (mode, tally) in &report {
        ensure!(
            tally.matched == CONNECTIONS,
            "{mode:?}: only {} of {CONNECTIONS} first frames were the screen ({} black, {} another screen)",
            tally.matched,
            tally.black,
            tally.other
        );
    }
    Ok(())
}
