//! Endpoint verification, sent by the API (the only writer of subscriptions) when a subscription whose policy has
//! `[verification]` is created, changes its URL, or is asked to (`POST /v1/subscriptions/{id}/verify`): the echo
//! challenge, or the CloudEvents validation handshake. The request goes through the dispatcher's egress-guarded
//! sender: the same guard, connector and deadline as a delivery. The decision (token, body, what counts as an echo
//! or a grant) is `hookline_core::verification`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use axum::Json;
use bytes::Bytes;
use hookline_core::model::{Subscription, VerificationState};
use hookline_core::policy::{Policy, VerificationMethod};
use hookline_core::request::{self, HeaderContext};
use hookline_core::verification::{self, handshake, AllowedRate, ChallengeFailure};
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

/// Sends the challenge (or the CloudEvents validation handshake) and records its result on `sub`: `verified`, or
/// `pending_verification` with the reason.
pub async fn challenge(s: &ApiState, sub: &mut Subscription, policy: &Policy) {
    let Some(rule) = &policy.verification else { return };
    let now = crate::now_ms();
    // Prepared like the dispatcher's entry: the same secrets, custom headers and egress route.
    let entry = SubscriptionEntry::new(sub.clone());
    let mut bounded = policy.clone();
    bounded.attempt.timeout_ms = rule.timeout_ms;
    let result = match (rule.method, rule.origin.as_deref()) {
        (VerificationMethod::Challenge, _) => echo(s, sub, &entry, &bounded, now).await.map(|()| None),
        (VerificationMethod::Cloudevents, Some(origin)) => cloudevents_handshake(s, sub, &entry, &bounded, origin).await.map(Some),
        // Validation requires an origin with this method; a policy without one cannot pass.
        (VerificationMethod::Cloudevents, None) => Err(ChallengeFailure::NotAnswered("verification.origin is not set".into())),
    };
    match result {
        Ok(granted) => {
            sub.verification = VerificationState::Verified as i32;
            sub.verification_error.clear();
            sub.verified_at_ms = now;
            sub.verification_allowed_rate_per_min = granted.map_or(0, AllowedRate::per_min);
            metrics::counter!("hookline_verification_challenges_total", "result" => "verified").increment(1);
        }
        Err(e) => {
            sub.verification = VerificationState::Pending as i32;
            sub.verification_error = e.to_string();
            sub.verification_allowed_rate_per_min = 0;
            metrics::counter!("hookline_verification_challenges_total", "result" => "failed").increment(1);
            tracing::info!(subscription = %sub.id, reason = %sub.verification_error, "endpoint verification failed");
        }
    }
}

/// The echo challenge: a signed POST whose token the endpoint must send back.
async fn echo(s: &ApiState, sub: &Subscription, entry: &SubscriptionEntry, policy: &Policy, now: i64) -> Result<(), ChallengeFailure> {
    let token = verification::token(&mut rand::rng());
    let id = verification::challenge_id(&token);
    let body = verification::body(&sub.id, &token, now);
    let secrets = entry.signing_secrets(now);
    let ctx = HeaderContext {
        event_id: &id,
        event_type: verification::CHALLENGE_TYPE,
        delivery_id: &id,
        subscription_id: &sub.id,
        attempt_number: 1,
        now_ms: now,
        secrets: &secrets,
        event: None,
    };
    let headers =
        request::headers(policy, &ctx, &body).map_err(|e| ChallengeFailure::NotAnswered(format!("cannot sign the challenge: {e}")))?;
    let answer = s.challenger.sender.send_owned(&entry.egress_key, policy, &sub.url, headers, &entry.headers, Bytes::from(body)).await;
    match answer.outcome {
        Outcome::Http { status, .. } => verification::check_answer(status, &answer.response_excerpt, &token),
        _ => Err(ChallengeFailure::NotAnswered(answer.reason)),
    }
}

/// The CloudEvents validation handshake: `OPTIONS` with the policy's origin, asking for the subscription's rate
/// limit (requests a minute) when it has one. A grant below that rate passes: hookline does not slow down to it
/// (the receiver's 429s then follow the policy's rules); it is kept on the subscription and logged.
async fn cloudevents_handshake(
    s: &ApiState,
    sub: &Subscription,
    entry: &SubscriptionEntry,
    policy: &Policy,
    origin: &str,
) -> Result<AllowedRate, ChallengeFailure> {
    let requested = hookline_core::rate_limit::effective(sub.rate_limit_per_s, sub.burst, policy).map(|l| l.per_s.saturating_mul(60));
    let headers = verification::handshake_headers(origin, requested);
    let answer = s.challenger.sender.send_options(&entry.egress_key, policy, &sub.url, headers, &entry.headers).await;
    let Outcome::Http { status, .. } = answer.outcome else { return Err(ChallengeFailure::NotAnswered(answer.reason)) };
    let first = |name: &str| {
        answer.response_headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| String::from_utf8_lossy(&h.value).into_owned())
    };
    let (allowed_origin, allowed_rate) = (first(handshake::ALLOWED_ORIGIN), first(handshake::ALLOWED_RATE));
    let granted = verification::check_handshake(status, allowed_origin.as_deref(), allowed_rate.as_deref(), origin, requested)?;
    if granted.is_below(requested) {
        tracing::warn!(
            subscription = %sub.id,
            granted_per_min = granted.per_min(),
            requested_per_min = requested.unwrap_or(0),
            "the endpoint allows fewer requests a minute than the subscription's rate limit; it may answer 429 above its grant"
        );
    }
    Ok(granted)
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
