//! Ordered subscriptions (`ordering = "key" | "strict"`): one delivery per key out at a time (see
//! `hookline_core::ordering` for the gate's rules). Only ordered subscriptions come here; every other delivery
//! takes the usual path without a lookup or a write of this module.
//!
//! Durability: a key's head is written to the subscription's endpoint state (`ordering_heads`, co-partitioned,
//! fenced, synced by a partition's next owner before it handles a record) before the head is sent, and removed
//! before its final record is written (for a held head: after it is on `held`). Deliveries waiting behind a head
//! stay in memory and uncommitted, so a crash or a move re-reads them in order; the new owner's gate knows the head
//! from the state and lets nothing of the key out until that head concludes. Waiting deliveries keep their units of
//! `dispatcher.max_in_flight`: a backlog beyond it pauses the partitions, as any backlog does, and loses nothing.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hookline_core::model::{DeliveryTask, EndpointState, OrderingHead};
use hookline_core::ordering::{head_stays, Exit, KeyGate, Ordering, RunId, Start};
use hookline_kafka::worker::Done;
use prost::Message as _;

use crate::deliver::{self, Aborted};
use crate::lanes::Run;
use crate::Ctx;

/// Keys of one subscription with a head out at once (each is a row of its endpoint state): a fresh key beyond it
/// waits for a row to free.
pub(crate) const MAX_OPEN_KEYS: usize = 1_000;

/// A delivery record taken for an ordered subscription.
pub(crate) struct Job {
    pub task: DeliveryTask,
    pub raw: Bytes,
    pub done: Done,
    pub source: Arc<str>,
    pub partition: i32,
    pub offset: i64,
}

/// (subscription id, key).
type GateKey = (String, String);

struct Slot {
    partition: i32,
    gate: KeyGate<Job>,
}

/// Every key gate of this dispatcher's ordered subscriptions.
#[derive(Default)]
pub(crate) struct Gates {
    inner: Mutex<HashMap<GateKey, Slot>>,
}

type Next = (RunId, Job, Start);

impl Gates {
    fn with<R>(&self, gk: &GateKey, f: impl FnOnce(&mut KeyGate<Job>) -> R) -> Option<R> {
        let mut map = self.inner.lock().expect("ordering gates lock");
        let slot = map.get_mut(gk)?;
        let r = f(&mut slot.gate);
        if slot.gate.is_idle() {
            map.remove(gk);
        }
        Some(r)
    }

    /// Drops a gate with what waits in it (uncommitted: the partition's next owner redoes it in order).
    fn abandon(&self, gk: &GateKey) {
        let dropped = self.inner.lock().expect("ordering gates lock").remove(gk);
        if let Some(slot) = dropped {
            waiting_changed(-(slot.gate.waiting() as f64));
        }
    }

    /// The partition was revoked: its gates go (their waiting deliveries stay uncommitted for the next owner).
    pub fn forget_partition(&self, partition: i32) {
        let mut map = self.inner.lock().expect("ordering gates lock");
        let before: usize = map.values().map(|s| s.gate.waiting()).sum();
        map.retain(|_, s| s.partition != partition);
        let after: usize = map.values().map(|s| s.gate.waiting()).sum();
        waiting_changed(after as f64 - before as f64);
    }

    /// Shutting down: nothing waiting is started any more (it stays uncommitted), so the drain waits only for what
    /// is out.
    pub fn clear(&self) {
        let mut map = self.inner.lock().expect("ordering gates lock");
        map.clear();
        metrics::gauge!("hookline_ordered_waiting").set(0.0);
    }
}

fn waiting_changed(by: f64) {
    if by != 0.0 {
        metrics::gauge!("hookline_ordered_waiting").increment(by);
    }
}

fn run_of(task: &DeliveryTask) -> RunId {
    RunId { delivery_id: task.delivery_id.clone(), run_id: task.run_id.clone() }
}

/// Takes an ordered subscription's delivery: out now, or queued behind its key's head.
pub(crate) fn submit(ctx: &Arc<Ctx>, ordering: &Ordering, job: Job) {
    let gk: GateKey = (job.task.subscription_id.clone(), ordering.key_of(job.task.event.as_ref()));
    let run = run_of(&job.task);
    let partition = job.partition;
    let (next, fresh_gate, waits) = {
        let mut map = ctx.ordering.inner.lock().expect("ordering gates lock");
        let fresh_gate = !map.contains_key(&gk);
        let slot = map.entry(gk.clone()).or_insert_with(|| Slot { partition, gate: KeyGate::default() });
        let before = slot.gate.waiting();
        let next = slot.gate.arrive(run, job);
        let waits = slot.gate.waiting() > before;
        (next, fresh_gate, waits)
    };
    if waits {
        metrics::counter!("hookline_ordered_waits_total").increment(1);
        waiting_changed(1.0);
    }
    if fresh_gate {
        tokio::spawn(sync(ctx.clone(), gk.clone(), partition));
    }
    if let Some(n) = next {
        launch(ctx.clone(), gk, n);
    }
}

/// A new gate learns its key's head from the partition's synced endpoint state before it lets anything out.
async fn sync(ctx: Arc<Ctx>, gk: GateKey, partition: i32) {
    let ready = tokio::select! {
        biased;
        r = ctx.states.ready(partition) => r,
        _ = ctx.shutdown.cancelled() => false,
    };
    if !ready {
        ctx.ordering.abandon(&gk);
        return;
    }
    let head = durable_head(&ctx, &gk);
    let next = ctx.ordering.with(&gk, |g| {
        let before = g.waiting();
        let next = g.sync(head);
        (next, before.saturating_sub(g.waiting()))
    });
    if let Some((next, left_queue)) = next {
        released(left_queue);
        if let Some(n) = next {
            launch(ctx, gk, n);
        }
    }
}

fn released(n: usize) {
    if n > 0 {
        metrics::counter!("hookline_ordered_released_total").increment(n as u64);
        waiting_changed(-(n as f64));
    }
}

fn durable_head(ctx: &Ctx, (sub, key): &GateKey) -> Option<RunId> {
    let st = ctx.states.get(sub)?;
    st.ordering_heads
        .into_iter()
        .find(|h| h.key == *key)
        .map(|h| RunId { delivery_id: h.delivery_id, run_id: h.run_id })
}

/// Starts a delivery the gate let out; a fresh head is written first.
fn launch(ctx: Arc<Ctx>, gk: GateKey, (run, job, start): Next) {
    tokio::spawn(async move {
        if start == Start::Fresh && claim_head(&ctx, &gk, &run, job.partition).await.is_err() {
            ctx.ordering.abandon(&gk);
            return;
        }
        let lane = gk.0.clone();
        let job_ctx = ctx.clone();
        ctx.lanes.submit(&lane, Box::new(move |mode| Box::pin(run_head(job_ctx, gk, job, start, mode))));
    });
}

/// Writes the key's head (acknowledged) before it is sent, waiting while the subscription has
/// [`MAX_OPEN_KEYS`] heads out.
async fn claim_head(ctx: &Ctx, (sub, key): &GateKey, run: &RunId, partition: i32) -> Result<(), Aborted> {
    loop {
        let open = ctx.states.get(sub).map_or(0, |st| st.ordering_heads.len());
        if open < MAX_OPEN_KEYS {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = ctx.shutdown.cancelled() => return Err(Aborted),
        }
    }
    write_heads(ctx, sub, partition, |heads| {
        if heads.iter().any(|h| h.key == *key && h.delivery_id == run.delivery_id && h.run_id == run.run_id) {
            return false;
        }
        heads.retain(|h| h.key != *key);
        heads.push(OrderingHead { key: key.clone(), delivery_id: run.delivery_id.clone(), run_id: run.run_id.clone() });
        true
    })
    .await
}

/// Removes the key's head if it still names `run`.
async fn release_head(ctx: &Ctx, sub: &str, key: &str, run: &RunId, partition: i32) -> Result<(), Aborted> {
    write_heads(ctx, sub, partition, |heads| {
        let before = heads.len();
        heads.retain(|h| !(h.key == key && h.delivery_id == run.delivery_id && h.run_id == run.run_id));
        heads.len() != before
    })
    .await
}

/// Changes the subscription's heads under the endpoint-state lock and writes the state if `f` changed them.
async fn write_heads(ctx: &Ctx, sub: &str, partition: i32, f: impl FnOnce(&mut Vec<OrderingHead>) -> bool) -> Result<(), Aborted> {
    let topic = ctx.topics.endpoint_state();
    let pending = ctx.states.update(sub, partition, |st: &mut EndpointState| {
        if !f(&mut st.ordering_heads) {
            return None;
        }
        let payload = st.encode_to_vec();
        Some((ctx.enqueue(topic, sub, &payload), payload))
    });
    if let Some((enqueued, payload)) = pending {
        ctx.await_enqueued(enqueued, topic, sub, &payload).await?;
    }
    Ok(())
}

/// What the running head's delivery knows of its ordering (see [`note`] and [`before_final`]).
struct Out {
    key: String,
    partition: i32,
    exit: Cell<Exit>,
}

tokio::task_local! {
    static OUT: Out;
}

/// The running delivery leaves this way (a no-op outside an ordered delivery).
pub(crate) fn note(exit: Exit) {
    let _ = OUT.try_with(|o| o.exit.set(exit));
}

/// Just before an ordered delivery's final record: its key is released durably first, so a crash in between
/// sends it again in its place (at least once) rather than leaving its key blocked by a head that never returns.
pub(crate) async fn before_final(ctx: &Ctx, task: &DeliveryTask) -> Result<(), Aborted> {
    let Ok((key, partition)) = OUT.try_with(|o| (o.key.clone(), o.partition)) else { return Ok(()) };
    release_head(ctx, &task.subscription_id, &key, &run_of(task), partition).await
}

/// The head's delivery, in its subscription's lane; then the key's next.
async fn run_head(ctx: Arc<Ctx>, gk: GateKey, job: Job, start: Start, mode: Run) {
    let Job { task, raw, done, source, partition, offset } = job;
    let run = run_of(&task);
    let out = Out { key: gk.1.clone(), partition, exit: Cell::new(Exit::Final) };
    let (result, exit) = OUT
        .scope(out, async {
            let work = async {
                match mode {
                    Run::Now => deliver::deliver(ctx.clone(), task, partition).await,
                    Run::Shed(drain) => deliver::spill(ctx.clone(), task, drain).await,
                }
            };
            let r = crate::guarded(&ctx, work, &raw, &source, partition, offset).await;
            (r, OUT.with(|o| o.exit.get()))
        })
        .await;
    if result.is_err() {
        // Shutting down or revoked: this and what waits behind it belong to the next run or owner.
        ctx.ordering.abandon(&gk);
        return;
    }
    if !head_stays(start, exit) && release_head(&ctx, &gk.0, &gk.1, &run, partition).await.is_err() {
        ctx.ordering.abandon(&gk);
        return;
    }
    done.complete();
    let next = ctx.ordering.with(&gk, |g| {
        let before = g.waiting();
        let next = g.left(start, exit);
        (next, before.saturating_sub(g.waiting()))
    });
    if let Some((next, left_queue)) = next {
        released(left_queue);
        if let Some(n) = next {
            launch(ctx, gk, n);
        }
    }
}
