//! The indexer: a consumer group over `attempts`, `dlq` and `events` that writes the records into the store in
//! batches (one transaction each) and commits their offsets only after the transaction committed. Writes are
//! idempotent upserts keyed by delivery/run/attempt/try, so a crash between the two (or a rebalance) re-reads and
//! re-writes records without changing the log. Never on the delivery path: when the store is down, the indexer
//! retries the same batch and falls behind (its lag metrics grow); nothing else waits for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hookline_core::model::{AttemptPhase, AttemptRecord, DeadLetter, Event};
use hookline_kafka::client::group_consumer_config;
use hookline_kafka::rebalance::RebalanceContext;
use hookline_kafka::Topics;
use hookline_service::Config;
use prost::Message as _;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::{Batch, LogStore, StoreError, Target};

/// How often retention runs (and PostgreSQL's partitions ahead are created).
const MAINTENANCE_EVERY: Duration = Duration::from_secs(3_600);
/// Wait between attempts to write a batch the store refused.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    SchemaRegistry(String),
}

/// The group's name in `hookline_consumer_lag{group=…}`.
pub const LAG_GROUP: &str = "log-indexer";

/// Opens the store named by `[log]` and indexes until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), IndexerError> {
    let store = Arc::new(LogStore::open(&Target::from_settings(&config.log)?).await?);
    run_with_store(&config, store, "hookline-log-indexer", shutdown).await
}

/// Indexes into `store` (shared with the API in the same process) until `shutdown`.
pub async fn run_with_store(
    config: &Config,
    store: Arc<LogStore>,
    client_id: &str,
    shutdown: CancellationToken,
) -> Result<(), IndexerError> {
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    // Not fatal: a log written at the process's own priority is still a log.
    match store.lower_writer_priority(config.log.sqlite_writer_nice).await {
        Ok(Some(p)) => tracing::info!(nice = p.nice, "delivery log writer yields the cores to deliveries (log.sqlite_writer_nice)"),
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "the delivery log writer keeps the process's priority"),
    }
    let (context, mut rebalances) = RebalanceContext::new(LAG_GROUP);
    let (context, mut resets) = context.with_offset_resets();
    let group = store.indexer_group(&config.log.group_id).await?;
    tracing::info!(%group, backend = store.backend(), "delivery log indexer starting");
    let mut cc = group_consumer_config(&config.kafka, &group, client_id)?;
    // Committed by hand, after the store's commit (never by a timer that could run ahead of it).
    cc.set("enable.auto.commit", "false");
    let consumer: StreamConsumer<RebalanceContext> = cc.create_with_context(context)?;
    consumer.subscribe(&[topics.attempts(), topics.dlq(), topics.events()])?;
    let settings = &config.log;
    // Its own client and cache (one fetch per schema id for the log too): events framed for a Schema Registry are
    // kept as the fan-out decoded them.
    let registry = hookline_schema_registry::Registry::from_settings(&config.ingest.schema_registry)
        .map_err(|e| IndexerError::SchemaRegistry(e.to_string()))?;
    // A registry that does not answer holds the log at most this long per record (a fraction of the poll interval,
    // so the group keeps the member); past it the event is not kept (counted `skipped`).
    let registry_wait = Duration::from_millis(config.kafka.max_poll_interval_ms / 4).min(Duration::from_secs(60));
    let batch_wait = Duration::from_millis(settings.batch_max_wait_ms);
    let mut maintenance = tokio::time::interval(MAINTENANCE_EVERY);
    maintenance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    let mut gaps = crate::gaps::Gaps::default();
    // The batches being written while the next one is read: as many as the store writes side by side (PostgreSQL:
    // one per writing connection), committed in the order they were read.
    let concurrency = store.write_concurrency();
    let mut in_flight: std::collections::VecDeque<InFlight> = std::collections::VecDeque::with_capacity(concurrency);
    while !stopping {
        let mut batch = Batch::default();
        // Next offset to commit per (topic, partition).
        let mut next: HashMap<(Source, i32), i64> = HashMap::new();
        let mut newest_ts = 0i64;
        let mut read = 0usize;
        let deadline = tokio::time::sleep(Duration::from_secs(86_400));
        tokio::pin!(deadline);
        let mut started = false;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => { stopping = true; break; }
                // Besides where reading was (for gaps), the log keeps nothing per partition between batches.
                Some(_) = rebalances.recv() => gaps.forget(),
                // Before the records read after it (biased): the reset was reported before they were fetched.
                Some(r) = resets.recv() => {
                    if let Some(source) = Source::subscribed(&topics, &r.topic) {
                        gaps.offset_reset((source, r.partition), r.from, r.after_rebalances);
                    }
                }
                written = async { (&mut in_flight.front_mut().expect("guarded").task).await }, if !in_flight.is_empty() => {
                    let done = in_flight.pop_front().expect("guarded");
                    if !conclude(&consumer, &topics, done.offsets, written, CommitMode::Async) {
                        return Ok(());
                    }
                }
                _ = maintenance.tick(), if read == 0 && in_flight.is_empty() => {
                    match store.apply_retention(settings.retention_days, hookline_service::now_ms()).await {
                        Ok(r) => tracing::info!(deliveries = r.deliveries, attempts = r.attempts, events = r.events,
                            partitions_dropped = r.partitions_dropped, "delivery log retention applied"),
                        Err(e) => tracing::warn!(error = %e, "delivery log retention failed; retried in an hour"),
                    }
                }
                _ = &mut deadline, if started => break,
                received = consumer.recv() => {
                    let m = match received {
                        Ok(m) => m,
                        Err(e) => { tracing::warn!(error = %e, "log indexer consumer error"); continue; }
                    };
                    if !started {
                        started = true;
                        deadline.as_mut().reset(tokio::time::Instant::now() + batch_wait);
                    }
                    read += 1;
                    let ts = m.timestamp().to_millis().unwrap_or(0);
                    newest_ts = newest_ts.max(ts);
                    let source = Source::of(&topics, m.topic());
                    let lost = gaps.lost_before((source, m.partition()), m.offset());
                    if lost > 0 {
                        metrics::counter!("hookline_log_records_lost_total", "topic" => source.label()).increment(lost);
                        tracing::error!(topic = m.topic(), partition = m.partition(), lost, at_offset = m.offset(),
                            "delivery log: records removed by the broker before the indexer read them (retention shorter than its lag)");
                    }
                    next.insert((source, m.partition()), m.offset() + 1);
                    if let (Source::Events, Some(r)) = (source, &registry) {
                        await_schema(r, m.payload().unwrap_or_default(), registry_wait, &shutdown).await;
                    }
                    add(&mut batch, source, &m, ts, registry.as_deref());
                    if read >= settings.batch_max_records { break; }
                }
            }
        }
        while in_flight.len() >= concurrency {
            let InFlight { task, offsets } = in_flight.pop_front().expect("non-empty");
            if !conclude(&consumer, &topics, offsets, task.await, CommitMode::Async) {
                return Ok(());
            }
        }
        if read == 0 {
            continue;
        }
        let (store, days, stop) = (store.clone(), settings.retention_days, shutdown.clone());
        let task = tokio::spawn(async move { write(&store, batch, days, newest_ts, &stop).await });
        in_flight.push_back(InFlight { task, offsets: Offsets { next, newest_ts } });
    }
    while let Some(InFlight { task, offsets }) = in_flight.pop_front() {
        let mode = if in_flight.is_empty() { CommitMode::Sync } else { CommitMode::Async };
        if !conclude(&consumer, &topics, offsets, task.await, mode) {
            break;
        }
    }
    Ok(())
}

/// A batch handed to the store, with the offsets that follow it.
struct InFlight {
    task: tokio::task::JoinHandle<bool>,
    offsets: Offsets,
}

/// The topic a record came from: the offsets' key, without a copy of its name per record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Attempts,
    DeadLetters,
    Events,
}

impl Source {
    /// The indexer subscribes to these three only; anything else is the events topic's.
    fn of(topics: &Topics, topic: &str) -> Self {
        if topic == topics.attempts() {
            Self::Attempts
        } else if topic == topics.dlq() {
            Self::DeadLetters
        } else {
            Self::Events
        }
    }

    /// Which of the three `topic` is, by its whole name (a reset's topic comes from a log line).
    fn subscribed(topics: &Topics, topic: &str) -> Option<Self> {
        [Self::Attempts, Self::DeadLetters, Self::Events].into_iter().find(|s| s.name(topics) == topic)
    }

    /// The `topic` label of `hookline_log_records_lost_total`.
    fn label(self) -> &'static str {
        match self {
            Self::Attempts => "attempts",
            Self::DeadLetters => "dlq",
            Self::Events => "events",
        }
    }

    fn name(self, topics: &Topics) -> &str {
        match self {
            Self::Attempts => topics.attempts(),
            Self::DeadLetters => topics.dlq(),
            Self::Events => topics.events(),
        }
    }
}

struct Offsets {
    /// The next offset to consume per (topic, partition).
    next: HashMap<(Source, i32), i64>,
    /// The newest record's Kafka timestamp (ms).
    newest_ts: i64,
}

/// After a batch's write finished: commits its offsets when it was stored. False when it was not (shut down while
/// the store refused it, or the write panicked): nothing is committed, and the records are read again next time.
fn conclude(
    consumer: &StreamConsumer<RebalanceContext>,
    topics: &Topics,
    done: Offsets,
    written: Result<bool, tokio::task::JoinError>,
    mode: CommitMode,
) -> bool {
    match written {
        Ok(true) => {}
        Ok(false) => return false,
        Err(e) => {
            tracing::error!(error = %e, "delivery log write task failed; its records are read again at the next start");
            return false;
        }
    }
    let mut tpl = TopicPartitionList::new();
    for ((source, partition), offset) in &done.next {
        let _ = tpl.add_partition_offset(source.name(topics), *partition, Offset::Offset(*offset));
    }
    if let Err(e) = consumer.commit(&tpl, mode) {
        // A revoked partition cannot be committed here; its next owner re-reads (idempotently).
        tracing::debug!(error = %e, "log indexer offset commit failed");
    }
    if done.newest_ts > 0 {
        let lag = hookline_service::now_ms().saturating_sub(done.newest_ts).max(0);
        metrics::gauge!("hookline_log_indexer_lag_ms").set(lag as f64);
    }
    true
}

/// Writes a batch, retrying with backoff until it is stored (true) or shutdown (false).
async fn write(store: &LogStore, batch: Batch, retention_days: u32, newest_ts: i64, shutdown: &CancellationToken) -> bool {
    let mut wait = RETRY_MIN;
    let records = batch.len();
    // Folded once (the cutoff is the first try's: a retry within the hour keeps the same rows).
    let now = hookline_service::now_ms();
    let mut folded = crate::fold(batch, retention_days, now);
    folded.progress = (newest_ts > 0).then_some(crate::model::Progress { newest_record_ms: newest_ts, indexed_at_ms: now });
    let folded = Arc::new(folded);
    loop {
        let started = std::time::Instant::now();
        match store.index_folded(folded.clone()).await {
            Ok(s) => {
                metrics::histogram!("hookline_log_index_batch_ms").record(started.elapsed().as_secs_f64() * 1_000.0);
                for (kind, n) in [("attempt", s.attempts), ("delivery", s.deliveries), ("event", s.events), ("skipped", s.skipped)] {
                    metrics::counter!("hookline_log_indexed_total", "kind" => kind).increment(n as u64);
                }
                return true;
            }
            Err(e) => {
                metrics::counter!("hookline_log_index_errors_total").increment(1);
                tracing::warn!(error = %e, records, retry_in_ms = wait.as_millis() as u64, "delivery log write failed; retrying the batch");
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Until the schema of a framed Avro or Protobuf `value` is known to `r`, at most `limit`.
async fn await_schema(r: &hookline_schema_registry::Registry, value: &[u8], limit: Duration, shutdown: &CancellationToken) {
    use hookline_core::registry_framing::{split, PayloadDecoder as _, Resolved};
    let Some(Ok(framed)) = split(value) else { return };
    if r.to_json(framed) != Resolved::Pending {
        return;
    }
    if tokio::time::timeout(limit, r.resolve(framed.schema_id, shutdown)).await.is_err() {
        tracing::warn!(schema_id = framed.schema_id, "delivery log: the schema registry did not answer in time; this event is not kept");
    }
}

fn add(batch: &mut Batch, source: Source, m: &BorrowedMessage<'_>, ts: i64, registry: Option<&hookline_schema_registry::Registry>) {
    let payload = m.payload().unwrap_or_default();
    if source == Source::Attempts {
        // Leases (phase STARTED) live on `inflight`; only finished tries are attempts.
        match AttemptRecord::decode(payload) {
            Ok(rec) if rec.phase != AttemptPhase::Started as i32 => batch.attempts.push(rec),
            _ => metrics::counter!("hookline_log_indexed_total", "kind" => "skipped").increment(1),
        }
    } else if source == Source::DeadLetters {
        match DeadLetter::decode(payload) {
            Ok(dl) => batch.dead_letters.push(dl),
            Err(_) => metrics::counter!("hookline_log_indexed_total", "kind" => "skipped").increment(1),
        }
    } else {
        let decoded = match registry {
            Some(r) => hookline_kafka::event_record::decode_with(m, usize::MAX, r).ok(),
            None => hookline_kafka::event_record::decode(m, usize::MAX).ok(),
        };
        match decoded {
            Some(hookline_core::event_decode::Decoded::Event(mut ev)) => {
                if ev.accepted_at_ms == 0 {
                    ev.accepted_at_ms = ts;
                }
                batch.events.push((ev, ts));
            }
            // Ingest dead-letters what it cannot decode, and ignores a CloudEvent without data; the log has
            // nothing to keep of either.
            _ => metrics::counter!("hookline_log_indexed_total", "kind" => "skipped").increment(1),
        }
    }
}

/// A record of the events topic as ingest reads it (JSON envelope or protobuf `Event`), for keeping: what ingest
/// refuses (and dead-letters) is not kept; no delivery refers to it. The size limit is ingest's to enforce.
pub fn decode_event(bytes: &[u8]) -> Option<Event> {
    hookline_core::event_decode::decode(bytes, usize::MAX, false).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_from_json_and_protobuf() {
        let ev = decode_event(br#"{"id":"e1","type":"t.x","tenant":"acme","occurred_at":"2026-01-01T00:00:01.5Z","data":{"b":1,"a":2}}"#)
            .unwrap();
        assert_eq!((ev.id.as_str(), ev.r#type.as_str(), ev.tenant.as_str()), ("e1", "t.x", "acme"));
        assert_eq!(ev.occurred_at_ms, 1_767_225_601_500);
        assert_eq!(&ev.data_json[..], br#"{"b":1,"a":2}"#, "the data is kept byte for byte");
        let pb = Event { id: "e2".into(), r#type: "t.y".into(), ..Default::default() }.encode_to_vec();
        assert_eq!(decode_event(&pb).unwrap().id, "e2");
        assert!(decode_event(br#"{"type":"no.id"}"#).is_none());
        assert!(decode_event(b"").is_none());
        assert!(decode_event(b"{not json").is_none());
    }
}
