//! End-to-end: computer-use actions through a real `dormoused` into a real
//! desktop, witnessed by a page in Chromium on that desktop whose window
//! title mirrors what it receives, read with `xprop` through `docker exec`
//! (never through Dormouse), and by the guest's own input idle time.
//!
//! One desktop, many checks in one test (two cores in CI). No assertion on
//! speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{with_broker, BrokerProcess};
use dormouse_e2e::client::{ApiClient, ClientError, EventStream, Waits as _};
use dormouse_e2e::desk::{self, base64_decode, page_state, page_state_when, png_size};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_protocol::api::{CreateComputer, LeaseRequest};
use dormouse_protocol::{Request, Response};
use serde_json::{json, Value};
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const SAMPLE: &str = "Grüße, 世界 ✓ — ¿qué? «ok»\t\n";
const SEEN: Duration = Duration::from_secs(20);

/// A batch through the API as raw JSON: the answer, or (status, code,
/// message).
async fn post(api: &ApiClient, id: Uuid, batch: &Value) -> Result<Value, (u16, String, String)> {
    let path = format!("/v1/computers/{id}/actions");
    match api
        .call::<Value, Value>(dormouse_client::Method::POST, &path, Some(batch))
        .await
    {
        Ok(v) => Ok(v),
        Err(ClientError::Api {
            status,
            code,
            message,
            ..
        }) => Err((status.as_u16(), code, message)),
        Err(e) => Err((0, "transport".into(), e.to_string())),
    }
}

async fn ok(api: &ApiClient, id: Uuid, batch: Value) -> Result<Vec<Value>> {
    let answer = post(api, id, &batch)
        .await
        .map_err(|e| anyhow::anyhow!("{batch}: {e:?}"))?;
    let results = answer["results"].as_array().cloned().unwrap_or_default();
    ensure!(
        results.iter().all(|r| r["ok"] == true),
        "{batch}: {results:?}"
    );
    Ok(results)
}

fn text_of(state: &Value) -> String {
    state["t"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_drive_a_real_desktop_exactly() -> Result<()> {
    with_broker("actions_drive_a_real_desktop_exactly", scenario).await
}

// Over 100 lines on purpose: one scenario on one desktop, its steps in
// order, each checking the state the step before it left; apart, the story
// a reader follows would be spread over helpers that each need it all.
async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = api
        .create(&CreateComputer {
            name: Some("actions".into()),
            ..CreateComputer::default()
        })
        .await?
        .id;
    api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);
    let socket = broker
        .data_dir()
        .join("computers")
        .join(id.to_string())
        .join("run")
        .join(dormouse_protocol::SOCKET_FILE_NAME);

    // An unknown id and a computer that is not ready.
    let err = post(
        &api,
        Uuid::new_v4(),
        &json!({"actions": [{"action": "cursor_position"}]}),
    )
    .await
    .unwrap_err();
    ensure!(err.0 == 404, "{err:?}");

    desk::open_page(&guest, &broker.workspace(id), "actions.html", desk::PAGE).await?;

    // The pointer: the page learns where its viewport is on the screen.
    // The window may still be mapping: move until the page sees motion.
    for i in 0..40 {
        let x = 500 + (i % 2) * 40;
        ok(
            &api,
            id,
            json!({"actions": [{"action": "mouse_move", "coordinate": [x, 380]}]}),
        )
        .await?;
        if page_state(&guest).await?["o"].is_array() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let r = ok(
        &api,
        id,
        json!({"actions": [{"action": "mouse_move", "coordinate": [600, 380]},
                           {"action": "mouse_move", "coordinate": [641, 401]},
                           {"action": "cursor_position"}]}),
    )
    .await?;
    ensure!(r[2]["coordinate"] == json!([641, 401]), "{r:?}");
    let state = page_state_when(&guest, SEEN, |s| s["o"].is_array()).await?;
    if !state["o"].is_array() {
        let tree = guest
            .sh(
                GuestUser::Desk,
                "xwininfo -root -tree | head -40; xdotool getmouselocation",
            )
            .await?;
        eprintln!(
            "no pointer motion seen by the page: {state}\n{}",
            String::from_utf8_lossy(&tree.stdout)
        );
    }
    let (ox, oy) = (
        state["o"][0].as_i64().context("origin")?,
        state["o"][1].as_i64().context("origin")?,
    );
    eprintln!("viewport origin on the screen: {ox},{oy}");

    // Input counts as the guest's input: idle before, fresh after.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = |f: dormouse_protocol::frame::Frame<Response>| match f.message {
        Response::Activity(a) => a.input_idle_ms,
        _ => None,
    };
    let before = idle(desk::guest_call(&socket, &Request::Activity).await?);
    ok(
        &api,
        id,
        json!({"actions": [{"action": "mouse_move", "coordinate": [640, 400]}]}),
    )
    .await?;
    let after = idle(desk::guest_call(&socket, &Request::Activity).await?);
    ensure!(
        before.is_some_and(|b| b >= 2500) && after.is_some_and(|a| a < 1500),
        "input idle before {before:?}, after {after:?}"
    );

    // Plain ASCII first, with the layout the desktop starts with.
    let r = ok(
        &api,
        id,
        json!({"actions": [
            {"action": "left_click", "coordinate": [ox + 200, oy + 100]},
            {"action": "type", "text": "abc"}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| text_of(s) == "abc").await?;
    ensure!(text_of(&state) == "abc", "abc: {state} {r:?}");

    // Exact typing under us, de and fr.
    for layout in ["us", "de", "fr"] {
        guest
            .sh_ok(GuestUser::Desk, &format!("setxkbmap {layout}"))
            .await?;
        ok(
            &api,
            id,
            json!({"actions": [
                {"action": "left_click", "coordinate": [ox + 200, oy + 100]},
                {"action": "key", "text": "ctrl+a BackSpace"},
                {"action": "type", "text": SAMPLE}]}),
        )
        .await?;
        let state = page_state_when(&guest, SEEN, |s| text_of(s) == SAMPLE).await?;
        ensure!(text_of(&state) == SAMPLE, "{layout}: {state}");
    }
    guest.sh_ok(GuestUser::Desk, "setxkbmap us").await?;

    // A scaled click (1280x800 in 1024x768 is 1024x640) lands on the
    // button drawn under it, at the pixel the scaling rule says.
    let target = [ox + 640, oy + 320];
    let scaled = [target[0] * 4 / 5, target[1] * 4 / 5];
    let expect = [(2 * scaled[0] + 1) * 5 / 8, (2 * scaled[1] + 1) * 5 / 8];
    let r = ok(
        &api,
        id,
        json!({"actions": [{"action": "left_click", "coordinate": scaled},
                           {"action": "mouse_move", "coordinate": [scaled[0] + 3, scaled[1] + 1]},
                           {"action": "cursor_position"},
                           {"action": "screenshot"},
                           {"action": "zoom", "region": [0, 0, 100, 50]}],
               "scale": {"width": 1024, "height": 768}}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| s["c"].is_array()).await?;
    // On the button; the position Chromium reports for it is its latest
    // pointer position (here already the next move's, a few pixels on).
    let near = |i: usize, want: i64| (state["c"][i].as_i64().unwrap_or(-99) - want).abs() <= 5;
    ensure!(
        state["c"][0] == "b" && state["md"][0] == "b" && near(1, expect[0]) && near(2, expect[1]),
        "scaled click at {scaled:?} expected on the button at {expect:?}: {state}"
    );
    // Right after a click (which the window manager's click-to-focus grab
    // freezes for a moment), the position is the later move's.
    ensure!(
        r[2]["coordinate"] == json!([scaled[0] + 3, scaled[1] + 1]),
        "cursor_position after a click and a move answered {:?}, moved to {:?}",
        r[2]["coordinate"],
        [scaled[0] + 3, scaled[1] + 1]
    );
    ensure!(r[3]["size"] == json!([1024, 640]), "{:?}", r[3]["size"]);
    let shot = base64_decode(r[3]["image"]["data"].as_str().unwrap_or("")).context("base64")?;
    ensure!(png_size(&shot) == Some((1024, 640)), "screenshot PNG");
    // The zoom's region is [0, 0, 125, 63) on the screen, at native size.
    let zoom = base64_decode(r[4]["image"]["data"].as_str().unwrap_or("")).context("base64")?;
    ensure!(
        png_size(&zoom) == Some((125, 63)) && r[4]["size"] == json!([125, 63]),
        "zoom {:?} {:?}",
        png_size(&zoom),
        r[4]["size"]
    );

    // Shift held around a click.
    ok(
        &api,
        id,
        json!({"actions": [{"action": "left_click", "coordinate": [ox + 300, oy + 300], "text": "shift"}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| s["c"][4] == 2).await?;
    ensure!(state["c"][3] == 1, "shift-click: {state}");

    // Drag across the drag area.
    ok(
        &api,
        id,
        json!({"actions": [{"action": "left_click_drag",
                            "start_coordinate": [ox + 100, oy + 530],
                            "coordinate": [ox + 600, oy + 580]}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| s["up"].is_array()).await?;
    ensure!(
        state["down"] == json!([100, 530])
            && state["up"] == json!([600, 580])
            && state["moved"].as_i64().unwrap_or(0) > 0,
        "drag: {state}"
    );

    // The wheel, down then right.
    ok(
        &api,
        id,
        json!({"actions": [{"action": "scroll", "coordinate": [ox + 640, oy + 560],
                            "scroll_direction": "down", "scroll_amount": 3}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| s["wy"].as_f64().unwrap_or(0.0) > 0.0).await?;
    ensure!(
        state["wy"].as_f64().unwrap_or(0.0) > 0.0,
        "scroll down: {state}"
    );
    ok(
        &api,
        id,
        json!({"actions": [{"action": "scroll", "scroll_direction": "right", "scroll_amount": 2}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| s["wx"].as_f64().unwrap_or(0.0) > 0.0).await?;
    ensure!(
        state["wx"].as_f64().unwrap_or(0.0) > 0.0,
        "scroll right: {state}"
    );

    // Back to the top: the line below is where the page drew it.
    ok(
        &api,
        id,
        json!({"actions": [{"action": "scroll", "scroll_direction": "up", "scroll_amount": 10},
                           {"action": "scroll", "scroll_direction": "left", "scroll_amount": 10},
                           {"action": "wait", "duration": 0.8}]}),
    )
    .await?;

    // A key held for 0.6 s, and a triple click that selects the line.
    ok(
        &api,
        id,
        json!({"actions": [{"action": "hold_key", "text": "shift", "duration": 0.6},
                           {"action": "triple_click", "coordinate": [ox + 120, oy + 460]}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| {
        s["sel"].as_str().is_some_and(|t| t.contains("lazy"))
            && s["hold"][1].as_i64().unwrap_or(0) > 0
    })
    .await?;
    ensure!(
        state["hold"][0] == "Shift" && state["hold"][1].as_i64().unwrap_or(0) >= 550,
        "hold_key: {state}"
    );
    ensure!(
        state["sel"].as_str().unwrap_or("").trim() == "The quick brown fox jumps over the lazy dog",
        "a triple click selected {:?}, not the line",
        state["sel"]
    );

    // Back into the text area: everything refused below must type nothing.
    ok(
        &api,
        id,
        // Keys right after the click go where the click put the focus (the
        // text area, not the line the triple click selected).
        json!({"actions": [{"action": "left_click", "coordinate": [ox + 200, oy + 100]},
                           {"action": "key", "text": "ctrl+a BackSpace"},
                           {"action": "type", "text": "kept"}]}),
    )
    .await?;
    let state = page_state_when(&guest, SEEN, |s| text_of(s) == "kept").await?;
    ensure!(text_of(&state) == "kept", "{state}");
    let typed = json!({"action": "type", "text": "NO"});
    let long = "a".repeat(64 * 1024 + 1);
    let bad: Vec<(&str, Value)> = vec![
        (
            "unknown action",
            json!({"actions": [typed, {"action": "fly"}]}),
        ),
        (
            "unknown key",
            json!({"actions": [typed, {"action": "key", "text": "ctrl+Nope"}]}),
        ),
        (
            "off screen",
            json!({"actions": [typed, {"action": "left_click", "coordinate": [1280, 10]}]}),
        ),
        (
            "off the scaled space",
            json!({"actions": [typed, {"action": "left_click", "coordinate": [1100, 10]}],
                                         "scale": {"width": 1024, "height": 768}}),
        ),
        (
            "64 KiB + 1",
            json!({"actions": [typed, {"action": "type", "text": long}]}),
        ),
        ("101 actions", json!({"actions": vec![typed.clone(); 101]})),
        (
            "negative duration",
            json!({"actions": [typed, {"action": "wait", "duration": -1}]}),
        ),
    ];
    for (what, batch) in &bad {
        let err = post(&api, id, batch).await.unwrap_err();
        ensure!(
            err.0 == 400 && err.1 == "invalid_actions",
            "{what}: {:?}",
            (err.0, &err.1, err.2.chars().take(200).collect::<String>())
        );
        eprintln!(
            "refused ({what}): {}",
            err.2.chars().take(160).collect::<String>()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        text_of(&page_state(&guest).await?) == "kept",
        "a refused batch typed"
    );

    // Fenced: with a lease, a stale generation is 409 and types nothing.
    let grant = api
        .lease(
            id,
            &LeaseRequest {
                holder: "e2e".into(),
                ttl_ms: 600_000,
            },
        )
        .await?;
    let stale = api.with_generation(Some(grant.generation - 1));
    let err = post(&stale, id, &json!({"actions": [typed]}))
        .await
        .unwrap_err();
    ensure!(err.0 == 409 && err.1 == "stale_generation", "{err:?}");
    let err = post(&api, id, &json!({"actions": [typed]}))
        .await
        .unwrap_err();
    ensure!(err.0 == 409, "no generation under a live lease: {err:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        text_of(&page_state(&guest).await?) == "kept",
        "a fenced batch typed"
    );
    let api = api.with_generation(Some(grant.generation));

    // A batch that fails part-way: Control held behind its back makes
    // typing refuse; the answer says what ran.
    guest.sh_ok(GuestUser::Desk, "xdotool keydown ctrl").await?;
    let answer = post(
        &api,
        id,
        &json!({"actions": [{"action": "cursor_position"}, {"action": "type", "text": "x"},
                            {"action": "cursor_position"}]}),
    )
    .await;
    guest.sh_ok(GuestUser::Desk, "xdotool keyup ctrl").await?;
    let answer = answer.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let results = answer["results"].as_array().cloned().unwrap_or_default();
    ensure!(
        results.len() == 2
            && results[0]["ok"] == true
            && results[1]["ok"] == false
            && results[1]["error"]["code"] == "modifiers_active",
        "{results:?}"
    );
    ensure!(
        text_of(&page_state(&guest).await?) == "kept",
        "typed under ctrl"
    );
    Ok(())
}
