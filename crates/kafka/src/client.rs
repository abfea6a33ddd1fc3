//! librdkafka client settings. Safety-relevant properties are set here, in one place, for every binary, and so
//! are TLS and SASL: every client (producers, group consumers, table readers, scans, the admin client) gets them.

use std::path::Path;

use rdkafka::admin::AdminClient;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult};

use crate::oauth::TokenSource;
use crate::settings::{GroupProtocol, KafkaSettings};

/// The context of hookline's producers and admin clients: OAUTHBEARER tokens (`kafka.oauth.*`, `kafka.aws.*`), errors to the
/// log. (Consumers have their own contexts, which do the same: `RebalanceContext`, `QuietEof`.)
#[derive(Debug, Default, Clone, Copy)]
pub struct KafkaContext;

impl ClientContext for KafkaContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        crate::oauth::generate(config)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::error!(%error, reason, "kafka client error");
    }
}

pub use crate::producer::Producer;

fn base(settings: &KafkaSettings, client_id: &str) -> KafkaResult<ClientConfig> {
    let mut c = ClientConfig::new();
    for (k, v) in &settings.properties {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &settings.bootstrap_servers).set("client.id", client_id);
    // Secrets are read here, at every client's creation, so a rotated Secret mount is picked up by new clients.
    security(settings, &mut c).map_err(KafkaError::ClientCreation)?;
    Ok(c)
}

fn path_str<'a>(key: &str, path: &'a Path) -> Result<&'a str, String> {
    path.to_str().ok_or_else(|| format!("{key}: the path {} is not UTF-8", path.display()))
}

/// `kafka.security_protocol`, `kafka.tls.*`, `kafka.sasl.*`, `kafka.oauth.*` and `kafka.aws.*` as librdkafka
/// properties.
pub fn security(settings: &KafkaSettings, c: &mut ClientConfig) -> Result<(), String> {
    let proto = settings.security_protocol;
    c.set("security.protocol", proto.as_str());
    if proto.tls() {
        let tls = &settings.tls;
        if let Some(p) = &tls.ca_file {
            c.set("ssl.ca.location", path_str("kafka.tls.ca_file", p)?);
        }
        if let Some(p) = &tls.cert_file {
            c.set("ssl.certificate.location", path_str("kafka.tls.cert_file", p)?);
        }
        if let Some(p) = &tls.key_file {
            c.set("ssl.key.location", path_str("kafka.tls.key_file", p)?);
        }
        if let Some(password) = settings.tls_key_password()? {
            c.set("ssl.key.password", password.expose());
        }
        c.set("ssl.endpoint.identification.algorithm", if tls.check_hostname { "https" } else { "none" });
    }
    if let (true, Some(mechanism)) = (proto.sasl(), settings.sasl.mechanism) {
        c.set("sasl.mechanism", mechanism.as_librdkafka());
        if let Some(source) = TokenSource::from_settings(settings)? {
            c.set("sasl.oauthbearer.config", source.encode());
        } else if let Some((username, password)) = settings.sasl_credentials()? {
            c.set("sasl.username", username).set("sasl.password", password.expose());
        }
    }
    Ok(())
}

/// The producers' codec unless `kafka.properties` names one: a task carries its event's payload, so a deployment's
/// broker bytes (replication, cross-zone traffic, a managed cluster's bill) shrink several times for JSON. Tuning,
/// not safety: on a host whose cores, not its network, are the limit, `none` saves the codec's CPU.
pub const DEFAULT_COMPRESSION: &str = "lz4";

/// A producer for hookline's records: `acks=all` and idempotence so an acknowledged record is durable and never
/// duplicated by producer retries; murmur2 so every binary (and the Java clients upstream) agrees on the
/// partition of a subscription id — that is what co-partitions the work and state topics.
pub fn producer_config(settings: &KafkaSettings, client_id: &str) -> KafkaResult<ClientConfig> {
    let mut c = base(settings, client_id)?;
    c.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", settings.linger_ms.to_string())
        .set("message.max.bytes", settings.message_max_bytes.to_string())
        .set("delivery.timeout.ms", settings.delivery_timeout_ms.to_string());
    if !settings.properties.contains_key("compression.type") {
        c.set("compression.type", DEFAULT_COMPRESSION);
    }
    Ok(c)
}

pub fn producer(settings: &KafkaSettings, client_id: &str) -> KafkaResult<Producer> {
    Producer::from_config(&producer_config(settings, client_id)?)
}

/// [`producer_config`] for the hops a delivery waits on (ingest's: the accepted event, the delivery tasks), which
/// linger `delivery_path_linger_ms` instead of `linger_ms`.
pub fn delivery_path_producer_config(settings: &KafkaSettings, client_id: &str) -> KafkaResult<ClientConfig> {
    let mut c = producer_config(settings, client_id)?;
    c.set("linger.ms", settings.delivery_path_linger_ms.to_string());
    Ok(c)
}

/// A producer with [`delivery_path_producer_config`].
pub fn delivery_path_producer(settings: &KafkaSettings, client_id: &str) -> KafkaResult<Producer> {
    Producer::from_config(&delivery_path_producer_config(settings, client_id)?)
}

/// An admin client (topic creation) with hookline's connection and security settings.
pub fn admin(settings: &KafkaSettings, client_id: &str) -> KafkaResult<AdminClient<KafkaContext>> {
    let admin = AdminClient::from_config_and_context(&base(settings, client_id)?, KafkaContext)?;
    crate::oauth::prime(admin.inner(), settings)?;
    Ok(admin)
}

/// A group consumer that stores offsets only when told to (after an outcome is durable) and auto-commits what was
/// stored. Reading starts at the earliest record of a partition the group never committed, so nothing accepted
/// before the first consumer started is skipped.
///
/// Rebalances are incremental (cooperative-sticky): a member joining or leaving moves only the partitions that
/// change owner, and the others keep delivering instead of every member revoking everything and re-syncing its
/// state. The rebalance callback (`RebalanceContext`) then sees only the partitions that move.
pub fn group_consumer_config(settings: &KafkaSettings, group_id: &str, client_id: &str) -> KafkaResult<ClientConfig> {
    let mut c = base(settings, client_id)?;
    if let Some(id) = &settings.group_instance_id {
        c.set("group.instance.id", id);
    }
    match settings.group_protocol {
        GroupProtocol::Classic => {
            c.set("group.protocol", "classic")
                .set("partition.assignment.strategy", "cooperative-sticky")
                .set("session.timeout.ms", settings.session_timeout_ms.to_string())
                .set("heartbeat.interval.ms", (settings.session_timeout_ms / 10).max(100).to_string());
        }
        // KIP-848: the broker assigns (incrementally, as cooperative-sticky does) and owns the session timeout and
        // heartbeat interval; librdkafka refuses those keys with this protocol.
        GroupProtocol::Consumer => {
            c.set("group.protocol", "consumer");
        }
    }
    c.set("group.id", group_id)
        .set("max.poll.interval.ms", settings.max_poll_interval_ms.to_string())
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "500")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", settings.fetch_wait_max_ms.to_string())
        .set("enable.partition.eof", "false")
        // Feeds `hookline_consumer_lag` (see rebalance.rs).
        .set("statistics.interval.ms", "5000");
    // An offset reset (records skipped, see `offset_reset.rs`) is only a warning line of librdkafka's, which it does
    // not even produce when the process logs errors only (rdkafka sets librdkafka's level from the `log` filter).
    use rdkafka::config::RDKafkaLogLevel as L;
    if matches!(c.log_level, L::Emerg | L::Alert | L::Critical | L::Error) {
        c.set_log_level(L::Warning);
    }
    Ok(c)
}

/// A consumer that reads whole topics by assignment (no group membership, nothing committed): compacted tables.
pub fn table_consumer_config(settings: &KafkaSettings, client_id: &str) -> KafkaResult<ClientConfig> {
    let mut c = base(settings, client_id)?;
    // librdkafka requires a group id even for assign-only consumers; nothing is ever committed under it.
    c.set("group.id", format!("{client_id}-table-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", settings.fetch_wait_max_ms.to_string())
        .set("enable.partition.eof", "true");
    Ok(c)
}

/// Sets a tuning default (a prefetch bound, say) that `kafka.properties` may replace: left out when the operator
/// set `key` there.
pub fn set_tuning_default(c: &mut ClientConfig, settings: &KafkaSettings, key: &str, value: u32) {
    if !settings.properties.contains_key(key) {
        c.set(key, value.to_string());
    }
}

/// How long a stopping service waits for its group consumer to leave the group. librdkafka's close waits for an
/// in-progress rebalance to finish (a JoinGroup can be held for the group's rebalance timeout, minutes), and
/// rust-rdkafka's drop loops until it has. Offsets are committed before this, so giving up only means the
/// coordinator notices the departure at the session timeout instead of at once.
pub const LEAVE_GROUP_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Closes (drops) a group consumer on a thread of its own and waits at most `limit` for it: a drain with a
/// deadline must not become a shutdown without one.
pub async fn close_consumer<T: Send + 'static>(consumer: T, limit: std::time::Duration, name: &'static str) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let closing = std::thread::Builder::new().name(format!("{name}-close")).spawn(move || {
        drop(consumer);
        let _ = tx.send(());
    });
    if let Err(e) = closing {
        tracing::warn!(consumer = name, error = %e, "no thread to close the consumer on; closed it in place");
        return;
    }
    if tokio::time::timeout(limit, rx).await.is_err() {
        tracing::warn!(
            consumer = name,
            waited_ms = limit.as_millis() as u64,
            "the consumer did not leave its group in time (a rebalance in progress); the coordinator drops it at the session timeout"
        );
    }
}
