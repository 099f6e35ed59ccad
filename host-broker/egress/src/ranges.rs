//! The address ranges no desktop reaches in any mode unless an explicit
//! CIDR rule inside the range names them: loopback, private, link-local
//! (the cloud metadata address among them), CGNAT, ULA, multicast,
//! unspecified, broadcast and reserved space, Teredo, local-use NAT64 and
//! IPv4-translated space; and the IPv4 addresses an IPv6 address embeds
//! (mapped, translated, compatible, NAT64, 6to4, Teredo), so that every
//! check sees an address in each of its forms ([`forms`]): as resolved, in
//! its own family, and as each IPv4 address it embeds.
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
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo"),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use NAT64"),
    v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96, "IPv4-translated"),
];

/// The IPv4 addresses an IPv6 address embeds, if any: mapped
/// (`::ffff:0:0/96`), IPv4-translated (`::ffff:0:0:0/96`), IPv4-compatible
/// (`::/96`, past `::` and `::1`), NAT64 (`64:ff9b::/96`, and the last 32
/// bits of local-use `64:ff9b:1::/48`), 6to4 (`2002::/16`), and Teredo
/// (`2001::/32`: the server, then the client, whose bits are inverted).
pub fn embedded_v4(a: Ipv6Addr) -> Vec<Ipv4Addr> {
    let o = a.octets();
    let at = |i: usize| Ipv4Addr::new(o[i], o[i + 1], o[i + 2], o[i + 3]);
    let s = a.segments();
    let last32 = match s {
        [0, 0, 0, 0, 0, 0xffff, _, _]
        | [0, 0, 0, 0, 0xffff, 0, _, _]
        | [0x64, 0xff9b, 0, 0, 0, 0, _, _]
        | [0x64, 0xff9b, 1, _, _, _, _, _] => true,
        [0, 0, 0, 0, 0, 0, hi, lo] => hi != 0 || lo > 1,
        _ => false,
    };
    if last32 {
        return vec![at(12)];
    }
    match s[0] {
        0x2002 => vec![at(2)],
        0x2001 if s[1] == 0 => {
            let client = Ipv4Addr::from(!u32::from(at(12)));
            vec![at(4), client]
        }
        _ => Vec::new(),
    }
}

/// Every form an address is checked in: as resolved, then each IPv4
/// address it embeds.
pub fn forms(a: IpAddr) -> Vec<IpAddr> {
    let mut out = vec![a];
    if let IpAddr::V6(v6) = a {
        out.extend(embedded_v4(v6).into_iter().map(IpAddr::V4));
    }
    out
}

/// One form of an address as an IPv4 address where it is one in all but
/// family (mapped, `::ffff:a.b.c.d`), else as it is: how the host's own
/// interface addresses are kept.
pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        IpAddr::V4(_) => a,
    }
}

/// Each form of `a` that lies in a denied range, with the range (the form
/// as resolved first).
pub fn denied_forms(a: IpAddr) -> Vec<(IpAddr, &'static DeniedRange)> {
    forms(a)
        .into_iter()
        .filter_map(|f| DENIED.iter().find(|r| r.cidr.contains(f)).map(|r| (f, r)))
        .collect()
}

/// The first denied range a form of `a` lies in, if any.
pub fn denied_range(a: IpAddr) -> Option<&'static DeniedRange> {
    denied_forms(a).first().map(|(_, r)| *r)
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
            ("64:ff9b::a9fe:a9fe", "link-local (cloud metadata)"),
            ("2002:a00:1::", "private (RFC 1918)"),
            ("2002:7f00:1::1", "loopback"),
            ("::7f00:1", "IPv4-compatible"),
            ("::808:808", "IPv4-compatible"),
            ("2001::1", "Teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("64:ff9b:1::1", "local-use NAT64"),
            ("64:ff9b:1:ffff::808:808", "local-use NAT64"),
            ("::ffff:0:808:808", "IPv4-translated"),
            ("::ffff:0:7f00:1", "IPv4-translated"),
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
            "2002:808:808::1",
            "2001:4860:4860::8888",
            "2001:db9::1",
            "64:ff9a::7f00:1",
            "64:ff9b:2::7f00:1",
        ] {
            assert_eq!(what(addr), None, "{addr}");
        }
    }

    fn v4s(s: &str) -> Vec<String> {
        embedded_v4(s.parse().expect("v6"))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_embedding_form_yields_its_ipv4_address() {
        for (addr, embedded) in [
            ("::ffff:10.1.2.3", &["10.1.2.3"][..]),
            ("::ffff:0:10.1.2.3", &["10.1.2.3"]),
            ("::10.1.2.3", &["10.1.2.3"]),
            ("64:ff9b::10.1.2.3", &["10.1.2.3"]),
            ("64:ff9b:1:2::10.1.2.3", &["10.1.2.3"]),
            ("2002:a01:203::1", &["10.1.2.3"]),
            // Teredo: server 65.54.227.120, client 192.0.2.45 inverted.
            (
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                &["65.54.227.120", "192.0.2.45"],
            ),
            ("::", &[]),
            ("::1", &[]),
            ("2606:4700::1111", &[]),
            ("fe80::1", &[]),
        ] {
            assert_eq!(v4s(addr), embedded, "{addr}");
        }
    }

    #[test]
    fn an_address_is_checked_as_resolved_and_as_what_it_embeds() {
        let f = |s: &str| -> Vec<String> {
            forms(s.parse().expect("addr"))
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(f("8.8.8.8"), ["8.8.8.8"]);
        assert_eq!(f("::ffff:8.8.8.8"), ["::ffff:8.8.8.8", "8.8.8.8"]);
        assert_eq!(f("64:ff9b::808:808"), ["64:ff9b::808:808", "8.8.8.8"]);
        assert_eq!(f("2606:4700::1111"), ["2606:4700::1111"]);
        // The IPv6 form is judged first: a translated loopback is
        // IPv4-translated space, then loopback.
        let hits: Vec<&str> = denied_forms("::ffff:0:7f00:1".parse().expect("addr"))
            .iter()
            .map(|(_, r)| r.what)
            .collect();
        assert_eq!(hits, ["IPv4-translated", "loopback"]);
    }
}
