//! Messages on the guest socket (`/run/dormouse/supervisor.sock`).
//!
//! The broker (or any host tool) connects, sends one [`Request`] per frame and
//! reads one [`Response`] per request, in order. `watch` turns the connection
//! into a stream: the supervisor then pushes a [`Response::Status`] on every
//! change until the client hangs up.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::health::HealthReport;

/// What identifies one start of one container.
///
/// It changes on every `docker start` (also after a kill, also when a new
/// container reuses the same home, and under `--pid=host`) and stays the same
/// while one container runs, however often the supervisor re-prepares.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContainerStartIdentity {
    /// `/proc/sys/kernel/random/boot_id`: changes on host reboot.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/pid`: a new one for every container start.
    pub pid_ns_inode: u64,
    /// Field 22 of `/proc/1/stat` (clock ticks after boot): PID 1's start time.
    pub pid1_start_time: u64,
}

impl ContainerStartIdentity {
    /// A compact, stable string form, e.g. for files and logs.
    pub fn fingerprint(&self) -> String {
        format!(
            "{}:{}:{}",
            self.boot_id, self.pid_ns_inode, self.pid1_start_time
        )
    }
}

/// The answer to `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`crate::PROTOCOL_VERSION`] of the supervisor.
    pub protocol_version: u32,
    /// The supervisor's crate version.
    pub supervisor_version: String,
    /// This container start.
    pub identity: ContainerStartIdentity,
}

/// Where the desktop is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Identity, home, profile links and stale locks are being prepared.
    Preparing,
    /// Services are starting or the self-probe has not passed yet.
    Starting,
    /// The self-probe passed after this container start.
    Ready,
    /// Usable only in part, or a service is crash-looping; `problem` says why.
    Degraded,
    /// A graceful stop is under way.
    Stopping,
}

/// Run state of one supervised service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceRunState {
    /// Not started yet (waiting for the services before it).
    Pending,
    /// Spawned, not yet ready.
    Starting,
    /// Ready by its readiness event.
    Running,
    /// Exited; waiting out the restart backoff.
    Backoff,
    /// Gave up after repeated failures.
    Failed,
    /// Stopped on purpose.
    Stopped,
}

/// One supervised service, e.g. `xvfb`, `openbox`, `vnc`, `browser`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceState {
    /// Service name.
    pub name: String,
    /// Run state.
    pub state: ServiceRunState,
    /// Process id inside the guest while it runs.
    pub pid: Option<u32>,
    /// How often it was restarted after this container start.
    pub restarts: u32,
    /// How it last ended, e.g. `exit 1`, `signal 9`, with the classified cause.
    pub last_exit: Option<String>,
    /// Since when it has been ready.
    pub ready_since: Option<DateTime<Utc>>,
}

/// The answer to `status`, and every item of a `watch` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStatus {
    /// Where the desktop is in its life.
    pub phase: Phase,
    /// `true` only once the self-probe passed after this container start.
    pub ready: bool,
    /// When it became ready.
    pub ready_since: Option<DateTime<Utc>>,
    /// This container start.
    pub identity: ContainerStartIdentity,
    /// Supervised services, in start order.
    pub services: Vec<ServiceState>,
    /// The latest self-probe report, if one ran.
    pub health: Option<HealthReport>,
    /// Why the desktop is degraded or not ready, for people.
    pub problem: Option<String>,
}

/// One uid-1000 process using CPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BusyProcess {
    /// Process id inside the guest.
    pub pid: u32,
    /// Command name (`/proc/<pid>/comm`).
    pub comm: String,
    /// CPU use over the sampling interval, percent of one core.
    pub cpu_percent: f64,
}

/// The answer to `activity`: what the broker's idle timer counts as use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activity {
    /// Milliseconds since the last X input event, when X answers.
    pub input_idle_ms: Option<u64>,
    /// Whether any uid-1000 process is above the CPU threshold.
    pub busy: bool,
    /// The processes that made it busy.
    pub busy_processes: Vec<BusyProcess>,
}

/// The answer to `quiesce`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quiesced {
    /// Services that were closed cleanly (browsers first).
    pub closed: Vec<String>,
    /// `false` when the deadline passed before everything closed.
    pub complete: bool,
    /// How long it took.
    pub elapsed_ms: u64,
}

/// A request from a host-side client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Versions and container-start identity.
    Hello,
    /// Phase, services, health report.
    Status,
    /// Push the status now and on every change until the client hangs up.
    Watch,
    /// A PNG of the whole screen, as the frame's binary payload.
    Screenshot,
    /// Close browsers cleanly so their profiles flush; answer when done.
    Quiesce {
        /// Upper bound the supervisor keeps to.
        timeout_ms: u64,
    },
    /// Input idle time and busy processes.
    Activity,
}

impl Request {
    /// The `kind` tags this version understands.
    pub const KINDS: &'static [&'static str] = &[
        "hello",
        "status",
        "watch",
        "screenshot",
        "quiesce",
        "activity",
    ];
}

/// A response from the supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello(Hello),
    /// Answer to [`Request::Status`] and each item of [`Request::Watch`].
    Status(GuestStatus),
    /// Answer to [`Request::Screenshot`]; the PNG is the frame's payload.
    Screenshot {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// Answer to [`Request::Quiesce`].
    Quiesced(Quiesced),
    /// Answer to [`Request::Activity`].
    Activity(Activity),
    /// The request could not be served.
    Error {
        /// Stable code, e.g. `bad_frame`, `not_ready`.
        code: String,
        /// For people.
        message: String,
    },
}

impl Response {
    /// The `kind` tags this version understands.
    pub const KINDS: &'static [&'static str] = &[
        "hello",
        "status",
        "screenshot",
        "quiesced",
        "activity",
        "error",
    ];

    /// An error response.
    pub fn error(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Error {
            code: code.into(),
            message: message.into(),
        }
    }
}
