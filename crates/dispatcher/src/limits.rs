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
}
