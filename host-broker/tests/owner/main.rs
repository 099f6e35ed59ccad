//! The owner over the recording fake engine, with scripted supervisors bound
//! in each container's run directory when the fake starts it. Time-driven
//! rules run under paused tokio time.
//!
//! The core owns no engine, so its owner is tested here, over the Docker
//! backend as the daemon builds it, on the Docker backend's fake engine.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dormouse_protocol::api::{ContainerState, CreateComputer, LeaseRequest, PatchComputer};
use dormouse_protocol::frame;
use dormouse_protocol::{
    Activity, ContainerStartIdentity, GuestStatus, Hello, Phase, Quiesced, Request, Response,
    LABEL_COMPUTER, LABEL_PROTOCOL, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio::time::advance;

use chrono::Utc;
use dormouse_core::config::BrokerConfig;
use dormouse_core::engine::{EngineError, RunState};
use dormouse_core::error::BrokerError;
use dormouse_core::lifecycle::stop_key;
use dormouse_core::metrics::Metrics;
use dormouse_core::owner::{spawn_backend, RETRY_JITTER, RETRY_MAX};
use dormouse_core::store::StopRecord;
use dormouse_core::store::{ComputerStore, Paths, StopReasonStore};
use dormouse_core::BrokerHandle;
use dormouse_docker::fake::{FakeEngine, Verb};
use dormouse_docker::{ContainerInfo, DockerBackend, Engine};
use dormouse_http::ApiStatus as _;
use dormouse_protocol::api::{BrokerEvent, ComputerStatus, StopReason};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

/// The core over the Docker backend on `engine`, as the daemon builds it
/// for a Docker engine.
async fn spawn(
    config: BrokerConfig,
    engine: Arc<dyn Engine>,
    metrics: Arc<Metrics>,
) -> Result<(BrokerHandle, JoinHandle<()>), BrokerError> {
    let backend = DockerBackend::for_broker(engine, &config);
    spawn_backend(config, Arc::new(backend), metrics).await
}

const IMAGE: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";
const MS: Duration = Duration::from_millis(1);

/// What the scripted supervisors say.
#[derive(Debug)]
struct Script {
    activity: Mutex<Activity>,
    /// Answer every request with an oversized frame header.
    misbehave: AtomicBool,
    /// Never report ready.
    never_ready: AtomicBool,
    /// After ready, push this many statuses back to back (each different).
    flood: std::sync::atomic::AtomicUsize,
    /// `quiesce_hold` connections open now.
    holds: std::sync::atomic::AtomicUsize,
    /// Refuse `quiesce_hold` as a guest older than it does.
    no_hold: AtomicBool,
    /// Never answer `quiesce_hold` (a hung guest).
    silent_hold: AtomicBool,
    /// Hold every batch of actions unanswered until its connection closes.
    hold_actions: AtomicBool,
    /// Batches of actions held unanswered now.
    held_actions: std::sync::atomic::AtomicUsize,
}

impl Script {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            activity: Mutex::new(Activity {
                input_idle_ms: None,
                busy: false,
                busy_processes: vec![],
            }),
            misbehave: AtomicBool::new(false),
            never_ready: AtomicBool::new(false),
            flood: std::sync::atomic::AtomicUsize::new(0),
            holds: std::sync::atomic::AtomicUsize::new(0),
            no_hold: AtomicBool::new(false),
            silent_hold: AtomicBool::new(false),
            hold_actions: AtomicBool::new(false),
            held_actions: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn set_busy(&self, busy: bool) {
        self.activity.lock().unwrap().busy = busy;
    }
}

fn guest_status(ready: bool) -> GuestStatus {
    GuestStatus {
        phase: if ready { Phase::Ready } else { Phase::Starting },
        ready,
        ready_since: None,
        identity: ContainerStartIdentity {
            boot_id: "boot".into(),
            pid_ns_inode: 7,
            pid1_start_time: 9,
        },
        services: vec![],
        health: None,
        problem: None,
        taskbar_height: None,
        start_phases: Default::default(),
    }
}

// Over 100 lines on purpose: the fake supervisor's one loop with an arm
// per request it answers; the match is the table of what the fake does.
async fn serve_connection(mut stream: UnixStream, script: Arc<Script>) {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Some((request, used))) = frame::decode::<Request>(&buf) {
            buf.drain(..used);
            if script.misbehave.load(Ordering::SeqCst) {
                let _ = stream.write_all(&[0xff; 8]).await;
                continue;
            }
            let (response, payload): (Response, Vec<u8>) = match request.message {
                Request::Hello => (
                    Response::Hello(Hello {
                        protocol_version: PROTOCOL_VERSION,
                        supervisor_version: "scripted".into(),
                        identity: guest_status(false).identity,
                    }),
                    vec![],
                ),
                Request::Status => (Response::Status(guest_status(true)), vec![]),
                Request::Watch => {
                    let first = frame::encode(&Response::Status(guest_status(false)), &[]).unwrap();
                    if stream.write_all(&first).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    if !script.never_ready.load(Ordering::SeqCst) {
                        let ready =
                            frame::encode(&Response::Status(guest_status(true)), &[]).unwrap();
                        if stream.write_all(&ready).await.is_err() {
                            return;
                        }
                        for i in 0..script.flood.load(Ordering::SeqCst) {
                            let mut status = guest_status(true);
                            status.problem = Some(format!("flood {i}"));
                            let bytes = frame::encode(&Response::Status(status), &[]).unwrap();
                            if stream.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    }
                    std::future::pending::<()>().await;
                    return;
                }
                Request::Activity => (
                    Response::Activity(script.activity.lock().unwrap().clone()),
                    vec![],
                ),
                Request::Exec(_) | Request::PtyOpen(_) => {
                    (Response::error("exec_failed", "scripted"), vec![])
                }
                Request::EgressAccept => {
                    (Response::error("egress_unavailable", "scripted"), vec![])
                }
                Request::Quiesce { .. } => (
                    Response::Quiesced(Quiesced {
                        closed: vec!["browser".into()],
                        complete: true,
                        elapsed_ms: 1,
                    }),
                    vec![],
                ),
                Request::QuiesceHold { .. } if script.no_hold.load(Ordering::SeqCst) => {
                    let refusal = Response::error("unknown_kind", "unknown kind");
                    let _ = stream
                        .write_all(&frame::encode(&refusal, &[]).unwrap())
                        .await;
                    return;
                }
                Request::QuiesceHold { .. } if script.silent_hold.load(Ordering::SeqCst) => {
                    let _ = stream.read(&mut chunk).await;
                    return;
                }
                Request::QuiesceHold { .. } => {
                    let done = Response::Quiesced(Quiesced {
                        closed: vec!["browser".into()],
                        complete: true,
                        elapsed_ms: 1,
                    });
                    if stream
                        .write_all(&frame::encode(&done, &[]).unwrap())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    script.holds.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.read(&mut chunk).await;
                    script.holds.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                Request::Actions { .. } if script.hold_actions.load(Ordering::SeqCst) => {
                    script.held_actions.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.read(&mut chunk).await;
                    script.held_actions.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                Request::Actions { batch } => scripted_actions(&batch),
                Request::ClipboardGet => (
                    Response::Clipboard {
                        has_text: true,
                        truncated: false,
                    },
                    b"copied".to_vec(),
                ),
                Request::Screenshot { .. } => (
                    Response::Screenshot {
                        width: 1,
                        height: 1,
                        format: Default::default(),
                    },
                    b"\x89PNG\r\n\x1a\nfake".to_vec(),
                ),
            };
            let bytes = frame::encode(&response, &payload).unwrap();
            if stream.write_all(&bytes).await.is_err() {
                return;
            }
        }
    }
}

/// Every action succeeds: `cursor_position` is at [1, 2], each image a
/// tiny fake PNG of the payload.
fn scripted_actions(batch: &dormouse_protocol::actions::ActionBatch) -> (Response, Vec<u8>) {
    use dormouse_protocol::actions::{ActionImage, ActionName, ActionResult, GuestActionResults};
    let png = b"\x89PNG\r\n\x1a\nfake";
    let mut answer = GuestActionResults {
        results: vec![],
        image_lens: vec![],
        text_lens: vec![],
    };
    let mut payload = Vec::new();
    for action in &batch.actions {
        let name = action.name();
        answer.results.push(match name {
            ActionName::CursorPosition => ActionResult {
                coordinate: Some([1, 2]),
                ..ActionResult::ok(name)
            },
            ActionName::Screenshot | ActionName::Zoom => {
                payload.extend_from_slice(png);
                answer.image_lens.push(png.len() as u64);
                ActionResult {
                    image: Some(ActionImage {
                        media_type: "image/png".into(),
                        data: String::new(),
                    }),
                    size: Some([1, 1]),
                    ..ActionResult::ok(name)
                }
            }
            _ => ActionResult::ok(name),
        });
    }
    (Response::ActionResults(answer), payload)
}

async fn serve(listener: UnixListener, script: Arc<Script>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        connections.spawn(serve_connection(stream, script.clone()));
    }
}

fn run_dir_of(info: &ContainerInfo) -> Option<PathBuf> {
    info.mounts
        .iter()
        .find(|m| m.target == "/run/dormouse")
        .map(|m| PathBuf::from(&m.source))
}

/// A scripted supervisor binds the socket when the fake starts a container
/// and dies (leaving the stale socket file, as a real one does) when its run
/// ends.
fn install_guests(fake: &FakeEngine, script: Arc<Script>) {
    let running: Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>> = Arc::default();
    let on_start = running.clone();
    fake.on_start(move |info| {
        let Some(run_dir) = run_dir_of(info) else {
            return;
        };
        let socket = run_dir.join(dormouse_protocol::SOCKET_FILE_NAME);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let task = tokio::spawn(serve(listener, script.clone()));
        on_start
            .lock()
            .unwrap()
            .insert(info.name.clone(), task.abort_handle());
    });
    fake.on_end(move |info| {
        if let Some(task) = running.lock().unwrap().remove(&info.name) {
            task.abort();
        }
    });
}

struct Rig {
    dir: tempfile::TempDir,
    fake: Arc<FakeEngine>,
    script: Arc<Script>,
    metrics: Arc<Metrics>,
    handle: BrokerHandle,
    task: JoinHandle<()>,
}

fn config(dir: &Path, window: Duration, max: u32) -> BrokerConfig {
    let mut config = BrokerConfig::new(dir.to_owned());
    config.image = "dormouse/desktop:latest".into();
    config.idle_timeout = window;
    config.max_instances = max;
    config.quiesce_timeout = Duration::from_secs(1);
    config.stop_timeout = Duration::from_secs(2);
    config.ready_timeout = Duration::from_secs(5);
    config
}

impl Rig {
    async fn new(window: Duration) -> Rig {
        Self::with_max(window, 4).await
    }

    async fn with_max(window: Duration, max: u32) -> Rig {
        Self::with_config(window, max, |_| {}).await
    }

    async fn with_config(
        window: Duration,
        max: u32,
        change: impl FnOnce(&mut BrokerConfig),
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeEngine::new());
        fake.add_image(
            IMAGE,
            Some("dormouse/desktop:latest"),
            &[(LABEL_PROTOCOL, "1")],
        );
        let script = Script::new();
        install_guests(&fake, script.clone());
        let metrics = Arc::new(Metrics::default());
        let mut config = config(dir.path(), window, max);
        change(&mut config);
        let (handle, task) = spawn(config, fake.clone(), metrics.clone()).await.unwrap();
        Rig {
            dir,
            fake,
            script,
            metrics,
            handle,
            task,
        }
    }

    /// Drops the handle, waits for the owner to end, and starts a new one on
    /// the same data directory and engine (a broker restart).
    async fn restart(self, window: Duration) -> Rig {
        self.restart_with(window, |_| {}, |_| {}).await
    }

    /// [`Rig::restart`], with `meanwhile` done to the engine while no owner
    /// runs and `change` made to the new owner's configuration.
    async fn restart_with(
        self,
        window: Duration,
        meanwhile: impl FnOnce(&FakeEngine),
        change: impl FnOnce(&mut BrokerConfig),
    ) -> Rig {
        let Rig {
            dir,
            fake,
            script,
            metrics,
            handle,
            task,
        } = self;
        drop(handle);
        task.await.unwrap();
        meanwhile(&fake);
        let mut config = config(dir.path(), window, 4);
        change(&mut config);
        let (handle, task) = spawn(config, fake.clone(), metrics.clone()).await.unwrap();
        Rig {
            dir,
            fake,
            script,
            metrics,
            handle,
            task,
        }
    }

    /// Kills the owner task where it stands (a broker crash) and starts a
    /// new one on the same data directory and engine.
    async fn crash_and_restart(self) -> Rig {
        let Rig {
            dir,
            fake,
            script,
            metrics,
            handle,
            task,
        } = self;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        drop(handle);
        let (handle, task) = spawn(
            config(dir.path(), Duration::from_secs(3600), 4),
            fake.clone(),
            metrics.clone(),
        )
        .await
        .unwrap();
        Rig {
            dir,
            fake,
            script,
            metrics,
            handle,
            task,
        }
    }

    fn paths(&self) -> Paths {
        Paths::new(self.dir.path())
    }

    /// Creates a computer and waits until it is ready.
    async fn create(&self) -> ComputerStatus {
        let created = self.handle.create(CreateComputer::default()).await.unwrap();
        assert_eq!(created.container, ContainerState::Running, "{created:?}");
        self.until(created.id, "ready after create", |s| s.ready)
            .await
    }

    /// Starts a computer and waits until it is ready.
    async fn start(&self, id: Uuid) -> ComputerStatus {
        let started = self.handle.start(id, None).await.unwrap();
        assert_eq!(started.container, ContainerState::Running, "{started:?}");
        self.until(id, "ready after start", |s| s.ready).await
    }

    fn name(id: Uuid) -> String {
        dormouse_docker::spec::container_name(id)
    }

    async fn until(
        &self,
        id: Uuid,
        what: &str,
        pred: impl Fn(&ComputerStatus) -> bool,
    ) -> ComputerStatus {
        for _ in 0..2000 {
            let status = self.handle.get(id).await.unwrap();
            if pred(&status) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "timed out waiting for {what}: {:?}",
            self.handle.get(id).await
        );
    }
}

impl Rig {
    /// Waits for `pred` without moving the (paused) clock.
    async fn settled(
        &self,
        id: Uuid,
        what: &str,
        pred: impl Fn(&ComputerStatus) -> bool,
    ) -> ComputerStatus {
        for _ in 0..100 {
            settle().await;
            let status = self.handle.get(id).await.unwrap();
            if pred(&status) {
                return status;
            }
        }
        panic!(
            "{what} did not happen without time passing: {:?}",
            self.handle.get(id).await
        );
    }
}

/// Lets every task run without moving the clock.
async fn settle() {
    for _ in 0..500 {
        tokio::task::yield_now().await;
    }
}

fn mutations_of(fake: &FakeEngine, verb: &str) -> usize {
    fake.mutations()
        .iter()
        .filter(|m| m.starts_with(verb))
        .count()
}

mod actions;
mod activity;
mod engine_loss;
mod fencing;
mod hostile;
mod idle;
mod lifecycle;
mod restart;
mod trouble;
mod truth;
mod workspace;
