//! `GET /openapi.json`: the OpenAPI 3 document of this API, public (outside the bearer-token layer). The document
//! is kept true to the router by `crates/api/tests/openapi.rs`.

use axum::http::header;
use axum::response::IntoResponse;

/// The document, embedded at build time.
pub const DOCUMENT: &str = include_str!("openapi.json");

pub async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}
