//! A consumer context that reports partition assignments and revocations to the consumer's owner.
//!
//! Group consumers rebalance incrementally (cooperative-sticky, see `client::group_consumer_config`): an
//! assignment or revocation names only the partitions that change owner, and the partitions this member keeps are
//! not revoked and re-assigned. So each event is a delta: owners add or drop exactly the partitions named.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::offset_reset::OffsetReset;
use crate::watermark::SharedWatermarks;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// Forwards rebalances over a channel; the owner forgets revoked partitions' in-memory state.
pub struct RebalanceContext {
    events: mpsc::UnboundedSender<RebalanceEvent>,
    name: &'static str,
    drain: Option<RevokeDrain>,
    /// Rebalance events sent so far: the order of a reset among them (`OffsetReset::after_rebalances`).
    sent: AtomicU64,
    /// Where resets go besides the metric and the log, for an owner that counts what they skipped.
    resets: Option<mpsc::UnboundedSender<OffsetReset>>,
}

/// Finish before letting go: when partitions of `topic` are revoked, the rebalance waits (up to `limit`) for
/// their records in flight, then commits their watermarks, so the next owner starts after the work this member
/// finished instead of redoing it. Without it every rebalance (a member joining, leaving, or restarting) redoes each
/// member's uncommitted work: duplicates for every delivery in flight on every member.
pub struct RevokeDrain {
    pub marks: Arc<SharedWatermarks>,
    pub topic: String,
    pub limit: Duration,
    /// Called with each revoked partition once the wait is over: work not started by then must not start here.
    pub release: Box<dyn Fn(i32) + Send + Sync>,
    /// Once shutting down, the service's own drain has already waited: commit what is done without waiting again.
    pub shutdown: CancellationToken,
}

impl RebalanceContext {
    pub fn new(name: &'static str) -> (Self, mpsc::UnboundedReceiver<RebalanceEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { events: tx, name, drain: None, sent: AtomicU64::new(0), resets: None }, rx)
    }

    pub fn with_revoke_drain(name: &'static str, drain: RevokeDrain) -> (Self, mpsc::UnboundedReceiver<RebalanceEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { events: tx, name, drain: Some(drain), sent: AtomicU64::new(0), resets: None }, rx)
    }

    /// Also reports each offset reset (see `offset_reset`) on the returned channel.
    pub fn with_offset_resets(mut self) -> (Self, mpsc::UnboundedReceiver<OffsetReset>) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.resets = Some(tx);
        (self, rx)
    }

    fn report(&self, ev: RebalanceEvent) {
        self.sent.fetch_add(1, Ordering::SeqCst);
        let _ = self.events.send(ev);
    }

    /// The consumer could not read at `from` and was moved to `auto.offset.reset`: what it skips is lost to this
    /// group (for the dispatcher: deliveries never sent), so it is counted and logged as an error, not only as
    /// librdkafka's warning.
    fn offset_reset(&self, topic: String, partition: i32, from: i64) {
        let kind = crate::produce::topic_kind(&topic);
        metrics::counter!("hookline_consumer_offset_resets_total", "group" => self.name, "topic" => kind).increment(1);
        tracing::error!(
            consumer = self.name,
            topic,
            partition,
            from,
            "consumer offset reset: the broker no longer has the records from this offset (retention shorter than the group's lag?); \
             reading resumes at the earliest record it has"
        );
        if let Some(tx) = &self.resets {
            let after_rebalances = self.sent.load(Ordering::SeqCst);
            let _ = tx.send(OffsetReset { topic, partition, from, after_rebalances });
        }
    }

    fn drain_revoked(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let Some(d) = &self.drain else { return };
        let parts: Vec<i32> = tpl.elements().iter().filter(|e| e.topic() == d.topic).map(|e| e.partition()).collect();
        if parts.is_empty() {
            return;
        }
        // The callback runs inside the consumer's poll, on a runtime worker: waiting there must hand the worker's
        // other tasks (the deliveries being waited for) to another thread. A current-thread runtime cannot, so it
        // commits what is already done.
        // Lost (this member was dropped from the group, e.g. past `max.poll.interval.ms`): the partitions already
        // belong to another member, so there is nothing to wait for and a commit would fail.
        let lost = consumer.assignment_lost();
        let limit = if d.shutdown.is_cancelled() || lost { Duration::ZERO } else { d.limit };
        let started = std::time::Instant::now();
        let offsets = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) if !limit.is_zero() => {
                tokio::task::block_in_place(|| d.marks.wait_drained(&d.topic, &parts, limit))
            }
            _ => d.marks.wait_drained(&d.topic, &parts, Duration::ZERO),
        };
        for p in &parts {
            (d.release)(*p);
            d.marks.forget(&d.topic, *p);
        }
        let mut commit = TopicPartitionList::new();
        for (p, w) in &offsets {
            let _ = commit.add_partition_offset(&d.topic, *p, Offset::Offset(*w));
        }
        let result = if commit.count() > 0 && !lost { consumer.commit(&commit, CommitMode::Sync) } else { Ok(()) };
        metrics::histogram!("hookline_revoke_drain_ms").record(started.elapsed().as_millis() as f64);
        match result {
            Ok(()) => tracing::info!(
                consumer = self.name,
                partitions = parts.len(),
                waited_ms = started.elapsed().as_millis() as u64,
                "revoked partitions drained and committed"
            ),
            // A member that was already expelled (frozen past its session) cannot commit: the next owner redoes it.
            Err(e) => tracing::warn!(consumer = self.name, error = %e, "commit on revoke failed; the next owner redoes uncommitted work"),
        }
    }
}

impl RebalanceContext {
    /// The member was dropped from its group (`max.poll.interval.ms` exceeded): every partition it had is lost.
    /// Releases them at once (no drain: they are another member's now, and nothing more may start here) and
    /// reports them revoked, before librdkafka's own revocation of them, which may come a poll later.
    pub fn release_lost(&self, parts: &[(String, i32)]) {
        if let Some(d) = &self.drain {
            for (t, p) in parts {
                if *t == d.topic {
                    (d.release)(*p);
                    d.marks.forget(t, *p);
                }
            }
        }
        tracing::warn!(consumer = self.name, partitions = parts.len(), "partitions lost (dropped from the group); released");
        self.report(RebalanceEvent::Revoked(parts.to_vec()));
    }
}

fn list(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

impl ClientContext for RebalanceContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, config: Option<&str>) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        crate::oauth::generate(config)
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        match crate::table::describe_security_failure(&error, reason) {
            Some(failure) => tracing::error!(consumer = self.name, "{failure}"),
            None => tracing::error!(consumer = self.name, %error, reason, "kafka client error"),
        }
    }

    /// librdkafka's log lines, as rdkafka's default forwards them, besides reading offset resets out of them.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::error!(target: "librdkafka", "librdkafka: {fac} {line}"),
            L::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {fac} {line}");
                if let Some((topic, partition, from)) = crate::offset_reset::parse(fac, line) {
                    self.offset_reset(topic, partition, from);
                }
            }
            L::Notice | L::Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {line}"),
            L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {line}"),
        }
    }

    /// librdkafka's statistics (every `statistics.interval.ms`): consumer lag per topic kind, for autoscaling on
    /// the dispatcher group's lag and for alerts. Labels stay bounded: the role and the topic kind.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let mut lag: std::collections::BTreeMap<&'static str, i64> = Default::default();
        for (name, topic) in &statistics.topics {
            let kind = crate::produce::topic_kind(name);
            let sum: i64 = topic.partitions.values().filter(|p| p.partition >= 0).map(|p| p.consumer_lag.max(0)).sum();
            *lag.entry(kind).or_default() += sum;
        }
        for (kind, value) in lag {
            metrics::gauge!("hookline_consumer_lag", "group" => self.name, "topic" => kind).set(value as f64);
        }
    }
}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            tracing::info!(consumer = self.name, partitions = tpl.count(), "partitions revoked");
            self.drain_revoked(consumer, tpl);
            self.report(RebalanceEvent::Revoked(list(tpl)));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(consumer = self.name, partitions = tpl.count(), "partitions assigned");
                // librdkafka keeps a partition's pause across unassign and assign, while every owner starts a newly
                // assigned partition afresh (nothing held, not paused): a partition paused by backpressure, revoked
                // and later assigned back would otherwise never be fetched again.
                if let Err(e) = consumer.resume(tpl) {
                    tracing::warn!(consumer = self.name, error = %e, "resuming newly assigned partitions");
                }
                self.report(RebalanceEvent::Assigned(list(tpl)));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(consumer = self.name, error = %e, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(e) = result {
            // NoOffset just means nothing new was stored since the last commit.
            if !matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::NoOffset)) {
                tracing::warn!(consumer = self.name, error = %e, "offset commit failed");
            }
        }
    }
}
