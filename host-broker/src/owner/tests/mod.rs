//! The owner over the recording fake engine, with scripted supervisors bound
//! in each container's run directory when the fake starts it. Time-driven
//! rules run under paused tokio time.

#![allow(clippy::unwrap_used)]

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

use super::*;
use crate::engine::fake::{FakeEngine, Verb};
use crate::engine::{ContainerInfo, EngineError, RunState};
use crate::lifecycle::stop_key;
use crate::store::StopRecord;

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
    }
}

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
                Request::Quiesce { .. } => (
                    Response::Quiesced(Quiesced {
                        closed: vec!["browser".into()],
                        complete: true,
                        elapsed_ms: 1,
                    }),
                    vec![],
                ),
                Request::Screenshot => (
                    Response::Screenshot {
                        width: 1,
                        height: 1,
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
        let (handle, task) = spawn(config(dir.path(), window, 4), fake.clone(), metrics.clone())
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
        crate::lifecycle::container_name(id)
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

// ---- lifecycle --------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn create_ready_stop_start_ready() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let answered = rig.handle.create(CreateComputer::default()).await.unwrap();
    assert_eq!(
        answered.container,
        ContainerState::Running,
        "answered once running"
    );
    let created = rig.until(answered.id, "ready", |s| s.ready).await;
    assert_eq!(created.image_id, IMAGE);
    assert_eq!(created.phase, Some(Phase::Ready));
    let id = created.id;
    let name = Rig::name(id);
    assert_eq!(
        rig.fake.mutations(),
        vec![format!("create {name}"), format!("start {name}")]
    );
    assert!(rig.paths().record(id).exists(), "record persisted");

    let stopped = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(stopped.container, ContainerState::Stopped);
    assert_eq!(stopped.stop_reason, Some(StopReason::Manual));
    assert!(!stopped.ready);
    let finished = rig.fake.container(&name).unwrap().finished_at;
    assert_eq!(stopped.stopped_at, finished);
    assert!(stopped.resumable, "{:?}", stopped.resumable_problem);

    let started = rig.start(id).await;
    assert_eq!(started.stop_reason, None, "a start clears the reason");
    assert_eq!(started.stopped_at, None);
    assert_eq!(
        rig.fake.mutations(),
        vec![
            format!("create {name}"),
            format!("start {name}"),
            format!("stop {name}"),
            format!("start {name}"),
        ],
        "a resume is a start of the same container: no create, no remove"
    );
    let rendered = rig.metrics.render(&[]);
    assert!(
        rendered.contains("dormouse_resume_seconds_count 1"),
        "{rendered}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_created_container_is_hardened_and_labelled() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let spec = rig
        .fake
        .calls()
        .into_iter()
        .find_map(|c| match c {
            crate::engine::fake::Call::Create(spec) => Some(spec),
            _ => None,
        })
        .unwrap();
    assert_eq!(spec.image, IMAGE, "created by immutable ID, not by tag");
    assert_eq!(spec.hardening.network_mode, "none");
    assert_eq!(spec.hardening.cap_drop, vec!["ALL".to_string()]);
    assert_eq!(spec.labels.get(LABEL_COMPUTER), Some(&id.to_string()));
    let sources: Vec<_> = spec.mounts.iter().map(|m| m.source.clone()).collect();
    assert_eq!(
        sources,
        vec![rig.paths().workspace(id), rig.paths().run_dir(id)]
    );
    let record = ComputerStore::new(rig.paths()).load(id).unwrap().unwrap();
    assert_eq!(
        record.spec, *spec,
        "the record keeps the settings it was created with"
    );
}

#[tokio::test(start_paused = true)]
async fn an_image_without_a_compatible_protocol_is_refused() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    rig.fake
        .add_image("sha256:feed", Some("dormouse/desktop:latest"), &[]);
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Image(_)), "{err}");
    rig.fake.add_image(
        "sha256:beef",
        Some("dormouse/desktop:latest"),
        &[(LABEL_PROTOCOL, "99")],
    );
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Image(_)), "{err}");
    assert!(rig.fake.mutations().is_empty());
    assert!(rig.handle.list().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn wrong_states_and_unknown_ids_are_refused() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    assert!(matches!(
        rig.handle.start(id, None).await,
        Err(BrokerError::WrongState(_))
    ));
    rig.handle.stop(id, None).await.unwrap();
    assert!(matches!(
        rig.handle.stop(id, None).await,
        Err(BrokerError::WrongState(_))
    ));
    let nobody = Uuid::new_v4();
    assert_eq!(
        rig.handle.get(nobody).await,
        Err(BrokerError::NotFound(nobody))
    );
    assert!(matches!(
        rig.handle.start(nobody, None).await,
        Err(BrokerError::NotFound(_))
    ));
    assert!(matches!(
        rig.handle.screenshot(id).await,
        Err(BrokerError::WrongState(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn screenshots_come_from_the_guest() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let png = rig.handle.screenshot(id).await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
}

#[tokio::test(start_paused = true)]
async fn resume_fails_closed_when_the_container_changed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let name = Rig::name(id);
    rig.fake.mutate(&name, |c| {
        c.hardening.cap_add.push("CAP_SYS_ADMIN".into());
    });
    rig.fake.emit("update", &name);
    let status = rig.until(id, "not resumable", |s| !s.resumable).await;
    assert!(
        status
            .resumable_problem
            .as_deref()
            .is_some_and(|p| p.contains("cap_add")),
        "{status:?}"
    );
    let err = rig.handle.start(id, None).await.unwrap_err();
    assert!(matches!(err, BrokerError::NotResumable(_)), "{err}");
    assert_eq!(
        mutations_of(&rig.fake, "start"),
        1,
        "no start was attempted"
    );
}

#[tokio::test(start_paused = true)]
async fn resume_fails_closed_when_the_image_is_gone() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.remove_image(IMAGE);
    let err = rig.handle.start(id, None).await.unwrap_err();
    assert!(
        matches!(&err, BrokerError::NotResumable(p) if p.contains("no longer present")),
        "{err}"
    );
    let status = rig.handle.get(id).await.unwrap();
    assert!(!status.resumable);
}

#[tokio::test(start_paused = true)]
async fn resume_is_never_counted_against_capacity() {
    let rig = Rig::with_max(Duration::from_secs(3600), 1).await;
    let a = rig.create().await.id;
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, BrokerError::Capacity { running: 1, max: 1 }),
        "{err}"
    );
    assert_eq!(err.code(), "capacity");
    rig.handle.stop(a, None).await.unwrap();
    let b = rig.create().await.id;
    // At capacity: a create is refused while a resume succeeds.
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Capacity { .. }));
    rig.start(a).await;
    assert_eq!(mutations_of(&rig.fake, "create"), 2);
    assert!(rig.handle.get(b).await.unwrap().ready);
}

#[tokio::test(start_paused = true)]
async fn remove_keeps_the_workspace_unless_purged_and_it_can_be_adopted() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let mut events = rig.handle.subscribe();
    let a = rig.create().await.id;
    std::fs::write(rig.paths().workspace(a).join("notes.txt"), "kept").unwrap();
    rig.handle.remove(a, false, None).await.unwrap();
    assert_eq!(
        rig.fake.mutations().last().map(String::as_str),
        Some(format!("remove {}", Rig::name(a)).as_str())
    );
    assert!(
        rig.fake
            .mutations()
            .contains(&format!("stop {}", Rig::name(a))),
        "a running desktop is stopped gracefully before removal"
    );
    assert!(rig.paths().workspace(a).join("notes.txt").exists());
    assert!(!rig.paths().record(a).exists());
    assert!(matches!(
        rig.handle.get(a).await,
        Err(BrokerError::NotFound(_))
    ));
    let mut saw_removed = false;
    while let Ok(event) = events.try_recv() {
        saw_removed |= event == BrokerEvent::Removed { id: a };
    }
    assert!(saw_removed);

    let b = rig
        .handle
        .create(CreateComputer {
            workspace_from: Some(a),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    assert_eq!(
        std::fs::read_to_string(rig.paths().workspace(b).join("notes.txt")).unwrap(),
        "kept"
    );
    rig.handle.remove(b, true, None).await.unwrap();
    assert!(!rig.paths().computer_dir(b).exists());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_broker_leaves_desktops_running_and_reasons_survive() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let running = rig.create().await.id;
    let stopped = rig.create().await.id;
    rig.handle.stop(stopped, None).await.unwrap();
    let before = rig.fake.mutations();
    let rig = rig.restart(Duration::from_secs(3600)).await;
    assert_eq!(
        rig.fake.mutations(),
        before,
        "a restart touches no container"
    );
    assert_eq!(
        rig.fake.container(&Rig::name(running)).unwrap().state,
        RunState::Running
    );
    let status = rig.until(running, "ready again", |s| s.ready).await;
    assert_eq!(status.container, ContainerState::Running);
    let status = rig.handle.get(stopped).await.unwrap();
    assert_eq!(status.stop_reason, Some(StopReason::Manual));
}

#[tokio::test(start_paused = true)]
async fn a_slow_inspect_from_before_an_operation_never_overrides_it() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    rig.handle.stop(id, None).await.unwrap();
    settle().await;
    // An event makes the owner inspect; the engine's answer (stopped) is slow
    // and arrives after the start below finished.
    rig.fake.delay_next(Verb::Inspect, Duration::from_secs(3));
    rig.fake.emit("die", &name);
    settle().await;
    rig.start(id).await;
    advance(Duration::from_secs(4)).await;
    settle().await;
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Running, "{s:?}");
    assert!(s.ready);
    // A kill afterwards shows the engine's own reason, not our old one.
    rig.fake.foreign_kill(&name);
    let s = rig
        .until(id, "killed", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed));
}

// ---- stop reasons -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn foreign_stops_and_kills_never_show_our_reason() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    rig.handle.stop(id, None).await.unwrap();
    rig.start(id).await;

    rig.fake.foreign_stop(&name);
    let s = rig
        .until(id, "stopped", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, None, "a foreign stop has no reason");

    rig.start(id).await;
    rig.fake.foreign_kill(&name);
    let s = rig
        .until(id, "killed", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Killed));

    rig.start(id).await;
    rig.fake.oom_kill(&name);
    let s = rig
        .until(id, "oom", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Oom));

    // Our stop, then a foreign start and stop: the timestamp moved on.
    rig.start(id).await;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.foreign_start(&name);
    rig.until(id, "running", |s| s.container == ContainerState::Running)
        .await;
    rig.fake.foreign_stop(&name);
    let s = rig
        .until(id, "stopped", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, None);
}

// ---- idle ---------------------------------------------------------------------

/// A running, ready desktop whose idle window starts exactly now.
async fn idle_rig(window: Duration) -> (Rig, Uuid) {
    let rig = Rig::new(window).await;
    let id = rig.create().await.id;
    rig.handle.touch(id, None).await.unwrap();
    (rig, id)
}

#[tokio::test(start_paused = true)]
async fn idle_stops_after_exactly_one_quiet_window_and_only_stops() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    advance(999 * MS).await;
    settle().await;
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        0,
        "999 ms into a 1 s window: nothing"
    );
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Running);
    assert!(s.idle.as_ref().unwrap().stops_at.is_some());
    advance(MS).await;
    let s = rig
        .until(id, "idle stop", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert_eq!(s.idle.unwrap().stops_at, None);
    let name = Rig::name(id);
    assert_eq!(
        rig.fake.mutations(),
        vec![
            format!("create {name}"),
            format!("start {name}"),
            format!("stop {name}")
        ],
        "idle issues stop only: never remove, never recreate"
    );
    assert!(rig
        .metrics
        .render(&[])
        .contains("dormouse_idle_stops_total 1"));
}

#[tokio::test(start_paused = true)]
async fn touch_renews_and_reads_do_not() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    advance(600 * MS).await;
    rig.handle.touch(id, None).await.unwrap();
    // Reads do not renew: status, list, screenshot, events.
    let _events = rig.handle.subscribe();
    advance(300 * MS).await;
    rig.handle.get(id).await.unwrap();
    rig.handle.list().await.unwrap();
    rig.handle.screenshot(id).await.unwrap();
    advance(699 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "renewed at 600 ms");
    advance(MS).await;
    rig.until(id, "idle stop at 1.6 s", |s| {
        s.container == ContainerState::Stopped
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_guest_is_never_stopped_and_quiet_starts_a_new_window() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    rig.script.set_busy(true);
    for _ in 0..50 {
        advance(100 * MS).await;
        settle().await;
    }
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "busy never stops");
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.idle.unwrap().stops_at, None, "no stop time while busy");
    rig.script.set_busy(false);
    // The next re-check (a tenth of the window) sees the quiet moment and
    // starts a full new window from there.
    advance(100 * MS).await;
    settle().await;
    let s = rig.handle.get(id).await.unwrap();
    assert!(s.idle.unwrap().stops_at.is_some());
    advance(999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "a full new window");
    advance(MS).await;
    rig.until(id, "idle stop", |s| s.container == ContainerState::Stopped)
        .await;
}

#[tokio::test(start_paused = true)]
async fn guest_input_counts_as_activity() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    rig.script.activity.lock().unwrap().input_idle_ms = Some(400);
    advance(1000 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0, "input 400 ms ago");
    rig.script.activity.lock().unwrap().input_idle_ms = Some(10_000);
    advance(399 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0);
    advance(MS).await;
    rig.until(id, "idle stop", |s| s.container == ContainerState::Stopped)
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_manual_stop_cancels_the_idle_timer() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    advance(500 * MS).await;
    let s = rig.handle.stop(id, None).await.unwrap();
    assert_eq!(s.stop_reason, Some(StopReason::Manual));
    advance(5000 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    assert_eq!(
        rig.handle.get(id).await.unwrap().stop_reason,
        Some(StopReason::Manual)
    );
}

#[tokio::test(start_paused = true)]
async fn a_changed_window_counts_from_the_last_activity() {
    let (rig, id) = idle_rig(Duration::from_secs(10)).await;
    advance(3000 * MS).await;
    let err = rig
        .handle
        .patch(
            id,
            PatchComputer {
                idle_timeout_ms: Some(999),
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::BadRequest(_)));
    let s = rig
        .handle
        .patch(
            id,
            PatchComputer {
                idle_timeout_ms: Some(5000),
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(s.idle.as_ref().unwrap().timeout_ms, 5000);
    advance(1999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 0);
    advance(MS).await;
    rig.until(id, "stop at 5 s", |s| {
        s.container == ContainerState::Stopped
    })
    .await;
    let record = ComputerStore::new(rig.paths()).load(id).unwrap().unwrap();
    assert_eq!(
        record.idle_timeout_ms,
        Some(5000),
        "the override is persisted"
    );
}

#[tokio::test(start_paused = true)]
async fn failed_idle_stops_back_off() {
    let (rig, id) = idle_rig(Duration::from_secs(1)).await;
    rig.fake
        .fail_next(Verb::Stop, EngineError::Failed("busy engine".into()));
    rig.fake
        .fail_next(Verb::Stop, EngineError::Failed("busy engine".into()));
    advance(1000 * MS).await;
    rig.settled(id, "first failure", |s| {
        s.problem
            .as_deref()
            .is_some_and(|p| p.contains("idle stop failed"))
    })
    .await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    // First failure: back off one window.
    advance(999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    advance(MS).await;
    rig.settled(id, "second failure", |s| {
        s.problem
            .as_deref()
            .is_some_and(|p| p.contains("(2 so far)"))
    })
    .await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 2);
    // Second failure: two windows.
    advance(1999 * MS).await;
    settle().await;
    assert_eq!(mutations_of(&rig.fake, "stop"), 2);
    advance(MS).await;
    let s = rig
        .until(id, "stopped", |s| s.container == ContainerState::Stopped)
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert_eq!(mutations_of(&rig.fake, "stop"), 3);
}

// ---- fencing ------------------------------------------------------------------

fn lease_req(holder: &str, ttl_ms: u64) -> LeaseRequest {
    LeaseRequest {
        holder: holder.into(),
        ttl_ms,
    }
}

#[tokio::test(start_paused = true)]
async fn leases_fence_mutating_calls() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let grant = rig.handle.lease(id, lease_req("a", 60_000)).await.unwrap();
    assert_eq!(grant.generation, 1);
    let on_disk = ComputerStore::new(rig.paths()).load(id).unwrap().unwrap();
    assert_eq!(on_disk.generation, 1, "persisted before it was returned");

    let err = rig.handle.stop(id, None).await.unwrap_err();
    assert_eq!(err.code(), "lease_held");
    let err = rig.handle.stop(id, Some(0)).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    assert_eq!(err.http_status(), 409);
    let err = rig.handle.touch(id, Some(7)).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    assert!(rig
        .metrics
        .render(&[])
        .contains("dormouse_fencing_rejections_total 3"));
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        0,
        "refusals change nothing"
    );

    let err = rig
        .handle
        .lease(id, lease_req("b", 1000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "lease_held");
    let renewed = rig.handle.lease(id, lease_req("a", 60_000)).await.unwrap();
    assert_eq!(renewed.generation, 1, "a renewal keeps the generation");

    rig.handle.stop(id, Some(1)).await.unwrap();
    // Reads need no generation.
    rig.handle.get(id).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn generations_only_grow_across_restarts() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    assert_eq!(
        rig.handle
            .lease(id, lease_req("a", 1))
            .await
            .unwrap()
            .generation,
        1
    );
    // Leases expire by the wall clock.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        rig.handle
            .lease(id, lease_req("b", 1))
            .await
            .unwrap()
            .generation,
        2
    );
    let rig = rig.restart(Duration::from_secs(3600)).await;
    std::thread::sleep(Duration::from_millis(5));
    let grant = rig.handle.lease(id, lease_req("c", 60_000)).await.unwrap();
    assert_eq!(grant.generation, 3);
    let err = rig.handle.touch(id, Some(2)).await.unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    assert_eq!(rig.handle.get(id).await.unwrap().generation, 3);
}

#[tokio::test(start_paused = true)]
async fn a_takeover_waits_for_the_operation_in_flight() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.lease(id, lease_req("a", 1)).await.unwrap();
    rig.fake.delay(Verb::Stop, Duration::from_secs(3));
    let stopping = {
        let handle = rig.handle.clone();
        tokio::spawn(async move { handle.stop(id, Some(1)).await })
    };
    settle().await;
    std::thread::sleep(Duration::from_millis(5));
    let taking = {
        let handle = rig.handle.clone();
        tokio::spawn(async move { handle.lease(id, lease_req("b", 60_000)).await })
    };
    settle().await;
    assert!(!taking.is_finished(), "granted only once the stop is done");
    // Mutating calls wait for the takeover too.
    let err = rig.handle.touch(id, Some(1)).await.unwrap_err();
    assert!(matches!(err, BrokerError::WrongState(_)));
    let stopped = stopping.await.unwrap().unwrap();
    assert_eq!(stopped.container, ContainerState::Stopped);
    let grant = taking.await.unwrap().unwrap();
    assert_eq!(grant.generation, 2);
    assert_eq!(grant.holder, "b");
}

#[tokio::test(start_paused = true)]
async fn a_hung_operation_is_fenced_by_a_takeover() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.handle.lease(id, lease_req("a", 1)).await.unwrap();
    rig.fake.delay(Verb::Start, Duration::from_secs(10_000));
    let starting = {
        let handle = rig.handle.clone();
        tokio::spawn(async move { handle.start(id, Some(1)).await })
    };
    settle().await;
    std::thread::sleep(Duration::from_millis(5));
    let grant = rig.handle.lease(id, lease_req("b", 60_000)).await.unwrap();
    assert_eq!(grant.generation, 2);
    let err = starting.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "stale_generation");
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Stopped);
    assert_eq!(s.generation, 2);
}

// ---- engine trouble, guests, reconciliation -----------------------------------------

#[tokio::test(start_paused = true)]
async fn a_missing_engine_gives_engine_unavailable_and_the_broker_keeps_serving() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.fake.set_unavailable(true);
    let err = rig
        .handle
        .create(CreateComputer::default())
        .await
        .unwrap_err();
    assert_eq!(err.http_status(), 503);
    let err = rig.handle.start(id, None).await.unwrap_err();
    assert_eq!(err.code(), "engine_unavailable");
    let s = rig
        .until(id, "unknown", |s| s.container == ContainerState::Unknown)
        .await;
    assert!(!s.resumable);
    assert_eq!(rig.handle.list().await.unwrap().len(), 1);
    rig.fake.set_unavailable(false);
    rig.start(id).await;
}

#[tokio::test(start_paused = true)]
async fn a_misbehaving_guest_degrades_only_its_computer() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let good = rig.create().await.id;
    rig.script.misbehave.store(true, Ordering::SeqCst);
    let bad = rig.handle.create(CreateComputer::default()).await.unwrap();
    let bad = rig
        .until(bad.id, "degraded", |s| s.phase == Some(Phase::Degraded))
        .await;
    assert_eq!(bad.container, ContainerState::Running);
    assert!(!bad.ready);
    assert_eq!(bad.phase, Some(Phase::Degraded));
    assert!(bad.problem.is_some());
    let err = rig.handle.screenshot(bad.id).await.unwrap_err();
    assert_eq!(err.code(), "guest");
    rig.script.misbehave.store(false, Ordering::SeqCst);
    assert!(rig.handle.get(good).await.unwrap().ready);
}

#[tokio::test(start_paused = true)]
async fn a_symlink_planted_at_the_socket_is_refused() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    // The guest (root in its container) plants a symlink to a host socket.
    let decoy_dir = tempfile::tempdir().unwrap();
    let decoy = decoy_dir.path().join("host.sock");
    let _listener = UnixListener::bind(&decoy).unwrap();
    let socket = rig.paths().socket(id);
    rig.fake.on_start(move |_| {
        let _ = std::fs::remove_file(&socket);
        std::os::unix::fs::symlink(&decoy, &socket).unwrap();
    });
    rig.handle.start(id, None).await.unwrap();
    let s = rig.until(id, "refused", |s| s.problem.is_some()).await;
    assert!(!s.ready);
    assert!(
        s.problem.as_deref().is_some_and(|p| p.contains("symlink")),
        "{s:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_guest_that_never_gets_ready_is_reported_after_the_deadline() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    rig.script.never_ready.store(true, Ordering::SeqCst);
    rig.handle.start(id, None).await.unwrap();
    let s = rig
        .until(id, "the readiness deadline", |s| {
            s.problem
                .as_deref()
                .is_some_and(|p| p.contains("not ready within"))
        })
        .await;
    assert_eq!(s.container, ContainerState::Running);
    assert!(!s.ready);
}

#[tokio::test(start_paused = true)]
async fn an_unconfirmed_stop_is_finished_on_start_up() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let name = Rig::name(id);
    // As if the broker died after persisting the intent, before the engine stop.
    let stops = StopReasonStore::new(&rig.paths());
    stops
        .save(
            &stop_key(id),
            &StopRecord::intent(StopReason::Idle, Utc::now()),
        )
        .unwrap();
    let rig = rig.restart(Duration::from_secs(3600)).await;
    let s = rig
        .until(id, "finished stop", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Idle));
    assert_eq!(mutations_of(&rig.fake, "stop"), 1);
    assert_eq!(rig.fake.container(&name).unwrap().state, RunState::Exited);
}

#[tokio::test(start_paused = true)]
async fn a_stop_reported_under_way_is_on_disk_and_survives_a_broker_crash() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    // The stop's first engine call hangs; the broker dies meanwhile.
    rig.fake
        .delay_next(Verb::Inspect, Duration::from_secs(1000));
    let mut events = rig.handle.subscribe();
    let handle = rig.handle.clone();
    let stopping = tokio::spawn(async move { handle.stop(id, None).await });
    let under_way = loop {
        match events.recv().await.unwrap() {
            BrokerEvent::Status { computer } if computer.phase == Some(Phase::Stopping) => {
                break computer
            }
            _ => {}
        }
    };
    assert_eq!(under_way.container, ContainerState::Running);
    let stops = StopReasonStore::new(&rig.paths());
    let intent = stops.load(&stop_key(id)).unwrap().unwrap();
    assert_eq!(intent.reason, StopReason::Manual);
    assert!(!intent.confirmed);
    drop(events);
    let rig = rig.crash_and_restart().await;
    assert!(
        stopping.await.unwrap().is_err(),
        "the old broker never answered"
    );
    let s = rig
        .until(id, "finished stop", |s| {
            s.container == ContainerState::Stopped
        })
        .await;
    assert_eq!(s.stop_reason, Some(StopReason::Manual));
    assert_eq!(
        mutations_of(&rig.fake, "stop"),
        1,
        "finished by the new broker"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_that_happened_but_was_not_confirmed_is_confirmed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let stops = StopReasonStore::new(&rig.paths());
    stops
        .save(
            &stop_key(id),
            &StopRecord::intent(StopReason::Manual, Utc::now()),
        )
        .unwrap();
    // The engine stopped it, the broker died before confirming.
    rig.fake.foreign_stop(&Rig::name(id));
    let rig = rig.restart(Duration::from_secs(3600)).await;
    let s = rig.handle.get(id).await.unwrap();
    assert_eq!(s.container, ContainerState::Stopped);
    assert_eq!(s.stop_reason, Some(StopReason::Manual));
    assert_eq!(mutations_of(&rig.fake, "stop"), 0);
    assert!(stops.load(&stop_key(id)).unwrap().unwrap().confirmed);
}

#[tokio::test(start_paused = true)]
async fn containers_labelled_ours_without_a_record_are_reported_never_removed() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let id = rig.create().await.id;
    let mut stray = rig.fake.container(&Rig::name(id)).unwrap();
    let stray_id = Uuid::new_v4();
    stray.name = Rig::name(stray_id);
    stray.id = "stray".into();
    stray
        .labels
        .insert(LABEL_COMPUTER.into(), stray_id.to_string());
    rig.fake.insert_container(stray);
    let rig = rig.restart(Duration::from_secs(3600)).await;
    let orphans = rig.handle.orphans().await.unwrap();
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].computer, stray_id.to_string());
    assert_eq!(mutations_of(&rig.fake, "remove"), 0);
    assert!(rig.fake.container(&Rig::name(stray_id)).is_some());
    assert_eq!(rig.handle.list().await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn every_change_is_broadcast() {
    let rig = Rig::new(Duration::from_secs(3600)).await;
    let mut events = rig.handle.subscribe();
    let id = rig.create().await.id;
    rig.handle.stop(id, None).await.unwrap();
    let mut seen = Vec::new();
    while let Ok(BrokerEvent::Status { computer }) = events.try_recv() {
        seen.push((computer.container, computer.ready));
    }
    assert!(seen.contains(&(ContainerState::Running, false)), "{seen:?}");
    assert!(seen.contains(&(ContainerState::Running, true)), "{seen:?}");
    assert_eq!(seen.last(), Some(&(ContainerState::Stopped, false)));
}

#[tokio::test]
async fn bad_configuration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEngine::new());
    let metrics = Arc::new(Metrics::default());
    let mut c = config(dir.path(), Duration::from_secs(1), 0);
    assert!(spawn(c.clone(), fake.clone(), metrics.clone())
        .await
        .is_err());
    c.max_instances = 65;
    assert!(spawn(c.clone(), fake.clone(), metrics.clone())
        .await
        .is_err());
    c.max_instances = 2;
    c.idle_timeout = Duration::from_millis(999);
    assert!(spawn(c, fake, metrics).await.is_err());
}

mod hostile;
