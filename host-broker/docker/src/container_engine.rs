//! The container engine: the Docker Engine API as the Docker backend needs
//! it, a narrow trait of container verbs ([`Engine`]) in plain types of our
//! own, implemented over bollard by [`super::client`] and, for tests, by
//! [`super::fake`].
//!
//! Podman serves the same API; where it differs it is a
//! [`super::Dialect`] of the backend, not another engine. This module must
//! never hold policy: it does not decide *whether* to start or stop anything.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub use dormouse_core::engine::{EngineError, Image, Process, RunState};

/// A future returned by an engine verb.
pub type EngineFuture<'a, T> = BoxFuture<'a, Result<T, EngineError>>;

/// An image as the engine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Immutable content ID, `sha256:…`.
    pub id: String,
    /// Image labels (`dev.dormouse.protocol`, `dev.dormouse.recipe`, …).
    pub labels: BTreeMap<String, String>,
    /// What a container of it runs unless told otherwise.
    pub process: Process,
}

impl From<ImageInfo> for Image {
    fn from(info: ImageInfo) -> Self {
        Image {
            id: info.id,
            labels: info.labels,
            process: info.process,
        }
    }
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// PID namespace mode: empty (a private namespace). `host` would show
    /// the guest every host process.
    #[serde(default)]
    pub pid_mode: String,
    /// UTS namespace mode: empty (private).
    #[serde(default)]
    pub uts_mode: String,
    /// User namespace mode: empty (the engine's default).
    #[serde(default)]
    pub userns_mode: String,
    /// Host devices passed in: none.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Namespaced kernel settings: none.
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
    /// Read-only root filesystem: `false` (the guest writes its own root).
    #[serde(default)]
    pub readonly_rootfs: bool,
    /// Resource limits of every process (`nofile`, `nproc`), explicit so an
    /// engine's defaults (Podman's differ from Docker's) do not decide them.
    /// Records made before they were set carry none and are compared so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ulimits: Vec<Ulimit>,
}

/// One `setrlimit` limit of every process in a container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Ulimit {
    /// `nofile`, `nproc`, …
    pub name: String,
    /// Soft limit.
    pub soft: i64,
    /// Hard limit.
    pub hard: i64,
}

impl Hardening {
    /// A canonical form for comparison: capability names upper-case without
    /// `CAP_`, lists sorted, `no-new-privileges:true` spelled
    /// `no-new-privileges`, a seccomp profile given inline as its digest
    /// ([`super::seccomp::canonical`]), an empty restart policy spelled `no`.
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
                other => super::seccomp::canonical(other),
            })
            .collect();
        security_opt.sort();
        security_opt.dedup();
        // Engines report one capability set in different forms: Docker as
        // given (`drop ALL, add five`), Podman's compatible API as the
        // default set minus what was dropped. Compared is the effective set.
        let effective = {
            let add = caps(&self.cap_add);
            let drop = caps(&self.cap_drop);
            let mut set: Vec<String> = if drop.iter().any(|c| c == "ALL") {
                Vec::new()
            } else {
                DEFAULT_CAPABILITIES
                    .iter()
                    .map(|c| (*c).to_owned())
                    .filter(|c| !drop.contains(c))
                    .collect()
            };
            set.extend(add);
            set.sort();
            set.dedup();
            set
        };
        // The same namespace, spelled differently by the two engines.
        let own_namespace = |mode: &str| match mode {
            "private" => String::new(),
            other => other.to_owned(),
        };
        Hardening {
            network_mode: self.network_mode.clone(),
            cap_add: effective,
            cap_drop: vec!["ALL".into()],
            security_opt,
            // Podman reports a private IPC namespace as `shareable` (its own,
            // which others could be told to join; nothing joins ours).
            ipc_mode: match self.ipc_mode.as_str() {
                "shareable" => "private".into(),
                other => other.to_owned(),
            },
            // Docker always reports the mode; only Podman's compatible API
            // leaves it empty (it does not report it). See docs/security.md.
            cgroupns_mode: if self.cgroupns_mode.is_empty() {
                "private".into()
            } else {
                self.cgroupns_mode.clone()
            },
            privileged: self.privileged,
            publish_all_ports: self.publish_all_ports,
            restart_policy: if self.restart_policy.is_empty() {
                "no".into()
            } else {
                self.restart_policy.clone()
            },
            init: self.init,
            pid_mode: own_namespace(&self.pid_mode),
            uts_mode: own_namespace(&self.uts_mode),
            userns_mode: self.userns_mode.clone(),
            devices: {
                let mut d = self.devices.clone();
                d.sort();
                d
            },
            sysctls: self.sysctls.clone(),
            readonly_rootfs: self.readonly_rootfs,
            ulimits: {
                // `nofile` (Docker) and `RLIMIT_NOFILE` (Podman) name one limit.
                let mut u: Vec<Ulimit> = self
                    .ulimits
                    .iter()
                    .map(|l| {
                        let name = l.name.to_ascii_lowercase();
                        Ulimit {
                            name: name.strip_prefix("rlimit_").unwrap_or(&name).to_owned(),
                            ..l.clone()
                        }
                    })
                    .collect();
                u.sort();
                u
            },
        }
    }
}

/// The capabilities a container has when none are dropped: Docker's
/// default set, which Podman's compatible API also reports against.
pub const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

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
    /// What the container must run as (from the image, or `command`).
    /// Records made before it was kept carry none; theirs is not compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Process>,
}

impl ContainerSpec {
    /// What the container must run: `command` replaces the image's
    /// entrypoint (with no arguments) when set; otherwise the image's own.
    /// `None` for records made before this was kept.
    pub fn expected_process(&self) -> Option<Process> {
        if self.command.is_empty() {
            return self.process.clone();
        }
        Some(Process {
            entrypoint: self.command.clone(),
            cmd: Vec::new(),
            user: self
                .process
                .as_ref()
                .map(|p| p.user.clone())
                .unwrap_or_default(),
        })
    }

    /// The mounts `inspect` reports for a container created from this spec,
    /// sorted: the form in which "mounted as created" is compared.
    pub fn mount_infos(&self) -> Vec<MountInfo> {
        let mut mounts: Vec<MountInfo> = self.mounts.iter().map(MountInfo::from).collect();
        mounts.sort();
        mounts
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
    /// What it runs as.
    pub process: Process,
    /// The AppArmor profile the engine applied (empty: none or not supported).
    pub apparmor_profile: String,
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
    /// Runs `argv` as root in a running container with stdin and stdout
    /// attached, and returns the near end of a local socket pair joined to
    /// them (what the process writes to stderr is logged, never relayed).
    /// Engines that cannot do it say so.
    fn exec_stream<'a>(
        &'a self,
        name: &'a str,
        argv: &'a [&'a str],
    ) -> EngineFuture<'a, tokio::net::UnixStream> {
        let _ = (name, argv);
        Box::pin(async { Err(EngineError::Failed("this engine cannot exec".into())) })
    }
    /// Bytes of the container's writable layer (`SizeRw` of an inspect
    /// with sizes); `None` when the container does not exist or the engine
    /// does not say. Engines that cannot measure it keep this default.
    fn size_rw<'a>(&'a self, name: &'a str) -> EngineFuture<'a, Option<u64>> {
        let _ = name;
        Box::pin(async { Ok(None) })
    }
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
            ..Default::default()
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
