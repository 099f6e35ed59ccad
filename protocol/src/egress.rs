//! Egress sessions on the guest socket: how one TCP connection a guest
//! program opens through the supervisor's proxy becomes one byte stream the
//! broker dials and relays, with no network interface in the guest.
//!
//! The frame flow of one `egress_accept` connection (a `session` request of
//! the [`guest_protocol!`](crate::guest_protocol) table):
//!
//! ```text
//! broker                                     supervisor (proxy on 127.0.0.1:3128)
//!   | -- egress_accept ----------------------> |  parked (the broker keeps a pool)
//!   |                                          |  ... a guest program connects,
//!   |                                          |  its request head is read and
//!   |                                          |  validated ...
//!   | <------------- egress_open + payload --- |  oldest parked connection
//!   |  (resolve, check the policy, dial)       |
//!   | -- egress_connected | egress_refused | egress_failed --> |
//!   |  after egress_connected: raw bytes both ways, no frames, |
//!   |  half-close propagated, until both ends close            |
//! ```
//!
//! - [`EgressOpen`] names what the guest program asked for: `host` (a DNS
//!   name in lower case, an IPv4 literal, or an IPv6 literal *without*
//!   brackets), `port`, and the [`EgressForm`]. Its payload is what the
//!   broker writes upstream first, right after dialling: for
//!   [`EgressForm::Http`] the rewritten request head (origin-form request
//!   line, `Proxy-*` headers and hop-by-hop headers removed,
//!   `Connection: close`) and any body bytes already read; for
//!   [`EgressForm::Connect`] any bytes the client sent after its `CONNECT`
//!   head (usually none).
//! - The broker answers with exactly one [`EgressVerdict`] frame. On
//!   [`EgressVerdict::Connected`] the guest answers a `CONNECT` client with
//!   `HTTP/1.1 200 Connection established` (a plain-HTTP client gets the
//!   upstream's own answer through the relay) and both sides relay raw
//!   bytes ([`crate::splice::relay`]). On [`EgressVerdict::Refused`] the guest answers
//!   `403` with the reason (plain HTTP: a small HTML page saying the same),
//!   on [`EgressVerdict::Failed`] `502`; the connection then closes.
//! - **Hand-over.** A supervisor that can sets [`EgressOpen::hand_over`]. A
//!   broker on the guest's socket itself (not a bridge, which cannot carry
//!   a descriptor) may then answer [`EgressVerdict::HandOver`] instead of
//!   `Connected`: the guest answers a `CONNECT` client with its `200`,
//!   then sends the program's own TCP socket to the broker as one byte
//!   with `SCM_RIGHTS` on the session and closes its copy; the broker
//!   closes the session once it holds the socket. The broker relays that
//!   socket and the upstream directly (one hop of `splice(2)` instead of
//!   two and a unix socket), with the same caps, fences and audit; it
//!   takes only a connected TCP socket, once.
//! - The frame reader ([`crate::stream::read_frame`]) never reads past the
//!   end of its frame, so the raw bytes after a verdict or an open frame
//!   stay in the stream for the relay: no codec step is needed to switch.
//!
//! Everything from the other side is hostile: [`EgressOpen::validate`] and
//! [`check_host`] bound and check what the guest names, the guest reads
//! the verdict with [`VERDICT_TAMING`] (reasons escaped and cut to
//! [`MAX_REASON_LEN`]). This module holds the shapes and the shared
//! bounds, never a policy (which names may be reached is the broker's).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::frame::{Message, Taming};

/// The guest loopback port of the supervisor's HTTP proxy.
pub const PROXY_PORT: u16 = 3128;
/// The proxy URL every desktop process is given (`http_proxy` and kin).
pub const PROXY_URL: &str = "http://127.0.0.1:3128";
/// What every desktop process reaches directly (`no_proxy`).
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// The variables (and values) the supervisor sets for every service, exec
/// and terminal session.
pub const PROXY_ENV: &[(&str, &str)] = &[
    ("http_proxy", PROXY_URL),
    ("https_proxy", PROXY_URL),
    ("HTTP_PROXY", PROXY_URL),
    ("HTTPS_PROXY", PROXY_URL),
    ("no_proxy", NO_PROXY),
    ("NO_PROXY", NO_PROXY),
];

/// Longest host name (DNS's limit for a name in text form).
pub const MAX_HOST_LEN: usize = 253;
/// Longest label of a DNS name.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest HTTP method the proxy forwards.
pub const MAX_METHOD_LEN: usize = 32;
/// Longest reason of a verdict kept, in bytes after escaping.
pub const MAX_REASON_LEN: usize = 300;
/// Longest request line the proxy reads.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Longest request head (request line and headers) the proxy reads.
pub const MAX_REQUEST_HEAD: usize = 32 * 1024;
/// Largest payload of an `egress_open`: a rewritten head (never longer
/// than [`MAX_REQUEST_HEAD`]) and the bytes read with it.
pub const MAX_OPEN_PAYLOAD: u32 = 64 * 1024;
/// Largest JSON part of an `egress_open` or a verdict frame.
pub const MAX_EGRESS_MESSAGE: u32 = 4 * 1024;
/// How long the guest waits for the verdict after sending `egress_open`
/// (the broker resolves and dials within less).
pub const VERDICT_TIMEOUT: Duration = Duration::from_secs(30);

/// What the guest keeps of a verdict's text.
pub const VERDICT_TAMING: Taming = Taming {
    max_bytes: MAX_REASON_LEN,
    max_items: 0,
};

/// Why an egress message or name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The host is empty, too long, or not a DNS name or IP literal.
    #[error("invalid host: {0}")]
    Host(String),
    /// Port 0.
    #[error("invalid port 0")]
    Port,
    /// The method is not an HTTP token of at most [`MAX_METHOD_LEN`] bytes,
    /// or is `CONNECT` on a plain-HTTP request.
    #[error("invalid method: {0}")]
    Method(String),
}

/// What a guest program asked the proxy for: sent by the supervisor as the
/// answer to `egress_accept`, its payload written upstream first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressOpen {
    /// Names this connection in both sides' logs; counts up per container
    /// start.
    pub id: u64,
    /// A DNS name (lower case, no trailing dot), an IPv4 literal, or an IPv6
    /// literal without brackets ([`check_host`]).
    pub host: String,
    /// The TCP port, 1 to 65535.
    pub port: u16,
    /// How the guest program asked.
    pub form: EgressForm,
    /// The supervisor can hand the program's socket over
    /// ([`EgressVerdict::HandOver`]); absent from older supervisors.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hand_over: bool,
}

/// How the guest program asked for the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EgressForm {
    /// `CONNECT host:port`: any TCP protocol (TLS, SSH, ...) after the
    /// guest's `200`.
    Connect,
    /// An absolute-form plain-HTTP request (`GET http://host/path`); the
    /// payload is its rewritten head.
    Http {
        /// The request's method, e.g. `GET`.
        method: String,
    },
}

impl EgressOpen {
    /// Checks every field a hostile guest could have bent.
    pub fn validate(&self) -> Result<(), EgressError> {
        check_host(&self.host)?;
        if self.port == 0 {
            return Err(EgressError::Port);
        }
        if let EgressForm::Http { method } = &self.form {
            check_method(method)?;
            if method.eq_ignore_ascii_case("CONNECT") {
                return Err(EgressError::Method(method.clone()));
            }
        }
        Ok(())
    }

    /// `host:port`, with an IPv6 literal in brackets, as people read it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The one verdict the broker sends on an egress session after
/// [`EgressOpen`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum EgressVerdict {
    /// Resolved, allowed and dialled: from the next byte on the connection
    /// is a raw byte pipe both ways.
    #[serde(rename = "egress_connected")]
    Connected,
    /// Resolved, allowed and dialled, and relayed by the broker itself:
    /// the guest sends its program's socket next (only after an
    /// [`EgressOpen::hand_over`]).
    #[serde(rename = "egress_hand_over")]
    HandOver,
    /// The policy refuses it; the guest answers `403`.
    #[serde(rename = "egress_refused")]
    Refused {
        /// One line naming the rule, e.g.
        /// `denied: pypi.org:443 not in the allow list`.
        reason: String,
    },
    /// Allowed, but resolving or dialling failed; the guest answers `502`.
    #[serde(rename = "egress_failed")]
    Failed {
        /// The cause, e.g. `connection refused by 203.0.113.7:443`.
        reason: String,
    },
}

impl Message for EgressVerdict {
    const KINDS: &'static [&'static str] = &[
        "egress_connected",
        "egress_hand_over",
        "egress_refused",
        "egress_failed",
    ];
    fn payload_allowed(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self {
            Self::Connected => "egress_connected",
            Self::HandOver => "egress_hand_over",
            Self::Refused { .. } => "egress_refused",
            Self::Failed { .. } => "egress_failed",
        }
    }
}

/// Checks a host as [`EgressOpen::host`] carries it: an IPv4 literal, an
/// IPv6 literal without brackets, or a DNS name of at most
/// [`MAX_HOST_LEN`] bytes whose labels (1 to [`MAX_LABEL_LEN`] bytes) are
/// ASCII letters, digits, `-` and `_`, not starting or ending with `-`,
/// in lower case, without a trailing dot.
pub fn check_host(host: &str) -> Result<(), EgressError> {
    let refuse = |why: &str| {
        Err(EgressError::Host(format!(
            "{:?}: {why}",
            crate::frame::escape_text(host, 64)
        )))
    };
    if host.is_empty() {
        return refuse("empty");
    }
    if host.len() > MAX_HOST_LEN {
        return refuse("longer than 253 bytes");
    }
    if host.contains(':') {
        return match host.parse::<Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => refuse("not an IPv6 address"),
        };
    }
    if host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    for label in host.split('.') {
        if label.is_empty() {
            return refuse("empty label");
        }
        if label.len() > MAX_LABEL_LEN {
            return refuse("label longer than 63 bytes");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return refuse("only lower-case letters, digits, '-' and '_' are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return refuse("a label starts or ends with '-'");
        }
    }
    // All-numeric dotted names that are not IPv4 (`1.2.3`, `999.1.1.1`)
    // would be read as addresses by some resolvers.
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return refuse("numeric but not an IPv4 address");
    }
    Ok(())
}

/// Checks an HTTP method: an RFC 9110 token of at most [`MAX_METHOD_LEN`]
/// bytes.
pub fn check_method(method: &str) -> Result<(), EgressError> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if method.is_empty() || method.len() > MAX_METHOD_LEN || !method.bytes().all(token) {
        return Err(EgressError::Method(crate::frame::escape_text(method, 40)));
    }
    Ok(())
}

#[cfg(any(feature = "tokio", test))]
pub use io::{open_limits, read_verdict, verdict_limits, write_verdict};

#[cfg(any(feature = "tokio", test))]
mod io {
    use tokio::io::{AsyncRead, AsyncWrite};

    use super::{
        EgressVerdict, MAX_EGRESS_MESSAGE, MAX_OPEN_PAYLOAD, VERDICT_TAMING, VERDICT_TIMEOUT,
    };
    use crate::frame::Taming;
    use crate::stream::{self, ReadLimits, StreamError};

    /// What the broker reads of a parked connection's `egress_open`: waits
    /// as long as the guest has no client, then the whole frame within
    /// `rest`; strings bounded as for any guest text.
    pub fn open_limits(rest: std::time::Duration) -> ReadLimits {
        ReadLimits {
            max_message: MAX_EGRESS_MESSAGE,
            max_payload: MAX_OPEN_PAYLOAD,
            taming: Some(Taming::GUEST),
            ..ReadLimits::new(None, rest)
        }
    }

    /// What the guest reads of the verdict.
    pub fn verdict_limits() -> ReadLimits {
        ReadLimits {
            max_message: MAX_EGRESS_MESSAGE,
            max_payload: 0,
            taming: Some(VERDICT_TAMING),
            ..ReadLimits::new(Some(VERDICT_TIMEOUT), VERDICT_TIMEOUT)
        }
    }

    /// Reads the verdict frame and nothing after it: the raw bytes that
    /// follow a [`EgressVerdict::Connected`] stay in `r` for [`crate::splice::relay`].
    pub async fn read_verdict<R: AsyncRead + Unpin>(
        r: &mut R,
    ) -> Result<EgressVerdict, StreamError> {
        Ok(stream::read_frame::<EgressVerdict, _>(r, &verdict_limits())
            .await?
            .message)
    }

    /// Writes the verdict frame within `within`.
    pub async fn write_verdict<W: AsyncWrite + Unpin>(
        w: &mut W,
        verdict: &EgressVerdict,
        within: std::time::Duration,
    ) -> Result<(), StreamError> {
        stream::write_frame(w, verdict, &[], within).await
    }
}

#[cfg(test)]
mod tests;
