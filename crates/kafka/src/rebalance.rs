//! A consumer context that reports partition assignments and revocations to the consumer's owner.

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// Forwards rebalances over a channel; the owner forgets revoked partitions' in-memory state.
pub struct RebalanceContext {
    events: mpsc::UnboundedSender<RebalanceEvent>,
    name: &'static str,
}

impl RebalanceContext {
    pub fn new(name: &'static str) -> (Self, mpsc::UnboundedReceiver<RebalanceEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { events: tx, name }, rx)
    }
}

fn list(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

impl ClientContext for RebalanceContext {
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
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            tracing::info!(consumer = self.name, partitions = tpl.count(), "partitions revoked");
            let _ = self.events.send(RebalanceEvent::Revoked(list(tpl)));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(consumer = self.name, partitions = tpl.count(), "partitions assigned");
                let _ = self.events.send(RebalanceEvent::Assigned(list(tpl)));
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
