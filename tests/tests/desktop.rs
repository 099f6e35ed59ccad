//! End-to-end: the desktop a model sees, through a real `dormoused`, the
//! real engine and the real image: the taskbar the image starts by default,
//! the height the status reports for it, and Chromium with its own sandbox
//! under Dormouse's seccomp profile.
//!
//! Witnesses independent of the broker: `docker exec ps` for who runs what,
//! `xwininfo`/`xprop` in the guest for the taskbar's window and the window
//! manager's work area, `/proc` in the guest for Chromium's namespaces and
//! seccomp filters, `docker inspect` for the container's profile. Saves
//! `docs/images/desktop-taskbar.png` and `docs/images/desktop-chromium.png`
//! (the API's screenshots).
//!
//! Needs Docker and the desktop image (`DORMOUSE_TEST_IMAGE`); skips with a
//! visible message without them (fails under `CI=true`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_e2e::broker::ready_desktop;
use dormouse_e2e::client::ApiClient;
use dormouse_e2e::desk::{png_pixel, png_size};
use dormouse_e2e::engine;
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::{desktop_image, docker_available};
use serde_json::{json, Value};
use uuid::Uuid;

const SCREEN_HEIGHT: u32 = 800;
/// The colour the supervisor gives the bare desktop.
const DESKTOP_RGB: [u8; 3] = [0x3b, 0x5b, 0x7a];
/// The x of the taskbar's Chromium launcher, its second button (the
/// buttons are labelled: Terminal, Chromium, Firefox, Files).
const CHROMIUM_LAUNCHER_X: u32 = 158;
/// The profile the broker ships, read from the source tree (not through
/// the broker) to compare with what the engine applied.
const PROFILE: &str = include_str!("../../host-broker/docker/seccomp/dormouse.json");

/// `uid args` of every process in the guest.
async fn guest_ps(guest: &Guest) -> Result<Vec<(u32, String)>> {
    let out = engine::docker_ok(&["exec", guest.container(), "ps", "-eo", "uid=,args="]).await?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (uid, args) = l.trim().split_once(' ')?;
            Some((uid.parse().ok()?, args.trim().to_owned()))
        })
        .collect())
}

/// Waits (up to `within`) for `probe` to answer `Some`; the last error
/// otherwise.
async fn eventually<T, F, Fut>(within: Duration, what: &str, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => String::from("not yet"),
            Err(e) => format!("{e:#}"),
        };
        if tokio::time::Instant::now() > deadline {
            bail!("{what}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The taskbar's window as the X server has it: `(id, y, height)` of the
/// window named `tint2` (inside the window manager's frame), read with
/// `xwininfo`.
async fn taskbar_window(guest: &Guest) -> Result<(String, u32, u32)> {
    let tree = guest.sh_ok(GuestUser::Desk, "xwininfo -root -tree").await?;
    let Some(id) = tree
        .lines()
        .find(|l| l.contains("\"tint2\": ("))
        .and_then(|l| l.split_whitespace().next())
    else {
        bail!("no window named tint2 in the tree:\n{tree}");
    };
    let info = guest
        .sh_ok(GuestUser::Desk, &format!("xwininfo -id {id}"))
        .await?;
    let field = |name: &str| -> Result<u32> {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("{name} in {info}"))
    };
    Ok((
        id.to_owned(),
        field("Absolute upper-left Y:")?,
        field("Height:")?,
    ))
}

/// An action batch through the API; its answer.
async fn actions(api: &ApiClient, id: Uuid, batch: &Value) -> Result<Value> {
    Ok(api
        .call::<Value, Value>(
            dormouse_client::Method::POST,
            &format!("/v1/computers/{id}/actions"),
            Some(batch),
        )
        .await?)
}

/// The guest's process list as text, for failure messages.
async fn guest_ps_text(guest: &Guest) -> String {
    match guest_ps(guest).await {
        Ok(ps) => ps
            .iter()
            .map(|(uid, args)| format!("{uid} {args}"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("{e:#}"),
    }
}

fn save(name: &str, png: &[u8]) -> Result<()> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/images");
    std::fs::create_dir_all(&docs)?;
    std::fs::write(docs.join(name), png).with_context(|| format!("saving {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Over 100 lines on purpose: one real-engine test told in order (set up,
// witness the taskbar, open Chromium, witness its sandbox, clean up); its
// steps share the desktop and the witnesses.
async fn the_desktop_has_a_taskbar_and_chromium_keeps_its_sandbox() -> Result<()> {
    let test = "the_desktop_has_a_taskbar_and_chromium_keeps_its_sandbox";
    if !docker_available(test) {
        return Ok(());
    }
    let Some(image) = desktop_image(test) else {
        return Ok(());
    };
    let (broker, api, id) = ready_desktop(&image, "desk-taskbar").await?;
    let guest = Guest::for_computer(id);
    let result = async {
        // ---- the taskbar, as the status reports it and X has it ---------
        // Readiness does not wait for the taskbar, but the first screenshot
        // after ready shows it: its band in the taskbar's colours, the bare
        // desktop right above it.
        let first = api.screenshot(id).await?;
        let status = api.get(id).await?;
        let Some(height) = status.taskbar_height else {
            bail!("a desktop with its first screenshot taken reports no taskbar_height: {status:?}");
        };
        ensure!((16..=64).contains(&height), "taskbar_height {height}");
        let band = png_pixel(&first, 640, SCREEN_HEIGHT - height / 2);
        let above = png_pixel(&first, 640, SCREEN_HEIGHT - height - 4);
        ensure!(
            band.is_some() && band != Some(DESKTOP_RGB) && band != Some([0, 0, 0]),
            "the first screenshot after ready has no taskbar: {band:?} in its band"
        );
        ensure!(
            above == Some(DESKTOP_RGB),
            "above the band the bare desktop shows, not {above:?}"
        );
        save("desktop-first-screenshot.png", &first)?;
        let phases = status.start_phases.context("a running desktop's start phases")?;
        ensure!(
            phases.ready_ms.is_some() && phases.taskbar_ms.is_some(),
            "start phases: {phases:?}"
        );
        let ps = guest_ps(&guest).await?;
        for program in ["tint2 -c /etc/dormouse/tint2rc", "openbox"] {
            let runs: Vec<_> = ps.iter().filter(|(_, a)| a.starts_with(program)).collect();
            ensure!(
                !runs.is_empty() && runs.iter().all(|(uid, _)| *uid == 1000),
                "{program} must run, as uid 1000 only: {ps:?}"
            );
        }
        let (window, y, h) = taskbar_window(&guest).await?;
        ensure!(
            h == height && y + h == SCREEN_HEIGHT,
            "the tint2 window is {h} rows at y {y}; the status says {height}"
        );
        let kind = guest
            .sh_ok(
                GuestUser::Desk,
                &format!("xprop -id {window} _NET_WM_WINDOW_TYPE; xprop -root _NET_WORKAREA"),
            )
            .await?;
        ensure!(kind.contains("_NET_WM_WINDOW_TYPE_DOCK"), "{kind}");
        ensure!(
            kind.contains(&format!("0, 0, 1280, {}", SCREEN_HEIGHT - height)),
            "the work area must end above the taskbar: {kind}"
        );
        // The Terminal launcher, the taskbar's first button, as a model
        // would use it: a click on the band through the actions API opens
        // an xterm in the workspace within 5 s.
        let click = json!({"actions": [
            {"action": "left_click", "coordinate": [40, SCREEN_HEIGHT - height / 2]},
        ]});
        actions(&api, id, &click).await?;
        let xterm = eventually(
            Duration::from_secs(5),
            "an xterm from the launcher",
            || async {
                let out = guest
                    .sh(
                        GuestUser::Desk,
                        "xdotool search --onlyvisible --class XTerm",
                    )
                    .await?;
                Ok(out.status.success().then_some(()))
            },
        )
        .await;
        let cwd = guest
            .sh(
                GuestUser::Desk,
                "readlink /proc/$(pgrep -u 1000 -x xterm | head -1)/cwd",
            )
            .await?;
        if let Err(e) = xterm {
            bail!("{e:#}; the guest runs:\n{}", guest_ps_text(&guest).await);
        }
        ensure!(
            String::from_utf8_lossy(&cwd.stdout).trim() == "/home/desk/workspace",
            "the terminal opened elsewhere: {cwd:?}"
        );
        let typed = json!({"actions": [
            {"action": "type", "text": "echo The Dormouse desktop; pwd\n"},
        ]});
        actions(&api, id, &typed).await?;
        let shot = api.screenshot(id).await?;
        ensure!(png_size(&shot) == Some((1280, SCREEN_HEIGHT)), "screenshot");
        save("desktop-taskbar.png", &shot)?;
        // Above the centred terminal the bare desktop shows, in its colour.
        let bare = png_pixel(&shot, 20, 20);
        ensure!(
            bare == Some(DESKTOP_RGB),
            "the bare desktop is {bare:?}, not {DESKTOP_RGB:?}"
        );

        // ---- the container's seccomp profile is Dormouse's --------------
        let opts = engine::docker_ok(&[
            "inspect",
            "--format",
            "{{json .HostConfig.SecurityOpt}}",
            guest.container(),
        ])
        .await?;
        let opts: Vec<String> = serde_json::from_str(opts.trim())?;
        let applied: Vec<&str> = opts
            .iter()
            .filter_map(|o| o.strip_prefix("seccomp="))
            .collect();
        ensure!(applied.len() == 1, "one seccomp option: {opts:?}");
        let applied: Value = serde_json::from_str(applied[0]).context("the applied profile")?;
        let shipped: Value = serde_json::from_str(PROFILE)?;
        ensure!(
            applied == shipped,
            "the container's profile is not Dormouse's"
        );
        ensure!(opts.iter().any(|o| o.starts_with("no-new-privileges")));

        // ---- Chromium with its own sandbox ------------------------------
        // Opened as a model would: a click on the taskbar's Chromium
        // launcher (its second button) through the actions API; its window
        // must be up within 5 s. Then chrome://sandbox is typed into its
        // address bar (Chromium opens no chrome:// page named on its
        // command line).
        let click = json!({"actions": [
            {"action": "left_click", "coordinate": [CHROMIUM_LAUNCHER_X, SCREEN_HEIGHT - height / 2]},
        ]});
        actions(&api, id, &click).await?;
        let visible = |name: &'static str| {
            let guest = guest.clone();
            move || {
                let guest = guest.clone();
                async move {
                    let out = guest
                        .sh(
                            GuestUser::Desk,
                            &format!("xdotool search --onlyvisible --name '{name}'"),
                        )
                        .await?;
                    Ok(out.status.success().then_some(()))
                }
            }
        };
        let opened = eventually(
            Duration::from_secs(5),
            "Chromium's window from the launcher",
            visible("Chromium"),
        )
        .await;
        if let Err(e) = opened {
            bail!("{e:#}; the guest runs:\n{}", guest_ps_text(&guest).await);
        }
        let batch = json!({"actions": [
            {"action": "key", "text": "ctrl+l"},
            {"action": "type", "text": "chrome://sandbox\n"},
        ]});
        actions(&api, id, &batch).await?;
        eventually(
            Duration::from_secs(30),
            "the chrome://sandbox page",
            visible("Sandbox Status"),
        )
        .await?;
        let ps = guest_ps(&guest).await?;
        let chromium: Vec<_> = ps
            .iter()
            .filter(|(_, a)| a.starts_with("/usr/lib/chromium/chromium"))
            .collect();
        ensure!(
            chromium.iter().any(|(_, a)| a.contains("--type=zygote")),
            "no zygote: {chromium:?}"
        );
        ensure!(
            chromium
                .iter()
                .all(|(uid, a)| *uid == 1000 && !a.contains("--no-sandbox")),
            "Chromium must run as uid 1000 without --no-sandbox: {chromium:?}"
        );
        // A renderer: in a user namespace of its own (its uid map is not
        // the container's), a PID namespace of its own (two pids in NSpid)
        // and under seccomp filters (mode 2), as /proc in the guest tells.
        // (Its ns links are out of reach: Chromium makes it undumpable.)
        let renderer = guest
            .sh_ok(
                GuestUser::Root,
                "init=$(tr -s ' ' < /proc/1/uid_map | tr ' ' _); \
                 for p in $(pgrep -f -- '--type=renderer'); do \
                   map=$(tr -s ' ' < /proc/$p/uid_map | tr ' ' _); \
                   echo \"$p $map $init $(awk '/^NSpid:/{print NF-1} /^Seccomp:/{print $2}' \
                     /proc/$p/status | tr '\\n' ' ')\"; \
                 done",
            )
            .await?;
        let sandboxed = renderer.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 5 && f[1] != f[2] && f[3].parse::<u32>().is_ok_and(|d| d >= 2) && f[4] == "2"
        });
        ensure!(
            sandboxed,
            "no renderer in its own user and PID namespaces with seccomp on \
             (pid uid_map container-uid_map nspid-depth seccomp):\n{renderer}"
        );
        let shot = api.screenshot(id).await?;
        save("desktop-chromium.png", &shot)?;
        Ok(())
    }
    .await;
    let ps = guest_ps_text(&guest).await;
    drop(broker);
    result.with_context(|| format!("the guest runs:\n{ps}"))
}
