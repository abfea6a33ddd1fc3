//! `POST /v1/events`: validate, produce to the events topic, answer 202 once Kafka acknowledged it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use prost::Message as _;
use serde_json::{json, Value};

use super::auth::Principal;
use super::{ApiError, ApiState};
use crate::decode::{self, Decoded};
use hookline_core::cloudevents::{Binding, Context};

/// A tenant API key publishes for its own tenant: the event gets it when it names none, and naming another is 403.
/// A portal link cannot publish.
pub async fn publish(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if matches!(who, Principal::PortalLink { .. }) {
        return Err(super::auth::forbidden("a portal link cannot publish events; use an admin token or the tenant's API key"));
    }
    let body = body.map_err(super::body_unreadable)?;
    // A CloudEvent in the HTTP binding: binary mode (`ce-*` headers, the body is the data, of any JSON or text
    // type) or structured mode (`application/cloudevents+json`).
    let ce = Context::from_headers(Binding::Http, headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())), None);
    if !ce.is_binary() && !ce.is_structured() {
        if super::media_type_is(&headers, "application/cloudevents-batch+json") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "batched CloudEvents are not accepted: send one event per request (binary or structured mode)",
            )
            .with_field("Content-Type"));
        }
        super::require_json(
            &headers,
            "send the event as JSON with `Content-Type: application/json`, or as a CloudEvent (`ce-*` headers, or `Content-Type: application/cloudevents+json`)",
        )?;
    }
    let decoded = decode::decode_record(Some(&body), &ce, s.max_event_bytes, true).map_err(|e| {
        let status = if e.reason == "oversize" { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::UNPROCESSABLE_ENTITY };
        ApiError::new(status, e.reason, e.detail).with_field(e.field.unwrap_or("body"))
    })?;
    let Decoded::Event(mut event) = decoded else {
        return Err(
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "empty", "a CloudEvent without data has nothing to deliver").with_field("body")
        );
    };
    event.tenant = who.tenant_for(Some(&event.tenant), "tenant")?.unwrap_or_default();
    admit(&s, &who, &event.tenant)?;
    // Against its catalogued type's schema (compiled when the catalogue was read), before anything is written.
    super::event_types::check_event(&s, &event.r#type, &event.data_json)?;
    event.accepted_at_ms = crate::now_ms();
    let header = |name: &str| headers.get(name).map(|v| v.as_bytes());
    s.tracer.accept_http(&mut event, header("traceparent"), header("tracestate"));
    // Re-encoded as protobuf: validated once here, decoded cheaply by the fan-out.
    // Keyed by the entity when it names one: one entity's events share an events partition, so the fan-out (and an
    // ordered subscription, `ordering_key = "entity_id"`) sees them in the order they were accepted.
    let key = if event.entity_id.is_empty() { &event.id } else { &event.entity_id };
    hookline_kafka::produce::send(&s.producer, s.topics.events(), key, &event.encode_to_vec()).await.map_err(ApiError::unavailable)?;
    metrics::counter!("hookline_events_accepted_total", "source" => "http").increment(1);
    Ok((StatusCode::ACCEPTED, Json(json!({"id": event.id, "accepted_at_ms": event.accepted_at_ms}))))
}

/// The tenant's publish quota (its own, else `ingest.publish_rate_per_s`) and the API key's own, if any: past
/// either, 429 with `Retry-After`, nothing written.
fn admit(s: &ApiState, who: &Principal, tenant: &str) -> Result<(), ApiError> {
    use crate::publish_quota::limit_of;
    let own = s.tenants.get(tenant);
    let tenant_limit =
        limit_of(own.as_ref().map_or(0, |t| t.publish_rate_per_s), own.as_ref().map_or(0, |t| t.publish_burst), s.default_publish_quota);
    let key = match who {
        Principal::TenantKey { key_id, .. } => {
            s.keys.get(key_id).and_then(|k| limit_of(k.publish_rate_per_s, k.publish_burst, None).map(|l| (key_id.as_str(), l)))
        }
        _ => None,
    };
    if tenant_limit.is_none() && key.is_none() {
        return Ok(());
    }
    let now_us = u64::try_from(crate::now_us()).unwrap_or(0);
    s.publish_quotas.admit((tenant, tenant_limit), key, now_us).map_err(|t| {
        metrics::counter!("hookline_publish_throttled_total", "scope" => t.scope.as_str()).increment(1);
        let whose = match t.scope {
            crate::publish_quota::QuotaScope::Tenant => format!("tenant {tenant:?}"),
            crate::publish_quota::QuotaScope::Key => "this API key".to_owned(),
        };
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("{whose} may publish {} events/s (burst {}); retry after {} s", t.limit.per_s, t.limit.burst, t.retry_after_s()),
        )
        .with_field(if t.scope == crate::publish_quota::QuotaScope::Tenant { "tenant" } else { "Authorization" })
        .with_retry_after(t.retry_after_s())
    })
}
