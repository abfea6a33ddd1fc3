//! Address classification: which IP addresses a webhook may never reach, and why.
//!
//! Sources: the IANA IPv4 and IPv6 Special-Purpose Address Registries
//! (<https://www.iana.org/assignments/iana-ipv4-special-registry>,
//! <https://www.iana.org/assignments/iana-ipv6-special-registry>), the IPv6 Address Space registry (only
//! 2000::/3 is global unicast), and the cloud providers' documented metadata endpoints. Every registry entry is
//! refused, including the few anycast services marked "globally reachable" (AS112, AMT, PCP/TURN anycast):
//! no webhook receiver lives there, and refusing them costs nothing. See `docs/egress.md`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP network: an address and a prefix length, with no host bits set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// Why a string is not a CIDR range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("is not a CIDR range (expected an address, optionally followed by /prefix)")]
    Syntax,
    #[error("is not a CIDR range (prefix longer than {max})")]
    PrefixTooLong { max: u8 },
    #[error("is not a CIDR range (host bits are set; did you mean {suggestion}?)")]
    HostBits { suggestion: Cidr },
}

impl Cidr {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr { net: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    const fn v6(s: [u16; 8], prefix: u8) -> Cidr {
        Cidr { net: IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])), prefix }
    }

    pub fn network(&self) -> IpAddr {
        self.net
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` lies in this network. An IPv4 network never contains an IPv6 address (IPv4-mapped
    /// addresses are unwrapped by the caller, which knows the context).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask32(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask128(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    // `checked_shl` because a shift by 32 (prefix 0) overflows.
    u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `10.0.0.0/8`, `fc00::/7`, or a bare address meaning a single host (`/32` or `/128`). The address must
    /// be in its plain form (no octal or hex IPv4) and the network must have no host bits set: a range that
    /// silently widens (`10.1.2.3/8` meaning all of 10/8) is the kind of mistake an allow-list cannot afford.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr.parse().map_err(|_| CidrError::Syntax)?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => {
                // u8::from_str accepts a leading '+'; ranges are written with digits only.
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(CidrError::Syntax);
                }
                let n: u16 = p.parse().map_err(|_| CidrError::Syntax)?;
                if n > u16::from(max) {
                    return Err(CidrError::PrefixTooLong { max });
                }
                n as u8
            }
        };
        let masked = match net {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
        };
        if masked != net {
            return Err(CidrError::HostBits { suggestion: Cidr { net: masked, prefix } });
        }
        Ok(Cidr { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// The category given to cloud metadata endpoints, which are refused even inside an allow-list.
pub const METADATA: &str = "a cloud metadata address";

/// Instance metadata services. Most also fall in a non-public range; they are listed so the reason names them,
/// and so that no allow-list can open them. 168.63.129.16 (Azure WireServer) is otherwise public space.
const METADATA_ADDRS: &[IpAddr] = &[
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)), // AWS, GCP, Azure, DigitalOcean, OpenStack, ...
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 2)),   // AWS ECS task metadata and credentials
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 23)),  // AWS EKS Pod Identity agent
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)), // Alibaba Cloud
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),   // Azure WireServer
    IpAddr::V4(Ipv4Addr::new(192, 0, 0, 192)),     // Oracle Cloud Infrastructure
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)), // AWS (IPv6)
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23)), // AWS EKS Pod Identity (IPv6)
    IpAddr::V6(Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)), // GCP (IPv6)
];

const RFC1918: &str = "private (RFC 1918)";
const DOC_V4: &str = "reserved for documentation (TEST-NET, RFC 5737)";
const AS112: &str = "reserved for AS112 DNS (RFC 7534, RFC 7535)";

/// IANA IPv4 Special-Purpose Address Registry, most specific entries first (the first match names the reason).
static V4_TABLE: &[(Cidr, &str)] = &[
    (Cidr::v4(0, 0, 0, 0, 32), "unspecified"),
    (Cidr::v4(0, 0, 0, 0, 8), "in \"this network\" 0.0.0.0/8 (RFC 791)"),
    (Cidr::v4(10, 0, 0, 0, 8), RFC1918),
    (Cidr::v4(100, 64, 0, 0, 10), "shared address space (CGNAT, RFC 6598)"),
    (Cidr::v4(127, 0, 0, 0, 8), "loopback"),
    (Cidr::v4(169, 254, 0, 0, 16), "link-local"),
    (Cidr::v4(172, 16, 0, 0, 12), RFC1918),
    (Cidr::v4(192, 0, 0, 0, 24), "reserved for IETF protocol assignments (192.0.0.0/24)"),
    (Cidr::v4(192, 0, 2, 0, 24), DOC_V4),
    (Cidr::v4(192, 31, 196, 0, 24), AS112),
    (Cidr::v4(192, 52, 193, 0, 24), "reserved for AMT relays (RFC 7450)"),
    (Cidr::v4(192, 88, 99, 0, 24), "the deprecated 6to4 relay anycast range (RFC 7526)"),
    (Cidr::v4(192, 168, 0, 0, 16), RFC1918),
    (Cidr::v4(192, 175, 48, 0, 24), AS112),
    (Cidr::v4(198, 18, 0, 0, 15), "reserved for benchmarking (RFC 2544)"),
    (Cidr::v4(198, 51, 100, 0, 24), DOC_V4),
    (Cidr::v4(203, 0, 113, 0, 24), DOC_V4),
    (Cidr::v4(224, 0, 0, 0, 4), "multicast"),
    (Cidr::v4(255, 255, 255, 255, 32), "broadcast"),
    (Cidr::v4(240, 0, 0, 0, 4), "reserved (240.0.0.0/4)"),
];

const TEREDO: &str = "Teredo (2001::/32); all of 2001::/23 (IETF protocol assignments) is refused";
const SIX_TO_FOUR: &str = "6to4 (2002::/16, deprecated by RFC 7526); all of 6to4 is refused";
const COMPATIBLE: &str = "IPv4-compatible (::/96, deprecated by RFC 4291)";
const NAT64_LOCAL: &str = "local-use NAT64 (64:ff9b:1::/48, RFC 8215)";

/// IANA IPv6 Special-Purpose Address Registry entries that carry no IPv4 address (those are handled by
/// `embedded`), most specific first. Anything outside 2000::/3 that is not listed is refused afterwards.
static V6_TABLE: &[(Cidr, &str)] = &[
    (Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "discard-only (100::/64, RFC 6666)"),
    (Cidr::v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64), "a dummy prefix (100:0:0:1::/64, RFC 9780)"),
    (Cidr::v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), "reserved for benchmarking (2001:2::/48, RFC 5180)"),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), "reserved for IETF protocol assignments (2001::/23)"),
    (Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "reserved for documentation (2001:db8::/32, RFC 3849)"),
    (Cidr::v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48), AS112),
    (Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "reserved for documentation (3fff::/20, RFC 9637)"),
    (Cidr::v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), "reserved for SRv6 SIDs (5f00::/16, RFC 9602)"),
    (Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique local (fc00::/7, RFC 4193)"),
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
    (Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), "site-local (fec0::/10, deprecated by RFC 3879)"),
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
];

const GLOBAL_UNICAST: Cidr = Cidr::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);
const OUTSIDE_GLOBAL_UNICAST: &str = "outside global unicast 2000::/3 (reserved by IETF)";

/// An IPv4 address carried inside an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedded {
    /// `::ffff:a.b.c.d` — the IPv4 host itself on a dual-stack socket.
    Mapped(Ipv4Addr),
    /// `::a.b.c.d` (deprecated).
    Compatible(Ipv4Addr),
    /// `64:ff9b::a.b.c.d` — well-known NAT64 prefix, translated to the IPv4 host.
    Nat64(Ipv4Addr),
    /// `64:ff9b:1::/48` local-use NAT64; the IPv4 address is read from the last 32 bits.
    Nat64Local(Ipv4Addr),
    /// `2002:AABB:CCDD::/48` — 6to4, IPv4 in bits 16..47.
    SixToFour(Ipv4Addr),
    /// `2001:0:SSSS:SSSS:…:CCCC:CCCC` — Teredo server IPv4 in bits 32..63, client IPv4 inverted in the last 32.
    Teredo { server: Ipv4Addr, client: Ipv4Addr },
}

impl Embedded {
    /// The IPv4 addresses this embedding carries.
    pub fn v4s(&self) -> impl Iterator<Item = Ipv4Addr> {
        let (a, b) = match *self {
            Embedded::Mapped(v) | Embedded::Compatible(v) | Embedded::Nat64(v) | Embedded::Nat64Local(v) | Embedded::SixToFour(v) => {
                (v, None)
            }
            Embedded::Teredo { server, client } => (server, Some(client)),
        };
        std::iter::once(a).chain(b)
    }
}

fn last32(ip: Ipv6Addr) -> Ipv4Addr {
    Ipv4Addr::from(u128::from(ip) as u32)
}

/// The IPv4 address(es) embedded in `ip`, if it is one of the embedding formats.
pub fn embedded(ip: Ipv6Addr) -> Option<Embedded> {
    let s = ip.segments();
    let bits = u128::from(ip);
    if bits >> 32 == 0xffff {
        return Some(Embedded::Mapped(last32(ip)));
    }
    // `::` and `::1` are checked before this is called; every other ::/96 address is IPv4-compatible.
    if bits >> 32 == 0 {
        return Some(Embedded::Compatible(last32(ip)));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(Embedded::Nat64(last32(ip)));
    }
    if s[..3] == [0x64, 0xff9b, 1] {
        return Some(Embedded::Nat64Local(last32(ip)));
    }
    if s[0] == 0x2002 {
        let v4 = (u32::from(s[1]) << 16) | u32::from(s[2]);
        return Some(Embedded::SixToFour(Ipv4Addr::from(v4)));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        let server = Ipv4Addr::from((u32::from(s[2]) << 16) | u32::from(s[3]));
        let client = Ipv4Addr::from(!(bits as u32));
        return Some(Embedded::Teredo { server, client });
    }
    None
}

/// Why an address is not public.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonPublic {
    /// The address lies in a refused range; the text reads after "is": "loopback", "private (RFC 1918)".
    Range(&'static str),
    /// The IPv6 address carries an IPv4 address that is itself non-public.
    Embeds { v4: Ipv4Addr, category: &'static str },
}

impl NonPublic {
    pub fn category(&self) -> &'static str {
        match self {
            NonPublic::Range(c) => c,
            NonPublic::Embeds { category, .. } => category,
        }
    }

    /// A sentence a customer can read: `10.0.0.7 is private (RFC 1918)`,
    /// `::ffff:127.0.0.1 embeds 127.0.0.1, which is loopback`.
    pub fn reason(&self, ip: IpAddr) -> String {
        match self {
            NonPublic::Range(c) => format!("{ip} is {c}"),
            NonPublic::Embeds { v4, category } => format!("{ip} embeds {v4}, which is {category}"),
        }
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<&'static str> {
    if METADATA_ADDRS.contains(&IpAddr::V4(ip)) {
        return Some(METADATA);
    }
    V4_TABLE.iter().find(|(net, _)| net.contains(IpAddr::V4(ip))).map(|(_, c)| *c)
}

fn classify_v6(ip: Ipv6Addr) -> Option<NonPublic> {
    if METADATA_ADDRS.contains(&IpAddr::V6(ip)) {
        return Some(NonPublic::Range(METADATA));
    }
    if ip == Ipv6Addr::UNSPECIFIED {
        return Some(NonPublic::Range("unspecified"));
    }
    if ip == Ipv6Addr::LOCALHOST {
        return Some(NonPublic::Range("loopback"));
    }
    if let Some(e) = embedded(ip) {
        let inner = e.v4s().find_map(|v4| classify_v4(v4).map(|category| NonPublic::Embeds { v4, category }));
        return match e {
            // These reach exactly the IPv4 host inside: judged by it alone.
            Embedded::Mapped(_) | Embedded::Nat64(_) => inner,
            // Deprecated or non-global formats: refused whatever they carry, naming the IPv4 inside if bad.
            Embedded::Compatible(_) => Some(inner.unwrap_or(NonPublic::Range(COMPATIBLE))),
            Embedded::Nat64Local(_) => Some(inner.unwrap_or(NonPublic::Range(NAT64_LOCAL))),
            Embedded::SixToFour(_) => Some(inner.unwrap_or(NonPublic::Range(SIX_TO_FOUR))),
            Embedded::Teredo { .. } => Some(inner.unwrap_or(NonPublic::Range(TEREDO))),
        };
    }
    if let Some((_, c)) = V6_TABLE.iter().find(|(net, _)| net.contains(IpAddr::V6(ip))) {
        return Some(NonPublic::Range(c));
    }
    if !GLOBAL_UNICAST.contains(IpAddr::V6(ip)) {
        return Some(NonPublic::Range(OUTSIDE_GLOBAL_UNICAST));
    }
    None
}

/// Why `ip` is not a public address, or `None` when it is.
pub fn classify(ip: IpAddr) -> Option<NonPublic> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(NonPublic::Range),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// `Some` when `ip` is, or embeds, a cloud metadata address.
pub fn metadata(ip: IpAddr) -> Option<NonPublic> {
    if METADATA_ADDRS.contains(&ip) {
        return Some(NonPublic::Range(METADATA));
    }
    let IpAddr::V6(v6) = ip else { return None };
    embedded(v6)?.v4s().find(|v4| METADATA_ADDRS.contains(&IpAddr::V4(*v4))).map(|v4| NonPublic::Embeds { v4, category: METADATA })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_parse_and_contains() {
        assert!(c("10.0.0.0/8").contains("10.255.0.1".parse().unwrap()));
        assert!(!c("10.0.0.0/8").contains("11.0.0.1".parse().unwrap()));
        assert!(c("0.0.0.0/0").contains("8.8.8.8".parse().unwrap()));
        assert!(!c("0.0.0.0/0").contains("::1".parse().unwrap()), "a v4 range never contains v6");
        assert!(c("::/0").contains("2606:4700::1111".parse().unwrap()));
        assert!(c("127.0.0.1").contains("127.0.0.1".parse().unwrap()));
        assert!(!c("127.0.0.1").contains("127.0.0.2".parse().unwrap()));
        assert!(c("fd00::/8").contains("fd12::1".parse().unwrap()));
        assert_eq!(c("fd00::/8").to_string(), "fd00::/8");
    }

    #[test]
    fn cidr_rejects_malformed() {
        assert_eq!("10.0.0.0/33".parse::<Cidr>(), Err(CidrError::PrefixTooLong { max: 32 }));
        assert_eq!("::/129".parse::<Cidr>(), Err(CidrError::PrefixTooLong { max: 128 }));
        for bad in ["", "10.0.0.0/", "10.0.0.0/+8", "10.0.0/8", "010.0.0.0/8", "0x7f.0.0.1", "10.0.0.0/8/8", "a/8"] {
            assert_eq!(bad.parse::<Cidr>(), Err(CidrError::Syntax), "{bad}");
        }
        match "10.1.2.3/8".parse::<Cidr>() {
            Err(CidrError::HostBits { suggestion }) => assert_eq!(suggestion.to_string(), "10.0.0.0/8"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn embedded_forms() {
        let e = |s: &str| embedded(s.parse().unwrap());
        assert_eq!(e("::ffff:7f00:1"), Some(Embedded::Mapped(Ipv4Addr::new(127, 0, 0, 1))));
        assert_eq!(e("::a00:1"), Some(Embedded::Compatible(Ipv4Addr::new(10, 0, 0, 1))));
        assert_eq!(e("64:ff9b::a9fe:a9fe"), Some(Embedded::Nat64(Ipv4Addr::new(169, 254, 169, 254))));
        assert_eq!(e("64:ff9b:1::c0a8:1"), Some(Embedded::Nat64Local(Ipv4Addr::new(192, 168, 0, 1))));
        assert_eq!(e("2002:c0a8:101::1"), Some(Embedded::SixToFour(Ipv4Addr::new(192, 168, 1, 1))));
        // RFC 4380's example: server 65.54.227.120, client 192.0.2.45 (obfuscated as 3fff:fdd2).
        assert_eq!(
            e("2001:0:4136:e378:8000:63bf:3fff:fdd2"),
            Some(Embedded::Teredo { server: Ipv4Addr::new(65, 54, 227, 120), client: Ipv4Addr::new(192, 0, 2, 45) })
        );
        assert_eq!(e("2606:4700::1111"), None);
    }

    #[test]
    fn public_addresses_are_public() {
        for ip in
            ["8.8.8.8", "93.184.216.34", "1.1.1.1", "2606:4700::1111", "2a00:1450:4001:80b::200e", "64:ff9b::808:808", "::ffff:8.8.8.8"]
        {
            assert_eq!(classify(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn boundaries_of_ranges() {
        let cat = |s: &str| classify(s.parse().unwrap()).map(|n| n.category());
        assert_eq!(cat("100.63.255.255"), None);
        assert!(cat("100.64.0.0").is_some());
        assert!(cat("100.127.255.255").is_some());
        assert_eq!(cat("100.128.0.0"), None);
        assert_eq!(cat("172.15.255.255"), None);
        assert_eq!(cat("172.31.255.255"), Some(RFC1918));
        assert_eq!(cat("172.32.0.0"), None);
        assert_eq!(cat("198.17.255.255"), None);
        assert!(cat("198.19.255.255").is_some());
        assert_eq!(cat("198.20.0.0"), None);
        assert_eq!(cat("223.255.255.255"), None);
        assert_eq!(cat("255.255.255.255"), Some("broadcast"));
        assert_eq!(cat("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), Some(OUTSIDE_GLOBAL_UNICAST));
        assert_eq!(cat("2001:200::1"), None, "just past 2001::/23 is ordinary global unicast");
        assert_eq!(cat("3fff:1000::1"), None, "just past 3fff::/20");
        assert_eq!(cat("4000::1"), Some(OUTSIDE_GLOBAL_UNICAST));
    }

    #[test]
    fn metadata_wins_over_its_range() {
        assert_eq!(classify("169.254.169.254".parse().unwrap()), Some(NonPublic::Range(METADATA)));
        assert_eq!(classify("168.63.129.16".parse().unwrap()), Some(NonPublic::Range(METADATA)));
        assert_eq!(
            metadata("::ffff:169.254.169.254".parse().unwrap()),
            Some(NonPublic::Embeds { v4: Ipv4Addr::new(169, 254, 169, 254), category: METADATA })
        );
        assert_eq!(metadata("169.254.1.1".parse().unwrap()), None);
    }
}
