//! [`Engine`](super::container_engine::Engine) over the Docker Engine API with bollard.
//!
//! Connects to the socket it is given (`--engine-socket`), else with
//! `DOCKER_HOST` honoured (or the default unix socket), and
//! negotiates the API version down to what the engine speaks: Docker 20.10
//! answers API 1.41 and refuses newer clients. When the engine is not there
//! yet, the connection is still made and negotiation is retried on the next
//! call, so the broker can serve (and answer 503) without an engine.
//!
//! This module translates; it never decides anything about computers.

use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, InspectContainerOptions,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions, StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::Mutex;

use super::container_engine::{
    ContainerInfo, ContainerSpec, ContainerSummary, Engine, EngineError, EngineEvent, EngineFuture,
    ImageInfo, Process,
};

mod translate;

use translate::{btree, container_info, create_body, event, label_filters, map_err, summary};

/// Bound on connecting to the engine and negotiating the API version.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which engine answers, and its version, as its version report says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineIdentity {
    /// `Docker Engine`, `Podman Engine`, …
    pub name: String,
    /// The engine's own version, e.g. `20.10.24`, `4.3.1`.
    pub version: String,
    /// The API version both sides speak, e.g. `1.41`.
    pub api_version: String,
}

impl std::fmt::Display for EngineIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} (API {})",
            self.name, self.version, self.api_version
        )
    }
}

/// The Docker engine (or Podman's Docker-compatible service), through bollard.
#[derive(Debug, Clone)]
pub struct DockerEngine {
    /// The negotiated client, made on first successful use. bollard checks
    /// that a unix socket exists when the client is made, so an engine that
    /// is not up yet must not stop the broker from starting.
    client: Arc<Mutex<Option<Docker>>>,
    /// The socket given on the command line; `None`: `DOCKER_HOST` or the
    /// default.
    socket: Option<String>,
    /// Who answered the first successful connection.
    identity: Arc<std::sync::OnceLock<EngineIdentity>>,
}

impl DockerEngine {
    /// Connects to the engine named by `DOCKER_HOST` (default: the local
    /// unix socket); see [`Self::connect_to`].
    pub async fn connect() -> Result<DockerEngine, EngineError> {
        Self::connect_to(None).await
    }

    /// Connects to the engine at `socket` (a path or `unix://` URL), else to
    /// the one named by `DOCKER_HOST` (default: the local unix socket), and
    /// negotiates the API version.
    ///
    /// An engine that is not reachable yet is not an error here (the broker
    /// must keep serving without one; every verb retries the connection); a
    /// malformed `DOCKER_HOST` is.
    pub async fn connect_to(socket: Option<&str>) -> Result<DockerEngine, EngineError> {
        let engine = DockerEngine {
            client: Arc::new(Mutex::new(None)),
            socket: socket.map(str::to_owned),
            identity: Arc::new(std::sync::OnceLock::new()),
        };
        match engine.client().await {
            Ok(_) => Ok(engine),
            Err(EngineError::Unavailable(e)) => {
                tracing::warn!(error = %e, "container engine not reachable yet; will retry on use");
                Ok(engine)
            }
            Err(e) => Err(e),
        }
    }

    /// The client, made and version-negotiated once per process.
    async fn client(&self) -> Result<Docker, EngineError> {
        let mut slot = self.client.lock().await;
        if let Some(docker) = slot.as_ref() {
            return Ok(docker.clone());
        }
        let docker = match &self.socket {
            Some(socket) => Docker::connect_with_socket(
                socket,
                CONNECT_TIMEOUT.as_secs(),
                bollard::API_DEFAULT_VERSION,
            ),
            None => Docker::connect_with_defaults(),
        }
        .map_err(map_err)?;
        let docker = tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version())
            .await
            .map_err(|_| EngineError::Unavailable("no answer from the engine".into()))?
            .map_err(map_err)?;
        tracing::debug!(api = %docker.client_version(), "engine API version negotiated");
        if let Some(identity) = identify(&docker).await {
            tracing::info!(engine = %identity, "container engine");
            let _ = self.identity.set(identity);
        }
        report_storage_driver(&docker).await;
        *slot = Some(docker.clone());
        Ok(docker)
    }
}

impl DockerEngine {
    /// Who answered, once a connection succeeded.
    pub fn identity(&self) -> Option<&EngineIdentity> {
        self.identity.get()
    }
}

/// The engine's name and version from its version report: Podman lists a
/// component `Podman Engine`, Docker one called `Engine`.
async fn identify(docker: &Docker) -> Option<EngineIdentity> {
    let version = tokio::time::timeout(CONNECT_TIMEOUT, docker.version())
        .await
        .ok()?
        .ok()?;
    let components = version.components.unwrap_or_default();
    let name = if components
        .iter()
        .any(|c| c.name.to_ascii_lowercase().contains("podman"))
    {
        "Podman Engine"
    } else {
        "Docker Engine"
    };
    Some(EngineIdentity {
        name: name.to_owned(),
        version: version.version.unwrap_or_default(),
        api_version: docker.client_version().to_string(),
    })
}

/// Logs the engine's storage driver once, warning about the ones that make
/// every start slow: a desktop's start touches a few thousand files, and
/// `fuse-overlayfs` serves each operation from one userspace thread per
/// container (about 3x the guest's start time next to `overlay2` on the same
/// host; see docs/operations.md), while `vfs` copies whole layers.
async fn report_storage_driver(docker: &Docker) {
    let info = match tokio::time::timeout(CONNECT_TIMEOUT, docker.info()).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => return tracing::debug!(error = %e, "engine info unavailable"),
        Err(_) => return tracing::debug!("engine info: no answer"),
    };
    let driver = info.driver.unwrap_or_default();
    let version = info.server_version.unwrap_or_default();
    if matches!(driver.as_str(), "fuse-overlayfs" | "vfs") {
        tracing::warn!(
            storage_driver = %driver,
            engine = %version,
            "the engine's storage driver slows every desktop start; overlay2 is recommended"
        );
    } else {
        tracing::info!(storage_driver = %driver, engine = %version, "container engine");
    }
}

/// Joins an exec's attached streams to the far end of a socket pair until
/// either side ends: stdin from the socket, stdout to it; stderr is logged
/// (shortened), never relayed. Dropping everything ends the exec's stdin,
/// which ends a relaying process such as `dormouse-supervisor bridge`.
async fn pump_exec(
    far: tokio::net::UnixStream,
    mut output: std::pin::Pin<
        Box<
            dyn futures_util::Stream<Item = Result<bollard::container::LogOutput, BollardError>>
                + Send,
        >,
    >,
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    container: String,
) {
    use tokio::io::AsyncWriteExt as _;
    let (mut from_far, mut to_far) = far.into_split();
    let upstream = async {
        let _ = tokio::io::copy(&mut from_far, &mut input).await;
        let _ = input.shutdown().await;
    };
    let downstream = async {
        while let Some(item) = output.next().await {
            match item {
                Ok(bollard::container::LogOutput::StdOut { message }) => {
                    if to_far.write_all(&message).await.is_err() {
                        break;
                    }
                }
                Ok(bollard::container::LogOutput::StdErr { message }) => {
                    let text = String::from_utf8_lossy(&message);
                    let text: String = text.chars().take(300).collect();
                    tracing::debug!(%container, stderr = %dormouse_core::guest::sanitize(&text), "exec stream");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%container, error = %e, "exec stream ended");
                    break;
                }
            }
        }
        let _ = to_far.shutdown().await;
    };
    // Either direction ending ends the relay: a guest that closes its side
    // must not leave the exec (or this task) behind.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

impl Engine for DockerEngine {
    fn image<'a>(&'a self, reference: &'a str) -> EngineFuture<'a, Option<ImageInfo>> {
        Box::pin(async move {
            let docker = self.client().await?;
            match docker.inspect_image(reference).await {
                Ok(image) => {
                    let config = image.config.unwrap_or_default();
                    Ok(Some(ImageInfo {
                        id: image.id.unwrap_or_default(),
                        process: Process {
                            entrypoint: config.entrypoint.unwrap_or_default(),
                            cmd: config.cmd.unwrap_or_default(),
                            user: config.user.unwrap_or_default(),
                        },
                        labels: btree(config.labels),
                    }))
                }
                Err(e) => match map_err(e) {
                    EngineError::NotFound(_) => Ok(None),
                    other => Err(other),
                },
            }
        })
    }

    fn create<'a>(&'a self, spec: &'a ContainerSpec) -> EngineFuture<'a, String> {
        Box::pin(async move {
            let docker = self.client().await?;
            let options = CreateContainerOptionsBuilder::default()
                .name(&spec.name)
                .build();
            let created = docker
                .create_container(Some(options), create_body(spec))
                .await
                .map_err(map_err)?;
            for warning in &created.warnings {
                tracing::warn!(container = %spec.name, %warning, "engine warning on create");
            }
            Ok(created.id)
        })
    }

    fn start<'a>(&'a self, name: &'a str) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            let docker = self.client().await?;
            docker
                .start_container(name, None::<StartContainerOptions>)
                .await
                .map_err(map_err)
        })
    }

    fn stop<'a>(&'a self, name: &'a str, timeout: Duration) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            let docker = self.client().await?;
            let t = i32::try_from(timeout.as_secs().max(1)).unwrap_or(i32::MAX);
            let options = StopContainerOptionsBuilder::default().t(t).build();
            docker
                .stop_container(name, Some(options))
                .await
                .map_err(map_err)
        })
    }

    fn kill<'a>(&'a self, name: &'a str, signal: &'a str) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            let docker = self.client().await?;
            let options = KillContainerOptionsBuilder::default()
                .signal(signal)
                .build();
            docker
                .kill_container(name, Some(options))
                .await
                .map_err(map_err)
        })
    }

    fn inspect<'a>(&'a self, name: &'a str) -> EngineFuture<'a, Option<ContainerInfo>> {
        Box::pin(async move {
            let docker = self.client().await?;
            match docker
                .inspect_container(name, None::<InspectContainerOptions>)
                .await
            {
                Ok(raw) => Ok(Some(container_info(raw))),
                Err(e) => match map_err(e) {
                    EngineError::NotFound(_) => Ok(None),
                    other => Err(other),
                },
            }
        })
    }

    fn size_rw<'a>(&'a self, name: &'a str) -> EngineFuture<'a, Option<u64>> {
        Box::pin(async move {
            let docker = self.client().await?;
            let options = InspectContainerOptions { size: true };
            match docker.inspect_container(name, Some(options)).await {
                Ok(raw) => Ok(raw.size_rw.and_then(|n| u64::try_from(n).ok())),
                Err(e) => match map_err(e) {
                    EngineError::NotFound(_) => Ok(None),
                    other => Err(other),
                },
            }
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> EngineFuture<'a, ()> {
        Box::pin(async move {
            let docker = self.client().await?;
            let options = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            docker
                .remove_container(name, Some(options))
                .await
                .map_err(map_err)
        })
    }

    fn list<'a>(&'a self, labels: &'a [String]) -> EngineFuture<'a, Vec<ContainerSummary>> {
        Box::pin(async move {
            let docker = self.client().await?;
            let options = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&label_filters(labels))
                .build();
            let raw = docker
                .list_containers(Some(options))
                .await
                .map_err(map_err)?;
            Ok(raw.into_iter().map(summary).collect())
        })
    }

    fn exec_stream<'a>(
        &'a self,
        name: &'a str,
        argv: &'a [&'a str],
    ) -> EngineFuture<'a, tokio::net::UnixStream> {
        Box::pin(async move {
            let docker = self.client().await?;
            let exec = docker
                .create_exec(
                    name,
                    bollard::exec::CreateExecOptions {
                        attach_stdin: Some(true),
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        tty: Some(false),
                        cmd: Some(argv.to_vec()),
                        user: Some("0"),
                        ..Default::default()
                    },
                )
                .await
                .map_err(map_err)?;
            let started = docker
                .start_exec(&exec.id, None::<bollard::exec::StartExecOptions>)
                .await
                .map_err(map_err)?;
            let bollard::exec::StartExecResults::Attached { output, input } = started else {
                return Err(EngineError::Failed("exec started detached".into()));
            };
            let (near, far) = tokio::net::UnixStream::pair()
                .map_err(|e| EngineError::Failed(format!("socket pair: {e}")))?;
            tokio::spawn(pump_exec(far, output, input, name.to_owned()));
            Ok(near)
        })
    }

    fn events(&self, labels: &[String]) -> BoxStream<'static, Result<EngineEvent, EngineError>> {
        let engine = self.clone();
        let mut filters = label_filters(labels);
        filters.insert("type".into(), vec!["container".into()]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        let stream = futures_util::stream::once(async move {
            let docker = engine.client().await?;
            Ok::<_, EngineError>(docker.events(Some(options)))
        });
        stream
            .flat_map(|connected| match connected {
                Ok(events) => events
                    .filter_map(|item| async move {
                        match item {
                            Ok(raw) => event(raw).map(Ok),
                            Err(e) => Some(Err(map_err(e))),
                        }
                    })
                    .boxed(),
                Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }
}
