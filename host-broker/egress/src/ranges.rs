//! The address ranges no desktop reaches in any mode unless an explicit
//! CIDR rule inside the range names them: loopback, private, link-local
//! (the cloud metadata address among them), CGNAT, ULA, multicast,
//! unspecified, broadcast and reserved space, and IPv6 forms that embed an
//! IPv4 address (mapped, compatible, NAT64, 6to4), judged by the address
//! they embed.
//!
//! This module is a pure table; it never resolves or dials.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dormouse_protocol::egress_policy::Cidr;

/// A range no desktop reaches by default, and what it is called in a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeniedRange {
    /// The range.
    pub cidr: Cidr,
    /// What it is, for the reason line (`loopback`, `private (RFC 1918)`).
    pub what: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8, what: &'static str) -> DeniedRange {
    DeniedRange {
        cidr: Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        },
        what,
    }
}

const fn v6(s: [u16; 8], prefix: u8, what: &'static str) -> DeniedRange {
    DeniedRange {
        cidr: Cidr {
            addr: IpAddr::V6(Ipv6Addr::new(
                s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
            )),
            prefix,
        },
        what,
    }
}

/// Every denied range, most specific first where they nest.
pub const DENIED: &[DeniedRange] = &[
    v4(255, 255, 255, 255, 32, "broadcast"),
    v4(0, 0, 0, 0, 8, "unspecified (this network)"),
    v4(10, 0, 0, 0, 8, "private (RFC 1918)"),
    v4(172, 16, 0, 0, 12, "private (RFC 1918)"),
    v4(192, 168, 0, 0, 16, "private (RFC 1918)"),
    v4(100, 64, 0, 0, 10, "shared (CGNAT)"),
    v4(127, 0, 0, 0, 8, "loopback"),
    v4(169, 254, 169, 254, 32, "link-local (cloud metadata)"),
    v4(169, 254, 0, 0, 16, "link-local"),
    v4(192, 0, 0, 0, 24, "IETF protocol assignments"),
    v4(198, 18, 0, 0, 15, "benchmarking"),
    v4(224, 0, 0, 0, 4, "multicast"),
    v4(240, 0, 0, 0, 4, "reserved"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96, "IPv4-compatible"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local (ULA)"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
    v6([0x0100, 0, 0, 0, 0, 0, 0, 0], 64, "discard"),
];

/// The IPv4 address an IPv6 address stands for, if it embeds one: mapped
/// (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`).
pub fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = a.to_ipv4_mapped() {
        return Some(v4);
    }
    let o = a.octets();
    if o[..12] == [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0] {
        return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if o[..2] == [0x20, 0x02] {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// The address checks are made on: an IPv6 form embedding an IPv4 address
/// is judged as that IPv4 address.
pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(a, IpAddr::V4),
        IpAddr::V4(_) => a,
    }
}

/// The denied range `a` lies in (judged on its canonical form), if any.
pub fn denied_range(a: IpAddr) -> Option<&'static DeniedRange> {
    let a = canonical(a);
    DENIED.iter().find(|r| r.cidr.contains(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(s: &str) -> Option<&'static str> {
        denied_range(s.parse().expect("addr")).map(|r| r.what)
    }

    #[test]
    fn every_denied_range_is_denied() {
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("::1", "loopback"),
            ("10.0.0.1", "private (RFC 1918)"),
            ("172.16.0.1", "private (RFC 1918)"),
            ("172.31.255.255", "private (RFC 1918)"),
            ("192.168.1.1", "private (RFC 1918)"),
            ("169.254.169.254", "link-local (cloud metadata)"),
            ("169.254.1.1", "link-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("100.64.0.1", "shared (CGNAT)"),
            ("100.127.255.255", "shared (CGNAT)"),
            ("fc00::1", "unique local (ULA)"),
            ("fd12:3456::1", "unique local (ULA)"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("ff02::1", "multicast"),
            ("0.0.0.0", "unspecified (this network)"),
            ("::", "unspecified"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.1.2.3", "private (RFC 1918)"),
            ("::ffff:169.254.169.254", "link-local (cloud metadata)"),
            ("64:ff9b::7f00:1", "loopback"),
            ("2002:a00:1::", "private (RFC 1918)"),
            ("::7f00:1", "IPv4-compatible"),
        ] {
            assert_eq!(what(addr), Some(kind), "{addr}");
        }
    }

    #[test]
    fn public_addresses_are_not_denied() {
        for addr in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "172.15.255.255",
            "100.128.0.1",
            "100.63.255.255",
            "203.0.113.7",
            "169.253.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(what(addr), None, "{addr}");
        }
    }
}
