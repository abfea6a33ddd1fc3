//! Endpoint health as a pure state machine over `EndpointState` (the compacted `endpoint-state` topic's value).
//!
//! The dispatcher that owns a subscription's partition feeds it one event per finished attempt
//! ([`HealthEvent::of`]) and acts on the returned [`Transition`]: it writes the new state, and on a trip pauses or
//! disables the subscription and emits an ops event.

use crate::engine::{Decision, Verdict};
use crate::model::{EndpointCondition, EndpointState};
use crate::policy::DisableAction;
use crate::policy::DisableRule;

/// What a finished attempt means for its endpoint's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthEvent {
    Success,
    /// A failure the policy counts toward disablement.
    CountedFailure,
    /// A failure the policy does not count (LuciBook's 429): leaves the state as it is.
    UncountedFailure,
}

impl HealthEvent {
    /// The event for a decision, or `None` for a try that did not end its attempt (a micro-retry follows), so
    /// that an endpoint's failures are counted once per attempt.
    pub fn of(decision: &Decision) -> Option<HealthEvent> {
        if !decision.ends_attempt() {
            return None;
        }
        Some(match decision.verdict {
            Verdict::Success => HealthEvent::Success,
            _ if decision.counts_toward_disable => HealthEvent::CountedFailure,
            _ => HealthEvent::UncountedFailure,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    None,
    /// The endpoint just crossed the policy's threshold: pause or disable the subscription and notify.
    Tripped {
        action: DisableAction,
        reason: String,
    },
    /// A success after failures: the endpoint is healthy again.
    Recovered,
}

/// Whether the endpoint is paused or disabled: a tripped endpoint stays so until the user resumes it.
pub fn is_tripped(state: &EndpointState) -> bool {
    matches!(state.condition(), EndpointCondition::Paused | EndpointCondition::Disabled)
}

/// Applies one attempt's event at `now_ms`. `rule` is the policy's `disable` table (none: never trips).
///
/// - success: the failure streak ends (count and first-failure time reset); `Recovered` if there was one;
/// - counted failure: the streak grows (its start is recorded on the first); trips when the count reaches
///   `after_consecutive_failures` or the streak has lasted `after_failing_for_s`;
/// - uncounted failure: nothing changes.
///
/// A tripped endpoint stays tripped, and trips only once: later events (attempts that were in flight) only
/// update the last-success / last-failure times.
pub fn apply(state: &mut EndpointState, rule: Option<&DisableRule>, event: HealthEvent, now_ms: i64) -> Transition {
    if is_tripped(state) {
        match event {
            HealthEvent::Success => state.last_success_at_ms = now_ms,
            HealthEvent::CountedFailure => state.last_failure_at_ms = now_ms,
            HealthEvent::UncountedFailure => {}
        }
        return Transition::None;
    }
    match event {
        HealthEvent::UncountedFailure => Transition::None,
        HealthEvent::Success => {
            let had_failures = state.consecutive_failures > 0 || state.condition() == EndpointCondition::Failing;
            state.consecutive_failures = 0;
            state.first_failure_at_ms = 0;
            state.last_success_at_ms = now_ms;
            set_condition(state, EndpointCondition::Healthy, now_ms);
            if had_failures {
                Transition::Recovered
            } else {
                Transition::None
            }
        }
        HealthEvent::CountedFailure => {
            if state.consecutive_failures == 0 {
                state.first_failure_at_ms = now_ms;
            }
            state.consecutive_failures = state.consecutive_failures.saturating_add(1);
            state.last_failure_at_ms = now_ms;
            set_condition(state, EndpointCondition::Failing, now_ms);
            let Some(rule) = rule else { return Transition::None };
            let by_count = rule.after_consecutive_failures.is_some_and(|n| state.consecutive_failures >= n);
            let by_time = rule.after_failing_for_s.is_some_and(|s| {
                let failing_ms = i128::from(now_ms) - i128::from(state.first_failure_at_ms);
                // f64 → i128 `as` saturates (and NaN is 0, which validation rules out).
                s.is_finite() && s > 0.0 && failing_ms >= (s * 1000.0).round() as i128
            });
            if !(by_count || by_time) {
                return Transition::None;
            }
            let condition = match rule.action {
                DisableAction::Pause => EndpointCondition::Paused,
                DisableAction::Disable => EndpointCondition::Disabled,
            };
            set_condition(state, condition, now_ms);
            state.reason = rule.reason.clone();
            Transition::Tripped { action: rule.action, reason: rule.reason.clone() }
        }
    }
}

/// The part of an endpoint's state its readers act on (the times only describe it): a change of it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Material {
    consecutive_failures: u32,
    condition: i32,
    generation: u64,
    first_failure_at_ms: i64,
}

impl Material {
    pub fn of(state: &EndpointState) -> Self {
        Self {
            consecutive_failures: state.consecutive_failures,
            condition: state.condition,
            generation: state.generation,
            first_failure_at_ms: state.first_failure_at_ms,
        }
    }

    /// Whether going from `before` to `self` is worth a record. Not from unknown to healthy without failures (an
    /// endpoint's first success): every reader takes a missing state, or an unknown condition, as healthy with no
    /// failures (the API's `last_success_at_ms` then comes from the delivery log), so the record would tell them
    /// nothing, and a fan-out to many subscriptions would write one per subscription with traffic.
    pub fn changed_from(self, before: Material) -> bool {
        let as_assumed = before.condition == EndpointCondition::Unspecified as i32
            && before.consecutive_failures == 0
            && self.condition == EndpointCondition::Healthy as i32
            && self.consecutive_failures == 0;
        self != before && !as_assumed
    }
}

/// The user resumed or re-enabled the endpoint: healthy, counters and reason cleared, `generation` (the
/// subscription's `resume_generation`) recorded so that an older automatic pause no longer applies.
pub fn resume(state: &mut EndpointState, generation: u64) {
    state.consecutive_failures = 0;
    state.first_failure_at_ms = 0;
    state.reason.clear();
    state.set_condition(EndpointCondition::Healthy);
    // The time of the resume is not known here; 0 reads as "unknown" rather than a stale instant.
    state.condition_since_ms = 0;
    state.generation = generation;
}

fn set_condition(state: &mut EndpointState, condition: EndpointCondition, now_ms: i64) {
    if state.condition() != condition {
        state.set_condition(condition);
        state.condition_since_ms = now_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Next, Wait};
    use crate::policy;

    const DAY_MS: i64 = 86_400_000;

    fn lucibook() -> DisableRule {
        policy::builtin("lucibook").and_then(|p| p.disable).expect("lucibook has a disable rule")
    }

    fn gauge() -> DisableRule {
        policy::builtin("gauge").and_then(|p| p.disable).expect("gauge has a disable rule")
    }

    #[test]
    fn lucibook_pauses_on_the_fiftieth_counted_failure_and_429s_do_not_count() {
        let rule = lucibook();
        let mut s = EndpointState::default();
        for i in 1..=49 {
            assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, i), Transition::None, "failure {i}");
            // "it's the only response that pauses delivery without also burning down your consecutive_failures budget"
            assert_eq!(apply(&mut s, Some(&rule), HealthEvent::UncountedFailure, i), Transition::None);
        }
        assert_eq!(s.consecutive_failures, 49);
        assert_eq!(s.condition(), EndpointCondition::Failing);
        let t = apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 50);
        assert_eq!(t, Transition::Tripped { action: DisableAction::Pause, reason: "consecutive_failures".into() });
        assert_eq!(s.condition(), EndpointCondition::Paused);
        assert_eq!(s.reason, "consecutive_failures");
        assert_eq!(s.condition_since_ms, 50);
    }

    #[test]
    fn an_uncounted_failure_changes_nothing() {
        let mut s = EndpointState { consecutive_failures: 3, first_failure_at_ms: 7, ..Default::default() };
        s.set_condition(EndpointCondition::Failing);
        let before = s.clone();
        assert_eq!(apply(&mut s, Some(&lucibook()), HealthEvent::UncountedFailure, 1_000), Transition::None);
        assert_eq!(s, before);
    }

    #[test]
    fn a_success_resets_the_count() {
        let rule = lucibook();
        let mut s = EndpointState::default();
        for i in 0..49 {
            apply(&mut s, Some(&rule), HealthEvent::CountedFailure, i);
        }
        assert_eq!(apply(&mut s, Some(&rule), HealthEvent::Success, 100), Transition::Recovered);
        assert_eq!((s.consecutive_failures, s.first_failure_at_ms, s.last_success_at_ms), (0, 0, 100));
        assert_eq!(s.condition(), EndpointCondition::Healthy);
        // 49 more do not trip: the count started again.
        for i in 0..49 {
            assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 200 + i), Transition::None);
        }
        // A success with no failure before it is not a recovery.
        let mut fresh = EndpointState::default();
        assert_eq!(apply(&mut fresh, Some(&rule), HealthEvent::Success, 1), Transition::None);
    }

    #[test]
    fn gauge_disables_after_three_days_of_failures_only() {
        let rule = gauge();
        let mut s = EndpointState::default();
        let start = 1_000;
        // Hundreds of failures within three days do not trip: Gauge counts time, not failures.
        for i in 0..500 {
            let at = start + i * (3 * DAY_MS - 1) / 500;
            assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, at), Transition::None);
        }
        assert_eq!(s.first_failure_at_ms, start);
        assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, start + 3 * DAY_MS - 1), Transition::None);
        let t = apply(&mut s, Some(&rule), HealthEvent::CountedFailure, start + 3 * DAY_MS);
        assert_eq!(t, Transition::Tripped { action: DisableAction::Disable, reason: "consecutive_failures".into() });
        assert_eq!(s.condition(), EndpointCondition::Disabled);
    }

    #[test]
    fn gauge_one_success_resets_the_three_days() {
        let rule = gauge();
        let mut s = EndpointState::default();
        apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 0);
        apply(&mut s, Some(&rule), HealthEvent::Success, 2 * DAY_MS);
        apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 2 * DAY_MS + 1);
        assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 4 * DAY_MS), Transition::None);
        assert!(matches!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 5 * DAY_MS + 1), Transition::Tripped { .. }));
    }

    #[test]
    fn trips_once_and_stays_tripped_until_resumed() {
        let rule = lucibook();
        let mut s = EndpointState::default();
        for i in 0..50 {
            apply(&mut s, Some(&rule), HealthEvent::CountedFailure, i);
        }
        assert!(is_tripped(&s));
        let since = s.condition_since_ms;
        // Attempts that were already in flight finish afterwards: no second trip, no recovery.
        assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 60), Transition::None);
        assert_eq!(apply(&mut s, Some(&rule), HealthEvent::Success, 61), Transition::None);
        assert_eq!(s.condition(), EndpointCondition::Paused);
        assert_eq!((s.condition_since_ms, s.last_success_at_ms, s.last_failure_at_ms), (since, 61, 60));

        resume(&mut s, 7);
        assert_eq!(s.condition(), EndpointCondition::Healthy);
        assert_eq!((s.consecutive_failures, s.first_failure_at_ms, s.generation), (0, 0, 7));
        assert!(s.reason.is_empty());
        // The count starts again from zero.
        for i in 0..49 {
            assert_eq!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 100 + i), Transition::None);
        }
        assert!(matches!(apply(&mut s, Some(&rule), HealthEvent::CountedFailure, 200), Transition::Tripped { .. }));
    }

    #[test]
    fn without_a_rule_failures_are_counted_but_never_trip() {
        let mut s = EndpointState::default();
        for i in 0..10_000 {
            assert_eq!(apply(&mut s, None, HealthEvent::CountedFailure, i), Transition::None);
        }
        assert_eq!(s.consecutive_failures, 10_000);
        assert_eq!(s.condition(), EndpointCondition::Failing);
    }

    /// What `Material::changed_from` says about one event applied to `state`.
    fn written(mut state: EndpointState, rule: Option<&DisableRule>, event: HealthEvent) -> bool {
        let before = Material::of(&state);
        apply(&mut state, rule, event, 1_000);
        Material::of(&state).changed_from(before)
    }

    #[test]
    fn a_first_success_writes_nothing_and_every_other_change_of_health_is_written() {
        let rule = lucibook();
        let fresh = EndpointState::default();
        assert!(!written(fresh.clone(), Some(&rule), HealthEvent::Success), "unknown → healthy: what a reader assumes of no state");
        assert!(written(fresh.clone(), Some(&rule), HealthEvent::CountedFailure), "a first failure");
        assert!(!written(fresh.clone(), Some(&rule), HealthEvent::UncountedFailure));
        // A state written for something else first (an ordered key's head, a breaker) has an unknown condition too.
        let other = EndpointState { concurrency_limit: 4, ..Default::default() };
        assert!(!written(other, Some(&rule), HealthEvent::Success));
        let mut healthy = fresh.clone();
        apply(&mut healthy, Some(&rule), HealthEvent::Success, 1);
        assert!(!written(healthy.clone(), Some(&rule), HealthEvent::Success), "healthy stays healthy: only the time moves");
        assert!(written(healthy.clone(), Some(&rule), HealthEvent::CountedFailure));
        let mut failing = fresh.clone();
        apply(&mut failing, Some(&rule), HealthEvent::CountedFailure, 1);
        assert!(written(failing.clone(), Some(&rule), HealthEvent::Success), "a recovery");
        assert!(written(failing.clone(), Some(&rule), HealthEvent::CountedFailure), "one more failure");
        let mut tripped = fresh.clone();
        let one = DisableRule { after_consecutive_failures: Some(1), ..rule.clone() };
        assert!(matches!(apply(&mut tripped, Some(&one), HealthEvent::CountedFailure, 1), Transition::Tripped { .. }));
        assert!(written(fresh.clone(), Some(&one), HealthEvent::CountedFailure), "a pause at the first failure");
        assert!(!written(tripped.clone(), Some(&one), HealthEvent::Success), "a paused endpoint stays paused");
        // A resume of a paused endpoint is written (its generation and condition change), even before a success.
        let mut resumed = tripped.clone();
        let before = Material::of(&resumed);
        resume(&mut resumed, 1);
        assert!(Material::of(&resumed).changed_from(before));
        // A resume of an endpoint with no state yet, then its first success: still healthy without failures.
        let mut fresh_resumed = fresh.clone();
        let before = Material::of(&fresh_resumed);
        resume(&mut fresh_resumed, 2);
        apply(&mut fresh_resumed, Some(&rule), HealthEvent::Success, 5);
        assert!(!Material::of(&fresh_resumed).changed_from(before));
    }

    #[test]
    fn micro_retried_tries_are_not_events() {
        let wait = Wait { ms: 500, min_ms: 200, max_ms: 2000 };
        let micro = Decision {
            verdict: Verdict::Retry,
            counts_toward_disable: true,
            next: Next::MicroRetry(wait),
            rule: 3,
            decided_by: crate::engine::DecidedBy::MicroRetry,
        };
        assert_eq!(HealthEvent::of(&micro), None);
        let next = Decision { next: Next::NextAttempt(wait), ..micro };
        assert_eq!(HealthEvent::of(&next), Some(HealthEvent::CountedFailure));
        let backoff = Decision { counts_toward_disable: false, ..next };
        assert_eq!(HealthEvent::of(&backoff), Some(HealthEvent::UncountedFailure));
        let ok = Decision {
            verdict: Verdict::Success,
            counts_toward_disable: false,
            next: Next::Final(crate::FinalState::Succeeded),
            rule: 0,
            decided_by: crate::engine::DecidedBy::SuccessRule,
        };
        assert_eq!(HealthEvent::of(&ok), Some(HealthEvent::Success));
    }
}
