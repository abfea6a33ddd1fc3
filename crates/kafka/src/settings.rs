//! The `[kafka]` table of the config file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// `host:port,host:port`.
    pub bootstrap_servers: String,
    /// Prepended to every topic name.
    pub topic_prefix: String,
    /// Partitions of the work and state topics (deliveries, retry tiers, held, endpoint-state, subscriptions,
    /// attempts). They must all be equal: that is what co-partitions them by subscription id.
    pub partitions: i32,
    /// Partitions of the `events` input topic.
    pub event_partitions: i32,
    pub replication_factor: i32,
    /// Passed to librdkafka as is (SASL, SSL, tuning): `"security.protocol" = "SASL_SSL"`.
    /// hookline's own safety settings (acks, idempotence, partitioner, offset storing) cannot be overridden here.
    pub properties: BTreeMap<String, String>,
    /// How long a producer keeps retrying a record before reporting failure.
    pub delivery_timeout_ms: u64,
    /// Producer batching delay: a small value keeps latency low.
    pub linger_ms: u64,
    /// Largest record a producer sends (`message.max.bytes`); keep it at or below the brokers' and topics' limit.
    pub message_max_bytes: usize,
    /// Longest a consumer's fetch waits at the broker for data. Real Kafka answers as soon as data arrives, so this
    /// only bounds idle polling; the embedded mock broker always waits it out when a partition is empty, so there it
    /// is added to every hop's latency (dev mode uses 10 ms).
    pub fetch_wait_max_ms: u64,
    /// Whether the broker answers offset-by-time lookups (real Kafka does). Replays "since a time" use it to
    /// start near the time; without it (the embedded mock broker) they scan from the beginning.
    pub offsets_by_time: bool,
    /// Group consumers' `session.timeout.ms`: how long a member that stopped heartbeating (killed, frozen, cut
    /// off) keeps its partitions before the group reassigns them. Shorter recovers sooner from a crash; too short
    /// turns a GC-free but briefly stalled host into a rebalance. Heartbeats go every tenth of it.
    pub session_timeout_ms: u64,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            bootstrap_servers: "localhost:9092".into(),
            topic_prefix: "hookline.".into(),
            partitions: 12,
            event_partitions: 12,
            replication_factor: 3,
            properties: BTreeMap::new(),
            delivery_timeout_ms: 120_000,
            linger_ms: 2,
            offsets_by_time: true,
            fetch_wait_max_ms: 100,
            message_max_bytes: 1_000_000,
            session_timeout_ms: 10_000,
        }
    }
}

/// Properties hookline sets itself; overriding them would break a delivery guarantee.
pub const PROTECTED_PROPERTIES: &[&str] = &[
    "acks",
    "enable.idempotence",
    "partitioner",
    "enable.auto.offset.store",
    "group.id",
    "bootstrap.servers",
    "fetch.wait.max.ms",
    "message.max.bytes",
    "session.timeout.ms",
    "heartbeat.interval.ms",
];

impl KafkaSettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err("kafka.bootstrap_servers: must not be empty".into());
        }
        if self.partitions < 1 {
            return Err(format!("kafka.partitions: must be at least 1, got {}", self.partitions));
        }
        if self.event_partitions < 1 {
            return Err(format!("kafka.event_partitions: must be at least 1, got {}", self.event_partitions));
        }
        if self.fetch_wait_max_ms == 0 || self.fetch_wait_max_ms > 10_000 {
            return Err(format!("kafka.fetch_wait_max_ms: must be between 1 and 10000, got {}", self.fetch_wait_max_ms));
        }
        // Kafka brokers accept 6 s to 30 min by default (group.min/max.session.timeout.ms).
        if !(1_000..=1_800_000).contains(&self.session_timeout_ms) {
            return Err(format!("kafka.session_timeout_ms: must be between 1000 and 1800000, got {}", self.session_timeout_ms));
        }
        if self.replication_factor < 1 {
            return Err(format!("kafka.replication_factor: must be at least 1, got {}", self.replication_factor));
        }
        if let Some(k) = self.properties.keys().find(|k| PROTECTED_PROPERTIES.contains(&k.as_str())) {
            let instead = match k.as_str() {
                "fetch.wait.max.ms" => " (use kafka.fetch_wait_max_ms)",
                "message.max.bytes" => " (use kafka.message_max_bytes)",
                "session.timeout.ms" | "heartbeat.interval.ms" => " (use kafka.session_timeout_ms)",
                _ => "",
            };
            return Err(format!(
                "kafka.properties.{k}: hookline sets this itself (at-least-once delivery depends on it); remove it{instead}"
            ));
        }
        Ok(())
    }
}
