//! Building the records a delivery's outcome produces, from typed values: states, verdicts and outcomes are
//! enums here and become the records' words in one place.

use hookline_core::model::{AttemptPhase, AttemptRecord, DeadLetter, DeliveryTask, Event};
use hookline_core::vocabulary::DeadLetterReason;
use hookline_core::{Decision, FinalState, Next, Policy, UntriedOutcome, Verdict};

use crate::sender::TryResult;

mod wire;

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

/// The record of a try, borrowing what it is made of (the task, the policy, the try's result); its state and
/// status word follow from the decision. Encoded ([`TryRecord::encode`]) to the bytes prost gives the
/// [`AttemptRecord`] with the same values ([`TryRecord::to_record`]), without copying each field into an owned
/// `String` first and freeing them all after: building, encoding and dropping the owned record were ~6 % of the
/// dispatcher's CPU in `bench throughput`'s profile (docs/benchmarks.md, "Dispatcher CPU per delivery").
pub struct TryRecord<'a> {
    task: &'a DeliveryTask,
    attempt: u32,
    try_no: u32,
    started_at_ms: i64,
    started_at_us: i64,
    policy: &'a Policy,
    result: &'a TryResult,
    decision: &'a Decision,
    next_due_at_ms: i64,
    /// Set by `deliver` when tracing is on.
    pub traceparent: &'a str,
}

/// How an attempt's closing record is written (see `deliver::conclude`): its bytes, with the attempt it concludes
/// and its run set.
pub trait Concluding {
    fn next_due_at_ms(&self) -> i64;
    fn concluding(self, attempt: u32, run_id: &str) -> Vec<u8>;
}

impl Concluding for AttemptRecord {
    fn next_due_at_ms(&self) -> i64 {
        self.next_due_at_ms
    }

    fn concluding(mut self, attempt: u32, run_id: &str) -> Vec<u8> {
        use prost::Message as _;
        self.concludes_attempt = attempt;
        run_id.clone_into(&mut self.run_id);
        self.encode_to_vec()
    }
}

impl Concluding for TryRecord<'_> {
    fn next_due_at_ms(&self) -> i64 {
        self.next_due_at_ms
    }

    fn concluding(self, attempt: u32, run_id: &str) -> Vec<u8> {
        self.encode_with(attempt, run_id)
    }
}

/// A try's outcome token (`Outcome::token`) without a `String`: a status's digits are written to a small buffer.
enum Token {
    Status([u8; 5], usize),
    Word(&'static str),
}

impl Token {
    fn of(o: &hookline_core::Outcome) -> Self {
        use hookline_core::Outcome::*;
        match o {
            Http { status, .. } => {
                let mut digits = [0u8; 5];
                let mut n = *status;
                let mut i = digits.len();
                loop {
                    i -= 1;
                    digits[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                Token::Status(digits, i)
            }
            Timeout => Token::Word("timeout"),
            ConnectError => Token::Word("connect_error"),
            TlsError => Token::Word("tls_error"),
            EgressRefused => Token::Word("egress_refused"),
            InvalidUrl => Token::Word("invalid_url"),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Token::Status(d, i) => &d[*i..],
            Token::Word(w) => w.as_bytes(),
        }
    }
}

impl<'a> TryRecord<'a> {
    pub fn new(cx: &TryContext<'a>, result: &'a TryResult, decision: &'a Decision, next_due_at_ms: i64) -> Self {
        TryRecord {
            task: cx.task,
            attempt: cx.attempt,
            try_no: cx.try_no,
            started_at_ms: cx.started_at_ms,
            started_at_us: cx.started_at_us,
            policy: cx.policy,
            result,
            decision,
            next_due_at_ms,
            traceparent: "",
        }
    }

    fn state(&self) -> RecordState {
        match self.decision.next {
            Next::Final(s) => RecordState::Final(s),
            Next::MicroRetry(_) | Next::NextAttempt(_) => RecordState::Pending,
        }
    }

    fn rule(&self) -> Option<&'a hookline_core::policy::Rule> {
        self.policy.classify.get(self.decision.rule)
    }

    /// 1-based; 0 when no rule matched (an unvalidated policy's fallback).
    fn rule_no(&self) -> u32 {
        self.rule().map_or(0, |_| u32::try_from(self.decision.rule).map_or(0, |i| i.saturating_add(1)))
    }

    fn duration_ms(&self) -> i64 {
        self.result.duration.as_millis() as i64
    }

    /// The owned record with the same values (for a try's span when tracing is on, and the tests).
    pub fn to_record(&self) -> AttemptRecord {
        let event = self.task.event.as_ref();
        let state = self.state();
        AttemptRecord {
            delivery_id: self.task.delivery_id.clone(),
            subscription_id: self.task.subscription_id.clone(),
            event_id: event.map(|e| e.id.clone()).unwrap_or_default(),
            event_type: event.map(|e| e.r#type.clone()).unwrap_or_default(),
            attempt: self.attempt,
            r#try: self.try_no,
            started_at_ms: self.started_at_ms,
            duration_ms: self.duration_ms(),
            outcome: self.result.outcome.token(),
            http_status: self.result.outcome.status().map(u32::from).unwrap_or(0),
            reason: self.result.reason.clone(),
            response_excerpt: self.result.response_excerpt.clone(),
            verdict: self.decision.verdict.as_str().to_owned(),
            counts_toward_disable: self.decision.counts_toward_disable,
            next_due_at_ms: self.next_due_at_ms,
            final_state: state.final_word().to_owned(),
            status_word: Words::Policy(self.policy).status(state).to_owned(),
            phase: AttemptPhase::Finished as i32,
            policy: self.policy.name.clone(),
            request_headers: self.result.request_headers.clone(),
            response_headers: self.result.response_headers.clone(),
            decided_by: self.decision.decided_by.to_wire(),
            rule: self.rule_no(),
            rule_when: self.rule().map(|r| r.when.join(" ")).unwrap_or_default(),
            // Set on the record that ends the attempt (`Concluding`).
            concludes_attempt: 0,
            run_id: String::new(),
            traceparent: self.traceparent.to_owned(),
            received_at_us: self.task.received_at_us,
            started_at_us: self.started_at_us,
            tenant: event.map(|e| e.tenant.clone()).unwrap_or_default(),
        }
    }

    /// The record's bytes (not concluding an attempt: a micro-retry's try).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(0, "")
    }

    /// The record's bytes with `concludes_attempt` and `run_id` set; field by field as `AttemptRecord`'s
    /// declaration orders them (proto/hookline/v1/hookline.proto).
    fn encode_with(&self, concludes_attempt: u32, run_id: &str) -> Vec<u8> {
        let (task, result, decision) = (self.task, self.result, self.decision);
        let event = task.event.as_ref();
        let state = self.state();
        let mut w = wire::Writer::with_capacity(512);
        w.str(1, &task.delivery_id);
        w.str(2, &task.subscription_id);
        w.str(3, event.map_or("", |e| e.id.as_str()));
        w.str(4, event.map_or("", |e| e.r#type.as_str()));
        w.uint(5, u64::from(self.attempt));
        w.uint(6, u64::from(self.try_no));
        w.int(7, self.started_at_ms);
        w.int(8, self.duration_ms());
        w.bytes(9, Token::of(&result.outcome).as_bytes());
        w.uint(10, result.outcome.status().map_or(0, u64::from));
        w.str(11, &result.reason);
        w.str(12, &result.response_excerpt);
        w.str(13, decision.verdict.as_str());
        w.uint(14, u64::from(decision.counts_toward_disable));
        w.int(15, self.next_due_at_ms);
        w.str(16, state.final_word());
        w.str(17, Words::Policy(self.policy).status(state));
        w.int(18, i64::from(AttemptPhase::Finished as i32));
        w.str(19, &self.policy.name);
        w.uint(20, u64::from(concludes_attempt));
        w.str(21, run_id);
        w.str(22, self.traceparent);
        w.headers(23, &result.request_headers);
        w.headers(24, &result.response_headers);
        w.int(25, i64::from(decision.decided_by.to_wire()));
        w.uint(26, u64::from(self.rule_no()));
        w.joined(27, self.rule().map_or(&[][..], |r| &r.when[..]));
        w.int(28, task.received_at_us);
        w.int(29, self.started_at_us);
        w.str(30, event.map_or("", |e| e.tenant.as_str()));
        w.0
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
            tenant: event.map(|e| e.tenant.clone()).unwrap_or_default(),
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
        // A new event of hookline's, not the producer's CloudEvent.
        ..Default::default()
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
    use hookline_core::model::Header;
    use prost::Message;

    /// The record a closing used to be built as, field by field from positional words (the shape before the
    /// typed builder): what the log, the API and the tests read. Its eight positional arguments are the point.
    #[allow(clippy::too_many_arguments)]
    fn legacy_closing(
        task: &DeliveryTask,
        outcome: &str,
        reason: &str,
        final_state: &str,
        status_word: &str,
        now_ms: i64,
        policy: &str,
        verdict: &str,
    ) -> AttemptRecord {
        let event = task.event.as_ref();
        AttemptRecord {
            delivery_id: task.delivery_id.clone(),
            subscription_id: task.subscription_id.clone(),
            event_id: event.map(|e| e.id.clone()).unwrap_or_default(),
            event_type: event.map(|e| e.r#type.clone()).unwrap_or_default(),
            tenant: event.map(|e| e.tenant.clone()).unwrap_or_default(),
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
            event: Some(Event { id: "evt_1".into(), r#type: "order.paid".into(), tenant: "acme".into(), ..Default::default() }),
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
            (
                UntriedOutcome::SubscriptionDeleted,
                RecordState::Final(FinalState::Cancelled),
                Words::Own { policy_name: "" },
                Verdict::Terminal,
                legacy_closing(&t, "subscription_deleted", "why", "cancelled", "cancelled", 5, "", "terminal"),
            ),
            (
                UntriedOutcome::InvalidPolicy,
                RecordState::Final(FinalState::Dead),
                own,
                Verdict::Terminal,
                legacy_closing(&t, "invalid_policy", "why", "dead", "dead", 5, "custom", "terminal"),
            ),
            (
                UntriedOutcome::Inactive,
                RecordState::Final(FinalState::Cancelled),
                p,
                Verdict::Terminal,
                legacy_closing(&t, "inactive", "why", "cancelled", fynapse.status_word(FinalState::Cancelled), 5, "fynapse", "terminal"),
            ),
            (
                UntriedOutcome::Inactive,
                RecordState::Skipped,
                p,
                Verdict::Terminal,
                legacy_closing(&t, "inactive", "why", "skipped", &sw.skipped, 5, "fynapse", "terminal"),
            ),
            (
                UntriedOutcome::Oversize,
                RecordState::Final(FinalState::Dead),
                p,
                Verdict::Terminal,
                legacy_closing(&t, "oversize", "why", "dead", fynapse.status_word(FinalState::Dead), 5, "fynapse", "terminal"),
            ),
            (
                UntriedOutcome::LeaseExpired,
                RecordState::Pending,
                p,
                Verdict::Retry,
                legacy_closing(&t, "lease_expired", "why", "", &sw.pending, 5, "fynapse", "retry"),
            ),
            (
                UntriedOutcome::LeaseExpired,
                RecordState::Final(FinalState::Failed),
                p,
                Verdict::Terminal,
                legacy_closing(&t, "lease_expired", "why", "failed", fynapse.status_word(FinalState::Failed), 5, "fynapse", "terminal"),
            ),
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
        let got = Dead {
            task: &t,
            reason: DeadLetterReason::Oversize,
            detail: "too big".into(),
            state: FinalState::Dead,
            words: Words::Policy(&fynapse),
            attempts: 3,
            last_outcome: "oversize".into(),
            at_ms: 9,
        }
        .letter();
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
        let own = Dead {
            task: &t,
            reason: DeadLetterReason::InvalidPolicy,
            detail: String::new(),
            state: FinalState::Dead,
            words: Words::Own { policy_name: "x" },
            attempts: 2,
            last_outcome: String::new(),
            at_ms: 9,
        }
        .letter();
        assert_eq!((own.final_state.as_str(), own.status_word.as_str(), own.reason.as_str()), ("dead", "dead", "invalid_policy"));
    }

    /// A try's record takes its state and status word from the decision: pending while another try or attempt
    /// follows, else the final state in hookline's word and the profile's.
    #[test]
    fn a_tries_record_reads_its_state_from_the_decision() {
        let t = task();
        let fynapse = hookline_core::policy::builtin("fynapse").unwrap();
        let cx = TryContext { task: &t, attempt: 3, try_no: 1, started_at_ms: 7, started_at_us: 7_000, policy: &fynapse };
        let result = try_result(hookline_core::Outcome::http(503), Vec::new(), Vec::new());
        let progress = hookline_core::Progress { attempt: 1, try_no: 1, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 0 };
        let decision = hookline_core::decide(&fynapse, &progress, &result.outcome, &mut rand::rng());
        let rec = TryRecord::new(&cx, &result, &decision, 99).to_record();
        assert_eq!((rec.verdict.as_str(), rec.final_state.as_str()), (decision.verdict.as_str(), ""));
        assert_eq!(rec.status_word, fynapse.status_words.pending);
        let dead = Decision { next: Next::Final(FinalState::Dead), verdict: Verdict::Terminal, ..decision };
        let rec = TryRecord::new(&cx, &result, &dead, 0).to_record();
        assert_eq!(
            (rec.verdict.as_str(), rec.final_state.as_str(), rec.status_word.as_str()),
            ("terminal", "dead", fynapse.status_word(FinalState::Dead))
        );
    }

    fn try_result(outcome: hookline_core::Outcome, request_headers: Vec<Header>, response_headers: Vec<Header>) -> TryResult {
        TryResult {
            reason: format!("because of {outcome}"),
            outcome,
            response_excerpt: "{\"ok\":false}".into(),
            duration: std::time::Duration::from_millis(12),
            request_headers,
            response_headers,
        }
    }

    fn header(name: &str, value: &[u8]) -> Header {
        Header { name: name.into(), value: bytes::Bytes::copy_from_slice(value) }
    }

    /// The record of a try as it was built before `TryRecord` (field by field into the owned struct).
    fn legacy_try_record(cx: &TryContext<'_>, result: &TryResult, decision: &Decision, next_due_at_ms: i64) -> AttemptRecord {
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
            request_headers: result.request_headers.clone(),
            response_headers: result.response_headers.clone(),
            decided_by: decision.decided_by.to_wire(),
            rule: rule.map_or(0, |_| u32::try_from(decision.rule).map_or(0, |i| i.saturating_add(1))),
            rule_when: rule.map(|r| r.when.join(" ")).unwrap_or_default(),
            received_at_us: cx.task.received_at_us,
            started_at_us: cx.started_at_us,
            tenant: event.map(|e| e.tenant.clone()).unwrap_or_default(),
            ..Default::default()
        }
    }

    /// A try's record, encoded from borrowed values, is byte for byte what prost encodes for the record the
    /// dispatcher built before: every outcome kind (a status's digits, the words), decisions of every kind, with
    /// and without headers (an empty name or value, non-UTF-8 bytes), a rule of several matchers, no event,
    /// negative and large numbers, fields past tag 15 (two-byte keys), and with the attempt it concludes set.
    #[test]
    fn a_tries_record_encodes_as_prost_encodes_the_owned_record() {
        use hookline_core::Outcome;
        let mut t = task();
        t.received_at_us = 1_764_000_000_123_456;
        let no_event = DeliveryTask { event: None, received_at_us: -5, ..task() };
        let policies = ["standard", "fynapse", "lucibook", "relay", "gauge"].map(|p| hookline_core::policy::builtin(p).unwrap());
        let outcomes = [
            Outcome::http(0),
            Outcome::http(7),
            Outcome::http(204),
            Outcome::http(429),
            Outcome::http(503),
            Outcome::http(65_535),
            Outcome::Timeout,
            Outcome::ConnectError,
            Outcome::TlsError,
            Outcome::EgressRefused,
            Outcome::InvalidUrl,
        ];
        let headers = vec![
            header("Content-Type", b"application/json"),
            header("", b""),
            header("x-bin", &[0xff, 0x00, 0x80]),
            header("X-Empty", b""),
        ];
        let long = vec![header("x-long", &[b'a'; 300])];
        let (mut checked, mut joined) = (0, 0);
        for policy in &policies {
            for (k, outcome) in outcomes.iter().enumerate() {
                for (task, started_at_ms) in [(&t, 1_764_000_000_123), (&no_event, -1)] {
                    let cx = TryContext {
                        task,
                        attempt: 1 + k as u32,
                        try_no: (k % 3) as u32,
                        started_at_ms,
                        started_at_us: started_at_ms.saturating_mul(1000),
                        policy,
                    };
                    let (req, resp) = match k % 3 {
                        0 => (Vec::new(), Vec::new()),
                        1 => (headers.clone(), long.clone()),
                        _ => (long.clone(), headers.clone()),
                    };
                    let result = try_result(outcome.clone(), req, resp);
                    for attempt in [1, 2, 9] {
                        let progress = hookline_core::Progress { attempt, try_no: 1, first_attempt_at_ms: 1, now_ms: 2, wall_clock_ms: 2 };
                        let decision = hookline_core::decide(policy, &progress, outcome, &mut rand::rng());
                        for due in [0, 1_764_000_060_000, i64::MAX] {
                            let mut rec = TryRecord::new(&cx, &result, &decision, due);
                            rec.traceparent = if due == 0 { "" } else { "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" };
                            let mut want = legacy_try_record(&cx, &result, &decision, due);
                            want.traceparent = rec.traceparent.to_owned();
                            assert_eq!(rec.to_record(), want, "{} {outcome:?} {decision:?}", policy.name);
                            assert_eq!(rec.encode(), want.encode_to_vec(), "{} {outcome:?} {decision:?}", policy.name);
                            let concluding = rec.concluding(9, "run_7");
                            want.concludes_attempt = 9;
                            want.run_id = "run_7".into();
                            assert_eq!(concluding, want.clone().concluding(9, "run_7"));
                            assert_eq!(concluding, want.encode_to_vec());
                            checked += 1;
                            joined += usize::from(want.rule_when.contains(' '));
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 5 * 11 * 2 * 3 * 3);
        assert!(joined > 0, "some try matched a rule of several matchers, so `rule_when` was written joined");
    }
}
