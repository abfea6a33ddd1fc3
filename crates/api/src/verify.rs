//! The endpoint verification challenge, sent by the API (the only writer of subscriptions) when a subscription
//! whose policy has `[verification]` is created, changes its URL, or is asked to (`POST /v1/subscriptions/{id}/verify`).
//! The request goes through the dispatcher's egress-guarded sender: the same guard, connector and deadline as a
//! delivery. The decision (token, body, what counts as an echo) is `hookline_core::verification`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use axum::Json;
use bytes::Bytes;
use hookline_core::model::{Subscription, VerificationState};
use hookline_core::policy::Policy;
use hookline_core::request::{self, HeaderContext};
use hookline_core::verification::{self, ChallengeFailure};
use hookline_core::Outcome;
use hookline_kafka::state::SubscriptionEntry;
use serde_json::Value;

use super::{ApiError, ApiState};

/// Sends challenges; one per ingest process, sharing its connection pools between subscriptions with equal rules.
pub struct Challenger {
    sender: hookline_dispatcher::sender::Sender,
}

impl Challenger {
    pub fn new(egress: hookline_core::egress::EgressSettings) -> Self {
        Self { sender: hookline_dispatcher::sender::Sender::new(egress, Arc::new(hookline_dispatcher::connector::SystemResolver)) }
    }
}

/// Whether saving `sub` (previously `before`, `None` on create) must challenge its endpoint under `policy`, and
/// sets the verification fields a save without a challenge leaves: none when the policy asks for none.
pub fn needs_challenge(sub: &mut Subscription, before: Option<&Subscription>, policy: &Policy) -> bool {
    if policy.verification.is_none() {
        sub.verification = VerificationState::Unspecified as i32;
        sub.verification_error.clear();
        return false;
    }
    match before {
        None => true,
        Some(old) => old.url != sub.url || sub.verification != VerificationState::Verified as i32,
    }
}

/// Sends the challenge and records its result on `sub`: `verified`, or `pending_verification` with the reason.
pub async fn challenge(s: &ApiState, sub: &mut Subscription, policy: &Policy) {
    let Some(rule) = &policy.verification else { return };
    let now = crate::now_ms();
    let token = verification::token(&mut rand::rng());
    let id = verification::challenge_id(&token);
    let body = verification::body(&sub.id, &token, now);
    // Prepared like the dispatcher's entry: the same secrets, custom headers and egress route.
    let entry = SubscriptionEntry::new(sub.clone());
    let secrets = entry.signing_secrets(now);
    let ctx = HeaderContext {
        event_id: &id,
        event_type: verification::CHALLENGE_TYPE,
        delivery_id: &id,
        subscription_id: &sub.id,
        attempt_number: 1,
        now_ms: now,
        secrets: &secrets,
    };
    let result = match request::headers(policy, &ctx, &body) {
        Err(e) => Err(ChallengeFailure::NotAnswered(format!("cannot sign the challenge: {e}"))),
        Ok(headers) => {
            let mut bounded = policy.clone();
            bounded.attempt.timeout_ms = rule.timeout_ms;
            let answer =
                s.challenger.sender.send_owned(&entry.egress_key, &bounded, &sub.url, headers, &entry.headers, Bytes::from(body)).await;
            match answer.outcome {
                Outcome::Http { status, .. } => verification::check_answer(status, &answer.response_excerpt, &token),
                _ => Err(ChallengeFailure::NotAnswered(answer.reason)),
            }
        }
    };
    match result {
        Ok(()) => {
            sub.verification = VerificationState::Verified as i32;
            sub.verification_error.clear();
            sub.verified_at_ms = now;
            metrics::counter!("hookline_verification_challenges_total", "result" => "verified").increment(1);
        }
        Err(e) => {
            sub.verification = VerificationState::Pending as i32;
            sub.verification_error = e.to_string();
            metrics::counter!("hookline_verification_challenges_total", "result" => "failed").increment(1);
            tracing::info!(subscription = %sub.id, reason = %sub.verification_error, "endpoint verification failed");
        }
    }
}

/// `POST /v1/subscriptions/{id}/verify`: sends a new challenge, whatever the current state, and answers with the
/// subscription (its `verification` and `verification_error` say how it went).
pub async fn verify(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<super::auth::Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require_write()?;
    let entry = super::subscriptions::find(&s, &who, &id)?;
    let policy = entry.policy.clone().map_err(|e| ApiError::field("policy", e))?;
    if policy.verification.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "verification_not_required",
            format!("policy {} has no [verification] section; the endpoint needs no challenge", policy.name),
        )
        .with_field("id"));
    }
    let mut sub = entry.sub.to_subscription();
    challenge(&s, &mut sub, &policy).await;
    sub.updated_at_ms = crate::now_ms();
    super::subscriptions::write(&s, &sub).await?;
    Ok(Json(super::subscriptions::shown(&s, &SubscriptionEntry::new(sub)).await))
}
