//! `dormouse-supervisor`: PID 1 of a Dormouse desktop container.
//!
//! It prepares the home (profile links, stale locks once per container
//! start), runs Xvfb → window manager → VNC (→ browser) as uid 1000 without
//! fixed sleeps, probes its own readiness, stops gracefully, and reports over
//! `/run/dormouse/supervisor.sock`. The binary in `main.rs` is a thin shell.

pub mod activity;
pub mod config;
pub mod config_file;
pub mod identity;
pub mod init;
pub mod prepare;
pub mod probe;
pub mod procfs;
pub mod run;
pub mod screenshot;
pub mod services;
pub mod socket;
pub mod state;
pub mod stop;
pub mod x_client;

pub use config::Config;
pub use state::{QuiesceRequest, StatusCell};

/// Linux capabilities the supervisor needs, and all it needs: a container
/// runs it with `--cap-drop ALL` plus exactly these (and
/// `--security-opt no-new-privileges`). Desktop processes drop all of them
/// with their switch to uid 1000.
///
/// - `CHOWN`: the run directory to root; the workspace root, migrated
///   profiles and new directories to uid 1000.
/// - `DAC_OVERRIDE`: reading and writing the desktop user's files (profiles,
///   the workspace) as root.
/// - `SETUID`, `SETGID`: starting services as uid/gid 1000 (and dropping
///   supplementary groups).
/// - `KILL`: signalling the desktop user's processes on quiesce and stop.
///
/// Not `FOWNER`: modes are set before ownership is given away, and the
/// sticky directories it works in (`/tmp`, `/tmp/.X11-unix`) are root's.
pub const REQUIRED_CAPABILITIES: &[&str] = &["CHOWN", "DAC_OVERRIDE", "SETUID", "SETGID", "KILL"];
