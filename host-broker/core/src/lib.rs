//! `dormouse-core`: the broker's core. One owner task holds every
//! computer's state and is the only code that drives the backend or writes
//! the broker's records; the lifecycle verbs, the policies (idle, quota,
//! fencing), the guest client and the relay of guest work live here, over
//! the engine-neutral [`engine::Backend`] trait.
//!
//! This crate links no engine client and no HTTP server: the Docker-API
//! backend is `dormouse-docker`, the API and the screen gateway are
//! `dormouse-http`, and the daemon (`dormouse-broker`) picks the backend and
//! serves. Cargo refuses an edge back from here to any of them.
//!
//! The workspace routes are the one place the HTTP side touches the disk:
//! once the owner has authorised a request and said where the workspace is,
//! the handler runs [`workspace`] functions on the blocking pool, never on an
//! async task.

#![forbid(unsafe_code)]

pub mod activity;
pub mod availability;
pub mod command;
pub mod config;
pub mod egress;
pub mod engine;
pub mod error;
pub mod faults;
/// Entry points of the fuzz targets (`tests/fuzz`) into this crate's
/// private checks; only with the feature `fuzzing`, never in the daemon.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod guest;
pub mod idle;
pub mod lifecycle;
pub mod metrics;
pub mod owner;
pub mod paths;
pub mod quota;
pub mod reconcile;
pub mod relay;
pub mod screen;
pub mod secret;
pub mod store;
pub mod workspace;

pub use command::{BrokerHandle, Command};
pub use config::BrokerConfig;
pub use error::BrokerError;
