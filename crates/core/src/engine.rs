//! The one place retry logic lives: (policy, delivery progress, outcome, clock, rng) → decision.
//! The dispatcher and `hookline policy simulate` both call `decide`.

use rand::{Rng, RngCore};

use crate::outcome::Outcome;
use crate::policy::matcher::{when_matches, OutcomeKey};
use crate::policy::{secs_to_ms, FinalKind, Policy, RetryAfterUse, Rule, VerdictKind};
use crate::retry_after;

/// Where a delivery stands when a try ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// 1-based attempt number the try belonged to.
    pub attempt: u32,
    /// 1-based try within the attempt (> 1 only for micro-retries).
    pub try_no: u32,
    /// When the first attempt started (ms, same clock as `now_ms`).
    pub first_attempt_at_ms: i64,
    /// When the try ended: waits are measured from here.
    pub now_ms: i64,
    /// Unix wall clock (ms) at `now_ms`, to read an HTTP-date `Retry-After` against.
    pub wall_clock_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Retry,
    Terminal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinalState {
    Succeeded,
    Failed,
    Dead,
    Cancelled,
}

/// A wait and the bounds jitter could have drawn it from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub ms: u64,
    pub min_ms: u64,
    pub max_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try again inside the same attempt after the wait.
    MicroRetry(Wait),
    /// Start attempt `attempt + 1` after the wait.
    NextAttempt(Wait),
    Final(FinalState),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub counts_toward_disable: bool,
    pub next: Next,
    /// Index of the classification rule that matched (`classify.len()`: none did, or no rule was consulted).
    pub rule: usize,
    /// Which step of the policy settled it (stored with the attempt, shown in the delivery log).
    pub decided_by: DecidedBy,
}

/// The policy's reasoning for a decision: which step of [`decide`] settled it. Stored with every attempt, so the
/// delivery log says why a delivery was retried, when, or why it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// A `success` rule matched.
    SuccessRule,
    /// A `terminal` rule matched.
    TerminalRule,
    /// A retry rule; tried again inside the attempt (`micro_retries`).
    MicroRetry,
    /// A retry rule; the next attempt after the schedule's wait.
    Schedule,
    /// A retry rule; the next attempt after the wait the receiver's `Retry-After` asked for (longer than the
    /// schedule's, or the basis of a `base_plus_jitter` wait).
    RetryAfter,
    /// A retry rule, but the schedule allows no further attempt (`max_attempts` / the end of `waits_s`).
    AttemptsExhausted,
    /// A retry rule, but the next attempt would start after the schedule's `max_window_s`.
    WindowExhausted,
}

impl DecidedBy {
    pub const ALL: [DecidedBy; 7] = [
        Self::SuccessRule,
        Self::TerminalRule,
        Self::MicroRetry,
        Self::Schedule,
        Self::RetryAfter,
        Self::AttemptsExhausted,
        Self::WindowExhausted,
    ];

    /// The word stored in the delivery log and returned by the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SuccessRule => "success_rule",
            Self::TerminalRule => "terminal_rule",
            Self::MicroRetry => "micro_retry",
            Self::Schedule => "schedule",
            Self::RetryAfter => "retry_after",
            Self::AttemptsExhausted => "attempts_exhausted",
            Self::WindowExhausted => "window_exhausted",
        }
    }

    /// The inverse of [`as_str`](Self::as_str); `None` for a word this version does not know.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == word)
    }

    /// From the attempt record's field; `None` when unspecified (an old record) or unknown to this version.
    pub fn from_wire(v: i32) -> Option<Self> {
        use crate::model::DecidedBy as W;
        Some(match W::try_from(v).ok()? {
            W::Unspecified => return None,
            W::SuccessRule => Self::SuccessRule,
            W::TerminalRule => Self::TerminalRule,
            W::MicroRetry => Self::MicroRetry,
            W::Schedule => Self::Schedule,
            W::RetryAfter => Self::RetryAfter,
            W::AttemptsExhausted => Self::AttemptsExhausted,
            W::WindowExhausted => Self::WindowExhausted,
        })
    }

    pub fn to_wire(self) -> i32 {
        use crate::model::DecidedBy as W;
        (match self {
            Self::SuccessRule => W::SuccessRule,
            Self::TerminalRule => W::TerminalRule,
            Self::MicroRetry => W::MicroRetry,
            Self::Schedule => W::Schedule,
            Self::RetryAfter => W::RetryAfter,
            Self::AttemptsExhausted => W::AttemptsExhausted,
            Self::WindowExhausted => W::WindowExhausted,
        }) as i32
    }
}

impl Decision {
    /// Whether this try ended its attempt: anything but a micro-retry. Endpoint health counts attempts, so the
    /// dispatcher applies a decision to `health` only when this is true (see `health::HealthEvent::of`).
    pub fn ends_attempt(&self) -> bool {
        !matches!(self.next, Next::MicroRetry(_))
    }
}

impl From<VerdictKind> for Verdict {
    fn from(v: VerdictKind) -> Self {
        match v {
            VerdictKind::Success => Verdict::Success,
            VerdictKind::Retry => Verdict::Retry,
            VerdictKind::Terminal => Verdict::Terminal,
        }
    }
}

impl Verdict {
    /// `success`, `retry`, `terminal`: the word attempt records and `policy simulate` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Retry => "retry",
            Verdict::Terminal => "terminal",
        }
    }
}

impl FinalState {
    /// `succeeded`, `failed`, `dead`, `cancelled`: hookline's own words (a profile's are `Policy::status_word`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinalState::Succeeded => "succeeded",
            FinalState::Failed => "failed",
            FinalState::Dead => "dead",
            FinalState::Cancelled => "cancelled",
        }
    }
}

/// Decides what follows a try.
///
/// The first `classify` rule whose `when` matches decides: a success ends the delivery `succeeded`; a terminal rule
/// ends it in its `terminal_state` (default `dead`); a retry is, in order,
/// 1. a micro-retry inside the same attempt, if the rule allows one, the policy has `micro_retries`, tries remain,
///    and the receiver did not send a usable `Retry-After` (an explicit request to wait outranks a quick retry);
/// 2. the end (`exhausted`) if the attempt was the last one the schedule allows;
/// 3. otherwise the next attempt after the scheduled wait (jittered), adjusted by `Retry-After` as the rule says
///    — `clamp`: `max(scheduled, min(retry_after, max_s))`, so never earlier than the schedule and later by at most
///    `max_s`; `base_plus_jitter`: `retry_after × (1 + U[0, ratio])`, at most `max_s`; a missing or unusable header
///    leaves the scheduled wait — unless that attempt would start after `max_window_s` from the first attempt's
///    start, which is the end (`exhausted`) too.
///
/// Waits are measured from `progress.now_ms`, the end of the try. Every wait reports the range it was drawn from.
/// Pure, total and panic-free for any input; the arithmetic saturates.
pub fn decide(policy: &Policy, progress: &Progress, outcome: &Outcome, rng: &mut dyn RngCore) -> Decision {
    let key = OutcomeKey::of(outcome);
    let Some((index, rule)) = policy.classify.iter().enumerate().find(|(_, r)| when_matches(&r.when, key)) else {
        // `validate` guarantees some rule matches. For an unvalidated policy, retrying on the schedule is the
        // choice that loses nothing and still ends.
        let (next, decided_by) = retry_next(policy, &Rule::fallback(), progress, outcome, rng);
        return Decision { verdict: Verdict::Retry, counts_toward_disable: true, next, rule: policy.classify.len(), decided_by };
    };
    let (next, decided_by) = match rule.verdict {
        VerdictKind::Success => (Next::Final(FinalState::Succeeded), DecidedBy::SuccessRule),
        VerdictKind::Terminal => (Next::Final(rule.terminal_state.unwrap_or(FinalKind::Dead).state()), DecidedBy::TerminalRule),
        VerdictKind::Retry => retry_next(policy, rule, progress, outcome, rng),
    };
    Decision { verdict: rule.verdict.into(), counts_toward_disable: rule.counts_toward_disable, next, rule: index, decided_by }
}

/// Decides for an attempt that was lost with its dispatcher, under `in_flight = "count"` (LuciBook: "the in-flight
/// reaper reclaiming a lease-expired delivery that has no attempts left" marks it dead). `started_at_ms` is when
/// the lost attempt started; the next one is due the scheduled wait after that (its end is unknown), so a
/// delivery found late is retried at once. It counts toward disablement like a timeout would.
pub fn decide_lost_attempt(policy: &Policy, attempt: u32, started_at_ms: i64, now_ms: i64, rng: &mut dyn RngCore) -> Decision {
    let (next, decided_by) = match policy.scheduled_wait(attempt) {
        None => (Next::Final(FinalState::Dead), DecidedBy::AttemptsExhausted),
        Some(w) => {
            let drawn = draw(w.min_ms, w.max_ms, rng);
            let due = due_at_ms(started_at_ms, drawn.ms);
            let left = u64::try_from(due.saturating_sub(now_ms)).unwrap_or(0);
            (Next::NextAttempt(Wait { ms: left, min_ms: left.min(drawn.min_ms), max_ms: left.min(drawn.max_ms) }), DecidedBy::Schedule)
        }
    };
    let verdict = if matches!(next, Next::Final(_)) { Verdict::Terminal } else { Verdict::Retry };
    Decision { verdict, counts_toward_disable: true, next, rule: policy.classify.len(), decided_by }
}

impl Rule {
    fn fallback() -> Rule {
        Rule {
            when: Vec::new(),
            verdict: VerdictKind::Retry,
            counts_toward_disable: true,
            retry_after: RetryAfterUse::Ignore,
            micro_retry: false,
            terminal_state: None,
            note: String::new(),
        }
    }
}

fn retry_next(policy: &Policy, rule: &Rule, progress: &Progress, outcome: &Outcome, rng: &mut dyn RngCore) -> (Next, DecidedBy) {
    let retry_after_ms = match (&rule.retry_after, outcome) {
        (RetryAfterUse::Ignore, _) => None,
        (_, Outcome::Http { retry_after: Some(value), .. }) => retry_after::parse(value, progress.wall_clock_ms),
        _ => None,
    };

    if rule.micro_retry && retry_after_ms.is_none() {
        if let Some(m) = &policy.micro_retries {
            if progress.try_no < m.max_tries {
                return (Next::MicroRetry(draw(m.delay_min_ms, m.delay_max_ms, rng)), DecidedBy::MicroRetry);
            }
        }
    }

    let exhausted = Next::Final(policy.exhausted.state());
    let Some(scheduled) = policy.scheduled_wait(progress.attempt) else {
        return (exhausted, DecidedBy::AttemptsExhausted);
    };
    let drawn = draw(scheduled.min_ms, scheduled.max_ms, rng);
    let (wait, decided_by) = match (&rule.retry_after, retry_after_ms) {
        (RetryAfterUse::Clamp { max_s }, Some(ra)) => {
            // Later than the schedule if asked, up to max_s; never earlier than the schedule.
            let ra = ra.min(secs_to_ms(*max_s));
            let by = if ra > drawn.ms { DecidedBy::RetryAfter } else { DecidedBy::Schedule };
            (Wait { ms: drawn.ms.max(ra), min_ms: drawn.min_ms.max(ra), max_ms: drawn.max_ms.max(ra) }, by)
        }
        (RetryAfterUse::BasePlusJitter { jitter_ratio, max_s }, Some(ra)) => {
            let cap = secs_to_ms(*max_s);
            let ratio = if jitter_ratio.is_finite() { jitter_ratio.clamp(0.0, 1.0) } else { 0.0 };
            // f64 → u64 `as` saturates; precision loss above 2^53 ms is far beyond any cap.
            let hi = ((ra as f64) * (1.0 + ratio)).round() as u64;
            (draw(ra.min(cap), hi.max(ra).min(cap), rng), DecidedBy::RetryAfter)
        }
        _ => (drawn, DecidedBy::Schedule),
    };

    if let Some(window_s) = policy.schedule.max_window_s {
        let deadline = due_at_ms(progress.first_attempt_at_ms, secs_to_ms(window_s));
        if due_at_ms(progress.now_ms, wait.ms) > deadline {
            return (exhausted, DecidedBy::WindowExhausted);
        }
    }
    (Next::NextAttempt(wait), decided_by)
}

/// A wait drawn uniformly from `[lo, hi]` (bounds in either order).
fn draw(a: u64, b: u64, rng: &mut dyn RngCore) -> Wait {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let ms = if lo == hi { lo } else { rng.random_range(lo..=hi) };
    Wait { ms, min_ms: lo, max_ms: hi }
}

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// When something `wait_ms` after `from_ms` is due: saturating, so a huge wait is far in the future, never in the
/// past (`from + wait as i64` would wrap a wait above `i64::MAX` ms to a negative, i.e. "now").
pub fn due_at_ms(from_ms: i64, wait_ms: u64) -> i64 {
    from_ms.saturating_add(to_i64(wait_ms))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::policy::{self, Exponential, Jitter, JitterMode, BUILTIN_NAMES};

    fn outcome_strategy() -> impl Strategy<Value = Outcome> {
        let ra = prop_oneof![
            Just(None),
            (0u64..200_000).prop_map(|n| Some(n.to_string())),
            Just(Some("Thu, 01 Jan 2026 03:00:00 GMT".to_owned())),
            Just(Some("Wed, 31 Dec 2025 03:00:00 GMT".to_owned())),
            ".{0,12}".prop_map(Some),
        ];
        prop_oneof![
            (0u16..1000, ra).prop_map(|(status, retry_after)| Outcome::Http { status, retry_after }),
            Just(Outcome::Timeout),
            Just(Outcome::ConnectError),
            Just(Outcome::TlsError),
            Just(Outcome::EgressRefused),
            Just(Outcome::InvalidUrl),
        ]
    }

    fn progress_strategy() -> impl Strategy<Value = Progress> {
        (1u32..25, 1u32..4, 0i64..300_000_000, 1_767_225_600_000i64..1_767_300_000_000)
            .prop_map(|(attempt, try_no, now_ms, wall)| Progress { attempt, try_no, first_attempt_at_ms: 0, now_ms, wall_clock_ms: wall })
    }

    proptest! {
        /// Across every built-in profile: a wait is drawn within its bounds, and never below what the policy
        /// promises — the scheduled lower bound (jitter included), or for `base_plus_jitter` the receiver's value.
        #[test]
        fn waits_respect_the_policy_lower_bound(
            which in 0usize..5, progress in progress_strategy(), outcome in outcome_strategy(), seed in any::<u64>(),
        ) {
            let p = policy::builtin(BUILTIN_NAMES[which]).unwrap();
            let d = decide(&p, &progress, &outcome, &mut StdRng::seed_from_u64(seed));
            prop_assert!(d.rule < p.classify.len());
            let rule = &p.classify[d.rule];
            match d.next {
                Next::NextAttempt(w) => {
                    prop_assert!(w.min_ms <= w.ms && w.ms <= w.max_ms, "{w:?}");
                    let scheduled = p.scheduled_wait(progress.attempt).expect("a next attempt is scheduled");
                    let header = match &outcome { Outcome::Http { retry_after: Some(v), .. } => retry_after::parse(v, progress.wall_clock_ms), _ => None };
                    match (&rule.retry_after, header) {
                        (RetryAfterUse::BasePlusJitter { max_s, .. }, Some(ra)) => {
                            prop_assert!(w.ms >= ra.min(secs_to_ms(*max_s)));
                            prop_assert!(w.ms <= secs_to_ms(*max_s));
                        }
                        (RetryAfterUse::Clamp { max_s }, Some(ra)) => {
                            // "never faster than that attempt's own scheduled wait, and never slower than max"
                            prop_assert!(w.min_ms >= scheduled.min_ms);
                            prop_assert!(w.ms <= secs_to_ms(*max_s).max(scheduled.max_ms));
                            prop_assert!(w.ms >= ra.min(secs_to_ms(*max_s)));
                        }
                        _ => {
                            prop_assert_eq!((w.min_ms, w.max_ms), (scheduled.min_ms, scheduled.max_ms));
                        }
                    }
                    if let Some(window) = p.schedule.max_window_s {
                        prop_assert!(progress.now_ms + w.ms as i64 <= secs_to_ms(window) as i64);
                    }
                }
                Next::MicroRetry(w) => {
                    let m = p.micro_retries.as_ref().expect("micro-retries configured");
                    prop_assert!(rule.micro_retry && progress.try_no < m.max_tries);
                    prop_assert!(m.delay_min_ms <= w.ms && w.ms <= m.delay_max_ms);
                }
                Next::Final(_) => {}
            }
        }

        /// Jitter stays within ±ratio (or +ratio) of the base for any schedule.
        #[test]
        fn jitter_stays_in_bounds(
            initial in 0.001f64..10_000.0, mult in 1.0f64..5.0, ratio in 0.0f64..0.99, plus in any::<bool>(),
            attempt in 1u32..50, seed in any::<u64>(),
        ) {
            let mut p = policy::builtin("relay").unwrap();
            p.schedule.exponential = Some(Exponential { initial_s: initial, multiplier: mult, max_s: 20_000.0 });
            p.schedule.max_attempts = Some(60);
            let mode = if plus { JitterMode::Plus } else { JitterMode::PlusMinus };
            p.schedule.jitter = Some(Jitter { mode, ratio });
            prop_assert!(policy::validate(&p).is_ok());
            let progress = Progress { attempt, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
            let d = decide(&p, &progress, &Outcome::http(500), &mut StdRng::seed_from_u64(seed));
            let Next::NextAttempt(w) = d.next else { panic!("{:?}", d.next) };
            let base = (initial * mult.powi(attempt as i32 - 1)).min(20_000.0) * 1000.0;
            let lo = if plus { base } else { base * (1.0 - ratio) };
            prop_assert!(w.ms as f64 >= lo.round() - 1.0 && w.ms as f64 <= (base * (1.0 + ratio)).round() + 1.0, "{w:?} base {base}");
            prop_assert!(w.min_ms <= w.ms && w.ms <= w.max_ms);
        }

        /// `decide` is total even on a policy that never went through validation: NaNs, negatives, infinities,
        /// empty classification, wild clocks.
        #[test]
        fn decide_never_panics_on_unvalidated_policies(
            waits in proptest::collection::vec(prop_oneof![any::<f64>(), Just(f64::NAN), Just(f64::INFINITY)], 0..4),
            exp in proptest::option::of((any::<f64>(), any::<f64>(), any::<f64>())),
            max_attempts in proptest::option::of(any::<u32>()), window in proptest::option::of(any::<f64>()),
            ratio in any::<f64>(), ra_ratio in any::<f64>(), ra_max in any::<f64>(), empty in any::<bool>(),
            attempt in any::<u32>(), try_no in any::<u32>(), first in any::<i64>(), now in any::<i64>(), wall in any::<i64>(),
            outcome in outcome_strategy(), seed in any::<u64>(),
        ) {
            let mut p = policy::builtin("fynapse").unwrap();
            p.schedule.waits_s = if waits.is_empty() { None } else { Some(waits) };
            p.schedule.exponential = exp.map(|(initial_s, multiplier, max_s)| Exponential { initial_s, multiplier, max_s });
            p.schedule.max_attempts = max_attempts;
            p.schedule.max_window_s = window;
            p.schedule.jitter = Some(Jitter { mode: JitterMode::PlusMinus, ratio });
            for r in &mut p.classify {
                if r.verdict == VerdictKind::Retry {
                    r.retry_after = RetryAfterUse::BasePlusJitter { jitter_ratio: ra_ratio, max_s: ra_max };
                }
            }
            if empty {
                p.classify.clear();
            }
            let progress = Progress { attempt, try_no, first_attempt_at_ms: first, now_ms: now, wall_clock_ms: wall };
            let d = decide(&p, &progress, &outcome, &mut StdRng::seed_from_u64(seed));
            if let Next::NextAttempt(w) | Next::MicroRetry(w) = d.next {
                prop_assert!(w.min_ms <= w.ms && w.ms <= w.max_ms);
            }
        }
    }

    #[test]
    fn clamp_uses_the_drawn_scheduled_wait_as_its_floor() {
        // standard: 5 s +0-10%, 429 Retry-After clamped to 12 h.
        let p = policy::builtin("standard").unwrap();
        let progress = Progress { attempt: 1, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(seed);
            let outcome = Outcome::Http { status: 429, retry_after: Some("2".into()) };
            let Next::NextAttempt(w) = decide(&p, &progress, &outcome, &mut rng).next else { panic!() };
            assert!((5_000..=5_500).contains(&w.ms), "{w:?}");
            assert_eq!((w.min_ms, w.max_ms), (5_000, 5_500));
        }
    }

    #[test]
    fn an_unclassified_outcome_on_an_unvalidated_policy_is_retried_on_the_schedule() {
        let mut p = policy::builtin("lucibook").unwrap();
        p.classify.retain(|r| r.when != ["any"]);
        let progress = Progress { attempt: 1, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
        let d = decide(&p, &progress, &Outcome::http(404), &mut StdRng::seed_from_u64(0));
        assert_eq!(d.rule, p.classify.len());
        assert_eq!((d.verdict, d.counts_toward_disable), (Verdict::Retry, true));
        assert_eq!(d.next, Next::NextAttempt(Wait { ms: 60_000, min_ms: 60_000, max_ms: 60_000 }));
    }

    #[test]
    fn every_decision_says_which_step_of_the_policy_settled_it() {
        let standard = policy::builtin("standard").unwrap();
        let at = |attempt| Progress { attempt, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
        let by = |p: &Policy, attempt, o: Outcome| decide(p, &at(attempt), &o, &mut StdRng::seed_from_u64(1)).decided_by;
        assert_eq!(by(&standard, 1, Outcome::http(200)), DecidedBy::SuccessRule);
        assert_eq!(by(&standard, 1, Outcome::http(503)), DecidedBy::Schedule);
        let last = standard.schedule.max_attempts.unwrap();
        assert_eq!(by(&standard, last, Outcome::http(503)), DecidedBy::AttemptsExhausted);
        // standard clamps a 429's Retry-After: an hour outranks the 5 s schedule, a second does not.
        assert_eq!(by(&standard, 1, Outcome::Http { status: 429, retry_after: Some("3600".into()) }), DecidedBy::RetryAfter);
        assert_eq!(by(&standard, 1, Outcome::Http { status: 429, retry_after: Some("1".into()) }), DecidedBy::Schedule);
        let fynapse = policy::builtin("fynapse").unwrap();
        assert_eq!(by(&fynapse, 1, Outcome::http(410)), DecidedBy::TerminalRule);
        let mut windowed = policy::builtin("relay").unwrap();
        windowed.schedule.max_window_s = Some(0.001);
        assert_eq!(by(&windowed, 1, Outcome::http(503)), DecidedBy::WindowExhausted);
        let lost = decide_lost_attempt(&standard, last, 0, 0, &mut StdRng::seed_from_u64(1));
        assert_eq!(lost.decided_by, DecidedBy::AttemptsExhausted);
        for d in DecidedBy::ALL {
            assert_eq!(DecidedBy::parse(d.as_str()), Some(d));
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
            assert_eq!(DecidedBy::from_wire(d.to_wire()), Some(d));
        }
        assert_eq!(DecidedBy::from_wire(0), None, "an old record");
        assert_eq!(DecidedBy::from_wire(99), None);
        assert_eq!(DecidedBy::parse("guess"), None);
    }

    #[test]
    fn a_status_outside_100_599_is_a_malformed_response() {
        // Relay retries "temporary connection or network failure" but ends "any other HTTP response".
        let p = policy::builtin("relay").unwrap();
        let progress = Progress { attempt: 1, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
        for status in [0, 99, 600, 999, u16::MAX] {
            let d = decide(&p, &progress, &Outcome::http(status), &mut StdRng::seed_from_u64(0));
            assert_eq!(d.verdict, Verdict::Retry, "{status}");
        }
    }

    #[test]
    fn a_lost_attempt_counts_on_the_schedule_from_its_start_and_the_last_one_is_dead() {
        let p = crate::policy::builtin("lucibook").unwrap();
        let rng = &mut StdRng::seed_from_u64(0);
        // Attempt 1 started at t=0 and was lost; found at t=10 s: attempt 2 is due 60 s after the lost one started.
        let d = decide_lost_attempt(&p, 1, 0, 10_000, rng);
        assert_eq!((d.verdict, d.counts_toward_disable), (Verdict::Retry, true));
        assert_eq!(d.next, Next::NextAttempt(Wait { ms: 50_000, min_ms: 50_000, max_ms: 50_000 }));
        // Found after its wait has passed: at once.
        assert_eq!(decide_lost_attempt(&p, 1, 0, 100_000, rng).next, Next::NextAttempt(Wait { ms: 0, min_ms: 0, max_ms: 0 }));
        // The sixth (last) attempt lost: dead, not failed ("no attempts left").
        let d = decide_lost_attempt(&p, 6, 0, 1, rng);
        assert_eq!((d.verdict, d.next), (Verdict::Terminal, Next::Final(FinalState::Dead)));
    }
}
