//! `dormouse-broker`: the host side of Dormouse, as the daemon `dormoused`
//! runs it. It only creates, starts, stops, removes and fences desktop
//! containers, and serves their status and their workspaces.
//!
//! The work is in three crates, each of which cargo keeps from reaching back:
//! - `dormouse-core`: the one owner task, the lifecycle verbs, the policies,
//!   the records, the guest client and relay, over the engine-neutral
//!   `Backend` trait; it links no engine client and no HTTP server;
//! - `dormouse-docker`: the `Backend` over a Docker-API engine (bollard);
//! - `dormouse-http`: the API, the screen gateway and the panel (axum); the
//!   only place an HTTP status is chosen.
//!
//! This crate is the [`daemon`]: it reads the flags, picks and builds the
//! backend, starts the core and serves. The core's, the backend's and the
//! HTTP side's modules are re-exported under the names they had before the
//! split (`engine`, `owner`, `api`, …) for the integration tests and tools.

#![forbid(unsafe_code)]

pub mod daemon;

pub use dormouse_core::{
    command, config, egress, engine, error, guest, idle, lifecycle, metrics, owner, paths, quota,
    reconcile, relay, secret, store, workspace, BrokerConfig, BrokerError, BrokerHandle, Command,
};
pub use dormouse_docker as docker;
pub use dormouse_http as api;
pub use dormouse_http::screen;
