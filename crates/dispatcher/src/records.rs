//! Building the records a delivery's outcome produces.

use hookline_core::model::{AttemptPhase, AttemptRecord, DeadLetter, DeliveryTask, Event};
use hookline_core::{Decision, Next, Verdict};

use crate::sender::TryResult;

pub fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Success => "success",
        Verdict::Retry => "retry",
        Verdict::Terminal => "terminal",
    }
}

pub fn final_word(s: hookline_core::FinalState) -> &'static str {
    match s {
        hookline_core::FinalState::Succeeded => "succeeded",
        hookline_core::FinalState::Failed => "failed",
        hookline_core::FinalState::Dead => "dead",
        hookline_core::FinalState::Cancelled => "cancelled",
    }
}

pub struct TryContext<'a> {
    pub task: &'a DeliveryTask,
    pub attempt: u32,
    pub try_no: u32,
    pub started_at_ms: i64,
    pub policy: &'a hookline_core::Policy,
}

/// The record of a try. The headers are moved out of `result` (the rest of it is still read afterwards).
pub fn attempt_record(
    cx: &TryContext<'_>,
    result: &mut TryResult,
    decision: &Decision,
    next_due_at_ms: i64,
    status_word: &str,
) -> AttemptRecord {
    let event = cx.task.event.as_ref();
    let rule = cx.policy.classify.get(decision.rule);
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
        verdict: verdict_word(decision.verdict).to_owned(),
        counts_toward_disable: decision.counts_toward_disable,
        next_due_at_ms,
        final_state: match decision.next {
            Next::Final(s) => final_word(s).to_owned(),
            _ => String::new(),
        },
        status_word: status_word.to_owned(),
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
    }
}

/// A record that ends a delivery without an HTTP try (inactive subscription, invalid policy, oversize body).
pub fn closing_record(task: &DeliveryTask, outcome: &str, reason: String, final_state: &str, status_word: &str, now_ms: i64, policy: &str) -> AttemptRecord {
    let event = task.event.as_ref();
    AttemptRecord {
        delivery_id: task.delivery_id.clone(),
        subscription_id: task.subscription_id.clone(),
        event_id: event.map(|e| e.id.clone()).unwrap_or_default(),
        event_type: event.map(|e| e.r#type.clone()).unwrap_or_default(),
        attempt: task.attempts_made,
        r#try: 0,
        started_at_ms: now_ms,
        outcome: outcome.to_owned(),
        reason,
        verdict: "terminal".into(),
        final_state: final_state.to_owned(),
        status_word: status_word.to_owned(),
        phase: AttemptPhase::Finished as i32,
        policy: policy.to_owned(),
        ..Default::default()
    }
}

#[allow(clippy::too_many_arguments)]
pub fn dead_letter(
    task: &DeliveryTask,
    reason: &str,
    detail: String,
    final_state: &str,
    status_word: &str,
    attempts: u32,
    last_outcome: String,
    now_ms: i64,
) -> DeadLetter {
    DeadLetter {
        reason: reason.to_owned(),
        detail,
        final_state: final_state.to_owned(),
        status_word: status_word.to_owned(),
        subscription_id: task.subscription_id.clone(),
        delivery_id: task.delivery_id.clone(),
        event: task.event.clone(),
        attempts,
        last_outcome,
        at_ms: now_ms,
        first_attempt_at_ms: task.first_attempt_at_ms,
        ..Default::default()
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
