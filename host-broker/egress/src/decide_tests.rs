use super::*;

fn policy(mode: &str, allow: &[&str], deny: &[&str]) -> EgressPolicy {
    EgressPolicy {
        mode: mode.parse().expect("mode"),
        allow: allow.iter().map(|r| r.parse().expect("rule")).collect(),
        deny: deny.iter().map(|r| r.parse().expect("rule")).collect(),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn decide(
    p: &EgressPolicy,
    host: &str,
    port: u16,
    resolved: &[&str],
    view: &HostView,
) -> Result<Vec<Pass>, Refusal> {
    let dest = Destination::parse(host).expect("dest");
    let name = check_name(p, &dest, port)?;
    let addrs: Vec<IpAddr> = resolved.iter().map(|a| ip(a)).collect();
    check_addresses(p, &dest, port, &name, &addrs, view)
}

const PUBLIC: &str = "203.0.113.10";

#[test]
fn off_refuses_everything_with_the_reason() {
    let p = policy("off", &["example.com", "0.0.0.0/0"], &[]);
    let e = decide(&p, "example.com", 443, &[PUBLIC], &HostView::default()).expect_err("off");
    assert_eq!(e.reason, "denied: egress is off for this desktop");
}

#[test]
fn allowlist_names_exact_wildcard_and_port() {
    let v = HostView::default();
    let p = policy(
        "allowlist",
        &["example.com", "*.corp.test", "pypi.org:443"],
        &[],
    );
    let ok = decide(&p, "example.com", 80, &[PUBLIC], &v).expect("exact");
    assert_eq!(ok[0].rule.as_deref(), Some("example.com"));
    assert_eq!(
        decide(&p, "a.corp.test", 8443, &[PUBLIC], &v).expect("wild")[0]
            .rule
            .as_deref(),
        Some("*.corp.test")
    );
    assert!(decide(&p, "pypi.org", 443, &[PUBLIC], &v).is_ok());
    let e = decide(&p, "pypi.org", 80, &[PUBLIC], &v).expect_err("port");
    assert_eq!(e.reason, "denied: pypi.org:80 not in the allow list");
    let e = decide(&p, "corp.test", 80, &[PUBLIC], &v).expect_err("apex");
    assert_eq!(e.reason, "denied: corp.test:80 not in the allow list");
    let e = decide(&p, "www.example.com", 443, &[PUBLIC], &v).expect_err("sub");
    assert_eq!(
        e.reason,
        "denied: www.example.com:443 not in the allow list"
    );
}

#[test]
fn allowlist_cidrs_with_and_without_ports() {
    let v = HostView::default();
    let p = policy(
        "allowlist",
        &["203.0.113.0/24", "198.51.100.7/32:8080"],
        &[],
    );
    let ok = decide(&p, "any.test", 1234, &[PUBLIC], &v).expect("cidr");
    assert_eq!(ok[0].rule.as_deref(), Some("203.0.113.0/24"));
    assert!(decide(&p, "198.51.100.7", 8080, &["198.51.100.7"], &v).is_ok());
    let e = decide(&p, "198.51.100.7", 8081, &["198.51.100.7"], &v).expect_err("port");
    assert_eq!(e.reason, "denied: 198.51.100.7:8081 not in the allow list");
}

#[test]
fn deny_rules_win_over_allow_in_every_mode() {
    let v = HostView::default();
    for mode in ["open", "allowlist"] {
        let p = policy(
            mode,
            &["*.example.com", "203.0.113.0/24"],
            &["bad.example.com"],
        );
        let e = decide(&p, "bad.example.com", 443, &[PUBLIC], &v).expect_err(mode);
        assert_eq!(
            e.reason,
            "denied: bad.example.com:443 matches deny rule bad.example.com"
        );
        assert_eq!(e.rule.as_deref(), Some("bad.example.com"));
        let p = policy(mode, &["*.example.com"], &["203.0.113.0/24:443"]);
        let e = decide(&p, "x.example.com", 443, &[PUBLIC], &v).expect_err(mode);
        assert!(
            e.reason.contains("matches deny rule 203.0.113.0/24:443"),
            "{}",
            e.reason
        );
        assert_eq!(e.rule.as_deref(), Some("203.0.113.0/24:443"));
        assert!(decide(&p, "x.example.com", 80, &[PUBLIC], &v).is_ok());
    }
}

#[test]
fn a_denied_address_among_others_is_skipped() {
    let p = policy("open", &[], &[]);
    let ok = decide(
        &p,
        "mixed.test",
        80,
        &["127.0.0.1", PUBLIC],
        &HostView::default(),
    )
    .expect("public one passes");
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].addr, ip(PUBLIC));
}

#[test]
fn every_denied_range_is_denied_in_open_and_for_allowed_names() {
    let v = HostView::default();
    for addr in [
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "172.20.0.1",
        "192.168.0.10",
        "169.254.169.254",
        "169.254.3.4",
        "fe80::1",
        "100.64.1.1",
        "fc00::5",
        "fd00::5",
        "224.0.0.251",
        "ff02::fb",
        "0.0.0.0",
        "::",
        "255.255.255.255",
        "::ffff:127.0.0.1",
        "::ffff:192.168.1.1",
        "::ffff:169.254.169.254",
    ] {
        let p = policy("open", &[], &[]);
        let e = decide(&p, "rebind.test", 80, &[addr], &v).expect_err(addr);
        assert!(
            e.reason
                .starts_with("denied: rebind.test:80 resolves only to denied addresses ("),
            "{addr}: {}",
            e.reason
        );
        // An allowed name that resolves only to a denied address (rebinding).
        let p = policy("allowlist", &["rebind.test", "0.0.0.0/0", "::/0"], &[]);
        let e = decide(&p, "rebind.test", 80, &[addr], &v).expect_err(addr);
        assert_eq!(e.rule.as_deref(), Some("rebind.test"), "{addr}");
        // The literal itself.
        let p = policy("open", &[], &[]);
        let e = decide(&p, addr, 80, &[addr], &v).expect_err(addr);
        assert!(e.reason.starts_with("denied: "), "{}", e.reason);
    }
}

#[test]
fn an_explicit_cidr_inside_a_denied_range_allows_it() {
    let v = HostView::default();
    let p = policy("allowlist", &["127.0.0.1/32:8080", "fd00::/8"], &[]);
    assert!(decide(&p, "site.test", 8080, &["127.0.0.1"], &v).is_ok());
    assert!(decide(&p, "site.test", 8080, &["::ffff:127.0.0.1"], &v).is_ok());
    assert!(decide(&p, "site.test", 8081, &["127.0.0.1"], &v).is_err());
    assert!(decide(&p, "v6.test", 22, &["fd00::9"], &v).is_ok());
    // A wide rule does not lift a range it is wider than.
    let p = policy("allowlist", &["0.0.0.0/0", "169.254.0.0/16"], &[]);
    let e = decide(&p, "meta.test", 80, &["169.254.169.254"], &v).expect_err("metadata");
    assert!(
        e.reason
            .contains("169.254.169.254 is link-local (cloud metadata)"),
        "{}",
        e.reason
    );
    assert!(decide(&p, "ll.test", 80, &["169.254.1.1"], &v).is_ok());
    assert!(decide(&p, "lo.test", 80, &["127.0.0.1"], &v).is_err());
    // Open mode honours the explicit rule too.
    let p = policy("open", &["10.0.0.0/8"], &[]);
    assert!(decide(&p, "in.test", 80, &["10.9.9.9"], &v).is_ok());
    assert!(decide(&p, "in.test", 80, &["192.168.0.1"], &v).is_err());
}

#[test]
fn the_hosts_own_addresses_need_a_single_address_rule() {
    let mut v = HostView::default();
    v.own.insert(ip(PUBLIC));
    let p = policy("open", &["203.0.113.0/24"], &[]);
    let e = decide(&p, "me.test", 80, &[PUBLIC], &v).expect_err("own");
    assert!(
        e.reason.contains("is an address of this host"),
        "{}",
        e.reason
    );
    let p = policy("open", &["203.0.113.10/32"], &[]);
    assert!(decide(&p, "me.test", 80, &[PUBLIC], &v).is_ok());
}

#[test]
fn the_brokers_own_api_is_never_reachable() {
    let v = HostView {
        own: [ip("192.0.2.55")].into(),
        protected: vec![
            "127.0.0.1:7070".parse().expect("sock"),
            "[::]:9000".parse().expect("sock"),
        ],
    };
    let p = policy(
        "allowlist",
        &["127.0.0.0/8", "::1/128", "192.0.2.55/32"],
        &[],
    );
    let e = decide(&p, "127.0.0.1", 7070, &["127.0.0.1"], &v).expect_err("api");
    assert_eq!(
        e.reason,
        "denied: 127.0.0.1:7070: 127.0.0.1 is the broker's own API"
    );
    assert!(decide(&p, "127.0.0.1", 7071, &["127.0.0.1"], &v).is_ok());
    assert!(decide(&p, "x.test", 9000, &["::1"], &v).is_err());
    assert!(decide(&p, "x.test", 9000, &["127.0.0.5"], &v).is_err());
}

#[test]
fn port_zero_is_refused() {
    let p = policy("open", &[], &[]);
    let e = decide(&p, "example.com", 0, &[PUBLIC], &HostView::default()).expect_err("0");
    assert_eq!(e.reason, "denied: port 0 of example.com");
}

#[test]
fn recheck_follows_the_new_policy() {
    let v = HostView::default();
    let dest = Destination::parse("dl.test").expect("dest");
    let open = policy("allowlist", &["127.0.0.1/32:8080"], &[]);
    assert!(recheck(&open, &dest, ip("127.0.0.1"), 8080, &v).is_ok());
    let denied = policy("allowlist", &["127.0.0.1/32:8080"], &["dl.test"]);
    assert!(recheck(&denied, &dest, ip("127.0.0.1"), 8080, &v).is_err());
    let off = policy("off", &[], &[]);
    assert!(recheck(&off, &dest, ip("127.0.0.1"), 8080, &v).is_err());
    let other = policy("allowlist", &["127.0.0.1/32:9090"], &[]);
    assert!(recheck(&other, &dest, ip("127.0.0.1"), 8080, &v).is_err());
}

#[test]
fn ipv6_rules_see_the_ipv6_form_and_embedded_addresses_are_checked_as_ipv4() {
    let v = HostView::default();
    // An IPv6 deny rule sees the address as resolved, never mapped away.
    for (rule, addr) in [
        ("64:ff9b::/96", "64:ff9b::808:808"),
        ("2002::/16", "2002:808:808::1"),
        ("::ffff:0:0/96", "::ffff:8.8.8.8"),
        ("2606:4700::/32", "2606:4700::1111"),
    ] {
        let p = policy("open", &[], &[rule]);
        let e = decide(&p, addr, 443, &[addr], &v).expect_err(addr);
        let canonical = rule.parse::<EgressRule>().expect("rule").to_string();
        assert_eq!(e.rule, Some(canonical), "{addr}: {}", e.reason);
        assert!(
            decide(&policy("open", &[], &[]), addr, 443, &[addr], &v).is_ok(),
            "{addr}"
        );
    }
    // An IPv4 deny rule sees every IPv4 address an IPv6 one embeds.
    let p = policy("open", &[], &["8.8.8.0/24"]);
    for addr in [
        "8.8.8.8",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ] {
        let e = decide(&p, "dns.test", 53, &[addr], &v).expect_err(addr);
        assert_eq!(e.rule.as_deref(), Some("8.8.8.0/24"), "{addr}");
    }
    // Allow rules match either form.
    let p = policy("allowlist", &["2606:4700::/32", "8.8.8.8/32"], &[]);
    assert!(decide(&p, "cf.test", 443, &["2606:4700::1111"], &v).is_ok());
    assert!(decide(&p, "dns.test", 443, &["64:ff9b::808:808"], &v).is_ok());
    assert!(decide(&p, "dns.test", 443, &["2002:808:808::1"], &v).is_ok());
    assert!(decide(&p, "other.test", 443, &["2606:4701::1"], &v).is_err());
}

#[test]
fn teredo_local_nat64_and_translated_space_are_denied_and_what_they_embed_too() {
    let v = HostView::default();
    let open = policy("open", &[], &[]);
    for (addr, what) in [
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("64:ff9b:1::808:808", "local-use NAT64"),
        ("::ffff:0:808:808", "IPv4-translated"),
    ] {
        let e = decide(&open, addr, 443, &[addr], &v).expect_err(addr);
        assert!(
            e.reason.ends_with(&format!("is {what}")),
            "{addr}: {}",
            e.reason
        );
    }
    // A rule inside Teredo lifts Teredo, not the loopback its client embeds.
    let p = policy("open", &["2001::/32"], &[]);
    assert!(decide(
        &p,
        "t.test",
        443,
        &["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
        &v
    )
    .is_ok());
    let lo = "2001:0:4136:e378:8000:63bf:80ff:fffe";
    let e = decide(&p, "t.test", 443, &[lo], &v).expect_err("teredo loopback");
    assert!(e.reason.contains("is loopback"), "{}", e.reason);
    // A mapped loopback is lifted by an IPv4 rule, not an IPv6 one.
    let p = policy("allowlist", &["::ffff:127.0.0.1/128:8080"], &[]);
    assert!(decide(&p, "l.test", 8080, &["::ffff:127.0.0.1"], &v).is_err());
    let p = policy("allowlist", &["127.0.0.1/32:8080"], &[]);
    assert!(decide(&p, "l.test", 8080, &["::ffff:127.0.0.1"], &v).is_ok());
    assert!(decide(&p, "l.test", 8080, &["64:ff9b::7f00:1"], &v).is_ok());
}
