//! The endpoint verification challenge (a policy with `[verification]`), the pure part: the request body, the
//! token, and whether an answer proves the endpoint wants hookline's deliveries.
//!
//! Request: `POST <url>`, signed like a delivery (the policy's scheme, the subscription's secrets and custom
//! headers), body
//! `{"type":"hookline.endpoint_verification","challenge":"<token>","subscription_id":"sub_..","timestamp_ms":..}`.
//! Answer: a 2xx whose body is the token itself, or a JSON object `{"challenge":"<token>"}`.

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
}
