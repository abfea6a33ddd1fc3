//! The management API and the portal, served by the ingest binary beside the fan-out: events in, subscriptions,
//! tenants and the delivery log managed. JSON everywhere, errors as `{"error":{"code":..,"message":..,"field":..}}`,
//! bearer-token auth on everything but health and metrics.

pub mod auth;
pub mod event_type_table;
pub mod publish_quota;
pub mod replay;
pub mod tenant_tables;
/// The event decoder is core's: the fan-out and the delivery log's indexer read events with it too.
pub use hookline_core::event_decode as decode;
pub(crate) use hookline_service::{now_ms, now_us};
mod deliveries;
mod event_types;
mod events;
mod openapi;
mod portal;
mod secrets;
mod stats;
mod subscriptions;
mod tenants;
pub mod verify;

/// The stats' outcome classes (docs/api.md's vocabulary table is tested against them).
pub use stats::CLASSES as STATS_CLASSES;

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hookline_core::egress::EgressSettings;
use hookline_kafka::client::Producer as FutureProducer;
use hookline_kafka::state::{EndpointStates, SubscriptionTable};
use hookline_kafka::table::TableHandle;
use hookline_kafka::Topics;
use serde::de::DeserializeOwned;
use serde_json::json;

/// A request field that is present, even as `null` (which a plain `Option` reads as absent): `null` then means
/// "back to the default" in a PATCH.
pub(crate) fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    <serde_json::Value as serde::Deserialize>::deserialize(d).map(Some)
}

/// A string map with each key once: a repeated key is refused (as a repeated field is), not silently replaced by
/// its last value.
pub(crate) fn unique_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<std::collections::HashMap<String, String>>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = std::collections::HashMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of strings")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = std::collections::HashMap::new();
            while let Some((k, v)) = m.next_entry::<String, String>()? {
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                }
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique).map(Some)
}

pub struct ApiState {
    pub topics: Topics,
    pub producer: FutureProducer,
    pub subs: SubscriptionTable,
    pub subs_reader: TableHandle,
    pub states: EndpointStates,
    pub tokens: Vec<String>,
    pub max_event_bytes: usize,
    pub egress: EgressSettings,
    /// The delivery log store, filled by the indexer (in this process or another).
    pub log: Arc<hookline_log::LogStore>,
    pub kafka: hookline_kafka::KafkaSettings,
    /// Off unless `telemetry.otlp_endpoint` is set: then a `traceparent` header on `POST /v1/events` is carried.
    pub tracer: hookline_service::traces::Tracer,
    /// Sends endpoint verification challenges (policies with `[verification]`).
    pub challenger: verify::Challenger,
    pub tenants: crate::tenant_tables::TenantTable,
    pub tenants_reader: TableHandle,
    pub keys: crate::tenant_tables::KeyTable,
    pub keys_reader: TableHandle,
    /// Seals signing secrets before they are written.
    pub keyring: Arc<hookline_core::seal::Keyring>,
    pub portal: hookline_service::config::PortalSettings,
    /// The event-type catalogue (each schema compiled once, as its record is read).
    pub event_types: crate::event_type_table::EventTypeTable,
    pub event_types_reader: TableHandle,
    /// `ingest.schema_validation`: the mode of types that name none.
    pub schema_validation: hookline_service::config::SchemaValidation,
    /// `ingest.publish_rate_per_s` / `ingest.publish_burst`: a tenant's publish quota unless it has its own.
    pub default_publish_quota: Option<hookline_core::rate_limit::RateLimit>,
    pub publish_quotas: publish_quota::PublishQuotas,
    /// Decodes Avro and Protobuf framed events for replays (`[ingest.schema_registry]`), sharing the fan-out's cache.
    pub registry: Option<Arc<hookline_schema_registry::Registry>>,
}

pub fn router(state: Arc<ApiState>, max_request_bytes: usize) -> Router {
    Router::new()
        .route("/v1/events", post(events::publish))
        .route("/v1/subscriptions", post(subscriptions::create).get(subscriptions::list))
        .route("/v1/subscriptions/{id}", get(subscriptions::get).patch(subscriptions::update).delete(subscriptions::delete))
        .route("/v1/subscriptions/{id}/pause", post(subscriptions::pause))
        .route("/v1/subscriptions/{id}/resume", post(subscriptions::resume))
        .route("/v1/subscriptions/{id}/rotate-secret", post(subscriptions::rotate_secret))
        .route("/v1/subscriptions/{id}/verify", post(verify::verify))
        .route("/v1/subscriptions/{id}/test-event", post(event_types::test_event))
        .route("/v1/event-types", post(event_types::create).get(event_types::list))
        .route("/v1/event-types/{name}", get(event_types::get).patch(event_types::update).delete(event_types::delete))
        .route("/v1/subscriptions/{id}/deliveries", get(deliveries::list))
        .route("/v1/subscriptions/{id}/replay", post(deliveries::replay_since))
        .route("/v1/subscriptions/{id}/stats", get(stats::get))
        .route("/v1/deliveries", get(deliveries::search))
        .route("/v1/deliveries/{id}", get(deliveries::get))
        .route("/v1/deliveries/{id}/replay", post(deliveries::replay_one))
        .route("/v1/dlq/redrive", post(deliveries::redrive))
        .route("/v1/secrets/reseal", post(secrets::reseal))
        .route("/v1/tenants", post(tenants::create).get(tenants::list))
        .route("/v1/tenants/{id}", get(tenants::get).patch(tenants::update).delete(tenants::delete))
        .route("/v1/tenants/{id}/api-keys", post(tenants::create_key).get(tenants::list_keys))
        .route("/v1/tenants/{id}/api-keys/{key_id}", axum::routing::delete(tenants::delete_key))
        .route("/v1/tenants/{id}/portal-links", post(tenants::create_link))
        .route("/v1/whoami", get(auth::whoami))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::middleware))
        .route("/openapi.json", get(openapi::document))
        // A browser pointed at the server's address lands on the portal.
        .route("/", get(|| async { axum::response::Redirect::to("/portal/") }))
        .route("/portal", get(portal::index))
        // Both spellings open the portal (its assets use absolute paths).
        .route("/portal/", get(portal::index))
        .route("/portal/{file}", get(portal::file))
        // After every route: a known path with another method gets the JSON error; axum adds the `Allow` header.
        .method_not_allowed_fallback(|method: axum::http::Method, uri: axum::http::Uri| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not allowed on {}; the Allow header lists the methods that are", uri.path()),
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(max_request_bytes))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(middleware::from_fn(json_errors))
        // Outermost: the answers the layers above rewrote end their line too.
        .layer(middleware::map_response(json_newline))
        .with_state(state)
}

/// Longest request target and largest header block the API reads (the HTTP parser refuses heads over ~400 KiB
/// itself, with a bare status: these bounds answer below that, in the documented JSON shape).
pub const MAX_URI_BYTES: usize = 8 << 10;
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// Every `/v1` error in the documented JSON shape: an oversized target or header block is refused here (414, 431),
/// and an error a framework layer answered in plain text (a path segment that is not UTF-8: `/v1/tenants/%FF`)
/// is rewrapped, its text kept as the message.
async fn json_errors(req: Request, next: middleware::Next) -> Response {
    let v1 = req.uri().path().starts_with("/v1");
    if v1 {
        if req.uri().to_string().len() > MAX_URI_BYTES {
            return ApiError::new(
                StatusCode::URI_TOO_LONG,
                "uri_too_long",
                format!("the request target is longer than {MAX_URI_BYTES} bytes"),
            )
            .with_field("path")
            .into_response();
        }
        let head: usize = req.headers().iter().map(|(n, v)| n.as_str().len().saturating_add(v.len()).saturating_add(4)).sum();
        if head > MAX_HEADER_BYTES {
            return ApiError::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
                format!("the request's headers are larger than {MAX_HEADER_BYTES} bytes"),
            )
            .with_field("headers")
            .into_response();
        }
    }
    let resp = next.run(req).await;
    let is_json = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"));
    if !v1 || is_json || !(resp.status().is_client_error() || resp.status().is_server_error()) {
        return resp;
    }
    let status = resp.status();
    let text = match axum::body::to_bytes(resp.into_body(), 4 << 10).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() { status.canonical_reason().unwrap_or("error").to_owned() } else { text };
    match status {
        // A path segment the route could not read (not UTF-8, or not of its type).
        StatusCode::BAD_REQUEST => ApiError::new(status, "invalid_path", message).with_field("path"),
        StatusCode::NOT_FOUND => ApiError::new(status, "not_found", message),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(status, "body_too_large", message).with_field("body"),
        s if s.is_server_error() => ApiError::new(status, "internal", message),
        _ => ApiError::new(status, "invalid_request", message),
    }
    .into_response()
}

/// Every JSON answer ends its line, so answers printed one after another (a pasted block of `curl` commands) do
/// not run together.
async fn json_newline(resp: Response) -> Response {
    let json = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let mut bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => Vec::from(b),
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    if bytes.last() != Some(&b'\n') {
        bytes.push(b'\n');
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// An API error with a stable `code`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Seconds for a `Retry-After` header (a 429).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), field: None, retry_after_s: None }
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// Names the field (body key, query parameter, path segment or header) the error is about.
    pub fn with_field(mut self, field: &str) -> Self {
        self.field = Some(field.to_owned());
        self
    }

    pub fn field(field: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_field",
            message: format!("{field}: {}", message.into()),
            field: Some(field.to_owned()),
            retry_after_s: None,
        }
    }

    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "kafka_unavailable", format!("could not write to Kafka: {e}"))
    }

    /// The delivery log store did not answer (a database down or a file unreadable); nothing was changed.
    pub fn log_unavailable(e: hookline_log::StoreError) -> Self {
        tracing::warn!(error = %e, "delivery log query failed");
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "log_unavailable", format!("the delivery log store did not answer: {e}"))
    }

    /// A replay or redrive that could not read or write Kafka; the message says which.
    pub fn replay_failed(e: crate::replay::ReplayError) -> Self {
        if let crate::replay::ReplayError::Log(e) = e {
            return Self::log_unavailable(e);
        }
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "kafka_unavailable", e.to_string())
    }

    /// A JSON body that does not parse (400 `invalid_json`) or does not fit the request's shape (422
    /// `invalid_body`), with the field it concerns and in hookline's words, not the parser's.
    pub fn body(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        use serde_json::error::Category;
        match e.inner().classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_json", hookline_core::event_decode::json_error(e.inner())).with_field("body")
            }
            Category::Data => {
                let (field, message) = describe(&e.path().to_string(), &e.inner().to_string());
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", message).with_field(&field)
            }
        }
    }
}

/// (field, message) for a value that does not fit: serde's "unknown field `x`, expected ..." or "missing field
/// `x`" or "invalid type: ..., expected ..." at `path` (`.` is the whole body), reworded.
fn describe(path: &str, serde_message: &str) -> (String, String) {
    // serde_json appends the position; the field says where.
    let msg = serde_message.split(" at line ").next().unwrap_or(serde_message);
    let join = |name: &str| if path.is_empty() || path == "." { name.to_owned() } else { format!("{path}.{name}") };
    let quoted = |m: &str| m.split('`').nth(1).map(str::to_owned);
    if let Some(rest) = msg.strip_prefix("unknown field ") {
        let name = quoted(rest).unwrap_or_default();
        let known: Vec<&str> = rest.split('`').skip(3).step_by(2).collect();
        // serde_path_to_error already ends the path with the unknown key.
        let field = if path.ends_with(&name) { path.to_owned() } else { join(&name) };
        let hint = if known.is_empty() { String::new() } else { format!(" (known fields: {})", known.join(", ")) };
        return (field.clone(), format!("{field}: not a known field{hint}"));
    }
    if let Some(rest) = msg.strip_prefix("missing field ") {
        let field = join(&quoted(rest).unwrap_or_default());
        return (field.clone(), format!("{field}: is required"));
    }
    let field = if path.is_empty() || path == "." { "body".to_owned() } else { path.to_owned() };
    let reworded = match msg.strip_prefix("invalid type: ").and_then(|r| r.split_once(", expected ")) {
        Some((got, want)) => format!("expected {want}, got {got}"),
        None => msg.to_owned(),
    };
    (field.clone(), format!("{field}: {reworded}"))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"code": self.code, "message": self.message}});
        if let Some(f) = self.field {
            body["error"]["field"] = json!(f);
        }
        if matches!(self.status, StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT) {
            // The rest of the body is not read, so the server closes the connection after this answer; saying so
            // keeps the client from sending its next request on it (which would fail as a broken connection).
            return (self.status, [(header::CONNECTION, "close")], Json(body)).into_response();
        }
        if let Some(s) = self.retry_after_s {
            return (self.status, [(header::RETRY_AFTER, s.to_string())], Json(body)).into_response();
        }
        (self.status, Json(body)).into_response()
    }
}

/// A 415 naming `Content-Type` unless the request says its body is JSON (parameters such as `charset` allowed).
/// The request's media type (`Content-Type` without parameters) is `want`.
pub(crate) fn media_type_is(headers: &axum::http::HeaderMap, want: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case(want))
}

pub(crate) fn require_json(headers: &axum::http::HeaderMap, message: &'static str) -> Result<(), ApiError> {
    if media_type_is(headers, "application/json") {
        return Ok(());
    }
    Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message).with_field("Content-Type"))
}

/// A body that could not be read: over the request limit (or cut off).
pub(crate) fn body_unreadable(e: axum::extract::rejection::BytesRejection) -> ApiError {
    // A body cut short by the listener's deadline or minimum rate is the client's slowness, not its size.
    if let Some(cut) = hookline_service::http_body_guard::cut_short(&e) {
        return ApiError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", cut.to_string()).with_field("body");
    }
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", format!("the request body could not be read: {}", e.body_text()))
        .with_field("body")
}

/// `Query<T>` whose rejections are JSON errors naming the parameter.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(ApiQuery).map_err(|e| {
            let (field, message) = describe(&e.path().to_string(), &e.inner().to_string());
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message).with_field(&field)
        })
    }
}

/// Every request body is a JSON object: serde would otherwise read a struct from an array by position
/// (`[null, null]`), which no documented shape allows.
pub(crate) fn object_body(bytes: &[u8]) -> Result<(), ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | None => Ok(()),
        Some(_) => {
            Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", "the body must be a JSON object").with_field("body"))
        }
    }
}

/// A JSON body that may be left out (an empty POST takes the defaults).
pub(crate) fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    object_body(body)?;
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body)).map_err(ApiError::body)
}

/// `Json<T>` whose rejections are JSON errors naming the field.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json(req.headers(), "send the body as JSON with `Content-Type: application/json`")?;
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(body_unreadable)?;
        object_body(&bytes)?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(ApiError::body)?;
        de.end().map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("trailing characters after the JSON body (line {}, column {})", e.line(), e.column()),
            )
            .with_field("body")
        })?;
        Ok(ApiJson(value))
    }
}
