//! `dormouse-supervisor`: PID 1 of a Dormouse desktop container.
//!
//! It prepares the home (profile links, stale locks once per container
//! start), runs Xvfb → window manager → VNC (→ browser) as uid 1000 without
//! fixed sleeps, probes its own readiness, stops gracefully, and reports over
//! `/run/dormouse/supervisor.sock`. The binary in `main.rs` is a thin shell.

pub mod activity;
pub mod config;
pub mod probe;
pub mod screenshot;
pub mod socket;
pub mod state;
pub mod x_client;

pub use config::Config;
pub use state::{QuiesceRequest, StatusCell};
