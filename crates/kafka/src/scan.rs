//! Reading a topic once, from a time (or the beginning) to the end it has now: what replays and redrives do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::settings::KafkaSettings;
use crate::table::QuietEof;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("reading {topic}: {source}")]
    Kafka {
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error("reading {topic}: {reason}")]
    Security { topic: String, reason: String },
    #[error("reading {topic} took longer than {limit:?}; narrow the time range")]
    TooLong { topic: String, limit: Duration },
}

/// Calls `visit` for every record of `topic` written at or after `since_ms` (all records when `None`), up to
/// the partitions' ends at the time of the call. Returns the number of records visited.
pub async fn scan<F>(settings: &KafkaSettings, topic: &str, since_ms: Option<i64>, limit: Duration, visit: F) -> Result<u64, ScanError>
where
    F: FnMut(&BorrowedMessage<'_>),
{
    scan_partitions(settings, topic, None, since_ms, limit, visit).await
}

/// `scan`, limited to one partition when `only` is set.
pub async fn scan_partitions<F>(
    settings: &KafkaSettings,
    topic: &str,
    only: Option<i32>,
    since_ms: Option<i64>,
    limit: Duration,
    mut visit: F,
) -> Result<u64, ScanError>
where
    F: FnMut(&BorrowedMessage<'_>),
{
    let err = |source| ScanError::Kafka { topic: topic.to_owned(), source };
    let mut config = crate::client::table_consumer_config(settings, "hookline-scan").map_err(err)?;
    config.set("enable.partition.eof", "false");
    let consumer: Arc<StreamConsumer<QuietEof>> = Arc::new(config.create_with_context(QuietEof::default()).map_err(err)?);
    let (c, t, by_time) = (consumer.clone(), topic.to_owned(), settings.offsets_by_time);
    // Where each partition starts and ends, asked once (blocking calls, off the runtime's threads).
    let plan = tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64, i64)>, ScanError> {
        let md = crate::table::fetch_metadata(&c, &t, Duration::from_secs(10)).map_err(|e| match e {
            crate::table::MetadataError::Kafka(source) => ScanError::Kafka { topic: t.clone(), source },
            crate::table::MetadataError::Security(reason) => ScanError::Security { topic: t.clone(), reason },
        })?;
        let kafka = |source| ScanError::Kafka { topic: t.clone(), source };
        let parts: Vec<i32> = md
            .topics()
            .iter()
            .filter(|x| x.name() == t)
            .flat_map(|x| x.partitions().iter().map(|p| p.id()))
            .filter(|p| only.is_none_or(|o| o == *p))
            .collect();
        let mut plan = Vec::new();
        for p in parts {
            let (low, high) = c.fetch_watermarks(&t, p, Duration::from_secs(10)).map_err(kafka)?;
            let mut start = low;
            if let (Some(since), true) = (since_ms, by_time) {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&t, p, Offset::Offset(since)).map_err(kafka)?;
                let found = c.offsets_for_times(tpl, Duration::from_secs(10)).map_err(kafka)?;
                start = match found.find_partition(&t, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    // Nothing at or after `since`; unless the broker finds nothing for any time though the
                    // partition holds records: it cannot look offsets up by time at all (librdkafka's mock cluster),
                    // so the partition is read from its start and filtered by time, as with offsets_by_time off.
                    _ if low < high && !finds_any(&c, &t, p)? => {
                        if !WARNED_NO_TIME_INDEX.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            tracing::warn!(
                                topic = %t,
                                "the broker cannot look offsets up by time: reading from the start and filtering by time; set kafka.offsets_by_time = false to skip the lookup"
                            );
                        }
                        low
                    }
                    _ => high,
                };
            }
            if start < high {
                plan.push((p, start, high));
            }
        }
        Ok(plan)
    })
    .await
    .expect("scan planning does not panic")?;
    if plan.is_empty() {
        return Ok(0);
    }
    let mut tpl = TopicPartitionList::new();
    for (p, start, _) in &plan {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*start)).map_err(err)?;
    }
    consumer.assign(&tpl).map_err(err)?;
    let mut remaining: std::collections::HashMap<i32, i64> = plan.iter().map(|(p, _, end)| (*p, *end)).collect();
    let deadline = Instant::now() + limit;
    let mut visited = 0;
    while !remaining.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = match tokio::time::timeout(left, consumer.recv()).await {
            Err(_) => return Err(ScanError::TooLong { topic: topic.to_owned(), limit }),
            Ok(Err(e)) => return Err(err(e)),
            Ok(Ok(m)) => m,
        };
        let Some(end) = remaining.get(&m.partition()).copied() else { continue };
        if m.offset() < end {
            let written = m.timestamp().to_millis().unwrap_or(0);
            if since_ms.is_none_or(|s| written >= s) {
                visit(&m);
                visited += 1;
            }
        }
        if m.offset() + 1 >= end {
            remaining.remove(&m.partition());
        }
    }
    Ok(visited)
}

/// Said once per process: a broker that keeps no time index stays so.
static WARNED_NO_TIME_INDEX: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the broker finds an offset for the earliest time in a partition that holds records (every broker that
/// keeps record timestamps does).
fn finds_any(c: &StreamConsumer<QuietEof>, topic: &str, partition: i32) -> Result<bool, ScanError> {
    let kafka = |source| ScanError::Kafka { topic: topic.to_owned(), source };
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(0)).map_err(kafka)?;
    let found = c.offsets_for_times(tpl, Duration::from_secs(10)).map_err(kafka)?;
    Ok(matches!(found.find_partition(topic, partition).map(|e| e.offset()), Some(Offset::Offset(_))))
}

/// Reads one partition of a topic from an offset up to (not including) another, one record at a time: how the
/// retry-scheduler releases a subscription's parked records. Offsets the topic no longer has (deleted by its
/// retention, or by DeleteRecords) are not waited for: reading starts at the partition's earliest record, and
/// [`RangeReader::deleted`] says how many of the range were gone, for the caller to count as lost.
pub struct RangeReader {
    consumer: StreamConsumer<QuietEof>,
    topic: String,
    partition: i32,
    next: i64,
    to: i64,
    stall: Duration,
    deleted: i64,
}

impl RangeReader {
    /// `stall` bounds the wait for any one record (a broker that stopped answering), not the whole read.
    pub async fn open(
        settings: &KafkaSettings,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        stall: Duration,
    ) -> Result<Self, ScanError> {
        let err = |source| ScanError::Kafka { topic: topic.to_owned(), source };
        let mut config = crate::client::table_consumer_config(settings, "hookline-range").map_err(err)?;
        config.set("enable.partition.eof", "false");
        let mut consumer: StreamConsumer<QuietEof> = config.create_with_context(QuietEof::default()).map_err(err)?;
        let (mut from, mut deleted) = (from.max(0), 0);
        if from < to {
            // What retention removed is not waited for: the records below the partition's earliest are gone.
            let (t, timeout) = (topic.to_owned(), stall.min(Duration::from_secs(10)));
            let (c, low) = tokio::task::spawn_blocking(move || {
                let low = consumer.fetch_watermarks(&t, partition, timeout).map(|(low, _)| low);
                (consumer, low)
            })
            .await
            .map_err(|_| ScanError::Kafka { topic: topic.to_owned(), source: rdkafka::error::KafkaError::Canceled })?;
            consumer = c;
            let low = low.map_err(err)?;
            if low > from {
                deleted = low.min(to) - from;
                from = low.min(to);
            }
        }
        if from < to {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition, Offset::Offset(from)).map_err(err)?;
            consumer.assign(&tpl).map_err(err)?;
        }
        Ok(Self { consumer, topic: topic.to_owned(), partition, next: from, to, stall, deleted })
    }

    /// Records of the range the topic no longer had when they were to be read (deleted by retention).
    pub fn deleted(&self) -> i64 {
        self.deleted
    }

    /// The next offset this reader would return (everything below it was returned or did not exist).
    pub fn position(&self) -> i64 {
        self.next
    }

    /// The next record of the range, `None` past its end.
    pub async fn next(&mut self) -> Option<Result<rdkafka::message::OwnedMessage, ScanError>> {
        while self.next < self.to {
            let m = match tokio::time::timeout(self.stall, self.consumer.recv()).await {
                Err(_) => return Some(Err(ScanError::TooLong { topic: self.topic.clone(), limit: self.stall })),
                Ok(Err(source)) => return Some(Err(ScanError::Kafka { topic: self.topic.clone(), source })),
                Ok(Ok(m)) => m,
            };
            if m.partition() != self.partition || m.offset() < self.next {
                continue;
            }
            if m.offset() >= self.to {
                self.deleted = self.deleted.saturating_add(self.to - self.next);
                self.next = self.to;
                return None;
            }
            // Offsets of a partition without transactions are contiguous: a gap was deleted while reading.
            self.deleted = self.deleted.saturating_add(m.offset() - self.next);
            self.next = m.offset() + 1;
            return Some(Ok(m.detach()));
        }
        None
    }
}
