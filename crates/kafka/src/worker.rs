//! The at-least-once consume loop every service runs: subscribe, poll without pause, start each record's offset
//! as it is taken, complete it when its handler says its outcome is durable, store the contiguous completed
//! watermark (librdkafka auto-commits what is stored), back off by pausing partitions (never by not polling),
//! apply rebalances before the records that follow them, and at shutdown drain with a deadline, commit and leave.
//!
//! The handler decides what a record means; the loop owns the offsets. A record whose [`Done`] is dropped
//! without [`Done::complete`] stays uncommitted: its partition's next owner redoes it.
//!
//! # Zombies
//! A loop that does not poll for `kafka.max_poll_interval_ms` is dropped from its group by librdkafka while its
//! work in flight could go on sending, as a zombie, next to the partition's new owner. The loop publishes when
//! it last polled ([`Liveness`]); work checks [`Liveness::is_live`] before it starts a side effect and waits
//! instead once the loop has been silent for the interval less a margin, so it stops before the group can move
//! its partitions. A loop that comes back after a silence past the interval treats every partition as lost until
//! librdkafka says so (or, within a few seconds, does not).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Message;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::budget::{Budget, Charge};
use crate::client::{close_consumer, group_consumer_config, LEAVE_GROUP_WITHIN};
use crate::rebalance::{RebalanceContext, RebalanceEvent, RevokeDrain};
use crate::settings::KafkaSettings;
use crate::watermark::{store_all, SharedWatermarks};

/// What a consume loop is: its group, topics and bounds.
pub struct Settings {
    /// For logs, metrics labels and the closing thread's name.
    pub name: &'static str,
    pub group_id: String,
    pub client_id: String,
    pub topics: Vec<String>,
    /// Units of work in flight (see [`Done::add_units`]) before every partition is paused. `None`: the handler
    /// pauses partitions itself (through [`Control::consumer`]).
    pub max_in_flight: Option<usize>,
    /// `hookline_*_paused`, set to 1 while the budget keeps the partitions paused.
    pub paused_gauge: Option<metrics::Gauge>,
    /// How long the shutdown drain waits for work in flight; what does not finish stays uncommitted.
    pub drain: Duration,
    /// Test only (off when `None`): while it reads `true` the loop stops polling altogether, as a loop stuck in a
    /// long computation or a frozen process would. Never set in production.
    pub stall: Option<watch::Receiver<bool>>,
    /// At most this many KiB of records librdkafka fetches ahead of the loop (`queued.max.messages.kbytes`; its
    /// default is 64 MiB, and `fetch.max.bytes` follows it), unless `kafka.properties` sets that key. `None`:
    /// librdkafka's default.
    pub prefetch_kbytes: Option<u32>,
}

/// The consumer's config: hookline's group consumer settings with `settings`' prefetch bound.
fn consumer_config(kafka: &KafkaSettings, settings: &Settings) -> Result<rdkafka::ClientConfig, KafkaError> {
    let mut c = group_consumer_config(kafka, &settings.group_id, &settings.client_id)?;
    if let Some(kbytes) = settings.prefetch_kbytes {
        crate::client::set_tuning_default(&mut c, kafka, "queued.max.messages.kbytes", kbytes);
    }
    Ok(c)
}

/// Finish a revoked partition's work before letting go (see [`RevokeDrain`]), for the first topic of
/// [`Settings::topics`].
pub struct Revoke {
    pub limit: Duration,
    pub release: Box<dyn Fn(i32) + Send + Sync>,
    pub shutdown: CancellationToken,
}

/// When a consume loop last polled its consumer, shared with the work it started (one atomic load to check).
pub struct Liveness {
    origin: Instant,
    last_poll_ms: AtomicU64,
    /// Set after a silence past `max_poll`: the member may have been dropped from its group; cleared when its
    /// partitions were released or it is clearly still a member.
    suspect: AtomicBool,
    silence_limit_ms: u64,
    max_poll_ms: u64,
    changed: Notify,
}

impl Liveness {
    /// For a consumer with `max.poll.interval.ms = max_poll`: work stops starting after `max_poll` less
    /// [`fence_margin`] of silence.
    pub fn new(max_poll: Duration) -> Arc<Self> {
        let max_poll_ms = u64::try_from(max_poll.as_millis()).unwrap_or(u64::MAX).max(1);
        let margin = u64::try_from(fence_margin(max_poll).as_millis()).unwrap_or(0);
        Arc::new(Self {
            origin: Instant::now(),
            last_poll_ms: AtomicU64::new(0),
            suspect: AtomicBool::new(false),
            silence_limit_ms: max_poll_ms.saturating_sub(margin).max(1),
            max_poll_ms,
            changed: Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// How long since the loop last polled.
    pub fn silent_for(&self) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(self.last_poll_ms.load(Ordering::Acquire)))
    }

    /// Whether work may start a side effect now: the loop polled recently enough that the group still counts
    /// this member, and it is not waiting to learn whether it was dropped.
    pub fn is_live(&self) -> bool {
        !self.suspect.load(Ordering::Acquire)
            && self.now_ms().saturating_sub(self.last_poll_ms.load(Ordering::Acquire)) < self.silence_limit_ms
    }

    /// Waits until [`Liveness::is_live`] may have changed (or a short while: the caller re-checks).
    pub async fn changed(&self) {
        let _ = tokio::time::timeout(Duration::from_millis(250), self.changed.notified()).await;
    }

    fn touch(&self) {
        let now = self.now_ms();
        let before = self.last_poll_ms.swap(now, Ordering::AcqRel);
        if now.saturating_sub(before) >= self.silence_limit_ms {
            self.changed.notify_waiters();
        }
    }

    fn set_suspect(&self, on: bool) {
        self.suspect.store(on, Ordering::Release);
        if !on {
            self.changed.notify_waiters();
        }
    }
}

/// How long before `max.poll.interval.ms` a silent loop's work stops starting: a quarter of it, at most 30 s.
pub fn fence_margin(max_poll: Duration) -> Duration {
    (max_poll / 4).min(Duration::from_secs(30))
}

/// After a silence past `max.poll.interval.ms`, how long the loop waits for librdkafka to report the member
/// dropped before it concludes it is still a member.
const LOST_SIGNAL_WITHIN: Duration = Duration::from_secs(3);

struct Shared {
    marks: Arc<SharedWatermarks>,
    topics: Vec<Arc<str>>,
    /// (topic index, partition) whose watermark moved since the loop last stored offsets, each once: a burst of
    /// completions is one wake-up of the loop and one offsets store per partition, not one per record.
    moved: Mutex<Vec<(usize, i32)>>,
    /// Wakes the loop when `moved` stops being empty.
    wake: Notify,
}

impl Shared {
    fn complete(&self, topic: usize, partition: i32, offset: i64) {
        if self.marks.complete(&self.topics[topic], partition, offset).is_none() {
            return;
        }
        let first = {
            let mut moved = self.moved.lock().unwrap_or_else(|e| e.into_inner());
            let first = moved.is_empty();
            // As many entries as partitions assigned at most: a linear look is cheaper than hashing.
            if !moved.contains(&(topic, partition)) {
                moved.push((topic, partition));
            }
            first
        };
        if first {
            self.wake.notify_one();
        }
    }

    /// The partitions whose watermark moved since the last call.
    fn take_moved(&self, into: &mut Vec<(usize, i32)>) {
        into.clear();
        std::mem::swap(into, &mut *self.moved.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// One record taken into work. [`Done::complete`] once its outcome is durable; dropped without it, the record
/// stays uncommitted (the next owner of the partition redoes it). Either way its budget units are given back.
pub struct Done {
    shared: Arc<Shared>,
    topic: usize,
    partition: i32,
    offset: i64,
    _charge: Option<Charge>,
}

impl Done {
    pub fn topic(&self) -> &str {
        &self.shared.topics[self.topic]
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The record weighs `units` more than the one unit it was taken with (e.g. the tasks of its fan-out).
    pub fn add_units(&mut self, units: usize) {
        if let Some(c) = &mut self._charge {
            c.add(units);
        }
    }

    pub fn complete(self) {
        self.shared.complete(self.topic, self.partition, self.offset);
    }
}

/// Completes records by (topic, partition, offset), for handlers that keep records of their own by that key.
#[derive(Clone)]
pub struct Completer {
    shared: Arc<Shared>,
}

impl Completer {
    /// The record's outcome is durable. The tuple is what such handlers key their records by.
    pub fn send(&self, (topic, partition, offset): (String, i32, i64)) -> Result<(), std::convert::Infallible> {
        if let Some(i) = self.shared.topics.iter().position(|t| **t == *topic) {
            self.shared.complete(i, partition, offset);
        }
        Ok(())
    }
}

/// What a handler may do to the loop while it handles a record or a rebalance.
pub struct Control<'a> {
    name: &'static str,
    consumer: &'a StreamConsumer<RebalanceContext>,
    shared: &'a Arc<Shared>,
    budget: Option<&'a Arc<Budget>>,
}

impl Control<'_> {
    /// For a handler's own per-partition pauses (loops without a budget).
    pub fn consumer(&self) -> &StreamConsumer<RebalanceContext> {
        self.consumer
    }

    pub fn completer(&self) -> Completer {
        Completer { shared: self.shared.clone() }
    }

    /// Budget units in use.
    pub fn in_flight(&self) -> usize {
        self.budget.map_or(0, |b| b.in_use())
    }
}

/// A service's handling of its records.
pub trait Handler {
    /// What [`Handler::wake`] resolves to.
    type Wake;

    /// A record, its offset started. Hand `done` to the work that makes its outcome durable; do not wait here.
    fn record(&mut self, record: &BorrowedMessage<'_>, done: Done, ctl: &Control<'_>);

    /// A rebalance (a delta; see `RebalanceContext`). Revoked partitions' watermarks are already forgotten.
    fn rebalance(&mut self, event: RebalanceEvent, ctl: &Control<'_>);

    /// Work of the handler's own that the loop awaits beside the poll (timers); never resolves by default.
    fn wake(&mut self) -> impl Future<Output = Self::Wake> + Send + '_ {
        std::future::pending()
    }

    /// What [`Handler::wake`] resolved to.
    fn woken(&mut self, _wake: Self::Wake, _ctl: &Control<'_>) {}

    /// Shutting down: called once, before the drain.
    fn stopping(&mut self) {}

    /// Records in flight that the shutdown drain does not wait for (kept by the handler on purpose, like the
    /// retry-scheduler's held records). Only asked of loops without a budget.
    fn parked(&self) -> usize {
        0
    }
}

/// A subscribed group consumer and its loop's state.
pub struct Worker {
    consumer: StreamConsumer<RebalanceContext>,
    rebalances: mpsc::UnboundedReceiver<RebalanceEvent>,
    shared: Arc<Shared>,
    budget: Option<Arc<Budget>>,
    liveness: Arc<Liveness>,
    settings: Settings,
}

impl Worker {
    /// Creates the group consumer and subscribes. With `revoke`, revoked partitions of the first topic are
    /// drained and committed before they go (see [`RevokeDrain`]).
    pub fn subscribe(
        kafka: &KafkaSettings,
        settings: Settings,
        liveness: Arc<Liveness>,
        revoke: Option<Revoke>,
    ) -> Result<Self, KafkaError> {
        let marks = Arc::new(SharedWatermarks::default());
        let (context, rebalances) = match revoke {
            Some(r) => RebalanceContext::with_revoke_drain(
                settings.name,
                RevokeDrain {
                    marks: marks.clone(),
                    topic: settings.topics.first().cloned().unwrap_or_default(),
                    limit: r.limit,
                    release: r.release,
                    shutdown: r.shutdown,
                },
            ),
            None => RebalanceContext::new(settings.name),
        };
        let consumer: StreamConsumer<RebalanceContext> = consumer_config(kafka, &settings)?.create_with_context(context)?;
        let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let shared = Arc::new(Shared {
            marks,
            topics: settings.topics.iter().map(|t| Arc::from(t.as_str())).collect(),
            moved: Mutex::new(Vec::new()),
            wake: Notify::new(),
        });
        let budget = settings.max_in_flight.map(Budget::new);
        Ok(Self { consumer, rebalances, shared, budget, liveness, settings })
    }

    /// Completes records by key (see [`Completer`]).
    pub fn completer(&self) -> Completer {
        Completer { shared: self.shared.clone() }
    }

    /// Runs until `shutdown`, then drains (up to `Settings::drain`), commits what is stored and leaves the group.
    pub async fn run<H: Handler>(mut self, handler: &mut H, shutdown: &CancellationToken) {
        let name = self.settings.name;
        let max_poll = Duration::from_millis(self.liveness.max_poll_ms);
        let tick = (fence_margin(max_poll) / 3).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut paused = false;
        let mut assigned: BTreeSet<(String, i32)> = BTreeSet::new();
        // Until when a loop back from a long silence waits to hear whether it was dropped from its group.
        let mut suspect_until: Option<tokio::time::Instant> = None;
        let live = self.liveness.clone();
        live.touch();
        // Reused: storing offsets allocates nothing per burst but librdkafka's list.
        let mut moved = Vec::new();
        loop {
            if let Some(stall) = &mut self.settings.stall {
                while *stall.borrow_and_update() {
                    tokio::select! {
                        r = stall.changed() => if r.is_err() { break },
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
            // Past the interval without a poll, librdkafka may have dropped the member: nothing starts until that
            // is known (the first polls may still return records fetched before it).
            if suspect_until.is_none() && live.silent_for() >= max_poll {
                live.set_suspect(true);
                suspect_until = Some(tokio::time::Instant::now() + LOST_SIGNAL_WITHIN);
                tracing::warn!(consumer = name, silent_ms = live.silent_for().as_millis() as u64, "the consume loop did not poll for max.poll.interval.ms; nothing starts until the group says whether this member was dropped");
            }
            let budget = self.budget.as_ref();
            let ctl = Control { name, consumer: &self.consumer, shared: &self.shared, budget };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(ev) = self.rebalances.recv() => {
                    apply(ev, handler, &ctl, &mut assigned, paused, self.settings.paused_gauge.as_ref());
                }
                // Completions come in bursts: every partition whose watermark moved meanwhile is stored at once.
                _ = self.shared.wake.notified() => self.store_moved(&mut moved),
                _ = freed(budget, |b| b.resume_level()), if paused => {
                    paused = false;
                    set_paused(&self.consumer, false, name, self.settings.paused_gauge.as_ref());
                }
                // Before the poll, as the loops had it: a backlog of records must not hold back due timers or the
                // mail being sent (each of these is done in a moment, then the poll comes).
                w = handler.wake() => handler.woken(w, &ctl),
                received = polled(&live, self.consumer.recv()) => {
                    let m = match received {
                        Ok(m) => m,
                        Err(KafkaError::MessageConsumption(RDKafkaErrorCode::PollExceeded)) => {
                            // Dropped from the group: every partition is another member's by now.
                            let lost: Vec<(String, i32)> = assigned.iter().cloned().collect();
                            self.consumer.context().release_lost(&lost);
                            while let Ok(ev) = self.rebalances.try_recv() {
                                apply(ev, handler, &ctl, &mut assigned, paused, self.settings.paused_gauge.as_ref());
                            }
                            suspect_until = None;
                            live.set_suspect(false);
                            continue;
                        }
                        // Already logged by the client's error callback; librdkafka reconnects by itself.
                        Err(e) if crate::table::reported_by_client(&e) => {
                            tracing::debug!(consumer = name, error = %e, "broker connectivity");
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(consumer = name, error = %e, "consumer error");
                            continue;
                        }
                    };
                    // An assignment is reported during the poll that returns its first records: apply it first, so
                    // the handler finds the partition's ownership in place.
                    while let Ok(ev) = self.rebalances.try_recv() {
                        apply(ev, handler, &ctl, &mut assigned, paused, self.settings.paused_gauge.as_ref());
                    }
                    let Some(topic) = self.shared.topics.iter().position(|t| **t == *m.topic()) else { continue };
                    let (p, o) = (m.partition(), m.offset());
                    self.shared.marks.start(&self.shared.topics[topic], p, o);
                    // A record fetched before a pause took effect is still taken: skipping it would lose it.
                    let done = Done { shared: self.shared.clone(), topic, partition: p, offset: o, _charge: budget.map(|b| b.take(1)) };
                    handler.record(&m, done, &ctl);
                    if let Some(b) = budget {
                        if !paused && b.is_spent() {
                            paused = true;
                            set_paused(&self.consumer, true, name, self.settings.paused_gauge.as_ref());
                        }
                    }
                }
                _ = sleep_until(suspect_until), if suspect_until.is_some() => {
                    // No word of being dropped: still a member (librdkafka checks the interval once a second).
                    tracing::info!(consumer = name, "still a member of the group after the silence; resuming");
                    suspect_until = None;
                    live.set_suspect(false);
                }
                // Ends the select now and then, so that a fresh poll is made (and counted) even while idle.
                _ = ticks.tick() => {}
            }
        }

        // Drain: let work in flight finish, storing offsets as it completes.
        handler.stopping();
        let deadline = tokio::time::sleep(self.settings.drain);
        tokio::pin!(deadline);
        loop {
            let drained = match &self.budget {
                Some(b) => b.in_use() == 0,
                None => self.shared.marks.total_in_flight() <= handler.parked(),
            };
            if drained {
                break;
            }
            let budget = self.budget.clone();
            tokio::select! {
                _ = &mut deadline => {
                    tracing::warn!(consumer = name, in_flight = self.shared.marks.total_in_flight(), "drain deadline passed; unfinished work stays uncommitted");
                    break;
                }
                _ = self.shared.wake.notified() => self.store_moved(&mut moved),
                _ = freed(budget.as_ref(), |_| 0), if budget.is_some() => {}
            }
        }
        self.store_moved(&mut moved);
        if let Err(e) = self.consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(consumer = name, error = %e, "final commit (nothing stored?)");
        }
        close_consumer(self.consumer, LEAVE_GROUP_WITHIN, name).await;
    }

    /// Stores the committable offset of every partition whose watermark moved, in one call to librdkafka.
    fn store_moved(&self, moved: &mut Vec<(usize, i32)>) {
        self.shared.take_moved(moved);
        if moved.is_empty() {
            return;
        }
        let topics = &self.shared.topics;
        let offsets = self.shared.marks.committable_of(moved.iter().map(|(t, p)| (&*topics[*t], *p)));
        store_all(&self.consumer, &offsets);
    }
}

/// Until at most `level(budget)` units are in use; never without a budget.
async fn freed(budget: Option<&Arc<Budget>>, level: impl Fn(&Budget) -> usize) {
    match budget {
        Some(b) => b.at_most(level(b)).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Polls `recv`, first recording the poll: each new `recv` future's first poll is a librdkafka poll.
async fn polled<F: Future>(live: &Liveness, recv: F) -> F::Output {
    live.touch();
    recv.await
}

fn apply<H: Handler>(
    ev: RebalanceEvent,
    handler: &mut H,
    ctl: &Control<'_>,
    assigned: &mut BTreeSet<(String, i32)>,
    paused: bool,
    gauge: Option<&metrics::Gauge>,
) {
    match &ev {
        RebalanceEvent::Assigned(parts) => {
            assigned.extend(parts.iter().cloned());
            // Newly assigned partitions start unpaused.
            if paused {
                set_paused(ctl.consumer, true, ctl.name, gauge);
            }
        }
        RebalanceEvent::Revoked(parts) => {
            for tp in parts {
                assigned.remove(tp);
                // The next owner reads these again from the last commit.
                ctl.shared.marks.forget(&tp.0, tp.1);
            }
        }
    }
    handler.rebalance(ev, ctl);
}

/// Pauses or resumes fetching from every assigned partition; the consumer is polled all the same.
fn set_paused(consumer: &StreamConsumer<RebalanceContext>, pause: bool, name: &'static str, gauge: Option<&metrics::Gauge>) {
    if let Err(e) = crate::budget::set_paused(consumer, pause) {
        tracing::warn!(consumer = name, error = %e, pause, "pausing or resuming the partitions failed");
    }
    if let Some(g) = gauge {
        g.set(if pause { 1.0 } else { 0.0 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_quarter_of_the_interval_up_to_30_s() {
        assert_eq!(fence_margin(Duration::from_secs(8)), Duration::from_secs(2));
        assert_eq!(fence_margin(Duration::from_secs(300)), Duration::from_secs(30));
    }

    #[test]
    fn a_silence_past_the_limit_closes_the_fence_and_a_poll_opens_it() {
        let live = Liveness::new(Duration::from_millis(40));
        live.touch();
        assert!(live.is_live());
        std::thread::sleep(Duration::from_millis(35));
        assert!(!live.is_live(), "silent past 40 ms - 10 ms");
        live.touch();
        assert!(live.is_live());
        live.set_suspect(true);
        assert!(!live.is_live(), "suspect: possibly dropped from the group");
        live.set_suspect(false);
        assert!(live.is_live());
    }
}
