//! A compacted topic read into memory: read every partition from the beginning to its end ("caught up"), then
//! keep following it. The caller decides what a record means; this only moves bytes and tracks progress.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::client::table_consumer_config;
use crate::settings::KafkaSettings;

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("topic {0} does not exist or has no partitions (run `hookline topics create`)")]
    MissingTopic(String),
    #[error("reading topic {topic}: {source}")]
    Kafka {
        topic: String,
        #[source]
        source: KafkaError,
    },
    /// TLS or SASL failed: retrying cannot help until the configuration (or the broker's) is fixed.
    #[error("reading topic {topic}: {reason}")]
    Security { topic: String, reason: String },
}

/// The context of table readers and scans. Reaching the end of a partition is how a table reader knows it caught
/// up, not an error worth logging. TLS and SASL failures are kept for the error the caller sees.
#[derive(Default)]
pub struct QuietEof {
    failure: Mutex<Option<String>>,
}

impl QuietEof {
    /// The last TLS or SASL failure librdkafka reported, with the keys that configure it.
    pub fn security_failure(&self) -> Option<String> {
        self.failure.lock().expect("failure lock").clone()
    }
}

/// What a TLS or SASL failure reported by librdkafka tells an operator, or `None` for other errors.
pub fn describe_security_failure(error: &KafkaError, reason: &str) -> Option<String> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let tls = reason.contains("SSL routines") || reason.contains("SSL handshake");
    match error.rdkafka_error_code()? {
        C::SSL | C::BrokerTransportFailure if tls || error.rdkafka_error_code() == Some(C::SSL) => Some(format!(
            "the TLS handshake with the broker failed (check kafka.tls.ca_file, kafka.tls.check_hostname, and \
             kafka.tls.cert_file/key_file if the broker requires a client certificate): {reason}"
        )),
        C::Authentication | C::SaslAuthenticationFailed => {
            Some(format!("SASL authentication with the broker failed (check kafka.sasl.*, kafka.oauth.* or kafka.aws.*): {reason}"))
        }
        _ => None,
    }
}

impl rdkafka::ClientContext for QuietEof {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, config: Option<&str>) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        crate::oauth::generate(config)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF) {
            return;
        }
        if let Some(failure) = describe_security_failure(&error, reason) {
            *self.failure.lock().expect("failure lock") = Some(failure);
        }
        tracing::error!(%error, reason, "kafka client error");
    }
}

impl rdkafka::consumer::ConsumerContext for QuietEof {}

/// Client-wide transport errors, which librdkafka hands to the error callback as well as to the poll.
pub(crate) fn reported_by_client(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::AllBrokersDown | C::BrokerTransportFailure | C::Resolve | C::BrokerNotAvailable | C::NetworkException)
    )
}

/// Why [`fetch_metadata`] failed.
pub(crate) enum MetadataError {
    Kafka(KafkaError),
    Security(String),
}

/// The metadata of `topic`, asked in short waits with the consumer's event queue served in between: that runs the
/// OAuth token refresh (a consumer never polled has no token, so it cannot connect) and turns a TLS or SASL
/// failure into an error at once instead of a timeout after `limit`. Blocking: call it off the runtime's workers.
pub(crate) fn fetch_metadata(
    consumer: &StreamConsumer<QuietEof>,
    topic: &str,
    limit: Duration,
) -> Result<rdkafka::metadata::Metadata, MetadataError> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        // Nothing is assigned yet, so this yields no record: it only serves events. One poll serves one event, and
        // librdkafka queues a log line with every error, so serve a batch.
        for _ in 0..256 {
            let _ = futures::FutureExt::now_or_never(consumer.recv());
        }
        if let Some(failure) = consumer.context().security_failure() {
            return Err(MetadataError::Security(failure));
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match consumer.fetch_metadata(Some(topic), left.min(Duration::from_millis(250))) {
            Ok(md) => return Ok(md),
            Err(e) if left <= Duration::from_millis(250) => return Err(MetadataError::Kafka(e)),
            Err(_) => {}
        }
    }
}

/// How much of a table's topic librdkafka may fetch ahead of what the reader applied, in KiB. Its default
/// (`queued.max.messages.kbytes` = 64 MiB, `queued.min.messages` = 100,000 per partition) prefetches a whole
/// compacted topic of a few hundred thousand records into its queue while the reader decodes them; that memory is
/// freed once read but stays in the process's RSS (the allocator keeps it). The reader applies records faster than
/// 4 MiB takes to fetch, so catching up is not slower with the cap. `fetch.max.bytes` follows it (librdkafka
/// clamps it to this, and to at least `message.max.bytes`).
pub const PREFETCH_KBYTES: u32 = 4 * 1024;
/// Records per partition librdkafka keeps fetched ahead (its default is 100,000).
pub const PREFETCH_MESSAGES: u32 = 10_000;

/// The table reader's client: [`table_consumer_config`] with its prefetch bounded ([`PREFETCH_KBYTES`]) unless
/// `kafka.properties` sets those keys.
pub fn reader_config(settings: &KafkaSettings, client_id: &str) -> Result<ClientConfig, KafkaError> {
    let mut c = table_consumer_config(settings, client_id)?;
    for (key, value) in [("queued.max.messages.kbytes", PREFETCH_KBYTES), ("queued.min.messages", PREFETCH_MESSAGES)] {
        crate::client::set_tuning_default(&mut c, settings, key, value);
    }
    Ok(c)
}

#[derive(Default)]
struct Positions {
    /// Next offset to read, per partition.
    next: Mutex<HashMap<i32, i64>>,
    moved: Notify,
}

/// A running reader. Cloning shares it.
#[derive(Clone)]
pub struct TableHandle {
    topic: String,
    consumer: Arc<StreamConsumer<QuietEof>>,
    caught_up: watch::Receiver<bool>,
    positions: Arc<Positions>,
}

impl TableHandle {
    /// Resolves once every partition was read to the end it had when reading started.
    pub async fn wait_caught_up(&self) {
        let mut rx = self.caught_up.clone();
        let _ = rx.wait_for(|c| *c).await;
    }

    pub fn is_caught_up(&self) -> bool {
        *self.caught_up.borrow()
    }

    /// The partition's current end offset (high watermark).
    pub async fn end_offset(&self, partition: i32) -> Result<i64, TableError> {
        self.end_offset_of(&self.topic.clone(), partition).await
    }

    /// The current end offset of a partition of another topic, asked through this reader's client.
    pub async fn end_offset_of(&self, topic: &str, partition: i32) -> Result<i64, TableError> {
        let consumer = self.consumer.clone();
        let t = topic.to_owned();
        tokio::task::spawn_blocking(move || consumer.fetch_watermarks(&t, partition, Duration::from_secs(10)))
            .await
            .expect("watermark lookup does not panic")
            .map(|(_, high)| high)
            .map_err(|source| TableError::Kafka { topic: topic.to_owned(), source })
    }

    /// Waits until the reader has applied every record of `partition` below `offset`.
    pub async fn wait_for(&self, partition: i32, offset: i64) {
        loop {
            let moved = self.positions.moved.notified();
            let at = self.positions.next.lock().expect("positions lock").get(&partition).copied().unwrap_or(0);
            if at >= offset {
                return;
            }
            moved.await;
        }
    }
}

/// Starts reading `topic`. `apply(partition, key, value)` runs for every record in order; `value` is `None` for a
/// tombstone. The reader stops when `cancel` fires.
pub async fn spawn<F>(
    settings: &KafkaSettings,
    topic: &str,
    client_id: &str,
    mut apply: F,
    cancel: CancellationToken,
) -> Result<TableHandle, TableError>
where
    F: FnMut(i32, &[u8], Option<&[u8]>) + Send + 'static,
{
    let topic = topic.to_owned();
    let kafka = |source| TableError::Kafka { topic: topic.clone(), source };
    let consumer: StreamConsumer<QuietEof> =
        reader_config(settings, client_id).map_err(kafka)?.create_with_context(QuietEof::default()).map_err(kafka)?;
    let consumer = Arc::new(consumer);
    let partitions = {
        let (c, t) = (consumer.clone(), topic.clone());
        tokio::task::spawn_blocking(move || fetch_metadata(&c, &t, Duration::from_secs(10)))
            .await
            .expect("metadata lookup does not panic")
            .map_err(|e| match e {
                MetadataError::Kafka(source) => TableError::Kafka { topic: topic.clone(), source },
                MetadataError::Security(reason) => TableError::Security { topic: topic.clone(), reason },
            })?
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| t.partitions().len() as i32)
            .unwrap_or(0)
    };
    if partitions == 0 {
        return Err(TableError::MissingTopic(topic));
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&topic, p, Offset::Beginning).map_err(kafka)?;
    }
    consumer.assign(&tpl).map_err(kafka)?;

    let (caught_tx, caught_rx) = watch::channel(false);
    let positions = Arc::new(Positions::default());
    let handle = TableHandle { topic: topic.clone(), consumer: consumer.clone(), caught_up: caught_rx, positions: positions.clone() };

    tokio::spawn(async move {
        let mut at_end: HashSet<i32> = HashSet::new();
        loop {
            let received = tokio::select! {
                _ = cancel.cancelled() => break,
                r = consumer.recv() => r,
            };
            match received {
                Ok(m) => {
                    let key = m.key().unwrap_or_default();
                    apply(m.partition(), key, m.payload());
                    positions.next.lock().expect("positions lock").insert(m.partition(), m.offset() + 1);
                    positions.moved.notify_waiters();
                }
                Err(KafkaError::PartitionEOF(p)) => {
                    if at_end.insert(p) && at_end.len() as i32 == partitions {
                        tracing::debug!(%topic, "table caught up");
                        let _ = caught_tx.send(true);
                    }
                }
                // Broker connectivity is already logged by the client's error callback (`QuietEof::error`), and
                // librdkafka reconnects by itself: warn only of what that callback does not report.
                Err(e) if reported_by_client(&e) => {
                    tracing::debug!(%topic, error = %e, "table reader: broker connectivity; librdkafka reconnects");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    tracing::warn!(%topic, error = %e, "table reader error; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reader_prefetches_at_most_four_mib_and_librdkafka_accepts_it() {
        let settings = KafkaSettings::default();
        let c = reader_config(&settings, "t").unwrap();
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(c.get("queued.min.messages"), Some("10000"));
        // librdkafka checks the combination (fetch.max.bytes against message.max.bytes) when the client is made.
        let consumer: rdkafka::consumer::BaseConsumer<QuietEof> = c.create_with_context(QuietEof::default()).unwrap();
        drop(consumer);
    }

    #[test]
    fn kafka_properties_override_the_prefetch_cap() {
        let mut settings = KafkaSettings::default();
        settings.properties.insert("queued.max.messages.kbytes".into(), "65536".into());
        let c = reader_config(&settings, "t").unwrap();
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("65536"));
        assert_eq!(c.get("queued.min.messages"), Some("10000"));
    }
}
