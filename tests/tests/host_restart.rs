//! End-to-end: coming back after a host restart. Desktops run; the broker
//! is SIGKILLed and their containers `docker kill`ed behind it (the host
//! going down, as far as the broker and the engine can tell); the broker
//! starts again. With `--resume-after-restart running` (the default)
//! exactly the desktops that were running come back ready, and one stopped
//! through the API stays stopped; with `none` nothing starts. The engine is
//! the witness: `docker inspect` (`StartedAt`, state) and `docker events`
//! (a `start`, and never a `create` or `destroy`).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine::{self, ContainerFacts, EngineEventRecorder};
use dormouse_e2e::test_image;
use dormouse_protocol::api::{ContainerState, StopReason};
use nix::sys::signal::Signal;
use uuid::Uuid;

/// Generous: two cores shared by parallel tests, each booting desktops.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOPPED_TIMEOUT: Duration = Duration::from_secs(60);

fn name(id: Uuid) -> String {
    format!("dormouse-{id}")
}

async fn facts(id: Uuid) -> Result<ContainerFacts> {
    engine::inspect(&name(id))
        .await?
        .with_context(|| format!("container {} is gone", name(id)))
}

/// The broker dies by SIGKILL, then `ids` are killed by the engine, as when
/// the host goes down; returns what the engine said of each after the kill,
/// and a recorder of each container's events from then on.
async fn host_goes_down(
    broker: &mut BrokerProcess,
    ids: &[Uuid],
) -> Result<Vec<(ContainerFacts, EngineEventRecorder)>> {
    broker.kill(Signal::SIGKILL).await?;
    let mut after = Vec::new();
    for id in ids {
        if facts(*id).await?.status == "running" {
            engine::kill(&name(*id)).await?;
        }
    }
    for id in ids {
        let dead = facts(*id).await?;
        ensure!(
            dead.status == "exited",
            "{} still runs: {dead:?}",
            name(*id)
        );
        after.push((dead, EngineEventRecorder::start(&name(*id))?));
    }
    Ok(after)
}

/// The newest activity entry of `id` says the broker found it down after
/// the restart (reason `host_restart`).
async fn found_down(api: &ApiClient, id: Uuid) -> Result<()> {
    let deadline = tokio::time::Instant::now() + STOPPED_TIMEOUT;
    loop {
        let page = api.activity(id, 5).await?;
        if page
            .entries
            .iter()
            .any(|e| e.detail["reason"] == "host_restart")
        {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no `stopped (host_restart)` in {id}'s activity: {:?}",
            page.entries
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_desktops_come_back_after_a_host_restart_and_stopped_ones_stay() -> Result<()> {
    let Some(image) = test_image("running_desktops_come_back_after_a_host_restart") else {
        return Ok(());
    };
    let mut options = BrokerOptions::new(&image);
    options.max_instances = Some(3);
    options.extra_args = vec!["--resume-concurrency".into(), "2".into()];
    let mut broker = BrokerProcess::start(options).await?;
    let result = come_back_scenario(&mut broker).await;
    broker.log_on_failure(result)
}

async fn come_back_scenario(broker: &mut BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let a = create_ready(&api, &mut events, "restart-a", READY_TIMEOUT).await?;
    let b = create_ready(&api, &mut events, "restart-b", READY_TIMEOUT).await?;
    let stopped = create_ready(&api, &mut events, "restart-stopped", READY_TIMEOUT).await?;
    api.stop(stopped).await?;
    api.wait_stopped(&mut events, stopped, STOPPED_TIMEOUT)
        .await?;

    let down = host_goes_down(broker, &[a, b, stopped]).await?;
    broker.start_again().await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    for id in [a, b] {
        api.wait_ready(&mut events, id, READY_TIMEOUT)
            .await
            .with_context(|| format!("{id} back after the restart"))?;
    }
    // The stopped one was decided with the others: by now it would have
    // been started. It is not, and says why it stopped.
    let status = api.get(stopped).await?;
    ensure!(
        status.container == ContainerState::Stopped
            && status.stop_reason == Some(StopReason::Manual),
        "a desktop stopped through the API stays stopped: {status:?}"
    );
    for (id, (before, recorder)) in [a, b, stopped].into_iter().zip(down) {
        let now = facts(id).await?;
        let actions = recorder.finish().await;
        engine::ensure_never_rebuilt(&actions)?;
        ensure!(now.id == before.id, "{id} was replaced");
        if id == stopped {
            ensure!(
                now.status == "exited" && now.started_at == before.started_at,
                "{id} was started: {now:?}"
            );
            ensure!(
                !actions.iter().any(|a| engine::action_verb(a) == "start"),
                "the engine saw {id} start: {actions:?}"
            );
        } else {
            ensure!(
                now.status == "running" && now.started_at != before.started_at,
                "{id} not started again after its kill: before {before:?}, now {now:?}"
            );
            engine::ensure_action(&actions, "start")?;
            found_down(&api, id).await?;
        }
        eprintln!(
            "{id}: engine saw {:?}; StartedAt {} -> {}",
            engine::lifecycle_actions(&actions),
            before.started_at,
            now.started_at
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_none_nothing_starts_after_a_host_restart() -> Result<()> {
    let Some(image) = test_image("with_none_nothing_starts_after_a_host_restart") else {
        return Ok(());
    };
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec!["--resume-after-restart".into(), "none".into()];
    let mut broker = BrokerProcess::start(options).await?;
    let result = none_scenario(&mut broker).await;
    broker.log_on_failure(result)
}

async fn none_scenario(broker: &mut BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "restart-none", READY_TIMEOUT).await?;
    let mut down = host_goes_down(broker, &[id]).await?;
    broker.start_again().await?;
    let api = broker.client();
    // Decided (the activity says it was found down), and left alone.
    found_down(&api, id).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = api.get(id).await?;
    ensure!(
        status.container == ContainerState::Stopped && status.resumable,
        "stopped and resumable: {status:?}"
    );
    let (before, recorder) = down.pop().context("one desktop")?;
    let now = facts(id).await?;
    let actions = recorder.finish().await;
    ensure!(
        now.status == "exited" && now.started_at == before.started_at,
        "started by the broker: {now:?}"
    );
    ensure!(
        !actions.iter().any(|a| engine::action_verb(a) == "start"),
        "the engine saw a start: {actions:?}"
    );
    Ok(())
}
