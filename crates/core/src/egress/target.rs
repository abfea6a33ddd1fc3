//! What a checked URL points at, and host-name normalisation.

use std::fmt;
use std::net::IpAddr;

/// A URL that passed [`super::EgressGuard::check_url`]: its parsed form, its host and its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The parsed URL. Requests are built from this, never from the string the customer typed.
    pub url: url::Url,
    pub host: TargetHost,
    /// The explicit port or the scheme's default.
    pub port: u16,
}

/// The host a URL names, after WHATWG normalisation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// Lowercase ASCII (IDN in punycode), without a trailing dot. Must be resolved and every address checked.
    Name(String),
    /// An IP literal in any form the URL parser accepts (`2130706433`, `0x7f.1`, `[::ffff:7f00:1]`, ...).
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Name(n) => f.write_str(n),
            TargetHost::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A DNS name as the resolver will see it: lowercase ASCII, one trailing dot removed, LDH labels (plus `_`,
/// which real names use) of 1..=63 bytes, at most 253 bytes. The URL parser has already applied IDNA and
/// percent-decoding; this refuses what it lets through but DNS cannot carry (`a..b`, `exa*mple.com`).
pub(crate) fn normalise_name(name: &str) -> Result<String, &'static str> {
    let lower = name.to_ascii_lowercase();
    let trimmed = lower.strip_suffix('.').unwrap_or(&lower);
    if trimmed.is_empty() {
        return Err("it is empty");
    }
    if trimmed.len() > 253 {
        return Err("it is longer than 253 bytes");
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return Err("it has an empty label");
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 bytes");
        }
        if !label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            return Err("it contains characters a DNS name cannot hold");
        }
    }
    Ok(trimmed.to_owned())
}

/// Normalises a configured host name (which may be Unicode or upper case) the way the URL parser would.
/// `None` when it is not a name (empty, an IP address, invalid characters).
pub(crate) fn normalise_configured_name(name: &str) -> Option<String> {
    match url::Host::parse(name.trim()).ok()? {
        url::Host::Domain(d) => normalise_name(&d).ok(),
        url::Host::Ipv4(_) | url::Host::Ipv6(_) => None,
    }
}
