//! The container engine behind a narrow trait of our own verbs.
//!
//! Everything the broker asks of Docker (or Podman through its Docker API)
//! goes through [`Engine`]: `image`, `create`, `start`, `stop`, `kill`,
//! `inspect`, `remove`, `list` and `events`, in our own plain types. The
//! bollard implementation lives in [`docker`]; [`fake`] is a recording
//! in-memory engine for tests. This module must never hold policy: it does not
//! decide *whether* to start or stop anything, it only does it and reports
//! what the engine says.

pub mod docker;
pub mod fake;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};

/// A future returned by an engine verb.
pub type EngineFuture<'a, T> = BoxFuture<'a, Result<T, EngineError>>;

/// What went wrong talking to the engine.
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

/// An image as the engine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Immutable content ID, `sha256:…`.
    pub id: String,
    /// Image labels (`dev.dormouse.protocol`, `dev.dormouse.recipe`, …).
    pub labels: BTreeMap<String, String>,
}

/// A bind mount from the host into the container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BindMount {
    /// Absolute host path.
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A mount the engine reports for a container (of any kind).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MountInfo {
    /// `bind`, `volume`, `tmpfs`, …
    pub kind: String,
    /// Host path or volume name.
    pub source: String,
    /// Path inside the container.
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

impl From<&BindMount> for MountInfo {
    /// How the engine reports a bind mount it was given.
    fn from(m: &BindMount) -> Self {
        MountInfo {
            kind: "bind".into(),
            source: m.source.to_string_lossy().into_owned(),
            target: m.target.clone(),
            read_only: m.read_only,
        }
    }
}

/// CPU, memory and process limits of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU quota in units of 10⁻⁹ CPUs.
    pub nano_cpus: i64,
    /// Memory limit in bytes.
    pub memory: i64,
    /// Memory + swap limit in bytes (equal to `memory`: no swap).
    pub memory_swap: i64,
    /// Maximum number of processes.
    pub pids_limit: i64,
}

/// The isolation settings of a container's host config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hardening {
    /// `none` for every desktop.
    pub network_mode: String,
    /// Capabilities added after `cap_drop`.
    pub cap_add: Vec<String>,
    /// Capabilities dropped (`ALL`).
    pub cap_drop: Vec<String>,
    /// `no-new-privileges`, …
    pub security_opt: Vec<String>,
    /// `private`.
    pub ipc_mode: String,
    /// `private`.
    pub cgroupns_mode: String,
    /// Always `false`.
    pub privileged: bool,
    /// Always `false`.
    pub publish_all_ports: bool,
    /// Restart policy name: `no`.
    pub restart_policy: String,
    /// Engine-provided init process; `false`, the supervisor is PID 1.
    pub init: bool,
}

impl Hardening {
    /// A canonical form for comparison: capability names upper-case without
    /// `CAP_`, lists sorted, `no-new-privileges:true` spelled
    /// `no-new-privileges`, an empty restart policy spelled `no`.
    ///
    /// Engines normalise what they were given (Docker 20.10 stores `CHOWN`
    /// as `CAP_CHOWN`), so "as created" has to be judged on this form.
    pub fn normalized(&self) -> Hardening {
        fn caps(list: &[String]) -> Vec<String> {
            let mut out: Vec<String> = list.iter().map(|c| normalize_cap(c)).collect();
            out.sort();
            out.dedup();
            out
        }
        let mut security_opt: Vec<String> = self
            .security_opt
            .iter()
            .map(|o| match o.as_str() {
                "no-new-privileges:true" | "no-new-privileges=true" => "no-new-privileges".into(),
                other => other.to_owned(),
            })
            .collect();
        security_opt.sort();
        security_opt.dedup();
        Hardening {
            network_mode: self.network_mode.clone(),
            cap_add: caps(&self.cap_add),
            cap_drop: caps(&self.cap_drop),
            security_opt,
            ipc_mode: self.ipc_mode.clone(),
            cgroupns_mode: self.cgroupns_mode.clone(),
            privileged: self.privileged,
            publish_all_ports: self.publish_all_ports,
            restart_policy: if self.restart_policy.is_empty() {
                "no".into()
            } else {
                self.restart_policy.clone()
            },
            init: self.init,
        }
    }
}

/// `cap_chown`, `CAP_CHOWN` and `CHOWN` all name one capability.
pub fn normalize_cap(cap: &str) -> String {
    let upper = cap.trim().to_ascii_uppercase();
    match upper.strip_prefix("CAP_") {
        Some(rest) => rest.to_owned(),
        None => upper,
    }
}

/// Everything needed to create a desktop container; persisted with the
/// computer record as "the settings it was created with".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// Container name, `dormouse-<id>`.
    pub name: String,
    /// Immutable image ID.
    pub image: String,
    /// Fixed hostname of the computer.
    pub hostname: String,
    /// Container labels.
    pub labels: BTreeMap<String, String>,
    /// The only mounts.
    pub mounts: Vec<BindMount>,
    /// Isolation settings.
    pub hardening: Hardening,
    /// Resource limits.
    pub limits: Limits,
    /// Replaces the image's entrypoint and command when not empty. Desktops
    /// leave it empty: the image's entrypoint is the supervisor (PID 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
}

impl ContainerSpec {
    /// The mounts `inspect` reports for a container created from this spec,
    /// sorted: the form in which "mounted as created" is compared.
    pub fn mount_infos(&self) -> Vec<MountInfo> {
        let mut mounts: Vec<MountInfo> = self.mounts.iter().map(MountInfo::from).collect();
        mounts.sort();
        mounts
    }
}

/// The run state the engine reports.
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

/// What `inspect` says of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Engine ID.
    pub id: String,
    /// Name without the leading `/`.
    pub name: String,
    /// Image ID the container was created from.
    pub image: String,
    /// Configured hostname.
    pub hostname: String,
    /// Container labels.
    pub labels: BTreeMap<String, String>,
    /// Run state.
    pub state: RunState,
    /// When it last started; `None` if never.
    pub started_at: Option<DateTime<Utc>>,
    /// When it last stopped; `None` if never (or the engine gave no time).
    pub finished_at: Option<DateTime<Utc>>,
    /// Exit code of the last run.
    pub exit_code: Option<i64>,
    /// Whether the kernel's OOM killer ended the last run.
    pub oom_killed: bool,
    /// Every mount, of any kind.
    pub mounts: Vec<MountInfo>,
    /// Networks the container is attached to.
    pub networks: Vec<String>,
    /// Whether any port is published.
    pub published_ports: bool,
    /// Isolation settings as the engine stored them.
    pub hardening: Hardening,
    /// Limits as the engine stored them.
    pub limits: Limits,
}

#[cfg(test)]
impl ContainerInfo {
    /// A stopped (exited) container with empty settings, for unit tests that
    /// only care about how and when it stopped.
    pub(crate) fn test_stopped(finished_at: Option<DateTime<Utc>>, exit_code: i64) -> Self {
        ContainerInfo {
            id: "c".into(),
            name: "dormouse-x".into(),
            image: "sha256:i".into(),
            hostname: "h".into(),
            labels: BTreeMap::new(),
            state: RunState::Exited,
            started_at: None,
            finished_at,
            exit_code: Some(exit_code),
            oom_killed: false,
            mounts: vec![],
            networks: vec![],
            published_ports: false,
            hardening: Hardening {
                network_mode: "none".into(),
                cap_add: vec![],
                cap_drop: vec![],
                security_opt: vec![],
                ipc_mode: String::new(),
                cgroupns_mode: String::new(),
                privileged: false,
                publish_all_ports: false,
                restart_policy: String::new(),
                init: false,
            },
            limits: Limits {
                nano_cpus: 0,
                memory: 0,
                memory_swap: 0,
                pids_limit: 0,
            },
        }
    }
}

/// A container in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSummary {
    /// Engine ID.
    pub id: String,
    /// Name without the leading `/`.
    pub name: String,
    /// Container labels.
    pub labels: BTreeMap<String, String>,
    /// Run state.
    pub state: RunState,
}

/// One engine event about a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineEvent {
    /// `create`, `start`, `die`, `stop`, `kill`, `oom`, `destroy`, …
    pub action: String,
    /// Engine ID of the container.
    pub container_id: String,
    /// Container name.
    pub name: String,
    /// Container labels.
    pub labels: BTreeMap<String, String>,
    /// When it happened.
    pub time: Option<DateTime<Utc>>,
}

/// The verbs the broker needs from a container engine.
///
/// Names are container names (`dormouse-<id>`); an engine ID works too.
pub trait Engine: Send + Sync + fmt::Debug {
    /// Resolves an image reference (tag or ID); `None` when absent.
    fn image<'a>(&'a self, reference: &'a str) -> EngineFuture<'a, Option<ImageInfo>>;
    /// Creates (does not start) a container; returns its engine ID.
    fn create<'a>(&'a self, spec: &'a ContainerSpec) -> EngineFuture<'a, String>;
    /// Starts an existing container.
    fn start<'a>(&'a self, name: &'a str) -> EngineFuture<'a, ()>;
    /// Sends the stop signal and kills after `timeout`.
    fn stop<'a>(&'a self, name: &'a str, timeout: Duration) -> EngineFuture<'a, ()>;
    /// Sends `signal` (e.g. `SIGKILL`).
    fn kill<'a>(&'a self, name: &'a str, signal: &'a str) -> EngineFuture<'a, ()>;
    /// What the engine says of a container; `None` when it does not exist.
    fn inspect<'a>(&'a self, name: &'a str) -> EngineFuture<'a, Option<ContainerInfo>>;
    /// Removes a container (forcibly, with its anonymous volumes). Bind-mounted
    /// host directories are never touched by the engine.
    fn remove<'a>(&'a self, name: &'a str) -> EngineFuture<'a, ()>;
    /// Every container (running or not) carrying all of these labels
    /// (`key` or `key=value`).
    fn list<'a>(&'a self, labels: &'a [String]) -> EngineFuture<'a, Vec<ContainerSummary>>;
    /// Container events from now on, for containers carrying all of these
    /// labels. The stream ends (or yields an error) when the connection drops;
    /// the caller reconnects.
    fn events(&self, labels: &[String]) -> BoxStream<'static, Result<EngineEvent, EngineError>>;
}

/// Parses an engine timestamp. The engine writes `0001-01-01T00:00:00Z` for
/// "never"; that, an empty string or garbage are `None`.
pub fn parse_engine_time(raw: Option<&str>) -> Option<DateTime<Utc>> {
    let raw = raw?.trim();
    if raw.is_empty() || raw.starts_with("0001-01-01") {
        return None;
    }
    DateTime::parse_from_rfc3339(raw)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_names_are_normalized() {
        assert_eq!(normalize_cap("CAP_CHOWN"), "CHOWN");
        assert_eq!(normalize_cap("chown"), "CHOWN");
        assert_eq!(normalize_cap("ALL"), "ALL");
    }

    #[test]
    fn hardening_compares_in_canonical_form() {
        let given = Hardening {
            network_mode: "none".into(),
            cap_add: vec!["KILL".into(), "CHOWN".into()],
            cap_drop: vec!["ALL".into()],
            security_opt: vec!["no-new-privileges".into()],
            ipc_mode: "private".into(),
            cgroupns_mode: "private".into(),
            privileged: false,
            publish_all_ports: false,
            restart_policy: "no".into(),
            init: false,
        };
        let stored = Hardening {
            cap_add: vec!["CAP_CHOWN".into(), "CAP_KILL".into()],
            security_opt: vec!["no-new-privileges:true".into()],
            restart_policy: String::new(),
            ..given.clone()
        };
        assert_eq!(given.normalized(), stored.normalized());
        let widened = Hardening {
            cap_add: vec!["CAP_CHOWN".into(), "CAP_SYS_ADMIN".into()],
            ..stored
        };
        assert_ne!(given.normalized(), widened.normalized());
    }

    #[test]
    fn engine_times_parse_and_zero_is_none() {
        assert_eq!(parse_engine_time(Some("0001-01-01T00:00:00Z")), None);
        assert_eq!(parse_engine_time(Some("")), None);
        assert_eq!(parse_engine_time(None), None);
        assert_eq!(parse_engine_time(Some("yesterday")), None);
        let t = parse_engine_time(Some("2024-05-01T10:20:30.123456789Z")).expect("parses");
        assert_eq!(t.timestamp_subsec_nanos(), 123_456_789);
    }
}
