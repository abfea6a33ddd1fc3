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

    /// Keeps the buckets of subscriptions for which `live` holds; returns how many were forgotten.
    pub fn retain(&self, live: impl Fn(&str) -> bool) -> usize {
        let mut buckets = self.buckets.lock().expect("rate buckets lock");
        let before = buckets.len();
        buckets.retain(|id, _| live(id));
        before - buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_subscription_starts_again_with_a_full_bucket_and_others_keep_theirs() {
        let rates = Rates::default();
        let limit = RateLimit { per_s: 1, burst: 1 };
        for id in ["deleted", "live"] {
            assert_eq!(rates.reserve(id, limit), Duration::ZERO, "the first turn is free");
        }
        assert_eq!(rates.retain(|id| id == "live"), 1);
        assert_eq!(rates.reserve("deleted", limit), Duration::ZERO, "its bucket was dropped");
        assert!(rates.reserve("live", limit) > Duration::from_millis(500), "the live one still waits for its turn");
    }
}
