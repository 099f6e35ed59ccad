//! `dormouse-supervisor bridge`: the guest channel where no host directory
//! can be bind-mounted (a pod, a remote engine).
//!
//! The broker runs this subcommand through the engine's exec stream; it
//! connects to one socket of the run directory ([`Target`]: the supervisor
//! socket for `bridge`, the VNC socket for `bridge-vnc`) and relays bytes
//! both ways between that socket and its own stdin/stdout until either side
//! closes. It adds nothing to the stream and interprets nothing: the broker
//! speaks the same framed protocol as over the bind-mounted socket and keeps
//! every bound it has there (the bridge runs inside the guest, so its output
//! is exactly as trusted as the socket's).
//!
//! It must never write anything but relayed bytes to stdout (logs go to
//! stderr), and never outlive either side of the relay.

use std::io;
use std::path::Path;

use dormouse_protocol::screen::VNC_SOCKET_FILE_NAME;
use dormouse_protocol::SOCKET_FILE_NAME;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

/// Which socket of the run directory a bridge relays to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `supervisor.sock`: the framed guest protocol.
    Supervisor,
    /// `vnc.sock`: the desktop's RFB stream (the live screen).
    Vnc,
}

impl Target {
    /// The socket's file name in the run directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Supervisor => SOCKET_FILE_NAME,
            Self::Vnc => VNC_SOCKET_FILE_NAME,
        }
    }
}

/// Why the relay ended other than by a clean close.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The supervisor socket could not be reached.
    #[error("connecting to {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading or writing one side failed.
    #[error("relaying: {0}")]
    Relay(#[from] io::Error),
}

/// Bytes relayed in each direction, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// From the caller (stdin) to the supervisor.
    pub to_guest: u64,
    /// From the supervisor to the caller (stdout).
    pub to_host: u64,
}

/// Connects to the `target` socket in `run_dir` and relays the process's
/// stdin and stdout to it.
pub async fn run(run_dir: &Path, target: Target) -> Result<Relayed, BridgeError> {
    let path = run_dir.join(target.file_name());
    let socket = UnixStream::connect(&path)
        .await
        .map_err(|source| BridgeError::Connect {
            path: path.display().to_string(),
            source,
        })?;
    let caller = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    relay(caller, socket).await
}

/// Relays `caller` and `guest` both ways until one side closes; the other
/// side's write half is shut down so it sees the end too.
pub async fn relay<C, G>(mut caller: C, mut guest: G) -> Result<Relayed, BridgeError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    G: AsyncRead + AsyncWrite + Unpin,
{
    let (to_guest, to_host) = tokio::io::copy_bidirectional(&mut caller, &mut guest).await?;
    Ok(Relayed { to_guest, to_host })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn relays_both_ways_and_ends_when_the_caller_closes() {
        let (caller_near, mut caller_far) = tokio::io::duplex(64);
        let (guest_near, mut guest_far) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay(caller_near, guest_near));

        caller_far.write_all(b"hello guest").await.expect("write");
        let mut buf = [0u8; 11];
        guest_far.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"hello guest");

        guest_far.write_all(b"hi host").await.expect("write");
        let mut buf = [0u8; 7];
        caller_far.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"hi host");

        drop(caller_far);
        // The guest side sees the end of the stream once the caller is gone.
        let mut rest = Vec::new();
        guest_far.read_to_end(&mut rest).await.expect("read to end");
        assert!(rest.is_empty());
        drop(guest_far);
        let relayed = relay.await.expect("join").expect("relay");
        assert_eq!(
            relayed,
            Relayed {
                to_guest: 11,
                to_host: 7
            }
        );
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = run(dir.path(), Target::Supervisor)
            .await
            .expect_err("no socket");
        assert!(matches!(err, BridgeError::Connect { .. }), "{err}");
        assert!(err.to_string().contains(SOCKET_FILE_NAME), "{err}");
        let err = run(dir.path(), Target::Vnc).await.expect_err("no socket");
        assert!(err.to_string().contains(VNC_SOCKET_FILE_NAME), "{err}");
    }
}
