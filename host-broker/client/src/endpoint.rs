//! Where a broker listens, as a client names it: `http://HOST:PORT` or
//! `unix:/PATH` (the broker's `--listen unix:/PATH`).
//!
//! It owns parsing that address and turning it into request URLs; it never
//! connects anything itself.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The host name put into URLs sent over a unix socket (the broker ignores it).
const UNIX_HOST: &str = "localhost";

/// A broker's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Plain HTTP over TCP; `base` is `http://HOST:PORT` without a trailing slash.
    Http {
        /// The URL every path is appended to.
        base: String,
    },
    /// HTTP over a unix socket.
    Unix(PathBuf),
}

/// Why an address is not a usable [`Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Neither `http://` nor `unix:`.
    #[error("{0:?} must start with http:// or unix:/ (the broker has no TLS)")]
    Scheme(String),
    /// `unix:` with a relative path.
    #[error("unix socket path {0:?} must be absolute")]
    RelativeSocket(PathBuf),
    /// `http://` and nothing after it.
    #[error("{0:?} names no host")]
    NoHost(String),
}

impl Endpoint {
    /// `http://ADDR`.
    pub fn tcp(addr: SocketAddr) -> Self {
        Self::Http {
            base: format!("http://{addr}"),
        }
    }

    /// A unix socket; the path must be absolute.
    pub fn unix(path: impl Into<PathBuf>) -> Result<Self, EndpointError> {
        let path = path.into();
        if !path.is_absolute() {
            return Err(EndpointError::RelativeSocket(path));
        }
        Ok(Self::Unix(path))
    }

    /// The socket path, for a unix endpoint.
    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Self::Http { .. } => None,
            Self::Unix(path) => Some(path),
        }
    }

    /// The HTTP URL of `path` (which starts with `/`).
    pub(crate) fn http_url(&self, path: &str) -> String {
        match self {
            Self::Http { base } => format!("{base}{path}"),
            Self::Unix(_) => format!("http://{UNIX_HOST}{path}"),
        }
    }

    /// The WebSocket URL of `path`.
    pub(crate) fn ws_url(&self, path: &str) -> String {
        match self {
            Self::Http { base } => format!("ws{}{path}", base.trim_start_matches("http")),
            Self::Unix(_) => format!("ws://{UNIX_HOST}{path}"),
        }
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            return Self::unix(path);
        }
        let Some(rest) = s.strip_prefix("http://") else {
            return Err(EndpointError::Scheme(s.to_owned()));
        };
        let base = s.trim_end_matches('/');
        if rest.trim_end_matches('/').is_empty() {
            return Err(EndpointError::NoHost(s.to_owned()));
        }
        Ok(Self::Http {
            base: base.to_owned(),
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http { base } => f.write_str(base),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        let http: Endpoint = "http://127.0.0.1:7480/"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            http.http_url("/v1/computers"),
            "http://127.0.0.1:7480/v1/computers"
        );
        assert_eq!(http.ws_url("/v1/events"), "ws://127.0.0.1:7480/v1/events");
        let unix: Endpoint = "unix:/run/dormouse/api.sock"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            unix.socket_path(),
            Some(Path::new("/run/dormouse/api.sock"))
        );
        assert_eq!(unix.to_string(), "unix:/run/dormouse/api.sock");
        assert!(matches!(
            "https://example.org".parse::<Endpoint>(),
            Err(EndpointError::Scheme(_))
        ));
        assert!(matches!(
            "unix:api.sock".parse::<Endpoint>(),
            Err(EndpointError::RelativeSocket(_))
        ));
        assert!(matches!(
            "http://".parse::<Endpoint>(),
            Err(EndpointError::NoHost(_))
        ));
    }
}
