//! `dormouse-broker`: the host side of Dormouse. It only creates, starts,
//! stops, removes and fences desktop containers, and serves their status.
//!
//! `api/` parses HTTP into [`command::Command`]s; one owner task holds every
//! computer's state and is the only code that touches the engine or the disk.

#![forbid(unsafe_code)]

pub mod api;
pub mod command;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod exec;
pub mod guest;
pub mod idle;
pub mod lifecycle;
pub mod metrics;
pub mod owner;
pub mod quota;
pub mod reconcile;
pub mod screen;
pub mod store;
pub mod workspace;

pub use command::{BrokerHandle, Command};
pub use config::BrokerConfig;
pub use error::BrokerError;
