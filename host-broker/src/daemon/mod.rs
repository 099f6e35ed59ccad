//! `dormoused`: the broker daemon as a library function, so the binary is a
//! thin shell and tests can drive the same code.
//!
//! It owns the process: flags, the data directory and its token, the listener
//! (TCP, unix socket or systemd's), the systemd protocol and signals. It
//! starts the broker core and serves the API over it; it never decides
//! anything about computers. Stopping the daemon (SIGTERM) stops serving and
//! never stops a desktop.

pub mod listen;
pub mod logging;
pub mod restart;
pub mod screen_gateway;
pub mod serve;
pub mod systemd;
pub mod token;

use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use dormouse_core::command::BrokerHandle;
use dormouse_core::config::{BrokerConfig, ResourceLimits};
use dormouse_core::engine::Backend;
use dormouse_core::metrics::Metrics;
use dormouse_core::owner;
use dormouse_core::paths::Paths;
use dormouse_docker::{Dialect, DockerBackend, DockerConfig, DockerEngine, GuestChannel};
use dormouse_http::{self as api, ApiState, ApiToken};
pub use listen::{Activation, ApiListener, ListenAddr};
pub use logging::LogFormat;
pub use serve::ServeLimits;

/// How long in-flight requests may take to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long the core gets to wind down after the API stopped.
const CORE_GRACE: Duration = Duration::from_secs(5);

/// How long blocking tasks get once `run` has returned.
const RUNTIME_GRACE: Duration = Duration::from_secs(1);

/// Flags of `dormoused`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "dormoused",
    version,
    about = "Dormouse broker: creates, starts, stops and fences desktop containers and serves their status"
)]
pub struct DaemonArgs {
    /// State directory [default: $XDG_STATE_HOME/dormouse or ~/.local/state/dormouse].
    #[arg(long, value_name = "DIR", env = "DORMOUSE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the API listens: IP:PORT (loopback unless --allow-remote) or unix:/PATH.
    /// Ignored when systemd passes a socket.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7480")]
    pub listen: ListenAddr,
    /// Allow a non-loopback --listen address (the API has no TLS).
    #[arg(long)]
    pub allow_remote: bool,
    /// Image for new computers (reference or sha256 ID), resolved to its immutable ID.
    #[arg(long, value_name = "ID", default_value = "dormouse/desktop:latest")]
    pub image: String,
    /// Default idle window, e.g. 8h, 30min, 90s (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "8h", value_parser = parse_idle_timeout)]
    pub idle_timeout: Duration,
    /// Most running desktops created by this broker (1-64); resumes never count.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_instances: u32,
    /// CPUs per desktop (fractional).
    #[arg(long, value_name = "CPUS", default_value = "2", value_parser = parse_cpus)]
    pub cpus: f64,
    /// Memory per desktop, e.g. 4GiB, 2048MiB (swap is limited to the same: no extra swap).
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_memory)]
    pub memory: i64,
    /// Maximum number of processes per desktop.
    #[arg(long, value_name = "N", default_value_t = 2048,
          value_parser = clap::value_parser!(i64).range(64..=4_194_304))]
    pub pids: i64,
    /// Bound of the quiesce through the guest supervisor before an engine stop.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub quiesce_timeout: Duration,
    /// Grace the engine gives a desktop after SIGTERM before it kills it.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub stop_timeout: Duration,
    /// How long a start waits for the guest supervisor before reporting.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub ready_timeout: Duration,
    /// Extra label for every new container, KEY=VALUE (repeatable). The broker
    /// then also watches and reports only containers that carry it.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Deadline for a request's head (request line and headers), and for an
    /// idle kept-alive connection between two requests.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_serve_timeout)]
    pub header_timeout: Duration,
    /// Deadline for a request's body, counted from its head.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_serve_timeout)]
    pub body_timeout: Duration,
    /// Most API connections open at once (WebSockets included); beyond it new
    /// connections wait in the listen backlog.
    #[arg(long, value_name = "N", default_value_t = serve::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_connections: u32,
    /// Longest a desktop runs without a stop, whatever its guest reports
    /// (e.g. 12h); off unless given.
    #[arg(long, value_name = "DURATION", value_parser = parse_idle_timeout)]
    pub max_run: Option<Duration>,
    /// How often every desktop believed running is observed afresh, so a
    /// stop the engine's events never reported is corrected (and counted in
    /// `dormouse_state_divergence_total`), e.g. 30s, 2min (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_idle_timeout)]
    pub resync_interval: Duration,
    /// The container engine's API socket, a path or `unix://` URL: Docker's,
    /// or Podman's Docker-compatible service
    /// (`podman system service unix:///run/podman/podman.sock`) [default:
    /// DOCKER_HOST, else /var/run/docker.sock].
    #[arg(long, value_name = "SOCKET")]
    pub engine_socket: Option<String>,
    /// How the broker reaches each desktop's supervisor: the socket in the
    /// bind-mounted run directory, or `dormouse-supervisor bridge` over the
    /// engine's exec stream.
    #[arg(long, value_enum, default_value_t = GuestChannel::RunDir)]
    pub guest_channel: GuestChannel,
    /// Most bytes of file content a workspace import accepts, e.g. 10GiB.
    #[arg(long, value_name = "SIZE", default_value = "10GiB", value_parser = parse_size)]
    pub import_max_bytes: u64,
    /// Most entries (files and directories) a workspace import accepts.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub import_max_entries: u64,
    /// Largest file a workspace file write accepts, e.g. 1GiB.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub file_max_bytes: u64,
    /// Most bytes each workspace may hold, e.g. 10GiB: a project quota,
    /// enforced where the data directory's filesystem has project quotas
    /// (each status says whether it is).
    #[arg(long, value_name = "SIZE", default_value = "10GiB", value_parser = parse_workspace_bytes)]
    pub workspace_max_bytes: u64,
    /// Most files and directories each workspace may hold (enforced like
    /// `--workspace-max-bytes`).
    #[arg(long, value_name = "N", default_value_t = dormouse_core::quota::DEFAULT_WORKSPACE_INODES,
          value_parser = clap::value_parser!(u64).range(dormouse_core::quota::MIN_WORKSPACE_INODES..))]
    pub workspace_max_inodes: u64,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, e.g. info, debug, info,dormouse::access=warn [default: RUST_LOG, else info].
    #[arg(long, value_name = "FILTER", env = "DORMOUSE_LOG")]
    pub log_level: Option<String>,
    /// Where noVNC is installed (the panel's live screen); without it the
    /// panel shows still screenshots.
    #[arg(long, value_name = "DIR", default_value = dormouse_http::screen_viewer::DEFAULT_NOVNC_DIR)]
    pub novnc_dir: PathBuf,
    /// Where Debian's node-xterm is installed (the panel's terminal).
    #[arg(long, value_name = "DIR", default_value = dormouse_http::xterm::DEFAULT_XTERM_DIR)]
    pub xterm_dir: PathBuf,
    /// The egress mode of a desktop created without a policy: off, allowlist or open.
    #[arg(long, value_name = "MODE", default_value = "off")]
    pub egress_default: dormouse_protocol::egress_policy::EgressMode,
    /// Names egress resolves to fixed addresses before asking the resolver
    /// (/etc/hosts syntax), for split-horizon names.
    #[arg(long, value_name = "FILE")]
    pub egress_hosts: Option<PathBuf>,
    /// How long an egress connection may move no byte either way before it
    /// is closed (e.g. 5min, 30s; at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "5min", value_parser = parse_idle_timeout)]
    pub egress_idle_timeout: Duration,
    /// What activity keeps of an exec's argv: redacted, full or none (the program only).
    #[arg(long, value_name = "MODE", default_value = "redacted")]
    pub activity_argv: dormouse_protocol::activity::argv::ArgvRecord,
    #[command(flatten)]
    pub restart: restart::RestartArgs,
}

impl DaemonArgs {
    /// The data directory: `--data-dir`, or the default.
    pub fn data_dir(&self) -> Result<PathBuf, DaemonError> {
        match &self.data_dir {
            Some(dir) => Ok(dir.clone()),
            None => default_data_dir().ok_or(DaemonError::NoDataDir),
        }
    }

    /// The limits API connections are served under.
    pub fn serve_limits(&self) -> ServeLimits {
        ServeLimits {
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            max_connections: self.max_connections,
            ..ServeLimits::default()
        }
    }

    /// The broker core's configuration.
    pub fn broker_config(&self, data_dir: PathBuf) -> BrokerConfig {
        let mut config = BrokerConfig::new(data_dir);
        config.image = self.image.clone();
        config.idle_timeout = self.idle_timeout;
        config.max_instances = self.max_instances;
        config.limits = ResourceLimits {
            cpus: self.cpus,
            memory_bytes: self.memory,
            pids: self.pids,
        };
        config.quiesce_timeout = self.quiesce_timeout;
        config.stop_timeout = self.stop_timeout;
        config.ready_timeout = self.ready_timeout;
        config.container_labels = self.labels.iter().cloned().collect();
        config.max_run = self.max_run;
        config.resync_interval = self.resync_interval;
        config.probe_changes = true;
        config.workspace.import.max_total_bytes = self.import_max_bytes;
        config.workspace.import.max_entries = self.import_max_entries;
        config.workspace.files.max_write_bytes = self.file_max_bytes;
        config.egress_default = self.egress_default;
        config.activity_argv = self.activity_argv;
        config.workspace_quota = dormouse_core::quota::WorkspaceQuota {
            bytes: self.workspace_max_bytes,
            inodes: self.workspace_max_inodes,
        };
        self.restart.apply(&mut config);
        config
    }
}

/// `$XDG_STATE_HOME/dormouse`, else `~/.local/state/dormouse` (one
/// definition, shared with the clients that look for the token there).
pub use dormouse_protocol::local::default_data_dir;

/// What stops the daemon from starting or makes it exit with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No `--data-dir` and no `XDG_STATE_HOME` or `HOME`.
    #[error("no --data-dir given, and neither XDG_STATE_HOME nor HOME is set")]
    NoDataDir,
    /// The data directory cannot be made private.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The token file.
    #[error(transparent)]
    Token(#[from] token::TokenError),
    /// The listener.
    #[error(transparent)]
    Listen(#[from] listen::ListenError),
    /// The logger.
    #[error("{0}")]
    Logging(String),
    /// The container engine client could not be set up.
    #[error("container engine: {0}")]
    Engine(String),
    /// The egress hosts file.
    #[error("egress: {0}")]
    Egress(String),
    /// The broker core did not start.
    #[error("broker core: {0}")]
    Core(String),
    /// The broker core stopped while the daemon was serving.
    #[error("the broker core stopped unexpectedly")]
    CoreStopped,
    /// The tokio runtime or a signal handler.
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
    /// Serving the API failed.
    #[error("serving the API: {0}")]
    Serve(std::io::Error),
}

/// Runs the daemon until SIGTERM or SIGINT: the whole of `dormoused`.
///
/// Must be called from `main` before any other thread exists, because taking
/// systemd's sockets edits the environment.
pub fn main(args: DaemonArgs) -> Result<(), DaemonError> {
    let level = args
        .log_level
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".to_owned());
    logging::init(args.log_format, &level).map_err(DaemonError::Logging)?;
    let activation = Activation::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("dormoused")
        .build()
        .map_err(DaemonError::Runtime)?;
    let outcome = runtime.block_on(run(args, activation));
    // Blocking work still queued (a file write of the core, say) gets a
    // moment; the process must not hang on it after the API has drained.
    runtime.shutdown_timeout(RUNTIME_GRACE);
    outcome
}

/// The daemon on an existing runtime; `activation` are systemd's sockets.
// Over 100 lines on purpose: the daemon's start-up in order (backend,
// owner, listeners, READY=1, signals, shutdown); each step is a call, and
// apart the order systemd relies on would not be visible in one place.
pub async fn run(args: DaemonArgs, activation: Activation) -> Result<(), DaemonError> {
    let data_dir = args.data_dir()?;
    prepare_data_dir(&data_dir)?;
    let token = ApiToken::new(&token::load_or_create(&data_dir)?);
    let activated = activation.is_active();
    let listener = listen::bind(&args.listen, args.allow_remote, activation)?;
    let endpoint = listener.describe();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        data_dir = %data_dir.display(),
        listen = %endpoint,
        socket_activated = activated,
        image = %args.image,
        idle_timeout = %humantime::format_duration(args.idle_timeout),
        max_instances = args.max_instances,
        header_timeout = %humantime::format_duration(args.header_timeout),
        body_timeout = %humantime::format_duration(args.body_timeout),
        max_connections = args.max_connections,
        "dormoused starting; reconciling with the engine"
    );

    let hosts = match &args.egress_hosts {
        Some(path) => dormouse_egress::resolve::HostsFile::load(path)
            .map_err(|e| DaemonError::Egress(format!("{}: {e}", path.display())))?,
        None => dormouse_egress::resolve::HostsFile::default(),
    };
    let protected: Vec<std::net::SocketAddr> = match &listener {
        ApiListener::Tcp(l) => l.local_addr().into_iter().collect(),
        ApiListener::Unix(..) => Vec::new(),
    };
    let metrics = Arc::new(Metrics::default());
    let (broker, mut core, engine) = spawn_core(
        args.broker_config(data_dir.clone()),
        args.engine_socket.as_deref(),
        args.guest_channel,
        metrics.clone(),
    )
    .await?;

    let shutdown = CancellationToken::new();
    let mut state = ApiState::new(broker, metrics, token.clone());
    state.shutdown = shutdown.clone();
    state.engine = engine;
    let egress = Arc::new(dormouse_egress::Egress::new(
        dormouse_egress::resolve::Resolver::new(hosts),
        dormouse_egress::Caps {
            idle_timeout: args.egress_idle_timeout,
            ..dormouse_egress::Caps::default()
        },
        Some(data_dir.join("egress")),
        protected,
        Arc::new(crate::egress::BrokerHooks::new(
            state.broker.clone(),
            state.metrics.clone(),
        )),
    ));
    state.egress = Some(egress.clone());
    let egress_task = crate::egress::spawn(state.broker.clone(), egress, shutdown.clone());
    screen_gateway::wire(&mut state, &args.novnc_dir, &args.xterm_dir, &shutdown);
    state.mcp = listener.loopback();
    let socket_path = match &listener {
        ApiListener::Unix(_, path) => path.clone(),
        ApiListener::Tcp(_) => None,
    };
    let mut server = tokio::spawn(serve::serve(
        listener,
        api::router(state),
        args.serve_limits(),
        shutdown.clone(),
    ));

    systemd::ready(&format!("serving on {endpoint}"));
    tracing::info!(listen = %endpoint, "dormoused ready");
    if let Some(interval) = systemd::watchdog_interval() {
        tracing::info!(interval = %humantime::format_duration(interval), "systemd watchdog enabled");
        tokio::spawn(systemd::watchdog(interval, shutdown.clone()));
    }

    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Runtime)?;
    let mut hup = signal(SignalKind::hangup()).map_err(DaemonError::Runtime)?;
    let mut server_done = false;
    let outcome = loop {
        tokio::select! {
            _ = term.recv() => break Ok(()),
            _ = int.recv() => break Ok(()),
            _ = hup.recv() => token::reload(&data_dir, &token),
            _ = &mut core => break Err(DaemonError::CoreStopped),
            result = &mut server => {
                server_done = true;
                break match result {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(DaemonError::Serve(e)),
                    Err(e) => Err(DaemonError::Serve(std::io::Error::other(e))),
                };
            }
        }
    };

    // Stop serving; desktops keep running (nothing here asks the core to stop one).
    tracing::info!("dormoused stopping; desktops keep running");
    systemd::stopping();
    shutdown.cancel();
    egress_task.abort();
    if !server_done
        && tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
            .await
            .is_err()
    {
        tracing::warn!("requests still in flight after {SHUTDOWN_GRACE:?}; leaving them");
        server.abort();
    }
    if let Some(path) = socket_path {
        let _ = std::fs::remove_file(path);
    }
    // The router held the last handles; give the core a moment to finish
    // what it was doing so its records are written.
    if !core.is_finished() && tokio::time::timeout(CORE_GRACE, &mut core).await.is_err() {
        tracing::warn!("the broker core did not finish within {CORE_GRACE:?}; leaving it");
        core.abort();
    }
    match &outcome {
        Ok(()) => tracing::info!("dormoused stopped"),
        Err(e) => tracing::error!(error = %e, "dormoused stopped with an error"),
    }
    outcome
}

/// Makes the data directory exist and be private (0700).
pub fn prepare_data_dir(path: &Path) -> Result<(), DaemonError> {
    let err = |source| DaemonError::DataDir {
        path: path.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(err)
}

/// Builds the backend and starts the broker core (reconcile included) over
/// it; returns, beside the core, which engine answered, for `/healthz`.
async fn spawn_core(
    config: BrokerConfig,
    socket: Option<&str>,
    guest_channel: GuestChannel,
    metrics: Arc<Metrics>,
) -> Result<(BrokerHandle, JoinHandle<()>, Option<String>), DaemonError> {
    let (backend, identity) = build_backend(&config, socket, guest_channel).await?;
    let (handle, task) = owner::spawn_backend(config, backend, metrics)
        .await
        .map_err(|e| DaemonError::Core(e.to_string()))?;
    Ok((handle, task, identity))
}

/// The one place a backend is chosen and built. Today that is the
/// Docker-API backend over the engine at `socket`; which engine answered
/// (Docker or Podman) decides its dialect. A second backend is picked here,
/// by a flag.
async fn build_backend(
    config: &BrokerConfig,
    socket: Option<&str>,
    guest_channel: GuestChannel,
) -> Result<(Arc<dyn Backend>, Option<String>), DaemonError> {
    let engine = DockerEngine::connect_to(socket)
        .await
        .map_err(|e| DaemonError::Engine(e.to_string()))?;
    let identity = engine.identity().cloned();
    let dialect = match &identity {
        Some(id) => Dialect::from_engine_name(&id.name),
        None => {
            tracing::warn!("the engine did not answer yet: assuming Docker's dialect");
            Dialect::Docker
        }
    };
    let backend = DockerBackend::new(
        Arc::new(engine),
        DockerConfig {
            dialect,
            guest_channel,
            ..DockerConfig::from_broker(config)
        },
        Paths::new(&config.data_dir),
    );
    Ok((Arc::new(backend), identity.map(|i| i.to_string())))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 90s, 30min, 8h)"))
}

fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?} is shorter than one second"));
    }
    if d > Duration::from_secs(366 * 24 * 3600) {
        return Err(format!("{s:?} is longer than 366 days"));
    }
    Ok(d)
}

fn parse_serve_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("{s:?} is not between 100ms and 1h"));
    }
    Ok(d)
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    let key_ok = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if !key_ok {
        return Err(format!(
            "{key:?} is not a label key (letters, digits, . _ - /)"
        ));
    }
    if key.starts_with("dev.dormouse.") && key != "dev.dormouse.test" {
        return Err(format!("{key:?} is reserved for the broker's own labels"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

fn parse_cpus(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(c) if (0.01..=1024.0).contains(&c) => Ok(c),
        _ => Err(format!(
            "{s:?} is not a number of CPUs between 0.01 and 1024"
        )),
    }
}

/// A size: `10GiB`, `512MiB`, `4G`, `4096` (binary units; a bare number is
/// bytes).
fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a size such as 4GiB or 512MiB");
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// A workspace size limit: a [`parse_size`] of at least
/// [`dormouse_core::quota::MIN_WORKSPACE_BYTES`] (a quota tool reads 0 as "no limit").
fn parse_workspace_bytes(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s)?;
    if bytes < dormouse_core::quota::MIN_WORKSPACE_BYTES {
        return Err(format!("{s:?} is below the smallest workspace limit, 1MiB"));
    }
    Ok(bytes)
}

/// A memory limit: a [`parse_size`] of at least 64 MiB that the engine's
/// signed field holds.
fn parse_memory(s: &str) -> Result<i64, String> {
    let bytes = i64::try_from(parse_size(s)?).map_err(|_| format!("{s:?} is too large"))?;
    if bytes < 64 << 20 {
        return Err(format!("{s:?} is less than 64MiB"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[test]
    fn defaults_match_the_contract() {
        let args = DaemonArgs::try_parse_from(["dormoused"]).expect("defaults parse");
        assert_eq!(args.listen, ListenAddr::default());
        assert_eq!(args.image, "dormouse/desktop:latest");
        assert_eq!(args.idle_timeout, Duration::from_secs(8 * 3600));
        assert_eq!(args.max_instances, 2);
        assert_eq!(args.memory, 4 << 30);
        assert_eq!(args.log_format, LogFormat::Text);
        let config = args.broker_config(PathBuf::from("/nonexistent"));
        assert_eq!(
            config.workspace_quota,
            dormouse_core::quota::WorkspaceQuota::default()
        );
        assert_eq!(config.resync_interval, Duration::from_secs(30));
        assert!(config.probe_changes, "the daemon checks the event stream");
    }

    #[test]
    fn out_of_range_flags_are_usage_errors() {
        for bad in [
            &["dormoused", "--idle-timeout", "500ms"][..],
            &["dormoused", "--idle-timeout", "soon"],
            &["dormoused", "--max-instances", "0"],
            &["dormoused", "--max-instances", "65"],
            &["dormoused", "--listen", "localhost"],
            &["dormoused", "--memory", "1MiB"],
            &["dormoused", "--cpus", "0"],
            &["dormoused", "--log-format", "xml"],
            &["dormoused", "--workspace-max-bytes", "0"],
            &["dormoused", "--workspace-max-bytes", "1KiB"],
            &["dormoused", "--workspace-max-inodes", "0"],
            &["dormoused", "--workspace-max-inodes", "lots"],
            &["dormoused", "--resync-interval", "500ms"],
        ] {
            let err = DaemonArgs::try_parse_from(bad).expect_err("refused");
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
        let ok = DaemonArgs::try_parse_from([
            "dormoused",
            "--idle-timeout",
            "1s",
            "--max-instances",
            "64",
        ])
        .expect("edges are allowed");
        assert_eq!(ok.idle_timeout, Duration::from_secs(1));
        let quota = DaemonArgs::try_parse_from([
            "dormoused",
            "--workspace-max-bytes",
            "2GiB",
            "--workspace-max-inodes",
            "5000",
        ])
        .expect("workspace limits parse")
        .broker_config(PathBuf::from("/nonexistent"))
        .workspace_quota;
        assert_eq!((quota.bytes, quota.inodes), (2 << 30, 5000));
    }

    #[test]
    fn labels_parse() {
        let args = DaemonArgs::try_parse_from([
            "dormoused",
            "--label",
            "dev.dormouse.test=1",
            "--label",
            "team=a=b",
        ])
        .expect("labels");
        let config = args.broker_config(PathBuf::from("/x"));
        assert_eq!(
            config
                .container_labels
                .get("dev.dormouse.test")
                .map(String::as_str),
            Some("1")
        );
        assert_eq!(
            config.container_labels.get("team").map(String::as_str),
            Some("a=b")
        );
        for bad in ["novalue", "=x", "dev.dormouse.computer=1", "a b=c"] {
            assert!(
                DaemonArgs::try_parse_from(["dormoused", "--label", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn memory_sizes_parse() {
        assert_eq!(parse_memory("512MiB"), Ok(512 << 20));
        assert_eq!(parse_memory("2G"), Ok(2 << 30));
        assert!(parse_memory("99999999999999TiB").is_err());
    }

    #[test]
    fn data_dir_is_made_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("a/b");
        prepare_data_dir(&data).expect("prepare");
        let mode = std::fs::metadata(&data).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        prepare_data_dir(&data).expect("prepare again");
        let mode = std::fs::metadata(&data).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
