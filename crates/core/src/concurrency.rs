//! Adaptive concurrency per endpoint (policy `[concurrency]`), AIMD: an endpoint that answers 429/503, times out
//! or slows past `slow_ms` gets half as many concurrent requests (at most once per `DECREASE_EVERY_MS`, so one
//! overload that several requests in flight saw counts once); one that keeps answering gets one more for each
//! window of `limit` answers, between `min` and `max`. Pure: the dispatcher keeps one per endpoint and sizes the
//! endpoint's lane from it.

use crate::outcome::Outcome;
use crate::policy::ConcurrencyRule;

/// Decreases closer together than this count as one overload.
pub const DECREASE_EVERY_MS: i64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The endpoint answered in time.
    Answered,
    /// 429, 503, a timeout, or slower than `slow_ms`: it has more than it can take.
    Overloaded,
    /// Says nothing about its load (a connect error: the breaker's business; a refused destination).
    Neutral,
}

pub fn signal(rule: &ConcurrencyRule, outcome: &Outcome, duration_ms: u64) -> Signal {
    match outcome {
        Outcome::Http { status: 429 | 503, .. } | Outcome::Timeout => Signal::Overloaded,
        Outcome::Http { .. } if rule.slow_ms.is_some_and(|slow| duration_ms > slow) => Signal::Overloaded,
        Outcome::Http { .. } => Signal::Answered,
        _ => Signal::Neutral,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aimd {
    limit: u32,
    /// Answers since the limit last grew.
    answered: u32,
    last_decrease_ms: Option<i64>,
}

impl Aimd {
    /// Starts at `max`: a healthy endpoint is not throttled until it says it is overloaded.
    pub fn new(rule: &ConcurrencyRule) -> Self {
        Self { limit: rule.max.max(1), answered: 0, last_decrease_ms: None }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Applies one try's signal; the new limit when it changed.
    pub fn record(&mut self, rule: &ConcurrencyRule, signal: Signal, now_ms: i64) -> Option<u32> {
        let (min, max) = (rule.min.max(1), rule.max.max(rule.min.max(1)));
        let before = self.limit;
        match signal {
            Signal::Neutral => {}
            Signal::Overloaded => {
                let recent = self.last_decrease_ms.is_some_and(|t| now_ms.saturating_sub(t) < DECREASE_EVERY_MS);
                if !recent {
                    self.limit = (self.limit / 2).max(min);
                    self.last_decrease_ms = Some(now_ms);
                }
                self.answered = 0;
            }
            Signal::Answered => {
                self.answered = self.answered.saturating_add(1);
                if self.answered >= self.limit {
                    self.limit = self.limit.saturating_add(1).min(max);
                    self.answered = 0;
                }
            }
        }
        self.limit = self.limit.clamp(min, max);
        (self.limit != before).then_some(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> ConcurrencyRule {
        ConcurrencyRule { min: 1, max: 8, slow_ms: Some(500), pause_on_retry_after: true }
    }

    #[test]
    fn overload_halves_once_per_second_and_answers_grow_it_back_one_window_at_a_time() {
        let r = rule();
        let mut a = Aimd::new(&r);
        assert_eq!(a.limit(), 8);
        assert_eq!(a.record(&r, Signal::Overloaded, 0), Some(4));
        assert_eq!(a.record(&r, Signal::Overloaded, 10), None, "the same overload, seen by another request");
        assert_eq!(a.record(&r, Signal::Overloaded, 1_000), Some(2));
        assert_eq!(a.record(&r, Signal::Overloaded, 2_000), Some(1));
        assert_eq!(a.record(&r, Signal::Overloaded, 3_000), None, "never below min");
        assert_eq!(a.record(&r, Signal::Answered, 3_001), Some(2));
        assert_eq!(a.record(&r, Signal::Answered, 3_002), None);
        assert_eq!(a.record(&r, Signal::Answered, 3_003), Some(3));
        for t in 0..100 {
            a.record(&r, Signal::Answered, 4_000 + t);
        }
        assert_eq!(a.limit(), 8, "never above max");
        assert_eq!(a.record(&r, Signal::Neutral, 5_000), None);
    }

    #[test]
    fn what_counts_as_overload() {
        let r = rule();
        assert_eq!(signal(&r, &Outcome::http(503), 10), Signal::Overloaded);
        assert_eq!(signal(&r, &Outcome::http(429), 10), Signal::Overloaded);
        assert_eq!(signal(&r, &Outcome::Timeout, 10), Signal::Overloaded);
        assert_eq!(signal(&r, &Outcome::http(200), 501), Signal::Overloaded, "slower than slow_ms");
        assert_eq!(signal(&r, &Outcome::http(500), 10), Signal::Answered);
        assert_eq!(signal(&r, &Outcome::ConnectError, 10), Signal::Neutral);
    }
}
