//! Reading and parsing one proxy client's request head: bounded in bytes
//! (request line at most [`MAX_REQUEST_LINE`], head at most
//! [`MAX_REQUEST_HEAD`]) and in time (one deadline for the whole head, so a
//! slowloris client is cut off), then checked field by field into a
//! [`ProxyRequest`]: `CONNECT host:port`, or an absolute-form plain-HTTP
//! request whose head is rewritten for the upstream. It never touches a
//! socket other than the client's and never decides whether a name may be
//! reached (the broker does).

use std::net::Ipv6Addr;

use dormouse_protocol::egress::{
    check_host, check_method, EgressForm, MAX_REQUEST_HEAD, MAX_REQUEST_LINE,
};
use dormouse_protocol::frame::escape_text;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::time::{timeout_at, Instant};

/// Bytes asked of the client per read while the head is incomplete.
const READ_CHUNK: usize = 4096;

/// Headers of a plain-HTTP request that stay between the client and the
/// proxy (hop-by-hop, RFC 9110 §7.6.1) or that the proxy sets itself.
const DROPPED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Why a request head is refused: the HTTP status the client gets and a
/// one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {reason}")]
pub struct HeadError {
    /// `400`, `405`, `408` or `431`.
    pub status: u16,
    /// For people, without control characters.
    pub reason: String,
}

impl HeadError {
    fn new(status: u16, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }

    fn bad(reason: impl Into<String>) -> Self {
        Self::new(400, reason)
    }
}

/// A request the proxy can carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRequest {
    /// As [`dormouse_protocol::egress::EgressOpen::host`] carries it.
    pub host: String,
    /// 1 to 65535.
    pub port: u16,
    /// `CONNECT` or plain HTTP.
    pub form: EgressForm,
    /// For plain HTTP, the head to send upstream; empty for `CONNECT`.
    pub upstream_head: Vec<u8>,
}

/// Reads a request head by `deadline`: returns the head (up to and with its
/// blank line) and the bytes read after it.
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    deadline: Instant,
) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        let n = match timeout_at(deadline, r.read(&mut chunk)).await {
            Err(_) => {
                return Err(HeadError::new(
                    408,
                    "the request head did not arrive in time",
                ))
            }
            Ok(Ok(0)) => return Err(HeadError::bad("the client closed before its request ended")),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(HeadError::bad(format!("reading the request: {e}"))),
        };
        let searched_from = buf.len().saturating_sub(3);
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if !buf.contains(&b'\n') && buf.len() > MAX_REQUEST_LINE {
            return Err(line_too_long());
        }
        if let Some(at) = find_end(&buf, searched_from) {
            let early = buf.split_off(at);
            if buf.len() > MAX_REQUEST_HEAD {
                return Err(head_too_large());
            }
            return Ok((buf, early));
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Err(head_too_large());
        }
    }
}

fn line_too_long() -> HeadError {
    HeadError::bad(format!(
        "the request line is longer than {MAX_REQUEST_LINE} bytes"
    ))
}

fn head_too_large() -> HeadError {
    HeadError::new(
        431,
        format!("the request head is longer than {MAX_REQUEST_HEAD} bytes"),
    )
}

/// The index just past the first `\r\n\r\n` at or after `from`.
fn find_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| from + p + 4)
}

/// Parses a whole head (as [`read_head`] returns it).
pub fn parse(head: &[u8]) -> Result<ProxyRequest, HeadError> {
    let body = head.strip_suffix(b"\r\n\r\n").unwrap_or(head);
    let mut lines = body
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let line = lines.next().unwrap_or_default();
    if line.len() > MAX_REQUEST_LINE {
        return Err(line_too_long());
    }
    let line = text(line, "the request line")?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::bad(format!(
            "not an HTTP request line: {:?}",
            escape_text(line, 80)
        )));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HeadError::bad(format!(
            "unsupported version {:?}",
            escape_text(version, 20)
        )));
    }
    check_method(method).map_err(|e| HeadError::bad(e.to_string()))?;
    let mut headers = Vec::new();
    for raw in lines {
        headers.push(header(raw)?);
    }
    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(ProxyRequest {
            host,
            port,
            form: EgressForm::Connect,
            upstream_head: Vec::new(),
        });
    }
    if method.eq_ignore_ascii_case("TRACE") {
        return Err(HeadError::new(405, "TRACE is not carried"));
    }
    // Methods are case-sensitive, but some servers read `connect` as
    // CONNECT: as plain HTTP it is not carried (the broker refuses it too).
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(HeadError::new(
            405,
            "a CONNECT is spelled in capitals; any other spelling is not carried",
        ));
    }
    let Some(rest) = strip_prefix_ignore_case(target, "http://") else {
        let why = if target.starts_with('/') {
            "this is a proxy: ask for an absolute URL (http://host/path) or use CONNECT".into()
        } else if strip_prefix_ignore_case(target, "https://").is_some() {
            "https goes through CONNECT host:443".into()
        } else {
            format!(
                "only http:// URLs and CONNECT are carried, not {:?}",
                escape_text(target, 80)
            )
        };
        return Err(HeadError::bad(why));
    };
    let cut = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority_part, path) = rest.split_at(cut);
    let (host, port) = authority(authority_part, Some(80))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else if path.is_empty() {
        "/".into()
    } else {
        path.to_owned()
    };
    let upstream_head = rewrite(method, &path, version, authority_part, &headers);
    Ok(ProxyRequest {
        host,
        port,
        form: EgressForm::Http {
            method: method.to_owned(),
        },
        upstream_head,
    })
}

/// `bytes` as text without control characters (a header value may hold
/// HTAB).
fn text<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, HeadError> {
    let s =
        std::str::from_utf8(bytes).map_err(|_| HeadError::bad(format!("{what} is not UTF-8")))?;
    if s.chars().any(|c| c.is_control() && c != '\t') {
        return Err(HeadError::bad(format!(
            "{what} holds control characters: {:?}",
            escape_text(s, 80)
        )));
    }
    Ok(s)
}

/// One header line: a token name, a colon, a value.
fn header(raw: &[u8]) -> Result<(String, String), HeadError> {
    let line = text(raw, "a header")?;
    if line.starts_with([' ', '\t']) {
        return Err(HeadError::bad("folded header lines are not accepted"));
    }
    let Some((name, value)) = line.split_once(':') else {
        return Err(HeadError::bad(format!(
            "not a header line: {:?}",
            escape_text(line, 80)
        )));
    };
    check_method(name)
        .map_err(|_| HeadError::bad(format!("bad header name {:?}", escape_text(name, 40))))?;
    Ok((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()))
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| s.get(prefix.len()..))
        .flatten()
}

/// `host[:port]` or `[v6][:port]`: the host as `EgressOpen` carries it and
/// the port (`default` when absent; `CONNECT` has none).
pub fn authority(text: &str, default: Option<u16>) -> Result<(String, u16), HeadError> {
    if text.contains('@') {
        return Err(HeadError::bad("credentials in the URL are not carried"));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((inner, after)) = rest.split_once(']') else {
            return Err(HeadError::bad("an IPv6 literal without its ']'"));
        };
        if inner.parse::<Ipv6Addr>().is_err() {
            return Err(HeadError::bad(format!(
                "invalid IPv6 literal {:?}",
                escape_text(inner, 60)
            )));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| HeadError::bad("junk after the IPv6 literal"))?,
            ),
        };
        (inner.to_ascii_lowercase(), port)
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
            None => (text.to_ascii_lowercase(), None),
        }
    };
    let port = match (port, default) {
        (Some(p), _) => parse_port(p)?,
        (None, Some(d)) => d,
        (None, None) => return Err(HeadError::bad("CONNECT needs host:port")),
    };
    let host = host.strip_suffix('.').map(str::to_owned).unwrap_or(host);
    if host.contains(':') && !text.starts_with('[') {
        return Err(HeadError::bad("an IPv6 literal goes in brackets"));
    }
    check_host(&host).map_err(|e| HeadError::bad(e.to_string()))?;
    Ok((host, port))
}

fn parse_port(p: &str) -> Result<u16, HeadError> {
    let bad = || HeadError::bad(format!("invalid port {:?}", escape_text(p, 12)));
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match p.parse::<u32>() {
        Ok(n @ 1..=65535) => u16::try_from(n).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// The head sent upstream: origin-form, the URL's authority as `Host`,
/// hop-by-hop and `Proxy-*` headers (and those `Connection` names) gone,
/// `Connection: close`.
fn rewrite(
    method: &str,
    path: &str,
    version: &str,
    host: &str,
    headers: &[(String, String)],
) -> Vec<u8> {
    let named: Vec<String> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect();
    let mut out = format!("{method} {path} {version}\r\nHost: {host}\r\n");
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("proxy-")
            || DROPPED_HEADERS.contains(&lower.as_str())
            || named.contains(&lower)
        {
            continue;
        }
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
