//! End-to-end: the guest answers a screenshot of an unchanged screen with
//! the image it encoded last, and never once something was drawn.
//!
//! Every change is made where neither the broker nor the supervisor hears
//! of it (`docker exec` in the guest): a window mapped, text written into
//! it line by line, the window gone. Each shows in the next screenshots;
//! between changes the answers are the same bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{with_broker, BrokerProcess, READY_TIMEOUT};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream};
use dormouse_e2e::guest::{Guest, GuestUser};
use uuid::Uuid;

/// The window's background: pure magenta, which the desktop does not use.
const MAGENTA: [u8; 3] = [255, 0, 255];
/// Its text: pure green.
const GREEN: [u8; 3] = [0, 255, 0];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_screen_is_answered_again_and_a_change_never_missed() -> Result<()> {
    with_broker("an_unchanged_screen_is_answered_again", scenario).await
}

/// Pixels of `colour` in a screenshot.
fn count(png: &[u8], colour: [u8; 3]) -> Result<usize> {
    let img = image::load_from_memory(png)?.to_rgb8();
    Ok(img
        .pixels()
        .filter(|p| p.0.iter().zip(colour).all(|(a, b)| a.abs_diff(b) < 24))
        .count())
}

/// Screenshots until `done` holds for one (at most 10 s); that one.
async fn until(
    api: &ApiClient,
    id: Uuid,
    what: &str,
    done: impl Fn(&[u8]) -> Result<bool>,
) -> Result<Vec<u8>> {
    let started = Instant::now();
    loop {
        let png = api.screenshot(id).await?;
        if done(&png)? {
            return Ok(png);
        }
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: not on the screen after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "unchanged", READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);
    let first = api.screenshot(id).await?;
    ensure!(count(&first, MAGENTA)? == 0, "magenta before the window");

    // A window, then five lines written into it half a second apart, then
    // nothing for a minute.
    guest
        .sh_detached(
            GuestUser::Desk,
            "DISPLAY=:1 exec xterm -bg '#ff00ff' -fg '#00ff00' -geometry 60x20+200+150 \
             -e sh -c 'sleep 1; for i in 1 2 3 4 5; do echo XXXXXXXXXXXXXXXXXXXX; sleep 0.5; done; sleep 60'",
        )
        .await?;
    until(&api, id, "the window", |png| {
        Ok(count(png, MAGENTA)? > 10_000)
    })
    .await?;
    let mut seen = Vec::new();
    let written = Instant::now();
    while written.elapsed() < Duration::from_secs(8) {
        let green = count(&api.screenshot(id).await?, GREEN)?;
        if seen.last() != Some(&green) {
            seen.push(green);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each line adds 20 green letters; the cursor (green too) changes its
    // shape with the focus, so the counts are not strictly growing.
    let (least, most) = (
        seen.iter().min().copied().unwrap_or(0),
        seen.iter().max().copied().unwrap_or(0),
    );
    ensure!(
        seen.len() >= 5 && seen.last() == Some(&most) && most > least,
        "the lines written into the window showed as green pixel counts {seen:?}, \
         not five or more steps up to the most"
    );
    let quiet = api.screenshot(id).await?;
    ensure!(
        count(&quiet, GREEN)? == *seen.last().context("no count")?,
        "the last line is not on the quiet screen"
    );
    for _ in 0..5 {
        ensure!(
            api.screenshot(id).await? == quiet,
            "a quiet screen answered a different image"
        );
    }

    guest.sh_ok(GuestUser::Desk, "pkill -x xterm").await?;
    until(&api, id, "the window's end", |png| {
        Ok(count(png, MAGENTA)? == 0)
    })
    .await?;
    Ok(())
}
