//! Ordered subscriptions (`ordering = "key" | "strict"`): one delivery per key out at a time (the gate's rules are
//! `hookline_core::ordering::KeyGate`). Only ordered subscriptions come here; every other delivery takes the usual
//! path without a lookup or a write of this module.
//!
//! Each active key has a task of its own that carries out its gate's steps one after the other, so no park races a
//! release. Durability (every step is acknowledged before the input it stands for is completed):
//! - A key's head is written to the subscription's endpoint state (`ordering_heads`: co-partitioned, fenced, synced
//!   by a partition's next owner before it handles a record) before it is sent, and removed before its final record
//!   (for a held head: once it is on `held`).
//! - While the head is being sent, later deliveries of its key wait in memory, uncommitted (a crash re-reads them
//!   in order). When it goes to the retry ladder they are *parked*: written to the `ordered` topic (the partition of
//!   the same number), the first one's offset recorded in the key's state, and then completed, so a long retry
//!   holds back neither the partition's commits nor its budget. Later deliveries of the key are parked behind them.
//! - When the head concludes, the key's first parked delivery is read back (from the recorded offset) and put on
//!   `deliveries` with its offset in a header; when it arrives it becomes the head and the recorded offset moves
//!   past it. A crash in between releases it again: the copy whose offset is below the recorded one is skipped.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hookline_core::model::{DeliveryTask, EndpointState, OrderingHead};
use hookline_core::ordering::{Durable, Exit, KeyGate, Ordering, RunId, Start, Step};
use hookline_kafka::scan::RangeReader;
use hookline_kafka::table::TableHandle;
use hookline_kafka::worker::Done;
use prost::Message as _;
use rdkafka::message::{Header, Headers as _, OwnedHeaders};
use rdkafka::Message as _;
use tokio::sync::mpsc;

use crate::deliver::{self, Aborted};
use crate::lanes::Run;
use crate::Ctx;

/// Keys of one subscription with a head out or deliveries parked at once (each is a row of its endpoint state): a
/// fresh key beyond it waits for a row to free.
pub(crate) const MAX_OPEN_KEYS: usize = 1_000;
/// On a delivery put back from `ordered`: the offset it was parked at.
pub(crate) const RELEASED_FROM_HEADER: &str = "hookline-ordered-offset";
/// On a parked record: its ordering key (the subscription's ordering may change while it is parked).
const KEY_HEADER: &str = "hookline-ordering-key";
/// A release that reads nothing for this long gives up (the key's task stops; its deliveries are redone).
const READ_STALL: Duration = Duration::from_secs(30);

/// A delivery record taken for an ordered subscription.
pub(crate) struct Job {
    pub task: Box<DeliveryTask>,
    pub raw: Bytes,
    pub done: Done,
    pub source: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    /// Put back from `ordered`, where it was parked at this offset.
    pub released_from: Option<i64>,
}

/// (subscription id, key).
type GateKey = (String, String);

enum Msg {
    /// Boxed: a message is small while it waits in the channel.
    Arrive(RunId, Box<Job>),
    /// The head let out last left the dispatcher.
    Left(Start, Exit),
    /// The head's delivery was abandoned (shutdown or revoke): the key's task stops.
    Abort,
}

struct Entry {
    id: u64,
    partition: i32,
    tx: mpsc::UnboundedSender<Msg>,
}

/// The key tasks of this dispatcher's ordered subscriptions.
pub(crate) struct Gates {
    inner: Mutex<HashMap<GateKey, Entry>>,
    ids: AtomicU64,
    /// Reads end offsets of `ordered` (the endpoint-state reader's client).
    reader: TableHandle,
}

impl Gates {
    pub fn new(reader: TableHandle) -> Self {
        Self { inner: Mutex::default(), ids: AtomicU64::new(0), reader }
    }

    fn remove(&self, gk: &GateKey, id: u64) {
        let mut map = self.inner.lock().expect("ordering gates lock");
        if map.get(gk).is_some_and(|e| e.id == id) {
            map.remove(gk);
        }
    }

    /// The partition was revoked: its keys' tasks stop (what they hold stays uncommitted for the next owner).
    pub fn forget_partition(&self, partition: i32) {
        self.inner.lock().expect("ordering gates lock").retain(|_, e| {
            if e.partition == partition {
                let _ = e.tx.send(Msg::Abort);
            }
            e.partition != partition
        });
    }
}

fn run_of(task: &DeliveryTask) -> RunId {
    RunId { delivery_id: task.delivery_id.clone(), run_id: task.run_id.clone() }
}

/// A delivery put back from `ordered`: the offset it was parked at and its key, from its record's headers.
pub(crate) fn released(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<(i64, String)> {
    let headers = m.headers()?;
    let value = |name: &str| headers.iter().find(|h| h.key == name).and_then(|h| std::str::from_utf8(h.value?).ok());
    Some((value(RELEASED_FROM_HEADER)?.parse().ok()?, value(KEY_HEADER)?.to_owned()))
}

/// Takes an ordered subscription's delivery to its key's task (`key`: the one a released delivery was parked
/// under, else the subscription's ordering says).
pub(crate) fn submit(ctx: &Arc<Ctx>, ordering: Option<&Ordering>, key: Option<String>, job: Job) {
    let key = key.or_else(|| ordering.map(|o| o.key_of(job.task.event.as_ref()))).unwrap_or_default();
    let gk: GateKey = (job.task.subscription_id.clone(), key);
    let run = run_of(&job.task);
    let partition = job.partition;
    let mut map = ctx.ordering.inner.lock().expect("ordering gates lock");
    let entry = map.entry(gk.clone()).or_insert_with(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = ctx.ordering.ids.fetch_add(1, AtomicOrdering::Relaxed);
        tokio::spawn(key_task(ctx.clone(), gk, partition, id, tx.clone(), rx));
        Entry { id, partition, tx }
    });
    // Sent under the lock: a task that finds its channel empty under the lock may end.
    let _ = entry.tx.send(Msg::Arrive(run, Box::new(job)));
}

/// One key's task: syncs its gate with the durable state, then carries out its steps in order.
async fn key_task(
    ctx: Arc<Ctx>,
    gk: GateKey,
    partition: i32,
    id: u64,
    me: mpsc::UnboundedSender<Msg>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) {
    let ready = tokio::select! {
        biased;
        r = ctx.states.ready(partition) => r,
        _ = ctx.shutdown.cancelled() => false,
    };
    if !ready {
        ctx.ordering.remove(&gk, id);
        return;
    }
    // The ownership it works under: a later one (revoked and assigned again) is another task's.
    let epoch = ctx.states.epoch(partition);
    let mut gate: KeyGate<Job> = KeyGate::default();
    let mut todo: VecDeque<Step<Job>> = gate.sync(durable(&ctx, &gk)).into();
    loop {
        while let Some(step) = todo.pop_front() {
            if ctx.states.epoch(partition) != epoch {
                ctx.ordering.remove(&gk, id);
                return;
            }
            match execute(&ctx, &gk, partition, &mut gate, &me, step).await {
                Ok(more) => todo.extend(more),
                Err(Aborted) => {
                    ctx.ordering.remove(&gk, id);
                    return;
                }
            }
        }
        let msg = if gate.is_idle() {
            let mut map = ctx.ordering.inner.lock().expect("ordering gates lock");
            match rx.try_recv() {
                Ok(m) => m,
                Err(_) => {
                    if map.get(&gk).is_some_and(|e| e.id == id) {
                        map.remove(&gk);
                    }
                    return;
                }
            }
        } else {
            let m = tokio::select! {
                m = rx.recv() => m,
                _ = ctx.shutdown.cancelled() => None,
            };
            match m {
                Some(m) => m,
                None => {
                    ctx.ordering.remove(&gk, id);
                    return;
                }
            }
        };
        let steps = match msg {
            Msg::Arrive(run, job) => {
                let released = job.released_from;
                let steps = gate.arrive(run, *job, released);
                if steps.iter().any(|s| matches!(s, Step::Park(_))) || (steps.is_empty() && gate.waiting() > 0) {
                    metrics::counter!("hookline_ordered_waits_total").increment(1);
                }
                steps
            }
            Msg::Left(start, exit) => gate.left(start, exit),
            Msg::Abort => {
                ctx.ordering.remove(&gk, id);
                return;
            }
        };
        todo.extend(steps);
    }
}

fn durable(ctx: &Ctx, (sub, key): &GateKey) -> Durable {
    let Some(st) = ctx.states.get(sub) else { return Durable::default() };
    let Some(h) = st.ordering_heads.into_iter().find(|h| h.key == *key) else { return Durable::default() };
    Durable {
        head: (!h.delivery_id.is_empty()).then_some(RunId { delivery_id: h.delivery_id, run_id: h.run_id }),
        parked_from: (h.parked_from > 0).then(|| h.parked_from - 1),
    }
}

/// Carries out one step of the gate; returns the steps that follow from it.
async fn execute(
    ctx: &Arc<Ctx>,
    gk: &GateKey,
    partition: i32,
    gate: &mut KeyGate<Job>,
    me: &mpsc::UnboundedSender<Msg>,
    step: Step<Job>,
) -> Result<Vec<Step<Job>>, Aborted> {
    match step {
        Step::Send(run, job, start) => {
            if start == Start::Fresh {
                claim_head(ctx, gk, &run, partition).await?;
            }
            send(ctx, gk, job, start, me.clone());
            Ok(Vec::new())
        }
        Step::Adopt(run, job, from) => {
            metrics::counter!("hookline_ordered_released_total").increment(1);
            let head = run.clone();
            write_key(ctx, gk, partition, move |h| {
                h.delivery_id = head.delivery_id;
                h.run_id = head.run_id;
                h.parked_from = from.saturating_add(1);
            })
            .await?;
            // Like a fresh head for what its leaving means: it has not been out before.
            send(ctx, gk, job, Start::Fresh, me.clone());
            Ok(Vec::new())
        }
        Step::Skip(job) => {
            tracing::debug!(delivery = %job.task.delivery_id, "a repeated release of an ordered delivery; not sent again");
            job.done.complete();
            Ok(Vec::new())
        }
        Step::Park(job) => {
            let (_, offset) = park(ctx, gk, &job.raw).await?;
            if gate.parked_at(offset) {
                write_key(ctx, gk, partition, move |h| h.parked_from = offset.saturating_add(1)).await?;
            }
            metrics::counter!("hookline_ordered_parked_total").increment(1);
            job.done.complete();
            Ok(Vec::new())
        }
        Step::Release => match gate.parked_from() {
            Some(from) => {
                if release(ctx, gk, partition, from).await? {
                    Ok(Vec::new())
                } else {
                    write_key(ctx, gk, partition, |h| h.parked_from = 0).await?;
                    Ok(gate.released_none())
                }
            }
            None => Ok(gate.released_none()),
        },
    }
}

/// Writes a parked delivery to `ordered` (co-partitioned: the same partition number as its `deliveries` record).
async fn park(ctx: &Ctx, (sub, key): &GateKey, raw: &[u8]) -> Result<(i32, i64), Aborted> {
    let headers = OwnedHeaders::new().insert(Header { key: KEY_HEADER, value: Some(key.as_bytes()) });
    hookline_kafka::produce::send_until_acked(&ctx.producer, ctx.topics.ordered(), sub, raw, Some(&headers), &ctx.shutdown)
        .await
        .map_err(|_| Aborted)
}

/// Reads `ordered` from `from` for the key's first parked delivery and puts it back on `deliveries`. `false`: none.
async fn release(ctx: &Ctx, (sub, key): &GateKey, partition: i32, from: i64) -> Result<bool, Aborted> {
    let topic = ctx.topics.ordered();
    let end = tokio::select! {
        r = ctx.ordering.reader.end_offset_of(topic, partition) => r.map_err(|e| {
            tracing::warn!(subscription = %sub, error = %e, "reading the end of the ordered topic");
            Aborted
        })?,
        _ = ctx.shutdown.cancelled() => return Err(Aborted),
    };
    let mut reader = RangeReader::open(&ctx.kafka, topic, partition, from, end, READ_STALL).await.map_err(|e| {
        tracing::warn!(subscription = %sub, error = %e, "opening the ordered topic");
        Aborted
    })?;
    loop {
        let next = tokio::select! {
            n = reader.next() => n,
            _ = ctx.shutdown.cancelled() => return Err(Aborted),
        };
        let m = match next {
            None => {
                if reader.deleted() > 0 {
                    metrics::counter!("hookline_parked_records_lost_total", "topic" => "ordered")
                        .increment(reader.deleted().unsigned_abs());
                    tracing::error!(
                        subscription = %sub,
                        partition,
                        records = reader.deleted(),
                        "parked ordered deliveries were deleted by the ordered topic's retention before their key's head finished: lost"
                    );
                }
                return Ok(false);
            }
            Some(Err(e)) => {
                tracing::warn!(subscription = %sub, error = %e, "reading parked ordered deliveries; the key's deliveries are redone by its next run");
                return Err(Aborted);
            }
            Some(Ok(m)) => m,
        };
        if m.key() != Some(sub.as_bytes()) {
            continue;
        }
        let of_key = m.headers().and_then(|hs| hs.iter().find(|h| h.key == KEY_HEADER).map(|h| h.value == Some(key.as_bytes())));
        if of_key != Some(true) {
            continue;
        }
        let at = m.offset().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header { key: RELEASED_FROM_HEADER, value: Some(at.as_bytes()) })
            .insert(Header { key: KEY_HEADER, value: Some(key.as_bytes()) });
        let payload = m.payload().unwrap_or_default();
        hookline_kafka::produce::send_until_acked(&ctx.producer, ctx.topics.deliveries(), sub, payload, Some(&headers), &ctx.shutdown)
            .await
            .map_err(|_| Aborted)?;
        return Ok(true);
    }
}

/// Writes the key's head (acknowledged) before it is sent, waiting while the subscription has [`MAX_OPEN_KEYS`]
/// keys in its state.
async fn claim_head(ctx: &Ctx, gk: &GateKey, run: &RunId, partition: i32) -> Result<(), Aborted> {
    loop {
        let full = ctx
            .states
            .get(&gk.0)
            .is_some_and(|st| st.ordering_heads.len() >= MAX_OPEN_KEYS && !st.ordering_heads.iter().any(|h| h.key == gk.1));
        if !full {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = ctx.shutdown.cancelled() => return Err(Aborted),
        }
    }
    let run = run.clone();
    write_key(ctx, gk, partition, move |h| {
        h.delivery_id = run.delivery_id;
        h.run_id = run.run_id;
    })
    .await
}

/// Changes the key's row of the subscription's endpoint state (made when missing, dropped when it holds nothing)
/// and writes the state if the row changed.
async fn write_key(ctx: &Ctx, (sub, key): &GateKey, partition: i32, f: impl FnOnce(&mut OrderingHead)) -> Result<(), Aborted> {
    let topic = ctx.topics.endpoint_state();
    let pending = ctx.states.update(sub, partition, |st: &mut EndpointState| {
        let heads = &mut st.ordering_heads;
        let at = heads.iter().position(|h| h.key == *key);
        let before = at.map(|i| heads[i].clone());
        let mut row = before.clone().unwrap_or_else(|| OrderingHead { key: key.clone(), ..Default::default() });
        f(&mut row);
        let after = (!row.delivery_id.is_empty() || row.parked_from > 0).then_some(row);
        if before == after {
            return None;
        }
        match (at, after) {
            (Some(i), Some(row)) => heads[i] = row,
            (Some(i), None) => {
                heads.remove(i);
            }
            (None, Some(row)) => heads.push(row),
            (None, None) => {}
        }
        let payload = st.encode_to_vec();
        Some((ctx.enqueue(topic, sub, &payload), payload))
    });
    if let Some((enqueued, payload)) = pending {
        ctx.await_enqueued(enqueued, topic, sub, &payload).await?;
    }
    Ok(())
}

/// Removes the key's head if it still names `run` (keeps where its parked deliveries begin).
async fn release_head(ctx: &Ctx, gk: &GateKey, run: &RunId, partition: i32) -> Result<(), Aborted> {
    let run = run.clone();
    write_key(ctx, gk, partition, move |h| {
        if h.delivery_id == run.delivery_id && h.run_id == run.run_id {
            h.delivery_id.clear();
            h.run_id.clear();
        }
    })
    .await
}

/// Sends the head in its subscription's lane.
fn send(ctx: &Arc<Ctx>, gk: &GateKey, job: Job, start: Start, me: mpsc::UnboundedSender<Msg>) {
    let job_ctx = ctx.clone();
    let gk = gk.clone();
    let lane = gk.0.clone();
    ctx.lanes.submit(&lane, Box::new(move |mode| Box::pin(run_head(job_ctx, gk, job, start, mode, me))));
}

/// What the running head's delivery knows of its ordering (see [`note`] and [`before_final`]).
struct Out {
    key: String,
    partition: i32,
    exit: std::cell::Cell<Exit>,
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
    release_head(ctx, &(task.subscription_id.clone(), key), &run_of(task), partition).await
}

/// The head's delivery, in its subscription's lane; then its key's task hears how it left.
async fn run_head(ctx: Arc<Ctx>, gk: GateKey, job: Job, start: Start, mode: Run, me: mpsc::UnboundedSender<Msg>) {
    let Job { task, raw, done, source, partition, offset, .. } = job;
    let run = run_of(&task);
    let out = Out { key: gk.1.clone(), partition, exit: std::cell::Cell::new(Exit::Final) };
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
        let _ = me.send(Msg::Abort);
        return;
    }
    if !hookline_core::ordering::head_stays(start, exit) && release_head(&ctx, &gk, &run, partition).await.is_err() {
        let _ = me.send(Msg::Abort);
        return;
    }
    done.complete();
    let _ = me.send(Msg::Left(start, exit));
}
