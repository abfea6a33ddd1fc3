//! Per-endpoint rate limits: which limit applies (the subscription's fields over its policy's `[rate_limit]`
//! defaults) and a token bucket in its GCRA form (one "theoretical arrival time" per endpoint), which hands each
//! request the earliest instant it may start. Pure: the dispatcher passes a monotonic clock in microseconds.

use crate::policy::Policy;

/// The highest rate accepted (requests per second), and the largest burst.
pub const MAX_PER_S: u32 = 10_000;
pub const MAX_BURST: u32 = 10_000;
/// The same for a tenant's or an API key's publish quota (events per second through the API).
pub const MAX_PUBLISH_PER_S: u32 = 1_000_000;
pub const MAX_PUBLISH_BURST: u32 = 1_000_000;

/// At most `burst` requests at once, refilled at `per_s` a second: in any window of `w` seconds an endpoint gets at
/// most `burst + per_s * w` requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_s: u32,
    pub burst: u32,
}

/// The limit in force for a subscription: its own `rate_limit_per_s` / `burst` (0 = not set), else the policy's
/// defaults; `burst` defaults to the rate (one second's worth). `None`: no limit. Values outside the accepted ranges
/// (only possible in records not written by the API) are clamped into them.
pub fn effective(sub_per_s: u32, sub_burst: u32, policy: &Policy) -> Option<RateLimit> {
    let defaults = policy.rate_limit.as_ref();
    let per_s = if sub_per_s > 0 { sub_per_s } else { defaults.map_or(0, |d| d.per_s) };
    if per_s == 0 {
        return None;
    }
    let burst = if sub_burst > 0 { sub_burst } else { defaults.and_then(|d| d.burst).unwrap_or(per_s) };
    Some(RateLimit { per_s: per_s.min(MAX_PER_S), burst: burst.clamp(1, MAX_BURST) })
}

/// Checks a subscription's fields: each 0 (unset) or within its range; a burst needs a rate (its own or the
/// policy's). Returns the field at fault and why.
pub fn validate(per_s: u32, burst: u32, policy: &Policy) -> Result<(), (&'static str, String)> {
    if per_s > MAX_PER_S {
        return Err(("rate_limit_per_s", format!("at most {MAX_PER_S} requests per second, got {per_s}")));
    }
    if burst > MAX_BURST {
        return Err(("burst", format!("at most {MAX_BURST}, got {burst}")));
    }
    if burst > 0 && per_s == 0 && policy.rate_limit.is_none() {
        return Err(("burst", "a burst needs a rate: set rate_limit_per_s (or a policy with [rate_limit])".into()));
    }
    Ok(())
}

/// µs between two turns, and how far ahead of its time a turn may be taken (the burst).
fn steps(limit: RateLimit) -> (u64, u64) {
    let interval = 1_000_000 / u64::from(limit.per_s.clamp(1, MAX_PUBLISH_PER_S));
    (interval, interval.saturating_mul(u64::from(limit.burst.clamp(1, MAX_PUBLISH_BURST) - 1)))
}

/// One endpoint's (or publisher's) bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gcra {
    /// When the bucket would be full again if nothing else came, in the caller's microseconds.
    tat_us: u64,
}

impl Gcra {
    /// Reserves the next request's turn at `now_us` and returns how long it must wait before starting (0: at once).
    /// Every call takes a turn, so callers wait the returned time rather than asking again.
    pub fn reserve(&mut self, limit: RateLimit, now_us: u64) -> u64 {
        let (interval, tolerance) = steps(limit);
        let tat = self.tat_us.max(now_us);
        let at = tat.saturating_sub(tolerance).max(now_us);
        self.tat_us = tat.saturating_add(interval);
        at - now_us
    }

    /// Takes a turn only if one is free at `now_us`; otherwise `Err(wait)`, the bucket unchanged (a refused request
    /// costs nothing, so a client that retries after `wait` gets in).
    pub fn try_take(&mut self, limit: RateLimit, now_us: u64) -> Result<(), u64> {
        match self.wait(limit, now_us) {
            0 => {
                self.reserve(limit, now_us);
                Ok(())
            }
            wait => Err(wait),
        }
    }

    /// How long a request at `now_us` would wait for its turn (0: none), without taking it.
    pub fn wait(&self, limit: RateLimit, now_us: u64) -> u64 {
        let (_, tolerance) = steps(limit);
        self.tat_us.max(now_us).saturating_sub(tolerance).saturating_sub(now_us)
    }

    /// Whether the bucket is full at `now_us` (it then remembers nothing: dropping it changes no answer).
    pub fn is_full(&self, now_us: u64) -> bool {
        self.tat_us <= now_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TEN: RateLimit = RateLimit { per_s: 10, burst: 5 };

    #[test]
    fn a_burst_at_once_then_the_rate() {
        let mut b = Gcra::default();
        let waits: Vec<u64> = (0..8).map(|_| b.reserve(TEN, 1_000_000)).collect();
        assert_eq!(waits, [0, 0, 0, 0, 0, 100_000, 200_000, 300_000]);
        // After a quiet second the bucket is full again (but never fuller than the burst).
        let later = 10_000_000;
        let waits: Vec<u64> = (0..6).map(|_| b.reserve(TEN, later)).collect();
        assert_eq!(waits, [0, 0, 0, 0, 0, 100_000]);
    }

    #[test]
    fn a_refused_turn_costs_nothing() {
        let mut b = Gcra::default();
        let t0 = 1_000_000;
        assert!((0..5).all(|_| b.try_take(TEN, t0).is_ok()), "the burst");
        assert_eq!(b.try_take(TEN, t0), Err(100_000));
        // Refusals do not push the next turn back.
        assert_eq!(b.try_take(TEN, t0 + 50_000), Err(50_000));
        assert_eq!(b.try_take(TEN, t0 + 100_000), Ok(()));
        assert_eq!(b.wait(TEN, t0 + 100_000), 100_000);
        assert!(!b.is_full(t0 + 100_000));
        assert!(b.is_full(t0 + 600_000));
    }

    #[test]
    fn limits_come_from_the_subscription_then_the_policy() {
        let mut p = crate::policy::builtin("standard").unwrap();
        assert_eq!(effective(0, 0, &p), None);
        assert_eq!(effective(10, 0, &p), Some(RateLimit { per_s: 10, burst: 10 }));
        assert_eq!(effective(10, 3, &p), Some(RateLimit { per_s: 10, burst: 3 }));
        assert!(validate(0, 3, &p).unwrap_err().0 == "burst");
        assert!(validate(MAX_PER_S + 1, 0, &p).unwrap_err().0 == "rate_limit_per_s");
        p.rate_limit = Some(crate::policy::RateLimitDefaults { per_s: 50, burst: Some(100) });
        assert_eq!(effective(0, 0, &p), Some(RateLimit { per_s: 50, burst: 100 }));
        assert_eq!(effective(0, 7, &p), Some(RateLimit { per_s: 50, burst: 7 }));
        assert_eq!(effective(5, 0, &p), Some(RateLimit { per_s: 5, burst: 100 }));
        assert!(validate(0, 3, &p).is_ok());
    }

    proptest! {
        /// Whenever requests come, the turns handed out never put more than `burst + per_s * w` in a window of `w`
        /// seconds, and nothing panics or wraps, even at the clock's end.
        #[test]
        fn no_window_gets_more_than_the_burst_rule(per_s in 1u32..200, burst in 1u32..20, gaps in prop::collection::vec(0u64..300_000, 1..200), start in prop_oneof![Just(0u64), Just(u64::MAX - 1_000_000_000), 0u64..1_000_000_000]) {
            let limit = RateLimit { per_s, burst };
            let mut b = Gcra::default();
            let mut now = start;
            let mut starts = Vec::new();
            for g in gaps {
                now = now.saturating_add(g);
                let wait = b.reserve(limit, now);
                starts.push(now.saturating_add(wait));
            }
            starts.sort_unstable();
            let interval = 1_000_000 / u64::from(per_s);
            for (i, s) in starts.iter().enumerate() {
                for w_us in [interval, 1_000_000, 3_000_000] {
                    let n = starts[i..].iter().take_while(|t| **t < s.saturating_add(w_us)).count() as u64;
                    prop_assert!(n <= u64::from(burst) + w_us.div_ceil(interval), "{n} in {w_us} us");
                }
            }
        }
    }
}
