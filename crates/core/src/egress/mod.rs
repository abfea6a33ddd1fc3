//! The egress decision: may hookline send a webhook to this URL, to these addresses? No I/O here — the
//! dispatcher's guarded connector resolves names and connects, asking this module before every connection.
//!
//! A URL is judged by what a real URL parser (WHATWG, the `url` crate) makes of it, never by the raw string:
//! decimal, octal, hex and short IPv4 forms, fullwidth digits, ideographic dots, percent-encoding and IDN all
//! normalise to an address or an ASCII name first. Addresses are judged by [`classify_ip`] (the IANA
//! special-purpose registries, IPv4 embedded in IPv6, cloud metadata endpoints), then by the operator's and
//! the policy's deny ranges, and finally by the allow-list (off by default, for tests and on-premise targets).

mod ranges;
mod target;

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;
use crate::policy::EgressRules;

pub use ranges::{embedded, Cidr, CidrError, Embedded, NonPublic, METADATA};
pub use target::{Target, TargetHost};

/// The `[egress]` table of the config file: what the operator adds to the policies' rules.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EgressSettings {
    /// CIDR ranges reachable although non-public (tests, dev, on-premise targets). Off by default, logged
    /// loudly at start. Cloud metadata addresses stay refused whatever this says.
    #[serde(default)]
    pub allow_ranges: Vec<String>,
    /// Adds `http` to every policy's allowed schemes (dev mode, on-premise receivers).
    #[serde(default)]
    pub allow_http: bool,
    /// When set, only these destination ports are allowed.
    #[serde(default)]
    pub allowed_ports: Option<Vec<u16>>,
    /// CIDR ranges refused on top of the built-in tables, even when public.
    #[serde(default)]
    pub deny_ranges: Vec<String>,
    /// Host names refused before resolution: `internal.example.com`, or `*.example.com` for every subdomain.
    #[serde(default)]
    pub blocked_hostnames: Vec<String>,
    /// How long the dispatcher keeps a host name's addresses, at most (an answer that carries a shorter TTL is kept
    /// for that); `0` resolves on every attempt. The guard judges cached addresses on every connect as fresh ones.
    #[serde(default = "default_dns_cache_ttl_s")]
    pub dns_cache_ttl_s: u64,
    /// How long a failed lookup is remembered, so an endpoint whose name does not resolve is not asked about on
    /// every attempt; `0` never remembers a failure.
    #[serde(default = "default_dns_negative_ttl_s")]
    pub dns_negative_ttl_s: u64,
    /// Most host names the cache holds; beyond it the entry closest to expiring is dropped.
    #[serde(default = "default_dns_cache_max_entries")]
    pub dns_cache_max_entries: usize,
}

/// Short enough that an endpoint moved by DNS is followed within half a minute without its TTL, which the
/// system resolver does not report.
pub const DEFAULT_DNS_CACHE_TTL_S: u64 = 30;
pub const DEFAULT_DNS_NEGATIVE_TTL_S: u64 = 5;
pub const DEFAULT_DNS_CACHE_MAX_ENTRIES: usize = 10_000;
/// Upper bounds of the DNS keys: a day, an hour, a million names.
const MAX_DNS_CACHE_TTL_S: u64 = 86_400;
const MAX_DNS_NEGATIVE_TTL_S: u64 = 3_600;
const MAX_DNS_CACHE_MAX_ENTRIES: usize = 1_000_000;

fn default_dns_cache_ttl_s() -> u64 {
    DEFAULT_DNS_CACHE_TTL_S
}
fn default_dns_negative_ttl_s() -> u64 {
    DEFAULT_DNS_NEGATIVE_TTL_S
}
fn default_dns_cache_max_entries() -> usize {
    DEFAULT_DNS_CACHE_MAX_ENTRIES
}

impl Default for EgressSettings {
    fn default() -> Self {
        Self {
            allow_ranges: Vec::new(),
            allow_http: false,
            allowed_ports: None,
            deny_ranges: Vec::new(),
            blocked_hostnames: Vec::new(),
            dns_cache_ttl_s: DEFAULT_DNS_CACHE_TTL_S,
            dns_negative_ttl_s: DEFAULT_DNS_NEGATIVE_TTL_S,
            dns_cache_max_entries: DEFAULT_DNS_CACHE_MAX_ENTRIES,
        }
    }
}

/// A bad value in the `[egress]` config table or in a policy's `egress` rules, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct EgressConfigError {
    /// `egress.allow_ranges[1]`, `policy.egress.allowed_schemes[0]`, ...
    pub key: String,
    pub message: String,
}

impl EgressSettings {
    /// Checks every value, naming the first bad key: `egress.allow_ranges[1]: "10.0.0.0/33" is not a CIDR range`.
    pub fn validate(&self) -> Result<(), EgressConfigError> {
        parse_ranges(&self.allow_ranges, "egress.allow_ranges")?;
        parse_ranges(&self.deny_ranges, "egress.deny_ranges")?;
        parse_hostnames(&self.blocked_hostnames, "egress.blocked_hostnames")?;
        let bad = |key: &str, message: String| Err(EgressConfigError { key: key.into(), message });
        if self.dns_cache_ttl_s > MAX_DNS_CACHE_TTL_S {
            return bad("egress.dns_cache_ttl_s", format!("{} is more than a day ({MAX_DNS_CACHE_TTL_S} s)", self.dns_cache_ttl_s));
        }
        if self.dns_negative_ttl_s > MAX_DNS_NEGATIVE_TTL_S {
            return bad(
                "egress.dns_negative_ttl_s",
                format!("{} is more than an hour ({MAX_DNS_NEGATIVE_TTL_S} s)", self.dns_negative_ttl_s),
            );
        }
        if self.dns_cache_max_entries == 0 || self.dns_cache_max_entries > MAX_DNS_CACHE_MAX_ENTRIES {
            return bad(
                "egress.dns_cache_max_entries",
                format!("must be between 1 and {MAX_DNS_CACHE_MAX_ENTRIES} (set egress.dns_cache_ttl_s = 0 to turn the cache off)"),
            );
        }
        if let Some(ports) = &self.allowed_ports {
            if ports.is_empty() {
                return Err(EgressConfigError {
                    key: "egress.allowed_ports".into(),
                    message: "is empty, which would refuse every destination; remove it to allow all ports".into(),
                });
            }
            if let Some(i) = ports.iter().position(|p| *p == 0) {
                return Err(EgressConfigError { key: format!("egress.allowed_ports[{i}]"), message: "0 is not a destination port".into() });
            }
        }
        Ok(())
    }
}

fn parse_ranges(values: &[String], key: &str) -> Result<Vec<(Cidr, String)>, EgressConfigError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.trim()
                .parse::<Cidr>()
                .map(|c| (c, format!("{key}[{i}]")))
                .map_err(|e| EgressConfigError { key: format!("{key}[{i}]"), message: format!("{v:?} {e}") })
        })
        .collect()
}

fn parse_hostnames(values: &[String], key: &str) -> Result<Vec<HostPattern>, EgressConfigError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            HostPattern::parse(v).ok_or_else(|| EgressConfigError {
                key: format!("{key}[{i}]"),
                message: format!("{v:?} is not a host name or *.suffix pattern"),
            })
        })
        .collect()
}

/// Names refused whatever they resolve to. `metadata` alone is the short name GCE's resolver answers through
/// its search domain.
const BUILTIN_BLOCKED: &[&str] = &["localhost", "*.localhost", "metadata.google.internal", "metadata"];

/// A blocked host name: exact, or `*.suffix` for every name below `suffix` (not `suffix` itself).
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    Below(String),
}

impl HostPattern {
    fn parse(s: &str) -> Option<HostPattern> {
        let s = s.trim();
        let (below, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let name = target::normalise_configured_name(name)?;
        Some(if below { HostPattern::Below(name) } else { HostPattern::Exact(name) })
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(n) => name == n,
            HostPattern::Below(suffix) => {
                name.len() > suffix.len() + 1 && name.ends_with(suffix.as_str()) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            }
        }
    }
}

/// Whether a refusal is about the URL's shape or about where it points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// The URL cannot be parsed, or has no usable host or port.
    InvalidUrl,
    /// The destination is not allowed: scheme, user info, port, blocked name, non-public address.
    EgressRefused,
}

impl RefusalKind {
    pub fn outcome(self) -> Outcome {
        match self {
            RefusalKind::InvalidUrl => Outcome::InvalidUrl,
            RefusalKind::EgressRefused => Outcome::EgressRefused,
        }
    }
}

/// Why the guard refused a destination, in words a customer can read. Recorded in the attempt log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    pub kind: RefusalKind,
    pub reason: String,
}

impl Refusal {
    fn refused(reason: impl Into<String>) -> Refusal {
        Refusal { kind: RefusalKind::EgressRefused, reason: reason.into() }
    }

    fn invalid(reason: impl Into<String>) -> Refusal {
        Refusal { kind: RefusalKind::InvalidUrl, reason: reason.into() }
    }

    /// The attempt outcome policies classify: `egress_refused` or `invalid_url`.
    pub fn outcome(&self) -> Outcome {
        self.kind.outcome()
    }
}

/// The non-public category of `ip` ("loopback", "private (RFC 1918)", "a cloud metadata address", ...), or
/// `None` when it is a public address. For an IPv6 address embedding a non-public IPv4 address, the IPv4
/// address's category. Ignores allow and deny lists: see [`EgressGuard::check_ip`] for the full decision.
pub fn classify_ip(ip: IpAddr) -> Option<&'static str> {
    ranges::classify(ip).map(|n| n.category())
}

/// The egress decision for one policy under one configuration. Cheap to share (`Arc`) across tasks.
#[derive(Debug, Clone)]
pub struct EgressGuard {
    schemes: Vec<String>,
    ports: Option<Vec<u16>>,
    allow: Vec<(Cidr, String)>,
    /// With a description of who denied it, for the reason.
    deny: Vec<(Cidr, &'static str)>,
    blocked: Vec<HostPattern>,
    allow_http_from_settings: bool,
}

impl EgressGuard {
    /// Combines the policy's rules with the operator's settings. `allow_http` adds `http` to the policy's
    /// schemes; deny ranges and blocked names from both apply.
    pub fn new(settings: &EgressSettings, rules: &EgressRules) -> Result<EgressGuard, EgressConfigError> {
        settings.validate()?;
        let mut schemes = Vec::new();
        for (i, s) in rules.allowed_schemes.iter().enumerate() {
            let s = s.trim().to_ascii_lowercase();
            if s != "https" && s != "http" {
                return Err(EgressConfigError {
                    key: format!("policy.egress.allowed_schemes[{i}]"),
                    message: format!("{s:?} cannot be sent to (only https and http are supported)"),
                });
            }
            if !schemes.contains(&s) {
                schemes.push(s);
            }
        }
        if settings.allow_http && !schemes.iter().any(|s| s == "http") {
            schemes.push("http".into());
        }
        let mut deny: Vec<(Cidr, &'static str)> = Vec::new();
        for (c, _) in parse_ranges(&rules.deny_ranges, "policy.egress.deny_ranges")? {
            deny.push((c, "the delivery policy"));
        }
        for (c, _) in parse_ranges(&settings.deny_ranges, "egress.deny_ranges")? {
            deny.push((c, "the operator"));
        }
        let mut blocked = parse_hostnames(&rules.blocked_hostnames, "policy.egress.blocked_hostnames")?;
        blocked.extend(parse_hostnames(&settings.blocked_hostnames, "egress.blocked_hostnames")?);
        blocked.extend(BUILTIN_BLOCKED.iter().filter_map(|s| HostPattern::parse(s)));
        Ok(EgressGuard {
            schemes,
            ports: settings.allowed_ports.clone(),
            allow: parse_ranges(&settings.allow_ranges, "egress.allow_ranges")?,
            deny,
            blocked,
            allow_http_from_settings: settings.allow_http,
        })
    }

    /// The schemes this guard lets through, e.g. `["https"]`.
    pub fn allowed_schemes(&self) -> &[String] {
        &self.schemes
    }

    /// What a binary must log loudly (warn level) at start: each allow-list entry and plain http.
    pub fn startup_warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .allow
            .iter()
            .map(|(c, key)| {
                format!(
                    "egress allow-list in use: {c} ({key}) is reachable although it is non-public; \
                     meant for tests and on-premise targets only"
                )
            })
            .collect();
        if self.allow_http_from_settings {
            out.push("egress.allow_http is on: webhooks may be sent over plain http".into());
        }
        out
    }

    /// Parses and judges a URL without resolving it: scheme, user info, port, host name or IP literal.
    /// The returned [`Target`] carries the parsed URL; send to `target.url`, never to the raw string.
    pub fn check_url(&self, url: &str) -> Result<Target, Refusal> {
        let parsed = url::Url::parse(url.trim()).map_err(|e| Refusal::invalid(format!("the URL cannot be parsed: {e}")))?;
        let scheme = parsed.scheme();
        if !self.schemes.iter().any(|s| s == scheme) {
            return Err(Refusal::refused(format!("scheme {scheme} is not allowed (allowed: {})", self.schemes.join(", "))));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Refusal::refused("URLs with user info are refused"));
        }
        let port = parsed.port_or_known_default().ok_or_else(|| Refusal::invalid("the URL has no port"))?;
        if port == 0 {
            return Err(Refusal::invalid("port 0 is not a destination port"));
        }
        if let Some(ports) = &self.ports {
            if !ports.contains(&port) {
                let list: Vec<String> = ports.iter().map(u16::to_string).collect();
                return Err(Refusal::refused(format!("port {port} is not allowed (allowed: {})", list.join(", "))));
            }
        }
        let host = match parsed.host() {
            None => return Err(Refusal::invalid("the URL has no host")),
            Some(url::Host::Ipv4(v4)) => TargetHost::Ip(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => TargetHost::Ip(IpAddr::V6(v6)),
            Some(url::Host::Domain(d)) => TargetHost::Name(
                target::normalise_name(d).map_err(|why| Refusal::invalid(format!("host {d:?} is not a valid DNS name: {why}")))?,
            ),
        };
        match &host {
            TargetHost::Ip(ip) => self.check_ip(*ip)?,
            TargetHost::Name(name) => {
                if self.blocked.iter().any(|p| p.matches(name)) {
                    return Err(Refusal::refused(format!("{name} is a blocked hostname")));
                }
            }
        }
        Ok(Target { url: parsed, host, port })
    }

    /// Judges one address: metadata (always refused), deny ranges, the allow-list, then the built-in tables.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refusal> {
        if let Some(np) = ranges::metadata(ip) {
            return Err(Refusal::refused(np.reason(ip)));
        }
        let embedded = match ip {
            IpAddr::V6(v6) => ranges::embedded(v6),
            IpAddr::V4(_) => None,
        };
        let inner = || embedded.iter().flat_map(|e| e.v4s()).map(IpAddr::V4);
        for (net, who) in &self.deny {
            if net.contains(ip) {
                return Err(Refusal::refused(format!("{ip} is in a range denied by {who} ({net})")));
            }
            if let Some(v4) = inner().find(|v4| net.contains(*v4)) {
                return Err(Refusal::refused(format!("{ip} embeds {v4}, which is in a range denied by {who} ({net})")));
            }
        }
        // An IPv4-mapped address is the IPv4 host itself, so an IPv4 allow range covers it too.
        let mapped = match embedded {
            Some(Embedded::Mapped(v4)) => Some(IpAddr::V4(v4)),
            _ => None,
        };
        if self.allow.iter().any(|(net, _)| net.contains(ip) || mapped.is_some_and(|m| net.contains(m))) {
            return Ok(());
        }
        match ranges::classify(ip) {
            Some(np) => Err(Refusal::refused(np.reason(ip))),
            None => Ok(()),
        }
    }

    /// Judges what a target's host resolved to: refused if there is no address or if ANY address is refused,
    /// because the connection could go to any of them (and a resolver may rotate them).
    pub fn check_resolved(&self, target: &Target, addrs: &[IpAddr]) -> Result<(), Refusal> {
        match &target.host {
            TargetHost::Ip(ip) => {
                self.check_ip(*ip)?;
                for a in addrs {
                    self.check_ip(*a)?;
                }
                Ok(())
            }
            TargetHost::Name(name) => {
                if addrs.is_empty() {
                    return Err(Refusal::refused(format!("{name} resolved to no addresses")));
                }
                for a in addrs {
                    self.check_ip(*a).map_err(|r| Refusal::refused(format!("{name} resolves to a refused address: {}", r.reason)))?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for RefusalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefusalKind::InvalidUrl => "invalid_url",
            RefusalKind::EgressRefused => "egress_refused",
        })
    }
}

#[cfg(test)]
mod tests;
