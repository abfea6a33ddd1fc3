//! After settling: does the delivery log store (the one the soak's config names, written by the indexer inside
//! hookline-ingest, which the `kill-ingest` fault kills with SIGKILL) hold every accepted delivery with the final
//! state its attempt records name? Read with `hookline_log` directly (SQLite in WAL mode: a reader beside the
//! indexer's writer). The indexer trails Kafka by about a batch, so the check waits a bounded time for it.

use std::time::{Duration, Instant};

use hookline_log::{DeliveryState, LogStore, Target};
use hookline_service::config::LogSettings;

/// What the check found.
pub struct LogCheck {
    /// Accepted deliveries the store lacks, or holds in another state than their final records name.
    pub missing: usize,
    /// How long until the store held them all (or the wait gave up).
    pub lag: Duration,
    pub examples: Vec<String>,
}

/// `expected`: (delivery id, the final states its records name). Waits at most `limit` for the store to catch up.
pub async fn check(settings: &LogSettings, expected: Vec<(String, Vec<String>)>, limit: Duration) -> anyhow::Result<LogCheck> {
    let t0 = Instant::now();
    let store = LogStore::open(&Target::from_settings(settings)?).await?;
    let mut left = expected;
    loop {
        let mut still = Vec::new();
        for (id, finals) in left {
            let stored = store.delivery(&id).await?;
            let ok =
                stored.is_some_and(|d| d.delivery.state != DeliveryState::Pending && finals.iter().any(|f| f == d.delivery.state.as_str()));
            if !ok {
                still.push((id, finals));
            }
        }
        left = still;
        if left.is_empty() || t0.elapsed() >= limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut examples = Vec::new();
    for (id, finals) in left.iter().take(5) {
        let stored = store.delivery(id).await?.map(|d| d.delivery.state.as_str());
        examples.push(format!("{id}: stored {} (records say {})", stored.unwrap_or("nothing"), finals.join("/")));
    }
    Ok(LogCheck { missing: left.len(), lag: t0.elapsed(), examples })
}
