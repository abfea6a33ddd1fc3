//! The delivery log and replays: list a subscription's deliveries, read one with every attempt, replay one,
//! replay everything since a time, redrive the dead-letter topic.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use hookline_core::subscription::activity;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Principal;
use super::{ApiError, ApiJson, ApiQuery, ApiState};
use crate::delivery_log::{DeliveryEntry, Filter};
use crate::replay;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// A delivery state (`pending`, `succeeded`, `failed`, `dead`, `cancelled`, `skipped`).
    state: Option<String>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: Option<usize>,
    after: Option<String>,
}

pub async fn list(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Json<Value>, ApiError> {
    super::subscriptions::find(&s, &who, &id)?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::field("limit", "must be between 1 and 500"));
    }
    if let Some(st) = q.state.as_deref().filter(|st| !hookline_core::vocabulary::is_delivery_state(st)) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("state: {st:?} is not a delivery state ({})", hookline_core::vocabulary::DELIVERY_STATES.join(", ")),
        )
        .with_field("state"));
    }
    let filter = Filter { state: q.state.as_deref(), since_ms: q.since_ms, until_ms: q.until_ms };
    let page = s.log.list(&id, &filter, limit, q.after.as_deref());
    Ok(Json(json!({
        "items": page.items.iter().map(|e| view(e, false)).collect::<Vec<_>>(),
        "next_after": page.next,
    })))
}

pub async fn get(State(s): State<Arc<ApiState>>, Extension(who): Extension<Principal>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let entry = visible(&s, &who, &id)?;
    Ok(Json(view(&entry, true)))
}

/// The delivery `id` from the log, if its subscription is this credential's to see (a tenant credential cannot
/// see a delivery whose subscription is gone: nothing says whose it was).
fn visible(s: &ApiState, who: &Principal, id: &str) -> Result<DeliveryEntry, ApiError> {
    let entry = s.log.get(id).ok_or_else(|| not_found(id))?;
    if who.tenant().is_some() && s.subs.get(&entry.subscription_id).is_none_or(|e| !who.sees(&e.sub.tenant)) {
        return Err(not_found(id));
    }
    Ok(entry)
}

/// Replays one delivery. The subscription must be active (resume it first if it was paused), and the delivery
/// finished; its event must be known (dead-lettered deliveries carry it).
pub async fn replay_one(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let entry = visible(&s, &who, &id)?;
    who.require_write()?;
    let sub = s.subs.get(&entry.subscription_id).ok_or_else(|| {
        ApiError::new(StatusCode::CONFLICT, "subscription_deleted", "the delivery's subscription was deleted").with_field("id")
    })?;
    require_active(&s, &sub)?;
    if entry.state == "pending" {
        return Err(ApiError::new(StatusCode::CONFLICT, "delivery_in_progress", "the delivery has not reached a final state yet").with_field("id"));
    }
    let Some(event) = entry.event.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "event_unavailable",
            "only dead-lettered deliveries keep their event here; replay the time range with POST /v1/subscriptions/{id}/replay",
        )
        .with_field("id"));
    };
    if event.tenant != sub.sub.tenant {
        // Only a delivery made before tenant isolation can pair them; it is not sent again.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "event_unavailable",
            "the delivery's event belongs to another tenant than its subscription and is not sent again",
        ));
    }
    let n = replay::produce(&s, vec![replay::task(event, &entry.subscription_id, entry.attempts_made)])
        .await
        .map_err(ApiError::replay_failed)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"replayed": n, "delivery_id": id}))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySince {
    since_ms: i64,
    until_ms: Option<i64>,
}

pub async fn replay_since(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ReplaySince>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let sub = super::subscriptions::find(&s, &who, &id)?;
    who.require_write()?;
    require_active(&s, &sub)?;
    if req.until_ms.is_some_and(|u| u < req.since_ms) {
        return Err(ApiError::field("until_ms", "must not be before since_ms"));
    }
    let n = replay::since(&s, &sub, req.since_ms, req.until_ms).await.map_err(ApiError::replay_failed)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"replayed": n}))))
}

/// A tenant credential redrives only its own tenant's dead letters.
pub async fn redrive(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    ApiJson(mut f): ApiJson<replay::RedriveFilter>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    who.require_write()?;
    if let Some(sub) = &f.subscription_id {
        if who.tenant().is_some() {
            super::subscriptions::find(&s, &who, sub).map_err(|e| e.with_field("subscription_id"))?;
        }
    }
    f.tenant = who.tenant().map(str::to_owned);
    if let Some(st) = &f.final_state {
        if st != "failed" && st != "dead" {
            return Err(ApiError::field("final_state", "must be `failed` or `dead`"));
        }
    }
    // A documented-looking but unknown reason would silently match nothing.
    if let Some(r) = f.reason.as_deref().filter(|r| hookline_core::vocabulary::DeadLetterReason::delivery_reason(r).is_none()) {
        return Err(ApiError::field(
            "reason",
            format!("{r:?} is not the reason of a delivery's dead letter ({})", hookline_core::vocabulary::DeadLetterReason::delivery_words().join(", ")),
        ));
    }
    let r = replay::redrive(&s, &f).await.map_err(ApiError::replay_failed)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"redriven": r.redriven, "skipped": r.skipped}))))
}

fn require_active(s: &ApiState, sub: &hookline_kafka::state::SubscriptionEntry) -> Result<(), ApiError> {
    let act = activity(&sub.sub, s.states.get(&sub.sub.id).as_ref());
    if act.is_active() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "subscription_inactive",
        format!(
            "the subscription is {} ({}); resume or enable it before replaying",
            act.word(),
            act.reason().unwrap_or("")
        ),
    )
    .with_field("id"))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no delivery {id} in the delivery log")).with_field("id")
}

fn view(e: &DeliveryEntry, with_attempts: bool) -> Value {
    let mut v = json!({
        "delivery_id": e.delivery_id,
        "subscription_id": e.subscription_id,
        "event_id": e.event_id,
        "event_type": e.event_type,
        "state": e.state,
        // The policy's own word for the state (Fynapse's `DEAD_LETTER`): the one field with platform words.
        "platform_status": e.status_word,
        "attempts_made": e.attempts_made,
        "first_attempt_at_ms": e.first_at_ms,
        "last_attempt_at_ms": e.last_at_ms,
        "replayable": e.event.is_some() && e.state != "pending",
    });
    let attempts: Vec<Value> = e
        .attempts
        .iter()
        .map(|a| {
            json!({
                "attempt": a.attempt,
                "try": a.r#try,
                "started_at_ms": a.started_at_ms,
                "duration_ms": a.duration_ms,
                "outcome": a.outcome,
                "http_status": (a.http_status > 0).then_some(a.http_status),
                "reason": a.reason,
                "response_excerpt": a.response_excerpt,
                "verdict": a.verdict,
                "next_attempt_at_ms": (a.next_due_at_ms > 0).then_some(a.next_due_at_ms),
            })
        })
        .collect();
    if with_attempts {
        v["attempts"] = json!(attempts);
    } else {
        v["last_attempt"] = attempts.last().cloned().unwrap_or(Value::Null);
    }
    v
}
