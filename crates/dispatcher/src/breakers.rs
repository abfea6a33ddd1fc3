//! The circuit breakers of the endpoints this dispatcher sends to (the partition owner is the only sender), one
//! per subscription whose policy has a `[breaker]`. Decisions are `hookline_core::breaker::Breaker`'s.

use std::collections::HashMap;
use std::sync::Mutex;

use hookline_core::breaker::{Admission, Breaker, BreakerChange};
use hookline_core::policy::BreakerRule;

#[derive(Default)]
pub struct Breakers {
    /// Only breakers with something to remember: a closed one with no error counted is dropped, so the map holds
    /// the endpoints failing right now, not every endpoint ever sent to.
    map: Mutex<HashMap<String, Breaker>>,
}

impl Breakers {
    pub fn admit(&self, subscription_id: &str, now_ms: i64) -> Admission {
        let mut map = self.map.lock().expect("breakers lock");
        map.get_mut(subscription_id).map_or(Admission::Send, |b| b.admit(now_ms))
    }

    pub fn record(&self, subscription_id: &str, rule: &BreakerRule, unreachable: bool, now_ms: i64) -> Option<BreakerChange> {
        let mut map = self.map.lock().expect("breakers lock");
        let change = match map.get_mut(subscription_id) {
            Some(b) => b.record(rule, unreachable, now_ms),
            None if !unreachable => return None,
            None => map.entry(subscription_id.to_owned()).or_default().record(rule, unreachable, now_ms),
        };
        if map.get(subscription_id).is_some_and(Breaker::is_idle) {
            map.remove(subscription_id);
        }
        change
    }
}
