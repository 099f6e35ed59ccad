//! `dormouse-broker`: the host side of Dormouse. It only creates, starts,
//! stops, removes and fences desktop containers, and serves their status
//! and their workspaces.
//!
//! `api/` parses HTTP into [`command::Command`]s; one owner task holds every
//! computer's state and is the only code that touches the engine or the
//! broker's records. The workspace routes are the one place the API layer
//! touches the disk: once the owner has authorised a request and said where
//! the workspace is, the handler runs [`workspace`] functions on the
//! blocking pool, never on an async task.

#![forbid(unsafe_code)]

pub mod api;
pub mod command;
pub mod config;
pub mod daemon;
pub mod egress;
pub mod engine;
pub mod error;
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
