//! Tracing end to end: a `traceparent` published with an event is continued by every span hookline makes (fan-out,
//! each attempt, the retry hold, the dead letter), exported over OTLP/HTTP to an in-process collector stub, and sent
//! on to the receiver as the attempt's own context. Each test's pipeline exports to its own collector, so the
//! other tests (tracing off) are unaffected.
//!
//! `HOOKLINE_TRACE_DUMP=1` prints the collected trace (docs/operations.md shows one).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use hookline_core::trace::TraceParent;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde_json::json;

use crate::pipeline::quick_policy;
use crate::support::{wait_for, Collected, Pipeline, TOKEN};

const LIMIT: Duration = Duration::from_secs(60);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// A span as the collector received it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    scope: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    start_ns: u64,
    end_ns: u64,
    attrs: HashMap<String, String>,
}

impl Got {
    fn attr(&self, key: &str) -> &str {
        self.attrs.get(key).map(String::as_str).unwrap_or("")
    }
}

/// An OTLP/HTTP collector: `POST /v1/traces` with an `ExportTraceServiceRequest` in protobuf.
async fn collector() -> (SocketAddr, Arc<Collected<Got>>) {
    async fn traces(State(c): State<Arc<Collected<Got>>>, body: Bytes) -> (StatusCode, Vec<u8>) {
        let Ok(req) = ExportTraceServiceRequest::decode(body) else { return (StatusCode::BAD_REQUEST, Vec::new()) };
        let mut got = Vec::new();
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| value(kv.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                let scope = ss.scope.map(|s| s.name).unwrap_or_default();
                for s in ss.spans {
                    got.push(Got {
                        service: service.clone(),
                        scope: scope.clone(),
                        name: s.name,
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent: hex::encode(&s.parent_span_id),
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        attrs: s.attributes.iter().map(|kv| (kv.key.clone(), value(kv.value.as_ref()))).collect(),
                    });
                }
            }
        }
        c.items.lock().unwrap().extend(got);
        c.changed.notify_waiters();
        (StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
    }
    fn value(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match v.and_then(|v| v.value.as_ref()) {
            Some(AnyValue::StringValue(s)) => s.clone(),
            Some(AnyValue::IntValue(i)) => i.to_string(),
            Some(AnyValue::BoolValue(b)) => b.to_string(),
            Some(AnyValue::DoubleValue(d)) => d.to_string(),
            other => format!("{other:?}"),
        }
    }
    let spans = Arc::new(Collected::<Got>::default());
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(traces)).with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind collector");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, spans)
}

async fn traced_pipeline(collector: SocketAddr) -> Pipeline {
    Pipeline::start_with(2, |c| {
        c.telemetry.otlp_endpoint = Some(format!("http://{collector}"));
        c.telemetry.service_name = "hookline-test".into();
        c.telemetry.export_interval_ms = 50;
    })
    .await
}

/// `POST /v1/events` with extra headers.
async fn publish_with(p: &Pipeline, id: &str, headers: &[(&str, &str)]) {
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/v1/events", p.api))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = json!({"id": id, "type": "order.created", "data": {"n": 1}}).to_string();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client.request(req.body(Full::new(Bytes::from(body))).unwrap()).await.expect("API answers");
    let status = resp.status();
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, 202, "publish: {}", String::from_utf8_lossy(&text));
}

fn spans_of(spans: &Collected<Got>, trace_id: &str) -> Vec<Got> {
    let mut v: Vec<Got> = spans.items.lock().unwrap().iter().filter(|s| s.trace_id == trace_id).cloned().collect();
    v.sort_by_key(|s| s.start_ns);
    v
}

/// The trace as an indented tree, each span with its offset from the trace's first span and its attributes.
fn render(spans: &[Got]) -> String {
    fn walk(out: &mut String, spans: &[Got], parent: &str, depth: usize, t0: u64) {
        for s in spans.iter().filter(|s| s.parent == parent) {
            let mut attrs: Vec<_> = s.attrs.iter().collect();
            attrs.sort();
            let attrs: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!(
                "{:indent$}{} [{}] span {} +{} ms, {} ms\n{:indent$}    {}\n",
                "",
                s.name,
                s.scope,
                s.span_id,
                (s.start_ns.saturating_sub(t0)) / 1_000_000,
                (s.end_ns.saturating_sub(s.start_ns)) / 1_000_000,
                "",
                attrs.join(" "),
                indent = depth * 2
            ));
            walk(out, spans, &s.span_id, depth + 1, t0);
        }
    }
    let t0 = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let roots: Vec<String> = spans.iter().filter(|s| !ids.contains(&s.parent.as_str())).map(|s| s.parent.clone()).collect();
    let mut out = String::new();
    for root in roots.iter().collect::<std::collections::BTreeSet<_>>() {
        out.push_str(&format!("trace {} (parent {})\n", spans[0].trace_id, if root.is_empty() { "none" } else { root }));
        walk(&mut out, spans, root, 1, t0);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_is_followed_from_publish_to_its_last_attempt() {
    let (addr, spans) = collector().await;
    let p = traced_pipeline(addr).await;
    p.script("flaky", vec![Some((503, None)), Some((200, None))]);
    p.script("gone", vec![Some((410, None))]);
    let (flaky, _) =
        p.subscribe(json!({"url": p.url("flaky"), "event_types": ["order.*"], "policy_toml": quick_policy(&[0.5], |_| {})})).await;
    let (gone, _) = p.subscribe(json!({"url": p.url("gone"), "event_types": ["order.*"], "policy": "fynapse"})).await;
    let incoming = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    publish_with(&p, "evt_traced", &[("traceparent", &incoming), ("tracestate", "vendor=abc")]).await;
    p.wait_finals(2, LIMIT).await;

    // The receiver got the same trace, each attempt as its parent (a new span id every time), and the tracestate.
    let got = p.requests_to("flaky");
    assert_eq!(got.len(), 2, "503 then 200");
    let sent: Vec<TraceParent> =
        got.iter().map(|r| TraceParent::parse(r.headers["traceparent"].to_str().unwrap()).expect("a valid traceparent is sent")).collect();
    for (tp, r) in sent.iter().zip(&got) {
        assert_eq!(hex::encode(tp.trace_id), TRACE_ID);
        assert_ne!(hex::encode(tp.span_id), PARENT_ID, "the parent is the attempt's span, not the publisher's");
        assert!(tp.sampled());
        assert_eq!(r.headers["tracestate"], "vendor=abc");
    }
    assert_ne!(sent[0].span_id, sent[1].span_id);

    // Every span of the event reached the collector.
    let spans2 = spans.clone();
    wait_for(&spans.changed, LIMIT, "fan-out, 3 attempts, a retry hold and a dead letter", || {
        let s = spans_of(&spans2, TRACE_ID);
        let n = |name: &str| s.iter().filter(|x| x.name == name).count();
        n("hookline.fanout") == 1 && n("hookline.attempt") == 3 && n("hookline.retry.hold") == 1 && n("hookline.dead_letter") == 1
    })
    .await;
    let trace = spans_of(&spans, TRACE_ID);
    if std::env::var_os("HOOKLINE_TRACE_DUMP").is_some() {
        println!("{}", render(&trace));
    }
    assert!(trace.iter().all(|s| s.service == "hookline-test"));
    let fanout = trace.iter().find(|s| s.name == "hookline.fanout").unwrap();
    assert_eq!(fanout.parent, PARENT_ID, "the fan-out continues the publisher's span");
    assert_eq!(fanout.scope, "hookline-ingest");
    assert_eq!((fanout.attr("hookline.event.id"), fanout.attr("hookline.deliveries")), ("evt_traced", "2"));

    let attempts_of = |sub: &str| -> Vec<&Got> {
        trace.iter().filter(|s| s.name == "hookline.attempt" && s.attr("hookline.subscription.id") == sub).collect()
    };
    let flaky_attempts = attempts_of(&flaky);
    assert_eq!(flaky_attempts.len(), 2);
    let (first, second) = (flaky_attempts[0], flaky_attempts[1]);
    assert_eq!(
        (
            first.attr("hookline.attempt"),
            first.attr("hookline.outcome"),
            first.attr("http.response.status_code"),
            first.attr("hookline.verdict")
        ),
        ("1", "503", "503", "retry")
    );
    assert!(first.attr("hookline.next_due_at_ms").parse::<i64>().unwrap() > 0, "{first:?}");
    assert_eq!(
        (
            second.attr("hookline.attempt"),
            second.attr("hookline.outcome"),
            second.attr("hookline.verdict"),
            second.attr("hookline.final_state")
        ),
        ("2", "200", "success", "succeeded")
    );
    for (span, tp) in [first, second].iter().zip(&sent) {
        assert_eq!(span.parent, fanout.span_id);
        assert_eq!(span.scope, "hookline-dispatcher");
        assert_eq!(span.span_id, hex::encode(tp.span_id), "the request's traceparent names the attempt's span");
    }
    let hold = trace.iter().find(|s| s.name == "hookline.retry.hold").unwrap();
    assert_eq!((hold.attr("hookline.subscription.id"), hold.attr("hookline.retry.route")), (flaky.as_str(), "deliveries"));
    assert_eq!(hold.scope, "hookline-retry-scheduler");
    // The hold starts when attempt 1 schedules the retry (while it writes its outcome) and ends at the release;
    // its times are whole milliseconds (the records' clock), hence the 1 ms allowance.
    assert!(
        first.start_ns <= hold.start_ns + 1_000_000 && hold.end_ns <= second.start_ns,
        "attempt 1 → hold → attempt 2 in time order: {first:?} {hold:?} {second:?}"
    );
    assert!(hold.end_ns - hold.start_ns >= 400_000_000, "held for the 0.5 s wait: {hold:?}");

    let gone_attempt = attempts_of(&gone);
    assert_eq!(
        (gone_attempt.len(), gone_attempt[0].attr("hookline.outcome"), gone_attempt[0].attr("hookline.verdict")),
        (1, "410", "terminal")
    );
    let dead = trace.iter().find(|s| s.name == "hookline.dead_letter").unwrap();
    assert_eq!(dead.parent, gone_attempt[0].span_id, "the dead letter follows the last attempt");
    assert_eq!((dead.attr("hookline.dead_letter.reason"), dead.attr("hookline.final_state")), ("terminal_outcome", "dead"));

    // The attempts topic names each try's span too (the delivery log can link to the trace).
    let recs = p.attempts_of(&flaky);
    let named: Vec<&str> = recs.iter().filter(|r| r.r#try > 0).map(|r| r.traceparent.as_str()).collect();
    assert!(named.contains(&got[0].headers["traceparent"].to_str().unwrap()), "{named:?}");
    // The dead letter carries the event's trace context.
    let dl = p.dlq.items.lock().unwrap().iter().find(|d| d.subscription_id == gone).cloned().expect("dead letter");
    assert_eq!(dl.event.unwrap().traceparent, format!("00-{TRACE_ID}-{}-01", fanout.span_id));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_header_is_continued_and_an_invalid_or_missing_traceparent_starts_a_new_trace() {
    let (addr, spans) = collector().await;
    let p = traced_pipeline(addr).await;
    p.subscribe(json!({"url": p.url("hook"), "event_types": ["*"]})).await;

    // Published to the events topic with W3C record headers, as an instrumented Kafka producer does.
    let kafka_trace = "0af7651916cd43dd8448eb211c80319c";
    let producer = hookline_kafka::client::producer(&p.config.kafka, "test-upstream").unwrap();
    let headers = OwnedHeaders::new()
        .insert(Header { key: "traceparent", value: Some(&format!("00-{kafka_trace}-b7ad6b7169203331-01")) })
        .insert(Header { key: "tracestate", value: Some("congo=t61rcWkgMzE") });
    let record = br#"{"id":"evt_kafka_tp","type":"x.y","data":{}}"#;
    let events = p.topics().events().to_owned();
    producer
        .send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(&record[..]).headers(headers), Duration::from_secs(5))
        .await
        .unwrap();
    p.wait_finals(1, LIMIT).await;
    let r = &p.requests_to("hook")[0];
    let tp = TraceParent::parse(r.headers["traceparent"].to_str().unwrap()).unwrap();
    assert_eq!(hex::encode(tp.trace_id), kafka_trace, "the record header's trace is continued");
    assert_eq!(r.headers["tracestate"], "congo=t61rcWkgMzE");

    // A malformed record with a traceparent: its dead letter is a span of the publisher's trace.
    let bad_trace = "5b8aa5a2d2c872e8321cf37308d69df2";
    let headers = OwnedHeaders::new().insert(Header { key: "traceparent", value: Some(&format!("00-{bad_trace}-051581bf3cb55c13-01")) });
    producer
        .send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(&b"{not json"[..]).headers(headers), Duration::from_secs(5))
        .await
        .unwrap();
    let spans2 = spans.clone();
    wait_for(&spans.changed, LIMIT, "the malformed record's dead-letter span", || {
        spans_of(&spans2, bad_trace).iter().any(|s| {
            s.name == "hookline.dead_letter" && s.parent == "051581bf3cb55c13" && s.attr("hookline.dead_letter.reason") == "invalid_json"
        })
    })
    .await;

    let upper = format!("00-{}-{PARENT_ID}-01", TRACE_ID.to_uppercase());
    publish_with(&p, "evt_bad_tp", &[("traceparent", &upper), ("tracestate", "vendor=abc")]).await;
    publish_with(&p, "evt_no_tp", &[]).await;
    p.wait_finals(3, LIMIT).await;
    let got = p.requests_to("hook");
    let mut trace_ids = Vec::new();
    for r in &got[1..] {
        let raw = r.headers["traceparent"].to_str().unwrap();
        assert_ne!(raw, upper, "an invalid traceparent is never copied");
        let tp = TraceParent::parse(raw).expect("a new, valid trace");
        assert_ne!(hex::encode(tp.trace_id), TRACE_ID.to_lowercase());
        assert!(r.headers.get("tracestate").is_none(), "a tracestate without a valid traceparent is dropped");
        trace_ids.push(hex::encode(tp.trace_id));
    }
    assert_eq!(trace_ids.len(), 2);
    assert_ne!(trace_ids[0], trace_ids[1], "each event starts its own trace");
    for id in &trace_ids {
        let spans2 = spans.clone();
        wait_for(&spans.changed, LIMIT, "the new trace's root fan-out and its attempt", || {
            let s = spans_of(&spans2, id);
            s.iter().any(|x| x.name == "hookline.fanout" && x.parent.is_empty()) && s.iter().any(|x| x.name == "hookline.attempt")
        })
        .await;
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_no_trace_context_is_carried() {
    let p = Pipeline::start(2).await;
    p.subscribe(json!({"url": p.url("plain"), "event_types": ["*"]})).await;
    publish_with(&p, "evt_off", &[("traceparent", &format!("00-{TRACE_ID}-{PARENT_ID}-01"))]).await;
    p.wait_finals(1, LIMIT).await;
    let got = p.requests_to("plain");
    assert!(got[0].headers.get("traceparent").is_none(), "{:?}", got[0].headers);
    assert!(p.finals()[0].traceparent.is_empty());
    p.stop().await;
}
