//! The `when` matcher language of classification rules, and the outcome keys it matches against.

use crate::outcome::Outcome;

/// HTTP statuses a policy can classify. Anything outside is not a status RFC 9110 gives a class to, so the
/// engine reads it as a malformed response (`connect_error`).
pub const STATUS_RANGE: std::ops::RangeInclusive<u16> = 100..=599;

/// What a rule is matched against: a classifiable status or one of the non-HTTP outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKey {
    Status(u16),
    Timeout,
    ConnectError,
    TlsError,
    EgressRefused,
    InvalidUrl,
}

impl OutcomeKey {
    /// The key an outcome is classified by. A status outside 100-599 is a malformed response.
    pub fn of(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Http { status, .. } if STATUS_RANGE.contains(status) => OutcomeKey::Status(*status),
            Outcome::Http { .. } | Outcome::ConnectError => OutcomeKey::ConnectError,
            Outcome::Timeout => OutcomeKey::Timeout,
            Outcome::TlsError => OutcomeKey::TlsError,
            Outcome::EgressRefused => OutcomeKey::EgressRefused,
            Outcome::InvalidUrl => OutcomeKey::InvalidUrl,
        }
    }

    /// Every key there is: each classifiable status, then the non-HTTP outcomes.
    pub fn all() -> impl Iterator<Item = OutcomeKey> {
        STATUS_RANGE.map(OutcomeKey::Status).chain([
            OutcomeKey::Timeout,
            OutcomeKey::ConnectError,
            OutcomeKey::TlsError,
            OutcomeKey::EgressRefused,
            OutcomeKey::InvalidUrl,
        ])
    }

    pub fn describe(self) -> String {
        match self {
            OutcomeKey::Status(s) => format!("status {s}"),
            OutcomeKey::Timeout => "timeout".into(),
            OutcomeKey::ConnectError => "connect_error".into(),
            OutcomeKey::TlsError => "tls_error".into(),
            OutcomeKey::EgressRefused => "egress_refused".into(),
            OutcomeKey::InvalidUrl => "invalid_url".into(),
        }
    }
}

/// One parsed `when` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matcher {
    /// `any`: every outcome.
    Any,
    /// `any_status`: every HTTP response.
    AnyStatus,
    /// `200-299`, `503` (a range of one).
    Statuses(u16, u16),
    /// `timeout`, `connect_error`, ...
    Token(OutcomeKey),
}

impl Matcher {
    /// Parses one matcher; the error says what is wrong and what is accepted.
    pub fn parse(text: &str) -> Result<Matcher, String> {
        let t = text.trim();
        let fail = |why: &str| Err(format!("unknown matcher {text:?}: {why}"));
        match t {
            "any" => return Ok(Matcher::Any),
            "any_status" => return Ok(Matcher::AnyStatus),
            "timeout" => return Ok(Matcher::Token(OutcomeKey::Timeout)),
            "connect_error" => return Ok(Matcher::Token(OutcomeKey::ConnectError)),
            "tls_error" => return Ok(Matcher::Token(OutcomeKey::TlsError)),
            "egress_refused" => return Ok(Matcher::Token(OutcomeKey::EgressRefused)),
            "invalid_url" => return Ok(Matcher::Token(OutcomeKey::InvalidUrl)),
            _ => {}
        }
        let b = t.as_bytes();
        // A class: `2xx`.
        if b.len() == 3 && b[1..].eq_ignore_ascii_case(b"xx") {
            return match b[0] {
                d @ b'1'..=b'5' => {
                    let lo = u16::from(d - b'0') * 100;
                    Ok(Matcher::Statuses(lo, lo + 99))
                }
                _ => fail("a status class is 1xx to 5xx"),
            };
        }
        let status = |s: &str| -> Option<u16> {
            if s.len() == 3 && s.bytes().all(|c| c.is_ascii_digit()) {
                s.parse::<u16>().ok().filter(|n| STATUS_RANGE.contains(n))
            } else {
                None
            }
        };
        if let Some((lo, hi)) = t.split_once('-') {
            return match (status(lo.trim()), status(hi.trim())) {
                (Some(lo), Some(hi)) if lo <= hi => Ok(Matcher::Statuses(lo, hi)),
                (Some(_), Some(_)) => fail("a range goes from low to high"),
                _ => fail("a range is two statuses from 100 to 599, e.g. \"500-599\""),
            };
        }
        match status(t) {
            Some(s) => Ok(Matcher::Statuses(s, s)),
            None => fail(
                "expected a status (100-599), a class (\"5xx\"), a range (\"500-599\"), \"any_status\", \"any\", \
                 or one of timeout, connect_error, tls_error, egress_refused, invalid_url",
            ),
        }
    }

    pub fn matches(self, key: OutcomeKey) -> bool {
        match (self, key) {
            (Matcher::Any, _) => true,
            (Matcher::AnyStatus, OutcomeKey::Status(_)) => true,
            (Matcher::Statuses(lo, hi), OutcomeKey::Status(s)) => (lo..=hi).contains(&s),
            (Matcher::Token(t), k) => t == k,
            _ => false,
        }
    }
}

/// Whether any of a rule's `when` entries matches. An entry that does not parse matches nothing (validation
/// rejects it; an unvalidated policy must still never panic).
pub fn when_matches(when: &[String], key: OutcomeKey) -> bool {
    when.iter().any(|w| Matcher::parse(w).is_ok_and(|m| m.matches(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_form() {
        let cases = [
            ("2xx", Matcher::Statuses(200, 299)),
            ("5XX", Matcher::Statuses(500, 599)),
            ("503", Matcher::Statuses(503, 503)),
            ("500-599", Matcher::Statuses(500, 599)),
            ("any_status", Matcher::AnyStatus),
            ("any", Matcher::Any),
            ("timeout", Matcher::Token(OutcomeKey::Timeout)),
            ("connect_error", Matcher::Token(OutcomeKey::ConnectError)),
            ("tls_error", Matcher::Token(OutcomeKey::TlsError)),
            ("egress_refused", Matcher::Token(OutcomeKey::EgressRefused)),
            ("invalid_url", Matcher::Token(OutcomeKey::InvalidUrl)),
        ];
        for (text, want) in cases {
            assert_eq!(Matcher::parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        for bad in ["5xxx", "6xx", "0xx", "99", "600", "1000", "599-500", "500-", "-500", "", "Timeout!", "50x"] {
            let err = Matcher::parse(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn odd_statuses_are_malformed_responses() {
        assert_eq!(OutcomeKey::of(&Outcome::http(99)), OutcomeKey::ConnectError);
        assert_eq!(OutcomeKey::of(&Outcome::http(600)), OutcomeKey::ConnectError);
        assert_eq!(OutcomeKey::of(&Outcome::http(599)), OutcomeKey::Status(599));
    }
}
