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

mod log;
pub use log::{LogSettings, LogStoreKind};

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
    pub log: LogSettings,
    pub dlq: DlqSettings,
    pub secrets: SecretsSettings,
}

/// Master keys that seal subscriptions' signing secrets in the `subscriptions` topic (AES-256-GCM). Each key is
/// `<id>:<base64 of 32 bytes>` (`hookline secrets generate-key` makes one). Every key listed opens records; the
/// write key seals new ones. Ingest and the dispatcher need them; the retry-scheduler does not.
#[derive(Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsSettings {
    /// Keys given inline, usually from the environment: `HOOKLINE_SECRETS__KEYS='["k2:…","k1:…"]'`.
    pub keys: Vec<String>,
    /// A file with one key per line (`#` starts a comment), read at start; joined to `keys`.
    pub keys_file: Option<std::path::PathBuf>,
    /// The id of the key that seals new records. Unset: the first key (of `keys`, then of `keys_file`).
    pub write_key: Option<String>,
}

impl std::fmt::Debug for SecretsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.split_once(':').map_or("<invalid>", |(id, _)| id)).collect();
        f.debug_struct("SecretsSettings")
            .field("keys", &ids)
            .field("keys_file", &self.keys_file)
            .field("write_key", &self.write_key)
            .finish()
    }
}

impl SecretsSettings {
    /// The keyring, reading `keys_file` if set. Errors name the setting.
    pub fn keyring(&self) -> Result<hookline_core::seal::Keyring, ConfigError> {
        let mut entries = self.keys.clone();
        if let Some(path) = &self.keys_file {
            let text = std::fs::read_to_string(path)
                .map_err(|error| ConfigError::Read { path: format!("{} (secrets.keys_file)", path.display()), error })?;
            entries.extend(text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).map(str::to_owned));
        }
        hookline_core::seal::Keyring::from_entries(entries.iter().map(String::as_str), self.write_key.as_deref()).map_err(|e| {
            let key = match e {
                hookline_core::seal::SealError::UnknownWriteKey(_) => "secrets.write_key",
                _ => "secrets.keys",
            };
            ConfigError::Invalid(format!("{key}: {e}"))
        })
    }
}

/// Portal links (`POST /v1/tenants/{id}/portal-links`) and how the portal may be embedded (`[ingest.portal]`).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortalSettings {
    /// The HMAC key that signs portal links, at least 32 characters; the same on every ingest replica. Unset:
    /// portal links cannot be made (409 `portal_links_disabled`).
    pub link_secret: Option<String>,
    /// How long a portal link is valid unless the request asks for less.
    pub link_ttl_s: u64,
    /// The portal's public base URL (`https://hooks.example.com`) for the links. Unset: taken from the request's
    /// `Host` header as `http://<host>`.
    pub public_url: Option<String>,
    /// Origins that may show the portal in an iframe (CSP `frame-ancestors`), e.g. `https://app.example.com`.
    /// Empty: none may.
    pub frame_ancestors: Vec<String>,
}

impl Default for PortalSettings {
    fn default() -> Self {
        Self { link_secret: None, link_ttl_s: 3_600, public_url: None, frame_ancestors: Vec::new() }
    }
}

impl std::fmt::Debug for PortalSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortalSettings")
            .field("link_secret", &self.link_secret.as_ref().map(|_| "<redacted>"))
            .field("link_ttl_s", &self.link_ttl_s)
            .field("public_url", &self.public_url)
            .field("frame_ancestors", &self.frame_ancestors)
            .finish()
    }
}

/// Longest portal link lifetime (`ingest.portal.link_ttl_s` and a request's `ttl_s`).
pub const MAX_PORTAL_LINK_TTL_S: u64 = 7 * 86_400;

impl PortalSettings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.link_secret.as_ref().is_some_and(|s| s.len() < 32) {
            return invalid("ingest.portal.link_secret: must be at least 32 characters".into());
        }
        if !(60..=MAX_PORTAL_LINK_TTL_S).contains(&self.link_ttl_s) {
            return invalid(format!("ingest.portal.link_ttl_s: must be 60 to {MAX_PORTAL_LINK_TTL_S}, got {}", self.link_ttl_s));
        }
        if let Some(u) = &self.public_url {
            let ok = (u.starts_with("https://") || u.starts_with("http://"))
                && u.parse::<http::Uri>().is_ok_and(|x| x.host().is_some() && x.query().is_none());
            if !ok {
                return invalid(format!("ingest.portal.public_url: must be an http(s) URL such as https://hooks.example.com, got {u:?}"));
            }
        }
        for a in &self.frame_ancestors {
            if a.is_empty() || a.len() > 255 || a.bytes().any(|b| !b.is_ascii_graphic() || b == b';' || b == b',') {
                return invalid(format!(
                    "ingest.portal.frame_ancestors: {a:?} is not a CSP source such as https://app.example.com or 'self'"
                ));
            }
        }
        Ok(())
    }
}

/// The dead-letter topic's record format (`[dlq]`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DlqSettings {
    /// `protobuf` (the `DeadLetter` message) or `json` (the `hookline.dead_letter.v1` document,
    /// docs/dead-letters.md). Readers take both, so it can be changed at any time.
    pub format: hookline_core::dead_letter::DlqFormat,
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
            let ok = endpoint.strip_prefix("http://").is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
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
    /// Timeouts and connection cap of the API's listener (`[ingest.http]`).
    pub http: HttpServerSettings,
    /// /metrics, /healthz and /readyz on a listener of their own as well (unset: only on the API's), so probes and
    /// scrapes get answers however many connections the API's clients hold. Point Kubernetes probes here.
    pub health_addr: Option<SocketAddr>,
    /// Timeouts and connection cap of that listener (`[ingest.health_http]`).
    pub health_http: HttpServerSettings,
    /// Each tenant's publish quota unless the tenant has its own (`PATCH /v1/tenants/{id}`): events per second
    /// through `POST /v1/events`, answered 429 with `Retry-After` past it. 0: no quota.
    pub publish_rate_per_s: u32,
    /// Events a tenant may publish at once above the rate (0: one second's worth).
    pub publish_burst: u32,
    /// Portal links and embedding (`[ingest.portal]`).
    pub portal: PortalSettings,
    /// What `POST /v1/events` does with an event whose `data` fails its catalogued type's JSON Schema, for types
    /// that do not choose (`validation` of `/v1/event-types`).
    pub schema_validation: SchemaValidation,
    /// The Schema Registry that decodes Avro and Protobuf framed events (`[ingest.schema_registry]`; unset `url`:
    /// none).
    pub schema_registry: hookline_schema_registry::SchemaRegistrySettings,
}

/// How publishing checks an event's `data` against its type's JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaValidation {
    /// Not checked.
    Off,
    /// Accepted, counted (`hookline_schema_violations_total`) and logged once per type per minute.
    #[default]
    Warn,
    /// Refused with 422 naming the path inside the event and the rule.
    Reject,
}

impl SchemaValidation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Warn => "warn",
            Self::Reject => "reject",
        }
    }
}

impl Default for IngestSettings {
    fn default() -> Self {
        Self {
            listen_addr: "0.0.0.0:8080".parse().expect("literal address"),
            api_tokens: Vec::new(),
            max_event_bytes: 960 << 10,
            max_request_bytes: 2 << 20,
            group_id: "hookline-ingest".into(),
            http: HttpServerSettings::default(),
            health_addr: None,
            health_http: HttpServerSettings::default(),
            publish_rate_per_s: 0,
            publish_burst: 0,
            portal: PortalSettings::default(),
            schema_validation: SchemaValidation::default(),
            schema_registry: Default::default(),
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
    /// lane would need over 5 s to drain at the pace it can finish work: its recent pace over windows of at least
    /// 1 s, or its concurrency ÷ the time a delivery takes if more); beyond it new
    /// ones, and those it had queued beyond it, are parked on the retry ladder (not an attempt), so a slow or
    /// hanging endpoint cannot use up `max_in_flight`. Parked tasks of a lane that still finishes work (1/s or more)
    /// come back one by one at its pace; those of a hanging one after 4 s, 15 s, then each minute (or its estimated
    /// drain time, at most 1 min). Not judged while the broker or the process stalls, nor for 5 s after. A lane
    /// that can finish work at ≥ ¼ of the mean pace of all lanes (and ≥ 1/s) is not judged stuck while it would
    /// drain within 30 s.
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
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifySettings {
    /// `host:port` of the SMTP server. Unset: no e-mail.
    pub smtp_addr: Option<String>,
    /// `starttls`, `implicit` (SMTPS, usually port 465) or `none`. Unset: `none` to a loopback address (a local
    /// relay or sidecar), `starttls` to anything else.
    pub tls: Option<SmtpTls>,
    /// PEM file of the CA certificates that sign the server's certificate, trusted instead of the public roots
    /// (a relay with a private CA). Unset: the public (webpki) roots.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Envelope sender and `From:` header.
    pub from: String,
    /// AUTH credentials (PLAIN or LOGIN, whichever the server offers), used only when both are set. Never sent
    /// in plain text except to a loopback address.
    pub username: Option<String>,
    pub password: Option<String>,
    /// Per SMTP step (connect with greeting and EHLO, STARTTLS, AUTH, each command, the message).
    pub timeout_ms: u64,
}

/// How the SMTP connection is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmtpTls {
    /// Plain connect, then `STARTTLS` before anything else; a server that does not offer it is an error (never a
    /// fallback to plain text).
    Starttls,
    /// TLS from the first byte (SMTPS).
    Implicit,
    /// No TLS: for a relay on loopback.
    None,
}

impl Default for NotifySettings {
    fn default() -> Self {
        Self {
            smtp_addr: None,
            tls: None,
            tls_ca_file: None,
            from: "hookline@localhost".into(),
            username: None,
            password: None,
            timeout_ms: 10_000,
        }
    }
}

impl std::fmt::Debug for NotifySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifySettings")
            .field("smtp_addr", &self.smtp_addr)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("from", &self.from)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl NotifySettings {
    /// The host and port of `smtp_addr` (`[::1]:25` gives `::1`).
    pub fn host_port(&self) -> Option<(String, u16)> {
        let (host, port) = self.smtp_addr.as_deref()?.rsplit_once(':')?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        (!host.is_empty()).then(|| (host.to_owned(), port))
    }

    /// Whether `smtp_addr` is on this machine (`localhost`, 127.0.0.0/8, `::1`).
    pub fn is_loopback(&self) -> bool {
        self.host_port()
            .is_some_and(|(h, _)| h.eq_ignore_ascii_case("localhost") || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))
    }

    /// `tls`, or its default for `smtp_addr`.
    pub fn tls_mode(&self) -> SmtpTls {
        self.tls.unwrap_or(if self.is_loopback() { SmtpTls::None } else { SmtpTls::Starttls })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        let Some(addr) = &self.smtp_addr else { return Ok(()) };
        if self.host_port().is_none() {
            return invalid(format!("notify.smtp_addr: must be host:port (a port 1-65535), got {addr:?}"));
        }
        let plain = |s: &str| s.bytes().all(|b| b.is_ascii_graphic() && !b"<>(),;\\".contains(&b));
        if !self.from.contains('@') || !plain(&self.from) {
            return invalid("notify.from: must be an e-mail address such as hookline@example.com".into());
        }
        if self.username.is_some() != self.password.is_some() {
            return invalid("notify.username, notify.password: set both or neither".into());
        }
        let tls = self.tls_mode();
        // The password would cross the network readable by anyone on the path.
        if self.username.is_some() && tls == SmtpTls::None && !self.is_loopback() {
            return invalid(format!(
                "notify.tls: \"none\" would send notify.username/notify.password in plain text to {addr}; use \"starttls\" \
                 or \"implicit\" (plain text is allowed only to a loopback relay)"
            ));
        }
        if self.tls_ca_file.is_some() && tls == SmtpTls::None {
            return invalid("notify.tls_ca_file: set, but notify.tls is \"none\" (no TLS to verify)".into());
        }
        if self.timeout_ms == 0 {
            return invalid("notify.timeout_ms: must be at least 1".into());
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

    pub fn from_toml_with_env(text: &str, origin: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
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
        self.log.validate()?;
        self.telemetry.validate()?;
        self.ingest.portal.validate()?;
        self.ingest.schema_registry.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.ingest.http.validate("ingest.http").map_err(ConfigError::Invalid)?;
        self.ingest.health_http.validate("ingest.health_http").map_err(ConfigError::Invalid)?;
        for (key, v, max) in [
            ("ingest.publish_rate_per_s", self.ingest.publish_rate_per_s, hookline_core::rate_limit::MAX_PUBLISH_PER_S),
            ("ingest.publish_burst", self.ingest.publish_burst, hookline_core::rate_limit::MAX_PUBLISH_BURST),
        ] {
            if v > max {
                return Err(ConfigError::Invalid(format!("{key}: at most {max}, got {v}")));
            }
        }
        if self.ingest.publish_burst > 0 && self.ingest.publish_rate_per_s == 0 {
            return Err(ConfigError::Invalid("ingest.publish_burst: a burst needs a rate: set ingest.publish_rate_per_s".into()));
        }
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
    let key = if parents.len() == 2 && parents[0] == "kafka" && parents[1] == "properties" { last.replace('_', ".") } else { last.clone() };
    cursor.insert(key, parse_env_value(value));
    Ok(())
}

fn parse_env_value(value: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct Wrapper {
        v: toml::Value,
    }
    // TOML reads `inf` and `nan` as floats; no setting wants those, and `inf` is a likely typo for `info`.
    if value.trim_start_matches(['+', '-']).eq_ignore_ascii_case("inf") || value.trim_start_matches(['+', '-']).eq_ignore_ascii_case("nan")
    {
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

/// Adds "did you mean `x`?" to serde's "unknown field `y`, expected one of `a`, `b`" when a known key is close, and
/// says `a whole number` where serde says `u64`.
fn with_hint(message: &str) -> String {
    hookline_core::words::reword(message)
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
        // The mock broker answers no admin request for authorized operations.
        c.kafka.check_acls_at_start = false;
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
        // A local master key and portal-link key, made for this run (nothing of a dev run outlives it).
        let mut rng = rand::rng();
        c.secrets.keys = vec![hookline_core::seal::generate_entry("dev", &mut rng)];
        c.ingest.portal.link_secret = Some(hookline_core::sign::generate_secret(&mut rng));
        // Like the embedded broker, the delivery log does not outlive the run: a file of its own under the temp
        // dir (unique per call, so tests running side by side never share one), which `hookline dev` removes.
        c.log.sqlite_path = dev_log_dir().join("delivery-log.sqlite3");
        c
    }
}

/// A directory name (not created) under the temp dir, unique per call and per process.
fn dev_log_dir() -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let temp = std::env::temp_dir();
    // `hookline dev` removes its own on exit, but a killed run, a test or a bench leaves one behind each time (a
    // delivery log of up to hundreds of MB): the first dev config of a process removes those of exited processes.
    SWEPT.call_once(|| {
        sweep_dev_log_dirs(&temp, |pid| std::path::Path::new("/proc").join(pid.to_string()).exists());
    });
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    temp.join(format!("{DEV_LOG_DIR_PREFIX}{}-{n}", std::process::id()))
}

const DEV_LOG_DIR_PREFIX: &str = "hookline-dev-";

/// Removes `hookline-dev-<pid>-<n>` directories under `temp` whose process is gone. Only where `/proc` tells
/// (Linux); elsewhere nothing is removed. Errors are ignored: another process may be sweeping the same dir.
fn sweep_dev_log_dirs(temp: &std::path::Path, alive: impl Fn(u32) -> bool) -> usize {
    if !std::path::Path::new("/proc/self").exists() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(temp) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DEV_LOG_DIR_PREFIX)) else { continue };
        let Some((pid, n)) = rest.split_once('-') else { continue };
        let (Ok(pid), true) = (pid.parse::<u32>(), !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        if pid != std::process::id() && !alive(pid) && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_log_dirs_of_exited_processes_are_swept_and_others_kept() {
        let temp = std::env::temp_dir().join(format!("hookline-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&temp);
        let me = std::process::id();
        for name in [
            "hookline-dev-4000000-0",
            "hookline-dev-4000000-7",
            format!("hookline-dev-{me}-0").as_str(),
            "hookline-dev-4000001-0",
            "hookline-dev-x-0",
            "hookline-dev-4000000-",
            "other",
        ] {
            std::fs::create_dir_all(temp.join(name).join("sub")).unwrap();
        }
        // 4000000 has exited, 4000001 is alive.
        assert_eq!(sweep_dev_log_dirs(&temp, |pid| pid == 4_000_001), 2);
        let mut left: Vec<String> = std::fs::read_dir(&temp).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        let mut want = vec![
            format!("hookline-dev-{me}-0"),
            "hookline-dev-4000000-".into(),
            "hookline-dev-4000001-0".into(),
            "hookline-dev-x-0".into(),
            "other".into(),
        ];
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&temp).unwrap();
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn dlq_format_is_read_from_file_and_env_and_a_wrong_one_names_the_key() {
        use hookline_core::dead_letter::DlqFormat;
        assert_eq!(Config::from_toml_with_env("", "t", env(&[])).unwrap().dlq.format, DlqFormat::Protobuf);
        assert_eq!(Config::from_toml_with_env("[dlq]\nformat = \"json\"\n", "t", env(&[])).unwrap().dlq.format, DlqFormat::Json);
        let c = Config::from_toml_with_env("", "t", env(&[("HOOKLINE_DLQ__FORMAT", "json")])).unwrap();
        assert_eq!(c.dlq.format, DlqFormat::Json);
        let e = Config::from_toml_with_env("[dlq]\nformat = \"avro\"\n", "t", env(&[])).unwrap_err().to_string();
        assert!(e.contains("format") && e.contains("json"), "{e}");
        let e = Config::from_toml_with_env("", "t", env(&[("HOOKLINE_DLQ__FORMAT", "xml")])).unwrap_err().to_string();
        assert!(e.contains("HOOKLINE_DLQ__FORMAT"), "{e}");
    }

    #[test]
    fn master_keys_come_from_the_list_and_the_file_and_errors_name_the_key() {
        let mut rng = rand::rng();
        let (a, b) = (hookline_core::seal::generate_entry("a", &mut rng), hookline_core::seal::generate_entry("b", &mut rng));
        let dir = std::env::temp_dir().join(format!("hookline-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, format!("# rotated in March\n{b}   # the new one\n\n")).unwrap();
        let env_keys = format!("[\"{a}\"]");
        let c = Config::from_toml_with_env(
            &format!("[secrets]\nkeys_file = {:?}\nwrite_key = \"b\"\n", file.display().to_string()),
            "f",
            env(&[("HOOKLINE_SECRETS__KEYS", &env_keys)]),
        )
        .unwrap();
        let ring = c.secrets.keyring().unwrap();
        assert_eq!((ring.ids(), ring.write_key_id()), (vec!["a", "b"], "b"));
        let dbg = format!("{:?}", c.secrets);
        assert!(!dbg.contains(a.split_once(':').unwrap().1), "Debug shows key ids only: {dbg}");
        let e = SecretsSettings { write_key: Some("c".into()), ..c.secrets.clone() }.keyring().unwrap_err();
        assert!(e.to_string().contains("secrets.write_key"), "{e}");
        let e = SecretsSettings::default().keyring().unwrap_err();
        assert!(e.to_string().contains("secrets.keys") && e.to_string().contains("no master key"), "{e}");
        let e = SecretsSettings { keys_file: Some(dir.join("missing")), ..Default::default() }.keyring().unwrap_err();
        assert!(e.to_string().contains("secrets.keys_file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(Config::dev("x:1", 1, "t").secrets.keyring().is_ok(), "dev mode makes its own key");
    }

    #[test]
    fn portal_settings_are_checked_by_name() {
        for (toml, key) in [
            ("[ingest.portal]\nlink_secret = \"short\"\n", "ingest.portal.link_secret"),
            ("[ingest.portal]\nlink_ttl_s = 10\n", "ingest.portal.link_ttl_s"),
            ("[ingest.portal]\npublic_url = \"hooks.example.com\"\n", "ingest.portal.public_url"),
            ("[ingest.portal]\nframe_ancestors = [\"https://a.example; script-src *\"]\n", "ingest.portal.frame_ancestors"),
        ] {
            let e = Config::from_toml_with_env(toml, "f", env(&[])).unwrap_err();
            assert!(e.to_string().contains(key), "{toml}: {e}");
        }
        let c = Config::from_toml_with_env(
            "[ingest.portal]\npublic_url = \"https://hooks.example.com\"\nframe_ancestors = [\"https://app.example.com\", \"'self'\"]\n",
            "f",
            env(&[("HOOKLINE_INGEST__PORTAL__LINK_SECRET", "0123456789abcdef0123456789abcdef")]),
        )
        .unwrap();
        assert_eq!(c.ingest.portal.link_ttl_s, 3600);
        assert!(!format!("{:?}", c.ingest.portal).contains("0123456789abcdef"));
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
    fn the_schema_registry_table_takes_env_overrides_and_names_its_bad_keys() {
        let c = Config::from_toml_with_env(
            "[ingest.schema_registry]\nrequest_timeout_ms = 2000\n",
            "t",
            env(&[("HOOKLINE_INGEST__SCHEMA_REGISTRY__URL", "http://registry:8081")]),
        )
        .unwrap();
        assert_eq!(c.ingest.schema_registry.url.as_deref(), Some("http://registry:8081"));
        assert_eq!(c.ingest.schema_registry.request_timeout_ms, 2000);
        for (toml, key) in [
            ("[ingest.schema_registry]\nurl = \"registry:8081\"\n", "ingest.schema_registry.url"),
            ("[ingest.schema_registry]\nurl = \"http://r\"\nretry_max_ms = 0\n", "ingest.schema_registry.retry_max_ms"),
            ("[ingest.schema_registry]\nurl_typo = \"http://r\"\n", "url_typo"),
        ] {
            let e = Config::from_toml_with_env(toml, "t", env(&[])).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
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
