//! The supervisor's one configuration: every system path and tunable.
//!
//! Production reads `/etc/dormouse/supervisor.toml` (if present), then
//! `DORMOUSE_*` environment variables, then flags. Unit tests build a
//! [`Config`] whose paths point into a temp directory and run the production
//! code against fake `/proc` files. No other module may hard-code a system path.

use std::path::PathBuf;

use serde::Deserialize;

/// Everything the supervisor needs to know about the system it runs on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// procfs root (`/proc`).
    pub proc_root: PathBuf,
    /// The desktop user's home (`/home/desk`).
    pub home: PathBuf,
    /// The persistent workspace mount (`/home/desk/workspace`).
    pub workspace: PathBuf,
    /// `/tmp`, where X keeps `.X<N>-lock` and `.X11-unix/`.
    pub tmp_dir: PathBuf,
    /// The run directory shared with the host (`/run/dormouse`).
    pub run_dir: PathBuf,
    /// Container-local state that survives `docker stop`/`start` of this
    /// container but not a new container (`/var/lib/dormouse-supervisor`).
    pub state_dir: PathBuf,
    /// uid of the desktop user.
    pub uid: u32,
    /// gid of the desktop user.
    pub gid: u32,
    /// X display number (`:1`).
    pub display: u32,
    /// Screen width in pixels.
    pub width: u32,
    /// Screen height in pixels.
    pub height: u32,
    /// Screen depth in bits.
    pub depth: u32,
    /// Loopback TCP port of the VNC server.
    pub vnc_port: u16,
    /// Browser started after the desktop is up: `chromium`, `firefox` or none.
    pub browser: Option<String>,
    /// Free space the workspace must have for the probe to pass, in MiB.
    pub workspace_min_free_mib: u64,
    /// CPU percent (of one core) above which a uid-1000 process counts as busy.
    pub busy_cpu_percent: f64,
    /// Upper bound for a graceful stop, in milliseconds.
    pub stop_timeout_ms: u64,
    /// Most guest-socket connections served at once; more are closed at once.
    pub socket_max_connections: usize,
    /// How long a connection may stay silent between requests (not `watch`), ms.
    pub socket_idle_timeout_ms: u64,
    /// Bound for the rest of a frame once its first byte arrived, and for
    /// every write to a client, ms.
    pub socket_io_timeout_ms: u64,
    /// Largest quiesce bound a client may ask for, ms.
    pub quiesce_max_ms: u64,
    /// How long `activity` samples the CPU use of uid-1000 processes, ms.
    pub busy_sample_ms: u64,
    /// Bound for each step of the self-probe (X, VNC) and for a screenshot, ms.
    pub probe_timeout_ms: u64,
    /// Re-probe a probed desktop this often even without service changes, ms
    /// (0: only when the service set changes).
    pub reprobe_interval_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            proc_root: "/proc".into(),
            home: "/home/desk".into(),
            workspace: "/home/desk/workspace".into(),
            tmp_dir: "/tmp".into(),
            run_dir: "/run/dormouse".into(),
            state_dir: "/var/lib/dormouse-supervisor".into(),
            uid: 1000,
            gid: 1000,
            display: 1,
            width: 1280,
            height: 800,
            depth: 24,
            vnc_port: 5900,
            browser: None,
            workspace_min_free_mib: 64,
            busy_cpu_percent: 20.0,
            stop_timeout_ms: 5000,
            socket_max_connections: 64,
            socket_idle_timeout_ms: 10_000,
            socket_io_timeout_ms: 5_000,
            quiesce_max_ms: 60_000,
            busy_sample_ms: 200,
            probe_timeout_ms: 5_000,
            reprobe_interval_ms: 60_000,
        }
    }
}

impl Config {
    /// The supervisor socket.
    pub fn socket_path(&self) -> PathBuf {
        self.run_dir.join(dormouse_protocol::SOCKET_FILE_NAME)
    }

    /// `DISPLAY` value, e.g. `:1`.
    pub fn display_name(&self) -> String {
        format!(":{}", self.display)
    }

    /// Root of the browser profiles inside the workspace.
    pub fn profiles_root(&self) -> PathBuf {
        self.workspace.join(".browser-profiles")
    }

    /// `/tmp/.X<N>-lock`.
    pub fn x_lock_path(&self) -> PathBuf {
        self.tmp_dir.join(format!(".X{}-lock", self.display))
    }

    /// `/tmp/.X11-unix/X<N>`.
    pub fn x_socket_path(&self) -> PathBuf {
        self.tmp_dir
            .join(".X11-unix")
            .join(format!("X{}", self.display))
    }
}
