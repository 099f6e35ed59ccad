//! End-to-end: the engine lost and back under load. With [`DESKTOPS`]
//! desktops running, an import and an export in flight and [`SCREENS`]
//! live screens open, the engine goes away for [`OUTAGE`] and comes back:
//!
//! - **Docker:** the broker talks to the engine through a unix-socket proxy
//!   ([`EngineProxy`]) that the test cuts (every connection dropped, the
//!   socket refusing) and restores. The machine's Docker engine itself is
//!   never touched.
//! - **Podman** (when `DOCKER_HOST` names Podman): the API service
//!   `scripts/podman-engine` started is SIGKILLed and started again; its
//!   containers keep running under conmon.
//!
//! Asserted: `/healthz` keeps answering `ok` and says since when the engine
//! is unavailable; every status is `unknown` with a problem naming the
//! engine; calls that need the engine answer `503 engine_unavailable`; the
//! import is whole or absent and the export a whole archive or a clear
//! error; nothing is revoked (the open screens keep drawing) while the
//! engine — asked directly, the independent witness — says every desktop
//! runs; after the return every desktop is ready (or resumable) again,
//! reconciled, not restarted, and the screens open again. The figures
//! (time to detect, time to reconcile) are printed on one `ENGINE-LOSS`
//! line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dormouse_client::Upload;
use dormouse_e2e::archive::{tar, tar_entry};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{
    create_ready, is_ready, ApiClient, ClientError, EventStream, Waits as _,
};
use dormouse_e2e::engine;
use dormouse_e2e::proxy::EngineProxy;
use dormouse_e2e::rfb::{set_encodings, set_pixel_format_bgrx, update_request, RfbViewer, TokenIn};
use dormouse_e2e::test_image;
use dormouse_protocol::api::{ComputerStatus, ContainerState, CreateComputer};
use dormouse_protocol::exec::ExecRequest;
use dormouse_protocol::screen::{CreateScreen, ScreenGrant, ScreenMode};
use futures_util::StreamExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::time::Instant;
use uuid::Uuid;

#[path = "engine_loss/transfer.rs"]
mod transfer;

use transfer::{export_outcome, import_outcome, HeldSink, Release};

/// Desktops running through the outage (the figure; the machine
/// here, 2 cores, copes with it).
const DESKTOPS: usize = 10;
/// Live screens open through the outage (view and control alternately).
const SCREENS: usize = 5;
/// How long the engine stays away.
const OUTAGE: Duration = Duration::from_secs(10);
/// Desktops created at once while setting up.
const CREATE_AT_ONCE: usize = 4;
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How soon the loss must show on `/healthz` and in every status.
const DETECT_WITHIN: Duration = Duration::from_secs(5);
/// How soon after the return every desktop must be reconciled: the longest
/// backoff pause (5 s + 20 %) and the observations.
const RECONCILE_WITHIN: Duration = Duration::from_secs(15);
/// The export's file and the import's file.
const EXPORT_BYTES: usize = 24 << 20;
const IMPORT_BYTES: usize = 16 << 20;
const WIDTH: u16 = 1280;
const HEIGHT: u16 = 800;

/// How the engine goes away.
enum Outage {
    Proxy(EngineProxy),
    /// The Podman API service on this socket, through `scripts/podman-engine`.
    PodmanService {
        socket: PathBuf,
        image: String,
    },
}

impl Outage {
    fn name(&self) -> &'static str {
        match self {
            Self::Proxy(_) => "docker (socket proxy cut)",
            Self::PodmanService { .. } => "podman (API service SIGKILLed)",
        }
    }

    fn podman(&self) -> bool {
        matches!(self, Self::PodmanService { .. })
    }

    async fn cut(&self) -> Result<()> {
        match self {
            Self::Proxy(proxy) => {
                proxy.cut();
                Ok(())
            }
            Self::PodmanService { socket, .. } => podman_engine(socket, &["kill"]).await,
        }
    }

    async fn restore(&self) -> Result<()> {
        match self {
            Self::Proxy(proxy) => {
                if proxy.is_cut() {
                    proxy.restore()?;
                }
                Ok(())
            }
            Self::PodmanService { socket, image } => podman_engine(socket, &["start", image]).await,
        }
    }

    /// The engine's own word on a container, asked without the broker's
    /// path to it (the proxy, or the API service that is down).
    async fn witness(&self, name: &str) -> Result<String> {
        match self {
            Self::Proxy(_) => Ok(engine::inspect(name)
                .await?
                .map(|f| format!("{} {}", f.status, f.started_at))
                .unwrap_or_else(|| "missing".into())),
            Self::PodmanService { .. } => {
                let out = tokio::process::Command::new("podman")
                    .args([
                        "inspect",
                        "--format",
                        "{{.State.Status}} {{.State.StartedAt}}",
                        name,
                    ])
                    .output()
                    .await
                    .context("spawning podman inspect")?;
                ensure!(
                    out.status.success(),
                    "podman inspect {name}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
            }
        }
    }
}

/// Runs `scripts/podman-engine ARGS` for the service on `socket`.
async fn podman_engine(socket: &std::path::Path, args: &[&str]) -> Result<()> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/podman-engine");
    let out = tokio::process::Command::new(&script)
        .args(args)
        .env("DORMOUSE_PODMAN_SOCKET", socket)
        .output()
        .await
        .with_context(|| format!("spawning {}", script.display()))?;
    ensure!(
        out.status.success(),
        "scripts/podman-engine {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_the_engine_cut_off_under_load_and_back() -> Result<()> {
    let test = "docker_the_engine_cut_off_under_load_and_back";
    let Some(image) = test_image(test) else {
        return Ok(());
    };
    if engine::is_podman().await? {
        eprintln!("SKIPPED {test}: the engine is Podman (its own test restarts the service)");
        return Ok(());
    }
    let proxy = EngineProxy::start(engine::engine_socket())?;
    let options = options(&image, proxy.socket());
    let broker = BrokerProcess::start(options).await?;
    let outage = Outage::Proxy(proxy);
    let result = scenario(&broker, &outage).await;
    if let Err(e) = &result {
        eprintln!("{test}: {e:#}");
    }
    let restored = outage.restore().await;
    broker.log_on_failure(result.and(restored))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn podman_the_api_service_killed_under_load_and_back() -> Result<()> {
    let test = "podman_the_api_service_killed_under_load_and_back";
    let Some(image) = test_image(test) else {
        return Ok(());
    };
    if !engine::is_podman().await? {
        eprintln!("SKIPPED {test}: the engine is not Podman");
        return Ok(());
    }
    let socket = PathBuf::from(engine::engine_socket());
    let broker = BrokerProcess::start(options(&image, &socket)).await?;
    let outage = Outage::PodmanService {
        socket,
        image: image.clone(),
    };
    let result = scenario(&broker, &outage).await;
    if let Err(e) = &result {
        eprintln!("{test}: {e:#}");
    }
    let restored = outage.restore().await;
    broker.log_on_failure(result.and(restored))
}

fn options(image: &str, socket: &std::path::Path) -> BrokerOptions {
    let mut options = BrokerOptions::new(image);
    options.max_instances = Some(u32::try_from(DESKTOPS + 1).unwrap());
    options.extra_args = vec![
        "--engine-socket".into(),
        format!("unix://{}", socket.display()),
    ];
    options
}

/// The figures of one run.
#[derive(Debug, Default)]
struct Figures {
    setup: Duration,
    outage: Duration,
    /// How long cutting took (the script's SIGKILL and wait, on Podman);
    /// the detection times count from its start.
    cut_took: Duration,
    health_detect: Duration,
    status_detect: Duration,
    reconciled: Duration,
    all_ready: Duration,
    import: String,
    export: String,
    /// The stop in flight: its answer, then the desktop's state.
    stop: String,
    refused: Vec<String>,
    /// `/healthz`'s line about the return.
    health_after: String,
}

// Over 100 lines on purpose: one scenario, in the order the issue tells it.
async fn scenario(broker: &BrokerProcess, outage: &Outage) -> Result<()> {
    let api = broker.client();
    let setup_began = Instant::now();
    let mut figures = Figures::default();
    let running = create_many(&api, DESKTOPS).await?;
    let mut events = EventStream::open(&api).await?;
    let target = create_ready(&api, &mut events, "import-target", READY_TIMEOUT).await?;
    api.write_file(target, "old.txt", b"before the import".to_vec(), false)
        .await?;
    api.stop(target).await?;

    // The export's source: a file big enough to still be streaming.
    let source = running[0];
    let payload: Vec<u8> = (0..EXPORT_BYTES)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    api.write_file(source, "export/big.bin", payload, true)
        .await?;

    let mut before = Vec::new();
    for id in &running {
        before.push(outage.witness(&container(*id)).await?);
    }
    ensure!(
        before.iter().all(|w| w.starts_with("running")),
        "not every desktop runs before the outage: {before:?}"
    );

    let mut screens = Vec::new();
    for (i, id) in running.iter().take(SCREENS).enumerate() {
        let mode = if i % 2 == 0 {
            ScreenMode::View
        } else {
            ScreenMode::Control
        };
        let grant = mint(&api, *id, mode).await?;
        let mut viewer = viewer(broker, &grant).await?;
        draws(&mut viewer)
            .await
            .context("a screen before the outage")?;
        screens.push((*id, grant, viewer));
    }
    figures.setup = setup_began.elapsed();

    // The import, streamed: half now, the rest once the engine is gone.
    let (import_tx, import_rx) = tokio::io::duplex(64 * 1024);
    let import_body = tar(&[
        tar_entry("imported/big.bin", b'0', &vec![7u8; IMPORT_BYTES], ""),
        tar_entry("imported/done.txt", b'0', b"whole", ""),
    ]);
    let half = import_body.len() / 2;
    let (first, rest) = import_body.split_at(half);
    let (first, rest) = (first.to_vec(), rest.to_vec());
    let import_api = api.clone();
    let import =
        tokio::spawn(async move { import_api.import(target, Upload::reader(import_rx)).await });
    let (go_on, resume_import) = tokio::sync::oneshot::channel::<()>();
    let feeder = tokio::spawn(async move {
        let mut tx = import_tx;
        tx.write_all(&first).await?;
        let _ = resume_import.await;
        tx.write_all(&rest).await?;
        tx.shutdown().await?;
        anyhow::Ok(())
    });
    // The export, read by a sink that holds it until the engine is gone.
    // The sink blocks its writer, so the export has a thread (and a
    // runtime, and a client) of its own.
    let sink = HeldSink::default();
    let _release = Release(sink.clone());
    let export_sink = sink.clone();
    let export_api = broker.client();
    let export = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut out = export_sink;
        anyhow::Ok(runtime.block_on(export_api.export(source, true, &mut out)))
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.bytes() == 0 || import.is_finished() {
        ensure!(!import.is_finished(), "the import ended before the outage");
        ensure!(Instant::now() < deadline, "the export never began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A stop in flight too: the last desktop's, begun just before the cut.
    let stopping = running[DESKTOPS - 1];
    let stop_api = api.clone();
    let stop = tokio::spawn(async move { stop_api.stop(stopping).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    eprintln!(
        "{}: {} desktops ready, {SCREENS} screens open, an import, an export and a stop in flight",
        outage.name(),
        DESKTOPS + 1
    );

    // ---- the engine goes away ------------------------------------------------
    let cut_at = Instant::now();
    outage.cut().await?;
    figures.cut_took = cut_at.elapsed();
    eprintln!("{}: engine cut off", outage.name());
    figures.health_detect = until(DETECT_WITHIN, "/healthz to say so", || async {
        let health = api.health().await?;
        ensure!(health.starts_with("ok\n"), "/healthz: {health:?}");
        Ok(health.contains("engine: unavailable since "))
    })
    .await?
    .saturating_duration_since(cut_at);
    let all = DESKTOPS + 1;
    figures.status_detect = until(DETECT_WITHIN, "every status `unknown`", || async {
        let list = api.list().await?;
        Ok(list.len() == all && list.iter().all(unknown_for_the_engine))
    })
    .await?
    .saturating_duration_since(cut_at);

    // In flight: the import and the export go on to their end.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = go_on.send(());
    sink.release();
    feeder.await??;
    let imported = import.await?;
    let exported = tokio::task::spawn_blocking(move || export.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the export's thread panicked"))??;

    // Calls that need the engine say why they cannot be made.
    let refused = [
        ("start", api.start(target).await.map(drop)),
        ("stop", api.stop(running[1]).await.map(drop)),
        (
            "exec",
            api.exec(running[2], &ExecRequest::shell("true"), false)
                .await
                .map(drop),
        ),
        ("screenshot", api.screenshot(running[3]).await.map(drop)),
        (
            "screen",
            mint(&api, running[4], ScreenMode::View).await.map(drop),
        ),
        (
            "create",
            api.create(&CreateComputer::default()).await.map(drop),
        ),
    ];
    for (what, result) in refused {
        let code = match &result {
            Err(e) => e.code().unwrap_or("(no code)").to_owned(),
            Ok(()) => "(succeeded)".into(),
        };
        figures.refused.push(format!("{what}={code}"));
        ensure!(
            code == "engine_unavailable",
            "{what} while the engine is away: {result:?}"
        );
    }
    let stopped = stop.await?;
    figures.stop = match &stopped {
        Ok(s) => format!("answered({:?})", s.container),
        Err(e) => format!("error({})", e.code().unwrap_or("transport")),
    };
    // Nothing stopped, nothing revoked: the engine itself says every
    // desktop runs, and every open screen still draws.
    for id in running.iter().filter(|id| **id != stopping) {
        let now = outage.witness(&container(*id)).await?;
        ensure!(now.starts_with("running"), "{id} during the outage: {now}");
    }
    for (id, _, viewer) in &mut screens {
        draws(viewer)
            .await
            .with_context(|| format!("the screen of {id} during the outage"))?;
        ensure!(!api.screens(*id).await?.is_empty(), "{id}: revoked");
    }
    let health = api.health().await?;
    ensure!(
        health.starts_with("ok\n") && health.contains("engine: unavailable since "),
        "/healthz at the end of the outage: {health:?}"
    );
    // The outage lasts OUTAGE, or as long as the checks took if longer.
    tokio::time::sleep(OUTAGE.saturating_sub(cut_at.elapsed())).await;

    // ---- the engine comes back ------------------------------------------------
    outage.restore().await?;
    let back_at = Instant::now();
    figures.outage = back_at.saturating_duration_since(cut_at);
    eprintln!("{}: engine back", outage.name());
    figures.reconciled = until(RECONCILE_WITHIN, "the reconciliation", || async {
        let health = api.health().await?;
        Ok(health.contains("engine: available again") && health.contains("reconciled in"))
    })
    .await?
    .saturating_duration_since(back_at);
    figures.health_after = api
        .health()
        .await?
        .lines()
        .find(|l| l.starts_with("engine: available again"))
        .unwrap_or_default()
        .to_owned();
    figures.all_ready = until(
        RECONCILE_WITHIN,
        "every desktop ready or resumable",
        || async {
            let list = api.list().await?;
            Ok(list.len() == all
                && list.iter().all(|s| {
                    if s.id == target {
                        s.container == ContainerState::Stopped && s.resumable && s.problem.is_none()
                    } else if s.id == stopping {
                        // The stop the outage interrupted is finished (its
                        // intent was on disk) or it had not begun.
                        is_ready(s) || (s.container == ContainerState::Stopped && s.resumable)
                    } else {
                        is_ready(s) && s.problem.is_none()
                    }
                }))
        },
    )
    .await?
    .saturating_duration_since(back_at);
    let after = api.get(stopping).await?;
    figures.stop = format!(
        "{} then {:?}/{:?}",
        figures.stop, after.container, after.stop_reason
    );
    for (id, was) in running.iter().zip(&before) {
        if *id == stopping {
            continue;
        }
        let now = outage.witness(&container(*id)).await?;
        ensure!(&now == was, "{id} was restarted: {was} -> {now}");
    }

    // The screens kept through the outage still draw; each opens again.
    for (id, grant, viewer) in &mut screens {
        draws(viewer)
            .await
            .with_context(|| format!("the screen of {id} after the outage"))?;
        let mut again = self::viewer(broker, grant).await?;
        draws(&mut again)
            .await
            .with_context(|| format!("a screen of {id} opened again"))?;
        again.close().await;
    }
    let fresh = mint(&api, running[4], ScreenMode::View).await?;
    draws(&mut viewer(broker, &fresh).await?).await?;

    figures.import = import_outcome(broker, target, imported)?;
    figures.export = export_outcome(&sink, exported)?;
    // Resumable means it: the import target starts.
    api.start(target).await?;
    api.wait_ready(&mut events, target, READY_TIMEOUT).await?;

    eprintln!(
        "ENGINE-LOSS engine={:?} desktops={DESKTOPS}+1 screens={SCREENS} outage_ms={} cut_took_ms={} setup_s={} \
         healthz_detect_ms={} status_detect_ms={} reconciled_after_return_ms={} \
         all_ready_after_return_ms={} import={} export={} stop_in_flight={:?} refused=[{}] restarted=0 revoked=0\n\
         ENGINE-LOSS /healthz after: {}",
        outage.name(),
        figures.outage.as_millis(),
        figures.cut_took.as_millis(),
        figures.setup.as_secs(),
        figures.health_detect.as_millis(),
        figures.status_detect.as_millis(),
        figures.reconciled.as_millis(),
        figures.all_ready.as_millis(),
        figures.import,
        figures.export,
        figures.stop,
        figures.refused.join(" "),
        figures.health_after,
    );
    if outage.podman() {
        eprintln!("(podman: the containers ran on under conmon while the service was down)");
    }
    Ok(())
}

fn container(id: Uuid) -> String {
    format!("dormouse-{id}")
}

/// `unknown`, with a problem naming the engine: since when it is
/// unavailable, or (for the desktop whose stop the outage interrupted) the
/// failure of that stop.
fn unknown_for_the_engine(s: &ComputerStatus) -> bool {
    s.container == ContainerState::Unknown
        && !s.ready
        && s.problem.as_deref().is_some_and(|p| {
            p.starts_with("container engine: unavailable since")
                || p == "container engine unreachable"
        })
}

/// Asks `check` every 50 ms until it says yes; answers when.
async fn until<F, Fut>(within: Duration, what: &str, check: F) -> Result<Instant>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await? {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("waited {within:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` desktops, ready, [`CREATE_AT_ONCE`] at a time.
async fn create_many(api: &ApiClient, n: usize) -> Result<Vec<Uuid>> {
    let made: Vec<Result<Uuid>> = futures_util::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let mut events = EventStream::open(&api).await?;
                create_ready(&api, &mut events, &format!("loss-{i}"), READY_TIMEOUT).await
            }
        })
        .buffer_unordered(CREATE_AT_ONCE)
        .collect()
        .await;
    made.into_iter().collect()
}

async fn mint(api: &ApiClient, id: Uuid, mode: ScreenMode) -> Result<ScreenGrant, ClientError> {
    api.create_screen(
        id,
        &CreateScreen {
            mode,
            ttl_ms: Some(600_000),
            reason: None,
        },
    )
    .await
}

async fn viewer(broker: &BrokerProcess, grant: &ScreenGrant) -> Result<RfbViewer> {
    let url = format!("ws://{}{}", broker.addr(), grant.websocket);
    let mut v = RfbViewer::connect(&url, &grant.token, TokenIn::Subprotocol).await?;
    let init = v.handshake().await?;
    ensure!((init.width, init.height) == (WIDTH, HEIGHT), "{init:?}");
    v.send(&set_pixel_format_bgrx()).await?;
    // ZRLE first: a full frame is small.
    v.send(&set_encodings(&[16, 0])).await?;
    Ok(v)
}

/// The screen draws: a full update arrives for a full request.
async fn draws(v: &mut RfbViewer) -> Result<()> {
    v.send(&update_request(false, 0, 0, WIDTH, HEIGHT)).await?;
    let rects = tokio::time::timeout(Duration::from_secs(10), v.read_update())
        .await
        .context("no update within 10 s")??;
    ensure!(!rects.is_empty(), "an empty update");
    Ok(())
}
