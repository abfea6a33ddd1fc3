//! One delivery task, top to bottom: subscription lookup → inactive handling → lane → request → tries →
//! engine decision → produced records (attempt, retry | dead letter, endpoint state, ops, follow-ups).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use hookline_core::breaker::{Admission, BreakerChange};
use hookline_core::health::{self, HealthEvent, Transition};
use hookline_core::model::{DeliveryTask, EndpointCondition, EndpointState, Event, OpsEvent, RetryEnvelope, TaskOrigin};
use hookline_core::policy::{ConcurrencyRule, DisableAction, InFlightRule, InactiveAction, Policy};
use hookline_core::request;
use hookline_core::subscription::Activity;
use hookline_core::vocabulary::DeadLetterReason;
use hookline_core::{decide, due_at_ms, FinalState, Next, Progress, UntriedOutcome, Verdict};
use hookline_kafka::state::SubscriptionEntry;
use hookline_kafka::topics::tier_for;
use hookline_service::traces::Span;
use prost::Message;

use crate::breakers::Pause;
use crate::lanes::Stuck;
use crate::meters::Ended;
use crate::outcomes::{Claim, RunGuard};
use crate::records::{self, Concluding, RecordState, TryContext, TryRecord, Untried, Words};
use crate::{now_ms, Ctx};

/// The delivery was not finished because the process is shutting down: its offset must not be committed.
#[derive(Debug)]
pub struct Aborted;

/// The zombie fence (see `hookline_kafka::worker`): the consume loop has been silent for nearly
/// `kafka.max_poll_interval_ms`, so the group may be about to drop this member and give the partition to another.
/// Nothing is sent until the loop polls again; if the partition goes meanwhile the task is left uncommitted, and
/// its next owner sends it. Called only when `ctx.liveness.is_live()` is false (the hot path is one atomic load).
pub(crate) async fn fence(ctx: &Ctx, partition: i32) -> Result<(), Aborted> {
    metrics::counter!("hookline_dispatcher_fenced_total").increment(1);
    tracing::warn!(
        partition,
        silent_ms = ctx.liveness.silent_for().as_millis() as u64,
        "the consume loop is silent near max.poll.interval.ms; no send starts until it polls again"
    );
    // The ownership it started under: another one (revoked, maybe assigned again) is not this task's.
    let epoch = ctx.states.epoch(partition);
    loop {
        let owned = ctx.states.ready(partition).now_or_never() != Some(false);
        if !owned || (epoch != 0 && ctx.states.epoch(partition) != epoch) || ctx.shutdown.is_cancelled() {
            return Err(Aborted);
        }
        if ctx.liveness.is_live() {
            return Ok(());
        }
        ctx.liveness.changed().await;
    }
}

/// A lane slot a delivery holds while it talks to the endpoint. [`Slot::release`] gives it back as soon as the
/// attempt's last try has its answer: the lane caps concurrent requests to one endpoint
/// (`dispatcher.per_subscription_concurrency`), and the records that follow (attempt, retry or dead letter,
/// endpoint state) wait for the broker's acknowledgements, which took the slot for as long as the broker's tail
/// (tens to hundreds of ms on a loaded host) while the lane's next deliveries queued behind it. The delivery
/// itself, and so its offset, still completes only once those records are acknowledged.
#[derive(Default)]
pub struct Slot(Option<Arc<AtomicBool>>);

/// What [`hold_slot`] looks at: whether the delivery gave its [`Slot`] back.
pub struct Released(Arc<AtomicBool>);

impl Slot {
    /// A slot and what [`hold_slot`] watches for its release.
    pub fn new() -> (Self, Released) {
        let flag = Arc::new(AtomicBool::new(false));
        (Self(Some(flag.clone())), Released(flag))
    }

    /// No lane to give back to (ordered subscriptions keep theirs until the end: see `ordering.rs`).
    pub fn none() -> Self {
        Self::default()
    }

    /// Only the delivery that owns the slot calls this, inside its own poll (the slot is moved into its future and
    /// is not `Clone`), so [`hold_slot`] sees it when that poll returns: no wake-up is needed.
    fn release(&self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}

/// Drives `delivery` on the caller's task (the lane's runner) until it releases its [`Slot`] (`released`) or ends;
/// what is left of it then runs on a task of its own and the caller returns, so the lane can start its next job. A
/// future moved to a new task registers that task's waker at its next poll, which a new task always gets.
pub(crate) async fn hold_slot(mut delivery: BoxFuture<'static, ()>, released: Released) {
    let rest = std::future::poll_fn(|cx| match delivery.as_mut().poll(cx) {
        Poll::Ready(()) => Poll::Ready(false),
        // Released during the poll that just returned (see `Slot::release`).
        Poll::Pending if released.0.load(Ordering::Acquire) => Poll::Ready(true),
        Poll::Pending => Poll::Pending,
    })
    .await;
    if rest {
        tokio::spawn(delivery);
    }
}

/// Runs inside the subscription's lane (see `lanes.rs`), so it is the only place that waits for an endpoint. Returns
/// once every record of the delivery is acknowledged.
pub async fn deliver(ctx: Arc<Ctx>, task: Box<DeliveryTask>, partition: i32) -> Result<(), Aborted> {
    match deliver_in_lane(ctx.clone(), task, partition, &Slot::none()).await? {
        Some(last) => ctx.write_last(last).await,
        None => Ok(()),
    }
}

/// [`deliver`], giving the lane's slot back (`slot`) once the endpoint has answered the attempt's last try. The
/// record that concludes the attempt comes back unwritten when every record before it is acknowledged
/// ([`LastWrite`]): the caller writes it, and its acknowledgement completes the delivery.
pub async fn deliver_in_lane(ctx: Arc<Ctx>, task: Box<DeliveryTask>, partition: i32, slot: &Slot) -> Result<Option<LastWrite>, Aborted> {
    tracing::debug!(delivery = %task.delivery_id, partition, "task received");
    let ready = tokio::select! {
        // A synced partition's task runs even during the drain, as before: only a wait for a sync gives up.
        biased;
        r = ctx.states.ready(partition) => r,
        // Shutting down before the partition was synced: the drain must not wait for a sync that may never finish.
        _ = ctx.shutdown.cancelled() => false,
    };
    if !ready {
        // The partition was revoked (or the process stops) before its state was synced: the next owner delivers it.
        return Err(Aborted);
    }
    // A redo (after a rebalance, or a task produced twice) of an attempt whose outcome is already written: done.
    let run = match ctx.outcomes.claim(ctx.outcomes.key(&task.delivery_id, &task.run_id, next_attempt(&task))).await {
        Claim::Concluded => return Box::pin(already_concluded(&ctx, &task, partition)).await.map(|()| None),
        Claim::Run(guard) => guard,
    };
    let now = now_ms();
    if task.origin == TaskOrigin::Retry as i32 && task.due_at_ms > 0 {
        metrics::histogram!("hookline_retry_lateness_ms").record((now - task.due_at_ms) as f64);
    }
    // The branches below are boxed: this future lives as long as the delivery, so it should not carry the records
    // of branches it did not take.
    let Some(entry) = ctx.subs.get(&task.subscription_id) else {
        // Deleted subscription: nothing to deliver to. Recorded so the delivery has a final state.
        return Box::pin(async {
            let rec = Untried {
                task: &task,
                outcome: UntriedOutcome::SubscriptionDeleted,
                reason: "the subscription was deleted".into(),
                state: RecordState::Final(FinalState::Cancelled),
                words: Words::Own { policy_name: "" },
                at_ms: now,
            }
            .record();
            conclude(&ctx, &task, rec).await?;
            ctx.meters.delivery(Ended::Final(FinalState::Cancelled)).increment(1);
            Ok(None)
        })
        .await;
    };
    let policy = match &entry.policy {
        Ok(p) => p.clone(),
        Err(e) => {
            return Box::pin(async {
                let detail = format!("the subscription's policy is invalid: {e}");
                let words = Words::Own { policy_name: &entry.sub.policy };
                let (state, outcome) = (FinalState::Dead, UntriedOutcome::InvalidPolicy);
                let rec =
                    Untried { task: &task, outcome, reason: detail.clone(), state: RecordState::Final(state), words, at_ms: now }.record();
                let dl = records::Dead {
                    task: &task,
                    reason: DeadLetterReason::InvalidPolicy,
                    detail,
                    state,
                    words,
                    attempts: task.attempts_made,
                    last_outcome: String::new(),
                    at_ms: now,
                }
                .letter();
                ctx.produce_dead_letter(&task.subscription_id, &dl).await?;
                ctx.tracer.dead_letter(&dl, None);
                conclude(&ctx, &task, rec).await?;
                metrics::counter!("hookline_dead_lettered_total", "reason" => DeadLetterReason::InvalidPolicy.as_str()).increment(1);
                ctx.meters.delivery(Ended::Final(FinalState::Dead)).increment(1);
                Ok(None)
            })
            .await;
        }
    };

    let state = ctx.states.get(&task.subscription_id);
    let act = entry.sub.activity(state.as_ref());
    if !act.is_active() {
        return Box::pin(inactive(&ctx, &task, &entry, &policy, &act, now)).await.map(|()| None);
    }
    // Early (a replay scheduled for later, or clocks apart): wait on the tier ladder, never deliver early.
    if task.due_at_ms > now.saturating_add(5) {
        let wait = u64::try_from(task.due_at_ms.saturating_sub(now)).unwrap_or(0);
        return Box::pin(schedule(&ctx, *task, wait, now)).await.map(|()| None);
    }

    // Before a lease is written: a shutdown while waiting for the turn leaves no attempt behind.
    Box::pin(rate_turn(&ctx, &task.subscription_id, &entry)).await?;
    if policy.in_flight == InFlightRule::Count {
        return Box::pin(leased_attempt(&ctx, task, &entry, &policy, partition, slot, run)).await.map(|()| None);
    }
    let Some(task) = Box::pin(admitted(&ctx, task, &policy, partition)).await? else { return Ok(None) };
    let last = Box::pin(attempt(&ctx, task, &entry, &policy, partition, slot)).await?;
    Ok(last.map(|record| LastWrite { record, run }))
}

/// The record that concludes an attempt, encoded and not yet written: everything the attempt produced before it is
/// acknowledged. Its key is the subscription id.
pub(crate) struct Unwritten {
    pub key: String,
    pub payload: Vec<u8>,
}

/// An attempt's last record and the claim on the attempt (see `outcomes.rs`): once the record is acknowledged, the
/// attempt is concluded (a copy of the task is not sent again) and the delivery's input offset may be committed.
/// Written by [`Ctx::settle`](crate::Ctx::settle) (its acknowledgement handled where it arrives) or by
/// [`Ctx::write_last`](crate::Ctx::write_last) (awaited).
pub(crate) struct LastWrite {
    pub record: Unwritten,
    pub run: RunGuard,
}

/// An attempt under a lease (`in_flight = "count"`): an attempt an earlier owner left in flight counts; otherwise
/// the lease is written (acknowledged) before the attempt and removed after its outcome is written.
async fn leased_attempt(
    ctx: &Ctx,
    task: Box<DeliveryTask>,
    entry: &Arc<SubscriptionEntry>,
    policy: &Policy,
    partition: i32,
    slot: &Slot,
    run: RunGuard,
) -> Result<(), Aborted> {
    let attempt_no = task.attempts_made + 1;
    let absolute = task.prior_attempts + attempt_no;
    let topic = ctx.topics.inflight();
    let key = task.delivery_id.clone();
    if let Some(lease) = ctx.leases.take(&key, absolute) {
        lost_attempt(ctx, *task, entry, policy, lease, partition).await?;
    } else {
        // Before the lease: a delivery that waits or is parked has no attempt in flight.
        let Some(task) = Box::pin(admitted(ctx, task, policy, partition)).await? else { return Ok(()) };
        let lease = hookline_core::model::AttemptRecord {
            delivery_id: task.delivery_id.clone(),
            subscription_id: task.subscription_id.clone(),
            attempt: absolute,
            started_at_ms: now_ms(),
            phase: hookline_core::model::AttemptPhase::Started as i32,
            policy: policy.name.clone(),
            ..Default::default()
        };
        ctx.produce_to_partition(topic, partition, &key, Some(&lease.encode_to_vec())).await?;
        // The lease goes only once the attempt's outcome is acknowledged.
        if let Some(record) = attempt(ctx, task, entry, policy, partition, slot).await? {
            ctx.write_last(LastWrite { record, run }).await?;
        }
    }
    ctx.produce_to_partition(topic, partition, &key, None).await
}

/// The earlier owner died during this attempt: it counts as a failed attempt whose outcome is unknown.
async fn lost_attempt(
    ctx: &Ctx,
    mut task: DeliveryTask,
    entry: &SubscriptionEntry,
    policy: &Policy,
    lease: crate::leases::Lease,
    partition: i32,
) -> Result<(), Aborted> {
    let attempt_no = task.attempts_made + 1;
    let now = now_ms();
    if task.first_attempt_at_ms == 0 {
        task.first_attempt_at_ms = lease.started_at_ms;
    }
    let decision = hookline_core::decide_lost_attempt(policy, attempt_no, lease.started_at_ms, now, &mut rand::rng());
    let reason = format!("attempt {attempt_no} was in flight when its dispatcher stopped (lease expired); counted as failed");
    metrics::counter!("hookline_attempts_total", "outcome" => "lease_expired").increment(1);
    let rec = match decision.next {
        // `decide_lost_attempt` never asks for a micro-retry; were it to, waiting is the safe reading.
        Next::NextAttempt(wait) | Next::MicroRetry(wait) => {
            let due = due_at_ms(now, wait.ms);
            let lost = Untried {
                task: &task,
                outcome: UntriedOutcome::LeaseExpired,
                reason,
                state: RecordState::Pending,
                words: Words::Policy(policy),
                at_ms: lease.started_at_ms,
            };
            let mut rec = lost.record_with(Verdict::Retry);
            rec.attempt = task.prior_attempts + attempt_no;
            rec.counts_toward_disable = true;
            rec.next_due_at_ms = due;
            rec.decided_by = decision.decided_by.to_wire();
            let mut next = task.clone();
            next.attempts_made = attempt_no;
            next.due_at_ms = due;
            next.scheduled_wait_ms = i64::try_from(wait.ms).unwrap_or(i64::MAX);
            next.origin = TaskOrigin::Retry as i32;
            schedule(ctx, next, wait.ms, now).await?;
            metrics::counter!("hookline_deliveries_retried_total").increment(1);
            rec
        }
        Next::Final(state) => {
            let (outcome, words) = (UntriedOutcome::LeaseExpired, Words::Policy(policy));
            let mut rec = Untried {
                task: &task,
                outcome,
                reason: reason.clone(),
                state: RecordState::Final(state),
                words,
                at_ms: lease.started_at_ms,
            }
            .record();
            rec.attempt = task.prior_attempts + attempt_no;
            rec.counts_toward_disable = true;
            rec.decided_by = decision.decided_by.to_wire();
            let mut last = task.clone();
            last.attempts_made = attempt_no;
            let attempts = task.prior_attempts + attempt_no;
            let dl = records::Dead {
                task: &last,
                reason: DeadLetterReason::LeaseExpired,
                detail: reason.clone(),
                state,
                words,
                attempts,
                last_outcome: outcome.as_str().into(),
                at_ms: now,
            }
            .letter();
            ctx.produce_dead_letter(&task.subscription_id, &dl).await?;
            ctx.tracer.dead_letter(&dl, None);
            ctx.meters.delivery(Ended::Final(state)).increment(1);
            metrics::counter!("hookline_dead_lettered_total", "reason" => DeadLetterReason::LeaseExpired.as_str()).increment(1);
            if state == FinalState::Dead {
                follow_ups(ctx, &task, policy, &reason, now).await?;
            }
            rec
        }
    };
    update_health(ctx, partition, entry, policy, HealthEvent::CountedFailure, now).await?;
    conclude(ctx, &task, rec).await
}

async fn inactive(
    ctx: &Ctx,
    task: &DeliveryTask,
    entry: &SubscriptionEntry,
    policy: &Policy,
    act: &Activity,
    now: i64,
) -> Result<(), Aborted> {
    let why = format!("subscription {} ({})", act.word(), act.reason().unwrap_or(""));
    // An endpoint not verified yet has not refused anything: its deliveries wait for it, whatever `inactive` says.
    let action = if matches!(act, Activity::PendingVerification) { InactiveAction::Hold } else { policy.inactive };
    match action {
        InactiveAction::Hold => {
            let mut held = task.clone();
            held.origin = TaskOrigin::Held as i32;
            ctx.produce(ctx.topics.held(), &task.subscription_id, &held).await?;
            crate::ordering::note(hookline_core::ordering::Exit::Held);
            metrics::counter!("hookline_deliveries_held_total").increment(1);
        }
        InactiveAction::Cancel => {
            let state = RecordState::Final(FinalState::Cancelled);
            let rec =
                Untried { task, outcome: UntriedOutcome::Inactive, reason: why, state, words: Words::Policy(policy), at_ms: now }.record();
            conclude(ctx, task, rec).await?;
            ctx.meters.delivery(Ended::Final(FinalState::Cancelled)).increment(1);
        }
        InactiveAction::Skip => {
            let state = RecordState::Skipped;
            let rec =
                Untried { task, outcome: UntriedOutcome::Inactive, reason: why, state, words: Words::Policy(policy), at_ms: now }.record();
            conclude(ctx, task, rec).await?;
            ctx.meters.delivery(Ended::Skipped).increment(1);
        }
    }
    let _ = entry;
    Ok(())
}

/// Waits of a task parked again and again because its lane stays full: 4 s, 15 s, then each minute, so a hanging
/// endpoint's backlog does not churn through the ladder.
const SPILL_WAITS_MS: [u64; 3] = [4_000, 15_000, 60_000];

/// How long a spilled task waits: its step of `SPILL_WAITS_MS`, or longer if its lane needs longer to drain (a
/// hanging endpoint's lane needs minutes: its tasks wait the longest step at once instead of coming back to be
/// parked again after 4 s and 15 s), never more than the longest step.
fn spill_wait_ms(spills: u32, lane_drain: Duration) -> u64 {
    let step = SPILL_WAITS_MS[(spills as usize).min(SPILL_WAITS_MS.len() - 1)];
    let longest = SPILL_WAITS_MS[SPILL_WAITS_MS.len() - 1];
    step.max(u64::try_from(lane_drain.as_millis()).unwrap_or(u64::MAX)).min(longest)
}

/// A lane is too deep (its endpoint is slow or hanging): park the task on the retry ladder for a while instead of
/// holding a slot of `dispatcher.max_in_flight`, so the partition keeps moving for everyone else. Not an attempt.
/// A lane that still finishes work gets its parked tasks back at its pace; one that hangs, after the steps of
/// `SPILL_WAITS_MS` (`stuck.drain` is how long it would need to drain at its pace). Counted by why the lane was
/// judged stuck, so a healthy lane parked (`deep`) shows apart from a hanging or slow one.
pub async fn spill(ctx: Arc<Ctx>, mut task: Box<DeliveryTask>, stuck: Stuck) -> Result<(), Aborted> {
    let now = now_ms();
    let wait_ms = match ctx.lanes.paced_spill_wait(&task.subscription_id) {
        Some(paced) => u64::try_from(paced.as_millis()).unwrap_or(u64::MAX),
        None => spill_wait_ms(task.spills, stuck.drain),
    };
    task.spills = task.spills.saturating_add(1);
    task.due_at_ms = due_at_ms(now, wait_ms);
    metrics::counter!("hookline_deliveries_spilled_total", "cause" => stuck.cause.as_str()).increment(1);
    schedule(&ctx, *task, wait_ms, now).await
}

/// Puts the task on the retry tier for `wait_ms`.
async fn schedule(ctx: &Ctx, mut task: DeliveryTask, wait_ms: u64, now: i64) -> Result<(), Aborted> {
    let tier = tier_for(wait_ms);
    if task.due_at_ms == 0 {
        task.due_at_ms = due_at_ms(now, wait_ms);
    }
    let key = task.subscription_id.clone();
    let env = RetryEnvelope { task: Some(task), enqueued_at_ms: now, tier_delay_ms: i64::try_from(tier.delay_ms).unwrap_or(i64::MAX) };
    metrics::counter!("hookline_retries_scheduled_total", "tier" => tier.name).increment(1);
    ctx.produce(ctx.topics.retry(tier), &key, &env).await?;
    crate::ordering::note(hookline_core::ordering::Exit::Ladder);
    Ok(())
}

/// Waits for the endpoint's next turn under its rate limit, shared by all its deliveries (each try takes one,
/// micro-retries too). Waiting is not an attempt and counts toward nothing. The lane keeps its slot meanwhile, so a
/// limited endpoint drains like a slow one: once its lane is deep, its backlog parks on the ladder (`spill`).
async fn rate_turn(ctx: &Ctx, subscription_id: &str, entry: &SubscriptionEntry) -> Result<(), Aborted> {
    let Some(limit) = entry.rate_limit else { return Ok(()) };
    let wait = ctx.rates.reserve(subscription_id, limit);
    if wait.is_zero() {
        return Ok(());
    }
    metrics::counter!("hookline_rate_limit_waits_total").increment(1);
    tokio::select! {
        _ = tokio::time::sleep(wait) => Ok(()),
        _ = ctx.shutdown.cancelled() => Err(Aborted),
    }
}

/// The longest `Retry-After` pause a delivery waits out inside its lane. Parking each of a paused endpoint's
/// deliveries on the retry ladder costs a record, a read by the retry-scheduler and a record back per delivery, per
/// pause: under a `Retry-After: 1` that answers each delivery's first try, every waiting delivery went round the
/// ladder about once a second, on the CPU the healthy endpoints need. Waiting in the lane costs nothing and keeps
/// the endpoint's order; what the lane cannot hold (`dispatcher.max_queued_per_subscription`) parks as any slow
/// endpoint's backlog does (`spill`, at the lane's pace). A longer pause parks each delivery once, until it ends.
const PAUSE_IN_LANE: Duration = Duration::from_secs(5);

/// Whether the endpoint may be tried now, before an attempt (and its lease): a `Retry-After` pause ending within
/// `PAUSE_IN_LANE` is waited out in the lane; a longer one, or an open breaker, parks the delivery on the retry
/// ladder until it ends (`None`). Neither is an attempt or counts toward anything; a delivery is never sent early.
async fn admitted(ctx: &Ctx, task: Box<DeliveryTask>, policy: &Policy, partition: i32) -> Result<Option<Box<DeliveryTask>>, Aborted> {
    if policy.breaker.is_none() && policy.concurrency.is_none() {
        return Ok(Some(task));
    }
    let id = task.subscription_id.as_str();
    if policy.concurrency.is_some() {
        let pause = tokio::select! {
            p = ctx.breakers.wait_out_pause(id, PAUSE_IN_LANE) => p,
            _ = ctx.shutdown.cancelled() => return Err(Aborted),
        };
        match pause {
            Pause::None => {}
            Pause::WaitedOut => {
                metrics::counter!("hookline_retry_after_waits_total").increment(1);
                // Revoked while it waited: the partition's next owner delivers it (the task is not committed).
                if ctx.states.ready(partition).now_or_never() == Some(false) {
                    return Err(Aborted);
                }
            }
            Pause::Long { until } => {
                let left_ms = i64::try_from(until.saturating_duration_since(tokio::time::Instant::now()).as_millis()).unwrap_or(i64::MAX);
                park_for_breaker(ctx, *task, now_ms().saturating_add(left_ms)).await?;
                return Ok(None);
            }
        }
    }
    // An open breaker: the delivery waits, uncounted, until the endpoint may be tried again.
    if let Admission::Wait { until_ms } = ctx.breakers.admit(id, now_ms()) {
        park_for_breaker(ctx, *task, until_ms).await?;
        return Ok(None);
    }
    Ok(Some(task))
}

/// Parks a delivery whose endpoint's breaker is open (or whose `Retry-After` pause is long) until it may be tried
/// again: not an attempt, nothing counted; never earlier than it was due.
async fn park_for_breaker(ctx: &Ctx, mut task: DeliveryTask, until_ms: i64) -> Result<(), Aborted> {
    let now = now_ms();
    task.due_at_ms = task.due_at_ms.max(until_ms);
    let wait_ms = u64::try_from(task.due_at_ms.saturating_sub(now)).unwrap_or(0);
    metrics::counter!("hookline_breaker_parked_total").increment(1);
    schedule(ctx, task, wait_ms, now).await
}

/// Writes a breaker's opening or closing to the endpoint state, where the API shows it.
async fn breaker_changed(ctx: &Ctx, partition: i32, id: &str, change: BreakerChange) -> Result<(), Aborted> {
    let (until, to) = match change {
        BreakerChange::Opened { until_ms } => (until_ms, "open"),
        BreakerChange::Closed => (0, "closed"),
    };
    metrics::counter!("hookline_breaker_transitions_total", "to" => to).increment(1);
    tracing::info!(subscription = %id, breaker = to, open_until_ms = until, "endpoint circuit breaker");
    let topic = ctx.topics.endpoint_state();
    let (enqueued, payload) = ctx.states.update(id, partition, |st: &mut EndpointState| {
        st.breaker_open_until_ms = until;
        let payload = st.encode_to_vec();
        (ctx.enqueue(topic, id, &payload), payload)
    });
    ctx.await_enqueued(enqueued, topic, id, &payload).await
}

/// Adaptive concurrency: sizes the endpoint's lane from its answers, and pauses the whole endpoint for a
/// `Retry-After` on a 429/503 (this delivery's own next attempt is still its policy's decision).
async fn adapt(ctx: &Ctx, partition: i32, id: &str, rule: &ConcurrencyRule, result: &crate::sender::TryResult) -> Result<(), Aborted> {
    let now = now_ms();
    if rule.pause_on_retry_after {
        if let hookline_core::Outcome::Http { status: 429 | 503, retry_after: Some(ra) } = &result.outcome {
            if let Some(wait_ms) = hookline_core::retry_after::parse(ra, now).filter(|w| *w > 0) {
                // Bounded like any wait a policy may schedule.
                let wait_ms = wait_ms.min((hookline_core::policy::MAX_WAIT_S * 1000.0) as u64);
                ctx.breakers.hold(id, tokio::time::Instant::now() + Duration::from_millis(wait_ms));
                metrics::counter!("hookline_endpoint_paused_by_retry_after_total").increment(1);
            }
        }
    }
    let duration_ms = u64::try_from(result.duration.as_millis()).unwrap_or(u64::MAX);
    let signal = hookline_core::concurrency::signal(rule, &result.outcome, duration_ms);
    let Some(limit) = ctx.limits.record(id, rule, signal, now) else { return Ok(()) };
    ctx.lanes.set_cap(id, limit as usize);
    // Written when it changes (halving at most once a second, growing by one per window of answers), so the API
    // shows each endpoint's current limit.
    let topic = ctx.topics.endpoint_state();
    let (enqueued, payload) = ctx.states.update(id, partition, |st: &mut EndpointState| {
        st.concurrency_limit = limit;
        let payload = st.encode_to_vec();
        (ctx.enqueue(topic, id, &payload), payload)
    });
    ctx.await_enqueued(enqueued, topic, id, &payload).await
}

/// What an attempt does after a try's outcome is recorded.
enum AfterTry {
    /// A micro-retry: try again after this many ms, within the same attempt.
    TryAgain(u64),
    /// The attempt is over; its concluding record is left to write.
    Done(Unwritten),
}

/// An attempt's tries. Its concluding record comes back unwritten (`None` when the attempt ended without a request
/// and wrote its records itself).
async fn attempt(
    ctx: &Ctx,
    mut task: Box<DeliveryTask>,
    entry: &Arc<SubscriptionEntry>,
    policy: &Policy,
    partition: i32,
    slot: &Slot,
) -> Result<Option<Unwritten>, Aborted> {
    let attempt_no = task.attempts_made + 1;
    let event = task.event.as_ref();
    let body = match request::body(policy, event.unwrap_or(&Event::default())) {
        Ok(b) => b,
        // Boxed: this future waits for the endpoint with every other delivery in flight, and should not carry the
        // records of a branch it did not take.
        Err(e) => return Box::pin(oversize(ctx, &task, policy, e)).await.map(|()| None),
    };
    // The body is handed to the request, not kept: the pool frees it once written on a new connection (a reused
    // one keeps it, to send it again should that connection turn out closed), so a delivery waiting for its answer
    // does not hold it. A micro-retry builds it again (byte for byte the same; it was built once).
    let mut body = Some(body);
    let mut try_no = 1;
    loop {
        if try_no > 1 {
            Box::pin(rate_turn(ctx, &task.subscription_id, entry)).await?;
        }
        // To the µs for the latency split (AttemptRecord.started_at_us); the ms is the same instant.
        let started_us = hookline_service::now_us();
        let started = started_us.div_euclid(1000);
        if task.first_attempt_at_ms == 0 {
            task.first_attempt_at_ms = started;
        }
        let body = match body.take() {
            Some(b) => b,
            None => request::body(policy, task.event.as_ref().unwrap_or(&Event::default())).unwrap_or_default(),
        };
        tracing::debug!(delivery = %task.delivery_id, attempt_no, try_no, "sending");
        // `None` unless tracing is on; then its context is the request's `traceparent`.
        let span = ctx.tracer.attempt(&task, task.prior_attempts + attempt_no, try_no);
        // Boxed, like every step after it: the future of a delivery is as large as its largest step, and it lives
        // as long as the delivery waits for the endpoint.
        // Also a try that waited (its turn, a backoff) while the consume loop went silent.
        if !ctx.liveness.is_live() {
            Box::pin(fence(ctx, partition)).await?;
        }
        let result = Box::pin(send_once(ctx, &task, entry, policy, attempt_no, body, started, span.as_ref())).await;
        tracing::debug!(delivery = %task.delivery_id, outcome = %result.outcome, reason = %result.reason, "try finished");
        if let Some(rule) = &policy.concurrency {
            Box::pin(adapt(ctx, partition, &task.subscription_id, rule, &result)).await?;
        }
        if let Some(rule) = &policy.breaker {
            let unreachable = hookline_core::breaker::is_unreachable(&result.outcome);
            if let Some(change) = ctx.breakers.record(&task.subscription_id, rule, unreachable, now_ms()) {
                Box::pin(breaker_changed(ctx, partition, &task.subscription_id, change)).await?;
            }
        }
        match Box::pin(conclude_try(ctx, partition, &task, entry, policy, attempt_no, try_no, started_us, result, span, slot)).await? {
            AfterTry::TryAgain(wait_ms) => {
                // Boxed: a timer is large, and only a micro-retry waits on one.
                Box::pin(micro_retry_wait(ctx, wait_ms)).await?;
                try_no += 1;
            }
            AfterTry::Done(last) => return Ok(Some(last)),
        }
    }
}

/// The wait before a micro-retry's next try; `Aborted` if the process shuts down meanwhile.
async fn micro_retry_wait(ctx: &Ctx, wait_ms: u64) -> Result<(), Aborted> {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => Ok(()),
        _ = ctx.shutdown.cancelled() => Err(Aborted),
    }
}

/// The event's body is over the policy's limit: the delivery is dead without a request.
async fn oversize(ctx: &Ctx, task: &DeliveryTask, policy: &Policy, e: request::BodyError) -> Result<(), Aborted> {
    let now = now_ms();
    let detail = e.to_string();
    let (state, outcome, words) = (FinalState::Dead, UntriedOutcome::Oversize, Words::Policy(policy));
    let rec = Untried { task, outcome, reason: detail.clone(), state: RecordState::Final(state), words, at_ms: now }.record();
    let dl = records::Dead {
        task,
        reason: DeadLetterReason::Oversize,
        detail,
        state,
        words,
        attempts: task.attempts_made,
        last_outcome: outcome.as_str().into(),
        at_ms: now,
    }
    .letter();
    ctx.produce_dead_letter(&task.subscription_id, &dl).await?;
    ctx.tracer.dead_letter(&dl, None);
    conclude(ctx, task, rec).await?;
    metrics::counter!("hookline_dead_lettered_total", "reason" => DeadLetterReason::Oversize.as_str()).increment(1);
    ctx.meters.delivery(Ended::Final(FinalState::Dead)).increment(1);
    Ok(())
}

/// Decides what a try's outcome means and writes it: for a micro-retry, the try's record; otherwise the next
/// attempt on the ladder or the final state (dead letter, follow-ups), then the endpoint's health, then the record
/// that concludes the attempt (see `conclude`).
#[allow(clippy::too_many_arguments)]
async fn conclude_try(
    ctx: &Ctx,
    partition: i32,
    task: &DeliveryTask,
    entry: &SubscriptionEntry,
    policy: &Policy,
    attempt_no: u32,
    try_no: u32,
    started_us: i64,
    result: crate::sender::TryResult,
    span: Option<Span>,
    slot: &Slot,
) -> Result<AfterTry, Aborted> {
    let ended = now_ms();
    let progress =
        Progress { attempt: attempt_no, try_no, first_attempt_at_ms: task.first_attempt_at_ms, now_ms: ended, wall_clock_ms: ended };
    let decision = decide(policy, &progress, &result.outcome, &mut rand::rng());
    // The attempt's tries are over (a micro-retry tries again within the lane): what is left is records.
    if !matches!(decision.next, Next::MicroRetry(_)) {
        slot.release();
    }
    ctx.meters.attempt(&result.outcome).increment(1);
    ctx.meters.attempt_duration_ms().record(result.duration.as_secs_f64() * 1000.0);
    // Records count attempts across replays (as the attempt header does); the engine counts this run's.
    let started_at_ms = started_us.div_euclid(1000);
    let cx = TryContext { task, attempt: task.prior_attempts + attempt_no, try_no, started_at_ms, started_at_us: started_us, policy };
    // The try's record borrows the result: built once the branch has done its work (its due is the branch's).
    let traceparent = span.as_ref().map(|s| s.headers().0).unwrap_or_default();
    let due = match decision.next {
        Next::MicroRetry(wait) => {
            let mut rec = TryRecord::new(&cx, &result, &decision, due_at_ms(ended, wait.ms));
            rec.traceparent = &traceparent;
            traced(&rec, span);
            ctx.produce_encoded(ctx.topics.attempts(), &task.subscription_id, rec.encode()).await?;
            return Ok(AfterTry::TryAgain(wait.ms));
        }
        Next::NextAttempt(wait) => {
            let due = due_at_ms(ended, wait.ms);
            let mut next = task.clone();
            next.attempts_made = attempt_no;
            next.due_at_ms = due;
            next.scheduled_wait_ms = i64::try_from(wait.ms).unwrap_or(i64::MAX);
            next.origin = TaskOrigin::Retry as i32;
            Box::pin(schedule(ctx, next, wait.ms, ended)).await?;
            metrics::counter!("hookline_deliveries_retried_total").increment(1);
            due
        }
        Next::Final(state) => {
            ctx.meters.delivery(Ended::Final(state)).increment(1);
            if state == FinalState::Succeeded {
                if let Some(ev) = &task.event {
                    if ev.accepted_at_ms > 0 {
                        ctx.meters.delivery_latency_ms().record((ended - ev.accepted_at_ms) as f64);
                    }
                }
            } else {
                let why = if decision.verdict == Verdict::Terminal {
                    DeadLetterReason::TerminalOutcome
                } else {
                    DeadLetterReason::RetriesExhausted
                };
                let reason = why.as_str();
                let mut last = task.clone();
                last.attempts_made = attempt_no;
                let (words, attempts) = (Words::Policy(policy), task.prior_attempts + attempt_no);
                let dl = records::Dead {
                    task: &last,
                    reason: why,
                    detail: result.reason.clone(),
                    state,
                    words,
                    attempts,
                    last_outcome: result.outcome.token(),
                    at_ms: ended,
                }
                .letter();
                let dl = records::with_last_try(dl, &result);
                ctx.produce_dead_letter(&task.subscription_id, &dl).await?;
                ctx.tracer.dead_letter(&dl, span.as_ref());
                metrics::counter!("hookline_dead_lettered_total", "reason" => reason).increment(1);
                if state == FinalState::Dead {
                    Box::pin(follow_ups(ctx, task, policy, &result.reason, ended)).await?;
                }
            }
            0
        }
    };
    let mut rec = TryRecord::new(&cx, &result, &decision, due);
    rec.traceparent = &traceparent;
    traced(&rec, span);
    let event = match decision.verdict {
        Verdict::Success => HealthEvent::Success,
        _ if decision.counts_toward_disable => HealthEvent::CountedFailure,
        _ => HealthEvent::UncountedFailure,
    };
    Box::pin(update_health(ctx, partition, entry, policy, event, ended)).await?;
    Ok(AfterTry::Done(concluding(ctx, task, rec).await?))
}

/// Ends the try's span (tracing on) with what its record says (the record names the span: `traceparent`).
fn traced(rec: &TryRecord<'_>, span: Option<Span>) {
    if let Some(span) = span {
        span.finish_attempt(&rec.to_record());
    }
}

/// The attempt a task is for, counted across runs (as the attempt header and records count).
fn next_attempt(task: &DeliveryTask) -> u32 {
    task.prior_attempts + task.attempts_made + 1
}

/// Writes the record that concludes the task's attempt, and remembers it. It is the last record the attempt writes
/// (after its retry or dead letter, follow-ups and endpoint state), so its presence means the attempt is complete.
fn conclude<'a>(ctx: &'a Ctx, task: &'a DeliveryTask, rec: impl Concluding + Send + 'a) -> BoxFuture<'a, Result<(), Aborted>> {
    Box::pin(async move {
        let last = concluding(ctx, task, rec).await?;
        ctx.produce_encoded(ctx.topics.attempts(), &last.key, last.payload).await?;
        ctx.outcomes.concluded(ctx.outcomes.key(&task.delivery_id, &task.run_id, next_attempt(task)), now_ms());
        Ok(())
    })
}

/// The record that concludes the task's attempt, encoded for [`conclude`] or the caller to write.
fn concluding<'a>(ctx: &'a Ctx, task: &'a DeliveryTask, rec: impl Concluding) -> BoxFuture<'a, Result<Unwritten, Aborted>> {
    let last = rec.next_due_at_ms() == 0;
    let payload = rec.concluding(next_attempt(task), &task.run_id);
    Box::pin(async move {
        // No next attempt: an ordered delivery's key is released before this record says it concluded.
        if last {
            crate::ordering::before_final(ctx, task).await?;
        }
        Ok(Unwritten { key: task.subscription_id.clone(), payload })
    })
}

/// A task for an attempt whose outcome is already written: acknowledged without a request. A lease an earlier owner
/// left for it (`in_flight = "count"`) is removed, as that owner would have done next.
async fn already_concluded(ctx: &Ctx, task: &DeliveryTask, partition: i32) -> Result<(), Aborted> {
    tracing::debug!(delivery = %task.delivery_id, attempt = next_attempt(task), "outcome already written; not sent again");
    metrics::counter!("hookline_redeliveries_skipped_total").increment(1);
    crate::ordering::note(hookline_core::ordering::Exit::Redo);
    if ctx.leases.take(&task.delivery_id, next_attempt(task)).is_some() {
        ctx.produce_to_partition(ctx.topics.inflight(), partition, &task.delivery_id, None).await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn send_once(
    ctx: &Ctx,
    task: &DeliveryTask,
    entry: &Arc<SubscriptionEntry>,
    policy: &Policy,
    attempt_no: u32,
    body: Bytes,
    now: i64,
    span: Option<&Span>,
) -> crate::sender::TryResult {
    let event = task.event.as_ref();
    let ids = request::AttemptIds {
        event_id: event.map(|e| e.id.as_str()).unwrap_or(""),
        event_type: event.map(|e| e.r#type.as_str()).unwrap_or(""),
        delivery_id: &task.delivery_id,
        attempt_number: task.prior_attempts + attempt_no,
        now_ms: now,
        event,
    };
    // The subscription's plan (made when it was first sent to or changed): the headers move into the request; the
    // attempt record shares their buffers (secrets left out).
    let plan = ctx.sender.plan(entry, policy);
    ctx.sender.send_planned(&plan, policy, &ids, span.map(Span::headers), body).await
}

async fn follow_ups(ctx: &Ctx, task: &DeliveryTask, policy: &Policy, reason: &str, now: i64) -> Result<(), Aborted> {
    let event_type = task.event.as_ref().map(|e| e.r#type.as_str()).unwrap_or("");
    for f in policy.follow_ups.iter().filter(|f| f.on_event_type == event_type) {
        let ev = records::follow_up_event(task, &f.emit_event_type, reason, now);
        ctx.produce(ctx.topics.events(), &ev.id.clone(), &ev).await?;
        metrics::counter!("hookline_follow_up_events_total").increment(1);
    }
    Ok(())
}

/// Applies the attempt to the endpoint's counters; writes the state when it changed and reports transitions.
async fn update_health(
    ctx: &Ctx,
    partition: i32,
    entry: &SubscriptionEntry,
    policy: &Policy,
    event: HealthEvent,
    now: i64,
) -> Result<(), Aborted> {
    let id = &entry.sub.id;
    let topic = ctx.topics.endpoint_state();
    let (pending, transition, snapshot) = ctx.states.update(id, partition, |st: &mut EndpointState| {
        let before = health::Material::of(st);
        if entry.sub.resume_generation > st.generation {
            health::resume(st, entry.sub.resume_generation);
        }
        let transition = health::apply(st, policy.disable.as_ref(), event, now);
        // Neither a success on a healthy endpoint (only last_success_at moves) nor a first success is written.
        let material = health::Material::of(st).changed_from(before);
        let pending = material.then(|| {
            let payload = st.encode_to_vec();
            (ctx.enqueue(topic, id, &payload), payload)
        });
        let snapshot = (!matches!(transition, Transition::None)).then(|| st.clone());
        (pending, transition, snapshot)
    });
    if let Some((enqueued, payload)) = pending {
        ctx.await_enqueued(enqueued, topic, id, &payload).await?;
    }
    let ops = match transition {
        Transition::None => None,
        Transition::Tripped { action, reason } => {
            let kind = match action {
                DisableAction::Pause => "endpoint_paused",
                DisableAction::Disable => "endpoint_disabled",
            };
            metrics::counter!("hookline_endpoints_disabled_total", "action" => kind).increment(1);
            tracing::warn!(subscription = %id, %reason, kind, "endpoint switched off by its policy");
            // `notify = false`: no ops event, hence no e-mail either.
            policy.disable.as_ref().is_some_and(|d| d.notify).then_some((kind, reason))
        }
        Transition::Recovered => Some(("endpoint_recovered", String::new())),
    };
    if let Some((kind, reason)) = ops {
        let snapshot = snapshot.unwrap_or_default();
        let condition = EndpointCondition::try_from(snapshot.condition).unwrap_or(EndpointCondition::Unspecified);
        let ev = OpsEvent {
            kind: kind.to_owned(),
            subscription_id: id.to_string(),
            reason,
            detail: format!(
                "policy {}; {} consecutive counted failures; condition {:?}",
                policy.name, snapshot.consecutive_failures, condition
            ),
            at_ms: now,
            owner_email: entry.sub.owner_email().to_owned(),
            url: entry.sub.url.to_string(),
        };
        ctx.produce(ctx.topics.ops(), id, &ev).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output_size4<F, A, B, C, D, R>(_: &F) -> usize
    where
        F: Fn(A, B, C, D) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// A delivery's future lives as long as the delivery (10k of them with 10k in flight): every branch and step
    /// that is not waiting on the endpoint is boxed, so it stays small. It was 8.6 KB before; 1,232 bytes after the
    /// task's event (held by value across the steps) gained `only_subscription_id` and the try its recorded headers;
    /// 1,312 with the latency split's three stamps on the task and the try's start in µs; 1,328 with the lane slot it
    /// gives back once the endpoint answered; 640 with the task boxed (it was held by value in several of its states).
    #[tokio::test]
    async fn a_delivery_future_stays_small() {
        assert!(output_size4(&deliver_in_lane) <= 640, "deliver_in_lane: {} bytes", output_size4(&deliver_in_lane));
        let sender = crate::sender::Sender::new(Default::default(), Arc::new(crate::connector::SystemResolver));
        let policy = hookline_core::policy::builtin("standard").unwrap();
        let send = sender.send_owned("k", &policy, "http://127.0.0.1:1/", Default::default(), &[], Bytes::new());
        // The request's own future (the pool's checkout and the own HTTP/1.1 client's exchange; its head is encoded
        // before the future exists and the body read is boxed) is inlined in the send step: 1,528 bytes in a debug
        // build, where hyper's legacy client boxed a 2.6 KB one separately.
        assert!(std::mem::size_of_val(&send) <= 2_200, "send: {} bytes", std::mem::size_of_val(&send));
        // The deliveries' own path, by the subscription's send plan.
        let entry = Arc::new(SubscriptionEntry::new(hookline_core::model::Subscription {
            id: "s".into(),
            url: "http://127.0.0.1:1/".into(),
            ..Default::default()
        }));
        let plan = sender.plan(&entry, &policy);
        let ids = request::AttemptIds { event_id: "e", event_type: "t", delivery_id: "d", attempt_number: 1, now_ms: 0, event: None };
        let planned = sender.send_planned(&plan, &policy, &ids, None, Bytes::new());
        assert!(std::mem::size_of_val(&planned) <= 2_200, "planned send: {} bytes", std::mem::size_of_val(&planned));
    }

    /// One lane slot (`per_subscription_concurrency = 1`); each job as the dispatcher's lane job runs a delivery.
    fn in_lane(delivery: impl FnOnce(Slot) -> BoxFuture<'static, ()> + Send + 'static) -> crate::lanes::Job {
        Box::new(move |_| {
            Box::pin(async move {
                let (slot, released) = Slot::new();
                hold_slot(delivery(slot), released).await
            })
        })
    }

    #[tokio::test]
    async fn a_lane_starts_its_next_delivery_once_the_endpoint_answered_while_the_records_wait_for_the_broker() {
        use tokio::sync::oneshot;
        let lanes = crate::lanes::Lanes::new(1);
        let (ack_tx, ack_rx) = oneshot::channel::<()>();
        let (first_done_tx, mut first_done) = oneshot::channel::<()>();
        let (second_started_tx, second_started) = oneshot::channel::<()>();
        lanes.submit(
            "s",
            in_lane(move |slot| {
                Box::pin(async move {
                    // The endpoint answered the last try: the slot goes back; the records then wait for the broker.
                    slot.release();
                    let _ = ack_rx.await;
                    let _ = first_done_tx.send(());
                })
            }),
        );
        lanes.submit(
            "s",
            in_lane(move |_| {
                Box::pin(async move {
                    let _ = second_started_tx.send(());
                })
            }),
        );
        tokio::time::timeout(Duration::from_secs(10), second_started).await.expect("the next delivery starts").unwrap();
        assert!(first_done.try_recv().is_err(), "the first delivery still waits for its acknowledgement");
        ack_tx.send(()).unwrap();
        // Moved to a task of its own, it is still woken by what it was waiting for, and finishes.
        tokio::time::timeout(Duration::from_secs(10), first_done).await.expect("the first delivery finishes").unwrap();
        assert_eq!(lanes.depth("s"), 0);
    }

    #[tokio::test]
    async fn a_delivery_that_does_not_release_its_slot_holds_the_lane_until_it_ends() {
        use tokio::sync::oneshot;
        let lanes = crate::lanes::Lanes::new(1);
        let (end_tx, end_rx) = oneshot::channel::<()>();
        let (second_started_tx, mut second_started) = oneshot::channel::<()>();
        // A micro-retry, or an ordered delivery: the slot is kept for the whole delivery.
        lanes.submit(
            "s",
            in_lane(move |_slot| {
                Box::pin(async move {
                    let _ = end_rx.await;
                })
            }),
        );
        lanes.submit(
            "s",
            in_lane(move |_| {
                Box::pin(async move {
                    let _ = second_started_tx.send(());
                })
            }),
        );
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(second_started.try_recv().is_err(), "the lane's one slot is still taken");
        assert_eq!(lanes.depth("s"), 2);
        end_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), second_started).await.expect("the next delivery starts").unwrap();
    }

    #[test]
    fn spill_waits_follow_the_steps_or_the_lanes_drain_time_up_to_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(spill_wait_ms(0, s(5)), 5_000, "a lane just over the threshold: about when it has room");
        assert_eq!(spill_wait_ms(0, s(1)), 4_000);
        assert_eq!(spill_wait_ms(1, s(5)), 15_000);
        assert_eq!(spill_wait_ms(7, s(5)), 60_000);
        assert_eq!(spill_wait_ms(0, s(170)), 60_000, "a hanging lane: the longest step at once");
        assert_eq!(spill_wait_ms(0, Duration::MAX), 60_000);
    }
}
