//! Building the records a delivery's outcome produces, from typed values: states, verdicts and outcomes are
//! enums here and become the records' words in one place.

use hookline_core::model::{AttemptPhase, AttemptRecord, DeadLetter, DeliveryTask, Event};
use hookline_core::vocabulary::DeadLetterReason;
use hookline_core::{Decision, FinalState, Next, Policy, UntriedOutcome, Verdict};

use crate::sender::TryResult;

/// Where a record leaves its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Not final: another try or attempt follows.
    Pending,
    Final(FinalState),
    /// The policy's `inactive = "skip"`: a final state that is not an outcome of the engine.
    Skipped,
}

impl RecordState {
    /// The record's `final_state`: empty while pending.
    fn final_word(self) -> &'static str {
        match self {
            RecordState::Pending => "",
            RecordState::Final(s) => s.as_str(),
            RecordState::Skipped => "skipped",
        }
    }
}

/// Whose words a record uses for its state.
#[derive(Debug, Clone, Copy)]
pub enum Words<'a> {
    /// The delivery's policy: its status words, and its name as the record's `policy`.
    Policy(&'a Policy),
    /// No usable policy: hookline's own words, under the policy name the subscription names (maybe empty).
    Own { policy_name: &'a str },
}

impl<'a> Words<'a> {
    fn policy_name(self) -> &'a str {
        match self {
            Words::Policy(p) => &p.name,
            Words::Own { policy_name } => policy_name,
        }
    }

    /// The record's `status_word` for `state`.
    pub fn status(self, state: RecordState) -> &'a str {
        match (self, state) {
            (Words::Policy(p), RecordState::Pending) => &p.status_words.pending,
            (Words::Policy(p), RecordState::Final(s)) => p.status_word(s),
            (Words::Policy(p), RecordState::Skipped) => &p.status_words.skipped,
            (Words::Own { .. }, RecordState::Pending) => "pending",
            (Words::Own { .. }, s) => s.final_word(),
        }
    }
}

pub struct TryContext<'a> {
    pub task: &'a DeliveryTask,
    pub attempt: u32,
    pub try_no: u32,
    pub started_at_ms: i64,
    /// The same instant to the µs (`AttemptRecord.started_at_us`).
    pub started_at_us: i64,
    pub policy: &'a hookline_core::Policy,
}

/// The record of a try; its state and status word follow from `decision`. The headers are moved out of `result`
/// (the rest of it is still read afterwards).
pub fn attempt_record(cx: &TryContext<'_>, result: &mut TryResult, decision: &Decision, next_due_at_ms: i64) -> AttemptRecord {
    let event = cx.task.event.as_ref();
    let rule = cx.policy.classify.get(decision.rule);
    let state = match decision.next {
        Next::Final(s) => RecordState::Final(s),
        Next::MicroRetry(_) | Next::NextAttempt(_) => RecordState::Pending,
    };
    AttemptRecord {
        delivery_id: cx.task.delivery_id.clone(),
        subscription_id: cx.task.subscription_id.clone(),
        event_id: event.map(|e| e.id.clone()).unwrap_or_default(),
        event_type: event.map(|e| e.r#type.clone()).unwrap_or_default(),
        attempt: cx.attempt,
        r#try: cx.try_no,
        started_at_ms: cx.started_at_ms,
        duration_ms: result.duration.as_millis() as i64,
        outcome: result.outcome.token(),
        http_status: result.outcome.status().map(u32::from).unwrap_or(0),
        reason: result.reason.clone(),
        response_excerpt: result.response_excerpt.clone(),
        verdict: decision.verdict.as_str().to_owned(),
        counts_toward_disable: decision.counts_toward_disable,
        next_due_at_ms,
        final_state: state.final_word().to_owned(),
        status_word: Words::Policy(cx.policy).status(state).to_owned(),
        phase: AttemptPhase::Finished as i32,
        policy: cx.policy.name.clone(),
        request_headers: std::mem::take(&mut result.request_headers),
        response_headers: std::mem::take(&mut result.response_headers),
        decided_by: decision.decided_by.to_wire(),
        // 1-based; 0 when no rule matched (an unvalidated policy's fallback).
        rule: rule.map_or(0, |_| u32::try_from(decision.rule).map_or(0, |i| i.saturating_add(1))),
        rule_when: rule.map(|r| r.when.join(" ")).unwrap_or_default(),
        // Set by `deliver::conclude` on the record that ends the attempt.
        concludes_attempt: 0,
        run_id: String::new(),
        // Set by `deliver` when tracing is on.
        traceparent: String::new(),
        received_at_us: cx.task.received_at_us,
        started_at_us: cx.started_at_us,
    }
}

/// A record of an attempt that ended without an HTTP try (deleted or inactive subscription, invalid policy,
/// oversize body), or of a lost attempt (`lease_expired`, final or retried).
pub struct Untried<'a> {
    pub task: &'a DeliveryTask,
    pub outcome: UntriedOutcome,
    pub reason: String,
    pub state: RecordState,
    pub words: Words<'a>,
    pub at_ms: i64,
}

impl Untried<'_> {
    /// The record, with the verdict `terminal`: nothing was tried, so nothing was classified.
    pub fn record(self) -> AttemptRecord {
        self.record_with(Verdict::Terminal)
    }

    pub fn record_with(self, verdict: Verdict) -> AttemptRecord {
        let event = self.task.event.as_ref();
        AttemptRecord {
            delivery_id: self.task.delivery_id.clone(),
            subscription_id: self.task.subscription_id.clone(),
            event_id: event.map(|e| e.id.clone()).unwrap_or_default(),
            event_type: event.map(|e| e.r#type.clone()).unwrap_or_default(),
            attempt: self.task.attempts_made,
            r#try: 0,
            started_at_ms: self.at_ms,
            outcome: self.outcome.as_str().to_owned(),
            reason: self.reason,
            verdict: verdict.as_str().to_owned(),
            final_state: self.state.final_word().to_owned(),
            status_word: self.words.status(self.state).to_owned(),
            phase: AttemptPhase::Finished as i32,
            policy: self.words.policy_name().to_owned(),
            ..Default::default()
        }
    }
}

/// A delivery's dead letter.
pub struct Dead<'a> {
    pub task: &'a DeliveryTask,
    pub reason: DeadLetterReason,
    pub detail: String,
    pub state: FinalState,
    pub words: Words<'a>,
    /// Attempts made, counted across runs.
    pub attempts: u32,
    /// The last attempt's outcome word (empty when there was none to speak of).
    pub last_outcome: String,
    pub at_ms: i64,
}

impl Dead<'_> {
    pub fn letter(self) -> DeadLetter {
        let state = RecordState::Final(self.state);
        DeadLetter {
            reason: self.reason.as_str().to_owned(),
            detail: self.detail,
            final_state: state.final_word().to_owned(),
            status_word: self.words.status(state).to_owned(),
            subscription_id: self.task.subscription_id.clone(),
            delivery_id: self.task.delivery_id.clone(),
            event: self.task.event.clone(),
            attempts: self.attempts,
            last_outcome: self.last_outcome,
            at_ms: self.at_ms,
            first_attempt_at_ms: self.task.first_attempt_at_ms,
            ..Default::default()
        }
    }
}

/// `dl` with what the delivery's last HTTP try got back (status and the capped start of the body).
pub fn with_last_try(mut dl: DeadLetter, result: &TryResult) -> DeadLetter {
    dl.last_http_status = result.outcome.status().map(u32::from).unwrap_or(0);
    dl.last_response_excerpt = result.response_excerpt.clone();
    dl
}

/// The follow-up event for a dead delivery (Relay: `message.failed` for a dead `message.received`).
pub fn follow_up_event(task: &DeliveryTask, emit_type: &str, reason: &str, now_ms: i64) -> Event {
    let original = task.event.clone().unwrap_or_default();
    let data = serde_json::json!({
        "event_id": original.id,
        "event_type": original.r#type,
        "delivery_id": task.delivery_id,
        "subscription_id": task.subscription_id,
        "reason": reason,
    });
    Event {
        id: follow_up_id(&task.delivery_id, emit_type),
        r#type: emit_type.to_owned(),
        occurred_at_ms: now_ms,
        tenant: original.tenant,
        entity_id: original.entity_id,
        data_json: serde_json::to_vec(&data).unwrap_or_default().into(),
        accepted_at_ms: 0,
        // The follow-up continues the original's trace.
        traceparent: original.traceparent,
        tracestate: original.tracestate,
        // A follow-up fans out to its own type's subscribers, even for a test event.
        only_subscription_id: String::new(),
    }
}

/// Deterministic, so a re-run of the same death produces the same follow-up id (receivers deduplicate).
fn follow_up_id(delivery_id: &str, emit_type: &str) -> String {
    let id = hookline_core::model::delivery_id(delivery_id, emit_type);
    format!("evt_{}", &id["dlv_".len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The record a closing used to be built as, field by field from positional words (the shape before the
    /// typed builder): what the log, the API and the tests read. Its eight positional arguments are the point.
    #[allow(clippy::too_many_arguments)]
    fn legacy_closing(task: &DeliveryTask, outcome: &str, reason: &str, final_state: &str, status_word: &str, now_ms: i64, policy: &str, verdict: &str) -> AttemptRecord {
        let event = task.event.as_ref();
        AttemptRecord {
            delivery_id: task.delivery_id.clone(),
            subscription_id: task.subscription_id.clone(),
            event_id: event.map(|e| e.id.clone()).unwrap_or_default(),
            event_type: event.map(|e| e.r#type.clone()).unwrap_or_default(),
            attempt: task.attempts_made,
            started_at_ms: now_ms,
            outcome: outcome.to_owned(),
            reason: reason.to_owned(),
            verdict: verdict.into(),
            final_state: final_state.to_owned(),
            status_word: status_word.to_owned(),
            phase: AttemptPhase::Finished as i32,
            policy: policy.to_owned(),
            ..Default::default()
        }
    }

    fn task() -> DeliveryTask {
        DeliveryTask {
            delivery_id: "dlv_1".into(),
            subscription_id: "sub_1".into(),
            attempts_made: 2,
            first_attempt_at_ms: 1_000,
            event: Some(Event { id: "evt_1".into(), r#type: "order.paid".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    /// Every record shape the dispatcher writes without a try, built from typed values, encodes to the same bytes
    /// as the words the call sites used to pass (Fynapse's profile has its own status words, so a swapped word
    /// would show).
    #[test]
    fn untried_records_encode_as_before() {
        let t = task();
        let fynapse = hookline_core::policy::builtin("fynapse").unwrap();
        let own = Words::Own { policy_name: "custom" };
        let p = Words::Policy(&fynapse);
        let sw = &fynapse.status_words;
        let cases: [(UntriedOutcome, RecordState, Words<'_>, Verdict, AttemptRecord); 7] = [
            (UntriedOutcome::SubscriptionDeleted, RecordState::Final(FinalState::Cancelled), Words::Own { policy_name: "" }, Verdict::Terminal,
                legacy_closing(&t, "subscription_deleted", "why", "cancelled", "cancelled", 5, "", "terminal")),
            (UntriedOutcome::InvalidPolicy, RecordState::Final(FinalState::Dead), own, Verdict::Terminal,
                legacy_closing(&t, "invalid_policy", "why", "dead", "dead", 5, "custom", "terminal")),
            (UntriedOutcome::Inactive, RecordState::Final(FinalState::Cancelled), p, Verdict::Terminal,
                legacy_closing(&t, "inactive", "why", "cancelled", fynapse.status_word(FinalState::Cancelled), 5, "fynapse", "terminal")),
            (UntriedOutcome::Inactive, RecordState::Skipped, p, Verdict::Terminal,
                legacy_closing(&t, "inactive", "why", "skipped", &sw.skipped, 5, "fynapse", "terminal")),
            (UntriedOutcome::Oversize, RecordState::Final(FinalState::Dead), p, Verdict::Terminal,
                legacy_closing(&t, "oversize", "why", "dead", fynapse.status_word(FinalState::Dead), 5, "fynapse", "terminal")),
            (UntriedOutcome::LeaseExpired, RecordState::Pending, p, Verdict::Retry,
                legacy_closing(&t, "lease_expired", "why", "", &sw.pending, 5, "fynapse", "retry")),
            (UntriedOutcome::LeaseExpired, RecordState::Final(FinalState::Failed), p, Verdict::Terminal,
                legacy_closing(&t, "lease_expired", "why", "failed", fynapse.status_word(FinalState::Failed), 5, "fynapse", "terminal")),
        ];
        assert_ne!(fynapse.status_word(FinalState::Dead), "dead", "the profile's own words make the check meaningful");
        for (outcome, state, words, verdict, want) in cases {
            let got = Untried { task: &t, outcome, reason: "why".into(), state, words, at_ms: 5 }.record_with(verdict);
            assert_eq!(got.encode_to_vec(), want.encode_to_vec(), "{outcome:?} {state:?}");
        }
    }

    /// A dead letter from typed values: the same bytes as the positional words gave.
    #[test]
    fn dead_letters_encode_as_before() {
        let t = task();
        let fynapse = hookline_core::policy::builtin("fynapse").unwrap();
        let got = Dead { task: &t, reason: DeadLetterReason::Oversize, detail: "too big".into(), state: FinalState::Dead, words: Words::Policy(&fynapse), attempts: 3, last_outcome: "oversize".into(), at_ms: 9 }.letter();
        let want = DeadLetter {
            reason: "oversize".into(),
            detail: "too big".into(),
            final_state: "dead".into(),
            status_word: fynapse.status_word(FinalState::Dead).to_owned(),
            subscription_id: "sub_1".into(),
            delivery_id: "dlv_1".into(),
            event: t.event.clone(),
            attempts: 3,
            last_outcome: "oversize".into(),
            at_ms: 9,
            first_attempt_at_ms: 1_000,
            ..Default::default()
        };
        assert_eq!(got.encode_to_vec(), want.encode_to_vec());
        let own = Dead { task: &t, reason: DeadLetterReason::InvalidPolicy, detail: String::new(), state: FinalState::Dead, words: Words::Own { policy_name: "x" }, attempts: 2, last_outcome: String::new(), at_ms: 9 }.letter();
        assert_eq!((own.final_state.as_str(), own.status_word.as_str(), own.reason.as_str()), ("dead", "dead", "invalid_policy"));
    }

    /// A try's record takes its state and status word from the decision: pending while another try or attempt
    /// follows, else the final state in hookline's word and the profile's.
    #[test]
    fn a_tries_record_reads_its_state_from_the_decision() {
        let t = task();
        let fynapse = hookline_core::policy::builtin("fynapse").unwrap();
        let cx = TryContext { task: &t, attempt: 3, try_no: 1, started_at_ms: 7, started_at_us: 7_000, policy: &fynapse };
        let mut result = TryResult {
            outcome: hookline_core::Outcome::http(503),
            reason: "HTTP 503".into(),
            response_excerpt: String::new(),
            duration: std::time::Duration::from_millis(12),
            request_headers: Vec::new(),
            response_headers: Vec::new(),
        };
        let progress = hookline_core::Progress { attempt: 1, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
        let decision = hookline_core::decide(&fynapse, &progress, &result.outcome, &mut rand::rng());
        let rec = attempt_record(&cx, &mut result, &decision, 99);
        assert_eq!((rec.verdict.as_str(), rec.final_state.as_str()), (decision.verdict.as_str(), ""));
        assert_eq!(rec.status_word, fynapse.status_words.pending);
        let dead = Decision { next: Next::Final(FinalState::Dead), verdict: Verdict::Terminal, ..decision };
        let rec = attempt_record(&cx, &mut result, &dead, 0);
        assert_eq!((rec.verdict.as_str(), rec.final_state.as_str(), rec.status_word.as_str()), ("terminal", "dead", fynapse.status_word(FinalState::Dead)));
    }
}
