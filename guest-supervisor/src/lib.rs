//! `dormouse-supervisor`: PID 1 of a Dormouse desktop container.
//!
//! It prepares the home (profile links, stale locks once per container
//! start), runs Xvfb → window manager → VNC (→ browser) as uid 1000 without
//! fixed sleeps, probes its own readiness, stops gracefully, and reports over
//! `/run/dormouse/supervisor.sock`. The binary in `main.rs` is a thin shell.

pub mod activity;
pub mod bridge;
pub mod clipboard;
pub mod config;
pub mod config_file;
pub mod egress;
pub mod exec;
pub mod exec_socket;
pub mod identity;
pub mod init;
pub mod input;
pub mod locks;
pub mod nofollow;
pub mod pidfd;
pub mod prepare;
pub mod probe;
pub mod procfs;
pub mod reopen;
pub mod screenshot;
pub mod services;
pub mod socket;
pub mod status;
pub mod stop;
pub mod supervise;
pub mod vnc_socket;
pub mod x_client;

pub use config::Config;

/// Milliseconds of `d` as logs and the protocol carry them (saturating: no
/// duration the supervisor measures comes near `u64::MAX` ms).
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
pub use status::{QuiesceRequest, StatusCell};

/// The capabilities the supervisor needs (see [`dormouse_protocol::GUEST_CAPABILITIES`]).
pub use dormouse_protocol::GUEST_CAPABILITIES as REQUIRED_CAPABILITIES;
