//! CloudEvents to receivers: an event as the CloudEvents HTTP protocol binding 1.0 carries it, for a policy with
//! `request.format = "cloudevents_binary"` (attributes as `ce-*` headers, the data as the body) or
//! `"cloudevents_structured"` (the JSON event format as the body). Pure: `request.rs` calls it for the body and
//! the headers of an attempt.
//!
//! The attributes: `id`, `type`; `source` the event's own (one that arrived as a CloudEvent), else the policy's
//! `request.cloudevents_source` (`{tenant}` replaced), else `/hookline/<tenant>` (`/hookline` without a tenant);
//! `time` from `occurred_at_ms` (left out when 0); `subject`, `dataschema` and the extensions when the event has
//! them; `datacontenttype` the event's, `application/json` by default.

use std::borrow::Cow;

use crate::model::Event;
use crate::policy::RequestFormat;

pub const SPEC_VERSION: &str = "1.0";
/// The `Content-Type` of a structured-mode request.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";
/// What the data is taken to be when the event states no (usable) content type: ingest keeps `data` as JSON text.
pub const DEFAULT_DATA_CONTENT_TYPE: &str = "application/json";

/// Attribute names the specification defines: an extension by one of these names would contradict the event's own
/// attribute (or the binding's `Content-Type`), so it is not sent.
const DEFINED_ATTRIBUTES: [&str; 10] =
    ["specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time", "data", "data_base64"];

/// The event's CloudEvents `source`: its own, else `template` with `{tenant}` replaced by the tenant (as a path
/// segment), else `/hookline/<tenant>`.
pub fn source<'a>(template: Option<&str>, event: &'a Event) -> Cow<'a, str> {
    if !event.source.is_empty() {
        return Cow::Borrowed(&event.source);
    }
    let tenant = path_segment(&event.tenant);
    match template {
        Some(t) => Cow::Owned(t.replace("{tenant}", &tenant)),
        None if tenant.is_empty() => Cow::Borrowed("/hookline"),
        None => Cow::Owned(format!("/hookline/{tenant}")),
    }
}

/// `s` with everything but RFC 3986 unreserved characters percent-encoded, so any tenant keeps the source a valid
/// URI-reference.
fn path_segment(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            push_pct(&mut out, b);
        }
    }
    Cow::Owned(out)
}

fn push_pct(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// An attribute value as an HTTP header value (HTTP binding 3.1.3.2): space, `"`, `%` and every character outside
/// printable ASCII (U+0021-U+007E) percent-encoded, byte by byte of its UTF-8 form, upper-case hex.
pub fn header_value(s: &str) -> Cow<'_, str> {
    let plain = |b: u8| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%';
    if s.bytes().all(plain) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for b in s.bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            push_pct(&mut out, b);
        }
    }
    Cow::Owned(out)
}

/// The data's media type: the event's `datacontenttype` when it is a usable header value (visible ASCII and
/// spaces), else [`DEFAULT_DATA_CONTENT_TYPE`].
pub fn data_content_type(event: &Event) -> &str {
    let ct = event.data_content_type.trim();
    if ct.is_empty() || !ct.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        DEFAULT_DATA_CONTENT_TYPE
    } else {
        ct
    }
}

/// `Content-Type` of a request in `format` carrying `event` (`None`: a request that carries no event, such as the
/// verification challenge, whose body is JSON).
pub fn content_type(format: RequestFormat, event: Option<&Event>) -> &str {
    match (format, event) {
        (RequestFormat::CloudeventsBinary, Some(e)) => data_content_type(e),
        (RequestFormat::CloudeventsStructured, Some(_)) => STRUCTURED_CONTENT_TYPE,
        _ => DEFAULT_DATA_CONTENT_TYPE,
    }
}

/// Whether a media type is JSON: `application/json`, `text/json` or any `+json` suffix (parameters ignored).
fn is_json(media_type: &str) -> bool {
    let essence = media_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// The extensions to send, by name: valid attribute names (`a`-`z`, `0`-`9`) that the specification does not
/// define, in name order (the same headers, in the same order, on every attempt).
fn extensions(event: &Event) -> Vec<(&str, &str)> {
    let mut ext: Vec<(&str, &str)> = event
        .extensions
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .filter(|(k, _)| {
            !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) && !DEFINED_ATTRIBUTES.contains(k)
        })
        .collect();
    ext.sort_unstable();
    ext
}

/// The `ce-*` headers of a binary-mode request (the `Content-Type` is the request's own, see [`content_type`]),
/// values percent-encoded; empty attributes are left out.
pub fn binary_headers(source_template: Option<&str>, event: &Event) -> Vec<(Cow<'static, str>, String)> {
    let mut h: Vec<(Cow<'static, str>, String)> = Vec::with_capacity(8 + event.extensions.len());
    h.push((Cow::Borrowed("ce-specversion"), SPEC_VERSION.to_owned()));
    h.push((Cow::Borrowed("ce-id"), header_value(&event.id).into_owned()));
    h.push((Cow::Borrowed("ce-source"), header_value(&source(source_template, event)).into_owned()));
    h.push((Cow::Borrowed("ce-type"), header_value(&event.r#type).into_owned()));
    if event.occurred_at_ms != 0 {
        h.push((Cow::Borrowed("ce-time"), crate::request::rfc3339_millis(event.occurred_at_ms)));
    }
    if !event.subject.is_empty() {
        h.push((Cow::Borrowed("ce-subject"), header_value(&event.subject).into_owned()));
    }
    if !event.data_schema.is_empty() {
        h.push((Cow::Borrowed("ce-dataschema"), header_value(&event.data_schema).into_owned()));
    }
    for (name, value) in extensions(event) {
        h.push((Cow::Owned(format!("ce-{name}")), header_value(value).into_owned()));
    }
    h
}

/// The body of a binary-mode request: the data alone. Ingest keeps `data` as JSON text; data of another media type
/// that is a JSON string (how the CloudEvents JSON format carries text) is sent as that string's content. No data:
/// an empty body.
pub fn binary_body(event: &Event) -> Vec<u8> {
    let data = crate::request::trim_json_ws(&event.data_json);
    if data.first() == Some(&b'"') && !is_json(data_content_type(event)) {
        if let Ok(text) = serde_json::from_slice::<String>(data) {
            return text.into_bytes();
        }
    }
    data.to_vec()
}

/// The body of a structured-mode request: the event in the CloudEvents JSON format. Extensions are JSON strings
/// (their canonical string form: ingest keeps no other); `data` is the event's JSON verbatim, left out when there
/// is none (and `datacontenttype` with it).
pub fn structured_body(source_template: Option<&str>, event: &Event) -> Vec<u8> {
    let data = crate::request::trim_json_ws(&event.data_json);
    let mut out = Vec::with_capacity(160 + event.id.len() + event.r#type.len() + event.source.len() + data.len());
    fn member(out: &mut Vec<u8>, name: &str, value: &str) {
        out.push(b',');
        crate::request::write_json_str(out, name);
        out.push(b':');
        crate::request::write_json_str(out, value);
    }
    out.extend_from_slice(b"{\"specversion\":\"1.0\"");
    member(&mut out, "id", &event.id);
    member(&mut out, "source", &source(source_template, event));
    member(&mut out, "type", &event.r#type);
    if event.occurred_at_ms != 0 {
        member(&mut out, "time", &crate::request::rfc3339_millis(event.occurred_at_ms));
    }
    if !event.subject.is_empty() {
        member(&mut out, "subject", &event.subject);
    }
    if !event.data_schema.is_empty() {
        member(&mut out, "dataschema", &event.data_schema);
    }
    for (name, value) in extensions(event) {
        member(&mut out, name, value);
    }
    if !data.is_empty() {
        member(&mut out, "datacontenttype", data_content_type(event));
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(data);
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn event() -> Event {
        Event {
            id: "evt_1".into(),
            r#type: "order.paid".into(),
            occurred_at_ms: 1_614_265_330_123,
            tenant: "acme".into(),
            data_json: Bytes::from_static(br#" {"amount": 12} "#),
            ..Default::default()
        }
    }

    fn get<'a>(h: &'a [(Cow<'static, str>, String)], name: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn header_values_are_percent_encoded_as_the_binding_says() {
        // The binding's own example, then each character class it names.
        assert_eq!(header_value("Euro € 😀"), "Euro%20%E2%82%AC%20%F0%9F%98%80");
        assert_eq!(header_value(r#"a "b" 100%"#), "a%20%22b%22%20100%25");
        assert_eq!(header_value("tab\there\u{7f}\u{1}"), "tab%09here%7F%01");
        assert_eq!(header_value("/orders/42?x=1&y=é"), "/orders/42?x=1&y=%C3%A9");
        assert!(matches!(header_value("plain-ascii_~!#$&'()*+,/:;<=>?@[]^`{|}"), Cow::Borrowed(_)));
    }

    #[test]
    fn an_event_without_cloudevents_context_gets_the_default_attributes() {
        let h = binary_headers(None, &event());
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_ref()).collect();
        assert_eq!(names, ["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time"], "empty attributes are left out");
        assert_eq!(get(&h, "ce-specversion"), Some("1.0"));
        assert_eq!(get(&h, "ce-source"), Some("/hookline/acme"));
        assert_eq!(get(&h, "ce-time"), Some("2021-02-25T15:02:10.123Z"));
        let mut e = event();
        e.occurred_at_ms = 0;
        e.tenant.clear();
        let h = binary_headers(None, &e);
        assert_eq!(get(&h, "ce-time"), None, "no time rather than a made-up one");
        assert_eq!(get(&h, "ce-source"), Some("/hookline"));
        e.tenant = "a b/c".into();
        assert_eq!(source(Some("https://hooks.example.com/{tenant}/events"), &e), "https://hooks.example.com/a%20b%2Fc/events");
        assert_eq!(source(None, &e), "/hookline/a%20b%2Fc");
    }

    #[test]
    fn a_cloudevent_keeps_its_own_attributes_and_extensions() {
        let mut e = event();
        e.source = "https://shop.example/orders".into();
        e.subject = "order 42".into();
        e.data_schema = "https://shop.example/schemas/paid.json".into();
        e.extensions = [
            ("traceid", "abc def"),
            ("partitionkey", "k1"),
            ("Bad-Name", "x"),
            ("id", "forged"),
            ("datacontenttype", "text/plain"),
            ("", "empty"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let h = binary_headers(Some("/ignored"), &e);
        assert_eq!(get(&h, "ce-source"), Some("https://shop.example/orders"));
        assert_eq!(get(&h, "ce-subject"), Some("order%2042"));
        assert_eq!(get(&h, "ce-dataschema"), Some("https://shop.example/schemas/paid.json"));
        assert_eq!(get(&h, "ce-id"), Some("evt_1"), "an extension never overrides a defined attribute");
        let ext: Vec<(&str, &str)> = h.iter().skip(7).map(|(n, v)| (n.as_ref(), v.as_str())).collect();
        assert_eq!(ext, [("ce-partitionkey", "k1"), ("ce-traceid", "abc%20def")], "valid names only, in name order");
        assert_eq!(h.iter().filter(|(n, _)| n == "ce-id").count(), 1);
        assert!(h.iter().all(|(n, _)| http_token(n)));
    }

    fn http_token(n: &str) -> bool {
        n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    #[test]
    fn the_binary_body_is_the_data_alone() {
        let e = event();
        assert_eq!(binary_body(&e), br#"{"amount": 12}"#);
        assert_eq!(content_type(RequestFormat::CloudeventsBinary, Some(&e)), "application/json");
        // Text data is kept by ingest as a JSON string: its content is the body.
        let mut text = event();
        text.data_content_type = "text/plain; charset=utf-8".into();
        text.data_json = Bytes::from_static(br#""h\u00e9llo \"world\"""#);
        assert_eq!(binary_body(&text), "héllo \"world\"".as_bytes());
        assert_eq!(content_type(RequestFormat::CloudeventsBinary, Some(&text)), "text/plain; charset=utf-8");
        // A JSON string under a JSON media type stays JSON.
        let mut s = event();
        s.data_content_type = "application/vnd.order+json".into();
        s.data_json = Bytes::from_static(br#""x""#);
        assert_eq!(binary_body(&s), br#""x""#);
        let mut none = event();
        none.data_json = Bytes::new();
        assert!(binary_body(&none).is_empty());
        // A content type that cannot be a header value is not sent as one.
        let mut bad = event();
        bad.data_content_type = "text/plain\r\nx-injected: 1".into();
        assert_eq!(content_type(RequestFormat::CloudeventsBinary, Some(&bad)), "application/json");
        assert_eq!(content_type(RequestFormat::CloudeventsBinary, None), "application/json");
        assert_eq!(content_type(RequestFormat::CloudeventsStructured, Some(&e)), STRUCTURED_CONTENT_TYPE);
    }

    #[test]
    fn the_structured_body_is_the_json_event_format() {
        let mut e = event();
        e.subject = "order \"42\"".into();
        e.extensions = [("traceid".to_owned(), "t1".to_owned()), ("type".to_owned(), "forged".to_owned())].into_iter().collect();
        let b = structured_body(None, &e);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "specversion": "1.0", "id": "evt_1", "source": "/hookline/acme", "type": "order.paid",
                "time": "2021-02-25T15:02:10.123Z", "subject": "order \"42\"", "traceid": "t1",
                "datacontenttype": "application/json", "data": {"amount": 12}
            })
        );
        assert!(std::str::from_utf8(&b).unwrap().ends_with(r#""data":{"amount": 12}}"#), "data verbatim");
        let mut none = event();
        none.data_json = Bytes::new();
        none.occurred_at_ms = 0;
        let v: serde_json::Value = serde_json::from_slice(&structured_body(Some("/s"), &none)).unwrap();
        assert_eq!(v, serde_json::json!({"specversion": "1.0", "id": "evt_1", "source": "/s", "type": "order.paid"}));
    }
}
