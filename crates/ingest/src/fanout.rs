//! The fan-out: each accepted event becomes one delivery task per matching subscription. The event's offset is
//! stored only after every task (or its dead letter) is acknowledged.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use hookline_core::model::{delivery_id, DeadLetter, DeliveryTask, Event, TaskOrigin};
use hookline_kafka::client::group_consumer_config;
use hookline_kafka::rebalance::{RebalanceContext, RebalanceEvent};
use hookline_kafka::state::SubscriptionTable;
use hookline_kafka::watermark::{store, Watermarks};
use hookline_kafka::Topics;
use prost::Message as _;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use hookline_kafka::client::Producer as FutureProducer;
use rdkafka::producer::FutureRecord;
use rdkafka::Message;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::decode;

/// Events being fanned out at once (each may produce many tasks).
const MAX_IN_FLIGHT: usize = 4_096;

pub struct Fanout {
    pub topics: Topics,
    pub producer: FutureProducer,
    pub subs: SubscriptionTable,
    pub max_event_bytes: usize,
    pub shutdown: CancellationToken,
}

pub async fn run(f: Arc<Fanout>, config: &hookline_service::Config, client_id: &str) -> Result<(), KafkaError> {
    let (context, mut rebalances) = RebalanceContext::new("ingest");
    let consumer: StreamConsumer<RebalanceContext> =
        group_consumer_config(&config.kafka, &config.ingest.group_id, client_id)?.create_with_context(context)?;
    let events = f.topics.events();
    consumer.subscribe(&[events])?;
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(i32, i64)>();
    let mut marks = Watermarks::new();
    let store = |consumer: &StreamConsumer<RebalanceContext>, p: i32, w: i64| store(consumer, events, p, w);
    loop {
        tokio::select! {
            biased;
            _ = f.shutdown.cancelled() => break,
            Some(ev) = rebalances.recv() => {
                if let RebalanceEvent::Revoked(parts) = ev {
                    for (t, p) in parts { marks.forget(&t, p); }
                }
            }
            Some((p, o)) = done_rx.recv() => {
                if let Some(w) = marks.complete(events, p, o) { store(&consumer, p, w); }
            }
            next = async {
                let permit = in_flight.clone().acquire_owned().await.expect("never closed");
                (permit, consumer.recv().await)
            } => {
                let (permit, received) = next;
                let m = match received {
                    Ok(m) => m,
                    Err(e) => { tracing::warn!(error = %e, "events consumer error"); continue; }
                };
                let (p, o) = (m.partition(), m.offset());
                marks.start(events, p, o);
                metrics::counter!("hookline_events_consumed_total").increment(1);
                let accepted_at = m.timestamp().to_millis().unwrap_or_else(crate::now_ms);
                let work = match decode::decode(m.payload().unwrap_or_default(), f.max_event_bytes, false) {
                    Ok(mut ev) => {
                        if ev.accepted_at_ms == 0 { ev.accepted_at_ms = accepted_at; }
                        fan_out(&f, ev)
                    }
                    Err(invalid) => {
                        metrics::counter!("hookline_events_invalid_total", "reason" => invalid.reason).increment(1);
                        tracing::debug!(partition = p, offset = o, %invalid, "invalid event dead-lettered");
                        // The raw record is kept whole when it fits the event limit (it always fits a Kafka record
                        // then); an oversize one keeps its first bytes, and the source offset points at all of it.
                        let payload = m.payload().unwrap_or_default();
                        let keep = payload.len().min(f.max_event_bytes);
                        let mut detail = invalid.detail;
                        if keep < payload.len() {
                            detail.push_str(&format!("; raw truncated to its first {keep} of {} bytes", payload.len()));
                        }
                        let dl = DeadLetter {
                            reason: invalid.reason.into(), detail, raw: payload[..keep].to_vec().into(),
                            source_topic: events.to_owned(), source_partition: p, source_offset: o, at_ms: crate::now_ms(), ..Default::default()
                        };
                        vec![enqueue(&f.producer, f.topics.dlq(), String::new(), dl.encode_to_vec())]
                    }
                };
                let done = done_tx.clone();
                let shutdown = f.shutdown.clone();
                let producer = f.producer.clone();
                tokio::spawn(async move {
                    if complete(work, &producer, &shutdown).await {
                        let _ = done.send((p, o));
                    }
                    drop(permit);
                });
            }
        }
    }
    // Drain what is in flight, then commit.
    let _ = tokio::time::timeout(Duration::from_secs(10), in_flight.acquire_many(MAX_IN_FLIGHT as u32)).await;
    while let Ok((p, o)) = done_rx.try_recv() {
        if let Some(w) = marks.complete(events, p, o) {
            store(&consumer, p, w);
        }
    }
    let _ = consumer.commit_consumer_state(CommitMode::Sync);
    Ok(())
}

/// A record to produce: enqueued now (keeps order), awaited later.
pub struct Pending {
    topic: String,
    key: String,
    payload: Vec<u8>,
    future: Option<rdkafka::producer::DeliveryFuture>,
}

fn enqueue(producer: &FutureProducer, topic: &str, key: String, payload: Vec<u8>) -> Pending {
    let future = producer.send_result(FutureRecord::to(topic).key(&key).payload(&payload)).ok();
    Pending { topic: topic.to_owned(), key, payload, future }
}

fn fan_out(f: &Fanout, ev: Event) -> Vec<Pending> {
    let targets = f.subs.matching(&ev.r#type);
    metrics::counter!("hookline_deliveries_fanned_out_total").increment(targets.len() as u64);
    let deliveries = f.topics.deliveries();
    targets
        .iter()
        .map(|entry| {
            let task = DeliveryTask {
                delivery_id: delivery_id(&ev.id, &entry.sub.id),
                subscription_id: entry.sub.id.clone(),
                event: Some(ev.clone()),
                origin: TaskOrigin::Fanout as i32,
                ..Default::default()
            };
            enqueue(&f.producer, deliveries, entry.sub.id.clone(), task.encode_to_vec())
        })
        .collect()
}

/// Waits for every record; re-produces any that failed until it lands. False when shutting down first.
async fn complete(work: Vec<Pending>, producer: &FutureProducer, shutdown: &CancellationToken) -> bool {
    let results = join_all(work.into_iter().map(|p| async move {
        if let Some(fut) = p.future {
            if let Ok(Ok(_)) = fut.await {
                return None;
            }
        }
        Some((p.topic, p.key, p.payload))
    }))
    .await;
    for (topic, key, payload) in results.into_iter().flatten() {
        loop {
            match hookline_kafka::produce::send(producer, &topic, &key, &payload).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "fan-out produce failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = shutdown.cancelled() => return false,
                    }
                }
            }
        }
    }
    true
}
