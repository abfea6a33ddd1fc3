//! Parking held deliveries per subscription, without keeping them.
//!
//! A delivery of an inactive subscription (policy `inactive = "hold"`) waits on the `held` topic, keyed by its
//! subscription. The scheduler does not keep it in memory: per subscription it remembers only where its parked
//! records begin on its `held` partition (the *parked position*, topic `parked`, compacted). Every record of that
//! subscription on that partition at or after the position is parked, so the group's offset can move past them
//! once the position is durable. When the subscription is active again (or deleted: the dispatcher then records
//! its deliveries as cancelled), a release reads the partition from the position, forwards that subscription's
//! records to `deliveries` in order and skips the others, then removes the position. One subscription's backlog
//! therefore costs no memory and holds back no other subscription: a resume releases within a beat of
//! [`Parking::tick`] plus the read, whatever else the partition holds.
//!
//! At-least-once: a record is completed (its offset may be committed) only once a position at or below it is
//! acknowledged; a position moves forward (or is removed) only after every record of the subscription below the
//! new position was forwarded and acknowledged. A crash or a partition move in between releases some records
//! again (duplicates), never none. A new owner of a partition reads the partition's positions to the end before
//! it handles any record of it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use hookline_core::model::{DeliveryTask, ParkedPosition, TaskOrigin};
use hookline_kafka::client::Producer;
use hookline_kafka::produce::ShutDown;
use hookline_kafka::scan::RangeReader;
use hookline_kafka::table::{self, TableError, TableHandle};
use hookline_kafka::{KafkaSettings, Topics};
use hookline_service::now_ms;
use hookline_service::traces::Tracer;
use prost::Message as _;
use rdkafka::Message as _;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Releases reading at the same time: each has a consumer of its own.
const MAX_RELEASES: usize = 4;
/// Forwards of one release awaiting their acknowledgement together.
const FORWARD_BATCH: usize = 256;
/// A release that read nothing for this long gives up; it is tried again after [`RETRY_AFTER`].
const STALL: Duration = Duration::from_secs(30);
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// A release that forwarded this many records moves the position forward, so a crash repeats less.
const CHECKPOINT_EVERY: u64 = 10_000;

/// Whether a subscription's held deliveries may go to `deliveries` now (active again, or deleted).
pub type Releasable = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What to do with a record read from `held`.
pub enum Held {
    /// Forward it to `deliveries` now.
    Release,
    /// Parked behind a durable position: the record is done.
    Parked,
    /// The subscription's first parked record: done once its position is acknowledged (`Ok`); an error means the
    /// partition was revoked or the process is stopping, and the record stays uncommitted.
    ParkedOnceWritten(oneshot::Receiver<()>),
    /// The partition was revoked: leave the record uncommitted.
    Abandoned,
    /// The partition's positions are still being read: keep the record (and its partition paused) and offer it
    /// again once [`Parking::synced`] says so.
    Wait,
}

/// The positions of one `held` partition were read to the end (or shutdown came first).
pub struct Synced {
    partition: i32,
    generation: u64,
    /// The `held` partition's end offset when the read began.
    result: Result<i64, ShutDown>,
}

impl Synced {
    pub fn partition(&self) -> i32 {
        self.partition
    }
}

/// Reads the `parked` partition to its end and returns the `held` partition's end offset from before.
async fn read_to_end(reader: &TableHandle, held: &str, partition: i32, shutdown: &CancellationToken) -> Result<i64, ShutDown> {
    let (end, held_end) = loop {
        let r = async { Ok::<_, TableError>((reader.end_offset(partition).await?, reader.end_offset_of(held, partition).await?)) }.await;
        match r {
            Ok(ends) => break ends,
            Err(e) => {
                tracing::warn!(partition, error = %e, "reading parked positions; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => return Err(ShutDown),
                }
            }
        }
    };
    tokio::select! {
        _ = reader.wait_for(partition, end) => Ok(held_end),
        _ = shutdown.cancelled() => Err(ShutDown),
    }
}

/// A release that finished, stopped or failed (see [`Parking::next_event`] and [`Parking::handle`]).
pub struct ReleaseEvent {
    partition: i32,
    sub: String,
    id: u64,
    outcome: Outcome,
}

enum Outcome {
    /// Every record of the subscription below the release's end was forwarded and acknowledged.
    Done,
    /// Records below `next` were forwarded; the subscription is inactive again (`stopped`) or the read failed.
    Partial { next: i64, failed: bool },
    /// Checkpoint: records below `next` were forwarded; the release goes on.
    Progress { next: i64 },
    /// The partition was revoked or the process is stopping.
    Cancelled,
}

struct Mark {
    /// The first offset not known to be released.
    from: i64,
    parked_at_ms: i64,
    release: Option<Release>,
    /// After a failed release, the next is not started before this.
    not_before: Option<Instant>,
    /// Written by this process (false for a position read from the topic at assignment).
    confirmed: bool,
}

struct Release {
    id: u64,
    /// One past the last offset it reads.
    upto: i64,
    /// A record of the subscription at or past `upto` arrived meanwhile and was parked: another release follows.
    covered_above: bool,
}

/// A `held` partition this process owns, with its positions read.
struct Part {
    /// One past the highest offset of the partition this process has handled or knows was handled before it.
    next: i64,
    marks: HashMap<String, Mark>,
    cancel: CancellationToken,
    /// Writes of positions, one at a time in order (a later write never lands before an earlier one).
    writes: mpsc::UnboundedSender<Write>,
}

struct Write {
    sub: String,
    /// `None` removes the position.
    position: Option<ParkedPosition>,
    acked: Option<oneshot::Sender<()>>,
}

pub struct Parking {
    topics: Topics,
    settings: KafkaSettings,
    producer: Producer,
    shutdown: CancellationToken,
    releasable: Releasable,
    tracer: Tracer,
    /// The positions as the topic says, every partition's (the reader applies everything, this process's writes
    /// too): what a partition's new owner starts from.
    table: Arc<Mutex<HashMap<i32, HashMap<String, ParkedPosition>>>>,
    reader: TableHandle,
    parts: HashMap<i32, Part>,
    /// Revoked and not assigned again since.
    revoked: HashSet<i32>,
    /// Partitions whose positions are being read, by the read's generation (a stale read is ignored).
    syncing: HashMap<i32, u64>,
    events_tx: mpsc::UnboundedSender<ReleaseEvent>,
    events_rx: mpsc::UnboundedReceiver<ReleaseEvent>,
    slots: Arc<Semaphore>,
    next_id: u64,
}

impl Parking {
    /// Starts following the `parked` topic; `stop` ends the reader.
    #[allow(clippy::too_many_arguments)] // called once, from the scheduler's start, with what it already holds
    pub async fn start(
        settings: &KafkaSettings,
        topics: &Topics,
        instance: &str,
        producer: Producer,
        releasable: Releasable,
        tracer: Tracer,
        shutdown: CancellationToken,
        stop: CancellationToken,
    ) -> Result<Self, TableError> {
        let table: Arc<Mutex<HashMap<i32, HashMap<String, ParkedPosition>>>> = Arc::default();
        let t = table.clone();
        let reader = table::spawn(
            settings,
            topics.parked(),
            &format!("{instance}-parked"),
            move |_, k, v| {
                let id = String::from_utf8_lossy(k).into_owned();
                let mut t = t.lock().expect("parked table lock");
                match v.filter(|v| !v.is_empty()).map(ParkedPosition::decode) {
                    Some(Ok(pos)) => {
                        // A position elsewhere of the same subscription (partitions re-numbered) is replaced.
                        for (p, m) in t.iter_mut() {
                            if *p != pos.held_partition {
                                m.remove(&id);
                            }
                        }
                        t.entry(pos.held_partition).or_default().insert(id, pos);
                    }
                    None => t.values_mut().for_each(|m| {
                        m.remove(&id);
                    }),
                    Some(Err(e)) => tracing::warn!(subscription = %id, error = %e, "undecodable parked position ignored"),
                }
            },
            stop,
        )
        .await?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Ok(Self {
            topics: topics.clone(),
            settings: settings.clone(),
            producer,
            shutdown,
            releasable,
            tracer,
            table,
            reader,
            parts: HashMap::new(),
            revoked: HashSet::new(),
            syncing: HashMap::new(),
            events_tx,
            events_rx,
            slots: Arc::new(Semaphore::new(MAX_RELEASES)),
            next_id: 0,
        })
    }

    /// Resolves once the topic was read to the end it had at start.
    pub async fn caught_up(&self) {
        self.reader.wait_caught_up().await;
    }

    /// Subscriptions with parked deliveries on this process's partitions.
    pub fn parked_subscriptions(&self) -> usize {
        self.parts.values().map(|p| p.marks.len()).sum()
    }

    /// A `held` partition was assigned: its positions are read to the end by the returned future (the consume loop
    /// awaits it beside its poll and hands the result to [`Parking::synced`]); until then its records are
    /// [`Held::Wait`]. `None`: already read, or being read.
    pub fn assigned(&mut self, partition: i32) -> Option<BoxFuture<'static, Synced>> {
        self.revoked.remove(&partition);
        self.sync(partition)
    }

    /// Starts reading a partition's positions unless they are read or being read.
    pub fn sync(&mut self, partition: i32) -> Option<BoxFuture<'static, Synced>> {
        if self.parts.contains_key(&partition) || self.syncing.contains_key(&partition) {
            return None;
        }
        self.next_id = self.next_id.wrapping_add(1);
        let generation = self.next_id;
        self.syncing.insert(partition, generation);
        let (reader, held, shutdown) = (self.reader.clone(), self.topics.held().to_owned(), self.shutdown.clone());
        Some(Box::pin(async move {
            let result = read_to_end(&reader, &held, partition, &shutdown).await;
            Synced { partition, generation, result }
        }))
    }

    /// The positions of a partition were read (see [`Parking::assigned`]): whether its records may now be offered
    /// (again) to [`Parking::on_held`]. False for a read of an earlier assignment or one cut short by shutdown.
    pub fn synced(&mut self, s: Synced) -> bool {
        let partition = s.partition;
        if self.syncing.get(&partition) != Some(&s.generation) {
            return false;
        }
        self.syncing.remove(&partition);
        let Ok(held_end) = s.result else { return false };
        let marks: HashMap<String, Mark> = self
            .table
            .lock()
            .expect("parked table lock")
            .get(&partition)
            .map(|m| {
                m.iter()
                    .map(|(id, pos)| {
                        (
                            id.clone(),
                            Mark {
                                from: pos.held_offset,
                                parked_at_ms: pos.parked_at_ms,
                                release: None,
                                not_before: None,
                                confirmed: false,
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let cancel = self.shutdown.child_token();
        let (writes, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_positions(self.producer.clone(), self.topics.parked().to_owned(), partition, rx, cancel.clone()));
        tracing::debug!(partition, parked = marks.len(), "parked positions read");
        // Everything below the partition's end now was handled by an earlier owner or will be read by this one.
        self.parts.insert(partition, Part { next: held_end, marks, cancel, writes });
        true
    }

    /// A `held` partition was revoked: its releases stop, its positions are the next owner's.
    pub fn revoked(&mut self, partition: i32) {
        if let Some(part) = self.parts.remove(&partition) {
            part.cancel.cancel();
        }
        self.syncing.remove(&partition);
        self.revoked.insert(partition);
    }

    /// What to do with the record at `offset` of `held` partition `partition`, a task of subscription `sub`
    /// (its record key) that [`Releasable`] says may or may not go out now.
    pub fn on_held(&mut self, partition: i32, offset: i64, sub: &str, releasable: bool) -> Held {
        // A record of a partition revoked since it was fetched is its next owner's.
        if self.revoked.contains(&partition) {
            return Held::Abandoned;
        }
        let Some(part) = self.parts.get_mut(&partition) else { return Held::Wait };
        part.next = part.next.max(offset.saturating_add(1));
        enum Step {
            Release,
            Parked,
            /// Write the position (from, parked at); the record is done once it is acknowledged.
            Write(i64, i64),
        }
        let step = match part.marks.get_mut(sub) {
            None if releasable => Step::Release,
            None => {
                let at = now_ms();
                part.marks
                    .insert(sub.to_owned(), Mark { from: offset, parked_at_ms: at, release: None, not_before: None, confirmed: true });
                Step::Write(offset, at)
            }
            Some(m) => {
                let covered = match &mut m.release {
                    // A release is reading up to `upto`; what comes after goes after it, in order.
                    Some(r) if offset >= r.upto => {
                        r.covered_above = true;
                        true
                    }
                    _ => offset >= m.from,
                };
                if covered && m.confirmed {
                    Step::Parked
                } else if covered {
                    // A position taken over from the former owner is written again before anything parked behind
                    // it is done: a write of the former owner's still in flight lands before this one.
                    m.confirmed = true;
                    Step::Write(m.from, m.parked_at_ms)
                } else if releasable || m.release.is_some() {
                    // Below the position (read again after a restart): out now. While a release runs from the
                    // position, forwarding it is safe too: the dispatcher holds it again if it must wait.
                    Step::Release
                } else {
                    m.from = offset;
                    m.confirmed = true;
                    Step::Write(offset, m.parked_at_ms)
                }
            }
        };
        if !matches!(step, Step::Release) {
            metrics::counter!("hookline_held_parked_total").increment(1);
        }
        match step {
            Step::Release => Held::Release,
            Step::Parked => Held::Parked,
            Step::Write(from, parked_at_ms) => {
                let (tx, rx) = oneshot::channel();
                let position =
                    ParkedPosition { subscription_id: sub.to_owned(), held_partition: partition, held_offset: from, parked_at_ms };
                let _ = part.writes.send(Write { sub: sub.to_owned(), position: Some(position), acked: Some(tx) });
                Held::ParkedOnceWritten(rx)
            }
        }
    }

    /// Starts a release for each parked subscription that may go out now (up to [`MAX_RELEASES`] at a time; the
    /// others wait for the next beat).
    pub fn tick(&mut self) {
        let now = Instant::now();
        for (partition, part) in &mut self.parts {
            for (sub, m) in &mut part.marks {
                if m.release.is_some() || m.not_before.is_some_and(|t| t > now) || !(self.releasable)(sub) {
                    continue;
                }
                let Ok(slot) = self.slots.clone().try_acquire_owned() else { break };
                self.next_id = self.next_id.wrapping_add(1);
                let id = self.next_id;
                let upto = part.next;
                m.release = Some(Release { id, upto, covered_above: false });
                m.not_before = None;
                let job = ReleaseJob {
                    settings: self.settings.clone(),
                    held: self.topics.held().to_owned(),
                    deliveries: self.topics.deliveries().to_owned(),
                    partition: *partition,
                    sub: sub.clone(),
                    from: m.from,
                    upto,
                    producer: self.producer.clone(),
                    releasable: self.releasable.clone(),
                    tracer: self.tracer.clone(),
                    cancel: part.cancel.clone(),
                };
                let events = self.events_tx.clone();
                let (partition, sub) = (*partition, sub.clone());
                let parked_for = now_ms().saturating_sub(m.parked_at_ms);
                tracing::info!(subscription = %sub, partition, from = m.from, upto, parked_for_ms = parked_for, "releasing parked deliveries");
                tokio::spawn(async move {
                    let _slot = slot;
                    let progress = (events.clone(), sub.clone());
                    let outcome = job
                        .run(|next| {
                            let _ = progress.0.send(ReleaseEvent {
                                partition,
                                sub: progress.1.clone(),
                                id,
                                outcome: Outcome::Progress { next },
                            });
                        })
                        .await;
                    let _ = events.send(ReleaseEvent { partition, sub, id, outcome });
                });
            }
        }
        metrics::gauge!("hookline_parked_subscriptions").set(self.parked_subscriptions() as f64);
    }

    /// The next finished (or checkpointed) release, for [`Parking::handle`]. Never resolves while none runs.
    pub async fn next_event(&mut self) -> Option<ReleaseEvent> {
        self.events_rx.recv().await
    }

    /// Moves or removes the position of a release that ended or checkpointed.
    pub fn handle(&mut self, ev: ReleaseEvent) {
        let Some(part) = self.parts.get_mut(&ev.partition) else { return };
        let sub = ev.sub;
        let Some(m) = part.marks.get_mut(&sub) else { return };
        // A release of an earlier assignment, or superseded: its outcome says nothing about the current one.
        let Some((upto, covered_above)) = m.release.as_ref().filter(|r| r.id == ev.id).map(|r| (r.upto, r.covered_above)) else { return };
        let position = |from: i64, parked_at_ms: i64| {
            Some(ParkedPosition { subscription_id: sub.clone(), held_partition: ev.partition, held_offset: from, parked_at_ms })
        };
        let outcome = match ev.outcome {
            Outcome::Done => "done",
            Outcome::Partial { failed: false, .. } => "stopped",
            Outcome::Partial { failed: true, .. } => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Progress { .. } => "progress",
        };
        match ev.outcome {
            Outcome::Done if !covered_above => {
                part.marks.remove(&sub);
                let _ = part.writes.send(Write { sub, position: None, acked: None });
            }
            Outcome::Done => {
                m.from = upto;
                m.release = None;
                m.confirmed = true;
                let _ = part.writes.send(Write { sub: sub.clone(), position: position(m.from, m.parked_at_ms), acked: None });
            }
            Outcome::Partial { next, failed } => {
                let moved = next > m.from;
                m.from = m.from.max(next);
                m.release = None;
                if failed {
                    m.not_before = Some(Instant::now() + RETRY_AFTER);
                }
                if moved {
                    m.confirmed = true;
                    let _ = part.writes.send(Write { sub: sub.clone(), position: position(m.from, m.parked_at_ms), acked: None });
                }
            }
            Outcome::Progress { next } => {
                if next > m.from {
                    m.from = next;
                    m.confirmed = true;
                    let _ = part.writes.send(Write { sub: sub.clone(), position: position(m.from, m.parked_at_ms), acked: None });
                }
                return;
            }
            Outcome::Cancelled => m.release = None,
        }
        metrics::counter!("hookline_held_releases_total", "outcome" => outcome).increment(1);
    }
}

/// Writes positions of one partition in order, each until acknowledged, to that partition itself (where the
/// partition's next owner reads them, whatever the key would hash to).
async fn write_positions(
    producer: Producer,
    topic: String,
    partition: i32,
    mut rx: mpsc::UnboundedReceiver<Write>,
    cancel: CancellationToken,
) {
    loop {
        let w = tokio::select! {
            _ = cancel.cancelled() => return,
            w = rx.recv() => match w { Some(w) => w, None => return },
        };
        let value = w.position.as_ref().map(prost::Message::encode_to_vec);
        let written =
            hookline_kafka::produce::send_to_partition_until_acked(&producer, &topic, partition, &w.sub, value.as_deref(), &cancel).await;
        if written.is_err() {
            return;
        }
        if let Some(tx) = w.acked {
            let _ = tx.send(());
        }
    }
}

/// One release: read `held` partition `partition` over `[from, upto)` and forward `sub`'s records.
struct ReleaseJob {
    settings: KafkaSettings,
    held: String,
    deliveries: String,
    partition: i32,
    sub: String,
    from: i64,
    upto: i64,
    producer: Producer,
    releasable: Releasable,
    tracer: Tracer,
    cancel: CancellationToken,
}

type Forward = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(i32, i64), ShutDown>> + Send>>;

impl ReleaseJob {
    async fn run(self, checkpoint: impl Fn(i64)) -> Outcome {
        let mut reader = match RangeReader::open(&self.settings, &self.held, self.partition, self.from, self.upto, STALL).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(subscription = %self.sub, error = %e, "parked deliveries not released; retrying");
                return Outcome::Partial { next: self.from, failed: true };
            }
        };
        let outcome = self.forward(&mut reader, checkpoint).await;
        let deleted = reader.deleted();
        if deleted > 0 {
            // Retention removed them before the subscription was active again: lost, and said so.
            metrics::counter!("hookline_parked_records_lost_total", "topic" => "held").increment(deleted.unsigned_abs());
            tracing::error!(
                subscription = %self.sub,
                partition = self.partition,
                from = self.from,
                records = deleted,
                "parked deliveries were deleted by the held topic's retention before they were released: lost \
                 (records of the partition, this subscription's among them); keep held's retention.ms above the longest pause"
            );
        }
        outcome
    }

    async fn forward(&self, reader: &mut RangeReader, checkpoint: impl Fn(i64)) -> Outcome {
        let mut batch: Vec<Forward> = Vec::new();
        let mut released: u64 = 0;
        let mut since_checkpoint: u64 = 0;
        loop {
            let m = tokio::select! {
                _ = self.cancel.cancelled() => return Outcome::Cancelled,
                m = reader.next() => m,
            };
            let m = match m {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    tracing::warn!(subscription = %self.sub, error = %e, "reading parked deliveries failed; retrying");
                    // The record that failed was not read: everything of `sub` below the reader's position was.
                    let next = reader.position();
                    return match self.flush(&mut batch).await {
                        Ok(()) => Outcome::Partial { next, failed: true },
                        Err(ShutDown) => Outcome::Cancelled,
                    };
                }
            };
            if m.key() != Some(self.sub.as_bytes()) {
                continue;
            }
            // An undecodable record was dead-lettered when it was first read.
            let Ok(mut task) = DeliveryTask::decode(m.payload().unwrap_or_default()) else { continue };
            if task.subscription_id != self.sub {
                continue;
            }
            if !(self.releasable)(&self.sub) {
                return match self.flush(&mut batch).await {
                    Ok(()) => Outcome::Partial { next: m.offset(), failed: false },
                    Err(ShutDown) => Outcome::Cancelled,
                };
            }
            task.origin = TaskOrigin::Held as i32;
            self.tracer.held_release(&task);
            let (producer, topic, key, payload) = (self.producer.clone(), self.deliveries.clone(), self.sub.clone(), task.encode_to_vec());
            let cancel = self.cancel.clone();
            batch.push(Box::pin(async move {
                hookline_kafka::produce::send_until_acked(&producer, &topic, &key, &payload, None, &cancel).await
            }));
            if batch.len() >= FORWARD_BATCH && self.flush(&mut batch).await.is_err() {
                return Outcome::Cancelled;
            }
            released = released.saturating_add(1);
            since_checkpoint = since_checkpoint.saturating_add(1);
            if since_checkpoint >= CHECKPOINT_EVERY {
                if self.flush(&mut batch).await.is_err() {
                    return Outcome::Cancelled;
                }
                since_checkpoint = 0;
                checkpoint(m.offset().saturating_add(1));
            }
        }
        if self.flush(&mut batch).await.is_err() {
            return Outcome::Cancelled;
        }
        tracing::info!(subscription = %self.sub, partition = self.partition, released, "parked deliveries released");
        Outcome::Done
    }

    /// Waits for every forward of the batch to be acknowledged.
    async fn flush(&self, batch: &mut Vec<Forward>) -> Result<(), ShutDown> {
        let n = batch.len() as u64;
        for r in futures::future::join_all(batch.drain(..)).await {
            r?;
        }
        metrics::counter!("hookline_held_released_total").increment(n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use hookline_kafka::mock::DevBroker;
    use rdkafka::producer::FutureRecord;

    use super::*;

    struct Fixture {
        _broker: DevBroker,
        settings: KafkaSettings,
        topics: Topics,
        producer: Producer,
        active: Arc<Mutex<HashSet<String>>>,
        stop: CancellationToken,
        written: std::sync::atomic::AtomicUsize,
    }

    impl Fixture {
        fn new() -> Self {
            let topics = Topics::new("hookline.");
            let broker = DevBroker::start(&topics, 1, 1).expect("mock broker");
            let settings = hookline_service::Config::dev(&broker.bootstrap_servers(), 1, "t").kafka;
            let producer = hookline_kafka::client::producer(&settings, "parking-test").unwrap();
            Self {
                _broker: broker,
                settings,
                topics,
                producer,
                active: Arc::default(),
                stop: CancellationToken::new(),
                written: Default::default(),
            }
        }

        async fn parking(&self) -> Parking {
            let active = self.active.clone();
            self.parking_with(Arc::new(move |id: &str| active.lock().unwrap().contains(id))).await
        }

        async fn parking_with(&self, releasable: Releasable) -> Parking {
            let p = Parking::start(
                &self.settings,
                &self.topics,
                "parking-test",
                self.producer.clone(),
                releasable,
                Tracer::default(),
                self.stop.clone(),
                self.stop.clone(),
            )
            .await
            .unwrap();
            p.caught_up().await;
            p
        }

        /// Writes held records for these subscriptions, in order, to partition 0 (delivery ids `<sub>-<n>`, n
        /// counting every record written); returns their offsets.
        async fn held(&self, subs: &[&str]) -> Vec<i64> {
            let mut at = Vec::new();
            for s in subs {
                let n = self.written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let task = DeliveryTask { subscription_id: (*s).into(), delivery_id: format!("{s}-{n}"), ..Default::default() };
                let payload = task.encode_to_vec();
                let record: FutureRecord<'_, str, [u8]> =
                    FutureRecord::to(self.topics.held()).partition(0).key(*s).payload(payload.as_slice());
                at.push(self.producer.send(record, Duration::from_secs(10)).await.unwrap().offset);
            }
            at
        }

        fn activate(&self, sub: &str) {
            self.active.lock().unwrap().insert(sub.into());
        }

        /// The delivery ids on `deliveries`, in order.
        async fn delivered(&self) -> Vec<String> {
            let reader = self.parking().await.reader;
            let end = reader.end_offset_of(self.topics.deliveries(), 0).await.unwrap();
            let mut r = RangeReader::open(&self.settings, self.topics.deliveries(), 0, 0, end, Duration::from_secs(10)).await.unwrap();
            let mut ids = Vec::new();
            while let Some(m) = r.next().await {
                ids.push(DeliveryTask::decode(m.unwrap().payload().unwrap()).unwrap().delivery_id);
            }
            ids
        }
    }

    /// Assigns partition 0 and waits until its positions are read, as the consume loop does.
    async fn ready(p: &mut Parking) {
        if let Some(read) = p.assigned(0) {
            assert!(p.synced(read.await), "the positions are read");
        }
    }

    async fn acked(h: Held) {
        match h {
            Held::ParkedOnceWritten(rx) => rx.await.expect("the position is acknowledged"),
            _ => panic!("expected the first parked record to wait for its position"),
        }
    }

    fn is(h: &Held, want: &str) -> bool {
        matches!((h, want), (Held::Release, "release") | (Held::Parked, "parked"))
    }

    async fn finish(p: &mut Parking) -> &'static str {
        let ev = tokio::time::timeout(Duration::from_secs(30), p.next_event()).await.expect("the release ends").unwrap();
        let what = match ev.outcome {
            Outcome::Done => "done",
            Outcome::Partial { failed: false, .. } => "stopped",
            Outcome::Partial { failed: true, .. } => "failed",
            Outcome::Progress { .. } => "progress",
            Outcome::Cancelled => "cancelled",
        };
        p.handle(ev);
        what
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parked_records_cost_a_position_and_a_resume_releases_only_that_subscriptions_in_order() {
        let f = Fixture::new();
        let at = f.held(&["a", "a", "b", "a", "c", "a"]).await;
        let mut p = f.parking().await;
        assert!(matches!(p.on_held(0, at[0], "a", false), Held::Wait), "before its positions are read, a record waits");
        ready(&mut p).await;
        f.activate("b");
        // The first parked record of a subscription waits for its position; the later ones are done at once.
        acked(p.on_held(0, at[0], "a", false)).await;
        assert!(is(&p.on_held(0, at[1], "a", false), "parked"));
        assert!(is(&p.on_held(0, at[2], "b", true), "release"), "an active subscription's goes out at once");
        assert!(is(&p.on_held(0, at[3], "a", false), "parked"));
        acked(p.on_held(0, at[4], "c", false)).await;
        assert!(is(&p.on_held(0, at[5], "a", false), "parked"));
        assert_eq!(p.parked_subscriptions(), 2, "one position per subscription, whatever it holds");

        // A new owner of the partition (a restart): the positions were durable, the records were never kept.
        let mut q = f.parking().await;
        ready(&mut q).await;
        assert_eq!(q.parked_subscriptions(), 2);
        p.tick();
        assert_eq!(p.parked_subscriptions(), 2, "nothing resumed, nothing released");
        drop(p);

        f.activate("a");
        q.tick();
        // A record of A read while its release runs (beyond what it reads) is parked behind it; the position
        // taken over from the former owner is written again first.
        let later = f.held(&["a"]).await[0];
        acked(q.on_held(0, later, "a", true)).await;
        assert_eq!(finish(&mut q).await, "done");
        assert_eq!(q.parked_subscriptions(), 2, "A's position moved to the later record; C's stays");
        assert_eq!(f.delivered().await, ["a-0", "a-1", "a-3", "a-5"], "A's parked records, in order, nothing of B or C");
        q.tick();
        assert_eq!(finish(&mut q).await, "done");
        assert_eq!(q.parked_subscriptions(), 1, "A's position removed once everything was released");
        assert_eq!(f.delivered().await, ["a-0", "a-1", "a-3", "a-5", "a-6"]);

        // Another restart: only C's position is left on the topic.
        let mut r = f.parking().await;
        ready(&mut r).await;
        assert_eq!(r.parked_subscriptions(), 1);
        // Revoked: a record of the partition fetched before is left to its next owner, and nothing is known here.
        r.revoked(0);
        let stale = f.held(&["c"]).await[0];
        assert!(matches!(r.on_held(0, stale, "c", false), Held::Abandoned));
        assert_eq!(r.parked_subscriptions(), 0);
        f.stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_read_again_below_the_position_moves_it_down_and_a_pause_mid_release_keeps_the_rest() {
        let f = Fixture::new();
        let at = f.held(&["a", "a", "a", "a"]).await;
        let mut p = f.parking().await;
        ready(&mut p).await;
        acked(p.on_held(0, at[2], "a", false)).await;
        // Read again after a restart from an earlier commit: the position goes down to it, durably.
        acked(p.on_held(0, at[0], "a", false)).await;
        assert!(is(&p.on_held(0, at[1], "a", false), "parked"));
        assert!(is(&p.on_held(0, at[3], "a", false), "parked"));
        drop(p);

        // Resumed, then paused again after two records went out: the release stops and the position moves there.
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        let releasable: Releasable = Arc::new(move |_: &str| c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 3);
        let mut q = f.parking_with(releasable).await;
        ready(&mut q).await;
        q.tick();
        assert_eq!(finish(&mut q).await, "stopped");
        assert_eq!(f.delivered().await, ["a-0", "a-1"]);
        assert_eq!(q.parked_subscriptions(), 1);
        drop(q);

        let mut r = f.parking().await;
        ready(&mut r).await;
        f.activate("a");
        r.tick();
        assert_eq!(finish(&mut r).await, "done");
        assert_eq!(f.delivered().await, ["a-0", "a-1", "a-2", "a-3"], "the rest, from the moved position");
        assert_eq!(r.parked_subscriptions(), 0);
        f.stop.cancel();
    }
}
