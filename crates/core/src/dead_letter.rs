//! The dead-letter topic's record formats and headers. A dead letter is written as the `DeadLetter` protobuf
//! (the default) or, with `dlq.format = "json"`, as the versioned JSON document `hookline.dead_letter.v1`
//! (docs/dead-letters.md) that analysts' tools read without hookline's `.proto`. Either way the record carries
//! `hookline-*` headers, so a consumer filters on reason, subscription, event type and tenant without decoding.
//! Readers (redrive, `hookline dlq tail`, the delivery log) take both formats.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::model::{DeadLetter, Event};
use crate::time::{parse_rfc3339_ms, rfc3339_ms};

/// The `schema` of every JSON dead letter. A change that removes or retypes a field gets a new version; new
/// fields may be added within v1 (readers ignore fields they do not know).
pub const SCHEMA_V1: &str = "hookline.dead_letter.v1";

/// Header names, on records of both formats.
pub mod header {
    /// The `DeadLetterReason` word (`retries_exhausted`, `invalid_json`, ...).
    pub const REASON: &str = "hookline-reason";
    /// The subscription id; empty for an input event that could not be read (it has none).
    pub const SUBSCRIPTION: &str = "hookline-subscription";
    /// The event's type; empty when the record has no readable event.
    pub const EVENT_TYPE: &str = "hookline-event-type";
    /// The event's tenant, only when it has one.
    pub const TENANT: &str = "hookline-tenant";
    /// `json` or `protobuf`: how the value is encoded.
    pub const FORMAT: &str = "hookline-format";
}

/// How dead letters are written (`dlq.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DlqFormat {
    /// The `DeadLetter` message of proto/hookline/v1/hookline.proto.
    #[default]
    Protobuf,
    /// One `hookline.dead_letter.v1` JSON document per record.
    Json,
}

impl DlqFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DlqFormat::Protobuf => "protobuf",
            DlqFormat::Json => "json",
        }
    }

    pub fn from_word(word: &[u8]) -> Option<Self> {
        match word {
            b"protobuf" => Some(DlqFormat::Protobuf),
            b"json" => Some(DlqFormat::Json),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a DeadLetter protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    #[error("not a {SCHEMA_V1} document: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unsupported dead-letter schema {0:?} (this hookline reads {SCHEMA_V1})")]
    Schema(String),
    #[error("{field}: {message}")]
    Field { field: &'static str, message: String },
    #[error("unknown hookline-format header value {0:?} (json or protobuf)")]
    Format(String),
}

/// The headers of `dl`'s record: reason, subscription and event type always (empty when unknown), tenant when
/// set, and the format.
pub fn headers(dl: &DeadLetter, format: DlqFormat) -> Vec<(&'static str, String)> {
    let event = dl.event.as_ref();
    let mut out = vec![
        (header::REASON, dl.reason.clone()),
        (header::SUBSCRIPTION, dl.subscription_id.clone()),
        (header::EVENT_TYPE, event.map(|e| e.r#type.clone()).unwrap_or_default()),
    ];
    if let Some(t) = event.map(|e| &e.tenant).filter(|t| !t.is_empty()) {
        out.push((header::TENANT, t.clone()));
    }
    out.push((header::FORMAT, format.as_str().to_owned()));
    out
}

/// The record value of `dl` in `format`.
pub fn encode(dl: &DeadLetter, format: DlqFormat) -> Vec<u8> {
    match format {
        DlqFormat::Protobuf => prost::Message::encode_to_vec(dl),
        // Serialising a struct of strings, numbers and already-valid raw JSON cannot fail.
        DlqFormat::Json => serde_json::to_vec(&Document::from(dl)).unwrap_or_default(),
    }
}

/// The value of `dl`'s record in `format`, at most `max_bytes` long when that can be done without losing what
/// matters, and the format it is in. A JSON document is larger than the protobuf (field names; base64 is 4/3
/// of the bytes), so one that does not fit keeps only the start of an unreadable input's `raw` (the detail says
/// so; `source` points at the whole record); a delivery's dead letter whose event does not fit as JSON is written
/// as protobuf instead (which always fits: the event fitted a delivery task), its `hookline-format` header says so,
/// and nothing of the event is lost for a redrive.
pub fn encode_within(dl: &DeadLetter, format: DlqFormat, max_bytes: usize) -> (Vec<u8>, DlqFormat, Option<DeadLetter>) {
    if format == DlqFormat::Protobuf {
        return (encode(dl, format), format, None);
    }
    let json = encode(dl, DlqFormat::Json);
    if json.len() <= max_bytes {
        return (json, DlqFormat::Json, None);
    }
    if !dl.raw.is_empty() {
        // Every 3 raw bytes dropped shorten the document by 4; the detail grows by a few dozen.
        let excess = json.len() - max_bytes + 128;
        let drop = excess.div_ceil(4).saturating_mul(3);
        let keep = dl.raw.len().saturating_sub(drop);
        let mut cut = dl.clone();
        cut.raw = dl.raw.slice(..keep);
        cut.detail.push_str(&format!("; raw truncated to its first {keep} of {} bytes in the JSON dead letter", dl.raw.len()));
        let json = encode(&cut, DlqFormat::Json);
        if json.len() <= max_bytes {
            return (json, DlqFormat::Json, Some(cut));
        }
    }
    (encode(dl, DlqFormat::Protobuf), DlqFormat::Protobuf, None)
}

/// Reads a dead letter of either format: by its `hookline-format` header when the record has one, otherwise by
/// its content (a JSON document starts with `{`, which no `DeadLetter` protobuf does: its first byte is a field
/// tag, and field 15 — tag byte 0x78 — is the highest that fits in one byte).
pub fn decode(payload: &[u8], format_header: Option<&[u8]>) -> Result<DeadLetter, DecodeError> {
    let format = match format_header {
        Some(h) => DlqFormat::from_word(h).ok_or_else(|| DecodeError::Format(String::from_utf8_lossy(h).into_owned()))?,
        None if payload.trim_ascii_start().first() == Some(&b'{') => DlqFormat::Json,
        None => DlqFormat::Protobuf,
    };
    match format {
        DlqFormat::Protobuf => Ok(<DeadLetter as prost::Message>::decode(payload)?),
        DlqFormat::Json => serde_json::from_slice::<Document>(payload)?.try_into(),
    }
}

/// `hookline.dead_letter.v1`. Every field is always written; `null` where the record has no value.
#[derive(Debug, Serialize, Deserialize)]
pub struct Document {
    pub schema: String,
    pub reason: String,
    #[serde(default)]
    pub detail: Option<String>,
    /// `failed` or `dead`; `null` for an input event that could not be read.
    #[serde(default)]
    pub final_state: Option<String>,
    /// The profile's own word for the final state (Fynapse: `DEAD_LETTER`): the API's `platform_status`.
    #[serde(default)]
    pub platform_status: Option<String>,
    /// The same as `platform_status`: its first name, kept for readers written against it.
    #[serde(default)]
    pub status_word: Option<String>,
    #[serde(default)]
    pub delivery_id: Option<String>,
    #[serde(default)]
    pub subscription_id: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub event: Option<EventDoc>,
    /// Attempts made, as the API's `attempts_made`.
    #[serde(default)]
    pub attempts_made: Option<u32>,
    /// The same as `attempts_made`: its first name.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default)]
    pub last_attempt: Option<LastAttempt>,
    /// Epoch ms, as every time in the API (`first_attempt_at_ms`); `first_attempt_at` is the same in RFC 3339.
    #[serde(default)]
    pub first_attempt_at_ms: Option<i64>,
    #[serde(default)]
    pub first_attempt_at: Option<String>,
    /// Epoch ms; `dead_lettered_at` is the same in RFC 3339.
    #[serde(default)]
    pub dead_lettered_at_ms: Option<i64>,
    #[serde(default)]
    pub dead_lettered_at: Option<String>,
    /// Where an unreadable input record was read from.
    #[serde(default)]
    pub source: Option<Source>,
    /// An unreadable input record's value (or its first bytes), base64.
    #[serde(default)]
    pub raw_base64: Option<String>,
    /// That record's headers, in order; null when it had none.
    #[serde(default)]
    pub raw_headers: Option<Vec<RawHeader>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RawHeader {
    pub key: String,
    /// The header's bytes in standard base64.
    pub value_base64: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct EventDoc {
    pub id: String,
    #[serde(rename = "type")]
    pub r#type: String,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub entity_id: Option<String>,
    #[serde(default)]
    pub occurred_at: Option<String>,
    #[serde(default)]
    pub accepted_at: Option<String>,
    /// `json`: `payload` is the event's data as it was accepted; `base64`: `payload` is a string, the data's
    /// bytes in base64 (data that is not JSON, or not byte for byte as JSON writes it).
    pub payload_encoding: PayloadEncoding,
    pub payload: Box<RawValue>,
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub tracestate: Option<String>,
    /// CloudEvents context of an event that arrived as a CloudEvent (null otherwise).
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub extensions: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub data_content_type: Option<String>,
    #[serde(default)]
    pub data_schema: Option<String>,
    /// The Schema Registry id of a framed value (null when unframed).
    #[serde(default)]
    pub registry_schema_id: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadEncoding {
    Json,
    Base64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LastAttempt {
    /// `503`, `timeout`, `connect_error`, `lease_expired`, `oversize`, ...
    pub outcome: String,
    /// `null` when the try got no HTTP answer.
    #[serde(default)]
    pub http_status: Option<u32>,
    /// The start of the response body (capped), `null` when there was none.
    #[serde(default)]
    pub response_excerpt: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

fn some(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn time(ms: i64) -> Option<String> {
    (ms != 0).then(|| rfc3339_ms(ms)).flatten()
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl From<&DeadLetter> for Document {
    fn from(dl: &DeadLetter) -> Self {
        let event = dl.event.as_ref();
        let has_attempt = !dl.last_outcome.is_empty() || dl.last_http_status != 0;
        Document {
            schema: SCHEMA_V1.to_owned(),
            reason: dl.reason.clone(),
            detail: some(&dl.detail),
            final_state: some(&dl.final_state),
            platform_status: some(&dl.status_word),
            status_word: some(&dl.status_word),
            delivery_id: some(&dl.delivery_id),
            subscription_id: some(&dl.subscription_id),
            tenant: event.and_then(|e| some(&e.tenant)),
            event: event.map(EventDoc::from),
            attempts_made: Some(dl.attempts),
            attempts: dl.attempts,
            last_attempt: has_attempt.then(|| LastAttempt {
                outcome: dl.last_outcome.clone(),
                http_status: (dl.last_http_status != 0).then_some(dl.last_http_status),
                response_excerpt: some(&dl.last_response_excerpt),
            }),
            first_attempt_at_ms: (dl.first_attempt_at_ms > 0).then_some(dl.first_attempt_at_ms),
            first_attempt_at: time(dl.first_attempt_at_ms),
            dead_lettered_at_ms: (dl.at_ms > 0).then_some(dl.at_ms),
            dead_lettered_at: time(dl.at_ms),
            source: (!dl.source_topic.is_empty()).then(|| Source {
                topic: dl.source_topic.clone(),
                partition: dl.source_partition,
                offset: dl.source_offset,
            }),
            raw_base64: (!dl.raw.is_empty()).then(|| b64().encode(&dl.raw)),
            raw_headers: (!dl.raw_headers.is_empty())
                .then(|| dl.raw_headers.iter().map(|h| RawHeader { key: h.key.clone(), value_base64: b64().encode(&h.value) }).collect()),
        }
    }
}

impl From<&Event> for EventDoc {
    fn from(e: &Event) -> Self {
        let (payload_encoding, payload) = payload(&e.data_json);
        EventDoc {
            id: e.id.clone(),
            r#type: e.r#type.clone(),
            tenant: some(&e.tenant),
            entity_id: some(&e.entity_id),
            occurred_at: time(e.occurred_at_ms),
            accepted_at: time(e.accepted_at_ms),
            payload_encoding,
            payload,
            traceparent: some(&e.traceparent),
            tracestate: some(&e.tracestate),
            source: some(&e.source),
            subject: some(&e.subject),
            extensions: (!e.extensions.is_empty()).then(|| e.extensions.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            data_content_type: some(&e.data_content_type),
            data_schema: some(&e.data_schema),
            registry_schema_id: (e.registry_schema_id != 0).then_some(e.registry_schema_id),
        }
    }
}

/// The data as JSON when it is JSON exactly as a reader gets it back (no surrounding whitespace, which the raw
/// value would not keep), else as a base64 string: a redrive re-delivers the same bytes either way.
fn payload(data: &[u8]) -> (PayloadEncoding, Box<RawValue>) {
    let exact = data.first().is_some_and(|b| !b.is_ascii_whitespace()) && data.last().is_some_and(|b| !b.is_ascii_whitespace());
    if exact {
        if let Some(raw) = std::str::from_utf8(data).ok().and_then(|s| RawValue::from_string(s.to_owned()).ok()) {
            return (PayloadEncoding::Json, raw);
        }
    }
    let text = serde_json::to_string(&b64().encode(data)).unwrap_or_else(|_| "\"\"".into());
    (PayloadEncoding::Base64, RawValue::from_string(text).unwrap_or_else(|_| RawValue::NULL.to_owned()))
}

fn parse_time(field: &'static str, v: &Option<String>) -> Result<i64, DecodeError> {
    match v {
        None => Ok(0),
        Some(s) => parse_rfc3339_ms(s).ok_or_else(|| DecodeError::Field { field, message: format!("{s:?} is not an RFC 3339 time") }),
    }
}

impl TryFrom<Document> for DeadLetter {
    type Error = DecodeError;

    fn try_from(d: Document) -> Result<Self, DecodeError> {
        if d.schema != SCHEMA_V1 {
            return Err(DecodeError::Schema(d.schema));
        }
        let event = match d.event {
            None => None,
            Some(e) => {
                let data_json = match e.payload_encoding {
                    PayloadEncoding::Json => e.payload.get().as_bytes().to_vec(),
                    PayloadEncoding::Base64 => {
                        let text: String = serde_json::from_str(e.payload.get()).map_err(|_| DecodeError::Field {
                            field: "event.payload",
                            message: "must be a base64 string when payload_encoding is base64".into(),
                        })?;
                        b64()
                            .decode(text)
                            .map_err(|err| DecodeError::Field { field: "event.payload", message: format!("not base64: {err}") })?
                    }
                };
                Some(Event {
                    occurred_at_ms: parse_time("event.occurred_at", &e.occurred_at)?,
                    accepted_at_ms: parse_time("event.accepted_at", &e.accepted_at)?,
                    id: e.id,
                    r#type: e.r#type,
                    tenant: e.tenant.unwrap_or_default(),
                    entity_id: e.entity_id.unwrap_or_default(),
                    data_json: data_json.into(),
                    traceparent: e.traceparent.unwrap_or_default(),
                    tracestate: e.tracestate.unwrap_or_default(),
                    // Not in the JSON document: a redrive sends to the dead letter's own subscription anyway.
                    only_subscription_id: String::new(),
                    source: e.source.unwrap_or_default(),
                    subject: e.subject.unwrap_or_default(),
                    extensions: e.extensions.unwrap_or_default().into_iter().collect(),
                    data_content_type: e.data_content_type.unwrap_or_default(),
                    data_schema: e.data_schema.unwrap_or_default(),
                    registry_schema_id: e.registry_schema_id.unwrap_or(0),
                })
            }
        };
        let raw = match &d.raw_base64 {
            None => Vec::new(),
            Some(r) => b64().decode(r).map_err(|err| DecodeError::Field { field: "raw_base64", message: format!("not base64: {err}") })?,
        };
        let (last_outcome, last_http_status, last_response_excerpt) = match d.last_attempt {
            None => (String::new(), 0, String::new()),
            Some(a) => (a.outcome, a.http_status.unwrap_or(0), a.response_excerpt.unwrap_or_default()),
        };
        let source = d.source.unwrap_or(Source { topic: String::new(), partition: 0, offset: 0 });
        let mut raw_headers = Vec::new();
        for h in d.raw_headers.unwrap_or_default() {
            let value = b64()
                .decode(&h.value_base64)
                .map_err(|err| DecodeError::Field { field: "raw_headers.value_base64", message: format!("not base64: {err}") })?;
            raw_headers.push(crate::model::RecordHeader { key: h.key, value: value.into() });
        }
        Ok(DeadLetter {
            // Either name of each: the API's (`*_ms`, `platform_status`, `attempts_made`) first.
            at_ms: match d.dead_lettered_at_ms {
                Some(ms) => ms,
                None => parse_time("dead_lettered_at", &d.dead_lettered_at)?,
            },
            first_attempt_at_ms: match d.first_attempt_at_ms {
                Some(ms) => ms,
                None => parse_time("first_attempt_at", &d.first_attempt_at)?,
            },
            reason: d.reason,
            detail: d.detail.unwrap_or_default(),
            final_state: d.final_state.unwrap_or_default(),
            status_word: d.platform_status.or(d.status_word).unwrap_or_default(),
            subscription_id: d.subscription_id.unwrap_or_default(),
            delivery_id: d.delivery_id.unwrap_or_default(),
            event,
            raw: raw.into(),
            source_topic: source.topic,
            source_partition: source.partition,
            source_offset: source.offset,
            attempts: d.attempts_made.unwrap_or(d.attempts),
            last_outcome,
            last_http_status,
            last_response_excerpt,
            raw_headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery_dl(data: &[u8]) -> DeadLetter {
        DeadLetter {
            reason: "retries_exhausted".into(),
            detail: "HTTP 503".into(),
            final_state: "dead".into(),
            status_word: "DEAD_LETTER".into(),
            subscription_id: "sub_1".into(),
            delivery_id: "dlv_1".into(),
            event: Some(Event {
                id: "evt_1".into(),
                r#type: "order.paid".into(),
                occurred_at_ms: 1_767_225_600_000,
                tenant: "acme".into(),
                entity_id: "ord_9".into(),
                data_json: data.to_vec().into(),
                accepted_at_ms: 1_767_225_600_250,
                traceparent: String::new(),
                tracestate: String::new(),
                only_subscription_id: String::new(),
                // A CloudEvent's context, kept through either format.
                source: "/shop/orders".into(),
                subject: "order/9".into(),
                extensions: [("region".to_owned(), "eu".to_owned())].into(),
                data_content_type: "application/json".into(),
                data_schema: "https://example.com/order.json".into(),
                registry_schema_id: 7,
            }),
            attempts: 3,
            last_outcome: "503".into(),
            last_http_status: 503,
            last_response_excerpt: "busy".into(),
            at_ms: 1_767_225_660_123,
            first_attempt_at_ms: 1_767_225_600_300,
            ..Default::default()
        }
    }

    #[test]
    fn a_delivery_dead_letter_is_a_readable_document() {
        let dl = delivery_dl(br#"{"amount":12,"note":"caf\u00e9"}"#);
        let bytes = encode(&dl, DlqFormat::Json);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["schema"], "hookline.dead_letter.v1");
        assert_eq!(v["reason"], "retries_exhausted");
        assert_eq!(v["subscription_id"], "sub_1");
        assert_eq!(v["tenant"], "acme");
        assert_eq!(v["event"]["type"], "order.paid");
        assert_eq!(v["event"]["payload_encoding"], "json");
        assert_eq!(v["event"]["payload"]["amount"], 12);
        assert_eq!(v["event"]["occurred_at"], "2026-01-01T00:00:00.000Z");
        assert_eq!(v["last_attempt"], serde_json::json!({"outcome": "503", "http_status": 503, "response_excerpt": "busy"}));
        assert_eq!(v["attempts"], 3);
        assert_eq!(v["dead_lettered_at"], "2026-01-01T00:01:00.123Z");
        // The API's words too, for the same values: one vocabulary, the first names kept as aliases.
        assert_eq!((v["attempts_made"].as_u64(), v["dead_lettered_at_ms"].as_i64()), (Some(3), Some(1_767_225_660_123)));
        assert_eq!(v["first_attempt_at_ms"], 1_767_225_600_300i64);
        assert_eq!(v["platform_status"], v["status_word"]);
        assert_eq!(v["source"], serde_json::Value::Null);
        assert_eq!(v["event"]["source"], "/shop/orders");
        assert_eq!(v["event"]["extensions"], serde_json::json!({"region": "eu"}));
        assert_eq!(v["event"]["registry_schema_id"], 7);
        assert_eq!(decode(&bytes, None).unwrap(), dl, "read back by content");
        assert_eq!(decode(&bytes, Some(b"json")).unwrap(), dl);
    }

    #[test]
    fn data_that_is_not_exact_json_is_base64_and_comes_back_byte_for_byte() {
        for data in [&b"\xff\x00binary"[..], b" {\"a\":1}", b"{\"a\":", b""] {
            let dl = delivery_dl(data);
            let bytes = encode(&dl, DlqFormat::Json);
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["event"]["payload_encoding"], "base64", "{data:?}");
            assert!(v["event"]["payload"].is_string());
            assert_eq!(decode(&bytes, None).unwrap().event.unwrap().data_json.as_ref(), data);
        }
    }

    #[test]
    fn an_unreadable_input_keeps_its_raw_bytes_and_source() {
        let dl = DeadLetter {
            reason: "invalid_json".into(),
            detail: "expected value at line 1".into(),
            raw: b"{nope".to_vec().into(),
            source_topic: "hookline.events".into(),
            source_partition: 2,
            source_offset: 41,
            at_ms: 5,
            raw_headers: vec![crate::model::RecordHeader { key: "ce_specversion".into(), value: b"0.3".to_vec().into() }],
            ..Default::default()
        };
        let bytes = encode(&dl, DlqFormat::Json);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["raw_headers"], serde_json::json!([{"key": "ce_specversion", "value_base64": "MC4z"}]));
        assert_eq!(v["event"], serde_json::Value::Null);
        assert_eq!(v["subscription_id"], serde_json::Value::Null);
        assert_eq!(v["raw_base64"], "e25vcGU=");
        assert_eq!(v["source"], serde_json::json!({"topic": "hookline.events", "partition": 2, "offset": 41}));
        assert_eq!(decode(&bytes, None).unwrap(), dl);
        let h = headers(&dl, DlqFormat::Json);
        assert_eq!(
            h,
            vec![
                ("hookline-reason", "invalid_json".into()),
                ("hookline-subscription", String::new()),
                ("hookline-event-type", String::new()),
                ("hookline-format", "json".into())
            ]
        );
    }

    #[test]
    fn protobuf_is_told_apart_by_content_or_header() {
        let dl = delivery_dl(b"{}");
        let pb = encode(&dl, DlqFormat::Protobuf);
        assert_eq!(decode(&pb, None).unwrap(), dl);
        assert_eq!(decode(&pb, Some(b"protobuf")).unwrap(), dl);
        assert!(matches!(decode(&pb, Some(b"avro")), Err(DecodeError::Format(_))));
        let h = headers(&dl, DlqFormat::Protobuf);
        assert!(h.contains(&("hookline-tenant", "acme".into())) && h.contains(&("hookline-event-type", "order.paid".into())), "{h:?}");
    }

    #[test]
    fn a_document_too_large_for_a_record_is_cut_or_written_as_protobuf() {
        let input = DeadLetter {
            reason: "invalid_json".into(),
            raw: vec![b'x'; 30_000].into(),
            source_topic: "hookline.events".into(),
            ..Default::default()
        };
        let (value, format, cut) = encode_within(&input, DlqFormat::Json, 30_000);
        assert_eq!(format, DlqFormat::Json);
        assert!(value.len() <= 30_000, "{}", value.len());
        let back = decode(&value, None).unwrap();
        assert!(back.raw.len() > 20_000 && back.raw.len() < 30_000 && back.raw.iter().all(|b| *b == b'x'), "{}", back.raw.len());
        assert!(back.detail.contains("raw truncated to its first") && back.detail.contains("of 30000 bytes"), "{}", back.detail);
        assert_eq!(cut.unwrap().raw.len(), back.raw.len());

        // A delivery's event is never cut: the record is protobuf, whole.
        let big = delivery_dl(&vec![0xffu8; 30_000]);
        let (value, format, cut) = encode_within(&big, DlqFormat::Json, 32_000);
        assert_eq!((format, cut), (DlqFormat::Protobuf, None));
        assert_eq!(decode(&value, None).unwrap(), big);
        // What fits stays JSON, untouched.
        let small = delivery_dl(b"{}");
        let (value, format, _) = encode_within(&small, DlqFormat::Json, 32_000);
        assert_eq!((format, decode(&value, Some(b"json")).unwrap()), (DlqFormat::Json, small));
    }

    #[test]
    fn documents_of_another_schema_or_with_bad_fields_are_refused() {
        let e = decode(br#"{"schema":"hookline.dead_letter.v2","reason":"x"}"#, None).unwrap_err();
        assert!(matches!(e, DecodeError::Schema(_)), "{e}");
        let e = decode(br#"{"schema":"hookline.dead_letter.v1","reason":"x","dead_lettered_at":"yesterday"}"#, None).unwrap_err();
        assert!(e.to_string().contains("dead_lettered_at"), "{e}");
        let e = decode(br#"{"schema":"hookline.dead_letter.v1","reason":"x","event":{"id":"e","type":"t","payload_encoding":"base64","payload":{"a":1}}}"#, None).unwrap_err();
        assert!(e.to_string().contains("event.payload"), "{e}");
        // A field added later within v1 is ignored.
        assert!(decode(br#"{"schema":"hookline.dead_letter.v1","reason":"x","added_later":true}"#, None).is_ok());
    }
}
