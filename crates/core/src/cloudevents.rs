//! CloudEvents in: the Kafka protocol binding (binary and structured content modes) and the HTTP binding of
//! `POST /v1/events`, mapped onto hookline's [`Event`]. docs/operations.md ("CloudEvents") has the mapping; in short:
//!
//! | CloudEvents | hookline |
//! |---|---|
//! | `id`, `type` | `id`, `type` |
//! | `source`, `subject` | `source`, `subject` (filter paths `source`, `subject`) |
//! | `time` | `occurred_at` |
//! | `partitionkey` (or the Kafka record key), else `subject` | `entity_id` (so `ordering_key = "entity_id"` works) |
//! | extension `tenant` | `tenant` |
//! | `traceparent`, `tracestate` (distributed tracing extension) | the trace context the deliveries continue |
//! | other extensions | `extensions` (filter paths `extensions.<name>`) |
//! | `datacontenttype`, `dataschema` | kept for CloudEvents out |
//! | data (JSON, or text as a JSON string) | `data` |
//!
//! Only specversion 1.0 is read. Data must be JSON (`application/json`, any `+json` type, or no content type) or
//! text (`text/*`, delivered as a JSON string); other media types are refused with a reason naming the type.

use std::collections::HashMap;

use base64::Engine;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::event_decode::{invalid_at, Invalid};
use crate::model::Event;
use crate::vocabulary::DeadLetterReason as Reason;

/// The structured mode's media type (`content-type: application/cloudevents+json`, parameters allowed).
pub const STRUCTURED_JSON: &str = "application/cloudevents+json";
/// The only specversion read.
pub const SPECVERSION: &str = "1.0";
/// More extension attributes than any real producer sets: beyond it the event is refused, not truncated.
pub const MAX_EXTENSIONS: usize = 32;
/// Longest accepted value of `source`, `subject`, `dataschema`, `datacontenttype` or an extension.
pub const MAX_ATTRIBUTE_BYTES: usize = 2048;
/// The CloudEvents specification asks extension names to be at most 20 characters; a little slack is allowed.
const MAX_EXTENSION_NAME: usize = 64;

/// Where the context attributes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Kafka record headers `ce_<name>`, UTF-8 as they are.
    Kafka,
    /// HTTP headers `ce-<name>`, percent-encoded (the HTTP binding, section 3.1.3.2).
    Http,
}

impl Binding {
    fn prefix(self) -> &'static str {
        match self {
            Binding::Kafka => "ce_",
            Binding::Http => "ce-",
        }
    }
}

/// The attributes a record or request carries outside its value: the CloudEvents headers, the content type and,
/// on Kafka, the record key. Empty for almost every record that is not a CloudEvent, so building it costs nothing
/// then.
#[derive(Debug, Default, Clone)]
pub struct Context<'a> {
    /// `(name without the prefix, lower case; value)`.
    pub attributes: Vec<(String, &'a [u8])>,
    pub content_type: Option<&'a [u8]>,
    pub key: Option<&'a [u8]>,
    pub binding: Option<Binding>,
}

impl<'a> Context<'a> {
    /// Collects what matters from `(name, value)` headers: `ce_*` / `ce-*` and `content-type`.
    pub fn from_headers(binding: Binding, headers: impl IntoIterator<Item = (&'a str, &'a [u8])>, key: Option<&'a [u8]>) -> Self {
        let mut c = Context { key, binding: Some(binding), ..Default::default() };
        let prefix = binding.prefix();
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("content-type") {
                c.content_type = c.content_type.or(Some(value));
            } else if name.len() > prefix.len() && name.is_char_boundary(prefix.len()) && name[..prefix.len()].eq_ignore_ascii_case(prefix)
            {
                c.attributes.push((name[prefix.len()..].to_ascii_lowercase(), value));
            }
        }
        c
    }

    /// A binary-mode CloudEvent: the value is its data, the attributes are headers.
    pub fn is_binary(&self) -> bool {
        self.attributes.iter().any(|(n, _)| n == "specversion")
    }

    /// `content-type: application/cloudevents+json` (structured mode).
    pub fn is_structured(&self) -> bool {
        self.content_type.and_then(|v| std::str::from_utf8(v).ok()).is_some_and(|ct| media_type(ct) == STRUCTURED_JSON)
    }
}

/// `Application/JSON; charset=utf-8` → `application/json`.
fn media_type(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// What the data's media type lets hookline deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataKind {
    Json,
    Text,
}

fn data_kind(content_type: Option<&str>) -> Result<DataKind, Invalid> {
    let Some(ct) = content_type else { return Ok(DataKind::Json) };
    let mt = media_type(ct);
    if mt.is_empty() || mt == "application/json" || mt.ends_with("+json") || mt == "text/json" {
        Ok(DataKind::Json)
    } else if mt.starts_with("text/") {
        Ok(DataKind::Text)
    } else {
        Err(invalid_at(
            Reason::EventInvalidField,
            format!("datacontenttype: {mt:?} is not delivered by hookline (JSON, any +json type, or text/*)"),
            "datacontenttype",
        ))
    }
}

/// The attributes read so far, before they become an [`Event`].
#[derive(Default)]
struct Attributes {
    specversion: Option<String>,
    id: Option<String>,
    source: Option<String>,
    event_type: Option<String>,
    time: Option<String>,
    subject: Option<String>,
    datacontenttype: Option<String>,
    dataschema: Option<String>,
    extensions: HashMap<String, String>,
}

impl Attributes {
    fn set(&mut self, name: &str, value: String) -> Result<(), Invalid> {
        let slot = match name {
            "specversion" => &mut self.specversion,
            "id" => &mut self.id,
            "source" => &mut self.source,
            "type" => &mut self.event_type,
            "time" => &mut self.time,
            "subject" => &mut self.subject,
            "datacontenttype" => &mut self.datacontenttype,
            "dataschema" => &mut self.dataschema,
            "data" | "data_base64" => {
                return Err(invalid_at(Reason::EventInvalidField, format!("`{name}` is not a context attribute"), "data"))
            }
            _ => {
                check_extension_name(name)?;
                if self.extensions.len() >= MAX_EXTENSIONS && !self.extensions.contains_key(name) {
                    return Err(invalid_at(
                        Reason::EventInvalidField,
                        format!("more than {MAX_EXTENSIONS} extension attributes"),
                        "extensions",
                    ));
                }
                check_attribute(name, &value)?;
                self.extensions.insert(name.to_owned(), value);
                return Ok(());
            }
        };
        *slot = Some(value);
        Ok(())
    }

    /// The version first: an event of another version is refused for that, whatever else it carries.
    fn check_version(&self) -> Result<(), Invalid> {
        match self.specversion.as_deref() {
            Some(SPECVERSION) => {}
            Some(other) => {
                return Err(invalid_at(
                    Reason::EventInvalidField,
                    format!("specversion: {other:?} is not read; only CloudEvents {SPECVERSION}"),
                    "specversion",
                ))
            }
            None => return Err(invalid_at(Reason::EventMissingField, "`specversion` is required", "specversion")),
        }
        Ok(())
    }

    fn into_event(mut self, data_json: Bytes, key: Option<&[u8]>) -> Result<Event, Invalid> {
        self.check_version()?;
        let id = crate::event_decode::required_name(self.id.take(), "id")?;
        let event_type = crate::event_decode::required_name(self.event_type.take(), "type")?;
        let source = self.source.take().unwrap_or_default();
        if source.trim().is_empty() {
            return Err(invalid_at(Reason::EventMissingField, "`source` is required", "source"));
        }
        for (name, v) in [("source", Some(&source)), ("subject", self.subject.as_ref()), ("dataschema", self.dataschema.as_ref())] {
            if let Some(v) = v {
                check_attribute(name, v)?;
            }
        }
        let occurred_at_ms = match self.time.as_deref() {
            None => 0,
            Some(t) => crate::event_decode::parse_rfc3339_ms(t)
                .filter(|ms| *ms >= 0)
                .ok_or_else(|| invalid_at(Reason::EventInvalidField, format!("time: {t:?} is not an RFC 3339 timestamp"), "time"))?,
        };
        let mut ext = self.extensions;
        let tenant = ext.remove("tenant").unwrap_or_default();
        crate::filter::validate_tenant(&tenant)
            .map_err(|e| invalid_at(Reason::EventInvalidField, format!("tenant (extension): {e}"), "tenant"))?;
        let traceparent = ext.remove("traceparent").unwrap_or_default();
        let tracestate = ext.remove("tracestate").unwrap_or_default();
        // The Kafka binding maps `partitionkey` to the record key; a producer may set either.
        if !ext.contains_key("partitionkey") {
            if let Some(k) = key.filter(|k| !k.is_empty()).and_then(|k| std::str::from_utf8(k).ok()) {
                check_attribute("partitionkey", k)?;
                ext.insert("partitionkey".into(), k.to_owned());
            }
        }
        let subject = self.subject.unwrap_or_default();
        let entity_id = ext.get("partitionkey").cloned().unwrap_or_else(|| subject.clone());
        Ok(Event {
            id,
            r#type: event_type,
            occurred_at_ms,
            tenant,
            entity_id,
            data_json,
            source,
            subject,
            extensions: ext,
            data_content_type: self.datacontenttype.unwrap_or_default(),
            data_schema: self.dataschema.unwrap_or_default(),
            traceparent,
            tracestate,
            ..Default::default()
        })
    }
}

/// Lower-case ASCII letters and digits (CloudEvents 1.0, "Attribute Naming Convention").
fn check_extension_name(name: &str) -> Result<(), Invalid> {
    if name.is_empty() || name.len() > MAX_EXTENSION_NAME || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        let shown: String = name.chars().take(MAX_EXTENSION_NAME).collect();
        return Err(invalid_at(
            Reason::EventInvalidField,
            format!("extension attribute {shown:?}: names are lower-case letters and digits, at most {MAX_EXTENSION_NAME}"),
            "extensions",
        ));
    }
    Ok(())
}

fn check_attribute(name: &str, v: &str) -> Result<(), Invalid> {
    if v.len() > MAX_ATTRIBUTE_BYTES {
        return Err(invalid_at(Reason::EventInvalidField, format!("{name}: longer than {MAX_ATTRIBUTE_BYTES} bytes"), field_of(name)));
    }
    if v.chars().any(char::is_control) {
        return Err(invalid_at(Reason::EventInvalidField, format!("{name}: contains control characters"), field_of(name)));
    }
    Ok(())
}

/// The `field` of an error: a named attribute, or `extensions` for any extension.
fn field_of(name: &str) -> &'static str {
    match name {
        "id" => "id",
        "type" => "type",
        "source" => "source",
        "subject" => "subject",
        "dataschema" => "dataschema",
        "datacontenttype" => "datacontenttype",
        "time" => "time",
        "specversion" => "specversion",
        _ => "extensions",
    }
}

/// A binary-mode event: attributes from headers, `value` its data. `None` for no data at all: the caller ignores
/// such a record (a tombstone on a compacted topic, or an event that says nothing) and counts it.
pub fn decode_binary(value: &[u8], ctx: &Context<'_>) -> Result<Option<Event>, Invalid> {
    let binding = ctx.binding.unwrap_or(Binding::Kafka);
    let mut attrs = Attributes::default();
    for (name, raw) in &ctx.attributes {
        let text = header_text(binding, name, raw)?;
        attrs.set(name, text)?;
    }
    if let Some(ct) = ctx.content_type {
        let ct = std::str::from_utf8(ct).map_err(|_| invalid_at(Reason::EventInvalidUtf8, "content-type: not UTF-8", "datacontenttype"))?;
        attrs.datacontenttype = Some(ct.trim().to_owned());
    }
    attrs.check_version()?;
    if value.is_empty() {
        // Still a CloudEvent: its attributes must be whole, or it is a bad record and not a tombstone.
        attrs.into_event(Bytes::new(), ctx.key)?;
        return Ok(None);
    }
    let data = data_of_bytes(value, attrs.datacontenttype.as_deref())?;
    attrs.into_event(data, ctx.key).map(Some)
}

fn header_text(binding: Binding, name: &str, raw: &[u8]) -> Result<String, Invalid> {
    let text = std::str::from_utf8(raw)
        .map_err(|e| invalid_at(Reason::EventInvalidUtf8, format!("{name}: not UTF-8 (at byte {})", e.valid_up_to()), field_of(name)))?;
    match binding {
        Binding::Kafka => Ok(text.to_owned()),
        Binding::Http => percent_decode(text)
            .ok_or_else(|| invalid_at(Reason::EventInvalidField, format!("ce-{name}: bad percent-encoding"), field_of(name))),
    }
}

/// `%XX` sequences to bytes, then UTF-8 (the HTTP binding percent-encodes what is not printable ASCII).
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The data as JSON text: JSON as it is (checked), text as a JSON string.
fn data_of_bytes(value: &[u8], content_type: Option<&str>) -> Result<Bytes, Invalid> {
    match data_kind(content_type)? {
        DataKind::Json => {
            let text = std::str::from_utf8(value)
                .map_err(|e| invalid_at(Reason::EventInvalidUtf8, format!("data: not UTF-8 (at byte {})", e.valid_up_to()), "data"))?;
            crate::event_decode::check_json_depth(text.as_bytes())?;
            serde_json::from_str::<&RawValue>(text)
                .map_err(|e| invalid_at(Reason::EventInvalidJson, format!("data: {}", crate::event_decode::json_error(&e)), "data"))?;
            Ok(Bytes::copy_from_slice(text.trim().as_bytes()))
        }
        DataKind::Text => {
            let text = std::str::from_utf8(value)
                .map_err(|e| invalid_at(Reason::EventInvalidUtf8, format!("data: not UTF-8 (at byte {})", e.valid_up_to()), "data"))?;
            Ok(Bytes::from(Value::String(text.to_owned()).to_string()))
        }
    }
}

/// A structured-mode event (the JSON event format) from a JSON object already known to be one.
pub fn decode_structured(json: &str, key: Option<&[u8]>) -> Result<Event, Invalid> {
    crate::event_decode::check_json_depth(json.as_bytes())?;
    let obj: Map<String, Value> =
        serde_json::from_str(json).map_err(|e| invalid_at(Reason::EventInvalidJson, crate::event_decode::json_error(&e), "body"))?;
    decode_object(obj, key)
}

/// True when a JSON object is a CloudEvent in the JSON event format: it has `specversion`, which hookline's own
/// envelope never has.
pub fn looks_structured(obj_text: &str) -> bool {
    // Cheap pre-check on the bytes, then a real look at the top-level keys.
    if !obj_text.contains("\"specversion\"") {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(borrow)]
        specversion: Option<&'a RawValue>,
    }
    serde_json::from_str::<Probe<'_>>(obj_text).map(|p| p.specversion.is_some()).unwrap_or(false)
}

fn decode_object(obj: Map<String, Value>, key: Option<&[u8]>) -> Result<Event, Invalid> {
    let mut attrs = Attributes::default();
    let mut data: Option<Value> = None;
    let mut data_base64: Option<String> = None;
    for (name, v) in obj {
        match name.as_str() {
            "data" => data = Some(v),
            "data_base64" => match v {
                Value::String(s) => data_base64 = Some(s),
                Value::Null => {}
                _ => return Err(invalid_at(Reason::EventInvalidField, "data_base64: must be a base64 string", "data_base64")),
            },
            _ => {
                let text = match v {
                    Value::Null => continue,
                    Value::String(s) => s,
                    // Extension attributes may be booleans or integers in the JSON format: kept in their
                    // canonical string form, as the binary mode carries them.
                    Value::Bool(b) if !is_core(&name) => b.to_string(),
                    Value::Number(n) if !is_core(&name) && (n.is_i64() || n.is_u64()) => n.to_string(),
                    _ => return Err(invalid_at(Reason::EventInvalidField, format!("{name}: must be a string"), field_of(&name))),
                };
                attrs.set(&name, text)?;
            }
        }
    }
    attrs.check_version()?;
    let kind = data_kind(attrs.datacontenttype.as_deref())?;
    let data_json = match (data, data_base64) {
        (Some(_), Some(_)) => {
            return Err(invalid_at(Reason::EventInvalidField, "`data` and `data_base64` are both set; an event has one", "data"))
        }
        (Some(Value::Null), None) | (None, None) => Bytes::new(),
        // With a text type, a JSON string is the text; anything else is JSON data, carried as it is.
        (Some(v), None) => Bytes::from(v.to_string()),
        (None, Some(b64)) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| invalid_at(Reason::EventInvalidField, format!("data_base64: not base64: {e}"), "data_base64"))?;
            match kind {
                DataKind::Json | DataKind::Text => data_of_bytes(&raw, attrs.datacontenttype.as_deref())?,
            }
        }
    };
    attrs.into_event(data_json, key)
}

fn is_core(name: &str) -> bool {
    matches!(name, "specversion" | "id" | "source" | "type" | "time" | "subject" | "datacontenttype" | "dataschema")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kafka<'a>(headers: &'a [(&'a str, &'a str)], key: Option<&'a [u8]>) -> Context<'a> {
        Context::from_headers(Binding::Kafka, headers.iter().map(|(n, v)| (*n, v.as_bytes())), key)
    }

    const BASE: [(&str, &str); 4] =
        [("ce_specversion", "1.0"), ("ce_id", "evt-1"), ("ce_source", "/orders"), ("ce_type", "com.example.order.created")];

    #[test]
    fn binary_mode_maps_every_attribute() {
        let mut h = BASE.to_vec();
        h.extend([
            ("ce_time", "2026-01-02T03:04:05.678Z"),
            ("ce_subject", "order/42"),
            ("ce_tenant", "acme"),
            ("ce_region", "eu"),
            ("ce_traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ("content-type", "application/json; charset=utf-8"),
            ("ce_dataschema", "https://example.com/order.json"),
            ("unrelated", "x"),
        ]);
        let ctx = kafka(&h, Some(b"cust-7"));
        assert!(ctx.is_binary() && !ctx.is_structured());
        let ev = decode_binary(br#" {"total": 12} "#, &ctx).unwrap().unwrap();
        assert_eq!(ev.id, "evt-1");
        assert_eq!(ev.r#type, "com.example.order.created");
        assert_eq!(ev.source, "/orders");
        assert_eq!(ev.subject, "order/42");
        assert_eq!(ev.tenant, "acme");
        assert_eq!(ev.occurred_at_ms, 1_767_323_045_678);
        assert_eq!(&ev.data_json[..], br#"{"total": 12}"#);
        assert_eq!(ev.data_content_type, "application/json; charset=utf-8");
        assert_eq!(ev.data_schema, "https://example.com/order.json");
        assert_eq!(ev.traceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        // The record key is the partition key, and so the entity.
        assert_eq!(ev.extensions.get("partitionkey").map(String::as_str), Some("cust-7"));
        assert_eq!(ev.entity_id, "cust-7");
        assert_eq!(ev.extensions.get("region").map(String::as_str), Some("eu"));
        assert!(!ev.extensions.contains_key("tenant") && !ev.extensions.contains_key("traceparent"));
    }

    #[test]
    fn subject_is_the_entity_without_a_partition_key() {
        let mut h = BASE.to_vec();
        h.push(("ce_subject", "order/42"));
        let ev = decode_binary(b"{}", &kafka(&h, None)).unwrap().unwrap();
        assert_eq!(ev.entity_id, "order/42");
    }

    #[test]
    fn no_data_is_ignored_but_a_broken_event_is_not() {
        assert_eq!(decode_binary(b"", &kafka(&BASE, None)).unwrap(), None);
        let broken = [("ce_specversion", "1.0"), ("ce_id", "x")];
        let e = decode_binary(b"", &kafka(&broken, None)).unwrap_err();
        assert_eq!(e.field, Some("type"));
    }

    #[test]
    fn refusals_name_the_attribute() {
        let cases: Vec<(Vec<(&str, &str)>, &[u8], &str, &str)> = vec![
            (vec![("ce_specversion", "0.3"), ("ce_id", "1"), ("ce_source", "/s"), ("ce_type", "t")], b"{}", "specversion", "invalid_field"),
            (vec![("ce_specversion", "1.0"), ("ce_id", "1"), ("ce_type", "t")], b"{}", "source", "missing_field"),
            (vec![("ce_specversion", "1.0"), ("ce_source", "/s"), ("ce_type", "t")], b"{}", "id", "missing_field"),
            ([BASE.as_slice(), &[("ce_time", "yesterday")]].concat(), b"{}", "time", "invalid_field"),
            ([BASE.as_slice(), &[("ce_Bad-Name", "x")]].concat(), b"{}", "extensions", "invalid_field"),
            ([BASE.as_slice(), &[("ce_tenant", "a b")]].concat(), b"{}", "tenant", "invalid_field"),
            (BASE.to_vec(), b"{not json", "data", "invalid_json"),
            ([BASE.as_slice(), &[("content-type", "application/avro")]].concat(), b"\x01\x02", "datacontenttype", "invalid_field"),
        ];
        for (h, value, field, reason) in cases {
            let e = decode_binary(value, &kafka(&h, None)).unwrap_err();
            assert_eq!((e.field, e.reason), (Some(field), reason), "{h:?}: {e}");
        }
        let many: Vec<(String, String)> = (0..=MAX_EXTENSIONS).map(|i| (format!("ce_x{i}"), "v".to_owned())).collect();
        let mut h: Vec<(&str, &str)> = BASE.to_vec();
        h.extend(many.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        assert_eq!(decode_binary(b"{}", &kafka(&h, None)).unwrap_err().field, Some("extensions"));
    }

    #[test]
    fn text_data_becomes_a_json_string() {
        let h = [BASE.as_slice(), &[("content-type", "text/plain")]].concat();
        let ev = decode_binary("héllo \"x\"".as_bytes(), &kafka(&h, None)).unwrap().unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&ev.data_json).unwrap(), json!("héllo \"x\""));
    }

    #[test]
    fn http_headers_are_percent_decoded() {
        let h = [("Ce-Specversion", "1.0"), ("ce-id", "1"), ("ce-source", "/s"), ("ce-type", "t"), ("ce-subject", "caf%C3%A9 %25")];
        let ctx = Context::from_headers(Binding::Http, h.iter().map(|(n, v)| (*n, v.as_bytes())), None);
        assert_eq!(decode_binary(b"{}", &ctx).unwrap().unwrap().subject, "café %");
        let bad = [("ce-specversion", "1.0"), ("ce-id", "1"), ("ce-source", "/s"), ("ce-type", "t"), ("ce-subject", "%zz")];
        let ctx = Context::from_headers(Binding::Http, bad.iter().map(|(n, v)| (*n, v.as_bytes())), None);
        assert_eq!(decode_binary(b"{}", &ctx).unwrap_err().field, Some("subject"));
    }

    #[test]
    fn structured_mode() {
        let doc = json!({
            "specversion": "1.0", "id": "e-9", "source": "urn:shop", "type": "order.paid", "subject": "o-1",
            "time": "2026-01-02T03:04:05+01:00", "datacontenttype": "application/json", "count": 3, "flag": true,
            "data": {"a": [1, 2]}
        })
        .to_string();
        assert!(looks_structured(&doc));
        assert!(!looks_structured(r#"{"id":"x","type":"t","data":{"specversion":"1.0"}}"#));
        let ev = decode_structured(&doc, None).unwrap();
        assert_eq!((ev.id.as_str(), ev.source.as_str(), ev.entity_id.as_str()), ("e-9", "urn:shop", "o-1"));
        assert_eq!(ev.occurred_at_ms, 1_767_319_445_000);
        assert_eq!(serde_json::from_slice::<Value>(&ev.data_json).unwrap(), json!({"a": [1, 2]}));
        assert_eq!(ev.extensions.get("count").map(String::as_str), Some("3"));
        assert_eq!(ev.extensions.get("flag").map(String::as_str), Some("true"));

        let b64 = json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data_base64": "eyJrIjoxfQ=="}).to_string();
        assert_eq!(&decode_structured(&b64, None).unwrap().data_json[..], br#"{"k":1}"#);
        let both = json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": 1, "data_base64": "MQ=="});
        assert_eq!(decode_structured(&both.to_string(), None).unwrap_err().field, Some("data"));
        let typed = json!({"specversion": "1.0", "id": 7, "source": "/s", "type": "t"});
        assert_eq!(decode_structured(&typed.to_string(), None).unwrap_err().field, Some("id"));
    }
}
