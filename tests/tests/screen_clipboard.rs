//! End-to-end: the clipboard through the live screen and through the
//! `clipboard_set` / `clipboard_get` actions, a real `dormoused`, the real
//! engine and image. A plain RFB client written here (no noVNC) holds a
//! view and a control connection; the witness of the desktop's clipboard is
//! `xclip` run as the desktop's user through `docker exec`, never Dormouse.
//!
//! Needs Docker and the desktop image (`DORMOUSE_TEST_IMAGE`); skips with a
//! visible message without them (fails under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{with_broker, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::rfb::{
    cut_text, set_encodings, set_pixel_format_bgrx, update_request, RfbViewer, TokenIn,
};
use dormouse_protocol::screen::{CreateScreen, ScreenGrant, ScreenMode};
use serde_json::{json, Value};
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const WIDTH: u16 = 1280;
const HEIGHT: u16 = 800;
/// The extended-clipboard pseudo-encoding.
const EXTENDED_CLIPBOARD: i32 = i32::from_be_bytes(0xC0A1_E5CE_u32.to_be_bytes());
/// What noVNC asks for, and more: Tight (7), Hextile (5), RRE (2), ZRLE
/// (16), Raw, CopyRect, quality and compression levels, DesktopSize,
/// LastRect, Cursor, QEMU keys, ExtendedDesktopSize, xvp, fences,
/// continuous updates, DesktopName, VMware's cursor, the extended clipboard.
const MANY: [i32; 20] = [
    7,
    -260,
    5,
    2,
    16,
    0,
    1,
    -26,
    -250,
    -223,
    -224,
    -239,
    -258,
    -308,
    -309,
    -312,
    -313,
    -307,
    0x574d_5664,
    EXTENDED_CLIPBOARD,
];

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

/// A viewer past the handshake, 32-bpp pixels, asking for `encodings` and
/// the whole screen.
async fn viewer(
    broker: &BrokerProcess,
    grant: &ScreenGrant,
    encodings: &[i32],
) -> Result<RfbViewer> {
    let url = format!("ws://{}{}", broker.addr(), grant.websocket);
    let mut v = RfbViewer::connect(&url, &grant.token, TokenIn::Subprotocol).await?;
    let init = v.handshake().await?;
    ensure!((init.width, init.height) == (WIDTH, HEIGHT), "{init:?}");
    v.send(&set_pixel_format_bgrx()).await?;
    v.send(&set_encodings(encodings)).await?;
    v.send(&update_request(false, 0, 0, WIDTH, HEIGHT)).await?;
    Ok(v)
}

/// Reads (and parses) updates until `until`, asking for more after each
/// and for the whole screen every second; stops early once `stop` holds.
/// Returns the updates read.
async fn watch(
    v: &mut RfbViewer,
    until: Instant,
    stop: impl Fn(&RfbViewer) -> bool,
) -> Result<usize> {
    let mut updates = 0;
    let mut full_at = Instant::now() + Duration::from_secs(1);
    while !stop(v) {
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            break;
        };
        if v.readable(left.min(Duration::from_millis(500))).await? {
            // What came may be a cut text, not an update: a whole update
            // of one pixel, asked for then, ends the read whatever it is.
            if v.peek() != Some(0) {
                v.send(&update_request(false, 0, 0, 1, 1)).await?;
            }
            v.read_update().await?;
            updates += 1;
            v.send(&update_request(true, 0, 0, WIDTH, HEIGHT)).await?;
        }
        if Instant::now() >= full_at {
            v.send(&update_request(false, 0, 0, WIDTH, HEIGHT)).await?;
            full_at = Instant::now() + Duration::from_secs(1);
        }
    }
    Ok(updates)
}

fn has(v: &RfbViewer, text: &[u8]) -> bool {
    v.cut_texts
        .iter()
        .any(|t| t.windows(text.len()).any(|w| w == text))
}

async fn clipboard(guest: &Guest) -> Result<String> {
    let out = guest
        .sh(GuestUser::Desk, "timeout 5 xclip -o -selection clipboard")
        .await?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Owns CLIPBOARD as the desktop's user with `text` (xclip stays as the
/// owner in the background, its output closed so `docker exec` returns).
async fn set_clipboard(guest: &Guest, text: &str) -> Result<()> {
    guest
        .sh_with_input(
            GuestUser::Desk,
            "xclip -selection clipboard -i >/dev/null 2>&1",
            text.as_bytes(),
        )
        .await?;
    Ok(())
}

async fn clipboard_becomes(guest: &Guest, want: &str, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let now = clipboard(guest).await?;
        if now == want {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < within,
            "the desktop's clipboard is {now:?}, not {want:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A batch through the API as raw JSON; its results.
async fn actions(api: &ApiClient, id: Uuid, batch: Value) -> Result<Vec<Value>> {
    let path = format!("/v1/computers/{id}/actions");
    let answer: Value = api
        .call(dormouse_client::Method::POST, &path, Some(&batch))
        .await
        .with_context(|| format!("{batch}"))?;
    Ok(answer["results"].as_array().cloned().unwrap_or_default())
}

/// `clipboard_set` then `clipboard_get` through the API, witnessed by xclip;
/// repeated sets leave one owner per selection, and the activity record
/// names the actions without their text.
async fn clipboard_actions(api: &ApiClient, id: Uuid, guest: &Guest) -> Result<()> {
    let text = "Grüße vom Agenten ✓ clip-77\nline two";
    let results = actions(
        api,
        id,
        json!({"actions": [{"action": "clipboard_set", "text": text},
                           {"action": "clipboard_get"}]}),
    )
    .await?;
    ensure!(
        results.len() == 2 && results.iter().all(|r| r["ok"] == true),
        "{results:?}"
    );
    ensure!(
        results[1]["text"] == text,
        "clipboard_get answered {:?}",
        results[1]
    );
    let seen = clipboard(guest).await?;
    ensure!(seen == text, "xclip -o in the guest reads {seen:?}");
    let primary = guest
        .sh(GuestUser::Desk, "timeout 5 xclip -o -selection primary")
        .await?;
    ensure!(
        String::from_utf8_lossy(&primary.stdout) == text,
        "PRIMARY: {primary:?}"
    );
    eprintln!(
        "clipboard_set then clipboard_get: {} bytes round trip, xclip agrees",
        text.len()
    );
    for i in 0..5 {
        let r = actions(
            api,
            id,
            json!({"actions": [{"action": "clipboard_set", "text": format!("again-{i}")}]}),
        )
        .await?;
        ensure!(r[0]["ok"] == true, "{r:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let owners = guest
        .sh(GuestUser::Root, "pgrep -c -x xclip || true")
        .await?;
    let owners: usize = String::from_utf8_lossy(&owners.stdout)
        .trim()
        .parse()
        .unwrap_or(99);
    ensure!(
        owners <= 2,
        "{owners} xclip processes after 6 sets (one owner per selection)"
    );
    ensure!(
        clipboard(guest).await? == "again-4",
        "the last set owns the clipboard"
    );
    eprintln!("6 sets leave {owners} xclip processes");
    let page = serde_json::to_string(&api.activity(id, 50).await?)?;
    ensure!(
        page.contains("clipboard_set"),
        "activity names the action: {page}"
    );
    ensure!(
        !page.contains("clip-77") && !page.contains("again-4"),
        "activity carries clipboard text: {page}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clipboard_reaches_control_only() -> Result<()> {
    with_broker("the_clipboard_reaches_control_only", scenario).await
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "clipboard", READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);
    clipboard_actions(&api, id, &guest).await?;

    let view_grant = mint(&api, id, ScreenMode::View).await?;
    let control_grant = mint(&api, id, ScreenMode::Control).await?;
    // View lists Tight first: the gateway's rewrite leaves ZRLE first.
    // Control lists ZRLE first, so x11vnc never picks Tight this viewer
    // cannot read past.
    let mut view = viewer(broker, &view_grant, &MANY).await?;
    let mut control_list = vec![16];
    control_list.extend(MANY.iter().filter(|e| **e != 16));
    let mut control = viewer(broker, &control_grant, &control_list).await?;
    watch(
        &mut control,
        Instant::now() + Duration::from_secs(1),
        |_| false,
    )
    .await?;

    // The view connection is read and parsed from now until 2.5 s after
    // control received the secret.
    let done = Arc::new(AtomicBool::new(false));
    let view_task = tokio::spawn({
        let done = Arc::clone(&done);
        async move {
            let until = Instant::now() + Duration::from_secs(90);
            let updates = watch(&mut view, until, |_| done.load(Ordering::Relaxed)).await;
            (view, updates)
        }
    });
    // x11vnc starts sending the selection about 15 s after a viewer
    // connects (measured: 15.3 s, then 0.4 s for each later copy), so a
    // first copy is waited for without a bound of 10 s.
    let warm = "warm-up-copy";
    let copied = Instant::now();
    set_clipboard(&guest, warm).await?;
    watch(&mut control, copied + Duration::from_secs(40), |v| {
        has(v, warm.as_bytes())
    })
    .await?;
    ensure!(
        has(&control, warm.as_bytes()),
        "control received no ServerCutText with {warm:?} in 40 s ({} cut texts, extended flags {:x?})",
        control.cut_texts.len(),
        control.extended_flags
    );
    eprintln!(
        "x11vnc sent its first selection {:?} after the copy",
        copied.elapsed()
    );

    // The desktop copies: control receives it within 10 s, view never does.
    let secret = "secret-123";
    let copied = Instant::now();
    set_clipboard(&guest, secret).await?;
    let control_updates = watch(&mut control, copied + Duration::from_secs(10), |v| {
        has(v, secret.as_bytes())
    })
    .await?;
    let took = copied.elapsed();
    ensure!(
        has(&control, secret.as_bytes()),
        "control received no ServerCutText with {secret:?} in 10 s ({} cut texts, {} extended, {control_updates} updates)",
        control.cut_texts.len(),
        control.extended_cut_texts
    );
    eprintln!("control received the desktop's clipboard {took:?} after the copy");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    done.store(true, Ordering::Relaxed);
    let (mut view, view_updates) = view_task.await?;
    let view_updates = view_updates?;
    ensure!(view_updates > 0, "the view connection received no update");
    ensure!(
        view.cut_texts.is_empty() && view.extended_cut_texts == 0,
        "view received the clipboard: {:?} ({} extended)",
        view.cut_texts,
        view.extended_cut_texts
    );
    eprintln!(
        "view: {view_updates} updates from before the first copy to 2.5 s after control had the secret, no ServerCutText; control: {control_updates} updates in the timed wait"
    );

    // The viewer pastes: control's text reaches the desktop, view's does not.
    let pasted = "pasted-from-control-42";
    control.send(&cut_text(pasted.as_bytes())).await?;
    let took = clipboard_becomes(&guest, pasted, Duration::from_secs(5))
        .await
        .context("control's ClientCutText")?;
    eprintln!("control's ClientCutText owned the desktop's clipboard in {took:?}");
    view.send(&cut_text(b"pasted-from-view-13")).await?;
    // The view connection stays up and keeps its updates coming meanwhile.
    let more = watch(&mut view, Instant::now() + Duration::from_secs(2), |_| {
        false
    })
    .await?;
    let now = clipboard(&guest).await?;
    ensure!(
        now == pasted,
        "view's ClientCutText changed the clipboard to {now:?}"
    );
    ensure!(
        view.cut_texts.is_empty() && view.extended_cut_texts == 0,
        "view received the clipboard after the paste: {:?}",
        view.cut_texts
    );
    eprintln!(
        "view's ClientCutText dropped ({more} updates meanwhile); the clipboard stayed {now:?}"
    );
    view.close().await;
    control.close().await;
    Ok(())
}
