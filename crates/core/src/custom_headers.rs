//! Per-subscription static headers: the rules a header must meet to be saved, and the prepared list the
//! dispatcher appends to every attempt. Checked on save (a 422 naming `headers.<name>`) and prepared once when the
//! subscription is loaded, never per delivery.

use std::collections::HashMap;

use crate::policy::Policy;
use crate::sign::names;

/// Most custom headers a subscription may carry.
pub const MAX_HEADERS: usize = 20;
pub const MAX_NAME_BYTES: usize = 64;
pub const MAX_VALUE_BYTES: usize = 1024;
/// Names and values together, so twenty maximal values cannot make every request 20 KiB larger.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// Connection-scoped headers (RFC 9110 §7.6.1) and the framing ones hyper sets itself.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
/// Set by hookline on every request: the body's description, the host it connects to, who sends it, and the
/// trace context of the attempt.
const PLATFORM: [&str; 6] = ["host", "content-length", "content-type", "user-agent", "traceparent", "tracestate"];

/// Why a header cannot be saved; `name` is the header as the request spelled it (the field is `headers.<name>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HeaderError {
    pub name: String,
    pub message: String,
}

/// The headers an attempt under `policy` carries besides the custom ones, lower-cased: the signature headers of
/// every scheme (a later policy change must not turn a custom header into a forged signature), the policy's
/// id/type/attempt/idempotency headers, `origin` after a CloudEvents handshake, and under a CloudEvents binary
/// format every `ce-` header (`ce-*`: a static one would forge or duplicate the event's attributes).
pub fn platform_header_names(policy: &Policy) -> Vec<String> {
    let mut v: Vec<String> = PLATFORM.iter().map(|s| (*s).to_owned()).collect();
    let all_schemes = [
        names::WEBHOOK_ID,
        names::WEBHOOK_TIMESTAMP,
        names::WEBHOOK_SIGNATURE,
        names::GAUGE_SIGNATURE,
        names::PULSE_SIGNATURE,
        names::PULSE_TIMESTAMP,
        names::PULSE_EVENT,
    ];
    v.extend(all_schemes.iter().map(|s| s.to_ascii_lowercase()));
    let shape = &policy.request;
    let optional =
        [&shape.idempotency_key_header, &shape.event_id_header, &shape.event_type_header, &shape.webhook_id_header, &shape.attempt_header];
    v.extend(optional.into_iter().flatten().map(|s| s.to_ascii_lowercase()));
    if policy.verification.as_ref().and_then(|ver| ver.cloudevents_origin()).is_some() {
        v.push("origin".into());
    }
    if shape.format == crate::policy::RequestFormat::CloudeventsBinary {
        v.push("ce-*".into());
    }
    v
}

/// Whether `lower` (a lower-cased name) is one of `reserved`; an entry ending in `*` reserves a prefix.
fn is_reserved(reserved: &[String], lower: &str) -> bool {
    reserved.iter().any(|r| match r.strip_suffix('*') {
        Some(prefix) => lower.starts_with(prefix),
        None => r == lower,
    })
}

/// An RFC 9110 token character.
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn check_one(name: &str, value: &str, reserved: &[String]) -> Result<(), String> {
    if name.is_empty() {
        return Err("a header name must not be empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("header names are at most {MAX_NAME_BYTES} bytes, got {}", name.len()));
    }
    if let Some(c) = name.bytes().find(|b| !tchar(*b)) {
        return Err(format!("{:?} is not allowed in a header name (RFC 9110 token characters only)", c as char));
    }
    let lower = name.to_ascii_lowercase();
    if HOP_BY_HOP.contains(&lower.as_str()) {
        return Err(format!("{name} is a hop-by-hop header and cannot be set"));
    }
    if is_reserved(reserved, &lower) {
        return Err(format!("{name} is set by hookline on every request (signature, ids, framing) and cannot be overridden"));
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!("header values are at most {MAX_VALUE_BYTES} bytes, got {}", value.len()));
    }
    // Visible ASCII and inner spaces/tabs: no CR/LF (header injection), no obs-text, no padding that HTTP strips.
    if let Some(c) = value.bytes().find(|b| !(b.is_ascii_graphic() || *b == b' ' || *b == b'\t')) {
        return Err(format!("byte 0x{c:02x} is not allowed in a header value (visible ASCII, spaces and tabs only)"));
    }
    if value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']) {
        return Err("a header value must not start or end with whitespace".into());
    }
    Ok(())
}

/// Checks every header of a subscription against `policy`; names are compared case-insensitively, so `X-A` and
/// `x-a` together are refused as duplicates. Errors come in name order, so the same request names the same header.
pub fn validate(headers: &HashMap<String, String>, policy: &Policy) -> Result<(), HeaderError> {
    let err = |name: &str, message: String| HeaderError { name: name.to_owned(), message };
    if headers.len() > MAX_HEADERS {
        return Err(err("", format!("at most {MAX_HEADERS} headers, got {}", headers.len())));
    }
    let reserved = platform_header_names(policy);
    let mut names: Vec<&String> = headers.keys().collect();
    names.sort();
    let mut seen: Vec<String> = Vec::with_capacity(names.len());
    let mut total: usize = 0;
    for name in names {
        let value = &headers[name];
        check_one(name, value, &reserved).map_err(|m| err(name, m))?;
        let lower = name.to_ascii_lowercase();
        if seen.contains(&lower) {
            return Err(err(name, format!("{name} is given twice (header names are case-insensitive)")));
        }
        seen.push(lower);
        total = total.saturating_add(name.len()).saturating_add(value.len());
    }
    if total > MAX_TOTAL_BYTES {
        return Err(err("", format!("names and values together are at most {MAX_TOTAL_BYTES} bytes, got {total}")));
    }
    Ok(())
}

/// The headers to append to every attempt, lower-cased and sorted by name: those of `headers` that pass
/// [`validate`]'s per-header rules under `policy`. A stored header that no longer passes (its policy changed under
/// it) is left out and reported, so the platform's own headers always win.
pub fn prepare(headers: &HashMap<String, String>, policy: &Policy) -> (Vec<(String, String)>, Vec<HeaderError>) {
    let reserved = platform_header_names(policy);
    let mut out: Vec<(String, String)> = Vec::with_capacity(headers.len().min(MAX_HEADERS));
    let mut dropped = Vec::new();
    let mut names: Vec<&String> = headers.keys().collect();
    names.sort();
    for name in names {
        let value = &headers[name];
        match check_one(name, value, &reserved) {
            Ok(()) if out.len() < MAX_HEADERS && !out.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) => {
                out.push((name.to_ascii_lowercase(), value.clone()));
            }
            Ok(()) => dropped.push(HeaderError { name: name.clone(), message: "duplicate or over the limit".into() }),
            Err(message) => dropped.push(HeaderError { name: name.clone(), message }),
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn standard() -> Policy {
        crate::policy::builtin("standard").unwrap()
    }

    #[test]
    fn accepts_ordinary_headers() {
        assert!(validate(&h(&[("X-Api-Key", "abc 123"), ("Authorization", "Bearer t0k3n")]), &standard()).is_ok());
        assert!(validate(&HashMap::new(), &standard()).is_ok());
    }

    #[test]
    fn refuses_what_would_break_or_forge_the_request() {
        let cases: &[(&str, &str, &str)] = &[
            ("Connection", "close", "hop-by-hop"),
            ("Transfer-Encoding", "chunked", "hop-by-hop"),
            ("Host", "evil.example", "set by hookline"),
            ("Content-Length", "1", "set by hookline"),
            ("content-type", "text/plain", "set by hookline"),
            ("Webhook-Signature", "v1,forged", "set by hookline"),
            ("webhook-id", "x", "set by hookline"),
            ("Gauge-Signature", "t=1,v1=00", "set by hookline"),
            ("X-Pulse-Signature", "00", "set by hookline"),
            ("Bad Name", "x", "token characters"),
            ("", "x", "empty"),
            ("X-A", "line\r\nInjected: yes", "0x0d"),
            ("X-A", " padded", "whitespace"),
            ("X-A", "é", "0xc3"),
        ];
        for (name, value, want) in cases {
            let e = validate(&h(&[(name, value)]), &standard()).unwrap_err();
            assert_eq!(e.name, *name);
            assert!(e.message.contains(want), "{name}: {}", e.message);
        }
        assert!(validate(&h(&[(&"x".repeat(MAX_NAME_BYTES + 1), "v")]), &standard()).is_err());
        assert!(validate(&h(&[("X-A", &"v".repeat(MAX_VALUE_BYTES + 1))]), &standard()).is_err());
    }

    #[test]
    fn the_policys_own_header_names_are_reserved() {
        let gauge = crate::policy::builtin("gauge").unwrap();
        let e = validate(&h(&[("gauge-event-id", "x")]), &gauge).unwrap_err();
        assert!(e.message.contains("cannot be overridden"), "{e}");
        assert!(validate(&h(&[("gauge-event-id", "x")]), &standard()).is_ok());
    }

    /// Under CloudEvents binary mode a static `ce-` header would forge an attribute of every event; after a
    /// CloudEvents handshake `Origin` is the granted origin.
    #[test]
    fn cloudevents_attribute_headers_and_the_granted_origin_are_reserved() {
        let mut p = standard();
        assert!(validate(&h(&[("ce-tenant", "acme"), ("Origin", "x")]), &p).is_ok(), "free under the envelope");
        p.request.format = crate::policy::RequestFormat::CloudeventsBinary;
        p.verification = Some(crate::policy::Verification {
            method: crate::policy::VerificationMethod::Cloudevents,
            timeout_ms: 1000,
            origin: Some("hooks.example.com".into()),
        });
        for name in ["CE-Source", "ce-tenant", "Origin"] {
            let e = validate(&h(&[(name, "x")]), &p).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.message.contains("set by hookline"), "{e}");
        }
        assert!(validate(&h(&[("x-ce-note", "ok")]), &p).is_ok());
    }

    #[test]
    fn caps_count_total_size_and_case_duplicates() {
        let many: HashMap<String, String> = (0..=MAX_HEADERS).map(|i| (format!("x-{i}"), "v".into())).collect();
        assert!(validate(&many, &standard()).unwrap_err().message.contains("at most"));
        let big: HashMap<String, String> = (0..8).map(|i| (format!("x-{i}"), "v".repeat(MAX_VALUE_BYTES))).collect();
        assert!(validate(&big, &standard()).unwrap_err().message.contains("together"));
        let dup = validate(&h(&[("X-A", "1"), ("x-a", "2")]), &standard()).unwrap_err();
        assert!(dup.message.contains("twice"), "{dup}");
    }

    #[test]
    fn prepare_keeps_valid_headers_and_drops_a_reserved_one() {
        let gauge = crate::policy::builtin("gauge").unwrap();
        let (kept, dropped) = prepare(&h(&[("X-B", "2"), ("X-A", "1"), ("Gauge-Event-Id", "forged")]), &gauge);
        assert_eq!(kept, vec![("x-a".to_owned(), "1".to_owned()), ("x-b".to_owned(), "2".to_owned())]);
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].name, "Gauge-Event-Id");
    }
}
