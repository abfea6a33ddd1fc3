//! The circuit breakers of the endpoints this dispatcher sends to (the partition owner is the only sender), one
//! per subscription whose policy has a `[breaker]`, and the endpoint-wide pauses of a `Retry-After`. Decisions
//! are `hookline_core::breaker::Breaker`'s.

use std::collections::HashMap;
use std::sync::Mutex;

use hookline_core::breaker::{Admission, Breaker, BreakerChange};
use hookline_core::policy::BreakerRule;

#[derive(Default)]
pub struct Breakers {
    /// Only breakers with something to remember: a closed one with no error counted is dropped, so the map holds
    /// the endpoints failing right now, not every endpoint ever sent to.
    map: Mutex<HashMap<String, Breaker>>,
    /// Endpoints paused by a `Retry-After` (policy `[concurrency]` with `pause_on_retry_after`): until when.
    /// Expired entries go at the next admission.
    holds: Mutex<HashMap<String, i64>>,
}

impl Breakers {
    pub fn admit(&self, subscription_id: &str, now_ms: i64) -> Admission {
        {
            let mut holds = self.holds.lock().expect("holds lock");
            match holds.get(subscription_id).copied() {
                Some(until_ms) if now_ms < until_ms => return Admission::Wait { until_ms },
                Some(_) => {
                    holds.remove(subscription_id);
                }
                None => {}
            }
        }
        let mut map = self.map.lock().expect("breakers lock");
        map.get_mut(subscription_id).map_or(Admission::Send, |b| b.admit(now_ms))
    }

    /// Pauses the whole endpoint until `until_ms` (a later hold wins).
    pub fn hold(&self, subscription_id: &str, until_ms: i64) {
        let mut holds = self.holds.lock().expect("holds lock");
        let h = holds.entry(subscription_id.to_owned()).or_insert(until_ms);
        *h = (*h).max(until_ms);
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

    /// Keeps the breakers and holds of subscriptions for which `live` holds; returns how many were forgotten.
    pub fn retain(&self, live: impl Fn(&str) -> bool) -> usize {
        let mut forgotten = 0;
        {
            let mut holds = self.holds.lock().expect("holds lock");
            let before = holds.len();
            holds.retain(|id, _| live(id));
            forgotten += before - holds.len();
        }
        let mut map = self.map.lock().expect("breakers lock");
        let before = map.len();
        map.retain(|id, _| live(id));
        forgotten + (before - map.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_drops_a_deleted_subscriptions_open_breaker_and_hold_only() {
        let b = Breakers::default();
        let rule = BreakerRule { consecutive_errors: 1, cool_off_ms: 60_000, max_cool_off_ms: 600_000 };
        for id in ["deleted", "live"] {
            b.record(id, &rule, true, 0);
            assert!(matches!(b.admit(id, 1), Admission::Wait { .. }), "{id} is open");
        }
        b.hold("deleted", 10_000);
        assert_eq!(b.retain(|id| id == "live"), 2, "the breaker and the hold");
        assert!(matches!(b.admit("deleted", 1), Admission::Send), "forgotten: closed again");
        assert!(!matches!(b.admit("live", 1), Admission::Send), "the live one stays open");
    }
}
