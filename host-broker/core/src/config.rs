//! The broker's configuration, filled by `dormoused`'s flags.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How often desktops believed running are observed afresh by default.
pub const DEFAULT_RESYNC_INTERVAL: Duration = Duration::from_secs(30);

/// Which desktops the broker starts again after its start-up reconcile
/// (`dormoused --resume-after-restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResumeAfterRestart {
    /// Those found stopped that were wanted running: they went down with
    /// the host (or the engine) while no broker watched.
    #[default]
    Running,
    /// None: every desktop stays as the reconcile found it.
    None,
}

/// Resource limits every desktop container gets.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceLimits {
    /// CPUs (fractional), e.g. 2.0.
    pub cpus: f64,
    /// Memory limit in bytes; swap is limited to the same (no extra swap).
    pub memory_bytes: i64,
    /// Maximum number of processes.
    pub pids: i64,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        Self {
            cpus: 2.0,
            memory_bytes: 4 * 1024 * 1024 * 1024,
            pids: 2048,
        }
    }
}

/// Everything the broker core needs.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// State directory: `computers/`, `stops/`, `token`.
    pub data_dir: PathBuf,
    /// Image reference or ID for new computers; resolved to an immutable ID.
    pub image: String,
    /// Default idle window (at least one second).
    pub idle_timeout: Duration,
    /// Most running desktops created by this broker.
    pub max_instances: u32,
    /// Limits for new containers.
    pub limits: ResourceLimits,
    /// Bound for `quiesce` through the supervisor before an engine stop.
    pub quiesce_timeout: Duration,
    /// Grace the engine gives the container after SIGTERM.
    pub stop_timeout: Duration,
    /// How long `start` waits for the guest socket before reporting.
    pub ready_timeout: Duration,
    /// A hard limit on continuous running: a desktop up this long is
    /// stopped (reason `idle`) whatever its guest reports and whoever touches
    /// it. `None` (the default): no limit.
    pub max_run: Option<Duration>,
    /// How often every desktop believed running (or with an unknown state)
    /// is observed afresh, so a change the engine's events never told is
    /// corrected within this long (`dormouse_state_divergence_total`).
    pub resync_interval: Duration,
    /// Whether the core checks once at start-up, with a probe container,
    /// that the engine's event stream delivers (`dormoused` does; tests of
    /// the core over a recording engine do not want the probe's calls).
    pub probe_changes: bool,
    /// Extra labels every container gets (e.g. `dev.dormouse.test=1`); they
    /// also narrow which containers this broker watches and reports as its own.
    pub container_labels: BTreeMap<String, String>,
    /// Limits of the workspace routes (file sizes, imports, disk walks).
    pub workspace: WorkspaceLimits,
    /// The size and inode limit each workspace gets where the data
    /// directory's filesystem enforces project quotas.
    pub workspace_quota: crate::quota::WorkspaceQuota,
    /// The egress mode of a desktop created without a policy (and of a
    /// record older than egress): `dormoused --egress-default`.
    pub egress_default: dormouse_protocol::egress_policy::EgressMode,
    /// Which desktops are started again after the start-up reconcile.
    pub resume_after_restart: ResumeAfterRestart,
    /// How many of those start (and boot to ready) at once (at least 1).
    pub resume_concurrency: usize,
    /// What an exec's or a terminal's activity entry keeps of its argv:
    /// `dormoused --activity-argv`.
    pub activity_argv: dormouse_protocol::activity::argv::ArgvRecord,
}

/// Limits of the workspace routes.
#[derive(Debug, Clone)]
pub struct WorkspaceLimits {
    /// File reads, writes, listings and deletes.
    pub files: crate::workspace::FilesConfig,
    /// Imports of a workspace from a tar.
    pub import: crate::workspace::ImportLimits,
    /// How long a disk-usage walk may take before it answers with lower bounds.
    pub disk_deadline: Duration,
}

impl Default for WorkspaceLimits {
    fn default() -> Self {
        Self {
            files: crate::workspace::FilesConfig::default(),
            import: crate::workspace::ImportLimits::default(),
            disk_deadline: crate::workspace::DEFAULT_DISK_DEADLINE,
        }
    }
}

impl BrokerConfig {
    /// Defaults around a data directory.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            image: "dormouse/desktop:latest".into(),
            idle_timeout: Duration::from_secs(8 * 3600),
            max_instances: 2,
            limits: ResourceLimits::default(),
            quiesce_timeout: Duration::from_secs(5),
            stop_timeout: Duration::from_secs(10),
            ready_timeout: Duration::from_secs(60),
            max_run: None,
            resync_interval: DEFAULT_RESYNC_INTERVAL,
            probe_changes: false,
            container_labels: BTreeMap::new(),
            workspace: WorkspaceLimits::default(),
            workspace_quota: crate::quota::WorkspaceQuota::default(),
            egress_default: dormouse_protocol::egress_policy::EgressMode::Off,
            resume_after_restart: ResumeAfterRestart::Running,
            resume_concurrency: 2,
            activity_argv: dormouse_protocol::activity::argv::ArgvRecord::Redacted,
        }
    }
}
