//! The HTTP API served by ingest: events in, subscriptions managed. JSON everywhere, errors as
//! `{"error":{"code":..,"message":..,"field":..}}`, bearer-token auth on everything but health and metrics.

mod deliveries;
mod events;
mod openapi;
mod portal;
mod stats;
mod subscriptions;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hookline_core::egress::EgressSettings;
use hookline_kafka::state::{EndpointStates, SubscriptionTable};
use hookline_kafka::table::TableHandle;
use hookline_kafka::Topics;
use hookline_kafka::client::Producer as FutureProducer;
use serde::de::DeserializeOwned;
use serde_json::json;
use subtle::ConstantTimeEq;

pub struct ApiState {
    pub topics: Topics,
    pub producer: FutureProducer,
    pub subs: SubscriptionTable,
    pub subs_reader: TableHandle,
    pub states: EndpointStates,
    pub tokens: Vec<String>,
    pub max_event_bytes: usize,
    pub egress: EgressSettings,
    pub log: Arc<crate::delivery_log::DeliveryLog>,
    pub kafka: hookline_kafka::KafkaSettings,
}

pub fn router(state: Arc<ApiState>, max_request_bytes: usize) -> Router {
    Router::new()
        .route("/v1/events", post(events::publish))
        .route("/v1/subscriptions", post(subscriptions::create).get(subscriptions::list))
        .route(
            "/v1/subscriptions/{id}",
            get(subscriptions::get).patch(subscriptions::update).delete(subscriptions::delete),
        )
        .route("/v1/subscriptions/{id}/pause", post(subscriptions::pause))
        .route("/v1/subscriptions/{id}/resume", post(subscriptions::resume))
        .route("/v1/subscriptions/{id}/rotate-secret", post(subscriptions::rotate_secret))
        .route("/v1/subscriptions/{id}/deliveries", get(deliveries::list))
        .route("/v1/subscriptions/{id}/replay", post(deliveries::replay_since))
        .route("/v1/subscriptions/{id}/stats", get(stats::get))
        .route("/v1/deliveries/{id}", get(deliveries::get))
        .route("/v1/deliveries/{id}/replay", post(deliveries::replay_one))
        .route("/v1/dlq/redrive", post(deliveries::redrive))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth))
        .route("/openapi.json", get(openapi::document))
        .route("/portal", get(portal::index))
        // Both spellings open the portal (its assets use absolute paths).
        .route("/portal/", get(portal::index))
        .route("/portal/{file}", get(portal::file))
        .layer(axum::extract::DefaultBodyLimit::max(max_request_bytes))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(state)
}

async fn auth(State(s): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).map(|(_, t)| t))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(presented) = presented else {
        return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing `Authorization: Bearer <token>` header")
            .into_response();
    };
    // Constant-time per token, and every token is compared, so timing reveals neither content nor position.
    let ok = s.tokens.iter().fold(false, |acc, t| acc | bool::from(t.as_bytes().ct_eq(presented.as_bytes())));
    if !ok {
        return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the bearer token is not valid").into_response();
    }
    next.run(req).await
}

/// An API error with a stable `code`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), field: None }
    }

    pub fn field(field: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_field",
            message: format!("{field}: {}", message.into()),
            field: Some(field.to_owned()),
        }
    }

    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "kafka_unavailable", format!("could not write to Kafka: {e}"))
    }

    /// A replay or redrive that could not read or write Kafka; the message says which.
    pub fn replay_failed(e: crate::replay::ReplayError) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "kafka_unavailable", e.to_string())
    }

    /// A JSON body that does not parse (400) or does not fit the request's shape (422).
    pub fn body(e: serde_json::Error) -> Self {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => Self::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()),
            Category::Data => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"code": self.code, "message": self.message}});
        if let Some(f) = self.field {
            body["error"]["field"] = json!(f);
        }
        (self.status, Json(body)).into_response()
    }
}

/// `Query<T>` whose rejections are JSON errors naming the problem.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(r) => Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", r.body_text())),
        }
    }
}

/// `Json<T>` whose rejections are JSON errors naming the problem.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON with `Content-Type: application/json`",
        ),
        JsonRejection::JsonDataError(e) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", e.body_text()),
        JsonRejection::JsonSyntaxError(e) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.body_text()),
        JsonRejection::BytesRejection(e) => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", format!("the request body could not be read: {}", e.body_text()))
        }
        other => ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", other.body_text()),
    }
}
