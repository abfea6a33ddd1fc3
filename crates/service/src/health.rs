//! `/metrics`, `/healthz` (process alive) and `/readyz` (state read to the end, consumer running).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::http_server::HttpServerSettings;

/// Whether the service may receive traffic. Cloning shares it.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct HealthState {
    readiness: Readiness,
    metrics: PrometheusHandle,
}

/// The three routes, for merging into a service's own router.
pub fn routes(readiness: Readiness, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
        .route("/readyz", get(ready))
        .with_state(HealthState { readiness, metrics })
}

async fn render_metrics(State(s): State<HealthState>) -> impl IntoResponse {
    ([("content-type", "text/plain; version=0.0.4")], s.metrics.render())
}

async fn ready(State(s): State<HealthState>) -> impl IntoResponse {
    if s.readiness.is_ready() {
        (StatusCode::OK, Json(serde_json::json!({"status": "ready"})))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({"status": "starting"})))
    }
}

/// Serves the health routes on `addr` until `shutdown`, within `limits`. Returns the bound address (port 0 picks
/// one).
pub async fn serve(
    addr: SocketAddr,
    readiness: Readiness,
    metrics: PrometheusHandle,
    limits: HttpServerSettings,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let (local, _task) = crate::http_server::spawn(addr, routes(readiness, metrics), limits, shutdown).await?;
    Ok(local)
}
