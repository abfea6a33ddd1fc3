//! The dispatcher: consumes `deliveries`, sends each task to its endpoint under its subscription's policy, and
//! produces the outcome (attempt record; retry on a tier, or dead letter; endpoint state; ops events).
//!
//! Records of a partition are dispatched concurrently and complete out of order; an offset is stored only when
//! every record below it has its outcome durably produced (the contiguous completed watermark).

mod breakers;
pub mod connector;
mod deliver;
mod forget;
mod inline;
pub mod lanes;
mod leases;
mod limits;
mod meters;
mod ordering;
mod outcomes;
mod rate;
mod records;
pub mod sender;
mod shadowed;
mod stalls;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use hookline_core::model::DeliveryTask;
use hookline_core::vocabulary::DeadLetterReason;
use hookline_kafka::client::producer;
use hookline_kafka::client::Producer as KafkaProducer;
use hookline_kafka::produce;
use hookline_kafka::producer::DeliveryFuture;
use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::state::{EndpointStates, SecretMode, StateTables, SubscriptionTable, FENCE_KEY};
use hookline_kafka::table::{TableError, TableHandle};
use hookline_kafka::worker::{self, Control, Done, Handler, Liveness, Revoke, Worker};
use hookline_kafka::Topics;
use hookline_service::{health, telemetry, Config, Readiness};
use prost::Message as _;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::FutureRecord;
use rdkafka::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::connector::{Resolve, SystemResolver};
use crate::deliver::Aborted;
use crate::lanes::{Lanes, Run};
use crate::sender::Sender;

#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("health endpoint: {0}")]
    Health(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] hookline_service::config::ConfigError),
    #[error(transparent)]
    Secrets(#[from] hookline_kafka::state::SecretsUnreadable),
    #[error(transparent)]
    Permissions(#[from] hookline_kafka::acl_check::AclCheckError),
}

/// Knobs that are not configuration: what tests and dev mode swap in.
#[derive(Clone, Default)]
pub struct Options {
    /// DNS for the egress guard; the system resolver when `None`.
    pub resolver: Option<Arc<dyn Resolve>>,
    /// Serve /metrics /healthz /readyz (off when several services share one process and port).
    pub serve_health: bool,
    /// A name for logs and client ids (several dispatchers may run in one process in tests).
    pub instance: Option<String>,
    /// Shared with the caller (dev mode waits on it): set once the group has assigned partitions and their state
    /// is synced, when a delivery taken now is sent at once.
    pub readiness: Readiness,
    /// Receives a copy of each rebalance (the partitions assigned or revoked, a delta) once the dispatcher applied
    /// it: tests of who owns what.
    pub rebalances: Option<mpsc::UnboundedSender<RebalanceEvent>>,
    /// Test only, off by default: while it reads `true`, the consume loop stops polling (a stuck loop or a frozen
    /// process), so that tests can watch a member overstay `kafka.max_poll_interval_ms`.
    pub stall_polling: Option<tokio::sync::watch::Receiver<bool>>,
}

pub(crate) struct Ctx {
    pub topics: Topics,
    pub producer: KafkaProducer,
    pub subs: SubscriptionTable,
    pub states: EndpointStates,
    pub lanes: Arc<Lanes>,
    pub leases: leases::Leases,
    pub outcomes: Arc<outcomes::OutcomeLedger>,
    pub stalls: Arc<stalls::Stalls>,
    /// Per-endpoint rate limits (subscriptions with `rate_limit_per_s` or a policy `[rate_limit]`).
    pub rates: rate::Rates,
    pub breakers: breakers::Breakers,
    pub limits: limits::Limits,
    /// Key gates of ordered subscriptions (`ordering.rs`).
    pub ordering: ordering::Gates,
    pub kafka: hookline_kafka::KafkaSettings,
    pub sender: Sender,
    pub shutdown: CancellationToken,
    /// Off unless `telemetry.otlp_endpoint` is set (then: a span per try, `traceparent` on the request).
    pub tracer: hookline_service::traces::Tracer,
    /// How dead letters are written (`dlq.format`, within the record size).
    pub dlq: hookline_kafka::dead_letters::DeadLetterWriter,
    /// When the consume loop last polled: no send starts once it has been silent near `max.poll.interval.ms`.
    pub liveness: Arc<Liveness>,
    /// The per-delivery metrics' handles.
    pub meters: meters::Meters,
    /// Writes the records that conclude attempts, settling each delivery where its acknowledgement arrives.
    pub settler: produce::Settler,
}

impl Ctx {
    /// Produces until acknowledged. librdkafka already retries for `delivery.timeout.ms`; past that the broker is
    /// really unavailable, and the record is retried here until it lands or the process shuts down (then the
    /// input offset stays uncommitted and the task is redone by the next owner).
    ///
    /// The produce futures are boxed: a delivery's future would otherwise carry the largest of them inline (several
    /// KiB) for its whole life, also while it only waits for the endpoint's answer.
    pub fn produce<'a>(&'a self, topic: &'a str, key: &'a str, msg: &impl prost::Message) -> BoxFuture<'a, Result<(), Aborted>> {
        self.produce_encoded(topic, key, msg.encode_to_vec())
    }

    /// [`Ctx::produce`] of a record already encoded.
    pub fn produce_encoded<'a>(&'a self, topic: &'a str, key: &'a str, payload: Vec<u8>) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move { self.produce_bytes(topic, key, &payload, None).await })
    }

    /// Writes a dead letter to `dlq` in the configured format, with its headers, until acknowledged.
    pub fn produce_dead_letter<'a>(&'a self, key: &'a str, dl: &hookline_core::model::DeadLetter) -> BoxFuture<'a, Result<(), Aborted>> {
        let (payload, headers) = self.dlq.record(dl);
        Box::pin(async move { self.produce_bytes(self.topics.dlq(), key, &payload, Some(&headers)).await })
    }

    async fn produce_bytes(
        &self,
        topic: &str,
        key: &str,
        payload: &[u8],
        headers: Option<&rdkafka::message::OwnedHeaders>,
    ) -> Result<(), Aborted> {
        let _write = self.stalls.write();
        produce::send_until_acked(&self.producer, topic, key, payload, headers, &self.shutdown).await.map_err(|_| Aborted)?;
        self.stalls.acked();
        Ok(())
    }

    /// Writes (or with `None`, deletes) a record on an explicit partition, until acknowledged.
    pub fn produce_to_partition<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        key: &'a str,
        payload: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            let _write = self.stalls.write();
            produce::send_to_partition_until_acked(&self.producer, topic, partition, key, payload, &self.shutdown)
                .await
                .map_err(|_| Aborted)?;
            self.stalls.acked();
            Ok(())
        })
    }

    /// Writes an attempt's last record without waiting for it: its acknowledgement, on the producer's polling
    /// thread, concludes the attempt (`RunGuard::concluded`) and completes the delivery's input offset (`done`),
    /// so no task waits for it and none is woken. A record given up on is written again until acknowledged, and a
    /// shutdown meanwhile leaves `done` incomplete (`produce::Settler`): the partition's next owner redoes the
    /// delivery, which its claim then finds concluded or not.
    pub fn settle(&self, last: deliver::LastWrite, done: Done) {
        let write = self.stalls.write();
        let run = last.run;
        self.settler.send(self.topics.attempts(), &last.record.key, &last.record.payload, move || {
            write.acked();
            run.concluded(now_ms());
            done.complete();
        });
    }

    /// Writes an attempt's last record and waits for its acknowledgement; then the attempt is concluded.
    pub async fn write_last(&self, last: deliver::LastWrite) -> Result<(), Aborted> {
        self.produce_bytes(self.topics.attempts(), &last.record.key, &last.record.payload, None).await?;
        last.run.concluded(now_ms());
        Ok(())
    }

    /// Enqueues without waiting, preserving order with other enqueues to the same partition.
    pub fn enqueue(&self, topic: &str, key: &str, payload: &[u8]) -> Option<DeliveryFuture> {
        self.producer.send_result(FutureRecord::to(topic).key(key).payload(payload)).ok()
    }

    /// Waits for an enqueued record; falls back to a reliable produce if it could not be enqueued or failed.
    pub fn await_enqueued<'a>(
        &'a self,
        f: Option<DeliveryFuture>,
        topic: &'a str,
        key: &'a str,
        payload: &'a [u8],
    ) -> BoxFuture<'a, Result<(), Aborted>> {
        Box::pin(async move {
            if let Some(f) = f {
                let _write = self.stalls.write();
                if let Ok(Ok(_)) = f.await {
                    self.stalls.acked();
                    return Ok(());
                }
            }
            self.produce_bytes(topic, key, payload, None).await
        })
    }
}

pub(crate) use hookline_service::now_ms;

/// How much of `deliveries` librdkafka fetches ahead of the consume loop, in KiB. Its default (64 MiB) let it hold
/// every task of a burst at once, in decompression buffers about 2.5× the records' size (30 MB with 10,000 tasks of
/// ~1.2 KB fetched ahead in `bench memory`), before the loop took them; freed once taken, that memory stays in the
/// process's RSS (glibc's arena of librdkafka's thread keeps it). The loop takes records as fast as it polls (a
/// saturated dispatcher pauses its partitions instead), so a few hundred milliseconds of deliveries ahead is enough.
/// `kafka.properties` may set `queued.max.messages.kbytes` instead.
const PREFETCH_KBYTES: u32 = 4 * 1024;

/// A lane at its depth that would need longer than this to drain counts as stuck (see `Lanes::stuck_for`).
const STUCK_AFTER: Duration = Duration::from_secs(5);

/// Runs a dispatcher until `shutdown`, then drains: in-flight deliveries get `dispatcher.drain_timeout_ms` to
/// finish; what does not finish stays uncommitted and is redelivered by the partition's next owner.
pub async fn run(config: Config, shutdown: CancellationToken, options: Options) -> Result<(), DispatcherError> {
    let metrics = telemetry::metrics_handle();
    let readiness = options.readiness.clone();
    let instance = options.instance.clone().unwrap_or_else(|| "hookline-dispatcher".into());
    if options.serve_health {
        let addr =
            health::serve(config.dispatcher.health_addr, readiness.clone(), metrics, config.dispatcher.health_http, shutdown.clone())
                .await?;
        tracing::info!(%addr, "dispatcher health endpoints listening");
    }
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let kafka = &config.kafka;
    // A principal without what the dispatcher does stops it here, the lacking ACLs named.
    hookline_kafka::acl_check::at_start(
        kafka,
        &instance,
        &hookline_kafka::acl_check::dispatcher_needs(&topics, &config.dispatcher.group_id),
    )
    .await?;
    let reader_stop = CancellationToken::new();

    // The master keys open the signing secrets; a record that does not open stops the dispatcher here.
    let keyring = Arc::new(config.secrets.keyring()?);
    let tables = StateTables::follow(kafka, &topics, &instance, SecretMode::Open(keyring), reader_stop.clone()).await?;
    tokio::select! {
        _ = tables.caught_up() => {}
        _ = shutdown.cancelled() => { reader_stop.cancel(); return Ok(()) }
    }
    if let Err(e) = tables.check_secrets() {
        reader_stop.cancel();
        return Err(e.into());
    }
    let StateTables { subs, states, states_reader, .. } = tables;
    tracing::info!(subscriptions = subs.len(), "dispatcher state loaded");

    // Loudly, at start: an allow-list makes non-public addresses reachable.
    if let Ok(guard) = hookline_core::egress::EgressGuard::new(&config.egress, &Default::default()) {
        for w in guard.startup_warnings() {
            tracing::warn!(target: "hookline::egress_allow", "{w}");
        }
    }
    let resolver = options.resolver.clone().unwrap_or_else(|| Arc::new(SystemResolver));
    let producer = producer(kafka, &instance)?;
    let ctx = Arc::new(Ctx {
        topics: topics.clone(),
        settler: produce::Settler::new(&producer, shutdown.clone()),
        producer,
        subs,
        states: states.clone(),
        lanes: Lanes::new(config.dispatcher.per_subscription_concurrency),
        leases: leases::Leases::default(),
        outcomes: outcomes::OutcomeLedger::new(config.dispatcher.dedupe_window_ms, config.dispatcher.dedupe_max_entries),
        stalls: stalls::Stalls::new(),
        rates: rate::Rates::default(),
        breakers: breakers::Breakers::default(),
        limits: limits::Limits::default(),
        ordering: ordering::Gates::new(states_reader.clone()),
        kafka: kafka.clone(),
        sender: Sender::new(config.egress.clone(), resolver),
        shutdown: shutdown.clone(),
        tracer: hookline_service::traces::Tracer::new(&config.telemetry, "dispatcher"),
        dlq: hookline_kafka::dead_letters::DeadLetterWriter::new(config.dlq.format, &config.kafka),
        liveness: Liveness::new(Duration::from_millis(kafka.max_poll_interval_ms)),
        meters: meters::Meters::default(),
    });

    tokio::spawn(ctx.stalls.clone().detect_freezes(reader_stop.clone()));
    tokio::spawn(forget::forget_deleted_every(ctx.clone(), forget::SWEEP_EVERY, reader_stop.clone()));
    tokio::spawn(shadowed::rewrite_shadowed(ctx.clone(), reader_stop.clone()));
    let deliveries = topics.deliveries();
    let revoke = Revoke {
        limit: Duration::from_millis(config.dispatcher.revoke_drain_ms),
        release: Box::new({
            let ctx = ctx.clone();
            move |p| {
                ctx.states.revoke(p);
                ctx.leases.forget_partition(p);
                ctx.ordering.forget_partition(p);
            }
        }),
        shutdown: shutdown.clone(),
    };
    let settings = worker::Settings {
        name: "dispatcher",
        group_id: config.dispatcher.group_id.clone(),
        client_id: instance.clone(),
        topics: vec![deliveries.to_owned()],
        // Saturated, the dispatcher pauses its partitions and keeps polling (see `Budget`).
        max_in_flight: Some(config.dispatcher.max_in_flight),
        paused_gauge: Some(metrics::gauge!("hookline_dispatcher_paused")),
        drain: Duration::from_millis(config.dispatcher.drain_timeout_ms),
        stall: options.stall_polling.clone(),
        prefetch_kbytes: Some(PREFETCH_KBYTES),
    };
    let worker = Worker::subscribe(kafka, settings, ctx.liveness.clone(), Some(revoke))?;
    let mut handler = Dispatch {
        ctx: ctx.clone(),
        reader: states_reader,
        readiness: readiness.clone(),
        observer: options.rebalances.clone(),
        source: deliveries.into(),
        max_queued: config.dispatcher.max_queued_per_subscription,
    };
    // At shutdown in-flight deliveries get `dispatcher.drain_timeout_ms` to finish (their records are produced).
    // The loop stays on the caller's task: moved onto a runtime worker (`tokio::spawn`) it measured no better
    // here (docs/benchmarks.md, "Dispatcher hand-offs and locks").
    worker.run(&mut handler, &shutdown).await;
    let _ = ctx.producer.flush(Duration::from_secs(10));
    reader_stop.cancel();
    ctx.tracer.flush().await;
    tracing::info!("dispatcher stopped");
    Ok(())
}

/// The dispatcher's handling of `deliveries` records (see `hookline_kafka::worker`).
struct Dispatch {
    ctx: Arc<Ctx>,
    reader: TableHandle,
    readiness: Readiness,
    observer: Option<mpsc::UnboundedSender<RebalanceEvent>>,
    source: Arc<str>,
    max_queued: usize,
}

impl Handler for Dispatch {
    type Wake = ();

    fn stopping(&mut self) {
        self.readiness.set(false);
    }

    fn rebalance(&mut self, ev: RebalanceEvent, _: &Control<'_>) {
        on_rebalance(ev, &self.ctx, &self.reader, &self.source, &self.readiness, &self.observer);
    }

    fn record(&mut self, m: &BorrowedMessage<'_>, done: Done, ctl: &Control<'_>) {
        // The latency split's receive stamp, copied to the task's attempt records (proto: received_at_us).
        let received_us = hookline_service::now_us();
        let ctx = &self.ctx;
        let (p, o) = (done.partition(), done.offset());
        ctx.meters.in_flight().set(ctl.in_flight() as f64);
        // Kept (one copy; the task's byte fields are slices of it) for the dead letter of a panic.
        let raw = Bytes::copy_from_slice(m.payload().unwrap_or_default());
        let task = match m.payload().map(|_| DeliveryTask::decode(raw.clone())) {
            // Boxed: the lane's job, the delivery and its steps each hold the task while it waits for its endpoint,
            // so each holds a pointer instead of the task's ~350 bytes.
            Some(Ok(t)) => Box::new(DeliveryTask { received_at_us: received_us, ..t }),
            other => {
                let detail = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "empty record".into(),
                };
                let ctx = ctx.clone();
                let topic = self.source.to_string();
                tokio::spawn(async move {
                    let dl = hookline_core::model::DeadLetter {
                        reason: DeadLetterReason::InvalidTask.as_str().into(),
                        detail,
                        raw,
                        source_topic: topic,
                        source_partition: p,
                        source_offset: o,
                        at_ms: now_ms(),
                        ..Default::default()
                    };
                    if ctx.produce_dead_letter("", &dl).await.is_ok() {
                        metrics::counter!("hookline_dead_lettered_total", "reason" => DeadLetterReason::InvalidTask.as_str()).increment(1);
                        done.complete();
                    }
                });
                return;
            }
        };
        // Ordered subscriptions only (see `ordering.rs`); while none exists, not even a lookup.
        // A delivery put back from `ordered` goes to its key whatever the subscription says now.
        let released = m.headers().and_then(|_| ordering::released(m));
        if released.is_some() || hookline_kafka::state::any_ordered() {
            let entry = ctx.subs.get(&task.subscription_id);
            let ord = entry.as_ref().and_then(|e| e.ordering.as_deref());
            if ord.is_some() || released.is_some() {
                let (released_from, key) = released.map_or((None, None), |(at, key)| (Some(at), Some(key)));
                let job = ordering::Job { task, raw, done, source: self.source.clone(), partition: p, offset: o, released_from };
                ordering::submit(ctx, ord, key, job);
                return;
            }
        }
        let lane = task.subscription_id.clone();
        let source = self.source.clone();
        // A deep lane that cannot drain within seconds (its endpoint hangs or is far too slow) would
        // otherwise use up `max_in_flight` and stall every other subscription: park the task on the ladder,
        // and with it what the lane queued beyond its depth before it was known to be stuck.
        // Not while the broker or this process stalls (or just after): then every lane looks stuck.
        let stuck = ctx.lanes.stuck_for(&lane, self.max_queued, STUCK_AFTER).filter(|_| !ctx.stalls.within(STUCK_AFTER));
        if let Some(stuck) = stuck {
            for job in ctx.lanes.shed(&lane, self.max_queued) {
                tokio::spawn(job(Run::Shed(stuck)));
            }
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let work = deliver::spill(ctx.clone(), task, stuck);
                if guarded(&ctx, work, &raw, &source, p, o).await.is_ok() {
                    done.complete();
                }
            });
            return;
        }
        let job_ctx = ctx.clone();
        // Built when the lane runs it: a queued job holds the task, not a delivery's whole future.
        ctx.lanes.submit(
            &lane,
            Box::new(move |run| {
                Box::pin(async move {
                    let (slot, released) = deliver::Slot::new();
                    let delivery = Box::pin(async move {
                        let work = async {
                            match run {
                                Run::Now => deliver::deliver_in_lane(job_ctx.clone(), task, p, &slot).await,
                                Run::Shed(stuck) => deliver::spill(job_ctx.clone(), task, stuck).await.map(|()| None),
                            }
                        };
                        match guarded(&job_ctx, work, &raw, &source, p, o).await {
                            // The attempt's last record: its acknowledgement completes the delivery.
                            Ok(Some(last)) => job_ctx.settle(last, done),
                            Ok(None) => done.complete(),
                            Err(Aborted) => {}
                        }
                    });
                    // The lane's slot is held until the endpoint has answered (see `deliver::Slot`); the delivery's
                    // records are then written on a task of their own while the lane starts its next job.
                    deliver::hold_slot(delivery, released).await;
                })
            }),
        );
    }
}

/// Runs one delivery's work. A panic in it (a bug) dead-letters the task with the panic's message: left
/// unfinished, its offset would hold back its partition's watermark, and so every later commit, until a rebalance.
///
/// Not an `async fn`: `work` is boxed before the returned future exists. An async fn keeps its arguments in its
/// state beside what it moves them into, so `work` (a whole delivery's future, waiting for its endpoint with 10,000
/// others) would be held twice; and the panic's dead letter is built in a boxed step of its own.
pub(crate) fn guarded<'a, T: Default + Send + 'a>(
    ctx: &'a Ctx,
    work: impl std::future::Future<Output = Result<T, Aborted>> + Send + 'a,
    raw: &'a Bytes,
    source_topic: &'a str,
    partition: i32,
    offset: i64,
) -> impl std::future::Future<Output = Result<T, Aborted>> + Send + 'a {
    let work = Box::pin(AssertUnwindSafe(work).catch_unwind());
    async move {
        if !ctx.liveness.is_live() {
            Box::pin(deliver::fence(ctx, partition)).await?;
        }
        match work.await {
            Ok(result) => result,
            Err(panic) => Box::pin(dead_letter_panic(ctx, panic, raw, source_topic, partition, offset)).await.map(|()| T::default()),
        }
    }
}

/// The dead letter of a delivery whose handling panicked: the task as the record carried it (`raw`, and what it
/// decodes to), with the panic's message.
async fn dead_letter_panic(
    ctx: &Ctx,
    panic: Box<dyn std::any::Any + Send>,
    raw: &Bytes,
    source_topic: &str,
    partition: i32,
    offset: i64,
) -> Result<(), Aborted> {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    tracing::error!(partition, offset, detail, "handling a delivery panicked; dead-lettering it");
    let task = DeliveryTask::decode(raw.clone()).unwrap_or_default();
    let reason = DeadLetterReason::InternalError;
    let dl = hookline_core::model::DeadLetter {
        reason: reason.as_str().into(),
        detail: format!("handling the delivery panicked: {detail}"),
        final_state: "dead".into(),
        subscription_id: task.subscription_id.clone(),
        delivery_id: task.delivery_id,
        event: task.event,
        raw: raw.clone(),
        source_topic: source_topic.into(),
        source_partition: partition,
        source_offset: offset,
        attempts: task.attempts_made,
        first_attempt_at_ms: task.first_attempt_at_ms,
        at_ms: now_ms(),
        ..Default::default()
    };
    ctx.produce_dead_letter(&task.subscription_id, &dl).await?;
    metrics::counter!("hookline_dead_lettered_total", "reason" => reason.as_str()).increment(1);
    Ok(())
}

/// Applies one rebalance. Rebalancing is incremental (cooperative-sticky): an assignment names only the partitions
/// this member gains, so only they are synced; the partitions it keeps go on delivering throughout.
fn on_rebalance(
    ev: RebalanceEvent,
    ctx: &Arc<Ctx>,
    reader: &TableHandle,
    topic: &str,
    readiness: &Readiness,
    observer: &Option<mpsc::UnboundedSender<RebalanceEvent>>,
) {
    if let Some(o) = observer {
        let _ = o.send(ev.clone());
    }
    let states = &ctx.states;
    match ev {
        RebalanceEvent::Assigned(parts) => {
            let parts: Vec<i32> = parts.into_iter().filter(|(t, _)| t == topic).map(|(_, p)| p).collect();
            if !readiness.is_ready() {
                // Ready once the first assignment's partitions are synced (an empty assignment is ready at once).
                let (states, readiness, parts) = (states.clone(), readiness.clone(), parts.clone());
                tokio::spawn(async move {
                    futures::future::join_all(parts.iter().map(|p| states.ready(*p))).await;
                    readiness.set(true);
                    tracing::info!("dispatcher ready");
                });
            }
            for p in parts {
                let assignment = states.assign(p);
                // Before delivering: apply everything earlier owners wrote to this partition's endpoint state, read
                // the leases they left in flight, and learn which attempts they already concluded (not redone).
                let (ctx, reader) = (ctx.clone(), reader.clone());
                tracing::debug!(partition = p, "assigned");
                tokio::spawn(async move {
                    // Revoked (and maybe assigned again) meanwhile: that assignment has a sync of its own.
                    while ctx.states.is_current(assignment) {
                        let synced = async {
                            let end = reader.end_offset(p).await.map_err(|e| e.to_string())?;
                            reader.wait_for(p, end).await;
                            let leases = ctx.leases.load(&ctx.kafka, ctx.topics.inflight(), p).await.map_err(|e| e.to_string())?;
                            let concluded =
                                ctx.outcomes.learn(&ctx.kafka, ctx.topics.attempts(), p, now_ms()).await.map_err(|e| e.to_string())?;
                            Ok::<_, String>((leases, concluded))
                        };
                        let synced = tokio::select! {
                            r = synced => r,
                            // A sync still running at shutdown is abandoned: nothing of the partition was sent.
                            _ = ctx.shutdown.cancelled() => return,
                        };
                        match synced {
                            Ok((leases, concluded)) => {
                                // Fence the partition before writing to it: states a former owner writes from now
                                // on carry an older epoch and are ignored by every reader.
                                let epoch = ctx.states.next_epoch(p);
                                let fence =
                                    hookline_core::model::EndpointState { owner_epoch: epoch, ..Default::default() }.encode_to_vec();
                                let topic = ctx.topics.endpoint_state();
                                if !ctx.states.is_current(assignment)
                                    || ctx.produce_to_partition(topic, p, FENCE_KEY, Some(&fence)).await.is_err()
                                {
                                    return;
                                }
                                if ctx.states.synced(assignment, epoch) {
                                    tracing::debug!(partition = p, leases, concluded, epoch, "partition synced and fenced");
                                }
                                return;
                            }
                            Err(e) => {
                                tracing::warn!(partition = p, error = %e, "syncing partition state; retrying");
                                tokio::select! {
                                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                                    _ = ctx.shutdown.cancelled() => return,
                                }
                            }
                        }
                    }
                });
            }
        }
        // Nothing to do here: the revoke drain (`RevokeDrain`, inside the rebalance callback) already committed the
        // revoked partitions' finished work, forgot their watermarks and released their endpoint state.
        RebalanceEvent::Revoked(_) => {}
    }
}
