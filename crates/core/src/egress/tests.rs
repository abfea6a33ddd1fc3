use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;

use super::*;
use crate::policy::EgressRules;

/// The shared table of hostile URLs (also run through the CLI binary).
const HOSTILE: &str = include_str!("hostile_urls.tsv");

fn hostile_rows() -> Vec<(&'static str, RefusalKind, &'static str)> {
    HOSTILE
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            assert_eq!(cols.len(), 3, "bad table row {l:?}");
            let kind = match cols[1] {
                "egress_refused" => RefusalKind::EgressRefused,
                "invalid_url" => RefusalKind::InvalidUrl,
                other => panic!("bad kind {other:?} in {l:?}"),
            };
            (cols[0], kind, cols[2])
        })
        .collect()
}

fn guard() -> EgressGuard {
    EgressGuard::new(&EgressSettings::default(), &EgressRules::default()).unwrap()
}

fn guard_with(settings: EgressSettings) -> EgressGuard {
    EgressGuard::new(&settings, &EgressRules::default()).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// check_url, then (for what passes) check_resolved against the literal itself, as the dispatcher does.
fn judge(g: &EgressGuard, url: &str, addrs: &[IpAddr]) -> Result<Target, Refusal> {
    let t = g.check_url(url)?;
    let addrs: Vec<IpAddr> = match (&t.host, addrs.is_empty()) {
        (TargetHost::Ip(ip), true) => vec![*ip],
        _ => addrs.to_vec(),
    };
    g.check_resolved(&t, &addrs)?;
    Ok(t)
}

#[test]
fn hostile_table_is_refused_with_its_reason() {
    let rows = hostile_rows();
    assert!(rows.len() >= 60, "the table must hold at least 60 URLs, has {}", rows.len());
    let g = guard();
    let mut failures = Vec::new();
    for (url, kind, fragment) in &rows {
        match judge(&g, url, &[]) {
            Ok(t) => failures.push(format!("{url:?} was allowed (host {})", t.host)),
            Err(r) if r.kind != *kind || !r.reason.contains(fragment) => {
                failures.push(format!("{url:?}: got {} {:?}, want {kind} containing {fragment:?}", r.kind, r.reason))
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{} rows failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_refused_literal_is_refused_when_a_name_resolves_to_it() {
    let g = guard();
    let target = g.check_url("https://hooks.example.com/in").unwrap();
    let public = ip("93.184.216.34");
    let mut checked = 0;
    for (url, _, fragment) in hostile_rows() {
        // Only rows whose refusal is about an address (not the scheme, name or URL shape).
        let Ok(parsed) = url::Url::parse(url) else { continue };
        let addr = match parsed.host() {
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            _ => continue,
        };
        if !["https"].contains(&parsed.scheme()) || parsed.port() == Some(0) || !parsed.username().is_empty() {
            continue;
        }
        let r = g.check_resolved(&target, &[public, addr]).expect_err(url);
        assert_eq!(r.kind, RefusalKind::EgressRefused);
        assert!(r.reason.starts_with("hooks.example.com resolves to a refused address: "), "{}", r.reason);
        assert!(r.reason.contains(fragment), "{url}: {:?} lacks {fragment:?}", r.reason);
        checked += 1;
    }
    assert!(checked >= 60, "only {checked} address rows");
}

#[test]
fn number_forms_are_judged_as_addresses_under_http_too() {
    let g = guard_with(EgressSettings { allow_http: true, ..Default::default() });
    for url in [
        "http://2130706433/",
        "http://0x7f.1/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://127.000.000.001/",
        "http://１２７．０．０．１/",
        "http://127。0。0。1/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://%31%32%37%2e%30%2e%30%2e%31/",
    ] {
        let r = g.check_url(url).expect_err(url);
        assert!(r.reason.contains("127.0.0.1") && r.reason.contains("loopback"), "{url}: {}", r.reason);
    }
    let r = g.check_url("http://[0:0:0:0:0:ffff:a00:1]/").unwrap_err();
    assert_eq!(r.reason, "::ffff:10.0.0.1 embeds 10.0.0.1, which is private (RFC 1918)");
    let r = g.check_url("http://localhost./").unwrap_err();
    assert_eq!(r.reason, "localhost is a blocked hostname");
}

#[test]
fn reasons_read_as_documented() {
    let g = guard();
    let reason = |u: &str| g.check_url(u).unwrap_err().reason;
    assert_eq!(reason("https://10.0.0.7/"), "10.0.0.7 is private (RFC 1918)");
    assert_eq!(reason("https://169.254.169.254/"), "169.254.169.254 is a cloud metadata address");
    assert_eq!(reason("http://example.com/"), "scheme http is not allowed (allowed: https)");
    assert_eq!(reason("https://u:p@example.com/"), "URLs with user info are refused");
    assert_eq!(reason("https://metadata.google.internal/"), "metadata.google.internal is a blocked hostname");
    assert_eq!(reason("https://[::ffff:127.0.0.1]/"), "::ffff:127.0.0.1 embeds 127.0.0.1, which is loopback");
}

#[test]
fn public_literals_and_names_pass() {
    let g = guard();
    for (url, host, port) in [
        ("https://93.184.216.34/", TargetHost::Ip(ip("93.184.216.34")), 443),
        ("https://[2606:4700::1111]/", TargetHost::Ip(ip("2606:4700::1111")), 443),
        ("https://[::ffff:8.8.8.8]:8443/x", TargetHost::Ip(ip("::ffff:8.8.8.8")), 8443),
        ("https://[64:ff9b::808:808]/", TargetHost::Ip(ip("64:ff9b::808:808")), 443),
        ("https://1.1.1.1:8443/hooks?a=b", TargetHost::Ip(ip("1.1.1.1")), 8443),
        ("https://Hooks.Example.COM./in", TargetHost::Name("hooks.example.com".into()), 443),
        ("https://bücher.example/", TargetHost::Name("xn--bcher-kva.example".into()), 443),
        ("https://localhost.example.com/", TargetHost::Name("localhost.example.com".into()), 443),
        ("https://my_host.example.com/", TargetHost::Name("my_host.example.com".into()), 443),
    ] {
        let t = g.check_url(url).unwrap_or_else(|r| panic!("{url}: {r}"));
        assert_eq!((t.host.clone(), t.port), (host, port), "{url}");
        if let TargetHost::Ip(a) = t.host {
            g.check_resolved(&t, &[a]).unwrap();
        }
    }
}

#[test]
fn target_url_is_the_parsed_url() {
    let t = guard().check_url("https://93.184.216.34\\hook?x=1").unwrap();
    assert_eq!(t.url.as_str(), "https://93.184.216.34/hook?x=1");
}

#[test]
fn a_name_resolving_to_public_and_private_is_refused() {
    let g = guard();
    let t = g.check_url("https://hooks.example.com/").unwrap();
    g.check_resolved(&t, &[ip("93.184.216.34"), ip("2606:4700::1111")]).unwrap();
    let r = g.check_resolved(&t, &[ip("93.184.216.34"), ip("10.0.0.7")]).unwrap_err();
    assert_eq!(r.kind, RefusalKind::EgressRefused);
    assert_eq!(r.reason, "hooks.example.com resolves to a refused address: 10.0.0.7 is private (RFC 1918)");
    let r = g.check_resolved(&t, &[]).unwrap_err();
    assert_eq!(r.reason, "hooks.example.com resolved to no addresses");
    assert_eq!(r.outcome(), Outcome::EgressRefused);
}

#[test]
fn loopback_refused_unless_allow_listed_with_http() {
    assert!(guard().check_url("http://127.0.0.1:8080/").is_err());
    let g = guard_with(EgressSettings { allow_ranges: vec!["127.0.0.0/8".into()], allow_http: true, ..Default::default() });
    let t = g.check_url("http://127.0.0.1:8080/hook").unwrap();
    g.check_resolved(&t, &[ip("127.0.0.1")]).unwrap();
    // The mapped form of an allowed IPv4 address is the same host.
    g.check_url("http://[::ffff:127.0.0.1]:8080/").unwrap();
    // The allow-list does not open ::1, other private ranges, or names blocked by name.
    assert!(g.check_url("http://[::1]/").is_err());
    assert!(g.check_url("http://10.0.0.1/").is_err());
    assert!(g.check_url("http://localhost:8080/").is_err());
    let t = g.check_url("http://receiver.test/").unwrap();
    g.check_resolved(&t, &[ip("127.0.0.1")]).unwrap();
    assert!(g.check_resolved(&t, &[ip("127.0.0.1"), ip("192.168.0.1")]).is_err());
    assert_eq!(g.startup_warnings().len(), 2, "{:?}", g.startup_warnings());
    assert!(g.startup_warnings()[0].contains("127.0.0.0/8"));
}

#[test]
fn metadata_is_refused_even_inside_an_allow_range() {
    let g = guard_with(EgressSettings { allow_ranges: vec!["169.254.0.0/16".into(), "0.0.0.0/0".into()], ..Default::default() });
    g.check_url("https://169.254.1.1/").unwrap();
    for url in ["https://169.254.169.254/", "https://[::ffff:169.254.169.254]/", "https://168.63.129.16/"] {
        let r = g.check_url(url).unwrap_err();
        assert!(r.reason.contains("cloud metadata"), "{url}: {}", r.reason);
    }
}

#[test]
fn deny_ranges_and_blocked_names_from_config_and_policy() {
    let rules = EgressRules {
        allowed_schemes: vec!["https".into()],
        blocked_hostnames: vec!["*.corp.example".into()],
        deny_ranges: vec!["93.184.216.0/24".into()],
    };
    let settings = EgressSettings {
        deny_ranges: vec!["2606:4700::/32".into()],
        blocked_hostnames: vec!["Evil.Example.".into()],
        // Deny wins over allow.
        allow_ranges: vec!["93.184.216.0/24".into()],
        ..Default::default()
    };
    let g = EgressGuard::new(&settings, &rules).unwrap();
    let reason = |u: &str| g.check_url(u).unwrap_err().reason;
    assert_eq!(reason("https://93.184.216.34/"), "93.184.216.34 is in a range denied by the delivery policy (93.184.216.0/24)");
    assert_eq!(
        reason("https://[::ffff:93.184.216.34]/"),
        "::ffff:93.184.216.34 embeds 93.184.216.34, which is in a range denied by the delivery policy (93.184.216.0/24)"
    );
    assert_eq!(reason("https://[2606:4700::1111]/"), "2606:4700::1111 is in a range denied by the operator (2606:4700::/32)");
    assert_eq!(reason("https://evil.example/"), "evil.example is a blocked hostname");
    assert_eq!(reason("https://a.b.corp.example/"), "a.b.corp.example is a blocked hostname");
    // `*.x` blocks names below x, not x itself, nor names merely ending in the same letters.
    g.check_url("https://corp.example/").unwrap();
    g.check_url("https://notcorp.example/").unwrap();
    g.check_url("https://1.1.1.1/").unwrap();
}

#[test]
fn ports() {
    let g = guard_with(EgressSettings { allowed_ports: Some(vec![443, 8443]), ..Default::default() });
    g.check_url("https://93.184.216.34/").unwrap();
    g.check_url("https://93.184.216.34:8443/").unwrap();
    let r = g.check_url("https://93.184.216.34:22/").unwrap_err();
    assert_eq!((r.kind, r.reason.as_str()), (RefusalKind::EgressRefused, "port 22 is not allowed (allowed: 443, 8443)"));
    // Without a list every valid port is allowed.
    guard().check_url("https://93.184.216.34:22/").unwrap();
}

#[test]
fn schemes_from_policy_and_settings() {
    let http_policy = EgressRules { allowed_schemes: vec!["HTTPS".into(), "http".into()], ..Default::default() };
    let g = EgressGuard::new(&EgressSettings::default(), &http_policy).unwrap();
    assert_eq!(g.allowed_schemes(), ["https", "http"]);
    g.check_url("http://93.184.216.34/").unwrap();
    let g = guard_with(EgressSettings { allow_http: true, ..Default::default() });
    assert_eq!(g.allowed_schemes(), ["https", "http"]);
    let bad = EgressRules { allowed_schemes: vec!["https".into(), "ftp".into()], ..Default::default() };
    let e = EgressGuard::new(&EgressSettings::default(), &bad).unwrap_err();
    assert_eq!(e.key, "policy.egress.allowed_schemes[1]");
}

#[test]
fn settings_validation_names_the_key() {
    let bad = |s: EgressSettings| s.validate().unwrap_err().to_string();
    let e = bad(EgressSettings { allow_ranges: vec!["127.0.0.0/8".into(), "10.0.0.0/33".into()], ..Default::default() });
    assert!(e.starts_with(r#"egress.allow_ranges[1]: "10.0.0.0/33" is not a CIDR range"#), "{e}");
    let e = bad(EgressSettings { deny_ranges: vec!["10.1.2.3/8".into()], ..Default::default() });
    assert!(e.starts_with("egress.deny_ranges[0]: ") && e.contains("did you mean 10.0.0.0/8?"), "{e}");
    let e = bad(EgressSettings { blocked_hostnames: vec!["ok.example".into(), "10.0.0.1".into()], ..Default::default() });
    assert!(e.starts_with("egress.blocked_hostnames[1]: "), "{e}");
    let e = bad(EgressSettings { allowed_ports: Some(vec![443, 0]), ..Default::default() });
    assert!(e.starts_with("egress.allowed_ports[1]: "), "{e}");
    let e = bad(EgressSettings { allowed_ports: Some(vec![]), ..Default::default() });
    assert!(e.starts_with("egress.allowed_ports: "), "{e}");
    let e = bad(EgressSettings { dns_cache_ttl_s: 86_401, ..Default::default() });
    assert!(e.starts_with("egress.dns_cache_ttl_s: 86401 is more than a day"), "{e}");
    let e = bad(EgressSettings { dns_negative_ttl_s: 3_601, ..Default::default() });
    assert!(e.starts_with("egress.dns_negative_ttl_s: "), "{e}");
    let e = bad(EgressSettings { dns_cache_max_entries: 0, ..Default::default() });
    assert!(e.starts_with("egress.dns_cache_max_entries: must be between 1 and"), "{e}");
    EgressSettings { dns_cache_ttl_s: 0, dns_negative_ttl_s: 0, ..Default::default() }.validate().unwrap();
    EgressSettings::default().validate().unwrap();
    let e =
        EgressGuard::new(&EgressSettings::default(), &EgressRules { deny_ranges: vec!["nope".into()], ..Default::default() }).unwrap_err();
    assert_eq!(e.key, "policy.egress.deny_ranges[0]");
}

#[test]
fn settings_parse_from_toml() {
    let s: EgressSettings = toml::from_str(
        r#"
        allow_ranges = ["127.0.0.0/8"]
        allow_http = true
        allowed_ports = [443]
        dns_cache_ttl_s = 0
        "#,
    )
    .unwrap();
    assert_eq!(s.allow_ranges, ["127.0.0.0/8"]);
    assert_eq!((s.dns_cache_ttl_s, s.dns_negative_ttl_s, s.dns_cache_max_entries), (0, 5, 10_000));
    assert!(s.allow_http);
    assert!(s.deny_ranges.is_empty());
    assert!(toml::from_str::<EgressSettings>("allow_rangez = []").is_err());
    assert_eq!(toml::from_str::<EgressSettings>("").unwrap(), EgressSettings::default());
}

#[test]
fn classify_ip_names_categories() {
    assert_eq!(classify_ip(ip("93.184.216.34")), None);
    assert_eq!(classify_ip(ip("10.0.0.7")), Some("private (RFC 1918)"));
    assert_eq!(classify_ip(ip("::ffff:127.0.0.1")), Some("loopback"));
    assert_eq!(classify_ip(ip("169.254.169.254")), Some(METADATA));
    assert_eq!(Refusal { kind: RefusalKind::InvalidUrl, reason: String::new() }.outcome(), Outcome::InvalidUrl);
}

proptest! {
    /// The guard never panics, whatever it is fed.
    #[test]
    fn check_url_never_panics(s in "\\PC{0,80}") {
        let _ = guard().check_url(&s);
        let _ = guard().check_url(&format!("https://{s}/"));
    }

    /// Every IPv4 address is refused or allowed identically in its dotted, decimal and hex spellings, and
    /// identically when IPv4-mapped; the mapped form is refused exactly when the plain one is.
    #[test]
    fn spellings_agree(n in any::<u32>()) {
        let g = guard();
        let v4 = Ipv4Addr::from(n);
        let dotted = g.check_url(&format!("https://{v4}/")).map(|t| t.host);
        prop_assert_eq!(&dotted, &g.check_url(&format!("https://{n}/")).map(|t| t.host));
        prop_assert_eq!(&dotted, &g.check_url(&format!("https://{n:#x}/")).map(|t| t.host));
        let mapped = g.check_url(&format!("https://[::ffff:{v4}]/"));
        prop_assert_eq!(dotted.is_ok(), mapped.is_ok());
        prop_assert_eq!(dotted.is_ok(), classify_ip(IpAddr::V4(v4)).is_none());
    }

    /// NAT64 (well-known prefix) is judged exactly like the IPv4 address inside.
    #[test]
    fn nat64_agrees_with_ipv4(n in any::<u32>()) {
        let v4 = Ipv4Addr::from(n);
        let nat64 = IpAddr::V6(std::net::Ipv6Addr::from((0x64_ff9b_u128 << 96) | u128::from(n)));
        prop_assert_eq!(classify_ip(IpAddr::V4(v4)).is_none(), classify_ip(nat64).is_none());
    }
}
