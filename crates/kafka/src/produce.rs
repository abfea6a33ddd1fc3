//! Producing a record and waiting for the broker's acknowledgement.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::FutureRecord;

use crate::client::Producer;

#[derive(Debug, thiserror::Error)]
#[error("producing to {topic} failed: {source}")]
pub struct ProduceError {
    pub topic: String,
    #[source]
    pub source: KafkaError,
}

/// How long a record may wait for room in the producer's local queue before the send fails.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one record and waits until it is acknowledged by all in-sync replicas. Returns (partition, offset).
pub async fn send(producer: &Producer, topic: &str, key: &str, payload: &[u8]) -> Result<(i32, i64), ProduceError> {
    send_with_headers(producer, topic, key, payload, None).await
}

pub async fn send_with_headers(
    producer: &Producer,
    topic: &str,
    key: &str,
    payload: &[u8],
    headers: Option<OwnedHeaders>,
) -> Result<(i32, i64), ProduceError> {
    let mut record = FutureRecord::to(topic).key(key).payload(payload);
    if let Some(h) = headers {
        record = record.headers(h);
    }
    send_record(producer, record).await
}

/// Sends a record and waits for its acknowledgement; a failure is counted by topic kind.
async fn send_record(producer: &Producer, record: FutureRecord<'_, str, [u8]>) -> Result<(i32, i64), ProduceError> {
    let topic = record.topic;
    match producer.send(record, QUEUE_TIMEOUT).await {
        Ok(delivery) => Ok((delivery.partition, delivery.offset)),
        Err((source, _)) => {
            metrics::counter!("hookline_kafka_produce_errors_total", "topic" => topic_kind(topic)).increment(1);
            Err(ProduceError { topic: topic.to_owned(), source })
        }
    }
}

/// How long [`send_until_acked`] waits between tries once librdkafka has given up on a record.
pub const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The process began shutting down before the record was acknowledged: the input that caused it must stay
/// uncommitted, so the next owner redoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shutting down before the record was acknowledged")]
pub struct ShutDown;

/// Sends until the record is acknowledged by all in-sync replicas, or `shutdown`. librdkafka already retries for
/// `delivery.timeout.ms`; a failure past that means the broker is really unavailable, and the record is tried again
/// every [`RETRY_EVERY`] (each failure logged and counted) rather than dropped: at-least-once needs it written.
/// Every loop that must not lose what it produces uses this one.
pub async fn send_until_acked(
    producer: &Producer,
    topic: &str,
    key: &str,
    payload: &[u8],
    headers: Option<&OwnedHeaders>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<(i32, i64), ShutDown> {
    until_acked(shutdown, || send_with_headers(producer, topic, key, payload, headers.cloned())).await
}

/// Writes `key` (or with `None`, its tombstone) on an explicit partition until acknowledged, like
/// [`send_until_acked`]: for the compacted tables a partition's owner keeps on the co-partitioned topic.
pub async fn send_to_partition_until_acked(
    producer: &Producer,
    topic: &str,
    partition: i32,
    key: &str,
    payload: Option<&[u8]>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<(i32, i64), ShutDown> {
    until_acked(shutdown, || async move {
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).partition(partition).key(key);
        if let Some(p) = payload {
            record = record.payload(p);
        }
        send_record(producer, record).await
    })
    .await
}

/// The one retry loop: tries `send` every [`RETRY_EVERY`] until it is acknowledged or `shutdown`.
async fn until_acked<F, Fut>(shutdown: &tokio_util::sync::CancellationToken, mut send: F) -> Result<(i32, i64), ShutDown>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(i32, i64), ProduceError>>,
{
    loop {
        // A send under way is not cut short by shutdown: the record is in librdkafka's queue either way, and a
        // drain waits for what it finishes.
        match send().await {
            Ok(at) => return Ok(at),
            Err(e) => {
                tracing::warn!(error = %e, "produce failed; retrying until acknowledged");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_EVERY) => {}
                    _ = shutdown.cancelled() => return Err(ShutDown),
                }
            }
        }
    }
}

/// Writes records whose acknowledgement is the last thing their work waits for, settling the work where the
/// acknowledgement arrives (the producer's polling thread) instead of in a task woken only for that: the
/// dispatcher's record that concludes an attempt, the fan-out's tasks. A record librdkafka gives up on, or cannot
/// enqueue, is counted (`hookline_kafka_produce_errors_total`) and written again on the runtime with
/// [`send_until_acked`]; `acked` runs once the record is acknowledged, or never if the process shuts down first
/// (then what it holds, such as an input's `Done`, is dropped: the input stays uncommitted and is redone).
pub struct Settler {
    producer: Producer,
    again: std::sync::Arc<Again>,
}

/// What writing a record again needs; held by every record's callback, so it keeps the producer only weakly (a
/// record the broker never answers must not keep its producer, and the process's service, alive).
struct Again {
    producer: crate::producer::WeakProducer,
    rt: tokio::runtime::Handle,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Settler {
    /// On the current runtime (where records given up on are written again).
    pub fn new(producer: &Producer, shutdown: tokio_util::sync::CancellationToken) -> Self {
        let again = Again { producer: producer.downgrade(), rt: tokio::runtime::Handle::current(), shutdown };
        Self { producer: producer.clone(), again: std::sync::Arc::new(again) }
    }

    /// Enqueues the record (without headers); `acked` runs once it is acknowledged (see [`Settler`]).
    pub fn send(&self, topic: &str, key: &str, payload: &[u8], acked: impl FnOnce() + Send + Sync + 'static) {
        let again = self.again.clone();
        self.producer.send_then(FutureRecord::to(topic).key(key).payload(payload), move |result| {
            let failed = match result {
                Ok(_) => return acked(),
                Err(failed) => failed,
            };
            metrics::counter!("hookline_kafka_produce_errors_total", "topic" => topic_kind(failed.topic)).increment(1);
            tracing::warn!(error = %failed.error, topic = failed.topic, "a record was given up on; writing it again until acknowledged");
            let Some(producer) = again.producer.upgrade() else { return };
            let (topic, key, payload) =
                (failed.topic.to_owned(), failed.key.unwrap_or_default().to_vec(), failed.payload.unwrap_or_default().to_vec());
            let rt = again.rt.clone();
            rt.spawn(async move {
                let key = String::from_utf8_lossy(&key);
                if send_until_acked(&producer, &topic, &key, &payload, None, &again.shutdown).await.is_ok() {
                    acked();
                }
            });
        });
    }
}

/// Sends a tombstone (null value) for `key`.
pub async fn send_tombstone(producer: &Producer, topic: &str, key: &str) -> Result<(), ProduceError> {
    let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).key(key);
    match producer.send(record, QUEUE_TIMEOUT).await {
        Ok(_) => Ok(()),
        Err((source, _)) => Err(ProduceError { topic: topic.to_owned(), source }),
    }
}

/// A bounded label for a topic: its name without the configurable prefix, and tiers folded into `retry`.
pub fn topic_kind(topic: &str) -> &'static str {
    const KINDS: &[&str] = &[
        "events",
        "deliveries",
        "held",
        "parked",
        "ordered",
        "dlq",
        "subscriptions",
        "endpoint-state",
        "attempts",
        "ops",
        "inflight",
        "tenants",
        "api-keys",
        "event-types",
    ];
    if topic.contains(".retry.") || topic.starts_with("retry.") {
        return "retry";
    }
    KINDS.iter().find(|k| topic.ends_with(*k)).copied().unwrap_or("other")
}

#[cfg(test)]
mod tests {
    #[test]
    fn topic_kind_is_bounded() {
        assert_eq!(super::topic_kind("hookline.retry.15m"), "retry");
        assert_eq!(super::topic_kind("x.endpoint-state"), "endpoint-state");
        assert_eq!(super::topic_kind("anything"), "other");
    }
}
