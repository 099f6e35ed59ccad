//! A recording in-memory [`Engine`] for tests (in the spirit of youki's
//! `libcgroups` test manager): it keeps containers and images in memory,
//! behaves like Docker 20.10 where the broker depends on it (capability
//! names come back as `CAP_…`, `stop` of a stopped container succeeds,
//! `FinishedAt` is kept while running), records every verb called, and lets a
//! test inject failures, delays, an unreachable engine and foreign actions
//! (a stop or kill the broker did not make, an OOM kill).
//!
//! It sits under the Docker backend, so the owner's tests drive the real
//! backend code over it. It is compiled only for the crate's own tests and
//! with the `test-support` feature (for tests of other crates), never
//! into the production library.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use chrono::Utc;
use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::{broadcast, watch};

mod stream;

use super::container_engine::{
    normalize_cap, ContainerInfo, ContainerSpec, ContainerSummary, Engine, EngineError,
    EngineEvent, EngineFuture, ImageInfo, RunState,
};

/// One call made to the fake, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `image(reference)`.
    Image(String),
    /// `create(spec)`: the spec as given.
    Create(Box<ContainerSpec>),
    /// `start(name)`.
    Start(String),
    /// `stop(name, timeout)`.
    Stop(String, Duration),
    /// `kill(name, signal)`.
    Kill(String, String),
    /// `inspect(name)`.
    Inspect(String),
    /// `remove(name)`.
    Remove(String),
    /// `list(labels)`.
    List,
    /// `events(labels)`.
    Events,
}

impl Call {
    /// Whether the call changes a container (create, start, stop, kill, remove).
    pub fn is_mutation(&self) -> bool {
        matches!(
            self,
            Self::Create(_) | Self::Start(_) | Self::Stop(..) | Self::Kill(..) | Self::Remove(_)
        )
    }

    /// A short form for assertions: `create dormouse-…`, `stop dormouse-…`.
    pub fn short(&self) -> String {
        match self {
            Self::Image(r) => format!("image {r}"),
            Self::Create(spec) => format!("create {}", spec.name),
            Self::Start(n) => format!("start {n}"),
            Self::Stop(n, _) => format!("stop {n}"),
            Self::Kill(n, s) => format!("kill {n} {s}"),
            Self::Inspect(n) => format!("inspect {n}"),
            Self::Remove(n) => format!("remove {n}"),
            Self::List => "list".into(),
            Self::Events => "events".into(),
        }
    }
}

/// A verb, for injecting failures and delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// `image`.
    Image,
    /// `create`.
    Create,
    /// `start`.
    Start,
    /// `stop`.
    Stop,
    /// `kill`.
    Kill,
    /// `inspect`.
    Inspect,
    /// `remove`.
    Remove,
    /// `list`.
    List,
}

#[derive(Debug, Default)]
struct State {
    images: BTreeMap<String, ImageInfo>,
    tags: BTreeMap<String, String>,
    containers: BTreeMap<String, ContainerInfo>,
    calls: Vec<Call>,
    unavailable: bool,
    failures: HashMap<Verb, Vec<EngineError>>,
    /// Failures a start answers after it did its work.
    late_start_failures: Vec<EngineError>,
    delays: HashMap<Verb, Duration>,
    next_delays: HashMap<Verb, Vec<Duration>>,
    stop_exit_code: i64,
    next_id: u64,
    /// Deliver no event to a subscription with a bare-key label filter, as
    /// Podman 4.3's compatible API does.
    blind_to_bare_labels: bool,
}

/// Something a test runs when a container starts or its run ends (e.g. a
/// scripted supervisor binding the socket in the run directory).
pub type Hook = std::sync::Arc<dyn Fn(&ContainerInfo) + Send + Sync>;

/// A change `create` applies to what it stores.
type CreateHook = std::sync::Arc<dyn Fn(&mut ContainerInfo) + Send + Sync>;

#[derive(Default)]
struct Hooks {
    on_start: Option<Hook>,
    on_end: Option<Hook>,
    /// Changes what `create` stores, as an engine that accepts a setting
    /// and does not apply it would.
    on_create: Option<CreateHook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("on_start", &self.on_start.is_some())
            .field("on_end", &self.on_end.is_some())
            .field("on_create", &self.on_create.is_some())
            .finish()
    }
}

/// The recording fake engine.
#[derive(Debug)]
pub struct FakeEngine {
    state: Mutex<State>,
    hooks: Mutex<Hooks>,
    events: broadcast::Sender<EngineEvent>,
    /// Bumped when the engine goes away: every open event stream breaks.
    cuts: watch::Sender<u64>,
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeEngine {
    /// An empty, reachable engine.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(1024);
        let (cuts, _) = watch::channel(0);
        Self {
            state: Mutex::new(State::default()),
            hooks: Mutex::new(Hooks::default()),
            events,
            cuts,
        }
    }

    /// Runs `hook` after every start of a container (ours or foreign).
    pub fn on_start(&self, hook: impl Fn(&ContainerInfo) + Send + Sync + 'static) {
        self.hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on_start = Some(std::sync::Arc::new(hook));
    }

    /// Lets `change` alter every container `create` stores (an engine that
    /// silently drops a setting).
    pub fn on_create(&self, change: impl Fn(&mut ContainerInfo) + Send + Sync + 'static) {
        self.hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on_create = Some(std::sync::Arc::new(change));
    }

    /// Runs `hook` whenever a container's run ends (stop, kill, OOM, forced remove).
    pub fn on_end(&self, hook: impl Fn(&ContainerInfo) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).on_end =
            Some(std::sync::Arc::new(hook));
    }

    fn run_hook(&self, start: bool, name: &str) {
        let hook = {
            let hooks = self.hooks.lock().unwrap_or_else(|p| p.into_inner());
            if start {
                hooks.on_start.clone()
            } else {
                hooks.on_end.clone()
            }
        };
        let info = self.container(name);
        if let (Some(hook), Some(info)) = (hook, info) {
            hook(&info);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking test thread must not hide the recorded calls.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an image with an ID, an optional tag and labels.
    pub fn add_image(&self, id: &str, tag: Option<&str>, labels: &[(&str, &str)]) {
        let mut s = self.lock();
        s.images.insert(
            id.to_owned(),
            ImageInfo {
                id: id.to_owned(),
                labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                process: super::container_engine::Process::default(),
            },
        );
        if let Some(tag) = tag {
            s.tags.insert(tag.to_owned(), id.to_owned());
        }
    }

    /// Deletes an image (containers made from it keep existing, as in Docker
    /// with `--force`).
    pub fn remove_image(&self, id: &str) {
        let mut s = self.lock();
        s.images.remove(id);
        s.tags.retain(|_, v| v != id);
    }

    /// Makes every verb fail with [`EngineError::Unavailable`] (or not);
    /// going away also breaks every open event stream, as a stopped engine
    /// closes its connections.
    pub fn set_unavailable(&self, unavailable: bool) {
        let was = std::mem::replace(&mut self.lock().unavailable, unavailable);
        if unavailable && !was {
            self.cuts.send_modify(|n| *n += 1);
        }
    }

    /// The next call of `verb` fails with `error` (queued in order).
    pub fn fail_next(&self, verb: Verb, error: EngineError) {
        self.lock().failures.entry(verb).or_default().push(error);
    }

    /// The next start does its work, then answers `error` (as Podman
    /// answers a start whose container was killed at once).
    pub fn fail_next_start_after_acting(&self, error: EngineError) {
        self.lock().late_start_failures.push(error);
    }

    /// Every later call of `verb` takes this long (tokio time) before acting.
    pub fn delay(&self, verb: Verb, by: Duration) {
        self.lock().delays.insert(verb, by);
    }

    /// Only the next call of `verb` takes this long (queued in order). An
    /// `inspect` answers with the state at the time of the call, like an
    /// engine whose answer is slow to arrive.
    pub fn delay_next(&self, verb: Verb, by: Duration) {
        self.lock().next_delays.entry(verb).or_default().push(by);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The container-changing calls so far, in short form.
    pub fn mutations(&self) -> Vec<String> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.is_mutation())
            .map(Call::short)
            .collect()
    }

    /// A container's current state.
    pub fn container(&self, name: &str) -> Option<ContainerInfo> {
        self.lock().containers.get(name).cloned()
    }

    /// Changes a container behind the broker's back (no event is sent;
    /// call [`FakeEngine::emit`] for one).
    pub fn mutate(&self, name: &str, change: impl FnOnce(&mut ContainerInfo)) {
        if let Some(c) = self.lock().containers.get_mut(name) {
            change(c);
        }
    }

    /// Puts a container in place as if someone else had created it.
    pub fn insert_container(&self, info: ContainerInfo) {
        let event = event_of("create", &info);
        self.lock().containers.insert(info.name.clone(), info);
        let _ = self.events.send(event);
    }

    /// Sends an event for a container as the engine would.
    pub fn emit(&self, action: &str, name: &str) {
        let event = self
            .lock()
            .containers
            .get(name)
            .map(|c| event_of(action, c));
        if let Some(event) = event {
            let _ = self.events.send(event);
        }
    }

    /// A stop the broker did not make (e.g. `docker stop` by an operator).
    pub fn foreign_stop(&self, name: &str) {
        self.end_run(name, 0, false);
        self.emit("die", name);
        self.emit("stop", name);
    }

    /// A kill the engine reports to nobody: the run ends (the guest with it)
    /// and no event is sent.
    pub fn silent_kill(&self, name: &str) {
        self.end_run(name, 137, false);
    }

    /// Makes event subscriptions filtered by a bare label key deliver
    /// nothing (Podman 4.3 matches only `key=value`).
    pub fn blind_to_bare_labels(&self, blind: bool) {
        self.lock().blind_to_bare_labels = blind;
    }

    /// A `docker kill -s KILL` the broker did not make.
    pub fn foreign_kill(&self, name: &str) {
        self.end_run(name, 137, false);
        self.emit("kill", name);
        self.emit("die", name);
    }

    /// The kernel's OOM killer ends the container.
    pub fn oom_kill(&self, name: &str) {
        self.end_run(name, 137, true);
        self.emit("oom", name);
        self.emit("die", name);
    }

    /// A `docker start` the broker did not make.
    pub fn foreign_start(&self, name: &str) {
        let started = {
            let mut s = self.lock();
            match s.containers.get_mut(name) {
                Some(c) if c.state.is_down() => {
                    begin_run(c);
                    true
                }
                _ => false,
            }
        };
        if started {
            self.run_hook(true, name);
            self.emit("start", name);
        }
    }

    fn end_run(&self, name: &str, exit_code: i64, oom: bool) {
        let ended = {
            let mut s = self.lock();
            match s.containers.get_mut(name) {
                Some(c) if c.state.is_up() => {
                    c.state = RunState::Exited;
                    c.finished_at = Some(Utc::now());
                    c.exit_code = Some(exit_code);
                    c.oom_killed = oom;
                    true
                }
                _ => false,
            }
        };
        if ended {
            self.run_hook(false, name);
        }
    }

    /// Records the call, then applies an injected delay, unavailability or
    /// failure.
    async fn enter(&self, call: Call, verb: Verb) -> Result<(), EngineError> {
        let delay = self.record(call, verb);
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        self.check(verb)
    }

    /// Records a call; returns the delay it is to take.
    fn record(&self, call: Call, verb: Verb) -> Option<Duration> {
        let mut s = self.lock();
        s.calls.push(call);
        match s.next_delays.get_mut(&verb).filter(|q| !q.is_empty()) {
            Some(queue) => Some(queue.remove(0)),
            None => s.delays.get(&verb).copied(),
        }
    }

    /// An injected unavailability or failure for this verb, if any.
    fn check(&self, verb: Verb) -> Result<(), EngineError> {
        let mut s = self.lock();
        if s.unavailable {
            return Err(EngineError::Unavailable(
                "fake engine is switched off".into(),
            ));
        }
        if let Some(queue) = s.failures.get_mut(&verb) {
            if !queue.is_empty() {
                return Err(queue.remove(0));
            }
        }
        Ok(())
    }
}

fn event_of(action: &str, c: &ContainerInfo) -> EngineEvent {
    EngineEvent {
        action: action.to_owned(),
        container_id: c.id.clone(),
        name: c.name.clone(),
        labels: c.labels.clone(),
        time: Some(Utc::now()),
    }
}

fn begin_run(c: &mut ContainerInfo) {
    c.state = RunState::Running;
    c.started_at = Some(Utc::now());
    c.oom_killed = false;
}

fn matches_labels(labels: &BTreeMap<String, String>, wanted: &[String]) -> bool {
    wanted.iter().all(|w| match w.split_once('=') {
        Some((k, v)) => labels.get(k).is_some_and(|have| have == v),
        None => labels.contains_key(w.as_str()),
    })
}

impl Engine for FakeEngine {
    fn image<'a>(&'a self, reference: &'a str) -> EngineFuture<'a, Option<ImageInfo>> {
        Box::pin(async move {
            self.enter(Call::Image(reference.to_owned()), Verb::Image)
                .await?;
            let s = self.lock();
            let id = s
                .tags
                .get(reference)
                .cloned()
                .unwrap_or_else(|| reference.to_owned());
            Ok(s.images.get(&id).cloned())
        })
    }

    fn create<'a>(&'a self, spec: &'a ContainerSpec) -> EngineFuture<'a, String> {
        Box::pin(async move {
            self.enter(Call::Create(Box::new(spec.clone())), Verb::Create)
                .await?;
            let info = {
                let mut s = self.lock();
                if s.containers.contains_key(&spec.name) {
                    return Err(EngineError::Conflict(format!(
                        "the container name \"/{}\" is already in use",
                        spec.name
                    )));
                }
                if !s.images.contains_key(&spec.image) {
                    return Err(EngineError::NotFound(format!(
                        "no such image: {}",
                        spec.image
                    )));
                }
                for m in &spec.mounts {
                    if !m.source.exists() {
                        return Err(EngineError::Failed(format!(
                            "invalid mount config: bind source path does not exist: {}",
                            m.source.display()
                        )));
                    }
                }
                s.next_id += 1;
                let id = format!("{:064x}", s.next_id);
                let mut hardening = spec.hardening.clone();
                // Docker 20.10 stores capabilities in their CAP_ form.
                hardening.cap_add = hardening
                    .cap_add
                    .iter()
                    .map(|c| format!("CAP_{}", normalize_cap(c)))
                    .collect();
                let mut info = ContainerInfo {
                    id: id.clone(),
                    name: spec.name.clone(),
                    image: spec.image.clone(),
                    hostname: spec.hostname.clone(),
                    labels: spec.labels.clone(),
                    state: RunState::Created,
                    started_at: None,
                    finished_at: None,
                    exit_code: Some(0),
                    oom_killed: false,
                    mounts: spec.mount_infos(),
                    networks: vec![spec.hardening.network_mode.clone()],
                    published_ports: false,
                    hardening,
                    limits: spec.limits,
                    process: spec.expected_process().unwrap_or_default(),
                    apparmor_profile: String::new(),
                };
                let change = self
                    .hooks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .on_create
                    .clone();
                if let Some(change) = change {
                    change(&mut info);
                }
                s.containers.insert(spec.name.clone(), info.clone());
                info
            };
            let _ = self.events.send(event_of("create", &info));
            Ok(info.id)
        })
    }

    fn start<'a>(&'a self, name: &'a str) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            self.enter(Call::Start(name.to_owned()), Verb::Start)
                .await?;
            let started = {
                let mut s = self.lock();
                let c = s
                    .containers
                    .get_mut(name)
                    .ok_or_else(|| EngineError::NotFound(format!("no such container: {name}")))?;
                if c.state.is_up() {
                    false
                } else if c.state.is_down() {
                    begin_run(c);
                    true
                } else {
                    return Err(EngineError::Failed(format!(
                        "cannot start a {} container",
                        c.state
                    )));
                }
            };
            if started {
                self.run_hook(true, name);
                self.emit("start", name);
            }
            let mut s = self.lock();
            if s.late_start_failures.is_empty() {
                Ok(())
            } else {
                Err(s.late_start_failures.remove(0))
            }
        })
    }

    fn stop<'a>(&'a self, name: &'a str, timeout: Duration) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            self.enter(Call::Stop(name.to_owned(), timeout), Verb::Stop)
                .await?;
            let stopped = {
                let mut s = self.lock();
                let code = s.stop_exit_code;
                let c = s
                    .containers
                    .get_mut(name)
                    .ok_or_else(|| EngineError::NotFound(format!("no such container: {name}")))?;
                if c.state.is_up() {
                    c.state = RunState::Exited;
                    c.finished_at = Some(Utc::now());
                    c.exit_code = Some(code);
                    true
                } else {
                    false
                }
            };
            if stopped {
                self.run_hook(false, name);
                self.emit("die", name);
                self.emit("stop", name);
            }
            Ok(())
        })
    }

    fn kill<'a>(&'a self, name: &'a str, signal: &'a str) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            self.enter(Call::Kill(name.to_owned(), signal.to_owned()), Verb::Kill)
                .await?;
            {
                let s = self.lock();
                let c = s
                    .containers
                    .get(name)
                    .ok_or_else(|| EngineError::NotFound(format!("no such container: {name}")))?;
                if !c.state.is_up() {
                    return Err(EngineError::Conflict(format!(
                        "container {name} is not running"
                    )));
                }
            }
            self.end_run(name, 137, false);
            self.emit("kill", name);
            self.emit("die", name);
            Ok(())
        })
    }

    fn inspect<'a>(&'a self, name: &'a str) -> EngineFuture<'a, Option<ContainerInfo>> {
        Box::pin(async move {
            let delay = self.record(Call::Inspect(name.to_owned()), Verb::Inspect);
            let snapshot = self.lock().containers.get(name).cloned();
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            self.check(Verb::Inspect)?;
            Ok(snapshot)
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            self.enter(Call::Remove(name.to_owned()), Verb::Remove)
                .await?;
            let removed = self.lock().containers.get(name).cloned();
            if removed.as_ref().is_some_and(|c| c.state.is_up()) {
                self.run_hook(false, name);
            }
            let removed = removed.and_then(|_| self.lock().containers.remove(name));
            match removed {
                Some(c) => {
                    if c.state.is_up() {
                        let _ = self.events.send(event_of("kill", &c));
                        let _ = self.events.send(event_of("die", &c));
                    }
                    let _ = self.events.send(event_of("destroy", &c));
                    Ok(())
                }
                None => Err(EngineError::NotFound(format!("no such container: {name}"))),
            }
        })
    }

    fn list<'a>(&'a self, labels: &'a [String]) -> EngineFuture<'a, Vec<ContainerSummary>> {
        Box::pin(async move {
            self.enter(Call::List, Verb::List).await?;
            Ok(self
                .lock()
                .containers
                .values()
                .filter(|c| matches_labels(&c.labels, labels))
                .map(|c| ContainerSummary {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    labels: c.labels.clone(),
                    state: c.state,
                })
                .collect())
        })
    }

    fn events(&self, labels: &[String]) -> BoxStream<'static, Result<EngineEvent, EngineError>> {
        let (unavailable, blind) = {
            let mut s = self.lock();
            s.calls.push(Call::Events);
            (
                s.unavailable,
                s.blind_to_bare_labels && labels.iter().any(|l| !l.contains('=')),
            )
        };
        if unavailable {
            return futures_util::stream::once(async {
                Err(EngineError::Unavailable(
                    "fake engine is switched off".into(),
                ))
            })
            .boxed();
        }
        let cut = self.cuts.subscribe();
        stream::follow(self.events.subscribe(), cut, labels.to_vec(), blind)
    }
}
