//! The policy document: what a TOML policy file can say. Parsing and validation live in `mod.rs`.
//!
//! Units are in the field names. Waits are seconds as numbers (fractions allowed, so tests can scale a schedule
//! down); sub-second knobs are milliseconds.

use serde::{Deserialize, Serialize};

/// A delivery policy: schedule, classification, disablement, request shape and egress rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Profile name (`lucibook`, `standard`, ...) or a custom name.
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub schedule: Schedule,
    pub attempt: AttemptLimits,
    /// Tries inside one attempt for outcomes whose rule sets `micro_retry = true`.
    #[serde(default)]
    pub micro_retries: Option<MicroRetries>,
    /// Ordered outcome classification: the first rule whose `when` matches decides.
    pub classify: Vec<Rule>,
    /// What running out of attempts (or window) means.
    pub exhausted: FinalKind,
    #[serde(default)]
    pub disable: Option<DisableRule>,
    /// What happens to a delivery whose subscription is paused or disabled.
    pub inactive: InactiveAction,
    /// What an attempt lost with its dispatcher (a crash mid-request) counts as.
    #[serde(default)]
    pub in_flight: InFlightRule,
    #[serde(default)]
    pub follow_ups: Vec<FollowUp>,
    pub request: RequestShape,
    #[serde(default)]
    pub egress: EgressRules,
    #[serde(default)]
    pub status_words: StatusWords,
    /// When present, an endpoint must answer a challenge before it gets deliveries (on create and on URL change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Default per-endpoint rate limit of subscriptions under this policy (their own fields win).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitDefaults>,
    /// When present, a circuit breaker per endpoint (see `crate::breaker`). Off by default: the platforms'
    /// schedules are exact without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerRule>,
    /// When present, adaptive concurrency per endpoint (see `crate::concurrency`); off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyRule>,
}

/// `[concurrency]`: concurrent requests to one endpoint adapt between `min` and `max` (AIMD); a `Retry-After` on a
/// 429/503 pauses the whole endpoint until then when `pause_on_retry_after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyRule {
    #[serde(default = "default_concurrency_min")]
    pub min: u32,
    pub max: u32,
    /// An answer slower than this counts as overload, like a 429/503. Unset: only those and timeouts do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_ms: Option<u64>,
    #[serde(default = "default_true")]
    pub pause_on_retry_after: bool,
}

fn default_concurrency_min() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

/// The most concurrent requests `[concurrency]` may allow one endpoint.
pub const MAX_CONCURRENCY: u32 = 1_000;

/// `[breaker]`: after `consecutive_errors` connect errors, TLS errors or timeouts in a row, the endpoint gets no
/// request for `cool_off_ms`, then one probe; a failed probe doubles the cool-off, up to `max_cool_off_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerRule {
    pub consecutive_errors: u32,
    pub cool_off_ms: u64,
    #[serde(default = "default_max_cool_off")]
    pub max_cool_off_ms: u64,
}

fn default_max_cool_off() -> u64 {
    600_000
}

/// The longest a breaker stays open at once: an hour.
pub const MAX_BREAKER_COOL_OFF_MS: u64 = 3_600_000;

/// `[rate_limit]`: requests per second to one endpoint, with a burst (default: one second's worth).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitDefaults {
    pub per_s: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

/// Endpoint verification: the endpoint must pass a handshake before it gets deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    #[serde(default)]
    pub method: VerificationMethod,
    /// Bounds the whole challenge exchange (connect + answer), like `attempt.timeout_ms` bounds an attempt.
    #[serde(default = "default_verification_timeout")]
    pub timeout_ms: u64,
    /// `cloudevents` only: the sending system's name, sent as `WebHook-Request-Origin` and, once granted, as
    /// `Origin` on every delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// How an endpoint proves it wants the deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum VerificationMethod {
    /// A signed POST carrying a random token the endpoint must echo.
    #[default]
    Challenge,
    /// The CloudEvents webhook validation handshake (HTTP 1.1 Web Hooks for Event Delivery, section 4):
    /// `OPTIONS` with `WebHook-Request-Origin`, answered by a 2xx with `WebHook-Allowed-Origin`.
    Cloudevents,
}

impl Verification {
    /// The origin a CloudEvents handshake grants: sent as `Origin` on every delivery (the web hooks spec asks it
    /// of a sender once permission is granted). `None` for the echo challenge.
    pub fn cloudevents_origin(&self) -> Option<&str> {
        match self.method {
            VerificationMethod::Cloudevents => self.origin.as_deref(),
            VerificationMethod::Challenge => None,
        }
    }
}

fn default_verification_timeout() -> u64 {
    5_000
}

/// The longest a challenge may wait: the API answers the create or verify request only after it.
pub const MAX_VERIFICATION_TIMEOUT_MS: u64 = 10_000;

/// Waits between attempts, each measured from the end of the previous attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Explicit waits: the wait before attempt n+1 is `waits_s[n-1]`. Exclusive with `exponential`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_s: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponential: Option<Exponential>,
    /// Total attempts including the first. For an explicit list it defaults to `waits_s.len() + 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// No attempt is scheduled to start later than this long after the first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Jitter>,
}

/// wait(n) = min(initial_s * multiplier^(n-1), max_s) for the wait after attempt n.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exponential {
    pub initial_s: f64,
    pub multiplier: f64,
    pub max_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jitter {
    pub mode: JitterMode,
    /// 0.2 = ±20% (`plus_minus`) or +0..20% (`plus`).
    pub ratio: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JitterMode {
    PlusMinus,
    Plus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptLimits {
    /// One deadline for connect + TLS + request + response headers and body.
    pub timeout_ms: u64,
    /// At most this many response-body bytes are read (the rest is discarded, the connection closed).
    pub response_cap_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MicroRetries {
    /// Tries in one attempt, the first included (Fynapse: 2).
    pub max_tries: u32,
    pub delay_min_ms: u64,
    pub delay_max_ms: u64,
}

/// One classification row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Matchers, any of which matches: `"2xx"`, `"503"`, `"500-599"`, `"any_status"`, `"timeout"`,
    /// `"connect_error"`, `"tls_error"`, `"egress_refused"`, `"invalid_url"`, `"any"`.
    pub when: Vec<String>,
    pub verdict: VerdictKind,
    #[serde(default)]
    pub counts_toward_disable: bool,
    #[serde(default)]
    pub retry_after: RetryAfterUse,
    /// Whether this outcome may be retried inside the same attempt (see `micro_retries`).
    #[serde(default)]
    pub micro_retry: bool,
    /// For `terminal`: the final state. Defaults to `dead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_state: Option<FinalKind>,
    /// A label for docs and logs ("429 is a backoff signal").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Success,
    Retry,
    Terminal,
}

/// How a `Retry-After` header on a retried response is used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum RetryAfterUse {
    #[default]
    Ignore,
    /// Next wait = clamp(Retry-After, [the attempt's scheduled wait, max_s]).
    Clamp { max_s: f64 },
    /// Next wait = Retry-After * (1 + U[0, jitter_ratio]), at most max_s.
    BasePlusJitter { jitter_ratio: f64, max_s: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalKind {
    Failed,
    Dead,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisableRule {
    /// After this many consecutive counted failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_consecutive_failures: Option<u32>,
    /// After every counted attempt failed for this long since the first failure (no success in between).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_failing_for_s: Option<f64>,
    pub action: DisableAction,
    /// Shown on the subscription (`disabled_reason`) and in the ops event.
    pub reason: String,
    /// Send an ops event and, where SMTP is configured, an e-mail to the owner.
    #[serde(default = "yes")]
    pub notify: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisableAction {
    Pause,
    Disable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InactiveAction {
    /// Keep the delivery until the subscription is resumed.
    Hold,
    /// End it with status `cancelled`.
    Cancel,
    /// Drop it from the live path (recorded as skipped; recoverable by replay).
    Skip,
}

/// An attempt whose dispatcher died while it was in flight: its outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum InFlightRule {
    /// It did not happen: the next owner makes the same attempt again (receivers may see it twice).
    #[default]
    Redo,
    /// It counts as a failed attempt (LuciBook's in-flight reaper): retried on the schedule if attempts remain,
    /// `dead` if none remain. Costs one acknowledged write before each attempt and one after.
    Count,
}

/// An event emitted when a delivery of `on_event_type` ends `dead` (Relay: `message.failed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FollowUp {
    pub on_event_type: String,
    pub emit_event_type: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestShape {
    pub signature: SignatureScheme,
    /// Verification tolerance documented to receivers (and used by `hookline verify`).
    #[serde(default = "default_tolerance")]
    pub signature_tolerance_s: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type_header: Option<String>,
    /// 1 on the first try, counting up across retries and redeliveries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_id_header: Option<String>,
    #[serde(default)]
    pub body_style: BodyStyle,
    /// What the request carries: hookline's JSON envelope, or the event as a CloudEvent (HTTP binding).
    #[serde(default)]
    pub format: RequestFormat,
    /// The CloudEvents `source` of events that did not arrive as CloudEvents (a URI-reference; `{tenant}` is
    /// replaced by the event's tenant). Unset: `/hookline/<tenant>`, or `/hookline` for an event without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloudevents_source: Option<String>,
    pub body_limit_bytes: u64,
    pub oversize: OversizeAction,
}

fn default_tolerance() -> u64 {
    300
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignatureScheme {
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`.
    StandardWebhooks,
    /// `Gauge-Signature: t=<epoch ms>,v1=<hex>` plus legacy `x-pulse-*` copies.
    Gauge,
    None,
}

/// Field names of the JSON body: `occurred_at`/`entity_id` or `occurredAt`/`entityId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BodyStyle {
    #[default]
    SnakeCase,
    CamelCase,
}

/// The request's format. CloudEvents formats follow the CloudEvents HTTP protocol binding 1.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RequestFormat {
    /// `{"id","type","occurred_at","tenant","entity_id","data"}` (see `body_style`).
    #[default]
    Envelope,
    /// Binary content mode: the attributes as `ce-*` headers, `Content-Type` the data's, the body the data alone.
    CloudeventsBinary,
    /// Structured content mode: `application/cloudevents+json`, the whole event in the JSON event format.
    CloudeventsStructured,
}

impl RequestFormat {
    pub fn is_cloudevents(self) -> bool {
        !matches!(self, RequestFormat::Envelope)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum OversizeAction {
    /// The delivery ends `dead` with reason `oversize`.
    Dead,
    /// Cut the string at `pointer` (JSON pointer into the body) until the body fits, and add
    /// `truncated: true` and `fetchUrl` (from the template; `{event_id}` is replaced) next to it.
    Truncate { pointer: String, fetch_url_template: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRules {
    #[serde(default = "https_only")]
    pub allowed_schemes: Vec<String>,
    #[serde(default)]
    pub blocked_hostnames: Vec<String>,
    /// Extra CIDR ranges refused on top of the built-in non-public tables.
    #[serde(default)]
    pub deny_ranges: Vec<String>,
}

impl Default for EgressRules {
    fn default() -> Self {
        Self { allowed_schemes: https_only(), blocked_hostnames: Vec::new(), deny_ranges: Vec::new() }
    }
}

fn https_only() -> Vec<String> {
    vec!["https".to_owned()]
}

/// The profile's own words for a delivery's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusWords {
    pub pending: String,
    pub succeeded: String,
    pub failed: String,
    pub dead: String,
    pub cancelled: String,
    pub skipped: String,
}

impl Default for StatusWords {
    fn default() -> Self {
        Self {
            pending: "pending".into(),
            succeeded: "succeeded".into(),
            failed: "failed".into(),
            dead: "dead".into(),
            cancelled: "cancelled".into(),
            skipped: "skipped".into(),
        }
    }
}
