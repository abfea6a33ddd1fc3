//! The retry-scheduler: consumes the retry tier topics and the `held` topic. A tier record is kept in memory until
//! min(enqueued + tier delay, due) — the partition is paused while too many are held, the poll loop keeps
//! running — then re-routed to a shorter tier if time remains, or forwarded to `deliveries`. A held delivery is
//! parked until its subscription is active again, without being kept in memory ([`parking`]). Offsets are stored
//! only after the forward (or the parked position) is acknowledged.

pub mod parking;
pub mod tiers;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt as _};
use hookline_core::model::{DeliveryTask, RetryEnvelope, TaskOrigin};
use hookline_kafka::client::producer;
use hookline_kafka::client::Producer as FutureProducer;
use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::state::{EndpointStates, StateTables, SubscriptionTable};
use hookline_kafka::table::TableError;
use hookline_kafka::worker::{self, Control, Done, Handler, Liveness, Worker};
use hookline_kafka::{Topics, TIERS};
use hookline_service::traces::Tracer;
use hookline_service::{health, telemetry, Config, Readiness};
use prost::Message as _;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::tiers::{release_at_ms, route, Route};

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("health endpoint: {0}")]
    Health(#[from] std::io::Error),
    #[error(transparent)]
    Permissions(#[from] hookline_kafka::acl_check::AclCheckError),
}

#[derive(Clone, Default)]
pub struct Options {
    pub serve_health: bool,
    pub instance: Option<String>,
    /// Shared with the caller (dev mode waits on it): set at the group's first assignment.
    pub readiness: Readiness,
}

use hookline_service::now_ms;

type Tp = (String, i32);

/// A record waiting in memory.
enum Waiting {
    Tier(RetryEnvelope),
}

struct Scheduler {
    topics: Topics,
    producer: FutureProducer,
    subs: SubscriptionTable,
    states: EndpointStates,
    shutdown: CancellationToken,
    max_held: usize,
    /// (release time, topic, partition, offset) of tier records.
    timers: BinaryHeap<Reverse<(i64, String, i32, i64)>>,
    waiting: HashMap<(String, i32, i64), Waiting>,
    held_count: HashMap<Tp, usize>,
    paused: HashMap<Tp, bool>,
    /// Off unless `telemetry.otlp_endpoint` is set (then: a span per release).
    tracer: Tracer,
    /// How dead letters of unreadable tasks are written (`dlq.format`, within the record size).
    dlq: hookline_kafka::dead_letters::DeadLetterWriter,
}

pub async fn run(config: Config, shutdown: CancellationToken, options: Options) -> Result<(), SchedulerError> {
    let instance = options.instance.clone().unwrap_or_else(|| "hookline-retry-scheduler".into());
    let metrics = telemetry::metrics_handle();
    let readiness = options.readiness.clone();
    if options.serve_health {
        let addr = health::serve(
            config.retry_scheduler.health_addr,
            readiness.clone(),
            metrics,
            config.retry_scheduler.health_http,
            shutdown.clone(),
        )
        .await?;
        tracing::info!(%addr, "retry-scheduler health endpoints listening");
    }
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let needs = hookline_kafka::acl_check::retry_scheduler_needs(&topics, &config.retry_scheduler.group_id);
    hookline_kafka::acl_check::at_start(&config.kafka, &instance, &needs).await?;
    let reader_stop = CancellationToken::new();
    // It never signs, so it keeps no secret and needs no master key.
    let tables =
        StateTables::follow(&config.kafka, &topics, &instance, hookline_kafka::state::SecretMode::Drop, reader_stop.clone()).await?;
    tokio::select! {
        _ = tables.caught_up() => {}
        _ = shutdown.cancelled() => { reader_stop.cancel(); return Ok(()) }
    }
    let StateTables { subs, states, .. } = tables;
    let producer = producer(&config.kafka, &instance)?;
    let tracer = Tracer::new(&config.telemetry, "retry-scheduler");
    let releasable: parking::Releasable = {
        let (subs, states) = (subs.clone(), states.clone());
        Arc::new(move |id: &str| may_release(&subs, &states, id))
    };
    let parking = parking::Parking::start(
        &config.kafka,
        &topics,
        &instance,
        producer.clone(),
        releasable,
        tracer.clone(),
        shutdown.clone(),
        reader_stop.clone(),
    )
    .await?;
    tokio::select! {
        _ = parking.caught_up() => {}
        _ = shutdown.cancelled() => { reader_stop.cancel(); return Ok(()) }
    }

    let mut inputs: Vec<String> = TIERS.iter().map(|t| topics.retry(t).to_owned()).collect();
    inputs.push(topics.held().to_owned());
    let settings = worker::Settings {
        name: "retry-scheduler",
        group_id: config.retry_scheduler.group_id.clone(),
        client_id: instance.clone(),
        topics: inputs,
        // Tier records pause their own partitions (see `Scheduler::hold`); a `held` partition pauses while its
        // parked positions are read.
        max_in_flight: None,
        paused_gauge: None,
        // Held records stay uncommitted; only finished forwards are stored. Give those a moment to land.
        drain: Duration::from_millis(config.retry_scheduler.drain_timeout_ms),
        stall: None,
        prefetch_kbytes: None,
    };
    let liveness = Liveness::new(Duration::from_millis(config.kafka.max_poll_interval_ms));
    let worker = Worker::subscribe(&config.kafka, settings, liveness, None)?;

    let sched = Scheduler {
        topics: topics.clone(),
        producer,
        subs,
        states,
        shutdown: shutdown.clone(),
        max_held: config.retry_scheduler.max_held_per_partition,
        timers: BinaryHeap::new(),
        waiting: HashMap::new(),
        held_count: HashMap::new(),
        paused: HashMap::new(),
        tracer,
        dlq: hookline_kafka::dead_letters::DeadLetterWriter::new(config.dlq.format, &config.kafka),
    };
    // Forwards complete by (topic, partition, offset), which is how the scheduler keys what it holds.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, i32, i64)>();
    let completer = worker.completer();
    tokio::spawn(async move {
        while let Some(at) = done_rx.recv().await {
            let _ = completer.send(at);
        }
    });
    // Parked subscriptions are re-checked on this beat: resuming one starts the release of its deliveries within it.
    let mut held_check = tokio::time::interval(Duration::from_millis(500));
    held_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut handler = Retries {
        held_topic: topics.held().to_owned(),
        sched,
        done_tx,
        held_check,
        readiness,
        parking,
        syncs: FuturesUnordered::new(),
        waiting_for_positions: HashMap::new(),
    };
    worker.run(&mut handler, &shutdown).await;
    let _ = handler.sched.producer.flush(Duration::from_secs(10));
    reader_stop.cancel();
    handler.sched.tracer.flush().await;
    tracing::info!("retry-scheduler stopped");
    Ok(())
}

/// The retry-scheduler's consume loop (see `hookline_kafka::worker`) around its [`Scheduler`].
struct Retries {
    sched: Scheduler,
    done_tx: mpsc::UnboundedSender<(String, i32, i64)>,
    held_topic: String,
    held_check: tokio::time::Interval,
    readiness: Readiness,
    parking: parking::Parking,
    /// Reads of newly assigned `held` partitions' parked positions, awaited beside the poll.
    syncs: FuturesUnordered<BoxFuture<'static, parking::Synced>>,
    /// Records of `held` partitions whose positions are still being read (the partition is paused meanwhile, so
    /// this holds at most what was already fetched), in order.
    waiting_for_positions: HashMap<i32, Vec<(DeliveryTask, (String, i32, i64))>>,
}

/// What woke the loop besides a record.
enum Wake {
    /// The earliest tier record is due.
    Timer,
    /// Time to re-check the parked subscriptions.
    HeldCheck,
    /// A release of parked deliveries ended or checkpointed.
    Release(parking::ReleaseEvent),
    /// A `held` partition's parked positions were read.
    Synced(parking::Synced),
}

impl Handler for Retries {
    type Wake = Wake;

    fn rebalance(&mut self, ev: RebalanceEvent, ctl: &Control<'_>) {
        match ev {
            RebalanceEvent::Revoked(parts) => {
                for (t, p) in parts {
                    self.sched.forget(&t, p);
                    if t == self.held_topic {
                        self.parking.revoked(p);
                        // Left uncommitted: the partition's next owner reads them again.
                        self.waiting_for_positions.remove(&p);
                    }
                }
            }
            RebalanceEvent::Assigned(parts) => {
                // A held partition's records wait until its parked positions are read (the loop keeps polling).
                for (_, p) in parts.iter().filter(|(t, _)| *t == self.held_topic) {
                    if let Some(read) = self.parking.assigned(*p) {
                        set_partition_paused(ctl, &self.held_topic, *p, true);
                        self.syncs.push(read);
                    }
                }
                if !self.readiness.is_ready() {
                    self.readiness.set(true);
                    tracing::info!("retry-scheduler ready");
                }
            }
        }
    }

    fn record(&mut self, m: &BorrowedMessage<'_>, _: Done, ctl: &Control<'_>) {
        let (sched, done_tx, consumer) = (&mut self.sched, &self.done_tx, ctl.consumer());
        let (t, p, o) = (m.topic().to_owned(), m.partition(), m.offset());
        let payload = m.payload().unwrap_or_default();
        let key = (t.clone(), p, o);
        if t == self.held_topic {
            match DeliveryTask::decode(payload) {
                // Parked by subscription (the record key); a record keyed otherwise goes back to the
                // dispatcher, which holds it again under its subscription's key.
                Ok(task) if m.key() != Some(task.subscription_id.as_bytes()) => sched.release_held(task, key, done_tx),
                Ok(task) => self.on_held(task, key, p, ctl),
                Err(e) => sched.dead_letter(payload, &e.to_string(), key, done_tx),
            }
            return;
        } else {
            match RetryEnvelope::decode(payload) {
                Ok(env) if env.task.is_some() => {
                    let at = release_at_ms(&env);
                    if at <= now_ms() {
                        sched.release_tier(consumer, env, key, done_tx, now_ms());
                    } else {
                        sched.timers.push(Reverse((at, t, p, o)));
                        sched.hold(consumer, key, Waiting::Tier(env));
                    }
                }
                Ok(_) => sched.dead_letter(payload, "retry envelope without a task", key, done_tx),
                Err(e) => sched.dead_letter(payload, &e.to_string(), key, done_tx),
            }
        }
        metrics::gauge!("hookline_retry_held").set(sched.waiting.len() as f64);
    }

    fn wake(&mut self) -> impl std::future::Future<Output = Wake> + Send + '_ {
        let next_timer = self.sched.timers.peek().map(|Reverse((at, ..))| *at);
        let sleep_until = next_timer.map_or_else(
            || Instant::now() + Duration::from_secs(3600),
            |at| {
                let left = Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0));
                // A due time centuries away (an old record's) must not overflow the clock: an hour is re-checked.
                Instant::now() + left.min(Duration::from_secs(3600))
            },
        );
        let held_check = &mut self.held_check;
        let parking = &mut self.parking;
        let reading = !self.syncs.is_empty();
        let syncs = &mut self.syncs;
        async move {
            tokio::select! {
                biased;
                Some(read) = syncs.next(), if reading => Wake::Synced(read),
                Some(ev) = parking.next_event() => Wake::Release(ev),
                _ = tokio::time::sleep_until(sleep_until), if next_timer.is_some() => Wake::Timer,
                _ = held_check.tick() => Wake::HeldCheck,
            }
        }
    }

    fn woken(&mut self, wake: Wake, ctl: &Control<'_>) {
        let (sched, done_tx, consumer) = (&mut self.sched, &self.done_tx, ctl.consumer());
        match wake {
            Wake::Timer => {
                let now = now_ms();
                while let Some(Reverse((at, ..))) = sched.timers.peek() {
                    if *at > now {
                        break;
                    }
                    let Reverse((_, t, p, o)) = sched.timers.pop().expect("peeked");
                    if let Some(Waiting::Tier(env)) = sched.waiting.remove(&(t.clone(), p, o)) {
                        sched.release_tier(consumer, env, (t, p, o), done_tx, now);
                    }
                }
            }
            Wake::HeldCheck => self.parking.tick(),
            Wake::Release(ev) => self.parking.handle(ev),
            Wake::Synced(read) => {
                let partition = read.partition();
                if self.parking.synced(read) {
                    // The records that came meanwhile, in order, then the rest of the partition.
                    for (task, key) in self.waiting_for_positions.remove(&partition).unwrap_or_default() {
                        self.on_held(task, key, partition, ctl);
                    }
                    set_partition_paused(ctl, &self.held_topic, partition, false);
                }
            }
        }
    }

    fn stopping(&mut self) {
        self.readiness.set(false);
    }

    /// Tier records waiting for their time, and held records waiting for their partition's positions, stay
    /// uncommitted: the drain waits only for forwards.
    fn parked(&self) -> usize {
        self.sched.waiting.len() + self.waiting_for_positions.values().map(Vec::len).sum::<usize>()
    }
}

impl Retries {
    /// A held delivery keyed by its subscription: released, parked behind its subscription's position, or kept
    /// until its partition's positions are read.
    fn on_held(&mut self, task: DeliveryTask, key: (String, i32, i64), partition: i32, ctl: &Control<'_>) {
        let releasable = self.sched.may_release_held(&task);
        match self.parking.on_held(partition, key.2, &task.subscription_id, releasable) {
            parking::Held::Release => self.sched.release_held(task, key, &self.done_tx),
            parking::Held::Parked => {
                let _ = self.done_tx.send(key);
            }
            parking::Held::ParkedOnceWritten(acked) => {
                let done = self.done_tx.clone();
                tokio::spawn(async move {
                    if acked.await.is_ok() {
                        let _ = done.send(key);
                    }
                });
            }
            // Revoked since it was fetched: left uncommitted for the next owner.
            parking::Held::Abandoned => {}
            parking::Held::Wait => {
                self.waiting_for_positions.entry(partition).or_default().push((task, key));
                if let Some(read) = self.parking.sync(partition) {
                    set_partition_paused(ctl, &self.held_topic, partition, true);
                    self.syncs.push(read);
                }
            }
        }
    }
}

/// Pauses or resumes fetching one partition (the consumer is polled all the same).
fn set_partition_paused(ctl: &Control<'_>, topic: &str, partition: i32, pause: bool) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let r = if pause { ctl.consumer().pause(&tpl) } else { ctl.consumer().resume(&tpl) };
    if let Err(e) = r {
        tracing::warn!(topic, partition, pause, error = %e, "pausing or resuming a partition failed");
    }
}

/// Whether a subscription's held deliveries may go to `deliveries`: it is active again, or deleted (the dispatcher
/// then records them as cancelled).
fn may_release(subs: &SubscriptionTable, states: &EndpointStates, id: &str) -> bool {
    match subs.get(id) {
        None => true,
        Some(e) => e.sub.activity(states.get(id).as_ref()).is_active(),
    }
}

impl Scheduler {
    fn may_release_held(&self, task: &DeliveryTask) -> bool {
        may_release(&self.subs, &self.states, &task.subscription_id)
    }

    fn hold<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(&mut self, consumer: &C, key: (String, i32, i64), w: Waiting) {
        let tp = (key.0.clone(), key.1);
        self.waiting.insert(key, w);
        let n = self.held_count.entry(tp.clone()).or_default();
        *n += 1;
        if *n >= self.max_held && !self.paused.get(&tp).copied().unwrap_or(false) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&tp.0, tp.1);
            if consumer.pause(&tpl).is_ok() {
                self.paused.insert(tp, true);
            }
        }
    }

    fn unhold<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(&mut self, consumer: &C, tp: Tp) {
        let n = self.held_count.entry(tp.clone()).or_default();
        *n = n.saturating_sub(1);
        if *n < self.max_held && self.paused.get(&tp).copied().unwrap_or(false) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&tp.0, tp.1);
            if consumer.resume(&tpl).is_ok() {
                self.paused.insert(tp, false);
            }
        }
    }

    fn forget(&mut self, topic: &str, partition: i32) {
        self.waiting.retain(|(t, p, _), _| !(t == topic && *p == partition));
        self.timers.retain(|Reverse((_, t, p, _))| !(t == topic && *p == partition));
        self.held_count.remove(&(topic.to_owned(), partition));
        self.paused.remove(&(topic.to_owned(), partition));
    }

    fn release_tier<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
        &mut self,
        consumer: &C,
        env: RetryEnvelope,
        key: (String, i32, i64),
        done: &mpsc::UnboundedSender<(String, i32, i64)>,
        now: i64,
    ) {
        self.unhold(consumer, (key.0.clone(), key.1));
        let mut task = env.task.unwrap_or_default();
        let sub = task.subscription_id.clone();
        let (topic, payload) = match route(task.due_at_ms, now) {
            Route::Deliver => {
                self.tracer.retry_hold(&task, env.enqueued_at_ms, env.tier_delay_ms, "deliveries", now);
                task.origin = TaskOrigin::Retry as i32;
                (self.topics.deliveries(), task.encode_to_vec())
            }
            Route::Tier(tier) => {
                self.tracer.retry_hold(&task, env.enqueued_at_ms, env.tier_delay_ms, tier.name, now);
                metrics::counter!("hookline_retry_rerouted_total", "tier" => tier.name).increment(1);
                let env = RetryEnvelope {
                    task: Some(task),
                    enqueued_at_ms: now,
                    tier_delay_ms: i64::try_from(tier.delay_ms).unwrap_or(i64::MAX),
                };
                (self.topics.retry(tier), env.encode_to_vec())
            }
        };
        self.forward(topic, sub, payload, key, done);
    }

    fn release_held(&mut self, mut task: DeliveryTask, key: (String, i32, i64), done: &mpsc::UnboundedSender<(String, i32, i64)>) {
        task.origin = TaskOrigin::Held as i32;
        let sub = task.subscription_id.clone();
        metrics::counter!("hookline_held_released_total").increment(1);
        self.tracer.held_release(&task);
        self.forward(self.topics.deliveries(), sub, task.encode_to_vec(), key, done);
    }

    fn dead_letter(&self, payload: &[u8], detail: &str, key: (String, i32, i64), done: &mpsc::UnboundedSender<(String, i32, i64)>) {
        let dl = hookline_core::model::DeadLetter {
            reason: hookline_core::vocabulary::DeadLetterReason::InvalidTask.as_str().into(),
            detail: detail.to_owned(),
            raw: payload.to_vec().into(),
            source_topic: key.0.clone(),
            source_partition: key.1,
            source_offset: key.2,
            at_ms: now_ms(),
            ..Default::default()
        };
        metrics::counter!("hookline_dead_lettered_total", "reason" => hookline_core::vocabulary::DeadLetterReason::InvalidTask.as_str())
            .increment(1);
        let (value, headers) = self.dlq.record(&dl);
        self.forward_with_headers(self.topics.dlq(), String::new(), value, Some(headers), key, done);
    }

    /// Produces in the background; the offset completes when the broker acknowledged it.
    fn forward(
        &self,
        topic: &str,
        key: String,
        payload: Vec<u8>,
        at: (String, i32, i64),
        done: &mpsc::UnboundedSender<(String, i32, i64)>,
    ) {
        self.forward_with_headers(topic, key, payload, None, at, done);
    }

    fn forward_with_headers(
        &self,
        topic: &str,
        key: String,
        payload: Vec<u8>,
        headers: Option<rdkafka::message::OwnedHeaders>,
        at: (String, i32, i64),
        done: &mpsc::UnboundedSender<(String, i32, i64)>,
    ) {
        let topic = topic.to_owned();
        let producer = self.producer.clone();
        let shutdown = self.shutdown.clone();
        let done = done.clone();
        let producer = Arc::new(producer);
        tokio::spawn(async move {
            // Shutting down first: the record stays uncommitted and is forwarded by the next owner.
            if hookline_kafka::produce::send_until_acked(&producer, &topic, &key, &payload, headers.as_ref(), &shutdown).await.is_ok() {
                let _ = done.send(at);
            }
        });
    }
}
