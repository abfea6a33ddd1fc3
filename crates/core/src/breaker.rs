//! The circuit breaker: after `consecutive_errors` connect errors or timeouts in a row, an endpoint gets no
//! requests for a cool-off; then one probe; its success closes the breaker, its failure opens it again for twice
//! as long (up to `max_cool_off_ms`). Distinct from a policy's `disable` rule: nothing is counted against the
//! deliveries that wait, and nothing is switched off. Pure: the dispatcher keeps one per endpoint and carries out
//! what it answers.

use crate::outcome::Outcome;
use crate::policy::BreakerRule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Breaker {
    /// Requests flow; `errors` connect errors or timeouts in a row so far.
    #[default]
    Closed,
    Counting {
        errors: u32,
    },
    /// No requests until `until_ms`.
    Open {
        until_ms: i64,
        cool_off_ms: u64,
    },
    /// One probe is out (since `since_ms`); everything else waits for its answer.
    Probing {
        since_ms: i64,
        cool_off_ms: u64,
    },
}

/// What a delivery about to send should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Send,
    /// Send: this request is the probe of a breaker that was open.
    Probe,
    /// Do not send; come back at `until_ms` (not an attempt: nothing is counted).
    Wait {
        until_ms: i64,
    },
}

/// A change the API should show (the dispatcher writes it to the endpoint state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerChange {
    Opened { until_ms: i64 },
    Closed,
}

/// Whether an outcome says the endpoint cannot be reached (what the breaker counts). Any HTTP answer, even a 5xx,
/// means it can: that is the policy's classification's business.
pub fn is_unreachable(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Timeout | Outcome::ConnectError | Outcome::TlsError)
}

impl Breaker {
    pub fn admit(&mut self, now_ms: i64) -> Admission {
        match *self {
            Breaker::Closed | Breaker::Counting { .. } => Admission::Send,
            Breaker::Open { until_ms, .. } if now_ms < until_ms => Admission::Wait { until_ms },
            Breaker::Open { cool_off_ms, .. } => {
                *self = Breaker::Probing { since_ms: now_ms, cool_off_ms };
                Admission::Probe
            }
            // A probe that never reports back (its dispatcher stopped mid-request) is replaced after a cool-off.
            Breaker::Probing { since_ms, cool_off_ms } => {
                let until_ms = since_ms.saturating_add(i64::try_from(cool_off_ms).unwrap_or(i64::MAX));
                if now_ms < until_ms {
                    Admission::Wait { until_ms }
                } else {
                    *self = Breaker::Probing { since_ms: now_ms, cool_off_ms };
                    Admission::Probe
                }
            }
        }
    }

    /// Applies a try's outcome.
    pub fn record(&mut self, rule: &BreakerRule, unreachable: bool, now_ms: i64) -> Option<BreakerChange> {
        let open = |cool_off_ms: u64| {
            let cool_off_ms = cool_off_ms.clamp(1, rule.max_cool_off_ms.max(1));
            let until_ms = now_ms.saturating_add(i64::try_from(cool_off_ms).unwrap_or(i64::MAX));
            (Breaker::Open { until_ms, cool_off_ms }, Some(BreakerChange::Opened { until_ms }))
        };
        let (next, change) = match (*self, unreachable) {
            (Breaker::Probing { .. }, false) => (Breaker::Closed, Some(BreakerChange::Closed)),
            (Breaker::Probing { cool_off_ms, .. }, true) => open(cool_off_ms.saturating_mul(2)),
            (Breaker::Closed | Breaker::Counting { .. }, false) => (Breaker::Closed, None),
            (Breaker::Closed, true) => Self::counted(rule, 1, open),
            (Breaker::Counting { errors }, true) => Self::counted(rule, errors.saturating_add(1), open),
            // Tries that were already out when it opened: their outcome changes nothing.
            (Breaker::Open { .. }, _) => (*self, None),
        };
        *self = next;
        change
    }

    fn counted(
        rule: &BreakerRule,
        errors: u32,
        open: impl Fn(u64) -> (Breaker, Option<BreakerChange>),
    ) -> (Breaker, Option<BreakerChange>) {
        if errors >= rule.consecutive_errors {
            open(rule.cool_off_ms)
        } else {
            (Breaker::Counting { errors }, None)
        }
    }

    /// Whether there is nothing to remember (a closed breaker with no errors counted).
    pub fn is_idle(&self) -> bool {
        matches!(self, Breaker::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> BreakerRule {
        BreakerRule { consecutive_errors: 3, cool_off_ms: 1_000, max_cool_off_ms: 3_000 }
    }

    #[test]
    fn opens_after_consecutive_errors_then_probes_once() {
        let (r, mut b) = (rule(), Breaker::default());
        assert_eq!(b.record(&r, true, 0), None);
        assert_eq!(b.record(&r, false, 1), None, "an HTTP answer resets the count");
        assert_eq!(b.record(&r, true, 2), None);
        assert_eq!(b.record(&r, true, 3), None);
        assert_eq!(b.record(&r, true, 4), Some(BreakerChange::Opened { until_ms: 1_004 }));
        assert_eq!(b.admit(500), Admission::Wait { until_ms: 1_004 });
        assert_eq!(b.admit(1_004), Admission::Probe);
        assert_eq!(b.admit(1_005), Admission::Wait { until_ms: 2_004 }, "one probe at a time");
        assert_eq!(b.record(&r, false, 1_100), Some(BreakerChange::Closed));
        assert_eq!(b.admit(1_101), Admission::Send);
        assert!(b.is_idle());
    }

    #[test]
    fn a_failed_probe_doubles_the_cool_off_up_to_its_cap() {
        let (r, mut b) = (rule(), Breaker::default());
        for t in 0..3 {
            b.record(&r, true, t);
        }
        assert_eq!(b.admit(1_002), Admission::Probe);
        assert_eq!(b.record(&r, true, 1_010), Some(BreakerChange::Opened { until_ms: 3_010 }));
        assert_eq!(b.admit(3_010), Admission::Probe);
        assert_eq!(b.record(&r, true, 3_020), Some(BreakerChange::Opened { until_ms: 6_020 }), "capped at 3 s");
    }

    #[test]
    fn a_lost_probe_is_replaced_and_late_outcomes_change_nothing() {
        let (r, mut b) = (rule(), Breaker::default());
        for t in 0..3 {
            b.record(&r, true, t);
        }
        assert_eq!(b.record(&r, false, 10), None, "a try already out when it opened");
        assert_eq!(b.admit(1_002), Admission::Probe);
        assert_eq!(b.admit(2_002), Admission::Probe, "the first probe never answered");
        let far = Breaker::Open { until_ms: i64::MAX, cool_off_ms: u64::MAX };
        let mut f = far;
        assert_eq!(f.admit(i64::MAX - 1), Admission::Wait { until_ms: i64::MAX });
        let mut p = Breaker::Probing { since_ms: i64::MAX - 5, cool_off_ms: u64::MAX };
        assert_eq!(p.admit(i64::MAX - 1), Admission::Wait { until_ms: i64::MAX }, "saturates");
    }
}
