//! The delivery log and replays: list a subscription's deliveries (filtered, paged), search by event or delivery
//! id, read one with every attempt, resend any finished one, replay everything since a time, redrive the
//! dead-letter topic. The log is the store (`hookline_log`), filled by the indexer: it may trail Kafka by a batch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use axum::Json;
use hookline_log::{AttemptRow, Cursor, DeliveryDetail, DeliveryRow, DeliveryState, ListQuery, Scope};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Principal;
use super::{ApiError, ApiJson, ApiQuery, ApiState};
use crate::replay;

/// Largest page (`limit`).
const MAX_LIMIT: usize = 500;
/// Longest a read may wait for the delivery log (`wait_ms`).
const MAX_WAIT_MS: u64 = 30_000;
/// How often a waiting read looks again when no indexer of this process wakes it (the log filled by another).
const WAIT_POLL: Duration = Duration::from_millis(250);

/// `wait_ms`: how long a read of something just published may wait for the delivery log to have it (the log trails
/// Kafka by about a batch). Woken as soon as the indexer stores a batch; answers as without it once time is up.
struct Wait {
    deadline: Option<tokio::time::Instant>,
    written: tokio::sync::watch::Receiver<u64>,
}

impl Wait {
    fn new(wait_ms: Option<u64>) -> Result<Self, ApiError> {
        if wait_ms.is_some_and(|w| w > MAX_WAIT_MS) {
            return Err(invalid_query("wait_ms", format!("must be between 0 and {MAX_WAIT_MS}")));
        }
        let deadline = wait_ms.filter(|w| *w > 0).map(|w| tokio::time::Instant::now() + Duration::from_millis(w));
        Ok(Self { deadline, written: hookline_log::written() })
    }

    /// False once the time is up (or no wait was asked for); else true after the next stored batch (or a poll).
    async fn again(&mut self) -> bool {
        let Some(deadline) = self.deadline else { return false };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        let _ = tokio::time::timeout((deadline - now).min(WAIT_POLL), self.written.changed()).await;
        true
    }
}

/// `?wait_ms=` on reads of one delivery.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    wait_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// A delivery state (`pending`, `succeeded`, `failed`, `dead`, `cancelled`, `skipped`).
    state: Option<String>,
    /// The status of the latest try (0: no response).
    http_status: Option<u16>,
    event_type: Option<String>,
    /// The deliveries of one event (at most one per subscription).
    event_id: Option<String>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: Option<usize>,
    after: Option<String>,
    /// Wait up to this long (ms) for the page to have at least one delivery.
    wait_ms: Option<u64>,
}

fn invalid_query(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", format!("{field}: {}", message.into())).with_field(field)
}

/// The store's query from the request's, every bad value refused naming its parameter (never an empty list).
fn list_query(scope: Scope, q: &LogQuery) -> Result<ListQuery, ApiError> {
    let mut lq = ListQuery::new(scope);
    lq.limit = q.limit.unwrap_or(50);
    if !(1..=MAX_LIMIT).contains(&lq.limit) {
        return Err(ApiError::field("limit", format!("must be between 1 and {MAX_LIMIT}")));
    }
    if let Some(st) = &q.state {
        lq.state = Some(st.parse::<DeliveryState>().map_err(|_| {
            invalid_query("state", format!("{st:?} is not a delivery state ({})", hookline_core::vocabulary::DELIVERY_STATES.join(", ")))
        })?);
    }
    if let Some(code) = q.http_status {
        if code != 0 && !(100..=599).contains(&code) {
            return Err(invalid_query("http_status", format!("{code} is not an HTTP status (100 to 599, or 0 for no response)")));
        }
        lq.http_status = Some(code);
    }
    if let Some(t) = &q.event_type {
        if t.is_empty() || t.len() > 256 {
            return Err(invalid_query("event_type", "must be 1 to 256 characters"));
        }
        lq.event_type = Some(t.clone());
    }
    if let (Some(since), Some(until)) = (q.since_ms, q.until_ms) {
        if until <= since {
            return Err(invalid_query("until_ms", "must be after since_ms"));
        }
    }
    lq.since_ms = q.since_ms;
    lq.until_ms = q.until_ms;
    if let Some(a) = &q.after {
        lq.after = Some(Cursor::decode(a).map_err(|e| invalid_query("after", e.to_string()))?);
    }
    Ok(lq)
}

/// Whether a row passes the list's filters (for the event-id search, which the store answers by event).
fn matches(d: &DeliveryRow, q: &ListQuery) -> bool {
    q.state.is_none_or(|s| d.state == s)
        && q.http_status.is_none_or(|c| d.last_http_status == c)
        && q.event_type.as_ref().is_none_or(|t| d.event_type == *t)
        && q.since_ms.is_none_or(|s| d.first_at_ms >= s)
        && q.until_ms.is_none_or(|u| d.first_at_ms < u)
        && q.after.as_ref().is_none_or(|c| (d.first_at_ms, d.delivery_id.as_str()) < (c.first_at_ms, c.delivery_id.as_str()))
}

pub async fn list(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Json<Value>, ApiError> {
    super::subscriptions::find(&s, &who, &id)?;
    let lq = list_query(Scope::Subscription(id.clone()), &q)?;
    let mut wait = Wait::new(q.wait_ms)?;
    let (items, next) = loop {
        let (items, next) = match &q.event_id {
            Some(event_id) => {
                let rows = s.log.by_event_id(event_id, None, MAX_LIMIT).await.map_err(ApiError::log_unavailable)?;
                let mut rows: Vec<DeliveryRow> = rows.into_iter().filter(|d| d.subscription_id == id && matches(d, &lq)).collect();
                rows.truncate(lq.page_size());
                (rows, None)
            }
            None => {
                let page = s.log.list(&lq).await.map_err(ApiError::log_unavailable)?;
                (page.items, page.next)
            }
        };
        if !items.is_empty() || !wait.again().await {
            break (items, next);
        }
    };
    Ok(Json(page_view(&s, items, next).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    event_id: Option<String>,
    delivery_id: Option<String>,
    /// Wait up to this long (ms) for at least one delivery.
    wait_ms: Option<u64>,
}

/// `GET /v1/deliveries?event_id=` (every subscription's delivery of the event) or `?delivery_id=`.
/// A tenant credential finds only its own tenant's deliveries.
pub async fn search(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    ApiQuery(q): ApiQuery<SearchQuery>,
) -> Result<Json<Value>, ApiError> {
    match (&q.event_id, &q.delivery_id) {
        (Some(e), None) if !e.is_empty() => {}
        (None, Some(d)) if !d.is_empty() => {}
        (Some(_), Some(_)) => return Err(invalid_query("delivery_id", "give event_id or delivery_id, not both")),
        (Some(_), None) => return Err(invalid_query("event_id", "must not be empty")),
        (None, Some(_)) => return Err(invalid_query("delivery_id", "must not be empty")),
        (None, None) => return Err(invalid_query("event_id", "give event_id or delivery_id to search by")),
    }
    let mut wait = Wait::new(q.wait_ms)?;
    let items = loop {
        let items: Vec<DeliveryRow> = match (&q.event_id, &q.delivery_id) {
            (Some(e), _) => s.log.by_event_id(e, who.tenant(), MAX_LIMIT).await.map_err(ApiError::log_unavailable)?,
            (None, Some(d)) => s.log.delivery(d).await.map_err(ApiError::log_unavailable)?.map(|d| d.delivery).into_iter().collect(),
            (None, None) => Vec::new(),
        };
        let items: Vec<DeliveryRow> = items.into_iter().filter(|d| visible(&s, &who, d)).collect();
        if !items.is_empty() || !wait.again().await {
            break items;
        }
    };
    Ok(Json(page_view(&s, items, None).await?))
}

async fn page_view(s: &ApiState, items: Vec<DeliveryRow>, next: Option<Cursor>) -> Result<Value, ApiError> {
    let last = s.log.last_attempts(&items).await.map_err(ApiError::log_unavailable)?;
    let progress = s.log.progress().await.map_err(ApiError::log_unavailable)?;
    Ok(json!({
        "items": items.iter().map(|d| list_view(d, &last)).collect::<Vec<_>>(),
        "next_after": next.map(|c| c.encode()),
        // How far the history trailed the topics when the indexer last wrote (a page may lack the newest
        // deliveries by that much; null before the indexer's first batch).
        "history": progress.map(|p| json!({"behind_ms": p.behind_ms(), "as_of_ms": p.indexed_at_ms})),
    }))
}

fn list_view(d: &DeliveryRow, last: &HashMap<String, AttemptRow>) -> Value {
    // Events are indexed with their deliveries: a finished delivery of a known event can be resent.
    let mut v = view(d, d.state != DeliveryState::Pending && !d.event_id.is_empty());
    v["last_attempt"] = last.get(&d.delivery_id).map_or(Value::Null, |a| attempt_view(a, false));
    v
}

/// Whether this credential may see the delivery: a tenant's, only while its subscription is the tenant's (a
/// delivery whose subscription is gone says nothing about whose it was).
fn visible(s: &ApiState, who: &Principal, d: &DeliveryRow) -> bool {
    who.tenant().is_none() || s.subs.get(&d.subscription_id).is_some_and(|e| who.sees(&e.sub.tenant))
}

/// Whether `event` is the delivery's own: of its subscription's tenant. The store finds an event by (tenant, id);
/// this also holds for a row indexed before events were keyed by tenant, whose tenant may name another tenant's
/// event of the same id. Such an event is never shown nor sent again.
fn own_event(s: &ApiState, d: &DeliveryRow, event: &hookline_core::model::Event) -> bool {
    match s.subs.get(&d.subscription_id) {
        Some(sub) => *sub.sub.tenant == *event.tenant,
        None => d.tenant == event.tenant,
    }
}

/// The delivery as this credential may see it, waiting (`wait_ms`) until `ready` says it is there as wanted; after
/// the wait, whatever the log has (`None`: not in it).
async fn find(
    s: &ApiState,
    who: &Principal,
    id: &str,
    wait_ms: Option<u64>,
    ready: fn(&DeliveryDetail) -> bool,
) -> Result<Option<DeliveryDetail>, ApiError> {
    let mut wait = Wait::new(wait_ms)?;
    loop {
        let d = s.log.delivery(id).await.map_err(ApiError::log_unavailable)?.filter(|d| visible(s, who, &d.delivery));
        if d.as_ref().is_some_and(ready) || !wait.again().await {
            return Ok(d);
        }
    }
}

pub async fn get(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<Value>, ApiError> {
    let d = find(&s, &who, &id, q.wait_ms, |_| true).await?.ok_or_else(|| not_found(&id))?;
    let event = d.event.as_ref().filter(|e| own_event(&s, &d.delivery, e));
    let mut v = view(&d.delivery, event.is_some() && d.delivery.state != DeliveryState::Pending);
    v["attempts"] = json!(d.attempts.iter().map(|a| attempt_view(a, true)).collect::<Vec<_>>());
    v["event"] = event.map_or(Value::Null, |e| {
        json!({
            "id": e.id,
            "type": e.r#type,
            "tenant": (!e.tenant.is_empty()).then_some(&e.tenant),
            "accepted_at_ms": e.accepted_at_ms,
            "source": (!e.source.is_empty()).then_some(&e.source),
            "subject": (!e.subject.is_empty()).then_some(&e.subject),
            "extensions": (!e.extensions.is_empty()).then(|| e.extensions.iter().collect::<std::collections::BTreeMap<_, _>>()),
            // What the receiver's body carries (as accepted); a body that is not JSON stays out.
            "data": serde_json::from_slice::<Value>(&e.data_json).unwrap_or(Value::Null),
            // The schema an upstream producer framed the record with (Confluent wire format); absent when unframed.
            "registry_schema_id": (e.registry_schema_id != 0).then_some(e.registry_schema_id),
        })
    });
    Ok(Json(v))
}

/// Resends one finished delivery, whatever its outcome: its stored event in a new run that continues the attempt
/// count. The subscription must be active (resume it first if it was paused). `wait_ms`: wait for the delivery to
/// be in the log, finished, with its event.
pub async fn replay_one(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let replayable = |d: &DeliveryDetail| d.delivery.state != DeliveryState::Pending && d.event.is_some();
    let d = find(&s, &who, &id, q.wait_ms, replayable).await?.ok_or_else(|| not_found(&id))?;
    who.require_write()?;
    let sub = s.subs.get(&d.delivery.subscription_id).ok_or_else(|| {
        ApiError::new(StatusCode::CONFLICT, "subscription_deleted", "the delivery's subscription was deleted").with_field("id")
    })?;
    require_active(&s, &sub)?;
    if d.delivery.state == DeliveryState::Pending {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "delivery_in_progress",
            "the delivery has not reached a final state yet (?wait_ms= waits for it)",
        )
        .with_field("id"));
    }
    let Some(event) = d.event else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "event_unavailable",
            "the delivery's event is not in the delivery log (older than log.retention_days, or not indexed yet)",
        )
        .with_field("id"));
    };
    if *event.tenant != *sub.sub.tenant {
        // Only a delivery made before tenant isolation can pair them; it is not sent again.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "event_unavailable",
            "the delivery's event belongs to another tenant than its subscription and is not sent again",
        ));
    }
    let n = replay::produce(&s, vec![replay::task(event, &d.delivery.subscription_id, d.delivery.attempts_made)])
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
            format!(
                "{r:?} is not the reason of a delivery's dead letter ({})",
                hookline_core::vocabulary::DeadLetterReason::delivery_words().join(", ")
            ),
        ));
    }
    let r = replay::redrive(&s, &f).await.map_err(ApiError::replay_failed)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"redriven": r.redriven, "skipped": r.skipped}))))
}

fn require_active(s: &ApiState, sub: &hookline_kafka::state::SubscriptionEntry) -> Result<(), ApiError> {
    let act = sub.sub.activity(s.states.get(&sub.sub.id).as_ref());
    if act.is_active() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "subscription_inactive",
        format!("the subscription is {} ({}); resume or enable it before replaying", act.word(), act.reason().unwrap_or("")),
    )
    .with_field("id"))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no delivery {id} in the delivery log (a delivery just made is there about 200 ms later: add ?wait_ms=5000 to wait for it)"
        ),
    )
    .with_field("id")
}

fn view(d: &DeliveryRow, replayable: bool) -> Value {
    json!({
        "delivery_id": d.delivery_id,
        "subscription_id": d.subscription_id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "state": d.state,
        // The policy's own word for the state (Fynapse's `DEAD_LETTER`): the one field with platform words.
        "platform_status": d.status_word,
        "attempts_made": d.attempts_made,
        "first_attempt_at_ms": d.first_at_ms,
        "last_attempt_at_ms": d.last_at_ms,
        "replayable": replayable,
        "dead_letter_reason": (!d.dead_letter_reason.is_empty()).then_some(&d.dead_letter_reason),
    })
}

fn attempt_view(a: &AttemptRow, detail: bool) -> Value {
    let mut v = json!({
        "attempt": a.attempt,
        "try": a.try_no,
        "started_at_ms": a.started_at_ms,
        "duration_ms": a.duration_ms,
        "outcome": a.outcome,
        "http_status": (a.http_status > 0).then_some(a.http_status),
        "reason": a.reason,
        "response_excerpt": a.response_excerpt,
        "verdict": a.verdict,
        // The policy's reasoning: which step decided, by which `classify` rule, and when the next attempt is due.
        "decided_by": a.decided_by,
        "rule": (a.rule > 0).then(|| json!({"number": a.rule, "when": a.rule_when})),
        "next_attempt_at_ms": (a.next_due_at_ms > 0).then_some(a.next_due_at_ms),
    });
    if detail {
        let pairs = |h: &[(String, String)]| h.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>();
        v["run_id"] = json!(a.run_id);
        // As sent and as received, secrets and signatures replaced by `<redacted>`.
        v["request_headers"] = json!(pairs(&a.request_headers));
        v["response_headers"] = json!(pairs(&a.response_headers));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(query: &str) -> Result<ListQuery, ApiError> {
        let q: LogQuery = serde_urlencoded::from_str(query).unwrap();
        list_query(Scope::Subscription("sub".into()), &q)
    }

    #[test]
    fn filters_parse_into_the_store_query() {
        let q = parse("state=dead&http_status=410&event_type=order.paid&since_ms=5&until_ms=9&limit=7&after=12.dlv_x").unwrap();
        assert_eq!(q.state, Some(DeliveryState::Dead));
        assert_eq!(
            (q.http_status, q.event_type.as_deref(), q.since_ms, q.until_ms, q.limit),
            (Some(410), Some("order.paid"), Some(5), Some(9), 7)
        );
        assert_eq!(q.after, Some(Cursor { first_at_ms: 12, delivery_id: "dlv_x".into() }));
        assert_eq!(parse("http_status=0").unwrap().http_status, Some(0), "0: no response");
        assert_eq!(parse("state=skipped").unwrap().state, Some(DeliveryState::Skipped));
    }

    #[test]
    fn every_bad_filter_names_its_parameter() {
        for (query, field, status) in [
            ("state=delivered", "state", 400),
            ("http_status=42", "http_status", 400),
            ("http_status=600", "http_status", 400),
            ("event_type=", "event_type", 400),
            ("since_ms=9&until_ms=9", "until_ms", 400),
            ("after=nope", "after", 400),
            ("limit=0", "limit", 422),
            ("limit=501", "limit", 422),
        ] {
            let e = parse(query).err().unwrap_or_else(|| panic!("{query} was accepted"));
            assert_eq!((e.status.as_u16(), e.field.as_deref()), (status, Some(field)), "{query}: {}", e.message);
        }
    }

    #[test]
    fn the_event_id_search_applies_the_other_filters_too() {
        let d = DeliveryRow {
            state: DeliveryState::Dead,
            last_http_status: 410,
            event_type: "a".into(),
            first_at_ms: 10,
            delivery_id: "d".into(),
            ..Default::default()
        };
        assert!(matches(&d, &parse("state=dead&http_status=410&event_type=a&since_ms=10&until_ms=11").unwrap()));
        for q in ["state=succeeded", "http_status=200", "event_type=b", "since_ms=11", "until_ms=10", "after=10.d", "after=9.z"] {
            assert!(!matches(&d, &parse(q).unwrap()), "{q}");
        }
        assert!(matches(&d, &parse("after=10.e").unwrap()), "older than the cursor (same ms, smaller id)");
    }
}
