//! librdkafka client settings. Safety-relevant properties are set here, in one place, for every binary.

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::FutureProducer;

use crate::settings::KafkaSettings;

fn base(settings: &KafkaSettings, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in &settings.properties {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &settings.bootstrap_servers).set("client.id", client_id);
    c
}

/// A producer for hookline's records: `acks=all` and idempotence so an acknowledged record is durable and never
/// duplicated by producer retries; murmur2 so every binary (and the Java clients upstream) agrees on the
/// partition of a subscription id — that is what co-partitions the work and state topics.
pub fn producer_config(settings: &KafkaSettings, client_id: &str) -> ClientConfig {
    let mut c = base(settings, client_id);
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", settings.linger_ms.to_string())
        .set("message.max.bytes", settings.message_max_bytes.to_string())
        .set("delivery.timeout.ms", settings.delivery_timeout_ms.to_string())
        .set("compression.type", "lz4");
    c
}

pub fn producer(settings: &KafkaSettings, client_id: &str) -> KafkaResult<FutureProducer> {
    producer_config(settings, client_id).create()
}

/// A group consumer that stores offsets only when told to (after an outcome is durable) and auto-commits what was
/// stored. Reading starts at the earliest record of a partition the group never committed, so nothing accepted
/// before the first consumer started is skipped.
pub fn group_consumer_config(settings: &KafkaSettings, group_id: &str, client_id: &str) -> ClientConfig {
    let mut c = base(settings, client_id);
    c.set("group.id", group_id)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "500")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", settings.session_timeout_ms.to_string())
        .set("heartbeat.interval.ms", (settings.session_timeout_ms / 10).max(100).to_string())
        .set("fetch.wait.max.ms", settings.fetch_wait_max_ms.to_string())
        .set("enable.partition.eof", "false")
        // Feeds `hookline_consumer_lag` (see rebalance.rs).
        .set("statistics.interval.ms", "5000");
    c
}

/// A consumer that reads whole topics by assignment (no group membership, nothing committed): compacted tables.
pub fn table_consumer_config(settings: &KafkaSettings, client_id: &str) -> ClientConfig {
    let mut c = base(settings, client_id);
    // librdkafka requires a group id even for assign-only consumers; nothing is ever committed under it.
    c.set("group.id", format!("{client_id}-table-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", settings.fetch_wait_max_ms.to_string())
        .set("enable.partition.eof", "true");
    c
}
