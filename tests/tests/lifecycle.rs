//! End-to-end: a real `dormoused`, the real engine, the real desktop image,
//! driven only through the broker's HTTP API and WebSocket, with the engine
//! and `docker exec` as independent witnesses.
//!
//! Each test has its own broker and data directory, so they run in parallel.
//! No test asserts on wall-clock speed; waits are generous and say what they
//! waited for.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{is_ready, ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine::{self, EngineEventRecorder};
use dormouse_e2e::guest::Guest;
use dormouse_e2e::markers::Markers;
use dormouse_e2e::{browser, test_image};
use dormouse_protocol::api::{ComputerStatus, ContainerState, CreateComputer, StopReason};
use nix::sys::signal::Signal;
use uuid::Uuid;

/// Generous: two cores shared by parallel tests, each booting a desktop.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const STOPPED_TIMEOUT: Duration = Duration::from_secs(60);

/// The image, or `None` when the test must skip (visible; a failure under CI).
/// A broker with one new desktop that is ready.
async fn broker_with_ready_desktop(
    image: &str,
    name: &str,
) -> Result<(BrokerProcess, ApiClient, EventStream, Uuid)> {
    let broker = BrokerProcess::start(BrokerOptions::new(image)).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let created = api
        .create(&CreateComputer {
            name: Some(name.to_owned()),
            ..CreateComputer::default()
        })
        .await?;
    ensure!(
        created.image_id == image
            || image.ends_with(&created.image_id)
            || created.image_id.ends_with(image),
        "created from {} instead of {image}",
        created.image_id
    );
    api.wait_ready(&mut events, created.id, READY_TIMEOUT)
        .await
        .with_context(|| format!("new desktop; broker log:\n{}", broker.log_tail(3000)))?;
    Ok((broker, api, events, created.id))
}

/// The engine's container ID of computer `id`; fails when there is none.
async fn container_id(id: Uuid) -> Result<String> {
    let name = format!("dormouse-{id}");
    Ok(engine::inspect(&name)
        .await?
        .with_context(|| format!("container {name} does not exist"))?
        .id)
}

/// On failure, shows the end of the broker's log beside the error.
fn with_broker_log<T>(broker: &BrokerProcess, result: Result<T>) -> Result<T> {
    if result.is_err() {
        eprintln!(
            "--- dormoused log (tail) ---\n{}\n--- end of dormoused log ---",
            broker.log_tail(8000)
        );
    }
    result
}

fn ensure_no_false_reason(status: &ComputerStatus) -> Result<()> {
    ensure!(
        matches!(status.stop_reason, None | Some(StopReason::Killed)),
        "a kill behind the broker's back must not carry a reason the broker did not cause: {status:?}"
    );
    Ok(())
}

/// Steps 1–3 of the proof: create → ready → markers everywhere; a manual stop
/// and start keep them and the engine sees only stop/start; the reason
/// `manual` outlives a broker restart; `docker kill -s KILL` behind the
/// broker's back (twice, the first time with both browsers holding their
/// profiles) is reported without a false reason and resumes with every
/// marker, the login cookie and both browsers working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_kill_keep_every_marker() -> Result<()> {
    let Some(image) = test_image("stop_and_kill_keep_every_marker") else {
        return Ok(());
    };
    let (mut broker, api, events, id) = broker_with_ready_desktop(&image, "markers").await?;
    let result = stop_and_kill_keep_every_marker_scenario(&mut broker, api, events, id).await;
    with_broker_log(&broker, result)
}

// Over 100 lines on purpose: one scenario on one desktop, its steps in
// order, each checking the state the step before it left; apart, the story
// a reader follows would be spread over helpers that each need it all.
async fn stop_and_kill_keep_every_marker_scenario(
    broker: &mut BrokerProcess,
    mut api: ApiClient,
    mut events: EventStream,
    id: Uuid,
) -> Result<()> {
    let guest = Guest::for_computer(id);
    let workspace = broker.workspace(id);
    let original = container_id(id).await?;

    // 1. Markers in every place a user keeps things.
    let markers = Markers::new();
    markers.write_files(&guest).await?;
    markers.write_browser_profiles(&guest).await?;
    markers.verify_files(&guest, &workspace).await?;

    // 2. Manual stop and start.
    let recorder = EngineEventRecorder::start(guest.container())?;
    api.stop(id).await?;
    let stopped = api
        .wait_stopped(&mut events, id, STOPPED_TIMEOUT)
        .await?
        .status;
    ensure!(
        stopped.stop_reason == Some(StopReason::Manual),
        "a manual stop must say so: {stopped:?}"
    );
    ensure!(
        stopped.resumable,
        "a stopped desktop must be resumable: {stopped:?}"
    );
    ensure!(
        !stopped.ready,
        "a stopped desktop is not ready: {stopped:?}"
    );

    // The reason is on disk, not in memory.
    broker.restart().await?;
    api = broker.client();
    events = EventStream::open(&api).await?;
    // Reconciling may take a moment; the reason must come back, not vanish.
    api.wait_for(
        &mut events,
        id,
        "the restarted broker reports the desktop stopped for reason `manual`",
        STOPPED_TIMEOUT,
        |s| s.container == ContainerState::Stopped && s.stop_reason == Some(StopReason::Manual),
    )
    .await?;

    api.start(id).await?;
    let ready = api.wait_ready(&mut events, id, READY_TIMEOUT).await?.status;
    ensure!(
        ready.stop_reason.is_none(),
        "a start clears the stop reason: {ready:?}"
    );
    markers.verify_files(&guest, &workspace).await?;
    markers.verify_browser_profiles(&guest).await?;
    let actions = recorder.finish().await;
    engine::ensure_never_rebuilt(&actions)?;
    engine::ensure_action(&actions, "stop")?;
    engine::ensure_action(&actions, "start")?;
    eprintln!(
        "manual stop/start: engine saw {:?}",
        engine::lifecycle_actions(&actions)
    );

    // 3. Killed behind the broker's back, twice.
    for round in 1..=2 {
        let recorder = EngineEventRecorder::start(guest.container())?;
        let held = if round == 1 {
            Some(browser::hold_profiles(&guest).await?)
        } else {
            None
        };
        engine::kill(guest.container()).await?;
        let killed = api
            .wait_stopped(&mut events, id, STOPPED_TIMEOUT)
            .await?
            .status;
        ensure_no_false_reason(&killed)?;
        ensure!(
            killed.resumable,
            "a killed desktop must be resumable: {killed:?}"
        );

        api.start(id).await?;
        api.wait_ready(&mut events, id, READY_TIMEOUT)
            .await
            .with_context(|| format!("resume after kill {round}"))?;
        if let Some(held) = held {
            browser::ensure_stale_locks_cleared(&guest, &held).await?;
        }
        markers.verify_files(&guest, &workspace).await?;
        markers.verify_browser_profiles(&guest).await?;
        let actions = recorder.finish().await;
        engine::ensure_never_rebuilt(&actions)?;
        engine::ensure_action(&actions, "start")?;
        eprintln!(
            "kill {round}: engine saw {:?}",
            engine::lifecycle_actions(&actions)
        );
    }

    ensure!(
        container_id(id).await? == original,
        "the container was replaced"
    );
    Ok(())
}

/// Step 4: the broker dies by SIGKILL while a stop is in flight. After a
/// restart it reconciles: a stop it had put on record (the guest was already
/// `stopping`) is finished and reported `manual`; otherwise the desktop is
/// either stopped and resumable or running and ready, never half-way. It is
/// never removed: the same container and its workspace are still there and
/// it resumes with every marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_mid_stop_reconciles() -> Result<()> {
    let Some(image) = test_image("broker_killed_mid_stop_reconciles") else {
        return Ok(());
    };
    let (mut broker, api, events, id) = broker_with_ready_desktop(&image, "mid-stop").await?;
    let result = broker_killed_mid_stop_reconciles_scenario(&mut broker, api, events, id).await;
    with_broker_log(&broker, result)
}

// Over 100 lines on purpose: one scenario on one desktop, its steps in
// order, each checking the state the step before it left; apart, the story
// a reader follows would be spread over helpers that each need it all.
async fn broker_killed_mid_stop_reconciles_scenario(
    broker: &mut BrokerProcess,
    api: ApiClient,
    mut events: EventStream,
    id: Uuid,
) -> Result<()> {
    let guest = Guest::for_computer(id);
    let workspace = broker.workspace(id);
    let original = container_id(id).await?;
    let markers = Markers::new();
    markers.write_files(&guest).await?;
    let recorder = EngineEventRecorder::start(guest.container())?;

    // Stop in flight; kill the broker the moment it reports the guest
    // stopping (or after a short while if that is never pushed).
    let stopping = {
        let api = api.clone();
        tokio::spawn(async move { api.stop(id).await })
    };
    let seen_stopping = api
        .wait_for(
            &mut events,
            id,
            "stop under way",
            Duration::from_millis(400),
            |s| {
                s.phase == Some(dormouse_protocol::guest::Phase::Stopping)
                    || s.container == ContainerState::Stopped
            },
        )
        .await
        .ok();
    broker.kill(Signal::SIGKILL).await?;
    let stop_answer = stopping.await.context("stop task")?;
    eprintln!(
        "broker killed mid-stop (stopping seen: {}); the stop request ended with {:?}",
        seen_stopping.is_some(),
        stop_answer.as_ref().map(|s| s.container)
    );

    // Nothing may have been removed while the broker was gone.
    ensure!(
        container_id(id).await? == original,
        "the container vanished or was replaced while the broker was down"
    );

    broker.start_again().await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let first = api.get(id).await?;
    eprintln!(
        "first status after the restart: container {:?}, ready {}, phase {:?}, stop_reason {:?}",
        first.container, first.ready, first.phase, first.stop_reason
    );
    let settled = if seen_stopping.is_some() {
        // The broker persists its stop intent before it asks the guest to
        // quiesce, and the guest only reports `stopping` once asked: this
        // stop was on record, and the documented behaviour is that the
        // restarted broker finishes it.
        api.wait_for(
            &mut events,
            id,
            "the restarted broker finishes the interrupted stop (stopped, reason manual)",
            READY_TIMEOUT,
            |s| s.container == ContainerState::Stopped && s.stop_reason == Some(StopReason::Manual),
        )
        .await?
        .status
    } else {
        api.wait_for(
            &mut events,
            id,
            "a coherent state (stopped and resumable, or running and ready)",
            READY_TIMEOUT,
            |s| (s.container == ContainerState::Stopped && s.resumable) || is_ready(s),
        )
        .await?
        .status
    };
    eprintln!(
        "after the restart: container {:?}, ready {}, stop_reason {:?}",
        settled.container, settled.ready, settled.stop_reason
    );
    ensure!(
        settled.stop_reason != Some(StopReason::Idle),
        "an interrupted manual stop is not an idle stop: {settled:?}"
    );
    ensure!(
        container_id(id).await? == original,
        "reconciling replaced the container"
    );
    if settled.container == ContainerState::Stopped {
        ensure!(!settled.ready, "stopped but ready: {settled:?}");
        api.start(id).await?;
        api.wait_ready(&mut events, id, READY_TIMEOUT).await?;
    }
    markers.verify_files(&guest, &workspace).await?;
    let actions = recorder.finish().await;
    engine::ensure_never_rebuilt(&actions)?;
    eprintln!("engine saw {:?}", engine::lifecycle_actions(&actions));
    Ok(())
}

/// Step 5: removing a computer keeps its workspace (browser profiles
/// included); a new computer created with `workspace_from` reads the files
/// and Chromium still has its login cookie. A purge then deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_keeps_workspace_for_readoption() -> Result<()> {
    let Some(image) = test_image("remove_keeps_workspace_for_readoption") else {
        return Ok(());
    };
    let (mut broker, api, events, id) = broker_with_ready_desktop(&image, "first").await?;
    let result = remove_keeps_workspace_for_readoption_scenario(&mut broker, api, events, id).await;
    with_broker_log(&broker, result)
}

async fn remove_keeps_workspace_for_readoption_scenario(
    broker: &mut BrokerProcess,
    api: ApiClient,
    mut events: EventStream,
    old: Uuid,
) -> Result<()> {
    let old_guest = Guest::for_computer(old);
    let old_workspace = broker.workspace(old);
    let markers = Markers::new();
    markers.write_files(&old_guest).await?;
    browser::chromium_set_cookie(&old_guest, markers.token()).await?;

    api.remove(old, false).await?;
    let gone = api.get(old).await;
    ensure!(
        gone.as_ref().err().and_then(|e| e.status())
            == Some(dormouse_e2e::client::StatusCode::NOT_FOUND),
        "a removed computer must be 404: {gone:?}"
    );
    ensure!(
        engine::inspect(old_guest.container()).await?.is_none(),
        "remove must remove the container"
    );
    let kept = old_workspace.join(dormouse_e2e::markers::WORKSPACE_MARKER_NAME);
    ensure!(
        std::fs::read_to_string(&kept).ok().as_deref() == Some(markers.token()),
        "remove must keep the workspace: {} is gone or changed",
        kept.display()
    );

    let adopted = api
        .create(&CreateComputer {
            name: Some("second".into()),
            workspace_from: Some(old),
            ..CreateComputer::default()
        })
        .await?;
    ensure!(adopted.id != old, "a new computer gets a new id");
    api.wait_ready(&mut events, adopted.id, READY_TIMEOUT)
        .await?;
    let new_guest = Guest::for_computer(adopted.id);
    let new_workspace = {
        let own = broker.workspace(adopted.id);
        if own.exists() {
            own
        } else {
            old_workspace.clone()
        }
    };
    markers.verify_workspace(&new_guest, &new_workspace).await?;
    browser::chromium_has_cookie(&new_guest, markers.token())
        .await
        .context("the login cookie lives in the workspace and must come along")?;

    api.remove(adopted.id, true).await?;
    ensure!(
        engine::inspect(new_guest.container()).await?.is_none(),
        "remove must remove the container"
    );
    ensure!(
        !new_workspace
            .join(dormouse_e2e::markers::WORKSPACE_MARKER_NAME)
            .exists(),
        "remove with purge must delete the workspace {}",
        new_workspace.display()
    );
    Ok(())
}
