//! Adaptive concurrency limits (policy `[concurrency]`) of the endpoints this dispatcher sends to: one AIMD
//! controller per subscription, sizing its lane. Decisions are `hookline_core::concurrency::Aimd`'s.

use std::collections::HashMap;
use std::sync::Mutex;

use hookline_core::concurrency::{Aimd, Signal};
use hookline_core::policy::ConcurrencyRule;

#[derive(Default)]
pub struct Limits {
    map: Mutex<HashMap<String, Aimd>>,
}

impl Limits {
    /// Applies a try's signal; the endpoint's new limit when it changed.
    pub fn record(&self, subscription_id: &str, rule: &ConcurrencyRule, signal: Signal, now_ms: i64) -> Option<u32> {
        let mut map = self.map.lock().expect("limits lock");
        let aimd = match map.get_mut(subscription_id) {
            Some(a) => a,
            None => map.entry(subscription_id.to_owned()).or_insert_with(|| Aimd::new(rule)),
        };
        let change = aimd.record(rule, signal, now_ms);
        if change.is_some() {
            metrics::histogram!("hookline_endpoint_concurrency_limit").record(f64::from(aimd.limit()));
        }
        change
    }

    /// Keeps the controllers of subscriptions for which `live` holds; returns how many were forgotten.
    pub fn retain(&self, live: impl Fn(&str) -> bool) -> usize {
        let mut map = self.map.lock().expect("limits lock");
        let before = map.len();
        map.retain(|id, _| live(id));
        before - map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_subscription_starts_again_at_the_maximum_and_others_keep_their_limit() {
        let limits = Limits::default();
        let rule = ConcurrencyRule { min: 1, max: 8, slow_ms: None, pause_on_retry_after: true };
        for id in ["deleted", "live"] {
            assert_eq!(limits.record(id, &rule, Signal::Overloaded, 0), Some(4), "{id} halves");
        }
        assert_eq!(limits.retain(|id| id == "live"), 1);
        // An overload long after: a fresh controller halves from 8, the kept one from 4.
        assert_eq!(limits.record("deleted", &rule, Signal::Overloaded, 1_000_000), Some(4));
        assert_eq!(limits.record("live", &rule, Signal::Overloaded, 1_000_000), Some(2));
    }
}
