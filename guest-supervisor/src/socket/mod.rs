//! The guest socket `/run/dormouse/supervisor.sock`: the only channel between
//! the host and a network-less guest.
//!
//! Three parts, each depending only on the ones after it:
//! [`run_dir`] makes the run directory a real, root-owned 0700 directory
//! (once, by file descriptor, never following a link) and binds a fresh
//! socket in it (whatever sat at its name is removed without being
//! followed: the run directory is the supervisor's own, so every start
//! recovers from what a previous one, or a hostile guest root, left there);
//! [`listener`] accepts capped connections and reads bounded frames;
//! [`dispatch`] is the supervisor's implementation of the protocol's
//! generated [`GuestService`](dormouse_protocol::GuestService), one method
//! per request of the table (`exec` and `pty_open` are served on their
//! connection by [`crate::exec_socket`]).
//!
//! Everything a client sends is hostile until parsed: the 8-byte header is
//! bounds-checked before anything is allocated, every read and write has a
//! deadline (the shared [`dormouse_protocol::stream`] reader and writer),
//! connections are capped, and a bad frame closes only its own connection.
//! This module never changes the status (it reads the
//! [`StatusCell`]) and never stops services itself (a `quiesce`, and the end
//! of a `quiesce_hold`, are handed to the service runner).

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::exec::ExecRunner;
use crate::status::{QuiesceRequest, StatusCell};

mod dispatch;
mod listener;
mod run_dir;

pub use listener::{accept_capped, accept_loop, MAX_REQUEST_LEN};
pub use run_dir::{
    bind, bind_named, secure_run_dir, BoundSocket, SocketError, RUN_DIR_MODE, SOCKET_MODE,
};

/// Binds the socket and serves it until the returned future is dropped
/// (which also ends every connection and removes the socket file).
pub async fn serve(
    config: Arc<Config>,
    cell: StatusCell,
    quiesce: mpsc::Sender<QuiesceRequest>,
    exec: ExecRunner,
    egress: crate::egress::Hub,
) -> Result<(), SocketError> {
    let bound = bind(&config)?;
    tracing::info!(path = %bound.path().display(), "guest socket listening");
    accept_loop(&bound.listener, config, cell, quiesce, exec, egress).await;
    Ok(())
}

#[cfg(test)]
mod tests;
