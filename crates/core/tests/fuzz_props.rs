//! Fuzz-style property tests (cargo fuzz needs nightly; proptest instead) for the parsers that read what customers
//! and receivers send: `Retry-After`, policy TOML, and webhook URLs through the egress guard. Each never panics;
//! what they accept keeps its invariants. Case counts are set per block so the file runs in well under 20 s
//! (`PROPTEST_CASES` overrides them all, e.g. for a longer local run).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hookline_core::egress::{EgressGuard, EgressSettings, TargetHost};
use hookline_core::policy::{self, EgressRules, BUILTIN_NAMES, MAX_ATTEMPTS_LIMIT};
use hookline_core::{retry_after, Outcome, Progress};
use proptest::prelude::*;
use rand::SeedableRng;

fn cases(n: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(n);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------------------
// Retry-After

const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]; // 1970-01-01 was a Thursday
const LONG_WEEKDAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in(y: i64, m: u32) -> u32 {
    [31, if is_leap(y) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1]
}

/// Days since 1970-01-01, counted naively (an oracle independent of the parser's arithmetic).
fn days_since_epoch(y: i64, m: u32, d: u32) -> i64 {
    let mut days = 0i64;
    for yy in 1970..y {
        days += if is_leap(yy) { 366 } else { 365 };
    }
    for mm in 1..m {
        days += i64::from(days_in(y, mm));
    }
    days + i64::from(d) - 1
}

/// A valid date and time, 1970..=2400 (the naive oracle's loop stays short).
fn valid_date() -> impl Strategy<Value = (i64, u32, u32, u32, u32, u32)> {
    (1970i64..=2400, 1u32..=12, 0u32..24, 0u32..60, 0u32..60)
        .prop_flat_map(|(y, m, h, mi, s)| (Just(y), Just(m), 1..=days_in(y, m), Just(h), Just(mi), Just(s)))
}

proptest! {
    #![proptest_config(cases(10_000))]

    #[test]
    fn retry_after_never_panics_on_any_string(value in any::<String>(), clock in any::<i64>()) {
        let _ = retry_after::parse(&value, clock);
    }

    #[test]
    fn retry_after_accepts_only_ascii(value in "[ \t0-9a-zA-Z,:\\-\u{0660}-\u{0669}\u{ff10}-\u{ff19}\u{00a0}]{0,40}", clock in any::<i64>()) {
        if retry_after::parse(&value, clock).is_some() {
            prop_assert!(value.is_ascii(), "{value:?} was read although it is not ASCII");
        }
    }

    /// Delta-seconds with the surrounding whitespace RFC 9110 allows: the number of seconds, saturating.
    #[test]
    fn retry_after_delta_seconds(digits in "[0-9]{1,30}", pre in "[ \t]{0,3}", post in "[ \t]{0,3}") {
        let want = digits.bytes().fold(0u64, |a, d| a.saturating_mul(10).saturating_add(u64::from(d - b'0'))).saturating_mul(1000);
        prop_assert_eq!(retry_after::parse(&format!("{pre}{digits}{post}"), 0), Some(want));
    }

    /// A valid IMF-fixdate, RFC 850 or asctime date is read exactly: the wait to it, or 0 when it is past.
    #[test]
    fn retry_after_valid_dates_are_exact((y, m, d, h, mi, s) in valid_date(), form in 0usize..3, clock in any::<i64>()) {
        let days = days_since_epoch(y, m, d);
        let wd = days.rem_euclid(7) as usize;
        let mon = MONTHS[m as usize - 1];
        let text = match form {
            0 => format!("{}, {d:02} {mon} {y:04} {h:02}:{mi:02}:{s:02} GMT", WEEKDAYS[wd]),
            // RFC 850 has a two-digit year; httpdate reads it as 19xx/20xx. Only unambiguous years here.
            1 if (2000..2070).contains(&y) => format!("{}, {d:02}-{mon}-{:02} {h:02}:{mi:02}:{s:02} GMT", LONG_WEEKDAYS[wd], y % 100),
            1 => return Ok(()),
            _ => format!("{} {mon} {d:>2} {h:02}:{mi:02}:{s:02} {y:04}", WEEKDAYS[wd]),
        };
        let at_ms = (days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s)) * 1000;
        let want = u64::try_from((i128::from(at_ms) - i128::from(clock)).max(0)).unwrap_or(u64::MAX);
        prop_assert_eq!(retry_after::parse(&text, clock), Some(want), "{}", text);
    }

    /// Near-valid dates: out-of-range fields, wrong weekdays, odd zones and spacing. Never a panic, and a value is
    /// read only if the weekday matches the date (httpdate checks it).
    #[test]
    fn retry_after_near_valid_dates_never_panic(
        wd in 0usize..8, d in 0u32..100, m in 0usize..14, y in 0u32..100_000, h in 0u32..100, mi in 0u32..100, s in 0u32..100,
        zone in prop::sample::select(vec!["GMT", "UTC", "+0000", "", "gmt", "GMT+1", "Z"]),
        sep in prop::sample::select(vec![" ", "  ", "\t", ""]), form in 0usize..4, clock in any::<i64>(),
    ) {
        let wdn = if wd < 7 { WEEKDAYS[wd] } else { "Xyz" };
        let mon = if m < 12 { MONTHS[m] } else if m == 12 { "jan" } else { "Foo" };
        let text = match form {
            0 => format!("{wdn},{sep}{d:02} {mon} {y:04} {h:02}:{mi:02}:{s:02} {zone}"),
            1 => format!("{wdn}day,{sep}{d:02}-{mon}-{:02} {h:02}:{mi:02}:{s:02} {zone}", y % 100),
            2 => format!("{wdn} {mon}{sep}{d:>2} {h:02}:{mi:02}:{s:02} {y}"),
            _ => format!("{d}{sep}{y}"),
        };
        let _ = retry_after::parse(&text, clock);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Policies

/// What every policy `parse` accepts must satisfy, and the engine must handle it without panicking.
fn check_accepted(p: &policy::Policy) -> Result<(), TestCaseError> {
    prop_assert!(policy::validate(p).is_ok());
    prop_assert!(p.attempt.timeout_ms > 0 && p.attempt.response_cap_bytes > 0);
    prop_assert!(!p.classify.is_empty());
    if let Some(max) = p.max_attempts() {
        prop_assert!((1..=MAX_ATTEMPTS_LIMIT).contains(&max), "max_attempts {max}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let outcomes = [
        Outcome::http(200),
        Outcome::http(302),
        Outcome::Http { status: 429, retry_after: Some("120".into()) },
        Outcome::Http { status: 503, retry_after: Some("Thu, 01 Jan 2099 00:00:00 GMT".into()) },
        Outcome::http(410),
        Outcome::Timeout,
        Outcome::ConnectError,
        Outcome::TlsError,
        Outcome::EgressRefused,
    ];
    let last = p.max_attempts().unwrap_or(30).min(30);
    for attempt in 1..=last {
        let _ = p.scheduled_wait(attempt);
        let progress =
            Progress { attempt, try_no: 1, first_attempt_at_ms: 0, now_ms: 1_000 * i64::from(attempt), wall_clock_ms: 1_767_225_600_000 };
        for o in &outcomes {
            let d = hookline_core::decide(p, &progress, o, &mut rng);
            if let hookline_core::Next::NextAttempt(w) | hookline_core::Next::MicroRetry(w) = d.next {
                prop_assert!(w.min_ms <= w.max_ms, "{w:?}");
            }
        }
    }
    // What parsed re-serialises to a document that parses to the same policy.
    let text = toml::to_string(p).map_err(|e| TestCaseError::fail(format!("serialise: {e}")))?;
    let again = policy::parse(&text).map_err(|e| TestCaseError::fail(format!("re-parse: {e}\n{text}")))?;
    prop_assert_eq!(&again, p);
    Ok(())
}

/// TOML-ish documents: top-level keys and tables the policy document knows (and some it does not), keys unique
/// per table so most documents are well-formed TOML, values of every type; now and then a garbage line.
fn tomlish() -> impl Strategy<Value = String> {
    let key = || {
        prop::sample::select(vec![
            "name",
            "description",
            "exhausted",
            "inactive",
            "in_flight",
            "waits_s",
            "max_attempts",
            "max_window_s",
            "timeout_ms",
            "response_cap_bytes",
            "when",
            "verdict",
            "terminal_state",
            "retry_after",
            "micro_retry",
            "counts_toward_disable",
            "jitter",
            "exponential",
            "signature",
            "allowed_schemes",
            "after_failing_for_s",
            "action",
            "reason",
            "max_tries",
            "delay_min_ms",
            "delay_max_ms",
            "body_limit_bytes",
            "x",
        ])
    };
    let value = || {
        prop_oneof![
            prop::sample::select(vec![
                "\"standard\"",
                "\"failed\"",
                "\"dead\"",
                "\"hold\"",
                "\"skip\"",
                "\"cancel\"",
                "\"count\"",
                "\"retry\"",
                "\"success\"",
                "\"terminal\"",
                "\"disable\"",
                "\"pause\"",
                "\"standard_webhooks\"",
                "[\"2xx\"]",
                "[\"any\"]",
                "[\"429\", \"503\"]",
                "[\"https\"]",
                "[\"timeout\", \"5xx\"]",
                "{ mode = \"clamp\", max_s = 60 }",
                "{ mode = \"plus\", ratio = 0.1 }",
                "{ action = \"dead\" }",
                "{ initial_s = 1, multiplier = 2, max_s = 60 }",
                "[1, 2, 3]",
                "[0.5]",
                "[]",
                "true",
                "false",
                "inf",
                "nan"
            ])
            .prop_map(str::to_owned),
            "\"[a-z0-9_*. ]{0,10}\"",
            "-?(0|[1-9][0-9]{0,21})",
            "-?(0|[1-9][0-9]{0,3})\\.[0-9]{1,4}(e[+-]?[0-9]{1,3})?",
            "\\[((0|[1-9][0-9]{0,5})(\\.[0-9])?, ?){0,6}\\]",
        ]
    };
    let table = move || prop::collection::btree_map(key(), value(), 0..7);
    // Each table at most once (a repeated table is a TOML error, found on the first try), `[[classify]]` 0-4 times.
    let headers = prop::sample::subsequence(
        vec!["[schedule]", "[attempt]", "[disable]", "[request]", "[egress]", "[micro_retries]", "[status_words]", "[x]"],
        0..=8,
    );
    let render = |m: std::collections::BTreeMap<&str, String>| m.into_iter().map(|(k, v)| format!("{k} = {v}\n")).collect::<String>();
    (
        table(),
        headers.prop_flat_map(move |hs| {
            let n = hs.len();
            (Just(hs), prop::collection::vec(table(), n..=n))
        }),
        prop::collection::vec(table(), 0..4),
        prop::option::weighted(0.1, "[^\n]{0,20}"),
    )
        .prop_map(move |(top, (headers, tables), classify, garbage)| {
            let mut doc = render(top);
            for (h, t) in headers.into_iter().zip(tables) {
                doc.push_str(&format!("{h}\n{}", render(t)));
            }
            for t in classify {
                doc.push_str(&format!("[[classify]]\n{}", render(t)));
            }
            if let Some(g) = garbage {
                doc.push_str(&g);
            }
            doc
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    /// Replace the n-th number with this text.
    Number(usize, String),
    /// Replace the n-th quoted string with this one.
    Text(usize, String),
    Truncate(usize),
    Insert(usize, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let number = prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("1".to_owned()),
        Just("1e308".to_owned()),
        Just("-1e308".to_owned()),
        Just("inf".to_owned()),
        Just("nan".to_owned()),
        Just("-0.0".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("1001".to_owned()),
        Just("0.0001".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
    ];
    let text = prop_oneof![
        Just(String::new()),
        Just("any".to_owned()),
        Just("2xx".to_owned()),
        Just("6xx".to_owned()),
        Just("999".to_owned()),
        Just("http".to_owned()),
        Just("gopher".to_owned()),
        Just("timeout".to_owned()),
        Just("dead".to_owned()),
        Just("hold".to_owned()),
        Just("count".to_owned()),
        Just("clamp".to_owned()),
        "[a-z0-9_*]{0,8}",
    ];
    prop_oneof![
        1 => any::<usize>().prop_map(Mutation::DeleteLine),
        1 => any::<usize>().prop_map(Mutation::DuplicateLine),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        3 => (any::<usize>(), number).prop_map(|(i, n)| Mutation::Number(i, n)),
        2 => (any::<usize>(), text).prop_map(|(i, t)| Mutation::Text(i, t)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), "[\\[\\]{}=\",.a-z0-9\n ]{1,6}").prop_map(|(i, s)| Mutation::Insert(i, s)),
    ]
}

/// Byte ranges of numbers (outside strings and comments, roughly) and of quoted strings' contents.
fn spans(text: &str) -> (Vec<(usize, usize)>, Vec<(usize, usize)>) {
    let (mut numbers, mut strings) = (Vec::new(), Vec::new());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                    i += 1;
                }
                strings.push((start, i));
                i += 1;
            }
            c if c.is_ascii_digit() => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                numbers.push((start, i));
            }
            _ => i += 1,
        }
    }
    (numbers, strings)
}

fn apply(text: &str, m: &Mutation) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let replace = |spans: &[(usize, usize)], i: usize, with: &str| {
        if spans.is_empty() {
            return text.to_owned();
        }
        let (a, b) = spans[i % spans.len()];
        format!("{}{with}{}", &text[..a], &text[b..])
    };
    match m {
        Mutation::DeleteLine(i) if !lines.is_empty() => {
            let mut l = lines.clone();
            l.remove(i % lines.len());
            l.join("\n")
        }
        Mutation::DuplicateLine(i) if !lines.is_empty() => {
            let mut l = lines.clone();
            l.insert(i % lines.len(), lines[i % lines.len()]);
            l.join("\n")
        }
        Mutation::SwapLines(a, b) if !lines.is_empty() => {
            let mut l = lines.clone();
            l.swap(a % lines.len(), b % lines.len());
            l.join("\n")
        }
        Mutation::Number(i, n) => replace(&spans(text).0, *i, n),
        Mutation::Text(i, t) => replace(&spans(text).1, *i, t),
        Mutation::Truncate(i) => {
            let mut at = i % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text[..at].to_owned()
        }
        Mutation::Insert(i, s) => {
            let mut at = i % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            format!("{}{s}{}", &text[..at], &text[at..])
        }
        _ => text.to_owned(),
    }
}

proptest! {
    #![proptest_config(cases(3_000))]

    #[test]
    fn policy_parse_never_panics_on_any_string(text in any::<String>()) {
        if let Ok(p) = policy::parse(&text) {
            check_accepted(&p)?;
        }
    }

    #[test]
    fn policy_parse_never_panics_on_tomlish_text(text in tomlish()) {
        if let Ok(p) = policy::parse(&text) {
            check_accepted(&p)?;
        }
    }

    /// Each built-in profile's TOML, mutated one to four times: never a panic; whatever still parses is valid
    /// and usable by the engine.
    #[test]
    fn mutated_builtin_profiles(which in 0..BUILTIN_NAMES.len(), muts in prop::collection::vec(mutation(), 1..5)) {
        let mut text = policy::builtin_source(BUILTIN_NAMES[which]).unwrap().to_owned();
        for m in &muts {
            text = apply(&text, m);
        }
        if let Ok(p) = policy::parse(&text) {
            check_accepted(&p)?;
        }
    }
}

#[test]
fn every_builtin_profile_passes_the_accepted_policy_checks() {
    for name in BUILTIN_NAMES {
        let p = policy::parse(policy::builtin_source(name).unwrap()).unwrap();
        check_accepted(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------------------------
// Egress: URLs

fn guard() -> EgressGuard {
    EgressGuard::new(&EgressSettings::default(), &EgressRules::default()).unwrap()
}

/// Non-public by an oracle independent of the product's tables: IANA special-purpose IPv4 ranges that are not
/// globally reachable, and their IPv6 counterparts, including IPv4 embedded by mapping, NAT64 and 6to4.
fn non_public(ip: IpAddr) -> bool {
    fn v4(ip: Ipv4Addr) -> bool {
        let [a, b, c, _] = ip.octets();
        ip.is_unspecified()
            || a == 0
            || ip.is_private()
            || ip.is_loopback()
            || ip.is_link_local()
            || (a == 100 && (64..128).contains(&b))
            || (a == 192 && b == 0 && c == 0)
            || ip.is_documentation()
            || (a == 198 && (b == 18 || b == 19))
            || ip.is_multicast()
            || a >= 240
    }
    match ip {
        IpAddr::V4(ip) => v4(ip),
        IpAddr::V6(ip) => {
            let s = ip.segments();
            let embedded = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
            ip.is_unspecified()
                || ip.is_loopback()
                || ip.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || (ip.to_ipv4_mapped().is_some_and(v4))
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && v4(embedded))
                || (s[0] == 0x2002 && v4(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8)))
        }
    }
}

/// An address in a non-public range, biased to the ones attackers aim at.
fn non_public_v4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(127, b, c, d)),
        any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(10, b, c, d)),
        any::<[u8; 2]>().prop_map(|[c, d]| Ipv4Addr::new(169, 254, c, d)),
        Just(Ipv4Addr::new(169, 254, 169, 254)),
        any::<[u8; 2]>().prop_map(|[c, d]| Ipv4Addr::new(192, 168, c, d)),
        (16u8..32, any::<u8>(), any::<u8>()).prop_map(|(b, c, d)| Ipv4Addr::new(172, b, c, d)),
        (64u8..128, any::<u8>(), any::<u8>()).prop_map(|(b, c, d)| Ipv4Addr::new(100, b, c, d)),
        any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(0, b, c, d)),
        (224u8..=255, any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c, d)| Ipv4Addr::new(a, b, c, d)),
        any::<u8>().prop_map(|d| Ipv4Addr::new(192, 0, 2, d)),
    ]
}

const FULLWIDTH: [char; 10] = ['０', '１', '２', '３', '４', '５', '６', '７', '８', '９'];

/// One of the many spellings the WHATWG parser reads as this IPv4 address.
fn spell_v4(ip: Ipv4Addr, form: u8, dot: &str, fullwidth: bool, percent: bool, trailing_dot: bool) -> String {
    let o = ip.octets();
    let n = u32::from(ip);
    let mut s = match form % 8 {
        0 => format!("{}.{}.{}.{}", o[0], o[1], o[2], o[3]),
        1 => n.to_string(),
        2 => format!("0x{n:08x}"),
        3 => format!("0{:o}.0{:o}.0{:o}.0{:o}", o[0], o[1], o[2], o[3]),
        4 => format!("{}.{}.{}", o[0], o[1], u32::from(o[2]) << 8 | u32::from(o[3])),
        5 => format!("{}.{}", o[0], n & 0x00ff_ffff),
        6 => format!("0x{:x}.0X{:X}.{}.0{:o}", o[0], o[1], o[2], o[3]),
        _ => format!("0{:03o}.0{:03o}.0{:03o}.0{:03o}", o[0], o[1], o[2], o[3]),
    };
    s = s.replace('.', dot);
    if fullwidth {
        s = s.chars().map(|c| c.to_digit(10).map_or(c, |d| FULLWIDTH[d as usize])).collect();
    }
    if percent {
        s = s.chars().map(|c| if c.is_ascii_digit() { format!("%{:02X}", c as u32) } else { c.to_string() }).collect();
    }
    if trailing_dot {
        s.push('.');
    }
    s
}

/// IPv6 literals that are non-public directly or through the IPv4 they carry.
fn spell_v6(v4: Ipv4Addr, form: u8, upper: bool) -> String {
    let [a, b, c, d] = v4.octets();
    let hi = u16::from_be_bytes([a, b]);
    let lo = u16::from_be_bytes([c, d]);
    let s = match form % 10 {
        0 => format!("::ffff:{v4}"),
        1 => format!("::ffff:{hi:x}:{lo:x}"),
        2 => format!("0:0:0:0:0:ffff:{hi:x}:{lo:x}"),
        3 => format!("64:ff9b::{v4}"),
        4 => format!("2002:{hi:x}:{lo:x}::1"),
        5 => "::1".to_owned(),
        6 => format!("fe80::{hi:x}:{lo:x}"),
        7 => format!("fd00:{hi:x}::{lo:x}"),
        8 => "0:0:0:0:0:0:0:1".to_owned(),
        _ => format!("ff02::{lo:x}"),
    };
    if upper {
        s.to_uppercase()
    } else {
        s
    }
}

fn url_shaped() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec!["https", "HTTPS", "http", "ftp", "javascript", "file", "", "https:/", "hTTps"]);
    let userinfo = prop::sample::select(vec!["", "", "", "user@", "user:pw@", "@", "a%40b@", "169.254.169.254@"]);
    let host = prop_oneof![
        "[a-z0-9.-]{1,20}",
        "[0-9.]{1,20}",
        "(0x)?[0-9a-fA-F.]{1,16}",
        "[\u{ff10}-\u{ff19}\u{0660}-\u{0669}\u{0966}-\u{096f}0-9.\u{3002}\u{ff0e}\u{ff61}]{1,16}",
        "\\[[0-9a-fA-F:.%]{0,30}\\]?",
        "(%[0-9a-fA-F]{2}|[a-z0-9.]){1,12}",
        "[\\PC&&[^/?#@:\\[\\]]]{1,12}",
    ];
    let port = prop::sample::select(vec!["", "", ":443", ":0", ":65535", ":65536", ":-1", ":08", ":"]);
    let path = prop::sample::select(vec!["", "/", "/hook?x=1", "/../../etc", "#frag", "\\\\evil", "/%2e%2e"]);
    (scheme, userinfo, host, port, path).prop_map(|(s, u, h, p, pa)| format!("{s}://{u}{h}{p}{pa}"))
}

/// What an accepted URL must be: https (the default guard), no user info, and a host that is a public address or a
/// DNS name that is not an address and not a blocked name. Re-checking the normalised URL gives the same target.
fn check_allowed(g: &EgressGuard, url: &str) -> Result<(), TestCaseError> {
    let Ok(t) = g.check_url(url) else { return Ok(()) };
    prop_assert_eq!(t.url.scheme(), "https", "{}", url);
    prop_assert!(t.url.username().is_empty() && t.url.password().is_none(), "{}", url);
    match &t.host {
        TargetHost::Ip(ip) => prop_assert!(!non_public(*ip), "{url:?} allowed a non-public literal {ip}"),
        TargetHost::Name(n) => {
            prop_assert!(n.parse::<IpAddr>().is_err(), "{url:?}: the name {n} is an address");
            prop_assert!(n.is_ascii() && !n.is_empty(), "{url:?}: {n:?}");
            prop_assert!(n != "localhost" && !n.ends_with(".localhost") && n != "metadata.google.internal", "{url:?}: {n}");
        }
    }
    let again = g.check_url(t.url.as_str());
    prop_assert!(again.is_ok(), "{url:?}: the normalised {} is refused: {:?}", t.url, again.err());
    prop_assert_eq!(&again.unwrap().host, &t.host);
    Ok(())
}

proptest! {
    #![proptest_config(cases(10_000))]

    #[test]
    fn check_url_never_panics_on_any_string(s in any::<String>()) {
        check_allowed(&guard(), &s)?;
    }

    #[test]
    fn check_url_on_url_shaped_strings(url in url_shaped()) {
        check_allowed(&guard(), &url)?;
    }

    /// Every spelling of a non-public IPv4 address is refused, whatever digits, dots and encodings it uses.
    #[test]
    fn non_public_v4_is_refused_in_every_spelling(
        ip in non_public_v4(), form in any::<u8>(),
        dot in prop::sample::select(vec![".", ".", "\u{3002}", "\u{ff0e}", "\u{ff61}", "%2e"]),
        fullwidth in any::<bool>(), percent in any::<bool>(), trailing_dot in any::<bool>(),
        port in prop::sample::select(vec!["", ":443", ":8443"]),
    ) {
        prop_assert!(non_public(IpAddr::V4(ip)));
        let host = spell_v4(ip, form, dot, fullwidth, percent, trailing_dot);
        let url = format!("https://{host}{port}/x");
        let r = guard().check_url(&url);
        prop_assert!(r.is_err(), "{url:?} ({ip}) was allowed: {:?}", r.ok().map(|t| t.host));
    }

    #[test]
    fn non_public_v6_is_refused(ip in non_public_v4(), form in any::<u8>(), upper in any::<bool>()) {
        let lit = spell_v6(ip, form, upper);
        let parsed: Ipv6Addr = lit.parse().unwrap();
        prop_assert!(non_public(IpAddr::V6(parsed)), "{lit}");
        let url = format!("https://[{lit}]/x");
        let r = guard().check_url(&url);
        prop_assert!(r.is_err(), "{url:?} was allowed: {:?}", r.ok().map(|t| t.host));
    }
}

mod payload_filter_props {
    use hookline_core::payload_filter::{Data, EventFields, Filter};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            "[a-c0-2.]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c0-2]{1,2}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn path() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("id".to_owned()),
            Just("type".to_owned()),
            Just("data".to_owned()),
            prop::collection::vec("[a-c0-2]{1,2}", 1..4).prop_map(|s| format!("data.{}", s.join("."))),
        ]
    }

    fn filter_doc() -> impl Strategy<Value = Value> {
        let scalar = prop_oneof![
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            "[a-c0-2.]{0,4}".prop_map(Value::String),
            any::<bool>().prop_map(Value::Bool),
        ];
        let valid = prop_oneof![
            (path(), scalar.clone()).prop_map(|(p, v)| json!({"path": p, "eq": v})),
            (path(), any::<bool>()).prop_map(|(p, b)| json!({"path": p, "exists": b})),
            (path(), "[a-c0-2.]{0,3}").prop_map(|(p, s)| json!({"path": p, "prefix": s})),
            (path(), prop_oneof![Just("gt"), Just("gte"), Just("lt"), Just("lte")], any::<i64>())
                .prop_map(|(p, op, n)| json!({"path": p, op: n})),
        ];
        let op = prop_oneof![Just("eq"), Just("exists"), Just("prefix"), Just("gt"), Just("gte"), Just("lt"), Just("lte"), Just("like")];
        let any_cond = (path(), op, json_value()).prop_map(|(p, op, v)| json!({"path": p, op: v}));
        let cond = prop_oneof![4 => valid, 1 => any_cond];
        cond.prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 1..4).prop_map(|c| json!({"all": c})),
                prop::collection::vec(inner, 1..4).prop_map(|c| json!({"any": c})),
            ]
        })
    }

    proptest! {
        /// Any document either parses or is refused with a location; a parsed filter evaluates against any event
        /// without panicking, and its explanation agrees with the fast path.
        #[test]
        fn evaluation_never_panics_and_explain_agrees(doc in prop_oneof![6 => filter_doc(), 1 => json_value()], data in json_value(), raw in prop::collection::vec(any::<u8>(), 0..16)) {
            let Ok(filter) = Filter::parse(&doc) else {
                prop_assert!(Filter::parse(&doc).unwrap_err().location.starts_with("filter"));
                return Ok(());
            };
            let again = Filter::parse(&filter.to_json());
            prop_assert_eq!(again.as_ref(), Ok(&filter));
            for data in [Data::Json(data), Data::parse(&raw), Data::Absent] {
                let ev = EventFields {
                    id: "e",
                    event_type: "t.x",
                    tenant: "",
                    entity_id: "",
                    source: "",
                    subject: "",
                    extensions: None,
                    data: &data,
                };
                let m = filter.matches(&ev);
                prop_assert_eq!(filter.explain(&ev).matched, m);
            }
        }
    }
}
