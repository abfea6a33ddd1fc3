//! Per-endpoint rate limits across all of a subscription's concurrent deliveries in this dispatcher (the only one
//! sending to it: the partition owner). A try waits for its turn before it starts; waiting is not an attempt and
//! counts toward nothing. The turn arithmetic is `hookline_core::rate_limit::Gcra`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hookline_core::rate_limit::{Gcra, RateLimit};

pub struct Rates {
    origin: Instant,
    /// One small entry per rate-limited subscription this process has sent to (bounded by the subscriptions).
    buckets: Mutex<HashMap<String, Gcra>>,
}

impl Default for Rates {
    fn default() -> Self {
        Self { origin: Instant::now(), buckets: Mutex::new(HashMap::new()) }
    }
}

impl Rates {
    /// Takes the subscription's next turn; the time to wait before sending.
    pub fn reserve(&self, subscription_id: &str, limit: RateLimit) -> Duration {
        let now_us = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut buckets = self.buckets.lock().expect("rate buckets lock");
        let wait_us = match buckets.get_mut(subscription_id) {
            Some(b) => b.reserve(limit, now_us),
            None => buckets.entry(subscription_id.to_owned()).or_default().reserve(limit, now_us),
        };
        Duration::from_micros(wait_us)
    }
}
