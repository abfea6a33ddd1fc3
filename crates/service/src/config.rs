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

pub use crate::http_server::HttpServerSettings;

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
    /// Base URL of an OTLP/HTTP collector (protobuf), e.g. `http://otel-collector:4318`: spans are POSTed to
    /// `<otlp_endpoint>/v1/traces`. Unset (the default): tracing is off — no spans, no trace headers.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute of exported spans.
    pub service_name: String,
    /// Share of traces started by hookline that are sampled, 0.0–1.0. A trace started upstream keeps its decision
    /// (the `traceparent` sampled flag).
    pub sample_ratio: f64,
    /// How often finished spans are sent to the collector (they are batched in between).
    pub export_interval_ms: u64,
    /// Longest one export request may take.
    pub export_timeout_ms: u64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Json,
            log_level: "info".into(),
            otlp_endpoint: None,
            service_name: "hookline".into(),
            sample_ratio: 1.0,
            export_interval_ms: 5_000,
            export_timeout_ms: 10_000,
        }
    }
}

impl TelemetrySettings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if let Some(endpoint) = &self.otlp_endpoint {
            // Only plain http: a collector is an in-cluster sidecar or agent; TLS to it is not supported.
            let ok = endpoint
                .strip_prefix("http://")
                .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
                && endpoint.parse::<http::Uri>().is_ok_and(|u| u.query().is_none());
            if !ok {
                return invalid(format!(
                    "telemetry.otlp_endpoint: must be an http:// URL of an OTLP/HTTP collector such as \
                     http://otel-collector:4318, got {endpoint:?}"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return invalid(format!("telemetry.sample_ratio: must be between 0.0 and 1.0, got {}", self.sample_ratio));
        }
        if self.service_name.trim().is_empty() || self.service_name.len() > 255 {
            return invalid("telemetry.service_name: must be 1 to 255 characters".into());
        }
        if !(10..=600_000).contains(&self.export_interval_ms) {
            return invalid(format!("telemetry.export_interval_ms: must be 10 to 600000, got {}", self.export_interval_ms));
        }
        if !(1..=600_000).contains(&self.export_timeout_ms) {
            return invalid(format!("telemetry.export_timeout_ms: must be 1 to 600000, got {}", self.export_timeout_ms));
        }
        Ok(())
    }

    /// Whether spans are made and trace context is carried (`otlp_endpoint` set).
    pub fn tracing_enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
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
    /// Timeouts and connection cap of the API's listener (`[ingest.http]`).
    pub http: HttpServerSettings,
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
            http: HttpServerSettings::default(),
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
    /// Timeouts and connection cap of the health listener (`[dispatcher.health_http]`).
    pub health_http: HttpServerSettings,
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
            health_http: HttpServerSettings::default(),
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
    /// Timeouts and connection cap of the health listener (`[retry_scheduler.health_http]`).
    pub health_http: HttpServerSettings,
}

impl Default for RetrySchedulerSettings {
    fn default() -> Self {
        Self {
            health_addr: "0.0.0.0:9092".parse().expect("literal address"),
            max_held_per_partition: 2_000,
            drain_timeout_ms: 10_000,
            group_id: "hookline-retry-scheduler".into(),
            health_http: HttpServerSettings::default(),
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
    /// The OS error is part of the message and not a `source`, so a chain printer shows it once.
    #[error("reading config file {path}: {error}")]
    Read { path: String, error: std::io::Error },
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
        Self::load_over(None, path, env)
    }

    /// `load` with `base` (e.g. `Config::dev`) beneath the file instead of the defaults: what the file and the
    /// environment set wins, the rest stays as in `base`.
    pub fn load_over(
        base: Option<&Config>,
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let (text, origin) = match path {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|error| ConfigError::Read { path: p.display().to_string(), error })?,
                p.display().to_string(),
            ),
            None => (String::new(), "(defaults)".to_owned()),
        };
        Self::build(base, &text, &origin, env)
    }

    pub fn from_toml_with_env(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::build(None, text, origin, env)
    }

    fn build(
        base: Option<&Config>,
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let parse_err = |e: toml::de::Error| ConfigError::Parse { path: origin.to_owned(), message: with_hint(&e.to_string()) };
        // Deserialised from the text itself first: then an unknown key or a wrong type is reported with its line.
        toml::from_str::<Config>(text).map_err(parse_err)?;
        let file: toml::Table = toml::from_str(text).map_err(parse_err)?;
        let mut table = match base {
            Some(b) => toml::Table::try_from(b).map_err(|e| ConfigError::Invalid(format!("base settings: {e}")))?,
            None => toml::Table::new(),
        };
        merge(&mut table, file);
        let mut overrides: Vec<(String, String)> =
            env.into_iter().filter(|(k, _)| k.starts_with("HOOKLINE_") && k.contains("__")).collect();
        overrides.sort();
        for (var, value) in &overrides {
            apply_override(&mut table, var, value)?;
        }
        let config: Config = match table.clone().try_into() {
            Ok(c) => c,
            Err(e) => return Err(blame_override(base, text, &overrides).unwrap_or_else(|| parse_err(e))),
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_log_level(&self.telemetry.log_level)?;
        self.kafka.validate().map_err(ConfigError::Invalid)?;
        self.egress.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.notify.validate()?;
        self.telemetry.validate()?;
        self.ingest.http.validate("ingest.http").map_err(ConfigError::Invalid)?;
        self.dispatcher.health_http.validate("dispatcher.health_http").map_err(ConfigError::Invalid)?;
        self.retry_scheduler.health_http.validate("retry_scheduler.health_http").map_err(ConfigError::Invalid)?;
        if self.dispatcher.revoke_drain_ms > 60_000 {
            return Err(ConfigError::Invalid(format!(
                "dispatcher.revoke_drain_ms: at most 60000 (a member waiting longer holds up the whole group's rebalance), got {}",
                self.dispatcher.revoke_drain_ms
            )));
        }
        // The drain runs inside a poll: a longer one would take the member out of its group mid-drain.
        if self.dispatcher.revoke_drain_ms >= self.kafka.max_poll_interval_ms {
            return Err(ConfigError::Invalid(format!(
                "dispatcher.revoke_drain_ms: must be below kafka.max_poll_interval_ms ({}), got {}",
                self.kafka.max_poll_interval_ms, self.dispatcher.revoke_drain_ms
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
    // TOML reads `inf` and `nan` as floats; no setting wants those, and `inf` is a likely typo for `info`.
    if value.trim_start_matches(['+', '-']).eq_ignore_ascii_case("inf") || value.trim_start_matches(['+', '-']).eq_ignore_ascii_case("nan") {
        return toml::Value::String(value.to_owned());
    }
    match toml::from_str::<Wrapper>(&format!("v = {value}")) {
        Ok(Wrapper { v: v @ (toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) | toml::Value::Array(_)) }) => v,
        _ => toml::Value::String(value.to_owned()),
    }
}

/// Overlays `top` on `bottom`, table by table.
fn merge(bottom: &mut toml::Table, top: toml::Table) {
    for (k, v) in top {
        match (bottom.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(t)) => merge(b, t),
            (_, v) => {
                bottom.insert(k, v);
            }
        }
    }
}

/// The first override that makes the settings unreadable, named by its variable (re-applied one at a time).
fn blame_override(base: Option<&Config>, text: &str, overrides: &[(String, String)]) -> Option<ConfigError> {
    let mut table = match base {
        Some(b) => toml::Table::try_from(b).ok()?,
        None => toml::Table::new(),
    };
    merge(&mut table, toml::from_str(text).ok()?);
    for (var, value) in overrides {
        apply_override(&mut table, var, value).ok()?;
        if let Err(e) = table.clone().try_into::<Config>() {
            return Some(ConfigError::Env { var: var.clone(), message: with_hint(e.message()) });
        }
    }
    None
}

/// Adds "did you mean `x`?" to serde's "unknown field `y`, expected one of `a`, `b`" when a known key is close.
fn with_hint(message: &str) -> String {
    let Some(rest) = message.split("unknown field `").nth(1) else { return message.to_owned() };
    let Some((unknown, expected)) = rest.split_once('`') else { return message.to_owned() };
    let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let best = known
        .iter()
        .map(|k| (edit_distance(unknown, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min();
    match best {
        Some((_, k)) => format!("{}; did you mean `{k}`?", message.trim_end()),
        None => message.to_owned(),
    }
}

/// Levenshtein distance (keys are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A `telemetry.log_level` filter: what `EnvFilter` accepts, and a bare word only if it is a level (a bare
/// `inf` would otherwise be read as a target name and silence every log).
fn check_log_level(filter: &str) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(format!("telemetry.log_level: {m}")));
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(filter) {
        return invalid(format!("{e} (in {filter:?})"));
    }
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for d in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !d.contains(['=', '[', ':']);
        if bare && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(d)) {
            return invalid(format!(
                "{d:?} is not a level (one of off, error, warn, info, debug, trace); to name a target write `{d}=info`"
            ));
        }
    }
    Ok(())
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
    fn group_membership_settings_come_from_the_environment_and_are_checked() {
        let c = Config::from_toml_with_env(
            "",
            "f",
            env(&[("HOOKLINE_KAFKA__GROUP_INSTANCE_ID", "hookline-dispatcher-7c9f-x2"), ("HOOKLINE_KAFKA__MAX_POLL_INTERVAL_MS", "60000")]),
        )
        .unwrap();
        assert_eq!(c.kafka.group_instance_id.as_deref(), Some("hookline-dispatcher-7c9f-x2"));
        assert_eq!(c.kafka.max_poll_interval_ms, 60_000);
        let e = Config::from_toml_with_env(
            "[kafka]\nsession_timeout_ms = 10000\nmax_poll_interval_ms = 20000\n[dispatcher]\nrevoke_drain_ms = 30000\n",
            "f",
            env(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("dispatcher.revoke_drain_ms: must be below kafka.max_poll_interval_ms (20000), got 30000"), "{e}");
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

    #[test]
    fn tracing_is_off_by_default_and_its_settings_are_validated_by_name() {
        let c = Config::from_toml_with_env("", "f", env(&[])).unwrap();
        assert!(!c.telemetry.tracing_enabled());
        let c = Config::from_toml_with_env(
            "[telemetry]\notlp_endpoint = \"http://otel:4318\"\nsample_ratio = 0.25\n",
            "f",
            env(&[("HOOKLINE_TELEMETRY__SERVICE_NAME", "webhooks")]),
        )
        .unwrap();
        assert!(c.telemetry.tracing_enabled());
        assert_eq!(c.telemetry.service_name, "webhooks");
        assert_eq!(c.telemetry.sample_ratio, 0.25);
        let c = Config::from_toml_with_env("", "f", env(&[("HOOKLINE_TELEMETRY__OTLP_ENDPOINT", "http://127.0.0.1:4318")])).unwrap();
        assert_eq!(c.telemetry.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        for (toml, key) in [
            ("otlp_endpoint = \"https://otel:4318\"", "telemetry.otlp_endpoint"),
            ("otlp_endpoint = \"otel:4318\"", "telemetry.otlp_endpoint"),
            ("otlp_endpoint = \"http://\"", "telemetry.otlp_endpoint"),
            ("sample_ratio = 1.5", "telemetry.sample_ratio"),
            ("sample_ratio = -0.1", "telemetry.sample_ratio"),
            ("sample_ratio = nan", "telemetry.sample_ratio"),
            ("service_name = \" \"", "telemetry.service_name"),
            ("export_interval_ms = 0", "telemetry.export_interval_ms"),
            ("export_timeout_ms = 0", "telemetry.export_timeout_ms"),
            ("otlp = \"http://x\"", "otlp"),
        ] {
            let e = Config::from_toml_with_env(&format!("[telemetry]\n{toml}\n"), "f", env(&[])).unwrap_err();
            assert!(e.to_string().contains(key), "{toml}: {e}");
        }
    }

    #[test]
    fn a_bad_override_names_its_variable() {
        let e = Config::from_toml_with_env("", "f", env(&[("HOOKLINE_DISPATCHER__MAX_IN_FLIGHT", "notanumber")])).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("environment variable HOOKLINE_DISPATCHER__MAX_IN_FLIGHT:"), "{msg}");
        assert!(msg.contains("notanumber"), "{msg}");
        let e = Config::from_toml_with_env("", "f", env(&[("HOOKLINE_BOGUS__KEY", "1")])).unwrap_err();
        assert!(e.to_string().starts_with("environment variable HOOKLINE_BOGUS__KEY:"), "{e}");
        let e = Config::from_toml_with_env("", "f", env(&[("HOOKLINE_DISPATCHER__MAX_INFLIGHT", "5")])).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("HOOKLINE_DISPATCHER__MAX_INFLIGHT") && msg.contains("did you mean `max_in_flight`?"), "{msg}");
    }

    #[test]
    fn an_unknown_file_key_gets_its_line_and_a_suggestion() {
        let e = Config::from_toml_with_env("[kafka]\nlinger_ms = 1\n\n[dispatcher]\nmax_inflight = 3\n", "f.toml", env(&[])).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("line 5"), "{msg}");
        assert!(msg.contains("did you mean `max_in_flight`?"), "{msg}");
        // Nothing close: no guess.
        let e = Config::from_toml_with_env("[dispatcher]\nzzzzzzzzzz = 3\n", "f.toml", env(&[])).unwrap_err();
        assert!(!e.to_string().contains("did you mean"), "{e}");
    }

    #[test]
    fn a_missing_file_prints_its_os_error_once() {
        let e = Config::load(Some(Path::new("/nonexistent/hookline.toml")), env(&[])).unwrap_err();
        // What a chain printer (anyhow's `{:#}`) shows: the message, then each source.
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain.push_str(&format!(": {s}"));
            source = s.source();
        }
        assert!(chain.contains("/nonexistent/hookline.toml"), "{chain}");
        assert_eq!(chain.matches("No such file").count(), 1, "{chain}");
    }

    #[test]
    fn log_levels_are_checked() {
        for bad in ["inf", "info,warnn", "hookline=loud"] {
            let text = format!("[telemetry]\nlog_level = {bad:?}\n");
            let e = Config::from_toml_with_env(&text, "f", env(&[])).unwrap_err();
            assert!(e.to_string().contains("telemetry.log_level"), "{bad}: {e}");
        }
        // `inf` from the environment is not TOML's infinity but a misspelt level.
        let e = Config::from_toml_with_env("", "f", env(&[("HOOKLINE_TELEMETRY__LOG_LEVEL", "inf")])).unwrap_err();
        assert!(e.to_string().contains("telemetry.log_level"), "{e}");
        for good in ["info", "WARN", "hookline_dispatcher=debug,info", "off"] {
            let text = format!("[telemetry]\nlog_level = {good:?}\n");
            Config::from_toml_with_env(&text, "f", env(&[])).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn http_limits_are_read_checked_and_named() {
        let c = Config::from_toml_with_env(
            "[ingest.http]\nmax_connections = 100\n[dispatcher.health_http]\nheader_read_timeout_ms = 2000\n",
            "f",
            env(&[("HOOKLINE_RETRY_SCHEDULER__HEALTH_HTTP__IDLE_TIMEOUT_MS", "5000")]),
        )
        .unwrap();
        assert_eq!((c.ingest.http.max_connections, c.ingest.http.header_read_timeout_ms), (100, 10_000));
        assert_eq!(c.dispatcher.health_http.header_read_timeout_ms, 2000);
        assert_eq!(c.retry_scheduler.health_http.idle_timeout_ms, 5000);
        for (text, key) in [
            ("[ingest.http]\nmax_connections = 0\n", "ingest.http.max_connections"),
            ("[ingest.http]\nheader_read_timeout_ms = 0\n", "ingest.http.header_read_timeout_ms"),
            ("[dispatcher.health_http]\nidle_timeout_ms = 3600001\n", "dispatcher.health_http.idle_timeout_ms"),
            ("[retry_scheduler.health_http]\nmax_connections = 100001\n", "retry_scheduler.health_http.max_connections"),
            ("[ingest.http]\nmax_conns = 1\n", "max_conns"),
        ] {
            let e = Config::from_toml_with_env(text, "f", env(&[])).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn a_base_stays_beneath_the_file_and_the_environment() {
        let base = Config::dev("127.0.0.1:9", 2, "dev-token-not-for-production");
        let dir = std::env::temp_dir().join(format!("hookline-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "[notify]\nsmtp_addr = \"127.0.0.1:2525\"\n").unwrap();
        let c = Config::load_over(Some(&base), Some(&file), env(&[("HOOKLINE_DISPATCHER__MAX_IN_FLIGHT", "7")])).unwrap();
        assert_eq!(c.notify.smtp_addr.as_deref(), Some("127.0.0.1:2525"));
        assert_eq!(c.dispatcher.max_in_flight, 7);
        assert_eq!(c.kafka.bootstrap_servers, "127.0.0.1:9");
        assert!(c.egress.allow_http);
        assert_eq!(c.kafka.partitions, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
