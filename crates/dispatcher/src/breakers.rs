//! The circuit breakers of the endpoints this dispatcher sends to (the partition owner is the only sender), one
//! per subscription whose policy has a `[breaker]`, and the endpoint-wide pauses of a `Retry-After`. Decisions
//! are `hookline_core::breaker::Breaker`'s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use hookline_core::breaker::{Admission, Breaker, BreakerChange};
use hookline_core::policy::BreakerRule;

#[derive(Default)]
pub struct Breakers {
    /// Only breakers with something to remember: a closed one with no error counted is dropped, so the map holds
    /// the endpoints failing right now, not every endpoint ever sent to.
    map: Mutex<HashMap<String, Breaker>>,
    /// Endpoints paused by a `Retry-After` (policy `[concurrency]` with `pause_on_retry_after`): until when (the
    /// monotonic clock: a wall-clock step neither ends a pause early nor stretches it). Expired entries go at the
    /// next look.
    holds: Mutex<HashMap<String, Instant>>,
}

/// What a delivery found when it looked for its endpoint's `Retry-After` pause (see [`Breakers::wait_out_pause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// None was on.
    None,
    /// One was on, and the delivery waited until it ended.
    WaitedOut,
    /// One is on that ends later than the delivery may wait in its lane: park it until then.
    Long { until: Instant },
}

impl Breakers {
    /// The endpoint's circuit breaker: whether a try may go now (a probe counts as taken once admitted).
    pub fn admit(&self, subscription_id: &str, now_ms: i64) -> Admission {
        let mut map = self.map.lock().expect("breakers lock");
        map.get_mut(subscription_id).map_or(Admission::Send, |b| b.admit(now_ms))
    }

    /// Until when the endpoint is paused by a `Retry-After`, if it is at `now`. An expired pause is dropped.
    pub fn held_until(&self, subscription_id: &str, now: Instant) -> Option<Instant> {
        let mut holds = self.holds.lock().expect("holds lock");
        match holds.get(subscription_id).copied() {
            Some(until) if now < until => Some(until),
            Some(_) => {
                holds.remove(subscription_id);
                None
            }
            None => None,
        }
    }

    /// Waits for the endpoint's `Retry-After` pause to end if it ends within `in_lane`, again if another answer
    /// has made it longer meanwhile (still within `in_lane` from then); never returns before the pause's end.
    pub async fn wait_out_pause(&self, subscription_id: &str, in_lane: Duration) -> Pause {
        let mut waited = false;
        loop {
            let now = Instant::now();
            let Some(until) = self.held_until(subscription_id, now) else {
                return if waited { Pause::WaitedOut } else { Pause::None };
            };
            if until - now > in_lane {
                return Pause::Long { until };
            }
            waited = true;
            tokio::time::sleep_until(until).await;
        }
    }

    /// Pauses the whole endpoint until `until` (a later hold wins).
    pub fn hold(&self, subscription_id: &str, until: Instant) {
        let mut holds = self.holds.lock().expect("holds lock");
        let h = holds.entry(subscription_id.to_owned()).or_insert(until);
        *h = (*h).max(until);
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
        let now = Instant::now();
        b.hold("deleted", now + Duration::from_secs(10));
        assert_eq!(b.held_until("deleted", now), Some(now + Duration::from_secs(10)));
        assert_eq!(b.retain(|id| id == "live"), 2, "the breaker and the hold");
        assert!(matches!(b.admit("deleted", 1), Admission::Send), "forgotten: closed again");
        assert_eq!(b.held_until("deleted", now), None, "its pause too");
        assert!(!matches!(b.admit("live", 1), Admission::Send), "the live one stays open");
    }

    #[test]
    fn a_retry_after_pause_lasts_until_its_latest_end_and_is_dropped_after() {
        let b = Breakers::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(b.held_until("a", t0), None);
        b.hold("a", at(2_000));
        b.hold("a", at(1_000));
        assert_eq!(b.held_until("a", at(1_500)), Some(at(2_000)), "an earlier end does not shorten it");
        assert!(matches!(b.admit("a", 1_500), Admission::Send), "a pause is not the breaker");
        assert_eq!(b.held_until("a", at(2_000)), None, "over at its end");
        assert!(b.holds.lock().unwrap().is_empty(), "an expired pause is not kept");
    }

    const IN_LANE: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn a_short_pause_is_waited_out_to_its_end_and_never_less() {
        let b = Breakers::default();
        let t0 = Instant::now();
        assert_eq!(b.wait_out_pause("a", IN_LANE).await, Pause::None);
        assert_eq!(Instant::now(), t0, "no pause, no wait");
        b.hold("a", t0 + Duration::from_secs(1));
        assert_eq!(b.wait_out_pause("a", IN_LANE).await, Pause::WaitedOut);
        assert_eq!(Instant::now(), t0 + Duration::from_secs(1), "exactly until the Retry-After ends");
        assert_eq!(b.wait_out_pause("b", IN_LANE).await, Pause::None, "another endpoint is not paused");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_made_longer_while_waiting_is_waited_out_too() {
        let b = std::sync::Arc::new(Breakers::default());
        let t0 = Instant::now();
        b.hold("a", t0 + Duration::from_secs(2));
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { (b.wait_out_pause("a", IN_LANE).await, Instant::now()) }
        });
        // Another delivery's 429 at 1 s asks for 3 s more.
        tokio::time::sleep(Duration::from_secs(1)).await;
        b.hold("a", Instant::now() + Duration::from_secs(3));
        let (pause, ended) = waiter.await.unwrap();
        assert_eq!(pause, Pause::WaitedOut);
        assert_eq!(ended, t0 + Duration::from_secs(4), "until the later end");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_longer_than_a_lane_may_wait_is_not_waited_in_the_lane() {
        let b = std::sync::Arc::new(Breakers::default());
        let t0 = Instant::now();
        b.hold("a", t0 + Duration::from_secs(30));
        assert_eq!(b.wait_out_pause("a", IN_LANE).await, Pause::Long { until: t0 + Duration::from_secs(30) });
        assert_eq!(Instant::now(), t0, "at once: the caller parks it until then");
        // Waiting, then renewed for longer than a lane may wait: parked from there, not waited for again.
        b.hold("b", t0 + Duration::from_secs(1));
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.wait_out_pause("b", IN_LANE).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.hold("b", Instant::now() + Duration::from_secs(60));
        assert_eq!(waiter.await.unwrap(), Pause::Long { until: t0 + Duration::from_millis(60_500) });
        assert_eq!(Instant::now(), t0 + Duration::from_secs(1), "it found the longer pause when the first one ended");
    }
}
