//! The timing rules of the tier ladder: when a held record is released, and where it goes then.

use hookline_core::model::RetryEnvelope;
use hookline_kafka::topics::{tier_for, Tier};

/// When a record on a tier may leave it: its tier delay after it was enqueued, or its due time if sooner.
/// (A record is routed to the largest tier not longer than its wait, so the due time is sooner only on the
/// shortest tier, for waits under a second.)
pub fn release_at_ms(env: &RetryEnvelope) -> i64 {
    let due = env.task.as_ref().map_or(0, |t| t.due_at_ms);
    let tier_end = env.enqueued_at_ms.saturating_add(env.tier_delay_ms);
    if due > 0 {
        due.min(tier_end)
    } else {
        tier_end
    }
}

/// Where a released record goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Due: back to the deliveries topic.
    Deliver,
    /// Time remains: to the largest tier not longer than the remaining wait.
    Tier(&'static Tier),
}

pub fn route(due_at_ms: i64, now_ms: i64) -> Route {
    if due_at_ms <= now_ms {
        Route::Deliver
    } else {
        Route::Tier(tier_for(u64::try_from(due_at_ms.saturating_sub(now_ms)).unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_core::model::DeliveryTask;

    fn env(enqueued: i64, tier_delay: i64, due: i64) -> RetryEnvelope {
        RetryEnvelope {
            task: Some(DeliveryTask { due_at_ms: due, ..Default::default() }),
            enqueued_at_ms: enqueued,
            tier_delay_ms: tier_delay,
        }
    }

    #[test]
    fn release_is_never_before_due_and_not_past_the_tier() {
        // A 12 h wait on the 4 h tier: released after 4 h, then re-routed.
        assert_eq!(release_at_ms(&env(0, 14_400_000, 43_200_000)), 14_400_000);
        // A 300 ms wait on the 1 s tier: released at its due time.
        assert_eq!(release_at_ms(&env(1_000, 1_000, 1_300)), 1_300);
        assert_eq!(release_at_ms(&env(5, 1_000, 0)), 1_005);
    }

    #[test]
    fn re_routing_walks_down_the_ladder_until_due() {
        let due = 43_200_000; // 12 h
        let mut now = 0;
        let mut hops = Vec::new();
        while let Route::Tier(t) = route(due, now) {
            hops.push(t.name);
            now = release_at_ms(&env(now, t.delay_ms as i64, due));
            assert!(now <= due, "never released after due on the way");
        }
        assert_eq!(now, due, "forwarded exactly at due");
        assert_eq!(hops, ["4h", "4h", "4h"]);
        let mut now = 0;
        let due = 100_000; // 1 min 40 s: 1m, then 15s x2, then 4s x2, then 1s x2
        let mut hops = Vec::new();
        while let Route::Tier(t) = route(due, now) {
            hops.push(t.name);
            now = release_at_ms(&env(now, t.delay_ms as i64, due));
        }
        assert_eq!(hops, ["1m", "15s", "15s", "4s", "4s", "1s", "1s"]);
        assert_eq!(route(due, due), Route::Deliver);
    }
}
