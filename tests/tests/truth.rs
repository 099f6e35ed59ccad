//! End-to-end: the broker's picture of the engine never rests on one event
//! stream. A broker configured as a user would (no labels, no options of
//! the harness's own) sees every kind of kill as `stopped` for reason
//! `killed` within a second, and `start` brings the desktop back ready:
//!
//! - `docker kill` (on Podman: through its compatible API, and `podman kill`
//!   with Podman's own CLI);
//! - SIGKILL of the container's init from the host;
//! - a kill while the engine's event stream is cut (a proxy between broker
//!   and engine swallows it; the engine itself is untouched);
//! - on Podman, a kill after the API service was restarted, and one while
//!   it was down (seen within a second of its answering again).
//!
//! The engine (`docker inspect`) is the independent witness of each kill.
//! Runs on whichever engine `DOCKER_HOST` names; each test has its own
//! broker and data directory, so they run in parallel.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream, Waits as _};
use dormouse_e2e::engine;
use dormouse_e2e::proxy::EngineProxy;
use dormouse_e2e::{test_image, TempDir};
use dormouse_protocol::api::{ContainerState, StopReason};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How soon after a kill the status must say so: the guest channel's
/// witness, not the 30 s resync, is what makes this hold without events.
const SEEN_WITHIN: Duration = Duration::from_secs(1);

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

/// After `how` killed computer `id`: the engine says so (exit 137), the
/// broker reports `stopped`/`killed` within [`SEEN_WITHIN`] of the kill,
/// and a start brings it back ready.
async fn seen_and_resumed(
    api: &ApiClient,
    events: &mut EventStream,
    id: Uuid,
    how: &str,
    killed_at: Instant,
) -> Result<Duration> {
    let seen = api
        .wait_for(
            events,
            id,
            &format!("stopped for reason `killed` after {how}"),
            Duration::from_secs(40),
            |s| s.container == ContainerState::Stopped && s.stop_reason == Some(StopReason::Killed),
        )
        .await?;
    let after = seen.at.saturating_duration_since(killed_at);
    let facts = engine::inspect(&format!("dormouse-{id}"))
        .await?
        .context("the container is gone")?;
    ensure!(
        facts.status == "exited" && facts.exit_code == 137,
        "the engine does not confirm the kill ({how}): {facts:?}"
    );
    eprintln!(
        "{how}: seen as stopped/killed after {} ms ({})",
        after.as_millis(),
        if seen.pushed { "pushed" } else { "polled" }
    );
    ensure!(
        after <= SEEN_WITHIN,
        "{how}: the broker took {after:?} to see the kill (at most {SEEN_WITHIN:?})"
    );
    ensure!(
        seen.status.resumable,
        "{how}: not resumable: {:?}",
        seen.status
    );
    api.start(id)
        .await
        .with_context(|| format!("start after {how}"))?;
    api.wait_ready(events, id, READY_TIMEOUT)
        .await
        .with_context(|| format!("ready after {how}"))?;
    Ok(after)
}

/// `docker kill`, `podman kill` (on Podman) and SIGKILL of the container's
/// init from the host, one after the other on one desktop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_kill_is_seen_within_a_second() -> Result<()> {
    let Some(image) = test_image("every_kind_of_kill_is_seen_within_a_second") else {
        return Ok(());
    };
    let broker = BrokerProcess::start(BrokerOptions::new(&image)).await?;
    let result = every_kind_of_kill_scenario(&broker).await;
    with_broker_log(&broker, result)
}

async fn every_kind_of_kill_scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "kills", READY_TIMEOUT).await?;
    let name = format!("dormouse-{id}");

    let killed_at = Instant::now();
    engine::kill(&name).await?;
    seen_and_resumed(&api, &mut events, id, "docker kill -s KILL", killed_at).await?;

    if engine::is_podman().await? {
        let killed_at = Instant::now();
        engine::podman_kill(&name).await?;
        seen_and_resumed(&api, &mut events, id, "podman kill -s KILL", killed_at).await?;
    }

    let pid = engine::init_pid(&name).await?;
    let killed_at = Instant::now();
    kill(Pid::from_raw(pid), Signal::SIGKILL).context("kill -9 of the container's init")?;
    seen_and_resumed(&api, &mut events, id, "kill -9 of the init", killed_at).await?;
    Ok(())
}

/// The event stream goes silent mid-way (a proxy swallows it; the broker
/// sees an open, healthy connection): a kill is seen through the guest
/// channel all the same, counted as a divergence, and the start works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_behind_a_cut_event_stream_is_seen() -> Result<()> {
    let Some(image) = test_image("a_kill_behind_a_cut_event_stream_is_seen") else {
        return Ok(());
    };
    let proxy = EngineProxy::start(engine::engine_socket())?;
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec![
        "--engine-socket".into(),
        format!("unix://{}", proxy.socket().display()),
    ];
    let broker = BrokerProcess::start(options).await?;
    let result = cut_stream_scenario(&broker, &proxy).await;
    with_broker_log(&broker, result)
}

async fn cut_stream_scenario(broker: &BrokerProcess, proxy: &EngineProxy) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "cut-stream", READY_TIMEOUT).await?;
    let name = format!("dormouse-{id}");
    ensure!(
        proxy.subscriptions() >= 1,
        "the broker never subscribed to events through the proxy"
    );
    let before = divergences(&api).await?;

    proxy.stall_events();
    let killed_at = Instant::now();
    engine::kill(&name).await?;
    seen_and_resumed(
        &api,
        &mut events,
        id,
        "a kill behind a cut stream",
        killed_at,
    )
    .await?;
    ensure!(
        proxy.swallowed() >= 1,
        "the engine sent nothing on the stalled stream: the cut proved nothing"
    );
    // Counted once the engine's own event is overdue (a few seconds).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let after = divergences(&api).await?;
        if after > before {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "a stop no event reported must count as a divergence ({before} -> {after})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `dormouse_state_divergence_total` from `/metrics`.
async fn divergences(api: &ApiClient) -> Result<u64> {
    let text = api.metrics().await?;
    text.lines()
        .find_map(|l| l.strip_prefix("dormouse_state_divergence_total "))
        .and_then(|v| v.trim().parse().ok())
        .context("no dormouse_state_divergence_total in /metrics")
}

/// Podman only: the broker talks to a Podman API service of its own (as a
/// user would run one); the service is restarted, then the desktop killed
/// with Podman's CLI. The broker sees it within a second and resumes it
/// through the new service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_the_podman_service_restarted_is_seen() -> Result<()> {
    let test = "a_kill_after_the_podman_service_restarted_is_seen";
    let Some(image) = test_image(test) else {
        return Ok(());
    };
    if !engine::is_podman().await? {
        eprintln!("SKIPPED {test}: the engine is not Podman");
        return Ok(());
    }
    let mut service = PodmanService::start()?;
    service.wait_answers().await?;
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec![
        "--engine-socket".into(),
        format!("unix://{}", service.socket.display()),
    ];
    let broker = BrokerProcess::start(options).await?;
    let result = podman_restart_scenario(&broker, &mut service).await;
    with_broker_log(&broker, result)
}

async fn podman_restart_scenario(
    broker: &BrokerProcess,
    service: &mut PodmanService,
) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "podman-restart", READY_TIMEOUT).await?;
    let name = format!("dormouse-{id}");

    service.restart().await?;
    let killed_at = Instant::now();
    engine::podman_kill(&name).await?;
    seen_and_resumed(
        &api,
        &mut events,
        id,
        "podman kill after a service restart",
        killed_at,
    )
    .await?;

    // Killed while the service is down: no stream, no inspect can tell it
    // then; the broker must know within a second of the service answering.
    service.stop();
    engine::podman_kill(&name).await?;
    service.start_again()?;
    service.wait_answers().await?;
    let back_at = Instant::now();
    seen_and_resumed(
        &api,
        &mut events,
        id,
        "podman kill while the service was down",
        back_at,
    )
    .await?;
    Ok(())
}

/// `podman system service` on a private socket, as the user ran it.
struct PodmanService {
    socket: PathBuf,
    child: Option<std::process::Child>,
    _dir: TempDir,
}

impl PodmanService {
    fn start() -> Result<Self> {
        let dir = TempDir::new("dormouse-podman-service");
        let socket = dir.path().join("podman.sock");
        let mut service = Self {
            socket,
            child: None,
            _dir: dir,
        };
        service.spawn()?;
        Ok(service)
    }

    fn spawn(&mut self) -> Result<()> {
        let child = std::process::Command::new("podman")
            .args(["--runtime", "runc", "system", "service", "--time=0"])
            .arg(format!("unix://{}", self.socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning podman system service")?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_answers(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if ping(&self.socket).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "podman system service on {} does not answer",
                    self.socket.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            let _ = child.wait();
        }
    }

    fn start_again(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.socket);
        self.spawn()
    }

    async fn restart(&mut self) -> Result<()> {
        self.stop();
        self.start_again()?;
        self.wait_answers().await
    }
}

impl Drop for PodmanService {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn ping(socket: &std::path::Path) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::UnixStream::connect(socket).await else {
        return false;
    };
    if stream
        .write_all(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    answer.starts_with(b"HTTP/1.") && String::from_utf8_lossy(&answer).contains(" 200 ")
}
