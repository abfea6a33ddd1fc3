//! The receiver: one HTTP server whose paths behave like the endpoints of a real fleet, recording every request
//! by (event id, path, attempt number). It answers by the attempt number in the request, never by what it saw
//! before, so a redelivered attempt gets the same answer as the first copy.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::Notify;

/// The request header carrying the attempt number (set by the soak policies' `attempt_header`).
pub const ATTEMPT_HEADER: &str = "Soak-Attempt";

/// How one endpoint behaves, and the final state its deliveries must reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// 204 at once.
    Ok,
    /// 204 after 50-250 ms.
    Slow,
    /// 503 to attempt 1, then 204.
    Flaky,
    /// Always 500: retried until the attempts run out, then `failed` and dead-lettered.
    Failing,
    /// 410: `dead` at once, dead-lettered.
    Gone,
    /// Attempt 1 hangs past the policy timeout, then 204.
    Hang,
}

impl Endpoint {
    pub const ALL: [Endpoint; 6] = [Endpoint::Ok, Endpoint::Slow, Endpoint::Flaky, Endpoint::Failing, Endpoint::Gone, Endpoint::Hang];

    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Ok => "ok",
            Endpoint::Slow => "slow",
            Endpoint::Flaky => "flaky",
            Endpoint::Failing => "failing",
            Endpoint::Gone => "gone",
            Endpoint::Hang => "hang",
        }
    }

    fn from_path(path: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.path() == path)
    }

    /// The final state every delivery to this endpoint must end in.
    pub fn expected_final(self) -> &'static str {
        match self {
            Endpoint::Failing => "failed",
            Endpoint::Gone => "dead",
            _ => "succeeded",
        }
    }
}

#[derive(Default)]
pub struct Recorded {
    /// Requests per (event id, path, attempt).
    pub per_attempt: Mutex<HashMap<(String, &'static str, u32), u32>>,
    pub total: AtomicU64,
    pub changed: Notify,
}

impl Recorded {
    pub fn requests(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

pub struct Receiver {
    pub addr: SocketAddr,
    pub recorded: Arc<Recorded>,
}

impl Receiver {
    pub async fn start(hang: Duration) -> anyhow::Result<Receiver> {
        let recorded = Arc::new(Recorded::default());
        let app = axum::Router::new().route("/{path}", axum::routing::post(receive)).with_state((recorded.clone(), hang));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Receiver { addr, recorded })
    }

    pub fn url(&self, e: Endpoint) -> String {
        format!("http://{}/{}", self.addr, e.path())
    }
}

async fn receive(State((rec, hang)): State<(Arc<Recorded>, Duration)>, Path(path): Path<String>, headers: HeaderMap) -> StatusCode {
    let Some(endpoint) = Endpoint::from_path(&path) else { return StatusCode::NOT_FOUND };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let id = header("webhook-id").unwrap_or("").to_owned();
    let attempt: u32 = header(ATTEMPT_HEADER).and_then(|v| v.parse().ok()).unwrap_or(0);
    *rec.per_attempt.lock().unwrap().entry((id, endpoint.path(), attempt)).or_insert(0) += 1;
    let n = rec.total.fetch_add(1, Ordering::Relaxed);
    rec.changed.notify_waiters();
    match endpoint {
        Endpoint::Ok => StatusCode::NO_CONTENT,
        Endpoint::Slow => {
            tokio::time::sleep(Duration::from_millis(50 + n.wrapping_mul(7919) % 201)).await;
            StatusCode::NO_CONTENT
        }
        Endpoint::Flaky if attempt <= 1 => StatusCode::SERVICE_UNAVAILABLE,
        Endpoint::Flaky => StatusCode::NO_CONTENT,
        Endpoint::Failing => StatusCode::INTERNAL_SERVER_ERROR,
        Endpoint::Gone => StatusCode::GONE,
        Endpoint::Hang if attempt <= 1 => {
            tokio::time::sleep(hang).await;
            StatusCode::NO_CONTENT
        }
        Endpoint::Hang => StatusCode::NO_CONTENT,
    }
}
