//! A scripted broker core for router tests: it answers [`Command`]s from an
//! in-memory table, broadcasts events like the real owner, and records every
//! command it receives so a test can assert that a bad request made none.

#![allow(dead_code, clippy::redundant_closure_call, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, StatusCode};
use chrono::Utc;
use dormouse_broker::api::{self, ApiState, ApiToken};
use dormouse_broker::command::{BrokerHandle, Command, Fence};
use dormouse_broker::error::BrokerError;
use dormouse_broker::guest::{GuestError, GuestRelay};
use dormouse_broker::metrics::Metrics;
use dormouse_broker::relay::{Purpose, Ticket};
use dormouse_protocol::actions::{
    ActionBatch, ActionImage, ActionName, ActionResult, GuestActionResults,
};
use dormouse_protocol::api::{
    BrokerEvent, ComputerStatus, ContainerState, IdleStatus, LeaseGrant, StopReason,
};
use dormouse_protocol::image::ImageFormat;
use dormouse_protocol::stream::{self, ReadLimits};
use dormouse_protocol::Phase;
use dormouse_protocol::{Request, Response};
use futures_util::future::BoxFuture;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc};
use tower::ServiceExt;
use uuid::Uuid;

/// The token every test uses.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A one-pixel PNG.
pub const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// What the scripted guest answers for an image of `format`: [`PNG`], or
/// a few bytes that begin with the JPEG or WebP signature.
pub fn image_of(format: ImageFormat) -> &'static [u8] {
    match format {
        ImageFormat::Png => PNG,
        ImageFormat::Jpeg => b"\xff\xd8\xff\xe0scripted",
        ImageFormat::Webp => b"RIFF\x0c\0\0\0WEBPVP8Lscripted",
    }
}

/// The scripted core's shared table and its record of commands.
#[derive(Debug, Default)]
pub struct Script {
    /// Computers by id.
    pub computers: BTreeMap<Uuid, ComputerStatus>,
    /// Every command received, as `verb id`.
    pub calls: Vec<String>,
    /// When set, every command fails with this error.
    pub fail_with: Option<BrokerError>,
    /// How long a started desktop stays running but not ready.
    pub boot_time: Duration,
    /// When set, a started desktop stops after `boot_time` with this problem
    /// instead of becoming ready.
    pub fail_boot: Option<String>,
    /// Egress policies set through the API.
    pub egress: BTreeMap<Uuid, dormouse_protocol::egress_policy::EgressPolicy>,
}

/// A router over a scripted core.
pub struct Harness {
    /// The router's state (broker handle, token, shutdown).
    pub state: ApiState,
    /// The scripted core's table.
    pub script: Arc<Mutex<Script>>,
    /// The core's event sender (to inject events).
    pub events: broadcast::Sender<BrokerEvent>,
}

impl Harness {
    /// A harness with one stopped computer and one running, ready one.
    pub fn new() -> Self {
        Self::with_capacity(64)
    }

    /// Same, with a given event-channel capacity (small forces lag).
    pub fn with_capacity(capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let (events, _) = broadcast::channel(capacity);
        let script = Arc::new(Mutex::new(Script::default()));
        tokio::spawn(owner(rx, script.clone(), events.clone()));
        let handle = BrokerHandle::new(tx, events.clone());
        let state = ApiState::new(handle, Arc::new(Metrics::default()), ApiToken::new(TOKEN));
        Self {
            state,
            script,
            events,
        }
    }

    /// The API router.
    pub fn router(&self) -> axum::Router {
        api::router(self.state.clone())
    }

    /// Adds a computer in the given state; returns its id.
    pub fn add(&self, name: &str, running: bool) -> Uuid {
        let status = sample(Uuid::new_v4(), name, running);
        let id = status.id;
        self.lock().computers.insert(id, status);
        id
    }

    /// The recorded calls.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// A snapshot of the table.
    pub fn computers(&self) -> BTreeMap<Uuid, ComputerStatus> {
        self.lock().computers.clone()
    }

    /// Locks the script.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().expect("script lock")
    }
}

/// A status as the real core would report it.
pub fn sample(id: Uuid, name: &str, running: bool) -> ComputerStatus {
    ComputerStatus {
        id,
        name: name.into(),
        owner: "default".into(),
        container: if running {
            ContainerState::Running
        } else {
            ContainerState::Stopped
        },
        ready: running,
        phase: running.then_some(Phase::Ready),
        problem: None,
        stop_reason: (!running).then_some(StopReason::Idle),
        stopped_at: (!running).then(Utc::now),
        resumable: !running,
        resumable_problem: running.then(|| "the container is running".into()),
        generation: 1,
        health: None,
        image_id: "sha256:0000".into(),
        idle: Some(IdleStatus {
            timeout_ms: 8 * 3600 * 1000,
            idle_for_ms: 0,
            stops_at: running.then(|| Utc::now() + chrono::Duration::hours(8)),
        }),
        workspace_limit: None,
        taskbar_height: running.then_some(32),
        start_phases: None,
    }
}

fn check_fence(status: &ComputerStatus, fence: Fence) -> Result<(), BrokerError> {
    match fence {
        Some(g) if g != status.generation => Err(BrokerError::StaleGeneration {
            given: g.to_string(),
            current: status.generation,
        }),
        _ => Ok(()),
    }
}

// Over 100 lines on purpose: the fake owner's one match, an arm per
// command it answers; the match is the table of what the fake does.
async fn owner(
    mut rx: mpsc::Receiver<Command>,
    script: Arc<Mutex<Script>>,
    events: broadcast::Sender<BrokerEvent>,
) {
    while let Some(command) = rx.recv().await {
        let mut s = script.lock().expect("script lock");
        let fail = s.fail_with.as_ref().map(BrokerError::duplicate);
        let boot_time = s.boot_time;
        let fail_boot = s.fail_boot.clone();
        macro_rules! answer {
            ($reply:expr, $name:expr, $id:expr, $body:expr) => {{
                s.calls.push(format!("{} {}", $name, $id));
                let result = match &fail {
                    Some(err) => Err(err.duplicate()),
                    // A closure, so `?` and `return` in a body end this command only.
                    None => (|| $body)(),
                };
                let _ = $reply.send(result);
            }};
        }
        let publish = |status: &ComputerStatus| {
            let _ = events.send(BrokerEvent::Status {
                computer: Box::new(status.clone()),
            });
        };
        match command {
            Command::Create(req, reply) => {
                let id = Uuid::new_v4();
                answer!(reply, "create", id, {
                    let name = req
                        .name
                        .clone()
                        .unwrap_or_else(|| id.to_string()[..8].into());
                    let mut status = sample(id, &name, true);
                    if let Some(owner) = req.owner.clone() {
                        status.owner = owner;
                    }
                    s.computers.insert(id, status.clone());
                    publish(&status);
                    Ok(status)
                })
            }
            Command::List(reply) => answer!(reply, "list", "*", {
                Ok(s.computers.values().cloned().collect())
            }),
            Command::Get(id, reply) => answer!(reply, "get", id, {
                s.computers
                    .get(&id)
                    .cloned()
                    .ok_or(BrokerError::NotFound(id))
            }),
            Command::Start(id, fence, reply) => answer!(reply, "start", id, {
                let c = s.computers.get_mut(&id).ok_or(BrokerError::NotFound(id))?;
                check_fence(c, fence)?;
                if c.container == ContainerState::Running {
                    return Err(BrokerError::WrongState("the computer is running".into()));
                }
                c.container = ContainerState::Running;
                c.ready = boot_time.is_zero();
                c.phase = Some(if c.ready {
                    Phase::Ready
                } else {
                    Phase::Starting
                });
                c.stop_reason = None;
                c.stopped_at = None;
                c.resumable = false;
                let status = c.clone();
                publish(&status);
                if !boot_time.is_zero() {
                    let script = script.clone();
                    let events = events.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(boot_time).await;
                        let mut s = script.lock().expect("script lock");
                        if let Some(c) = s.computers.get_mut(&id) {
                            if let (ContainerState::Running, Some(problem)) =
                                (c.container, fail_boot)
                            {
                                c.container = ContainerState::Stopped;
                                c.phase = None;
                                c.problem = Some(problem);
                                c.resumable = true;
                                let _ = events.send(BrokerEvent::Status {
                                    computer: Box::new(c.clone()),
                                });
                            } else if c.container == ContainerState::Running {
                                c.ready = true;
                                c.phase = Some(Phase::Ready);
                                c.idle = Some(IdleStatus {
                                    timeout_ms: 8 * 3600 * 1000,
                                    idle_for_ms: 0,
                                    stops_at: Some(Utc::now() + chrono::Duration::hours(8)),
                                });
                                let _ = events.send(BrokerEvent::Status {
                                    computer: Box::new(c.clone()),
                                });
                            }
                        }
                    });
                }
                Ok(status)
            }),
            Command::Stop(id, fence, reply) => answer!(reply, "stop", id, {
                let c = s.computers.get_mut(&id).ok_or(BrokerError::NotFound(id))?;
                check_fence(c, fence)?;
                c.container = ContainerState::Stopped;
                c.ready = false;
                c.phase = None;
                c.stop_reason = Some(StopReason::Manual);
                c.stopped_at = Some(Utc::now());
                c.resumable = true;
                c.resumable_problem = None;
                let status = c.clone();
                publish(&status);
                Ok(status)
            }),
            Command::Remove {
                id, fence, reply, ..
            } => answer!(reply, "remove", id, {
                let c = s.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                check_fence(c, fence)?;
                s.computers.remove(&id);
                let _ = events.send(BrokerEvent::Removed { id });
                Ok(())
            }),
            Command::Touch(id, fence, reply) => answer!(reply, "touch", id, {
                let c = s.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                check_fence(c, fence)?;
                Ok(c.clone())
            }),
            Command::Patch(id, patch, fence, reply) => answer!(reply, "patch", id, {
                let c = s.computers.get_mut(&id).ok_or(BrokerError::NotFound(id))?;
                check_fence(c, fence)?;
                if let (Some(ms), Some(idle)) = (patch.idle_timeout_ms, c.idle.as_mut()) {
                    idle.timeout_ms = ms;
                }
                Ok(c.clone())
            }),
            Command::Lease(id, req, reply) => answer!(reply, "lease", id, {
                let c = s.computers.get_mut(&id).ok_or(BrokerError::NotFound(id))?;
                c.generation += 1;
                Ok(LeaseGrant {
                    generation: c.generation,
                    holder: req.holder.clone(),
                    expires_at: Utc::now()
                        + chrono::Duration::milliseconds(
                            i64::try_from(req.ttl_ms).unwrap_or(i64::MAX),
                        ),
                })
            }),
            Command::Orphans(reply) => answer!(reply, "orphans", "*", Ok(Vec::new())),
            Command::AdmitGuest(id, fence, purpose, reply) => {
                let name = match purpose {
                    Purpose::Exec => "admit_exec",
                    Purpose::Screen(_) => "screen_admit",
                    Purpose::Screenshot => "screenshot",
                    Purpose::Actions { .. } => "actions",
                    _ => "admit_guest",
                };
                answer!(reply, name, id, {
                    let c = s.computers.get_mut(&id).ok_or(BrokerError::NotFound(id))?;
                    // No supervisor behind an exec: a call reaches "no
                    // supervisor socket". Screenshots and actions get the
                    // scripted guest.
                    let guest = dormouse_broker::guest::GuestSocket::new(
                        "/nonexistent/run/supervisor.sock",
                    );
                    let guest = match purpose {
                        Purpose::Exec => {
                            check_fence(c, fence)?;
                            if !c.ready {
                                return Err(BrokerError::WrongState(
                                    "not running and ready".into(),
                                ));
                            }
                            guest
                        }
                        Purpose::Screenshot => {
                            if !c.ready {
                                return Err(BrokerError::WrongState(
                                    "the desktop is not ready".into(),
                                ));
                            }
                            guest.through(Arc::new(ScriptedGuest))
                        }
                        Purpose::Actions { .. } => {
                            check_fence(c, fence)?;
                            guest.through(Arc::new(ScriptedGuest))
                        }
                        _ => guest,
                    };
                    Ok(Ticket {
                        computer: id,
                        guest,
                        generation: c.generation,
                        actor: dormouse_protocol::activity::Actor::Api,
                        revoked: tokio_util::sync::CancellationToken::new(),
                        answers: Default::default(),
                    })
                })
            }
            // The workspace routes are tested against the real core.
            Command::Workspace(_, _, reply) | Command::ImportSlot(_, reply) => {
                let _ = reply.send(Err(BrokerError::Internal("not scripted".into())));
            }
            Command::Disk(_, reply) => {
                let _ = reply.send(Err(BrokerError::Internal("not scripted".into())));
            }
            Command::Import(_, _, _, reply) => {
                let _ = reply.send(Err(BrokerError::Internal("not scripted".into())));
            }
            Command::Egress(id, set, fence, reply) => answer!(reply, "egress", id, {
                let c = s.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                if let Some(policy) = set {
                    check_fence(c, fence)?;
                    s.egress.insert(id, policy);
                }
                Ok(s.egress.get(&id).cloned().unwrap_or_default())
            }),
            Command::EgressActivity(id, reply) => answer!(reply, "egress_activity", id, Ok(())),
            Command::LastScreen(id, reply) => answer!(reply, "last_screen", id, {
                s.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                Ok(None)
            }),
            Command::ReleaseLease(id, _fence, reply) => answer!(reply, "release_lease", id, {
                s.computers.get(&id).ok_or(BrokerError::NotFound(id))?;
                Ok(())
            }),
        }
    }
}

/// The guest of the scripted core's desktops: one request per connection,
/// answered as a well-behaved supervisor would (a screenshot is
/// [`image_of`] its format, every action succeeds, each image too).
#[derive(Debug)]
struct ScriptedGuest;

impl GuestRelay for ScriptedGuest {
    fn open(&self) -> BoxFuture<'_, Result<UnixStream, GuestError>> {
        Box::pin(async {
            let (near, mut far) = UnixStream::pair().map_err(GuestError::Connect)?;
            tokio::spawn(async move {
                let limits = ReadLimits::new(Some(Duration::from_secs(5)), Duration::from_secs(5));
                let Ok(frame) = stream::read_frame::<Request, _>(&mut far, &limits).await else {
                    return;
                };
                let (response, payload) = match frame.message {
                    Request::Screenshot { encoding } => (
                        Response::Screenshot {
                            width: 1,
                            height: 1,
                            format: encoding.format,
                        },
                        image_of(encoding.format).to_vec(),
                    ),
                    Request::Actions { batch } => scripted_actions(&batch),
                    _ => (Response::error("unknown_kind", "not scripted"), Vec::new()),
                };
                let _ = stream::write_frame(&mut far, &response, &payload, Duration::from_secs(5))
                    .await;
            });
            Ok(near)
        })
    }
}

/// Every action succeeds; a `screenshot` or `zoom` gives [`image_of`] the
/// format it asked for.
fn scripted_actions(batch: &ActionBatch) -> (Response, Vec<u8>) {
    let mut answer = GuestActionResults {
        results: Vec::new(),
        image_lens: Vec::new(),
        text_lens: Vec::new(),
    };
    let mut payload = Vec::new();
    for action in &batch.actions {
        let name = action.name();
        answer.results.push(match name {
            ActionName::CursorPosition => ActionResult {
                coordinate: Some([0, 0]),
                ..ActionResult::ok(name)
            },
            ActionName::Screenshot | ActionName::Zoom => {
                let format = action.encoding().unwrap_or_default().format;
                let image = image_of(format);
                payload.extend_from_slice(image);
                answer
                    .image_lens
                    .push(u64::try_from(image.len()).unwrap_or(u64::MAX));
                ActionResult {
                    image: Some(ActionImage {
                        media_type: format.media_type().into(),
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

/// What the router answered one request.
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: axum::http::HeaderMap,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The API error's code.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("<no error code>")
            .to_owned()
    }
}

/// One request through the harness's router, answered whole.
pub async fn call(h: &Harness, request: axum::http::Request<Body>) -> Answer {
    let response = h.router().oneshot(request).await.expect("router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// A request with the token.
pub fn req(method: Method, uri: &str) -> axum::http::request::Builder {
    axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
}

/// A request with the token and no body.
pub fn empty(method: Method, uri: &str) -> axum::http::Request<Body> {
    req(method, uri).body(Body::empty()).expect("request")
}

/// A request with the token and a JSON body.
pub fn with_json(method: Method, uri: &str, body: &str) -> axum::http::Request<Body> {
    req(method, uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("request")
}
