//! `/v1/event-types`: the catalogue of event types the app publishes (name, description, an optional JSON Schema
//! of the event's `data`, example payloads, a validation mode), and `POST /v1/subscriptions/{id}/test-event`,
//! which delivers a type's example to one subscription. Written to the compacted `event-types` topic; every
//! write waits until this replica's table has applied it (and compiled its schema), so a client reads its own
//! writes. The catalogue is the app's, not a tenant's: admin tokens manage it, every credential may read it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use bytes::Bytes;
use hookline_core::model::{EventType, SchemaValidation as StoredMode};
use hookline_service::config::SchemaValidation;
use prost::Message as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Principal;
use super::event_type_table::{Compiled, Entry, Violation};
use super::{ApiError, ApiJson, ApiQuery, ApiState};

/// Longest name (as a subscription's event type may be).
pub const MAX_NAME_BYTES: usize = crate::subscriptions::MAX_EVENT_TYPE_BYTES;
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
/// A schema as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;
pub const MAX_EXAMPLES: usize = 10;
/// One example as compact JSON.
pub const MAX_EXAMPLE_BYTES: usize = 16 << 10;
/// Types in the catalogue (bounds the table and every subscription check).
pub const MAX_EVENT_TYPES: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEventType {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default)]
    examples: Option<Vec<Value>>,
    /// `off`, `warn` or `reject`; absent: `ingest.schema_validation`.
    #[serde(default)]
    validation: Option<SchemaValidation>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateEventType {
    description: Option<String>,
    /// Replaces the schema; `null` removes it.
    #[serde(default, deserialize_with = "crate::present")]
    schema: Option<Value>,
    /// Replaces every example (`[]` removes them).
    examples: Option<Vec<Value>>,
    /// `null`: back to `ingest.schema_validation`.
    #[serde(default, deserialize_with = "crate::present")]
    validation: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<usize>,
    /// The last name of the previous page.
    after: Option<String>,
}

fn stored(mode: Option<SchemaValidation>) -> i32 {
    (match mode {
        None => StoredMode::Unspecified,
        Some(SchemaValidation::Off) => StoredMode::Off,
        Some(SchemaValidation::Warn) => StoredMode::Warn,
        Some(SchemaValidation::Reject) => StoredMode::Reject,
    }) as i32
}

fn view(s: &ApiState, e: &Entry) -> Value {
    let t = &e.ty;
    let own = match StoredMode::try_from(t.validation).unwrap_or(StoredMode::Unspecified) {
        StoredMode::Unspecified => None,
        _ => Some(e.mode(s.schema_validation).as_str()),
    };
    json!({
        "name": t.name,
        "description": t.description,
        "schema": if t.schema_json.is_empty() { Value::Null } else { serde_json::from_str(&t.schema_json).unwrap_or(Value::Null) },
        "examples": t.examples_json.iter().map(|x| serde_json::from_str(x).unwrap_or(Value::Null)).collect::<Vec<Value>>(),
        "validation": own,
        // What publishing does now: the type's own mode or the server's default.
        "effective_validation": e.mode(s.schema_validation).as_str(),
        "created_at_ms": t.created_at_ms,
        "updated_at_ms": t.updated_at_ms,
    })
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no event type {name}")).with_field("name")
}

/// A catalogue name: an exact event type (no pattern), as publishing and subscriptions accept it.
fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::field("name", "is required (the event type, e.g. \"invoice.paid\")"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(ApiError::field("name", format!("at most {MAX_NAME_BYTES} bytes, got {}", name.len())));
    }
    hookline_core::filter::validate(name).map_err(|e| ApiError::field("name", e))?;
    if name.contains('*') {
        return Err(ApiError::field("name", "is an exact event type; patterns such as \"order.*\" belong in subscriptions"));
    }
    Ok(())
}

fn check_description(d: &str) -> Result<(), ApiError> {
    if d.len() > MAX_DESCRIPTION_BYTES {
        return Err(ApiError::field("description", format!("at most {MAX_DESCRIPTION_BYTES} bytes, got {}", d.len())));
    }
    Ok(())
}

/// The schema as stored (compact JSON) and compiled, or a 422 naming `schema`.
fn check_schema(schema: &Value) -> Result<(String, Compiled), ApiError> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(ApiError::field("schema", "a JSON Schema is an object (or true/false)"));
    }
    let text = schema.to_string();
    if text.len() > MAX_SCHEMA_BYTES {
        return Err(ApiError::field("schema", format!("at most {MAX_SCHEMA_BYTES} bytes, got {}", text.len())));
    }
    let compiled = Compiled::new(schema).map_err(|e| ApiError::field("schema", format!("does not compile: {e}")))?;
    Ok((text, compiled))
}

/// The examples as stored, each within its size and valid against the schema (a 422 naming `examples[i]`).
fn check_examples(examples: &[Value], schema: Option<&Compiled>) -> Result<Vec<String>, ApiError> {
    if examples.len() > MAX_EXAMPLES {
        return Err(ApiError::field("examples", format!("at most {MAX_EXAMPLES} examples, got {}", examples.len())));
    }
    let mut out = Vec::with_capacity(examples.len());
    for (i, x) in examples.iter().enumerate() {
        let field = format!("examples[{i}]");
        let text = x.to_string();
        if text.len() > MAX_EXAMPLE_BYTES {
            return Err(ApiError::field(&field, format!("at most {MAX_EXAMPLE_BYTES} bytes, got {}", text.len())));
        }
        if let Some(Err(v)) = schema.map(|c| c.check(x)) {
            return Err(ApiError::field(&field, format!("does not match the schema: {}: {} ({})", v.path, v.message, v.rule)));
        }
        out.push(text);
    }
    Ok(out)
}

pub async fn create(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    ApiJson(req): ApiJson<CreateEventType>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    who.require_admin()?;
    check_name(&req.name)?;
    let description = req.description.unwrap_or_default();
    check_description(&description)?;
    let schema = req.schema.as_ref().filter(|v| !v.is_null()).map(check_schema).transpose()?;
    let examples = check_examples(req.examples.as_deref().unwrap_or_default(), schema.as_ref().map(|(_, c)| c))?;
    if s.event_types.contains(&req.name) {
        return Err(
            ApiError::new(StatusCode::CONFLICT, "event_type_exists", format!("event type {} already exists", req.name)).with_field("name")
        );
    }
    if s.event_types.len() >= MAX_EVENT_TYPES {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "too_many_event_types",
            format!("the catalogue has {MAX_EVENT_TYPES} event types; delete one first"),
        ));
    }
    let now = crate::now_ms();
    let t = EventType {
        name: req.name,
        description,
        schema_json: schema.map(|(text, _)| text).unwrap_or_default(),
        examples_json: examples,
        validation: stored(req.validation),
        created_at_ms: now,
        updated_at_ms: now,
    };
    save(&s, &t).await?;
    let entry = s.event_types.get(&t.name).unwrap_or_else(|| Arc::new(Entry::new(t)));
    Ok((StatusCode::CREATED, Json(view(&s, &entry))))
}

/// A page in name order.
pub async fn list(State(s): State<Arc<ApiState>>, ApiQuery(q): ApiQuery<ListQuery>) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::field("limit", "must be between 1 and 500"));
    }
    let (items, more) = s.event_types.page(q.after.as_deref(), limit);
    let next = if more { items.last().map(|e| e.ty.name.clone()) } else { None };
    Ok(Json(json!({"items": items.iter().map(|e| view(&s, e)).collect::<Vec<_>>(), "next_after": next})))
}

pub async fn get(State(s): State<Arc<ApiState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let e = s.event_types.get(&name).ok_or_else(|| not_found(&name))?;
    Ok(Json(view(&s, &e)))
}

pub async fn update(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<UpdateEventType>,
) -> Result<Json<Value>, ApiError> {
    who.require_admin()?;
    let entry = s.event_types.get(&name).ok_or_else(|| not_found(&name))?;
    let mut t = entry.ty.clone();
    if let Some(d) = req.description {
        check_description(&d)?;
        t.description = d;
    }
    // The examples are checked against the schema the type will have: None = unchanged, Some(None) = removed.
    let replaced: Option<Option<Compiled>> = match &req.schema {
        None => None,
        Some(Value::Null) => {
            t.schema_json.clear();
            Some(None)
        }
        Some(v) => {
            let (text, compiled) = check_schema(v)?;
            t.schema_json = text;
            Some(Some(compiled))
        }
    };
    let current = match &replaced {
        None => entry.schema.as_ref(),
        Some(c) => c.as_ref(),
    };
    match &req.examples {
        Some(xs) => t.examples_json = check_examples(xs, current)?,
        None => {
            // A new schema must admit the examples the type keeps.
            let kept: Vec<Value> = t.examples_json.iter().map(|x| serde_json::from_str(x).unwrap_or(Value::Null)).collect();
            check_examples(&kept, current)?;
        }
    }
    if let Some(v) = req.validation {
        let mode: Option<SchemaValidation> =
            serde_json::from_value(v).map_err(|_| ApiError::field("validation", "must be \"off\", \"warn\", \"reject\" or null"))?;
        t.validation = stored(mode);
    }
    t.updated_at_ms = crate::now_ms();
    save(&s, &t).await?;
    let entry = s.event_types.get(&t.name).unwrap_or_else(|| Arc::new(Entry::new(t)));
    Ok(Json(view(&s, &entry)))
}

/// Deleted, not archived: a type is only a name and its documents, subscriptions that name it keep working (their
/// event types are patterns of their own), and the name can be catalogued again.
pub async fn delete(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    who.require_admin()?;
    s.event_types.get(&name).ok_or_else(|| not_found(&name))?;
    crate::tenants::write(&s, s.topics.event_types(), &s.event_types_reader, &name, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn save(s: &ApiState, t: &EventType) -> Result<(), ApiError> {
    crate::tenants::write(s, s.topics.event_types(), &s.event_types_reader, &t.name, Some(t.encode_to_vec())).await
}

/// Subscriptions choose from the catalogue once it has any type: each exact type in `types` that `before` did not
/// already have must be catalogued (a 422 naming `event_types[i]`); patterns (`*`, `order.*`) are always allowed.
/// Types a subscription already had stay allowed, so deleting a type never makes its subscriptions unsavable.
pub(crate) fn check_subscribed<B: AsRef<str>>(s: &ApiState, types: &[String], before: &[B]) -> Result<(), ApiError> {
    if s.event_types.is_empty() {
        return Ok(());
    }
    for (i, t) in types.iter().enumerate() {
        let exact = matches!(hookline_core::filter::key(t), hookline_core::filter::Key::Exact(_));
        if exact && !before.iter().any(|b| b.as_ref() == t) && !s.event_types.contains(t) {
            return Err(ApiError::field(
                &format!("event_types[{i}]"),
                format!(
                    "{t:?} is not in the event-type catalogue (GET /v1/event-types); catalogue it first or use a pattern such as \"{}*\"",
                    prefix_of(t)
                ),
            ));
        }
    }
    Ok(())
}

fn prefix_of(t: &str) -> &str {
    t.rfind('.').map_or("", |i| &t[..=i])
}

/// What publishing does with an event of a catalogued type whose `data` breaks its schema: `reject` → 422 naming
/// the path inside the event and the rule; `warn` → counted, logged once per type per interval, accepted.
pub(crate) fn check_event(s: &ApiState, event_type: &str, data_json: &[u8]) -> Result<(), ApiError> {
    let Some(entry) = s.event_types.get(event_type) else { return Ok(()) };
    let Some(schema) = entry.schema.as_ref() else { return Ok(()) };
    let mode = entry.mode(s.schema_validation);
    if mode == SchemaValidation::Off {
        return Ok(());
    }
    // The envelope's `data` was checked as JSON when decoded; absent is `null`.
    let data: Value = if data_json.is_empty() { Value::Null } else { serde_json::from_slice(data_json).unwrap_or(Value::Null) };
    let Err(v) = schema.check(&data) else { return Ok(()) };
    metrics::counter!("hookline_schema_violations_total", "mode" => mode.as_str()).increment(1);
    match mode {
        SchemaValidation::Reject => Err(violation(event_type, &v)),
        _ => {
            if s.event_types.should_log(event_type, crate::now_ms()) {
                tracing::warn!(
                    event_type, path = %v.path, rule = %v.rule, error = %v.message,
                    "an event does not match its type's schema (accepted: validation is warn; logged at most once a minute per type)"
                );
            }
            Ok(())
        }
    }
}

fn violation(event_type: &str, v: &Violation) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "schema_violation",
        format!("{}: {} (rule `{}` of the schema of event type {event_type})", v.path, v.message, v.rule),
    )
    .with_field(&v.path)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestEvent {
    event_type: String,
    /// Which of the type's examples (default 0).
    #[serde(default)]
    example: Option<usize>,
    /// A payload of the caller's instead of an example.
    #[serde(default)]
    data: Option<Value>,
}

/// Delivers one event of a catalogued type to this subscription only: published to the events topic like any event,
/// marked `only_subscription_id`, so the fan-out sends it to that subscription alone and the delivery log keeps its
/// event (it can be resent like any delivery). The event's id starts with `evt_test_`; the answer names the delivery
/// to follow at `GET /v1/deliveries/{delivery_id}`.
pub async fn test_event(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TestEvent>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    who.require_write()?;
    let sub = crate::subscriptions::find(&s, &who, &id)?;
    let entry = s
        .event_types
        .get(&req.event_type)
        .ok_or_else(|| ApiError::field("event_type", format!("{:?} is not in the event-type catalogue", req.event_type)))?;
    if !hookline_core::filter::matches_any(&sub.sub.event_types, &req.event_type) {
        return Err(ApiError::field("event_type", format!("subscription {id} does not receive {:?}", req.event_type)));
    }
    let data = match (req.data, req.example) {
        (Some(_), Some(_)) => return Err(ApiError::field("data", "give `example` or `data`, not both")),
        (Some(d), None) => {
            let text = d.to_string();
            if text.len() > MAX_EXAMPLE_BYTES {
                return Err(ApiError::field("data", format!("at most {MAX_EXAMPLE_BYTES} bytes, got {}", text.len())));
            }
            check_event(&s, &req.event_type, text.as_bytes())?;
            text
        }
        (None, i) => {
            let i = i.unwrap_or(0);
            let n = entry.ty.examples_json.len();
            entry.ty.examples_json.get(i).cloned().ok_or_else(|| ApiError::field("example", no_such_example(&req.event_type, i, n)))?
        }
    };
    let now = crate::now_ms();
    let event = hookline_core::model::Event {
        id: format!("evt_test_{:016x}", rand::random::<u64>()),
        r#type: req.event_type,
        occurred_at_ms: now,
        tenant: sub.sub.tenant.to_string(),
        data_json: Bytes::from(data),
        accepted_at_ms: now,
        only_subscription_id: sub.sub.id.to_string(),
        ..Default::default()
    };
    let event_id = event.id.clone();
    let delivery_id = hookline_core::model::delivery_id(&event.id, &sub.sub.id);
    hookline_kafka::produce::send(&s.producer, s.topics.events(), &event.id, &event.encode_to_vec())
        .await
        .map_err(ApiError::unavailable)?;
    metrics::counter!("hookline_test_events_total").increment(1);
    Ok((StatusCode::ACCEPTED, Json(json!({"event_id": event_id, "delivery_id": delivery_id, "subscription_id": id}))))
}

/// Why example `i` of a type with `n` examples cannot be sent, counted as a reader counts.
fn no_such_example(event_type: &str, i: usize, n: usize) -> String {
    match n {
        0 => format!("event type {event_type} has no examples; give `data`"),
        1 => format!("there is no example {i}: event type {event_type} has one example, number 0"),
        _ => format!("there is no example {i}: event type {event_type} has {n} examples, numbered 0 to {}", n - 1),
    }
}

#[cfg(test)]
mod example_tests {
    #[test]
    fn a_missing_example_is_named_in_plain_words() {
        assert_eq!(super::no_such_example("order.paid", 3, 1), "there is no example 3: event type order.paid has one example, number 0");
        assert_eq!(
            super::no_such_example("order.paid", 3, 2),
            "there is no example 3: event type order.paid has 2 examples, numbered 0 to 1"
        );
        assert_eq!(super::no_such_example("t", 0, 0), "event type t has no examples; give `data`");
    }
}
