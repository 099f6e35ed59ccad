//! The wire shape of a desktop's egress policy (`GET/PUT
//! /v1/computers/{id}/egress`, `"egress"` in the create body), the grammar
//! of its rules, and the audit entries the broker keeps of every
//! connection (`GET /v1/computers/{id}/egress/log`).
//!
//! This module parses and prints rules strictly and nothing else: what a
//! rule *decides* lives in the broker (`dormouse-egress`). A rule that does
//! not parse is refused on arrival with a message naming it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most rules in each of a policy's lists.
pub const MAX_RULES: usize = 1024;
/// Longest rule, in bytes.
pub const MAX_RULE_LEN: usize = 300;
/// Longest host name (RFC 1035, without the trailing dot).
pub const MAX_HOST_LEN: usize = 253;

/// What a desktop may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressMode {
    /// Nothing: every connection is refused.
    #[default]
    Off,
    /// Only what an `allow` rule names.
    Allowlist,
    /// Any public address, less what a `deny` rule names.
    Open,
}

impl EgressMode {
    /// The mode's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Allowlist => "allowlist",
            Self::Open => "open",
        }
    }
}

impl fmt::Display for EgressMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EgressMode {
    type Err = RuleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Self::Off),
            "allowlist" => Ok(Self::Allowlist),
            "open" => Ok(Self::Open),
            other => Err(RuleError::new(other, "a mode is off, allowlist or open")),
        }
    }
}

/// A desktop's egress policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// What may be reached at all.
    pub mode: EgressMode,
    /// What `allowlist` lets through (ignored by `open` and `off`, kept).
    #[serde(default)]
    pub allow: Vec<EgressRule>,
    /// What is refused in every mode; a deny rule wins over any allow rule.
    #[serde(default)]
    pub deny: Vec<EgressRule>,
}

impl EgressPolicy {
    /// The policy of `mode` with no rules.
    pub fn of_mode(mode: EgressMode) -> Self {
        Self {
            mode,
            allow: Vec::new(),
            deny: Vec::new(),
        }
    }

    /// Checks the bounds serde cannot: the number of rules in each list.
    pub fn validate(&self) -> Result<(), RuleError> {
        for (name, list) in [("allow", &self.allow), ("deny", &self.deny)] {
            if list.len() > MAX_RULES {
                return Err(RuleError::new(
                    name,
                    &format!("at most {MAX_RULES} rules per list"),
                ));
            }
        }
        Ok(())
    }
}

/// A host name pattern: one name, or every name below a domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    /// `*.example.com`: names below `name`, not `name` itself.
    pub wildcard: bool,
    /// The name, lower case, without a trailing dot.
    pub name: String,
}

impl HostPattern {
    /// Whether `host` (already lower case) matches.
    pub fn matches(&self, host: &str) -> bool {
        if self.wildcard {
            host.len() > self.name.len() + 1
                && host.ends_with(self.name.as_str())
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }
}

/// An IP network: an address and a prefix length, host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The network address.
    pub addr: IpAddr,
    /// The prefix length (0..=32 or 0..=128).
    pub prefix: u8,
}

impl Cidr {
    /// The network `addr/prefix`; `None` if the prefix is too long or host
    /// bits are set.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let cidr = Self { addr, prefix };
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        (prefix <= max && cidr.contains(addr) && cidr.network_bits(addr) == bits(addr))
            .then_some(cidr)
    }

    /// The host-bits-cleared value of `a` under this prefix.
    fn network_bits(&self, a: IpAddr) -> u128 {
        let (value, width) = match a {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32u32),
            IpAddr::V6(v6) => (u128::from(v6), 128u32),
        };
        let keep = u32::from(self.prefix);
        if keep == 0 {
            0
        } else {
            let shift = width - keep;
            (value >> shift) << shift
        }
    }

    /// Whether `a` (of the same family) lies in the network.
    pub fn contains(&self, a: IpAddr) -> bool {
        match (self.addr, a) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                self.network_bits(a) == self.network_bits(self.addr)
            }
            _ => false,
        }
    }

    /// Whether every address of `self` lies in `outer`.
    pub fn within(&self, outer: &Cidr) -> bool {
        self.prefix >= outer.prefix && outer.contains(self.addr)
    }

    /// Whether this network is a single address (`/32`, `/128`).
    pub fn is_single(&self) -> bool {
        match self.addr {
            IpAddr::V4(_) => self.prefix == 32,
            IpAddr::V6(_) => self.prefix == 128,
        }
    }
}

fn bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// What one rule names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RuleTarget {
    /// A host name pattern, matched against the name the guest asked for.
    Host(HostPattern),
    /// A network, matched against every address the broker resolved.
    Cidr(Cidr),
}

/// One rule: a host pattern or a CIDR, with an optional port.
///
/// Grammar (parsed strictly; the canonical form is what [`fmt::Display`]
/// prints and what the API answers):
/// - `example.com` — that name only; `*.example.com` — every name below
///   it, not the name itself; `pypi.org:443` — on that port only.
/// - `203.0.113.0/24`, `10.1.2.3/32:8080`, `fd00::/8`, `::1/128:443` — a
///   network (host bits zero), on any port or on one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressRule {
    /// What it names.
    pub target: RuleTarget,
    /// The one port it names; `None`: any port.
    pub port: Option<u16>,
}

impl EgressRule {
    /// Whether this rule names the name `host` on `port`.
    pub fn matches_host(&self, host: &str, port: u16) -> bool {
        matches!(&self.target, RuleTarget::Host(p) if p.matches(host))
            && self.port.is_none_or(|p| p == port)
    }

    /// Whether this rule names the address `addr` on `port`.
    pub fn matches_addr(&self, addr: IpAddr, port: u16) -> bool {
        matches!(&self.target, RuleTarget::Cidr(c) if c.contains(addr))
            && self.port.is_none_or(|p| p == port)
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            RuleTarget::Host(h) if h.wildcard => write!(f, "*.{}", h.name)?,
            RuleTarget::Host(h) => f.write_str(&h.name)?,
            RuleTarget::Cidr(c) => write!(f, "{c}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// A rule (or a host or a mode) that does not parse, naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad egress rule `{rule}`: {why}")]
pub struct RuleError {
    /// The rule as given (escaped, capped).
    pub rule: String,
    /// What is wrong with it.
    pub why: String,
}

impl RuleError {
    fn new(rule: &str, why: &str) -> Self {
        let mut shown: String = rule
            .chars()
            .take(80)
            .flat_map(char::escape_default)
            .collect();
        if rule.chars().count() > 80 {
            shown.push('…');
        }
        Self {
            rule: shown,
            why: why.to_owned(),
        }
    }
}

impl FromStr for EgressRule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| RuleError::new(s, why);
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.len() > MAX_RULE_LEN {
            return Err(bad(&format!("longer than {MAX_RULE_LEN} bytes")));
        }
        if !s.is_ascii() || s.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(bad("only printable ASCII without spaces"));
        }
        if let Some((addr, rest)) = s.split_once('/') {
            let (prefix, port) = match rest.split_once(':') {
                Some((prefix, port)) => (prefix, Some(parse_port(port).map_err(&bad)?)),
                None => (rest, None),
            };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| bad("a CIDR starts with an IPv4 or IPv6 address"))?;
            if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3
            {
                return Err(bad("a CIDR's prefix length is a number"));
            }
            let prefix: u8 = prefix.parse().map_err(|_| bad("prefix length too long"))?;
            let cidr = Cidr::new(addr, prefix).ok_or_else(|| {
                bad("the prefix length is too long for the address, or host bits are set")
            })?;
            return Ok(Self {
                target: RuleTarget::Cidr(cidr),
                port,
            });
        }
        if s.parse::<IpAddr>().is_ok() || s.starts_with('[') {
            return Err(bad(
                "write an address as a CIDR, e.g. 10.1.2.3/32 or ::1/128",
            ));
        }
        let (host, port) = match s.rsplit_once(':') {
            Some((host, port)) => (host, Some(parse_port(port).map_err(&bad)?)),
            None => (s, None),
        };
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(name) => (true, name),
            None => (false, host),
        };
        let name = validate_host_name(name).map_err(&bad)?;
        if name.parse::<Ipv4Addr>().is_ok() || looks_numeric(&name) {
            return Err(bad("write an address as a CIDR, e.g. 10.1.2.3/32"));
        }
        Ok(Self {
            target: RuleTarget::Host(HostPattern { wildcard, name }),
            port,
        })
    }
}

/// A port 1..=65535, digits only.
fn parse_port(s: &str) -> Result<u16, &'static str> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a port is a number from 1 to 65535");
    }
    match s.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => u16::try_from(p).map_err(|_| "port out of range"),
        _ => Err("a port is a number from 1 to 65535"),
    }
}

/// Whether the last label is all digits (a name such as `1.2.3` that some
/// resolvers read as an address).
fn looks_numeric(name: &str) -> bool {
    name.rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
}

/// A host name in lower case if it is one: labels of letters, digits and
/// hyphens (and `_`, which real names carry), 1 to 63 bytes, not starting
/// or ending with a hyphen, at most [`MAX_HOST_LEN`] bytes in all; one
/// trailing dot is dropped.
pub fn validate_host_name(name: &str) -> Result<String, &'static str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err("empty host name");
    }
    if name.len() > MAX_HOST_LEN {
        return Err("host name longer than 253 bytes");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each label of a host name has 1 to 63 bytes");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a host name has only letters, digits, hyphens and dots");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label of a host name neither starts nor ends with a hyphen");
        }
    }
    Ok(name.to_ascii_lowercase())
}

/// What a guest asked to reach, checked: a name or an address literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A host name, lower case.
    Name(String),
    /// An address literal (`[v6]` brackets removed).
    Addr(IpAddr),
}

impl Destination {
    /// Parses what a guest sent as a host: an IPv4 literal, an IPv6 literal
    /// with or without brackets, or a host name.
    pub fn parse(host: &str) -> Result<Self, &'static str> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(v6) = bare.parse::<Ipv6Addr>() {
            return Ok(Self::Addr(IpAddr::V6(v6)));
        }
        if let Ok(v4) = bare.parse::<Ipv4Addr>() {
            return Ok(Self::Addr(IpAddr::V4(v4)));
        }
        let name = validate_host_name(host)?;
        if looks_numeric(&name) {
            return Err("a host name whose last label is a number is not a name");
        }
        Ok(Self::Name(name))
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n),
            Self::Addr(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Self::Addr(a) => write!(f, "{a}"),
        }
    }
}

impl Serialize for EgressRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EgressRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How the broker decided one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressDecision {
    /// Allowed and connected.
    Allowed,
    /// Refused by the policy or a cap.
    Refused,
    /// Allowed, but the name did not resolve or the dial failed.
    Failed,
}

impl EgressDecision {
    /// The decision's name on the wire (and as a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Refused => "refused",
            Self::Failed => "failed",
        }
    }
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressEnd {
    /// Refused or failed before any byte was relayed.
    NotOpened,
    /// Both sides closed.
    Closed,
    /// No byte moved either way for the idle timeout.
    Idle,
    /// A policy change denied it.
    Policy,
    /// The desktop stopped, was removed or fenced off.
    Fenced,
    /// A read or write failed.
    Error,
}

/// What the guest asked for: a tunnel, or one plain-HTTP request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressKind {
    /// `CONNECT host:port`.
    Connect,
    /// An absolute-form plain-HTTP request, with its method.
    Http {
        /// The request's method.
        method: String,
    },
}

/// One connection in the audit ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressLogEntry {
    /// Position in this desktop's log; grows by one per entry, across restarts.
    pub seq: u64,
    /// When the guest asked.
    pub time: DateTime<Utc>,
    /// The desktop.
    pub computer: Uuid,
    /// The host the guest asked for, as asked (escaped, capped).
    pub host: String,
    /// The port.
    pub port: u16,
    /// What it asked for.
    pub kind: EgressKind,
    /// The address dialled (or the first refused one).
    #[serde(default)]
    pub address: Option<String>,
    /// Allowed, refused, failed.
    pub decision: EgressDecision,
    /// The rule that decided, in canonical form, when a rule did.
    #[serde(default)]
    pub rule: Option<String>,
    /// The one-line reason the guest saw, for a refusal or a failure.
    #[serde(default)]
    pub reason: Option<String>,
    /// Bytes from the guest to the destination.
    pub bytes_up: u64,
    /// Bytes from the destination to the guest.
    pub bytes_down: u64,
    /// From the request to the end.
    pub duration_ms: u64,
    /// How it ended.
    pub end: EgressEnd,
}

/// `GET /v1/computers/{id}/egress/log`: entries after `since`, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressLogPage {
    /// The entries.
    pub entries: Vec<EgressLogEntry>,
    /// The `since` to ask with next (the last entry's `seq`, or the one asked with).
    pub next: u64,
    /// `true` when more entries follow than one page holds.
    pub more: bool,
}

/// `GET /v1/computers/{id}/egress/refused`: the last refused or failed
/// connections, newest first (what the panel shows beside the mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRefusals {
    /// The entries, newest first.
    pub entries: Vec<EgressLogEntry>,
}

/// The `since` of a log query: a sequence number, or a time (RFC 3339).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSince {
    /// Entries with a greater `seq`.
    Seq(u64),
    /// Entries at or after this time.
    Time(DateTime<Utc>),
}

impl FromStr for LogSince {
    type Err = RuleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(Self::Seq)
                .map_err(|_| RuleError::new(s, "sequence number too large"));
        }
        DateTime::parse_from_rfc3339(s)
            .map(|t| Self::Time(t.with_timezone(&Utc)))
            .map_err(|_| RuleError::new(s, "`since` is a sequence number or an RFC 3339 time"))
    }
}

#[cfg(test)]
#[path = "egress_policy_tests.rs"]
mod tests;
