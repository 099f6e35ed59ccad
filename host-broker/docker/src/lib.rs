//! The [`Backend`] over a Docker-API engine: each desktop is one container.
//!
//! [`DockerBackend`] turns desktop verbs into container verbs of an
//! [`Engine`] ([`client::DockerEngine`] over bollard; [`fake`] in tests). It
//! owns what is Docker-shaped: the creation settings ([`ContainerSpec`],
//! [`spec`]), the name and label conventions (`dormouse-<id>`, the
//! `dev.dormouse.*` labels, the `destroy` event), and the resume check
//! ([`resume`]). Podman serves the same API: it is a [`Dialect`] of this
//! backend (its quirks are switches here), not another backend.
//!
//! It must never decide policy: it creates, starts, stops and removes only
//! when asked, and reports what the engine says.

#![forbid(unsafe_code)]

pub mod client;
pub mod container_engine;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
pub mod probe;
pub mod resume;
pub mod seccomp;
pub mod spec;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::{LABEL_COMPUTER, LABEL_OWNER};
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt};
use uuid::Uuid;

pub use self::client::DockerEngine;
pub use self::container_engine::{ContainerInfo, ContainerSpec, Engine, EngineEvent, ImageInfo};
use dormouse_core::config::{BrokerConfig, ResourceLimits};
use dormouse_core::engine::{
    Backend, BackendFuture, BackendSpec, Change, ChangeProbe, Desktop, EngineError, Image, Listed,
    Origin,
};
use dormouse_core::faults;
use dormouse_core::guest::GuestSocket;
use dormouse_core::paths::Paths;

/// Which engine speaks the Docker API, for the few places they differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dialect {
    /// Docker Engine (20.10 and later).
    #[default]
    Docker,
    /// Podman's Docker-compatible service.
    Podman,
}

impl Dialect {
    /// The event action of a container that is gone for good.
    pub fn removed_action(self) -> &'static str {
        "destroy"
    }

    /// The event actions of a container whose process ended (Docker says
    /// `die`; Podman's compatibility layer may say `died`).
    pub fn ended_actions(self) -> &'static [&'static str] {
        match self {
            Self::Docker => &["die"],
            Self::Podman => &["die", "died"],
        }
    }

    /// The dialect of an engine that calls itself `name` in its version
    /// report (Podman lists a component `Podman Engine`).
    pub fn from_engine_name(name: &str) -> Self {
        if name.to_ascii_lowercase().contains("podman") {
            Self::Podman
        } else {
            Self::Docker
        }
    }
}

/// How the broker reaches a desktop's supervisor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GuestChannel {
    /// The socket in the bind-mounted run directory.
    #[default]
    RunDir,
    /// `dormouse-supervisor bridge` over the engine's exec stream (where no
    /// host directory can be mounted; costs an exec per connection).
    Bridge,
}

/// How the Docker backend makes containers.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Which engine it talks to.
    pub dialect: Dialect,
    /// How the supervisor is reached.
    pub guest_channel: GuestChannel,
    /// Extra labels every container gets; they also narrow which containers
    /// count as this broker's.
    pub labels: BTreeMap<String, String>,
    /// Limits of every new container.
    pub limits: ResourceLimits,
}

impl DockerConfig {
    /// The settings a broker configuration implies (dialect: Docker).
    pub fn from_broker(config: &BrokerConfig) -> Self {
        Self {
            dialect: Dialect::Docker,
            guest_channel: GuestChannel::RunDir,
            labels: config.container_labels.clone(),
            limits: config.limits.clone(),
        }
    }
}

/// Desktops as containers of a Docker-API engine.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    engine: Arc<dyn Engine>,
    config: DockerConfig,
    paths: Paths,
}

impl DockerBackend {
    /// A backend over `engine`, keeping host directories under `paths`.
    pub fn new(engine: Arc<dyn Engine>, config: DockerConfig, paths: Paths) -> Self {
        Self {
            engine,
            config,
            paths,
        }
    }

    /// The backend a broker configuration implies over `engine`: Docker's
    /// dialect, the run-directory guest channel, host directories under the
    /// configured data directory.
    pub fn for_broker(engine: Arc<dyn Engine>, config: &BrokerConfig) -> Self {
        Self::new(
            engine,
            DockerConfig::from_broker(config),
            Paths::new(&config.data_dir),
        )
    }

    fn desktop(info: ContainerInfo) -> Desktop {
        Desktop {
            state: info.state,
            started_at: info.started_at,
            finished_at: info.finished_at,
            exit_code: info.exit_code,
            oom_killed: info.oom_killed,
            provenance: Arc::new(info),
        }
    }
}

/// The guest channel over the engine's exec: `dormouse-supervisor bridge`
/// relays the exec's stdin/stdout to the supervisor socket inside the guest.
#[derive(Debug)]
pub struct ExecBridge {
    /// The engine that runs the exec.
    pub engine: Arc<dyn Engine>,
    /// The container.
    pub container: String,
}

/// The command that relays the guest channel inside a desktop.
pub const BRIDGE_COMMAND: &[&str] = &["dormouse-supervisor", "bridge"];
/// The command that relays the desktop's VNC socket (the live screen).
pub const VNC_BRIDGE_COMMAND: &[&str] = &["dormouse-supervisor", "bridge-vnc"];

impl ExecBridge {
    fn open_command<'a>(
        &'a self,
        argv: &'static [&'static str],
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<tokio::net::UnixStream, dormouse_core::guest::GuestError>,
    > {
        Box::pin(async move {
            self.engine
                .exec_stream(&self.container, argv)
                .await
                .map_err(|e| {
                    dormouse_core::guest::GuestError::Connect(std::io::Error::other(e.to_string()))
                })
        })
    }
}

impl dormouse_core::guest::GuestRelay for ExecBridge {
    fn open(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<tokio::net::UnixStream, dormouse_core::guest::GuestError>,
    > {
        self.open_command(BRIDGE_COMMAND)
    }

    fn open_vnc(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<tokio::net::UnixStream, dormouse_core::guest::GuestError>,
    > {
        self.open_command(VNC_BRIDGE_COMMAND)
    }
}

fn listed(name: String, labels: &BTreeMap<String, String>, state: String) -> Listed {
    Listed {
        name,
        computer: labels.get(LABEL_COMPUTER).cloned().unwrap_or_default(),
        owner: labels.get(LABEL_OWNER).cloned(),
        state,
    }
}

impl Backend for DockerBackend {
    fn image<'a>(&'a self, reference: &'a str) -> BackendFuture<'a, Option<Image>> {
        Box::pin(async move { Ok(self.engine.image(reference).await?.map(Image::from)) })
    }

    fn spec(&self, id: Uuid, owner: &str, image: &Image) -> BackendSpec {
        spec::to_backend(&spec::container_spec(
            &self.config,
            &self.paths,
            id,
            owner,
            image,
        ))
    }

    fn provision<'a>(&'a self, origin: Origin<'a>) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            let spec = &spec::from_backend(origin.spec)?;
            seccomp::install(self.config.dialect, &self.paths)?;
            faults::step("engine: seccomp profile installed");
            self.engine.create(spec).await?;
            faults::step("engine: container created");
            // An engine may accept a setting and not apply it (a compatible
            // API that ignores a field): what it reports now must be what was
            // asked for, by the same check a resume runs, or the container
            // goes and the create fails closed.
            let info = self.engine.inspect(&spec.name).await?;
            faults::step("engine: created container inspected");
            if let Err(refusal) = resume::check(origin, info.as_ref(), Some(true)) {
                let why = refusal.message();
                tracing::error!(container = %spec.name, problem = %why, "the engine did not apply the hardening as asked; removing the container");
                if let Err(e) = self.engine.remove(&spec.name).await {
                    tracing::warn!(container = %spec.name, error = %e, "removing the refused container failed");
                }
                return Err(EngineError::Failed(format!(
                    "the engine did not apply the settings as asked: {why}"
                )));
            }
            self.engine.start(&spec.name).await
        })
    }

    fn resume(&self, id: Uuid) -> BackendFuture<'_, ()> {
        Box::pin(async move { self.engine.start(&spec::container_name(id)).await })
    }

    fn suspend(&self, id: Uuid, grace: Duration) -> BackendFuture<'_, ()> {
        Box::pin(async move { self.engine.stop(&spec::container_name(id), grace).await })
    }

    fn destroy(&self, id: Uuid) -> BackendFuture<'_, ()> {
        Box::pin(async move {
            match self.engine.remove(&spec::container_name(id)).await {
                Ok(()) | Err(EngineError::NotFound(_)) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn observe(&self, id: Uuid) -> BackendFuture<'_, Option<Desktop>> {
        Box::pin(async move {
            let info = self.engine.inspect(&spec::container_name(id)).await?;
            Ok(info.map(Self::desktop))
        })
    }

    fn inventory(&self) -> BackendFuture<'_, Vec<Listed>> {
        Box::pin(async move {
            let listed_now = self.engine.list(&spec::our_labels(&self.config)).await?;
            Ok(listed_now
                .into_iter()
                .map(|c| listed(c.name, &c.labels, c.state.to_string()))
                .collect())
        })
    }

    fn changes(&self) -> BoxStream<'static, Result<Change, EngineError>> {
        let removed = self.config.dialect.removed_action();
        let ended = self.config.dialect.ended_actions();
        let ours = spec::our_labels(&self.config);
        // The engine is asked for container events only, a filter every
        // engine honours; whose they are is judged here, on the labels each
        // event carries. (Podman 4.3 matches a bare-key label filter against
        // nothing, so a server-side `label=dev.dormouse.computer` would
        // deliver no event at all there.)
        self.engine
            .events(&[])
            .filter(move |event| {
                let keep = match event {
                    Ok(e) => spec::carries_labels(&e.labels, &ours),
                    Err(_) => true,
                };
                std::future::ready(keep)
            })
            .map(move |event| {
                event.map(|e| {
                    let computer = e
                        .labels
                        .get(LABEL_COMPUTER)
                        .and_then(|v| Uuid::parse_str(v).ok())
                        .or_else(|| spec::computer_of_name(&e.name));
                    tracing::debug!(action = %e.action, container = %e.name, "engine event");
                    let gone = e.action == removed;
                    Change {
                        computer,
                        gone,
                        ended: gone || ended.contains(&e.action.as_str()),
                        listed: listed(e.name, &e.labels, e.action),
                    }
                })
            })
            .boxed()
    }

    fn guest(&self, id: Uuid) -> GuestSocket {
        let socket = GuestSocket::new(self.paths.socket(id));
        match self.config.guest_channel {
            GuestChannel::RunDir => socket,
            GuestChannel::Bridge => socket.through(Arc::new(ExecBridge {
                engine: self.engine.clone(),
                container: spec::container_name(id),
            })),
        }
    }

    fn workspace(&self, id: Uuid) -> PathBuf {
        self.paths.workspace(id)
    }

    fn layer_bytes(&self, id: Uuid) -> BackendFuture<'_, Option<u64>> {
        Box::pin(async move { self.engine.size_rw(&spec::container_name(id)).await })
    }

    fn probe_changes<'a>(&'a self, image: &'a str) -> BoxFuture<'a, ChangeProbe> {
        Box::pin(probe::run(self.engine.clone(), &self.paths, image))
    }
}
