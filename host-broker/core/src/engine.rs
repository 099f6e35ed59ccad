//! The desktop backend: the verbs a desktop has, behind one trait.
//!
//! The owner and the lifecycle code speak only [`Backend`] verbs —
//! provision, resume, suspend, destroy, observe, a stream of changes, the
//! guest channel and the workspace — in the plain types of this module. How a
//! backend keeps a desktop (a container of a Docker-API engine today, the
//! `dormouse-docker` crate) is its own business: its creation settings
//! ([`BackendSpec`], opaque here), its naming and labelling conventions and
//! the check that a stopped desktop is still the one that was created
//! ([`Provenance`]).
//!
//! This module must never hold policy: a backend does not decide *whether* to
//! start or stop anything, it only does it and reports what it finds.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::guest::GuestSocket;

/// A future returned by a backend verb.
pub type BackendFuture<'a, T> = BoxFuture<'a, Result<T, EngineError>>;

/// What went wrong talking to the backend. Messages may carry the backend's
/// own words (paths, engine replies): they are for the log, never the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The engine could not be reached (socket missing, connection refused,
    /// timeout). The broker keeps serving and reports `unknown`.
    #[error("engine unreachable: {0}")]
    Unavailable(String),
    /// No such container or image.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request conflicts with the engine's state (e.g. the name is taken).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The engine refused or failed the request.
    #[error("engine error: {0}")]
    Failed(String),
}

/// The run state of a desktop as the backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    /// Created, never started.
    Created,
    /// Running.
    Running,
    /// Paused (cgroup freezer).
    Paused,
    /// Being restarted by a restart policy.
    Restarting,
    /// Being removed.
    Removing,
    /// Exited (stopped).
    Exited,
    /// Dead: the engine failed to stop or remove it.
    Dead,
    /// Anything this version does not know.
    Other,
}

impl RunState {
    /// Whether the container is up in any form (a paused container still
    /// holds its resources and counts as running).
    pub fn is_up(self) -> bool {
        matches!(self, Self::Running | Self::Paused | Self::Restarting)
    }

    /// Whether the container is down and could be started.
    pub fn is_down(self) -> bool {
        matches!(self, Self::Created | Self::Exited)
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Restarting => "restarting",
            Self::Removing => "removing",
            Self::Exited => "exited",
            Self::Dead => "dead",
            Self::Other => "unknown",
        })
    }
}

/// Why a start would be refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The desktop runs already (not a failure of the checks).
    Running,
    /// A check failed; the text says which, for people.
    Problem(String),
}

impl Refusal {
    /// The reason for people.
    pub fn message(&self) -> String {
        match self {
            Self::Running => "the container is already running".into(),
            Self::Problem(p) => p.clone(),
        }
    }
}

/// The backend's own judgement of whether a stopped desktop is still the one
/// its record was created as. Backend-private facts stay behind this trait.
pub trait Provenance: fmt::Debug + Send + Sync {
    /// Every resume check against `origin`; `image_present` is `None` when
    /// unknown (which fails closed).
    fn check(&self, origin: Origin<'_>, image_present: Option<bool>) -> Result<(), Refusal>;
}

/// What a desktop was made as, read from its computer's record: the facts a
/// backend creates it from ([`Backend::provision`]) and judges a resume
/// against ([`Provenance`]).
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The computer.
    pub id: Uuid,
    /// Its owner key.
    pub owner: &'a str,
    /// The immutable ID of the image it was created from.
    pub image_id: &'a str,
    /// The backend's creation settings ([`Backend::spec`]).
    pub spec: &'a BackendSpec,
}

/// The fixed hostname of a desktop: `desk-<first 8 hex digits of the id>`.
pub fn hostname(id: Uuid) -> String {
    let simple = id.simple().to_string();
    format!("desk-{}", &simple[..8])
}

/// What a desktop runs unless told otherwise, as its image declares it (the
/// OCI image configuration: entrypoint, command, user).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Entrypoint (the supervisor).
    pub entrypoint: Vec<String>,
    /// Arguments.
    pub cmd: Vec<String>,
    /// User (empty: root, the supervisor drops privileges itself).
    pub user: String,
}

/// A desktop image as the broker knows it: its immutable identity, the
/// labels it declares (`dev.dormouse.protocol`, `dev.dormouse.recipe`, …)
/// and what it runs. Where a backend keeps its images is its own business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Immutable content ID, `sha256:…`.
    pub id: String,
    /// The image's labels.
    pub labels: BTreeMap<String, String>,
    /// What a desktop of it runs unless told otherwise.
    pub process: Process,
}

/// One desktop as the broker needs it.
#[derive(Debug, Clone)]
pub struct Desktop {
    /// Run state.
    pub state: RunState,
    /// When it last started; `None` if never.
    pub started_at: Option<DateTime<Utc>>,
    /// When it last stopped; `None` if never (or the backend gave no time).
    pub finished_at: Option<DateTime<Utc>>,
    /// Exit code of the last run.
    pub exit_code: Option<i64>,
    /// Whether the kernel's OOM killer ended the last run.
    pub oom_killed: bool,
    /// What the backend knows of how it was made, for the resume check.
    pub provenance: Arc<dyn Provenance>,
}

impl Desktop {
    /// The resume check on this desktop.
    pub fn check(&self, origin: Origin<'_>, image_present: Option<bool>) -> Result<(), Refusal> {
        self.provenance.check(origin, image_present)
    }
}

/// What the broker last learnt from the backend about a computer's desktop:
/// the backend half of the owner's state of each computer, refreshed on
/// start-up, on every change the backend reports and after every operation.
#[derive(Debug, Clone)]
pub enum Observed {
    /// The backend could not be asked; why.
    Unknown(String),
    /// The backend has no such desktop.
    Missing,
    /// The desktop as observed.
    Present(Box<Desktop>),
}

impl Observed {
    /// The desktop, when the backend reported one.
    pub fn info(&self) -> Option<&Desktop> {
        match self {
            Self::Present(info) => Some(info),
            _ => None,
        }
    }

    /// Whether the desktop is up.
    pub fn is_up(&self) -> bool {
        self.info().is_some_and(|i| i.state.is_up())
    }
}

/// A provenance that accepts every resume, for tests.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug)]
pub struct NoProvenance;

#[cfg(any(test, feature = "test-support"))]
impl Provenance for NoProvenance {
    fn check(&self, _: Origin<'_>, _: Option<bool>) -> Result<(), Refusal> {
        Ok(())
    }
}

#[cfg(any(test, feature = "test-support"))]
impl Desktop {
    /// A stopped (exited) desktop, for unit tests that only care about how
    /// and when it stopped.
    pub fn test_stopped(finished_at: Option<DateTime<Utc>>, exit_code: i64) -> Self {
        Desktop {
            state: RunState::Exited,
            started_at: None,
            finished_at,
            exit_code: Some(exit_code),
            oom_killed: false,
            provenance: Arc::new(NoProvenance),
        }
    }
}

/// The creation settings of a desktop, persisted in its record as "what it
/// was created with". Opaque to the core: the backend that wrote it
/// ([`Backend::spec`]) is the one that reads it back
/// ([`BackendSpec::decode`]). It is stored as the settings' own JSON, so the
/// records written when this was the Docker backend's `ContainerSpec` inline
/// load as they are. Every backend's settings carry a `name`: the backend's
/// name for the desktop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackendSpec(serde_json::Value);

impl From<serde_json::Value> for BackendSpec {
    fn from(settings: serde_json::Value) -> Self {
        Self(settings)
    }
}

impl BackendSpec {
    /// The settings `settings`, as a record keeps them.
    pub fn encode<T: Serialize>(settings: &T) -> Result<Self, serde_json::Error> {
        serde_json::to_value(settings).map(Self)
    }

    /// The settings again, as the backend that wrote them reads them.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.0)
    }

    /// The settings as JSON.
    pub fn as_json(&self) -> &serde_json::Value {
        &self.0
    }

    /// The backend's name for the desktop, when the settings carry one.
    pub fn name(&self) -> Option<&str> {
        self.0.get("name").and_then(serde_json::Value::as_str)
    }

    /// How people call the thing that holds the desktop (`container dormouse-…`).
    pub fn describe(&self) -> String {
        format!("container {}", self.name().unwrap_or("(unnamed)"))
    }
}

/// A desktop the backend holds that carries this broker's marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The backend's name for it (container name).
    pub name: String,
    /// The computer id its marks name (possibly not a UUID).
    pub computer: String,
    /// The owner its marks name.
    pub owner: Option<String>,
    /// Its run state (or the action that was just seen happen to it).
    pub state: String,
}

/// Something happened to a desktop carrying this broker's marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The computer it belongs to, when its marks name one.
    pub computer: Option<Uuid>,
    /// What it is.
    pub listed: Listed,
    /// It no longer exists.
    pub gone: bool,
    /// Its run ended (or it is gone): what a kill or a stop looks like.
    pub ended: bool,
}

/// What a check of the backend's change stream found ([`Backend::probe_changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeProbe {
    /// A probe's end arrived on the stream, this long after it was caused.
    Delivered(Duration),
    /// Nothing of the probe arrived within this long.
    Silent(Duration),
    /// The check could not be made (why, for the log).
    NotChecked(String),
}

/// The verbs the broker needs from whatever keeps its desktops.
///
/// Every verb names a desktop by its computer id; how the backend finds it
/// (a container name, a pod) is the backend's convention.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Resolves an image reference (tag or ID) to the image's identity;
    /// `None` when absent.
    fn image<'a>(&'a self, reference: &'a str) -> BackendFuture<'a, Option<Image>>;
    /// The creation settings of a new desktop, persisted before
    /// [`Backend::provision`] is asked.
    fn spec(&self, id: Uuid, owner: &str, image: &Image) -> BackendSpec;
    /// Creates and starts the desktop of a persisted record.
    fn provision<'a>(&'a self, origin: Origin<'a>) -> BackendFuture<'a, ()>;
    /// Starts a stopped desktop again, the same one (never recreates it).
    fn resume(&self, id: Uuid) -> BackendFuture<'_, ()>;
    /// Stops a running desktop; `grace` is how long its processes get after
    /// the stop signal.
    fn suspend(&self, id: Uuid, grace: Duration) -> BackendFuture<'_, ()>;
    /// Removes the desktop. Its workspace is never touched; a missing
    /// desktop is success.
    fn destroy(&self, id: Uuid) -> BackendFuture<'_, ()>;
    /// One desktop's state; `None` when it does not exist.
    fn observe(&self, id: Uuid) -> BackendFuture<'_, Option<Desktop>>;
    /// Every desktop carrying this broker's marks, with or without a record.
    fn inventory(&self) -> BackendFuture<'_, Vec<Listed>>;
    /// Changes from now on. The stream ends (or yields an error) when the
    /// connection drops; the caller reconnects.
    fn changes(&self) -> BoxStream<'static, Result<Change, EngineError>>;
    /// The guest channel of a desktop.
    fn guest(&self, id: Uuid) -> GuestSocket;
    /// The host path of a desktop's workspace.
    fn workspace(&self, id: Uuid) -> PathBuf;
    /// Bytes of the desktop's own writable storage outside the workspace
    /// (a container's writable layer), measured by the backend on request;
    /// `None` when there is no desktop or the backend cannot say. It must
    /// never start the desktop.
    fn layer_bytes(&self, id: Uuid) -> BackendFuture<'_, Option<u64>> {
        let _ = id;
        Box::pin(async { Ok(None) })
    }
    /// Checks once that [`Backend::changes`] delivers what happens: makes a
    /// short-lived probe of `image` (never a desktop), ends it and waits for
    /// that on the stream. Backends that cannot keep this default.
    fn probe_changes<'a>(&'a self, image: &'a str) -> BoxFuture<'a, ChangeProbe> {
        let _ = image;
        Box::pin(async { ChangeProbe::NotChecked("this backend has no probe".into()) })
    }
}
