//! Fuzz-style property tests of the event decoder (`hookline_core::event_decode::decode`), which reads whatever upstream
//! producers write to the events topic: arbitrary bytes, and valid JSON envelopes and protobuf events mutated byte
//! by byte. It never panics; a decoded event always has a usable id and type; a rejection names one of the
//! documented reasons. `PROPTEST_CASES` overrides the case counts (e.g. for a longer local run).

use bytes::Bytes;
use hookline_core::event_decode::{decode, parse_rfc3339_ms};
use hookline_core::model::Event;
use proptest::prelude::*;
use prost::Message;

const MAX: usize = 64 << 10;
const REASONS: &[&str] = &[
    "oversize",
    "invalid_utf8",
    "invalid_json",
    "missing_field",
    "invalid_field",
    "invalid_protobuf",
    "empty",
    "schema_registry_required",
    "invalid_framing",
];

fn cases(n: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(n);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

/// The invariants of any decode result.
fn check(bytes: &[u8], max: usize, json_only: bool) -> Result<(), TestCaseError> {
    match decode(bytes, max, json_only) {
        Ok(ev) => {
            prop_assert!(!bytes.is_empty() && bytes.len() <= max);
            for (field, v) in [("id", &ev.id), ("type", &ev.r#type)] {
                prop_assert!(!v.trim().is_empty(), "decoded an event with an empty {field}: {ev:?}");
                prop_assert!(v.len() <= 256, "{field} longer than 256 bytes");
                prop_assert!(!v.chars().any(char::is_control), "{field} has control characters: {v:?}");
            }
            prop_assert!(hookline_core::filter::validate_tenant(&ev.tenant).is_ok(), "decoded an unusable tenant {:?}", ev.tenant);
            prop_assert!(ev.occurred_at_ms >= 0 || !json_only, "negative occurred_at from JSON: {}", ev.occurred_at_ms);
            if !ev.data_json.is_empty() {
                let text = std::str::from_utf8(&ev.data_json);
                prop_assert!(text.is_ok(), "data_json is not UTF-8");
                // Well-formed JSON. (Not necessarily readable as `serde_json::Value`: a number like 1e999 is valid
                // grammar, kept raw, and out of f64 range for a receiver's parser.)
                let parsed = serde_json::from_str::<serde::de::IgnoredAny>(text.unwrap());
                prop_assert!(parsed.is_ok(), "data_json is not JSON: {:?}", parsed.err());
            }
        }
        Err(e) => {
            prop_assert!(REASONS.contains(&e.reason), "undocumented reason {:?}", e.reason);
            prop_assert!(!e.detail.is_empty());
            if bytes.is_empty() {
                prop_assert_eq!(e.reason, "empty");
            } else if bytes.len() > max {
                prop_assert_eq!(e.reason, "oversize");
            }
        }
    }
    Ok(())
}

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_.:-]{1,40}"
}

/// Nested JSON values (objects, arrays, strings with escapes and non-ASCII, numbers).
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| serde_json::json!(f)),
        "\\PC{0,12}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map("[a-z\"\\\\]{0,6}", inner, 0..6).prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid JSON envelope, its fields in a random order and with random optional members.
fn envelope() -> impl Strategy<Value = (String, String, Vec<u8>)> {
    (name(), name(), prop::option::of(json_value()), prop::option::of(0i64..4_102_444_800_000), prop::option::of(name()), any::<bool>())
        .prop_map(|(id, ty, data, occurred, tenant, occurred_as_text)| {
            let mut m = serde_json::Map::new();
            m.insert("id".into(), id.clone().into());
            m.insert("type".into(), ty.clone().into());
            if let Some(d) = data {
                m.insert("data".into(), d);
            }
            if let Some(ms) = occurred {
                let v = if occurred_as_text { serde_json::json!("2026-01-02T03:04:05.678Z") } else { serde_json::json!(ms) };
                m.insert("occurred_at".into(), v);
            }
            if let Some(t) = tenant {
                m.insert("tenant".into(), t.into());
            }
            (id, ty, serde_json::to_vec(&serde_json::Value::Object(m)).unwrap())
        })
}

fn protobuf_event() -> impl Strategy<Value = Vec<u8>> {
    (name(), name(), prop::option::of(json_value()), any::<i64>(), "\\PC{0,10}").prop_map(|(id, ty, data, occurred, tenant)| {
        Event {
            id,
            r#type: ty,
            occurred_at_ms: occurred,
            tenant,
            data_json: data.map(|d| Bytes::from(serde_json::to_vec(&d).unwrap())).unwrap_or_default(),
            ..Default::default()
        }
        .encode_to_vec()
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    DuplicateRange(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop::sample::select(vec![b'{', b'}', b'[', b']', b'"', b'\\', b':', b',', 0u8, 0xff, 0x80, b' ', b'\n', 0x0a, 0x12]);
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), interesting).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::DuplicateRange(i, n)),
    ]
}

fn apply(mut b: Vec<u8>, m: &Mutation) -> Vec<u8> {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match m {
        Mutation::Flip(i, x) if !b.is_empty() => {
            let i = at(*i, b.len());
            b[i] ^= x;
        }
        Mutation::Set(i, x) if !b.is_empty() => {
            let i = at(*i, b.len());
            b[i] = *x;
        }
        Mutation::Insert(i, bytes) => {
            let i = at(*i, b.len() + 1);
            b.splice(i..i, bytes.iter().copied());
        }
        Mutation::Delete(i, n) if !b.is_empty() => {
            let i = at(*i, b.len());
            let end = (i + n).min(b.len());
            b.drain(i..end);
        }
        Mutation::Truncate(i) => b.truncate(at(*i, b.len() + 1)),
        Mutation::DuplicateRange(i, n) if !b.is_empty() => {
            let i = at(*i, b.len());
            let end = (i + n).min(b.len());
            let copy = b[i..end].to_vec();
            b.splice(end..end, copy);
        }
        _ => {}
    }
    b
}

proptest! {
    #![proptest_config(cases(10_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512), json_only in any::<bool>(), small in any::<bool>()) {
        check(&bytes, if small { 64 } else { MAX }, json_only)?;
    }

    /// Bytes that start like JSON, so the JSON path (not protobuf) sees them.
    #[test]
    fn json_looking_bytes_never_panic(body in "[{}\\[\\]\":,a-z0-9 \\\\]{0,200}", prefix in prop::sample::select(vec!["{", "[", "\"", " {", "\n["])) {
        check(format!("{prefix}{body}").as_bytes(), MAX, false)?;
    }

    #[test]
    fn valid_envelopes_decode_to_their_id_and_type((id, ty, bytes) in envelope()) {
        let ev = decode(&bytes, MAX, true);
        prop_assert!(ev.is_ok(), "{:?}: {}", ev.err(), String::from_utf8_lossy(&bytes));
        let ev = ev.unwrap();
        prop_assert_eq!((&ev.id, &ev.r#type), (&id, &ty));
        check(&bytes, MAX, false)?;
    }

    #[test]
    fn mutated_envelopes_never_panic((_, _, bytes) in envelope(), muts in prop::collection::vec(mutation(), 1..6), json_only in any::<bool>()) {
        let bytes = muts.iter().fold(bytes, apply);
        check(&bytes, MAX, json_only)?;
    }

    #[test]
    fn mutated_protobuf_events_never_panic(bytes in protobuf_event(), muts in prop::collection::vec(mutation(), 0..6)) {
        let bytes = muts.iter().fold(bytes, apply);
        check(&bytes, MAX, false)?;
    }

    #[test]
    fn rfc3339_never_panics(s in "\\PC{0,40}") {
        let _ = parse_rfc3339_ms(&s);
    }

    #[test]
    fn rfc3339_near_valid_never_panics(
        y in 0u32..10_000, mo in 0u32..20, d in 0u32..40, h in 0u32..30, mi in 0u32..70, s in 0u32..70,
        frac in "(\\.[0-9]{0,12})?", tz in prop::sample::select(vec!["Z", "z", "+00:00", "-23:59", "+99:99", "", "+0000", "ZZ"]),
    ) {
        let _ = parse_rfc3339_ms(&format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{frac}{tz}"));
    }
}

proptest! {
    #![proptest_config(cases(400))]

    /// Deep nesting anywhere (in `data`, at the top, inside strings) is bounded, never a stack overflow.
    #[test]
    fn deep_nesting_is_bounded(depth in 100usize..20_000, open in prop::sample::select(vec!["[", "{\"a\":"]), in_string in any::<bool>()) {
        let close = if open == "[" { "]" } else { "}" };
        let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let data = if in_string { serde_json::to_string(&nested).unwrap() } else { nested };
        let text = format!("{{\"id\":\"a\",\"type\":\"t\",\"data\":{data}}}");
        check(text.as_bytes(), 1 << 20, false)?;
        let r = decode(text.as_bytes(), 1 << 20, false);
        if in_string {
            prop_assert!(r.is_ok(), "brackets inside a string are not nesting: {:?}", r.err());
        } else if depth + 1 > 128 {
            prop_assert_eq!(r.unwrap_err().reason, "invalid_json");
        }
    }
}

/// Header names a CloudEvent producer might send, right or wrong.
fn ce_header() -> impl Strategy<Value = (String, Vec<u8>)> {
    let name = prop::sample::select(vec![
        "ce_specversion",
        "ce_id",
        "ce_type",
        "ce_source",
        "ce_time",
        "ce_subject",
        "ce_tenant",
        "ce_partitionkey",
        "ce_traceparent",
        "ce_region",
        "ce_Bad-Name",
        "content-type",
        "CE_ID",
    ]);
    let value = prop_oneof![
        prop::sample::select(vec!["1.0", "0.3", "", "x", "2026-01-02T03:04:05Z", "application/json", "text/plain", "application/avro"])
            .prop_map(|v| v.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
    ];
    (name.prop_map(str::to_owned), value)
}

proptest! {
    #![proptest_config(cases(2000))]

    /// Whatever headers and value a record carries (on Kafka or HTTP), the decoder answers without panicking, and a
    /// CloudEvent it accepts has a usable id, type, source and tenant.
    #[test]
    fn cloudevents_headers_never_panic(
        headers in prop::collection::vec(ce_header(), 0..10),
        value in prop::option::of(prop::collection::vec(any::<u8>(), 0..80)),
        key in prop::option::of(prop::collection::vec(any::<u8>(), 0..8)),
        http in any::<bool>(),
    ) {
        use hookline_core::cloudevents::{Binding, Context};
        use hookline_core::event_decode::{decode_record, Decoded};
        let binding = if http { Binding::Http } else { Binding::Kafka };
        let named: Vec<(String, Vec<u8>)> =
            headers.iter().map(|(n, v)| (if http { n.replacen("ce_", "ce-", 1) } else { n.clone() }, v.clone())).collect();
        let ctx = Context::from_headers(binding, named.iter().map(|(n, v)| (n.as_str(), v.as_slice())), key.as_deref());
        match decode_record(value.as_deref(), &ctx, MAX, http) {
            Ok(Decoded::Event(ev)) => {
                prop_assert!(!ev.id.trim().is_empty() && !ev.r#type.trim().is_empty());
                prop_assert!(!ctx.is_binary() || !ev.source.trim().is_empty(), "a binary CloudEvent without a source: {ev:?}");
                prop_assert!(hookline_core::filter::validate_tenant(&ev.tenant).is_ok());
            }
            Ok(Decoded::NoData) => prop_assert!(ctx.is_binary() && value.as_deref().unwrap_or_default().is_empty()),
            Err(e) => prop_assert!(REASONS.contains(&e.reason), "undocumented reason {}", e.reason),
        }
    }
}
