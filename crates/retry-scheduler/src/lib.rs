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

use hookline_core::model::{DeliveryTask, RetryEnvelope, TaskOrigin};
use hookline_core::subscription::activity;
use hookline_kafka::client::{group_consumer_config, producer};
use hookline_kafka::rebalance::{RebalanceContext, RebalanceEvent};
use hookline_kafka::state::{EndpointStates, StateTables, SubscriptionTable};
use hookline_kafka::table::TableError;
use hookline_kafka::watermark::{store, Watermarks};
use hookline_kafka::{Topics, TIERS};
use hookline_service::traces::Tracer;
use hookline_service::{health, telemetry, Config, Readiness};
use prost::Message as _;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use hookline_kafka::client::Producer as FutureProducer;
use rdkafka::producer::Producer;
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
        let addr = health::serve(config.retry_scheduler.health_addr, readiness.clone(), metrics, config.retry_scheduler.health_http, shutdown.clone()).await?;
        tracing::info!(%addr, "retry-scheduler health endpoints listening");
    }
    let topics = Topics::new(config.kafka.topic_prefix.clone());
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
    let mut parking = parking::Parking::start(
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

    let (context, mut rebalances) = RebalanceContext::new("retry-scheduler");
    let consumer: StreamConsumer<RebalanceContext> =
        group_consumer_config(&config.kafka, &config.retry_scheduler.group_id, &instance)?.create_with_context(context)?;
    let mut inputs: Vec<&str> = TIERS.iter().map(|t| topics.retry(t)).collect();
    inputs.push(topics.held());
    consumer.subscribe(&inputs)?;

    let mut sched = Scheduler {
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
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, i32, i64)>();
    let mut marks = Watermarks::new();
    let held_topic = topics.held();
    // Parked subscriptions are re-checked on this beat: resuming one starts the release of its deliveries within it.
    let mut held_check = tokio::time::interval(Duration::from_millis(500));
    held_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let next_timer = sched.timers.peek().map(|Reverse((at, ..))| *at);
        let sleep_until = next_timer.map_or_else(
            || Instant::now() + Duration::from_secs(3600),
            |at| {
                let left = Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0));
                // A due time centuries away (an old record's) must not overflow the clock: an hour is re-checked.
                Instant::now() + left.min(Duration::from_secs(3600))
            },
        );
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(ev) = rebalances.recv() => {
                match ev {
                    RebalanceEvent::Revoked(parts) => for (t, p) in parts {
                        marks.forget(&t, p);
                        sched.forget(&t, p);
                        if t == held_topic {
                            parking.revoked(p);
                        }
                    },
                    RebalanceEvent::Assigned(parts) => {
                        for (_, p) in parts.iter().filter(|(t, _)| *t == held_topic) {
                            // Stopping: the loop ends at the next turn.
                            let _ = parking.assigned(*p).await;
                        }
                        if !readiness.is_ready() {
                            readiness.set(true);
                            tracing::info!("retry-scheduler ready");
                        }
                    }
                }
            }
            Some((t, p, o)) = done_rx.recv() => {
                if let Some(w) = marks.complete(&t, p, o) {
                    store(&consumer, &t, p, w);
                }
            }
            _ = tokio::time::sleep_until(sleep_until), if next_timer.is_some() => {
                let now = now_ms();
                while let Some(Reverse((at, ..))) = sched.timers.peek() {
                    if *at > now { break; }
                    let Reverse((_, t, p, o)) = sched.timers.pop().expect("peeked");
                    if let Some(Waiting::Tier(env)) = sched.waiting.remove(&(t.clone(), p, o)) {
                        sched.release_tier(&consumer, env, (t, p, o), &done_tx, now);
                    }
                }
            }
            Some(ev) = parking.next_event() => parking.handle(ev),
            _ = held_check.tick() => parking.tick(),
            received = consumer.recv() => {
                let m = match received {
                    Ok(m) => m,
                    Err(e) => { tracing::warn!(error = %e, "retry consumer error"); continue; }
                };
                let (t, p, o) = (m.topic().to_owned(), m.partition(), m.offset());
                marks.start(&t, p, o);
                let payload = m.payload().unwrap_or_default();
                let key = (t.clone(), p, o);
                if t == held_topic {
                    match DeliveryTask::decode(payload) {
                        // Parked by subscription (the record key); a record keyed otherwise goes back to the
                        // dispatcher, which holds it again under its subscription's key.
                        Ok(task) if m.key() != Some(task.subscription_id.as_bytes()) => sched.release_held(task, key, &done_tx),
                        Ok(task) => {
                            let releasable = sched.may_release_held(&task);
                            match parking.on_held(p, o, &task.subscription_id, releasable).await {
                                parking::Held::Release => sched.release_held(task, key, &done_tx),
                                parking::Held::Parked => { let _ = done_tx.send(key); }
                                parking::Held::ParkedOnceWritten(acked) => {
                                    let done = done_tx.clone();
                                    tokio::spawn(async move { if acked.await.is_ok() { let _ = done.send(key); } });
                                }
                                // Stopping: left uncommitted for the next owner.
                                parking::Held::Abandoned => {}
                            }
                        }
                        Err(e) => sched.dead_letter(payload, &e.to_string(), key, &done_tx),
                    }
                } else {
                    match RetryEnvelope::decode(payload) {
                        Ok(env) if env.task.is_some() => {
                            let at = release_at_ms(&env);
                            if at <= now_ms() {
                                sched.release_tier(&consumer, env, key, &done_tx, now_ms());
                            } else {
                                sched.timers.push(Reverse((at, t, p, o)));
                                sched.hold(&consumer, key, Waiting::Tier(env));
                            }
                        }
                        Ok(_) => sched.dead_letter(payload, "retry envelope without a task", key, &done_tx),
                        Err(e) => sched.dead_letter(payload, &e.to_string(), key, &done_tx),
                    }
                }
                metrics::gauge!("hookline_retry_held").set(sched.waiting.len() as f64);
            }
        }
    }

    // Held records stay uncommitted; only finished forwards are stored. Give those a moment to land.
    readiness.set(false);
    let deadline = tokio::time::sleep(Duration::from_millis(config.retry_scheduler.drain_timeout_ms));
    tokio::pin!(deadline);
    while marks.total_in_flight() > sched.waiting.len() {
        tokio::select! {
            _ = &mut deadline => break,
            Some((t, p, o)) = done_rx.recv() => {
                if let Some(w) = marks.complete(&t, p, o) { store(&consumer, &t, p, w); }
            }
        }
    }
    let _ = consumer.commit_consumer_state(CommitMode::Sync);
    hookline_kafka::client::close_consumer(consumer, hookline_kafka::client::LEAVE_GROUP_WITHIN, "retry-scheduler").await;
    let _ = sched.producer.flush(Duration::from_secs(10));
    reader_stop.cancel();
    sched.tracer.flush().await;
    tracing::info!("retry-scheduler stopped");
    Ok(())
}

/// Whether a subscription's held deliveries may go to `deliveries`: it is active again, or deleted (the dispatcher
/// then records them as cancelled).
fn may_release(subs: &SubscriptionTable, states: &EndpointStates, id: &str) -> bool {
    match subs.get(id) {
        None => true,
        Some(e) => activity(&e.sub, states.get(id).as_ref()).is_active(),
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
                let env = RetryEnvelope { task: Some(task), enqueued_at_ms: now, tier_delay_ms: i64::try_from(tier.delay_ms).unwrap_or(i64::MAX) };
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
        metrics::counter!("hookline_dead_lettered_total", "reason" => hookline_core::vocabulary::DeadLetterReason::InvalidTask.as_str()).increment(1);
        let (value, headers) = self.dlq.record(&dl);
        self.forward_with_headers(self.topics.dlq(), String::new(), value, Some(headers), key, done);
    }

    /// Produces in the background; the offset completes when the broker acknowledged it.
    fn forward(&self, topic: &str, key: String, payload: Vec<u8>, at: (String, i32, i64), done: &mpsc::UnboundedSender<(String, i32, i64)>) {
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
