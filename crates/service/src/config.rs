//! One TOML file shared by all binaries, with environment overrides: `HOOKLINE_<SECTION>__<KEY>=value`
//! (e.g. `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS=kafka:9092`, `HOOKLINE_DISPATCHER__MAX_IN_FLIGHT=5000`). Values are
//! read as TOML when they parse as a number, boolean or array, otherwise as a string. Under
//! `kafka.properties`, `_` in the key stands for `.` (`HOOKLINE_KAFKA__PROPERTIES__SOCKET_KEEPALIVE_ENABLE`).
//! Unknown keys are errors, in the file and in the environment.

use std::net::SocketAddr;
use std::path::Path;

use hookline_core::egress::EgressSettings;
use hookline_kafka::KafkaSettings;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub kafka: KafkaSettings,
    pub telemetry: TelemetrySettings,
    pub ingest: IngestSettings,
    pub dispatcher: DispatcherSettings,
    pub retry_scheduler: RetrySchedulerSettings,
    pub egress: EgressSettings,
    pub notify: NotifySettings,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// `json` (one object per line) or `pretty`.
    pub log_format: LogFormat,
    /// A tracing filter: `info`, `hookline_dispatcher=debug,info`. `RUST_LOG` wins when set.
    pub log_level: String,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self { log_format: LogFormat::Json, log_level: "info".into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Json,
    Pretty,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestSettings {
    /// The HTTP API (and /metrics, /healthz, /readyz).
    pub listen_addr: SocketAddr,
    /// Bearer tokens accepted by the API. Empty: every API request is refused (401), health and metrics stay open.
    pub api_tokens: Vec<String>,
    /// Largest accepted event (the whole JSON envelope or protobuf record).
    pub max_event_bytes: usize,
    /// Largest accepted HTTP request body.
    pub max_request_bytes: usize,
    /// Consumer group of the fan-out.
    pub group_id: String,
    /// How long the delivery log keeps a delivery (Gauge keeps 30 days). Match the `attempts` topic retention.
    pub delivery_log_retention_ms: i64,
    /// Most deliveries the log keeps in memory; the oldest go first.
    pub delivery_log_max_deliveries: usize,
}

impl Default for IngestSettings {
    fn default() -> Self {
        Self {
            listen_addr: "0.0.0.0:8080".parse().expect("literal address"),
            api_tokens: Vec::new(),
            max_event_bytes: 960 << 10,
            max_request_bytes: 2 << 20,
            group_id: "hookline-ingest".into(),
            delivery_log_retention_ms: 30 * 24 * 3_600_000,
            delivery_log_max_deliveries: 1_000_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatcherSettings {
    /// /metrics, /healthz, /readyz.
    pub health_addr: SocketAddr,
    /// Deliveries taken from Kafka and not yet finished, across all partitions (memory bound).
    pub max_in_flight: usize,
    /// Concurrent HTTP requests to one subscription's endpoint.
    pub per_subscription_concurrency: usize,
    /// Deliveries one subscription may have running or queued in memory while its endpoint cannot keep up (the
    /// lane would need over 5 s to drain at its recent pace, measured over windows of at least 1 s); beyond it new
    /// ones, and those it had queued beyond it, are parked on the retry ladder (not an attempt), so a slow or
    /// hanging endpoint cannot use up `max_in_flight`. Parked tasks of a lane that still finishes work (1/s or more)
    /// come back one by one at its pace; those of a hanging one after 4 s, 15 s, then each minute (or its estimated
    /// drain time, at most 1 min). Not judged while the broker or the process stalls, nor for 5 s after.
    pub max_queued_per_subscription: usize,
    /// On SIGTERM, how long in-flight deliveries may take to finish before the rest is handed back uncommitted.
    pub drain_timeout_ms: u64,
    /// When a rebalance takes partitions away, how long to wait for their deliveries in flight before committing
    /// them and letting go (0: commit only what is already finished). Kafka accepts commits while a rebalance is
    /// being prepared, so waiting spares the next owner from redoing that work; the embedded mock broker refuses
    /// them, and there waiting only adds to what is redone.
    pub revoke_drain_ms: u64,
    /// How long the dispatcher remembers that an attempt's outcome is written, so a task redone after a rebalance or
    /// produced twice by a restarted ingest or retry-scheduler is acknowledged without sending it again. On an
    /// assignment, the partition's `attempts` records of this window are read before its deliveries start. 0 turns
    /// the check off (every redo is sent again, and a redone attempt schedules its retry again).
    pub dedupe_window_ms: u64,
    /// At most this many remembered outcomes (about 60 bytes each); the oldest are forgotten first.
    pub dedupe_max_entries: usize,
    pub group_id: String,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        Self {
            health_addr: "0.0.0.0:9091".parse().expect("literal address"),
            max_in_flight: 10_000,
            per_subscription_concurrency: 16,
            max_queued_per_subscription: 256,
            drain_timeout_ms: 30_000,
            revoke_drain_ms: 0,
            dedupe_window_ms: 120_000,
            dedupe_max_entries: 500_000,
            group_id: "hookline-dispatcher".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySchedulerSettings {
    pub health_addr: SocketAddr,
    /// Records held in memory per tier partition; past this the partition is paused until the head is released.
    pub max_held_per_partition: usize,
    pub drain_timeout_ms: u64,
    pub group_id: String,
}

impl Default for RetrySchedulerSettings {
    fn default() -> Self {
        Self {
            health_addr: "0.0.0.0:9092".parse().expect("literal address"),
            max_held_per_partition: 2_000,
            drain_timeout_ms: 10_000,
            group_id: "hookline-retry-scheduler".into(),
        }
    }
}

/// E-mail to subscription owners when a policy pauses or disables their endpoint (ingest reads the `ops` topic).
/// hookline speaks plain SMTP (no TLS) to a relay: point `smtp_addr` at a local relay or sidecar.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifySettings {
    /// `host:port` of the SMTP relay. Unset: no e-mail.
    pub smtp_addr: Option<String>,
    /// Envelope sender and `From:` header.
    pub from: String,
    /// AUTH PLAIN credentials, used only when both are set.
    pub username: Option<String>,
    pub password: Option<String>,
    /// Per SMTP command (connect, each reply, the message).
    pub timeout_ms: u64,
}

impl Default for NotifySettings {
    fn default() -> Self {
        Self { smtp_addr: None, from: "hookline@localhost".into(), username: None, password: None, timeout_ms: 10_000 }
    }
}

impl std::fmt::Debug for NotifySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifySettings")
            .field("smtp_addr", &self.smtp_addr)
            .field("from", &self.from)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl NotifySettings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.into()));
        let Some(addr) = &self.smtp_addr else { return Ok(()) };
        if addr.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
            return invalid("notify.smtp_addr: must be host:port");
        }
        let plain = |s: &str| s.bytes().all(|b| b.is_ascii_graphic() && !b"<>(),;\\".contains(&b));
        if !self.from.contains('@') || !plain(&self.from) {
            return invalid("notify.from: must be an e-mail address such as hookline@example.com");
        }
        if self.username.is_some() != self.password.is_some() {
            return invalid("notify.username, notify.password: set both or neither");
        }
        if self.timeout_ms == 0 {
            return invalid("notify.timeout_ms: must be at least 1");
        }
        Ok(())
    }
}

/// Room kept in every record for what hookline wraps around an event (ids, attempt counters, reasons).
pub const EVENT_ENVELOPE_BYTES: usize = 16 << 10;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("config: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads `path` (if given), applies `HOOKLINE_*` overrides from `env`, and validates.
    /// `env` is passed in (usually `std::env::vars()`) so nothing here reads or writes process-global state.
    pub fn load(path: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let (text, origin) = match path {
            Some(p) => (
                std::fs::read_to_string(p)
                    .map_err(|source| ConfigError::Read { path: p.display().to_string(), source })?,
                p.display().to_string(),
            ),
            None => (String::new(), "(defaults)".to_owned()),
        };
        Self::from_toml_with_env(&text, &origin, env)
    }

    pub fn from_toml_with_env(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: origin.to_owned(), message: e.to_string() })?;
        let mut overrides: Vec<(String, String)> =
            env.into_iter().filter(|(k, _)| k.starts_with("HOOKLINE_") && k.contains("__")).collect();
        overrides.sort();
        for (var, value) in &overrides {
            apply_override(&mut table, var, value)?;
        }
        let config: Config = table.try_into().map_err(|e: toml::de::Error| ConfigError::Parse {
            path: if overrides.is_empty() { origin.to_owned() } else { format!("{origin} + HOOKLINE_* overrides") },
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.kafka.validate().map_err(ConfigError::Invalid)?;
        self.egress.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.notify.validate()?;
        if self.dispatcher.revoke_drain_ms > 60_000 {
            return Err(ConfigError::Invalid(format!(
                "dispatcher.revoke_drain_ms: at most 60000 (a member waiting longer holds up the whole group's rebalance), got {}",
                self.dispatcher.revoke_drain_ms
            )));
        }
        if self.dispatcher.max_in_flight == 0 {
            return Err(ConfigError::Invalid("dispatcher.max_in_flight: must be at least 1".into()));
        }
        if self.dispatcher.dedupe_window_ms > 3_600_000 {
            return Err(ConfigError::Invalid(format!(
                "dispatcher.dedupe_window_ms: at most 3600000 (an assignment reads this much of `attempts` before delivering), got {}",
                self.dispatcher.dedupe_window_ms
            )));
        }
        if self.dispatcher.max_queued_per_subscription < self.dispatcher.per_subscription_concurrency {
            return Err(ConfigError::Invalid(
                "dispatcher.max_queued_per_subscription: must be at least dispatcher.per_subscription_concurrency".into(),
            ));
        }
        if self.dispatcher.per_subscription_concurrency == 0 {
            return Err(ConfigError::Invalid("dispatcher.per_subscription_concurrency: must be at least 1".into()));
        }
        if self.retry_scheduler.max_held_per_partition == 0 {
            return Err(ConfigError::Invalid("retry_scheduler.max_held_per_partition: must be at least 1".into()));
        }
        if self.ingest.max_event_bytes == 0 {
            return Err(ConfigError::Invalid("ingest.max_event_bytes: must be at least 1".into()));
        }
        // A delivery task or dead letter carries the whole event plus a few hundred bytes of envelope.
        let room = self.kafka.message_max_bytes.saturating_sub(EVENT_ENVELOPE_BYTES);
        if self.ingest.max_event_bytes > room {
            return Err(ConfigError::Invalid(format!(
                "ingest.max_event_bytes: {} does not fit in a Kafka record of kafka.message_max_bytes = {} with the \
                 {EVENT_ENVELOPE_BYTES}-byte room hookline keeps for its envelope; at most {room}",
                self.ingest.max_event_bytes, self.kafka.message_max_bytes
            )));
        }
        if self.ingest.api_tokens.iter().any(|t| t.len() < 16) {
            return Err(ConfigError::Invalid("ingest.api_tokens: every token must be at least 16 characters".into()));
        }
        Ok(())
    }
}

fn apply_override(table: &mut toml::Table, var: &str, value: &str) -> Result<(), ConfigError> {
    let path: Vec<String> = var["HOOKLINE_".len()..].split("__").map(|s| s.to_ascii_lowercase()).collect();
    let err = |message: String| ConfigError::Env { var: var.to_owned(), message };
    if path.iter().any(String::is_empty) {
        return Err(err("empty key segment".into()));
    }
    let (last, parents) = path.split_last().expect("split of a non-empty string");
    let mut cursor = table;
    for seg in parents {
        let entry = cursor.entry(seg.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cursor = entry.as_table_mut().ok_or_else(|| err(format!("`{seg}` is not a table")))?;
    }
    let key = if parents.len() == 2 && parents[0] == "kafka" && parents[1] == "properties" {
        last.replace('_', ".")
    } else {
        last.clone()
    };
    cursor.insert(key, parse_env_value(value));
    Ok(())
}

fn parse_env_value(value: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct Wrapper {
        v: toml::Value,
    }
    match toml::from_str::<Wrapper>(&format!("v = {value}")) {
        Ok(Wrapper { v: v @ (toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) | toml::Value::Array(_)) }) => v,
        _ => toml::Value::String(value.to_owned()),
    }
}

impl Config {
    /// Settings for `hookline dev` and tests: one local broker, few partitions, loopback receivers allowed over
    /// plain http (the egress allow-list is logged loudly at start), readable logs.
    pub fn dev(bootstrap_servers: &str, partitions: i32, api_token: &str) -> Self {
        let mut c = Config::default();
        c.kafka.bootstrap_servers = bootstrap_servers.to_owned();
        c.kafka.partitions = partitions;
        c.kafka.event_partitions = partitions;
        c.kafka.replication_factor = 1;
        c.kafka.linger_ms = 1;
        c.kafka.offsets_by_time = false;
        // The mock broker holds an empty fetch for the whole wait: keep hops short.
        c.kafka.fetch_wait_max_ms = 10;
        c.ingest.listen_addr = "127.0.0.1:0".parse().expect("literal address");
        c.ingest.api_tokens = vec![api_token.to_owned()];
        c.dispatcher.health_addr = "127.0.0.1:0".parse().expect("literal address");
        c.retry_scheduler.health_addr = "127.0.0.1:0".parse().expect("literal address");
        c.dispatcher.drain_timeout_ms = 5_000;
        c.retry_scheduler.drain_timeout_ms = 2_000;
        c.egress.allow_ranges = vec!["127.0.0.0/8".into(), "::1/128".into()];
        c.egress.allow_http = true;
        c.telemetry.log_format = LogFormat::Pretty;
        c.telemetry.log_level = "warn".into();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::from_toml_with_env("", "t", env(&[])).unwrap();
        assert_eq!(c.kafka.topic_prefix, "hookline.");
        assert_eq!(c.dispatcher.per_subscription_concurrency, 16);
    }

    #[test]
    fn env_overrides_file_and_types_follow_the_value() {
        let c = Config::from_toml_with_env(
            "[kafka]\nbootstrap_servers = \"a:1\"\n",
            "t",
            env(&[
                ("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", "b:2,c:3"),
                ("HOOKLINE_DISPATCHER__MAX_IN_FLIGHT", "77"),
                ("HOOKLINE_KAFKA__PROPERTIES__SOCKET_KEEPALIVE_ENABLE", "yes"),
                ("HOOKLINE_KAFKA__SECURITY_PROTOCOL", "ssl"),
                ("HOOKLINE_KAFKA__TLS__CHECK_HOSTNAME", "false"),
                ("HOOKLINE_CONFIG", "ignored: no section separator"),
                ("OTHER__X", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(c.kafka.bootstrap_servers, "b:2,c:3");
        assert_eq!(c.dispatcher.max_in_flight, 77);
        assert_eq!(c.kafka.properties.get("socket.keepalive.enable").map(String::as_str), Some("yes"));
        assert_eq!(c.kafka.security_protocol, hookline_kafka::settings::SecurityProtocol::Ssl);
        assert!(!c.kafka.tls.check_hostname, "nested [kafka.tls] keys take env overrides too");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::from_toml_with_env("[dispatcher]\nmax_inflight = 3\n", "f.toml", env(&[])).unwrap_err();
        assert!(e.to_string().contains("max_inflight"), "{e}");
        let e = Config::from_toml_with_env("", "f.toml", env(&[("HOOKLINE_DISPATCHER__NOPE", "1")])).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let e = Config::from_toml_with_env("[dispatcher]\nmax_in_flight = 0\n", "f", env(&[])).unwrap_err();
        assert!(e.to_string().contains("dispatcher.max_in_flight"), "{e}");
        let e = Config::from_toml_with_env("[kafka.properties]\nacks = \"1\"\n", "f", env(&[])).unwrap_err();
        assert!(e.to_string().contains("kafka.properties.acks"), "{e}");
        let e = Config::from_toml_with_env("[kafka.properties]\n\"session.timeout.ms\" = \"1000\"\n", "f", env(&[])).unwrap_err();
        assert!(e.to_string().contains("kafka.session_timeout_ms"), "points at the setting to use: {e}");
        let e = Config::from_toml_with_env("", "f", env(&[("HOOKLINE_KAFKA__SESSION_TIMEOUT_MS", "500")])).unwrap_err();
        assert!(e.to_string().contains("kafka.session_timeout_ms"), "{e}");
        let e = Config::from_toml_with_env("[dispatcher]\ndedupe_window_ms = 3600001\n", "f", env(&[])).unwrap_err();
        assert!(e.to_string().contains("dispatcher.dedupe_window_ms"), "{e}");
        let e = Config::from_toml_with_env("[dispatcher]\nrevoke_drain_ms = 60001\n", "f", env(&[])).unwrap_err();
        assert!(e.to_string().contains("dispatcher.revoke_drain_ms"), "{e}");
    }
}
