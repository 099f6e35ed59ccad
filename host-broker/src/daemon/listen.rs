//! Where the API listens: a loopback TCP address, a unix socket, or a socket
//! systemd passed in (`LISTEN_FDS`, `dormoused.socket`).
//!
//! It owns binding and the refusal of non-loopback addresses without
//! `--allow-remote` (the API has no TLS; a token sent in clear over a network
//! is a token given away). It never removes a path that is not a stale socket.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The `--listen` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `127.0.0.1:7480`, `[::1]:7480`, ...
    Tcp(SocketAddr),
    /// `unix:/run/dormouse/api.sock`.
    Unix(PathBuf),
}

impl Default for ListenAddr {
    fn default() -> Self {
        Self::Tcp(SocketAddr::from(([127, 0, 0, 1], 7480)))
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("unix socket path {path:?} must be absolute"));
            }
            return Ok(Self::Unix(path));
        }
        s.parse::<SocketAddr>().map(Self::Tcp).map_err(|_| {
            format!("{s:?} is neither an IP address with a port (127.0.0.1:7480) nor unix:/path")
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// What can go wrong setting up the listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// A non-loopback TCP address without `--allow-remote`.
    #[error(
        "refusing to listen on {0}: it is not a loopback address and the API has no TLS \
         (pass --allow-remote to do it anyway, behind a TLS-terminating proxy)"
    )]
    NotLoopback(SocketAddr),
    /// Binding failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Where.
        addr: String,
        /// Why.
        source: io::Error,
    },
    /// Something other than a stale socket is at the unix socket path, or a
    /// broker already answers there.
    #[error("cannot listen on unix:{path}: {reason}")]
    PathInUse {
        /// The path.
        path: PathBuf,
        /// What is there.
        reason: String,
    },
    /// The sockets systemd passed are not usable.
    #[error("socket activation: {0}")]
    Activation(String),
}

/// A bound listener, ready to serve.
#[derive(Debug)]
pub enum ApiListener {
    /// TCP.
    Tcp(tokio::net::TcpListener),
    /// Unix socket; the path is removed again on a clean stop when we bound it.
    Unix(tokio::net::UnixListener, Option<PathBuf>),
}

impl ApiListener {
    /// How this broker reaches itself: the TCP port on loopback (an
    /// unspecified address becomes loopback), or the unix socket.
    pub fn loopback(&self) -> Option<dormouse_client::Endpoint> {
        match self {
            Self::Tcp(l) => {
                let mut addr = l.local_addr().ok()?;
                if addr.ip().is_unspecified() {
                    addr.set_ip(if addr.is_ipv4() {
                        std::net::Ipv4Addr::LOCALHOST.into()
                    } else {
                        std::net::Ipv6Addr::LOCALHOST.into()
                    });
                }
                Some(dormouse_client::Endpoint::tcp(addr))
            }
            Self::Unix(l, _) => {
                let addr = l.local_addr().ok()?;
                dormouse_client::Endpoint::unix(addr.as_pathname()?).ok()
            }
        }
    }

    /// For logs and the systemd status line.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map(|a| format!("http://{a}"))
                .unwrap_or_else(|_| "tcp".into()),
            Self::Unix(l, _) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_else(|| "unix socket".into()),
        }
    }
}

/// Sockets passed by systemd, taken before the runtime starts threads
/// (taking them clears `LISTEN_FDS` from the environment).
#[derive(Debug, Default)]
pub struct Activation {
    listener: Option<ActivatedSocket>,
    error: Option<String>,
}

#[derive(Debug)]
enum ActivatedSocket {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl Activation {
    /// Takes the first socket systemd passed, if any. Must be called while the
    /// process has one thread (it edits the environment).
    pub fn from_env() -> Self {
        let mut fds = listenfd::ListenFd::from_env();
        if fds.len() == 0 {
            return Self::default();
        }
        if fds.len() > 1 {
            tracing::warn!(
                count = fds.len(),
                "systemd passed several sockets; using the first"
            );
        }
        let listener = match fds.take_tcp_listener(0) {
            Ok(Some(l)) => Some(ActivatedSocket::Tcp(l)),
            _ => match fds.take_unix_listener(0) {
                Ok(Some(l)) => Some(ActivatedSocket::Unix(l)),
                Ok(None) => None,
                Err(e) => {
                    return Self {
                        listener: None,
                        error: Some(format!(
                            "the passed socket is neither TCP nor unix stream: {e}"
                        )),
                    }
                }
            },
        };
        Self {
            listener,
            error: None,
        }
    }

    /// Whether systemd passed a socket.
    pub fn is_active(&self) -> bool {
        self.listener.is_some() || self.error.is_some()
    }
}

/// The listener to serve on: the activated socket if systemd passed one,
/// else `addr` bound now.
pub fn bind(
    addr: &ListenAddr,
    allow_remote: bool,
    activation: Activation,
) -> Result<ApiListener, ListenError> {
    if let Some(error) = activation.error {
        return Err(ListenError::Activation(error));
    }
    match activation.listener {
        Some(ActivatedSocket::Tcp(listener)) => {
            let local = listener
                .local_addr()
                .map_err(|e| ListenError::Activation(e.to_string()))?;
            check_loopback(local, allow_remote)?;
            listener
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(listener))
                .map(ApiListener::Tcp)
                .map_err(|e| ListenError::Activation(e.to_string()))
        }
        Some(ActivatedSocket::Unix(listener)) => listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixListener::from_std(listener))
            // systemd owns the path of a socket it made; never remove it.
            .map(|l| ApiListener::Unix(l, None))
            .map_err(|e| ListenError::Activation(e.to_string())),
        None => bind_addr(addr, allow_remote),
    }
}

fn bind_addr(addr: &ListenAddr, allow_remote: bool) -> Result<ApiListener, ListenError> {
    match addr {
        ListenAddr::Tcp(socket) => {
            check_loopback(*socket, allow_remote)?;
            let listener = std::net::TcpListener::bind(socket)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|source| ListenError::Bind {
                    addr: addr.to_string(),
                    source,
                })?;
            Ok(ApiListener::Tcp(listener))
        }
        ListenAddr::Unix(path) => {
            clear_stale_socket(path)?;
            let listener = std::os::unix::net::UnixListener::bind(path)
                .and_then(|l| {
                    // Only the broker's user connects; the token is checked as well.
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                    l.set_nonblocking(true)?;
                    tokio::net::UnixListener::from_std(l)
                })
                .map_err(|source| ListenError::Bind {
                    addr: addr.to_string(),
                    source,
                })?;
            Ok(ApiListener::Unix(listener, Some(path.clone())))
        }
    }
}

fn check_loopback(addr: SocketAddr, allow_remote: bool) -> Result<(), ListenError> {
    if addr.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(ListenError::NotLoopback(addr))
    }
}

/// Removes a socket left by a broker that died, but nothing else: not a
/// file, not a symlink, not the socket of a broker that still answers.
fn clear_stale_socket(path: &Path) -> Result<(), ListenError> {
    let in_use = |reason: &str| ListenError::PathInUse {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(in_use(&e.to_string())),
    };
    if !meta.file_type().is_socket() {
        return Err(in_use("it exists and is not a socket"));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(in_use("another process is listening there")),
        Err(_) => std::fs::remove_file(path).map_err(|e| in_use(&e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "127.0.0.1:7480".parse::<ListenAddr>(),
            Ok(ListenAddr::default())
        );
        assert_eq!(
            "unix:/run/d.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("/run/d.sock".into()))
        );
        assert!("unix:relative.sock".parse::<ListenAddr>().is_err());
        assert!("localhost".parse::<ListenAddr>().is_err());
    }

    #[tokio::test]
    async fn remote_addresses_need_allow_remote() {
        let remote: ListenAddr = "0.0.0.0:0".parse().expect("addr");
        assert!(matches!(
            bind(&remote, false, Activation::default()),
            Err(ListenError::NotLoopback(_))
        ));
        assert!(bind(&remote, true, Activation::default()).is_ok());
        let local: ListenAddr = "127.0.0.1:0".parse().expect("addr");
        assert!(bind(&local, false, Activation::default()).is_ok());
    }

    #[tokio::test]
    async fn unix_socket_replaces_only_a_stale_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("api.sock");
        let addr = ListenAddr::Unix(path.clone());
        let first = bind(&addr, false, Activation::default()).expect("bind");
        // A live broker answers there: refused.
        assert!(matches!(
            bind(&addr, false, Activation::default()),
            Err(ListenError::PathInUse { .. })
        ));
        drop(first);
        // The socket file stays behind (as after a crash): replaced.
        assert!(bind(&addr, false, Activation::default()).is_ok());
        let file = dir.path().join("file");
        std::fs::write(&file, "x").expect("write");
        assert!(matches!(
            bind(
                &ListenAddr::Unix(file.clone()),
                false,
                Activation::default()
            ),
            Err(ListenError::PathInUse { .. })
        ));
        assert!(file.exists(), "a regular file is never removed");
    }
}
