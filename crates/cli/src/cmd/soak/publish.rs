//! The publisher: events through ingest's API at a steady rate. An event is accepted when the API answers 202; a
//! refused connection or a 5xx (ingest killed or restarting) is retried with the same id, as a real producer would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::event_type;
use super::ledger::Ledger;

/// Requests in flight at once.
const CONCURRENCY: usize = 32;
const RETRY_EVERY: Duration = Duration::from_millis(100);
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);
/// How long the publisher waits for the first delivery before it goes on regardless.
const FLOWING_WITHIN: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct Publisher {
    api: SocketAddr,
    token: Arc<str>,
    client: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Default)]
pub struct Published {
    pub accepted: u64,
    /// Answered 4xx (other than 429), or never accepted within two minutes.
    pub rejected: u64,
    pub retries: u64,
}

impl Publisher {
    pub fn new(api: SocketAddr, token: &str) -> Publisher {
        Publisher { api, token: token.into(), client: Client::builder(TokioExecutor::new()).build_http() }
    }

    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<(u16, Value)> {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.api))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Full::new(body.map(|b| Bytes::from(b.to_string())).unwrap_or_default()))?;
        let resp = self.client.request(req).await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    /// Until `/readyz` answers 200 (ingest has loaded its tables).
    pub async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok((200, _)) = self.call("GET", "/readyz", None).await {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "ingest was not ready within {limit:?}");
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }

    pub async fn subscribe(&self, body: Value) -> anyhow::Result<String> {
        let (status, v) = self.call("POST", "/v1/subscriptions", Some(&body)).await?;
        anyhow::ensure!(status == 201, "creating a subscription answered {status}: {v}");
        Ok(v["id"].as_str().unwrap_or_default().to_owned())
    }

    /// Publishes `events` events at `rate` per second; returns what became of them. After the first event it waits
    /// until a delivery reaches the receiver (the groups have formed), so the rest, and the faults timed against
    /// them, land on a flowing pipeline however long a slow machine takes to form the groups.
    pub async fn publish_all(self, events: u64, rate: u64, tag: String, ledger: Arc<Ledger>) -> Published {
        let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let (accepted, rejected, retries) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = tokio::task::JoinSet::new();
        let mut start = tokio::time::Instant::now();
        let rate = rate.max(1);
        for i in 0..events {
            if i == 1 {
                ledger.wait_requests(1, FLOWING_WITHIN).await;
                start = tokio::time::Instant::now();
            }
            let due = Duration::from_secs_f64(i.saturating_sub(1) as f64 / rate as f64);
            tokio::time::sleep_until(start + due).await;
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let (p, ledger, tag) = (self.clone(), ledger.clone(), tag.clone());
            let (accepted, rejected, retries) = (accepted.clone(), rejected.clone(), retries.clone());
            tasks.spawn(async move {
                let _permit = permit;
                let id = format!("{tag}_{i:06}");
                let body = json!({"id": id, "type": event_type(i), "data": {"n": i, "note": "hookline soak"}});
                let first = Instant::now();
                loop {
                    match p.call("POST", "/v1/events", Some(&body)).await {
                        Ok((202, _)) => {
                            ledger.accept(&id, i);
                            accepted.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        Ok((status, v)) if status < 500 && status != 429 => {
                            eprintln!("soak: event {id} refused with {status}: {v}");
                            rejected.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        // 5xx, 429, or no answer: ingest is down, restarting or draining.
                        _ => {}
                    }
                    if first.elapsed() > GIVE_UP_AFTER {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(RETRY_EVERY).await;
                }
            });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
        Published {
            accepted: accepted.load(Ordering::Relaxed),
            rejected: rejected.load(Ordering::Relaxed),
            retries: retries.load(Ordering::Relaxed),
        }
    }
}
