//! Decoding and validating an upstream event: a JSON envelope or the protobuf `Event`. A rejection names a
//! stable reason (the dead-letter `reason`) and a detail a producer can act on.

use crate::cloudevents::{self, Context};
use crate::model::Event;
use crate::registry_framing::{self, Framed, FramingError, NoRegistry, PayloadDecoder, Resolved};
use crate::vocabulary::DeadLetterReason as Reason;
use bytes::Bytes;
use prost::Message;
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct Invalid {
    /// `oversize`, `invalid_utf8`, `invalid_json`, `missing_field`, `invalid_field`, `invalid_protobuf`, `empty`.
    pub reason: &'static str,
    pub detail: String,
    /// The envelope field at fault, when one is (`id`, `type`, `occurred_at`).
    pub field: Option<&'static str>,
}

fn invalid(reason: Reason, detail: impl Into<String>) -> Invalid {
    Invalid { reason: reason.as_str(), detail: detail.into(), field: None }
}

pub(crate) fn invalid_at(reason: Reason, detail: impl Into<String>, field: &'static str) -> Invalid {
    invalid(reason, detail).at(field)
}

impl Invalid {
    fn at(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }
}

/// Longest accepted id and type.
const MAX_NAME: usize = 256;

#[derive(Deserialize)]
struct Envelope<'a> {
    id: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    #[serde(alias = "occurredAt")]
    occurred_at: Option<serde_json::Value>,
    tenant: Option<String>,
    #[serde(alias = "entityId")]
    entity_id: Option<String>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

/// What a record of the events topic turned out to be.
#[derive(Debug, Clone, PartialEq)]
// Returned once per record and unpacked at once: boxing the event would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
pub enum Decoded {
    Event(Event),
    /// A binary-mode CloudEvent without data (on Kafka, a tombstone): nothing to deliver, and nothing wrong.
    NoData,
}

/// Decodes one record of the events topic, or an API request (`json_only`: a JSON body, or a CloudEvent in the
/// HTTP binding), with what it carries beside its value (`ctx`: CloudEvents headers, content type, record key).
/// The value may be hookline's JSON envelope, its protobuf `Event`, or a CloudEvent in binary or structured mode.
pub fn decode_record(value: Option<&[u8]>, ctx: &Context<'_>, max_bytes: usize, json_only: bool) -> Result<Decoded, Invalid> {
    decode_record_with(value, ctx, max_bytes, json_only, &NoRegistry).map_err(DecodeError::into_invalid)
}

/// Why [`decode_record_with`] returned no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Invalid(Invalid),
    /// The value is framed with this schema id, which the registry has not fetched yet: decode it again once it has.
    SchemaPending(u32),
}

impl DecodeError {
    /// For decoders without a registry, which never ask for a fetch.
    fn into_invalid(self) -> Invalid {
        match self {
            Self::Invalid(i) => i,
            Self::SchemaPending(id) => invalid(Reason::EventSchemaRegistryRequired, format!("schema id {id}: no registry")),
        }
    }
}

impl From<Invalid> for DecodeError {
    fn from(i: Invalid) -> Self {
        Self::Invalid(i)
    }
}

/// [`decode_record`], with `registry` turning a Schema Registry framed value (Confluent's wire format) into JSON
/// first: the envelope, or in binary mode the CloudEvent's data. Without a registry ([`NoRegistry`]) only JSON
/// payloads (JSON Schema) are read.
pub fn decode_record_with(
    value: Option<&[u8]>,
    ctx: &Context<'_>,
    max_bytes: usize,
    json_only: bool,
    registry: &dyn PayloadDecoder,
) -> Result<Decoded, DecodeError> {
    let bytes = value.unwrap_or_default();
    if bytes.len() > max_bytes {
        return Err(invalid(Reason::EventOversize, format!("{} bytes is over the limit of {max_bytes}", bytes.len())).into());
    }
    if !json_only {
        if let Some(framed) = registry_framing::split(bytes) {
            return decode_framed(framed, ctx, registry);
        }
    }
    Ok(decode_unframed(bytes, ctx, max_bytes, json_only)?)
}

fn decode_unframed(bytes: &[u8], ctx: &Context<'_>, max_bytes: usize, json_only: bool) -> Result<Decoded, Invalid> {
    if ctx.is_binary() {
        return Ok(cloudevents::decode_binary(bytes, ctx)?.map_or(Decoded::NoData, Decoded::Event));
    }
    if ctx.is_structured() {
        let text = std::str::from_utf8(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes))
            .map_err(|e| invalid(Reason::EventInvalidUtf8, format!("the event is not valid UTF-8 (at byte {})", e.valid_up_to())))?;
        if text.trim().is_empty() {
            return Err(invalid(Reason::EventEmpty, "the record has no value"));
        }
        return cloudevents::decode_structured(text, ctx.key).map(Decoded::Event);
    }
    decode_plain(bytes, max_bytes, json_only, ctx.key).map(Decoded::Event)
}

/// A framed value: a JSON payload (JSON Schema) is used as it is; another (Avro, Protobuf) once `registry` has made
/// it JSON. Then it is read as the record says: the envelope (or a structured CloudEvent), or in binary mode the
/// CloudEvent's data (JSON now, whatever `content-type` said of the framed bytes). The event keeps the schema id; a
/// rejection's detail names it.
fn decode_framed(
    framed: Result<Framed<'_>, FramingError>,
    ctx: &Context<'_>,
    registry: &dyn PayloadDecoder,
) -> Result<Decoded, DecodeError> {
    let framed = framed.map_err(|e| invalid(Reason::EventInvalidFraming, e.to_string()))?;
    let id = framed.schema_id;
    let named = |i: Invalid| Invalid { detail: format!("schema id {id}: {}", i.detail), ..i };
    // Avro can start with `{` or `[` (a first field of -62 or -46) but then is no JSON: asking the registry first
    // would cost every JSON Schema event of a new id a fetch.
    let first = framed.payload.iter().copied().find(|b| !b.is_ascii_whitespace());
    let is_json = matches!(first, Some(b'{' | b'[')) && serde_json::from_slice::<serde::de::IgnoredAny>(framed.payload).is_ok();
    let decoded_json;
    let json: &[u8] = if is_json {
        framed.payload
    } else {
        match registry.to_json(framed) {
            Resolved::Json(j) => {
                decoded_json = j;
                &decoded_json
            }
            Resolved::Pending => return Err(DecodeError::SchemaPending(id)),
            Resolved::Rejected(reason, detail) => return Err(invalid(reason, format!("schema id {id}: {detail}")).into()),
        }
    };
    let decoded = if ctx.is_binary() {
        let as_json = Context { content_type: Some(b"application/json"), ..ctx.clone() };
        cloudevents::decode_binary(json, &as_json).map(|e| e.map_or(Decoded::NoData, Decoded::Event))
    } else {
        decode_unframed(json, ctx, usize::MAX, false)
    };
    match decoded.map_err(named)? {
        Decoded::Event(mut ev) => {
            ev.registry_schema_id = id;
            Ok(Decoded::Event(ev))
        }
        Decoded::NoData => Ok(Decoded::NoData),
    }
}

/// Decodes a value without headers (hookline's envelope or protobuf, or a structured CloudEvent recognised by its
/// `specversion`): what a reader that has only the value (tests, benchmarks) uses.
pub fn decode(bytes: &[u8], max_bytes: usize, json_only: bool) -> Result<Event, Invalid> {
    if json_only || !registry_framing::is_framed(bytes) {
        return decode_plain(bytes, max_bytes, json_only, None);
    }
    match decode_record(Some(bytes), &Context::default(), max_bytes, false)? {
        Decoded::Event(ev) => Ok(ev),
        // Only a binary-mode CloudEvent can be without data, and a value alone is never one.
        Decoded::NoData => Err(invalid(Reason::EventEmpty, "the record has no value")),
    }
}

fn decode_plain(bytes: &[u8], max_bytes: usize, json_only: bool, key: Option<&[u8]>) -> Result<Event, Invalid> {
    if bytes.is_empty() {
        return Err(invalid(Reason::EventEmpty, "the record has no value"));
    }
    if bytes.len() > max_bytes {
        return Err(invalid(Reason::EventOversize, format!("{} bytes is over the limit of {max_bytes}", bytes.len())));
    }
    // A UTF-8 byte-order mark some editors and tools prepend is not part of the JSON.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    if json_only || first == Some(b'{') || first == Some(b'[') || first == Some(b'"') {
        if first != Some(b'{') {
            return Err(invalid(Reason::EventInvalidJson, "an event must be a JSON object"));
        }
        // A structured CloudEvent sent without its content type is still recognised (by `specversion`).
        if let Ok(text) = std::str::from_utf8(bytes) {
            if cloudevents::looks_structured(text) {
                return cloudevents::decode_structured(text, key);
            }
        }
        decode_json(bytes)
    } else {
        decode_protobuf(bytes)
    }
}

/// A JSON body that does not parse, in the one wording every API answer uses: "the body is not valid JSON (line 1,
/// column 34)"; a document of the wrong shape keeps serde's sentence, with the same position.
pub fn json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let (line, column) = (e.line(), e.column());
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => format!("the body is not valid JSON (line {line}, column {column})"),
        Category::Data => {
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
            format!("{msg} (line {line}, column {column})")
        }
    }
}

fn decode_json(bytes: &[u8]) -> Result<Event, Invalid> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| invalid(Reason::EventInvalidUtf8, format!("the event is not valid UTF-8 (at byte {})", e.valid_up_to())))?;
    check_depth(text.as_bytes())?;
    let env: Envelope<'_> = serde_json::from_str(text).map_err(|e| invalid(Reason::EventInvalidJson, json_error(&e)))?;
    let id = required(env.id, "id")?;
    let event_type = required(env.event_type, "type")?;
    let occurred_at_ms = match env.occurred_at {
        None | Some(serde_json::Value::Null) => 0,
        Some(serde_json::Value::Number(n)) => n.as_i64().filter(|v| *v >= 0).ok_or_else(|| {
            invalid(Reason::EventInvalidField, "occurred_at: a number must be whole milliseconds since the epoch").at("occurred_at")
        })?,
        Some(serde_json::Value::String(s)) => parse_rfc3339_ms(&s).ok_or_else(|| {
            invalid(Reason::EventInvalidField, format!("occurred_at: {s:?} is not an RFC 3339 timestamp")).at("occurred_at")
        })?,
        Some(_) => {
            return Err(
                invalid(Reason::EventInvalidField, "occurred_at: must be an RFC 3339 string or epoch milliseconds").at("occurred_at")
            )
        }
    };
    let tenant = env.tenant.unwrap_or_default();
    check_tenant(&tenant)?;
    Ok(Event {
        id,
        r#type: event_type,
        occurred_at_ms,
        tenant,
        entity_id: env.entity_id.unwrap_or_default(),
        data_json: env.data.map(|d| Bytes::copy_from_slice(d.get().as_bytes())).unwrap_or_default(),
        accepted_at_ms: 0,
        // Trace context comes from the record header or the HTTP header, not the JSON envelope.
        traceparent: String::new(),
        tracestate: String::new(),
        // Only hookline's own test events set it (in protobuf); a JSON envelope cannot.
        only_subscription_id: String::new(),
        ..Default::default()
    })
}

/// Deepest accepted nesting of arrays and objects: receivers' parsers have limits too (serde_json's is 128).
const MAX_DEPTH: usize = 128;

/// A raw-value capture skips serde_json's recursion limit, so nesting is bounded here, in one linear scan. Strings
/// are jumped over to their closing quote with `memchr` (most of an event's bytes are in strings: a byte-at-a-time
/// scan was nine tenths of the event decode's own time in the fan-out).
fn check_depth(json: &[u8]) -> Result<(), Invalid> {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = json.get(i) {
        i += 1;
        match b {
            b'"' => loop {
                // Unterminated: nothing more to count (serde_json reports the string).
                let Some(k) = json.get(i..).and_then(|rest| memchr::memchr2(b'"', b'\\', rest)) else { return Ok(()) };
                let at = i + k;
                // Past the quote, or past the backslash and the byte it escapes.
                i = at + 1;
                if json[at] == b'"' {
                    break;
                }
                i += 1;
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(invalid(Reason::EventInvalidJson, format!("nesting deeper than {MAX_DEPTH} levels")));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn decode_protobuf(bytes: &[u8]) -> Result<Event, Invalid> {
    let ev = Event::decode(bytes).map_err(|e| invalid(Reason::EventInvalidProtobuf, e.to_string()))?;
    check_name(&ev.id, "id")?;
    check_name(&ev.r#type, "type")?;
    check_tenant(&ev.tenant)?;
    if !ev.data_json.is_empty() {
        let text = std::str::from_utf8(&ev.data_json).map_err(|_| invalid(Reason::EventInvalidUtf8, "data_json is not valid UTF-8"))?;
        check_depth(text.as_bytes())?;
        serde_json::from_str::<&RawValue>(text).map_err(|e| invalid(Reason::EventInvalidJson, format!("data_json: {e}")))?;
    }
    Ok(ev)
}

pub(crate) fn required_name(v: Option<String>, field: &'static str) -> Result<String, Invalid> {
    required(v, field)
}

pub(crate) fn check_json_depth(json: &[u8]) -> Result<(), Invalid> {
    check_depth(json)
}

fn required(v: Option<String>, field: &'static str) -> Result<String, Invalid> {
    let v = v.ok_or_else(|| invalid(Reason::EventMissingField, format!("`{field}` is required")).at(field))?;
    check_name(&v, field)?;
    Ok(v)
}

fn check_name(v: &str, field: &'static str) -> Result<(), Invalid> {
    if v.trim().is_empty() {
        return Err(invalid(Reason::EventMissingField, format!("`{field}` must not be empty")).at(field));
    }
    if v.len() > MAX_NAME {
        return Err(invalid(Reason::EventInvalidField, format!("`{field}` is longer than {MAX_NAME} bytes")).at(field));
    }
    if v.chars().any(char::is_control) {
        return Err(invalid(Reason::EventInvalidField, format!("`{field}` contains control characters")).at(field));
    }
    Ok(())
}

/// The tenant decides which subscriptions an event reaches, so it must be exactly one a subscription can have.
fn check_tenant(tenant: &str) -> Result<(), Invalid> {
    crate::filter::validate_tenant(tenant).map_err(|e| invalid(Reason::EventInvalidField, format!("tenant: {e}")))
}

/// `2026-01-02T03:04:05Z`, with optional fraction and `±hh:mm` offset, to epoch milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok()).flatten()
    };
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let frac = &s[start..i.min(start + 3)];
        millis = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let v = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
            if *sign == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    // Days from civil (Howard Hinnant's algorithm).
    let (y2, m2) = if mo <= 2 { (y - 1, mo + 9) } else { (y, mo - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3_600 + mi * 60 + sec - offset_min * 60) * 1000) + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    /// The scan `check_depth` replaced, byte at a time: the reference for what it must decide.
    fn depth_ok_byte_at_a_time(json: &[u8]) -> bool {
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for &b in json {
            if in_string {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return false;
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        true
    }

    proptest::proptest! {
        #[test]
        fn nesting_is_judged_as_a_byte_at_a_time_scan_judges_it(
            parts in proptest::collection::vec(proptest::prop_oneof![
                proptest::strategy::Just(&b"\""[..]), proptest::strategy::Just(&b"\\"[..]), proptest::strategy::Just(&b"["[..]),
                proptest::strategy::Just(&b"{"[..]), proptest::strategy::Just(&b"]"[..]), proptest::strategy::Just(&b"}"[..]),
                proptest::strategy::Just(&b"a"[..]), proptest::strategy::Just(&b"\\\""[..]), proptest::strategy::Just(&b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["[..]),
            ], 0..400)
        ) {
            let json: Vec<u8> = parts.concat();
            proptest::prop_assert_eq!(check_depth(&json).is_ok(), depth_ok_byte_at_a_time(&json), "{:?}", String::from_utf8_lossy(&json));
        }
    }

    #[test]
    fn nesting_inside_strings_and_after_escapes_does_not_count() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_depth(deep(MAX_DEPTH).as_bytes()).is_ok());
        assert!(check_depth(deep(MAX_DEPTH + 1).as_bytes()).is_err());
        let quoted = format!(r#"{{"a":"{}\"{}","b":1}}"#, "[".repeat(500), "{".repeat(500));
        assert!(check_depth(quoted.as_bytes()).is_ok(), "brackets in a string, after an escaped quote");
        let escaped_backslash = format!(r#"{{"a":"x\\"{}"#, "[".repeat(MAX_DEPTH + 1));
        assert!(
            check_depth(escaped_backslash.as_bytes()).is_err(),
            "an escaped backslash ends nothing: the quote after it closes the string"
        );
        for cut in [&b"\""[..], b"\"\\", b"[\"abc", b"\"\\\""] {
            assert!(check_depth(cut).is_ok(), "an unterminated string is serde_json's to report: {cut:?}");
        }
    }

    #[test]
    fn accepts_a_json_envelope() {
        let ev = decode(
            br#"{"id":"evt_1","type":"message.received","occurred_at":"2026-01-01T00:00:01.5Z","tenant":"t","entityId":"e9","data":{"text":"hi"}}"#,
            MAX,
            false,
        )
        .unwrap();
        assert_eq!(ev.id, "evt_1");
        assert_eq!(ev.r#type, "message.received");
        assert_eq!(ev.occurred_at_ms, 1_767_225_601_500);
        assert_eq!(ev.entity_id, "e9");
        assert_eq!(&ev.data_json[..], br#"{"text":"hi"}"#);
    }

    #[test]
    fn an_unusable_tenant_is_refused_naming_it() {
        let long = format!(r#"{{"id":"e","type":"t","tenant":"{}"}}"#, "t".repeat(129));
        for body in [r#"{"id":"e","type":"t","tenant":"a b"}"#, r#"{"id":"e","type":"t","tenant":"a/b"}"#, long.as_str()] {
            let err = decode(body.as_bytes(), MAX, true).unwrap_err();
            assert_eq!(err.reason, "invalid_field", "{body}");
            assert!(err.detail.starts_with("tenant: "), "{}", err.detail);
        }
        let pb = Event { id: "e".into(), r#type: "t".into(), tenant: "acme\n".into(), ..Default::default() };
        assert_eq!(decode(&pb.encode_to_vec(), MAX, false).unwrap_err().reason, "invalid_field");
        // No tenant, an empty one and `null` all mean "no tenant".
        for body in [r#"{"id":"e","type":"t"}"#, r#"{"id":"e","type":"t","tenant":""}"#, r#"{"id":"e","type":"t","tenant":null}"#] {
            assert_eq!(decode(body.as_bytes(), MAX, true).unwrap().tenant, "", "{body}");
        }
        assert_eq!(decode(br#"{"id":"e","type":"t","tenant":"org_1.eu:2-x"}"#, MAX, true).unwrap().tenant, "org_1.eu:2-x");
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let ev = decode(b"\xEF\xBB\xBF{\"id\":\"e\",\"type\":\"t\"}", MAX, false).unwrap();
        assert_eq!(ev.id, "e");
    }

    #[test]
    fn accepts_protobuf() {
        let ev = Event { id: "e".into(), r#type: "t".into(), data_json: Bytes::from_static(b"[1]"), ..Default::default() };
        assert_eq!(decode(&ev.encode_to_vec(), MAX, false).unwrap(), ev);
    }

    #[test]
    fn json_that_does_not_parse_is_worded_as_the_api_words_every_body() {
        for (bytes, detail) in [
            (&b"{\"id\":\"a\",\"type\":\"t\""[..], "the body is not valid JSON (line 1, column 20)"),
            (&b"{not json"[..], "the body is not valid JSON (line 1, column 2)"),
        ] {
            let e = decode(bytes, MAX, false).unwrap_err();
            assert_eq!((e.reason, e.detail.as_str()), ("invalid_json", detail));
        }
    }

    #[test]
    fn rejects_bad_input_with_reasons() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"{not json", "invalid_json"),
            (b"{\"id\":\"a\",\"id\":\"b\",\"type\":\"t\"}", "invalid_json"),
            (b"{\"type\":\"t\"}", "missing_field"),
            (b"{\"id\":\"\",\"type\":\"t\"}", "missing_field"),
            (b"{\"id\":\"a\",\"type\":7}", "invalid_json"),
            (b"{\"id\":\"a\",\"type\":\"t\",\"occurred_at\":\"yesterday\"}", "invalid_field"),
            (b"{\"id\":\"a\xff\",\"type\":\"t\"}", "invalid_utf8"),
            (b"\x0a\x03abc\x12", "invalid_protobuf"),
            (b"\xff\xff\xff", "invalid_protobuf"),
            (b"[\"a\",\"t\",null,null,null,null]", "invalid_json"),
            (b"\"just a string\"", "invalid_json"),
        ];
        for (input, reason) in cases {
            let err = decode(input, MAX, false).unwrap_err();
            assert_eq!(err.reason, *reason, "{:?}: {err}", String::from_utf8_lossy(input));
        }
        let nested_string = format!("{{\"id\":\"a\",\"type\":\"t\",\"data\":\"{}\"}}", "[".repeat(1000));
        assert!(decode(nested_string.as_bytes(), MAX, false).is_ok(), "brackets inside strings are not nesting");
        let deep = format!("{{\"id\":\"a\",\"type\":\"t\",\"data\":{}{}}}", "[".repeat(1000), "]".repeat(1000));
        assert_eq!(decode(deep.as_bytes(), MAX, false).unwrap_err().reason, "invalid_json");
        assert_eq!(decode(&[b' '; 100], 10, false).unwrap_err().reason, "oversize");
    }

    #[test]
    fn a_framed_json_schema_event_is_its_payload_with_the_schema_id_kept() {
        let ev = decode(b"\x00\x00\x00\x01\x2c{\"id\":\"e\",\"type\":\"t\",\"data\":{\"n\":1}}", MAX, false).unwrap();
        assert_eq!((ev.id.as_str(), ev.registry_schema_id, &ev.data_json[..]), ("e", 300, &br#"{"n":1}"#[..]));
        let unframed = decode(br#"{"id":"e","type":"t"}"#, MAX, false).unwrap();
        assert_eq!(unframed.registry_schema_id, 0);
        // A framed envelope missing its type is refused as unframed JSON would be, naming the schema id.
        let e = decode(b"\x00\x00\x00\x00\x07{\"id\":\"e\"}", MAX, false).unwrap_err();
        assert_eq!((e.reason, e.field), ("missing_field", Some("type")));
        assert!(e.detail.starts_with("schema id 7: "), "{}", e.detail);
        // The API takes JSON only.
        assert_eq!(decode(b"\x00\x00\x00\x01\x2c{}", MAX, true).unwrap_err().reason, "invalid_json");
    }

    #[test]
    fn avro_or_protobuf_framed_events_need_a_registry_and_say_so_naming_the_schema_id() {
        let e = decode(b"\x00\x00\x00\x00\x2a\x04e1\x02t", MAX, false).unwrap_err();
        assert_eq!(e.reason, "schema_registry_required");
        assert!(e.detail.starts_with("schema id 42: ") && e.detail.contains("ingest.schema_registry.url"), "{}", e.detail);
        for (bytes, reason) in [(&b"\x00\x00\x01"[..], "invalid_framing"), (b"\x00\x00\x00\x00\x00{}", "invalid_framing")] {
            assert_eq!(decode(bytes, MAX, false).unwrap_err().reason, reason, "{bytes:?}");
        }
        struct Later;
        impl PayloadDecoder for Later {
            fn to_json(&self, _: Framed<'_>) -> Resolved {
                Resolved::Pending
            }
        }
        let with = |bytes: &[u8], r: &dyn PayloadDecoder| decode_record_with(Some(bytes), &Context::default(), MAX, false, r);
        assert_eq!(with(b"\x00\x00\x00\x00\x2a\x02", &Later), Err(DecodeError::SchemaPending(42)));
        struct Avro;
        impl PayloadDecoder for Avro {
            fn to_json(&self, f: Framed<'_>) -> Resolved {
                assert_eq!(f.payload, b"\x02");
                Resolved::Json(br#"{"id":"a","type":"t","occurred_at":5}"#.to_vec())
            }
        }
        let Ok(Decoded::Event(ev)) = with(b"\x00\x00\x00\x00\x2a\x02", &Avro) else { panic!("decoded") };
        assert_eq!((ev.id.as_str(), ev.occurred_at_ms, ev.registry_schema_id), ("a", 5, 42));
        // Binary mode: the decoded JSON is the CloudEvent's data, whatever content type the framed bytes had.
        let ctx = Context::from_headers(
            crate::cloudevents::Binding::Kafka,
            [
                ("ce_specversion", &b"1.0"[..]),
                ("ce_id", b"c1"),
                ("ce_source", b"/s"),
                ("ce_type", b"t.x"),
                ("content-type", b"application/avro"),
            ],
            None,
        );
        let Ok(Decoded::Event(ce)) = decode_record_with(Some(b"\x00\x00\x00\x00\x2a\x02"), &ctx, MAX, false, &Avro) else {
            panic!("a CloudEvent")
        };
        assert_eq!((ce.id.as_str(), ce.r#type.as_str(), ce.registry_schema_id), ("c1", "t.x", 42));
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&ce.data_json).unwrap()["id"], "a");
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339_ms("2026-10-21T07:28:00.123Z"), Some(1_792_567_680_123));
        for bad in ["", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00", "2026-01-01T00:00:00.Z", "x026-01-01T00:00:00Z"] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
