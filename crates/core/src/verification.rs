//! Endpoint verification (a policy with `[verification]`), the pure part: what is sent, and whether an answer
//! proves the endpoint wants hookline's deliveries. Two methods:
//!
//! - `challenge`: `POST <url>`, signed like a delivery (the policy's scheme, the subscription's secrets and custom
//!   headers), body
//!   `{"type":"hookline.endpoint_verification","challenge":"<token>","subscription_id":"sub_..","timestamp_ms":..}`.
//!   Answer: a 2xx whose body is the token itself, or a JSON object `{"challenge":"<token>"}`.
//! - `cloudevents`: the CloudEvents web hooks validation handshake (HTTP 1.1 Web Hooks for Event Delivery,
//!   section 4): `OPTIONS <url>` with `WebHook-Request-Origin` (and `WebHook-Request-Rate` when the subscription
//!   has a rate limit). Answer: a 2xx whose `WebHook-Allowed-Origin` is the origin or `*`, and whose
//!   `WebHook-Allowed-Rate` (required when a rate was asked for) is `*` or requests a minute.

use rand::Rng;
use serde_json::{json, Value};

/// The event type a challenge carries (also in its `type`-header, when the policy sends one).
pub const CHALLENGE_TYPE: &str = "hookline.endpoint_verification";

/// A fresh random token: 32 bytes, hex.
pub fn token(rng: &mut impl Rng) -> String {
    let bytes: [u8; 32] = rng.random();
    hex::encode(bytes)
}

/// The id a challenge is signed under (the Standard Webhooks `webhook-id`): distinct per challenge.
pub fn challenge_id(token: &str) -> String {
    format!("chl_{}", &token[..token.len().min(24)])
}

pub fn body(subscription_id: &str, token: &str, now_ms: i64) -> Vec<u8> {
    json!({"type": CHALLENGE_TYPE, "challenge": token, "subscription_id": subscription_id, "timestamp_ms": now_ms}).to_string().into_bytes()
}

/// Why an endpoint did not pass; shown on the subscription as `verification_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChallengeFailure {
    /// No answer: refused by the egress guard, connection error, timeout (the reason as an attempt records it).
    #[error("the challenge was not answered: {0}")]
    NotAnswered(String),
    #[error("the endpoint answered HTTP {0}; a 2xx echoing the challenge is required")]
    Status(u16),
    #[error("the endpoint answered 2xx without echoing the challenge (the body must be the token, or {{\"challenge\":\"<token>\"}})")]
    NotEchoed,
    #[error("the endpoint answered HTTP {0} to the CloudEvents validation request (OPTIONS); a 2xx with a WebHook-Allowed-Origin header is required")]
    HandshakeStatus(u16),
    #[error("the endpoint answered the CloudEvents validation request without a WebHook-Allowed-Origin header: it did not allow deliveries from origin {origin}")]
    OriginMissing { origin: String },
    #[error("the endpoint answered WebHook-Allowed-Origin: {allowed}; it must be the origin asked for ({origin}) or *")]
    OriginMismatch { allowed: String, origin: String },
    #[error("the CloudEvents validation request asked for {requested} requests a minute (WebHook-Request-Rate) and the answer has no WebHook-Allowed-Rate header")]
    RateMissing { requested: u32 },
    #[error("the endpoint answered WebHook-Allowed-Rate: {0}; it must be * or a positive number of requests a minute")]
    RateMalformed(String),
}

/// Header names of the CloudEvents validation handshake.
pub mod handshake {
    pub const REQUEST_ORIGIN: &str = "WebHook-Request-Origin";
    pub const REQUEST_RATE: &str = "WebHook-Request-Rate";
    pub const ALLOWED_ORIGIN: &str = "WebHook-Allowed-Origin";
    pub const ALLOWED_RATE: &str = "WebHook-Allowed-Rate";
}

/// The headers of a CloudEvents validation request (`OPTIONS`), after which the caller adds the subscription's
/// custom headers. `rate_per_min`: the subscription's rate limit, asked for as `WebHook-Request-Rate`.
pub fn handshake_headers(origin: &str, rate_per_min: Option<u32>) -> crate::request::AttemptHeaders {
    use std::borrow::Cow;
    let mut h = vec![
        (Cow::Borrowed("user-agent"), crate::request::USER_AGENT.to_owned()),
        (Cow::Borrowed(handshake::REQUEST_ORIGIN), origin.to_owned()),
    ];
    if let Some(rate) = rate_per_min.filter(|r| *r > 0) {
        h.push((Cow::Borrowed(handshake::REQUEST_RATE), rate.to_string()));
    }
    crate::request::AttemptHeaders(h)
}

/// What a passed CloudEvents handshake granted in `WebHook-Allowed-Rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllowedRate {
    /// `*`.
    Unlimited,
    /// Requests a minute.
    PerMinute(u32),
    /// No header (allowed only when no rate was asked for).
    NotStated,
}

impl AllowedRate {
    /// As the subscription keeps it (`verification_allowed_rate_per_min`): requests a minute, 0 for no limit.
    pub fn per_min(self) -> u32 {
        match self {
            AllowedRate::PerMinute(n) => n,
            AllowedRate::Unlimited | AllowedRate::NotStated => 0,
        }
    }

    /// Whether it is fewer requests a minute than `requested`.
    pub fn is_below(self, requested: Option<u32>) -> bool {
        matches!((self, requested), (AllowedRate::PerMinute(n), Some(r)) if n < r)
    }
}

/// Judges a CloudEvents handshake answer: its status, and its first `WebHook-Allowed-Origin` and
/// `WebHook-Allowed-Rate` values. `origin` and `requested` are what the request asked for.
pub fn check_handshake(
    status: u16,
    allowed_origin: Option<&str>,
    allowed_rate: Option<&str>,
    origin: &str,
    requested: Option<u32>,
) -> Result<AllowedRate, ChallengeFailure> {
    if !(200..=299).contains(&status) {
        return Err(ChallengeFailure::HandshakeStatus(status));
    }
    match allowed_origin.map(str::trim) {
        None | Some("") => return Err(ChallengeFailure::OriginMissing { origin: origin.to_owned() }),
        // DNS names compare without case.
        Some(a) if a == "*" || a.eq_ignore_ascii_case(origin) => {}
        Some(a) => return Err(ChallengeFailure::OriginMismatch { allowed: shown(a), origin: origin.to_owned() }),
    }
    match allowed_rate.map(str::trim) {
        None | Some("") => match requested.filter(|r| *r > 0) {
            Some(requested) => Err(ChallengeFailure::RateMissing { requested }),
            None => Ok(AllowedRate::NotStated),
        },
        Some("*") => Ok(AllowedRate::Unlimited),
        Some(r) => match r.parse::<u32>() {
            // Digits only: `parse` takes a leading `+`.
            Ok(n) if n > 0 && r.bytes().all(|b| b.is_ascii_digit()) => Ok(AllowedRate::PerMinute(n)),
            _ => Err(ChallengeFailure::RateMalformed(shown(r))),
        },
    }
}

/// A receiver's header value as an error message quotes it: at most 100 characters.
fn shown(v: &str) -> String {
    match v.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &v[..i]),
        None => v.to_owned(),
    }
}

/// Judges an answer: `status` and the start of its body (at least the token's length is kept).
pub fn check_answer(status: u16, body: &str, token: &str) -> Result<(), ChallengeFailure> {
    if !(200..=299).contains(&status) {
        return Err(ChallengeFailure::Status(status));
    }
    let text = body.trim();
    if text == token {
        return Ok(());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) if m.get("challenge").and_then(Value::as_str) == Some(token) => Ok(()),
        _ => Err(ChallengeFailure::NotEchoed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        let t = token(&mut rand::rng());
        assert_eq!(t.len(), 64);
        assert_ne!(t, token(&mut rand::rng()));
        assert_eq!(check_answer(200, &t, &t), Ok(()));
        assert_eq!(check_answer(204, &format!("  {t}\n"), &t), Ok(()));
        assert_eq!(check_answer(200, &format!(r#"{{"challenge":"{t}"}}"#), &t), Ok(()));
        assert_eq!(check_answer(200, "ok", &t), Err(ChallengeFailure::NotEchoed));
        assert_eq!(check_answer(200, "", &t), Err(ChallengeFailure::NotEchoed));
        assert_eq!(check_answer(200, r#"{"challenge":"other"}"#, &t), Err(ChallengeFailure::NotEchoed));
        assert_eq!(check_answer(302, &t, &t), Err(ChallengeFailure::Status(302)));
        let b: Value = serde_json::from_slice(&body("sub_1", &t, 7)).unwrap();
        assert_eq!(b, json!({"type": CHALLENGE_TYPE, "challenge": t, "subscription_id": "sub_1", "timestamp_ms": 7}));
        assert!(challenge_id(&t).starts_with("chl_"));
    }

    #[test]
    fn a_handshake_passes_only_with_the_origin_granted() {
        let o = "hooks.example.com";
        assert_eq!(check_handshake(200, Some(o), None, o, None), Ok(AllowedRate::NotStated));
        assert_eq!(check_handshake(204, Some(" * "), Some("*"), o, Some(600)), Ok(AllowedRate::Unlimited));
        assert_eq!(check_handshake(200, Some("Hooks.Example.com"), Some("120"), o, Some(600)), Ok(AllowedRate::PerMinute(120)));
        assert_eq!(check_handshake(405, Some(o), None, o, None), Err(ChallengeFailure::HandshakeStatus(405)));
        let missing = check_handshake(200, None, None, o, None).unwrap_err();
        assert_eq!(missing, ChallengeFailure::OriginMissing { origin: o.into() });
        assert!(missing.to_string().contains("without a WebHook-Allowed-Origin header"), "{missing}");
        let other = check_handshake(200, Some("evil.example"), None, o, None).unwrap_err();
        assert!(other.to_string().contains("WebHook-Allowed-Origin: evil.example; it must be"), "{other}");
        let no_rate = check_handshake(200, Some(o), None, o, Some(600)).unwrap_err();
        assert_eq!(no_rate, ChallengeFailure::RateMissing { requested: 600 });
        assert!(no_rate.to_string().contains("no WebHook-Allowed-Rate header"));
        for bad in ["0", "-5", "+5", "1.5", "lots", "99999999999"] {
            assert_eq!(check_handshake(200, Some(o), Some(bad), o, None), Err(ChallengeFailure::RateMalformed(bad.into())), "{bad}");
        }
        let long = "x".repeat(5000);
        assert!(check_handshake(200, Some(&long), None, o, None).unwrap_err().to_string().len() < 300, "a receiver's value is cut");
    }

    #[test]
    fn a_grant_below_the_rate_asked_for_is_told_apart() {
        assert!(AllowedRate::PerMinute(30).is_below(Some(600)));
        assert!(!AllowedRate::PerMinute(600).is_below(Some(600)));
        assert!(!AllowedRate::Unlimited.is_below(Some(600)));
        assert!(!AllowedRate::PerMinute(30).is_below(None));
        assert_eq!((AllowedRate::PerMinute(30).per_min(), AllowedRate::Unlimited.per_min()), (30, 0));
        let h = handshake_headers("hooks.example.com", Some(600));
        assert_eq!(h.get("webhook-request-origin"), Some("hooks.example.com"));
        assert_eq!(h.get("webhook-request-rate"), Some("600"));
        assert_eq!(handshake_headers("o", None).get("webhook-request-rate"), None);
    }
}
