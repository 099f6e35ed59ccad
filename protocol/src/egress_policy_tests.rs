//! Tests of the egress policy: parsing, matching and validation.

use super::*;

fn rule(s: &str) -> EgressRule {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn host_rules_parse_and_print_canonically() {
    assert_eq!(rule("Example.COM").to_string(), "example.com");
    assert_eq!(rule("example.com.").to_string(), "example.com");
    assert_eq!(rule("*.example.com").to_string(), "*.example.com");
    assert_eq!(rule("pypi.org:443").port, Some(443));
    assert_eq!(
        rule("*.pythonhosted.org:443").to_string(),
        "*.pythonhosted.org:443"
    );
    assert_eq!(rule("localhost").to_string(), "localhost");
}

#[test]
fn cidr_rules_parse_with_and_without_ports() {
    let r = rule("203.0.113.0/24");
    assert_eq!(r.port, None);
    assert!(r.matches_addr("203.0.113.9".parse().unwrap(), 1));
    assert!(!r.matches_addr("203.0.114.1".parse().unwrap(), 1));
    let r = rule("10.1.2.3/32:8080");
    assert!(r.matches_addr("10.1.2.3".parse().unwrap(), 8080));
    assert!(!r.matches_addr("10.1.2.3".parse().unwrap(), 8081));
    let r = rule("fd00::/8");
    assert!(r.matches_addr("fd12::1".parse().unwrap(), 443));
    assert!(!r.matches_addr("fe80::1".parse().unwrap(), 443));
    let r = rule("::1/128:443");
    assert_eq!(r.to_string(), "::1/128:443");
    assert!(r.matches_addr("::1".parse().unwrap(), 443));
    assert!(!r.matches_addr("127.0.0.1".parse().unwrap(), 443));
    assert_eq!(rule("0.0.0.0/0").to_string(), "0.0.0.0/0");
    assert!(rule("0.0.0.0/0").matches_addr("8.8.8.8".parse().unwrap(), 53));
}

#[test]
fn bad_rules_are_refused_naming_them() {
    for bad in [
        "",
        " example.com",
        "exa mple.com",
        "*.",
        "*",
        "*example.com",
        "ex*ample.com",
        "-bad.com",
        "bad-.com",
        "a..b",
        "example.com:0",
        "example.com:70000",
        "example.com:",
        "example.com:http",
        "example.com:+80",
        "10.1.2.3",
        "::1",
        "[::1]:443",
        "10.1.2.3/33",
        "10.1.2.3/24",
        "10.1.2.0/",
        "10.1.2.0/x",
        "10.1.2.0/24:0",
        "10.1.2.0/24:65536",
        "fd00::/129",
        "fd00::1/8",
        "300.1.1.1/32",
        "1.2.3",
        "ünicode.de",
        "tab\there.com",
        "new\nline.com",
        "under/score",
    ] {
        let e = bad.parse::<EgressRule>().expect_err(bad);
        assert!(e.to_string().starts_with("bad egress rule `"), "{e}");
        if !bad.is_empty() && bad.is_ascii() && !bad.contains(['\t', '\n']) {
            assert!(e.to_string().contains(bad), "{e} names {bad}");
        }
    }
    let long = format!("{}.com", "a".repeat(300));
    assert!(long.parse::<EgressRule>().is_err());
    let label = format!("{}.com", "a".repeat(64));
    assert!(label.parse::<EgressRule>().is_err());
}

#[test]
fn a_policy_with_a_bad_rule_does_not_deserialize_and_names_it() {
    let e = serde_json::from_str::<EgressPolicy>(
        r#"{"mode":"allowlist","allow":["pypi.org:443","10.0.0.1/8"]}"#,
    )
    .expect_err("bad");
    assert!(e.to_string().contains("10.0.0.1/8"), "{e}");
    assert!(serde_json::from_str::<EgressPolicy>(r#"{"mode":"closed"}"#).is_err());
    assert!(serde_json::from_str::<EgressPolicy>(r#"{"mode":"off","alow":[]}"#).is_err());
    let p: EgressPolicy = serde_json::from_str(r#"{"mode":"open"}"#).expect("open");
    assert_eq!(p, EgressPolicy::of_mode(EgressMode::Open));
    let p: EgressPolicy =
        serde_json::from_str(r#"{"mode":"allowlist","allow":["*.Example.com:443"]}"#).expect("ok");
    assert_eq!(
        serde_json::to_value(&p).expect("json")["allow"][0],
        "*.example.com:443"
    );
}

#[test]
fn wildcards_match_below_the_domain_only() {
    let r = rule("*.example.com");
    assert!(r.matches_host("a.example.com", 80));
    assert!(r.matches_host("a.b.example.com", 80));
    assert!(!r.matches_host("example.com", 80));
    assert!(!r.matches_host("badexample.com", 80));
    assert!(!r.matches_host("example.com.evil", 80));
    let r = rule("pypi.org:443");
    assert!(r.matches_host("pypi.org", 443));
    assert!(!r.matches_host("pypi.org", 80));
    assert!(!r.matches_host("www.pypi.org", 443));
    assert!(!rule("10.0.0.0/8").matches_host("10.0.0.1", 80));
}

#[test]
fn destinations_parse_names_and_literals() {
    assert_eq!(
        Destination::parse("Example.com").unwrap(),
        Destination::Name("example.com".into())
    );
    assert!(matches!(
        Destination::parse("[::1]").unwrap(),
        Destination::Addr(_)
    ));
    assert!(matches!(
        Destination::parse("::ffff:127.0.0.1").unwrap(),
        Destination::Addr(_)
    ));
    assert!(matches!(
        Destination::parse("127.0.0.1").unwrap(),
        Destination::Addr(_)
    ));
    for bad in [
        "",
        "a\u{7}b.com",
        "a b",
        "0x7f.1",
        "127.1",
        "a\r\nHost: x",
        "é.com",
    ] {
        assert!(Destination::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn since_is_a_seq_or_a_time() {
    assert_eq!("42".parse::<LogSince>().unwrap(), LogSince::Seq(42));
    assert!(matches!(
        "2026-12-01T10:00:00Z".parse::<LogSince>().unwrap(),
        LogSince::Time(_)
    ));
    assert!("yesterday".parse::<LogSince>().is_err());
    assert!("99999999999999999999".parse::<LogSince>().is_err());
}
