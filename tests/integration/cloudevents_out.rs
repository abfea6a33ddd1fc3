//! CloudEvents to receivers, checked by the ecosystem's own tools: a receiver (`interop/cloudevents_receiver.py`) parses
//! every delivery with the official CloudEvents Python SDK, checks its signature with the `standardwebhooks`
//! library, and answers the CloudEvents web hooks validation handshake. Needs `HOOKLINE_TEST_PYTHON` (set by
//! scripts/test from scripts/python-test-deps); without it the tests skip, unless `HOOKLINE_TEST_REQUIRE_PYTHON=1`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline_core::model::Event;
use hookline_core::policy::{RequestFormat, Verification, VerificationMethod};
use hookline_kafka::Topics;
use rdkafka::producer::FutureRecord;
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::pipeline::quick_policy;
use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(30);
/// The subscriptions' secret, known to the receiver before they exist.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ORIGIN: &str = "hooks.example.com";

/// The interpreter with the SDKs, or `None` (the test skips, saying why) when the environment names none.
fn python() -> Option<String> {
    match std::env::var("HOOKLINE_TEST_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ if std::env::var("HOOKLINE_TEST_REQUIRE_PYTHON").as_deref() == Ok("1") => {
            panic!("HOOKLINE_TEST_REQUIRE_PYTHON=1 but HOOKLINE_TEST_PYTHON is not set (scripts/python-test-deps prints it)")
        }
        _ => {
            eprintln!("skipped: HOOKLINE_TEST_PYTHON is not set (run scripts/python-test-deps and export what it prints)");
            None
        }
    }
}

/// The Python receiver: its port, and what it reported, one JSON value per request. Stopped when dropped.
struct Receiver {
    port: u16,
    seen: Arc<Mutex<Vec<Value>>>,
    changed: Arc<Notify>,
    child: std::process::Child,
}

impl Receiver {
    async fn start(python: &str) -> Receiver {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/integration/interop/cloudevents_receiver.py");
        let mut child = std::process::Command::new(python)
            .arg(&script)
            .arg(SECRET)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the Python receiver starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (seen, changed) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Notify::new()));
        let (port_tx, port_rx) = tokio::sync::oneshot::channel();
        // Its output is read on a thread of its own: the lines come as the receiver handles requests.
        std::thread::spawn({
            let (seen, changed) = (seen.clone(), changed.clone());
            move || {
                let mut lines = BufReader::new(stdout).lines();
                let port = lines.next().and_then(Result::ok).and_then(|l| l.trim().parse::<u16>().ok());
                let _ = port_tx.send(port);
                for line in lines.map_while(Result::ok) {
                    seen.lock().unwrap().push(serde_json::from_str::<Value>(&line).expect("the receiver reports JSON"));
                    changed.notify_waiters();
                }
            }
        });
        let port = tokio::time::timeout(LIMIT, port_rx).await.ok().and_then(Result::ok).flatten();
        let Some(port) = port else {
            let _ = child.kill();
            panic!("the receiver did not print its port (is the CloudEvents SDK installed? scripts/python-test-deps)");
        };
        Receiver { port, seen, changed, child }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    fn matching(&self, f: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.seen.lock().unwrap().iter().filter(|r| f(r)).cloned().collect()
    }

    /// The delivery of `event_id` to `path`, once the receiver reported it.
    async fn delivery(&self, path: &str, event_id: &str) -> Value {
        let what = format!("the delivery of {event_id} to /{path}");
        let found = |r: &Value| r["method"] == "POST" && r["path"] == format!("/{path}") && r["event"]["id"] == event_id;
        wait_for(&self.changed, LIMIT, &what, || !self.matching(found).is_empty()).await;
        self.matching(found).remove(0)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An event as it would arrive as a CloudEvent (its context in the proto's CloudEvents fields), produced as
/// protobuf to the events topic.
async fn produce(p: &Pipeline, event: &Event) {
    let producer = hookline_kafka::client::producer(&p.config.kafka, "test-cloudevents").unwrap();
    let events = Topics::new(p.config.kafka.topic_prefix.clone()).events().to_owned();
    let value = prost::Message::encode_to_vec(event);
    producer.send(FutureRecord::<str, [u8]>::to(&events).key(&event.id).payload(&value), Duration::from_secs(5)).await.unwrap();
}

fn handshake() -> Option<Verification> {
    Some(Verification { method: VerificationMethod::Cloudevents, timeout_ms: 3000, origin: Some(ORIGIN.into()) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloudevents_sdk_parses_every_delivery_after_the_validation_handshake() {
    let Some(python) = python() else { return };
    let p = Pipeline::start(2).await;
    let r = Receiver::start(&python).await;

    // Binary mode behind the handshake, with a rate limit of 2/s: the handshake asks for 120 a minute and the
    // receiver grants 60, which the subscription keeps.
    let binary = quick_policy(&[0.2], |pol| {
        pol.request.format = RequestFormat::CloudeventsBinary;
        pol.verification = handshake();
    });
    let (bin_id, _) = p
        .subscribe(json!({"url": r.url("ok"), "event_types": ["*"], "policy_toml": binary, "secret": SECRET, "rate_limit_per_s": 2}))
        .await;
    let view = p.subscription_when(&bin_id, |v| v["verification"] == "verified").await;
    assert_eq!(view["state"], "active", "{view}");
    assert_eq!(view["verification_allowed_rate_per_min"], 60, "{view}");
    let asked = r.matching(|x| x["method"] == "OPTIONS" && x["path"] == "/ok");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!((asked[0]["origin"].as_str(), asked[0]["rate"].as_str()), (Some(ORIGIN), Some("120")));

    // Structured mode, no handshake, its own default source.
    let structured = quick_policy(&[0.2], |pol| {
        pol.request.format = RequestFormat::CloudeventsStructured;
        pol.request.cloudevents_source = Some("https://hooks.example.com/{tenant}".into());
    });
    p.subscribe(json!({"url": r.url("structured"), "event_types": ["*"], "policy_toml": structured, "secret": SECRET})).await;

    // A CloudEvent with every attribute, one with text data, and an ordinary JSON event published to the API.
    let mut full = Event {
        id: "evt_ce_1".into(),
        r#type: "order.paid".into(),
        occurred_at_ms: 1_767_225_600_123,
        source: "https://shop.example/orders".into(),
        subject: "order 42 ✓".into(),
        data_schema: "https://shop.example/schemas/order.paid.json".into(),
        data_json: br#"{"amount": 12, "currency": "EUR"}"#.to_vec().into(),
        ..Default::default()
    };
    full.extensions.insert("traceid".into(), "abc def %20".into());
    full.extensions.insert("partitionkey".into(), "k1".into());
    produce(&p, &full).await;
    let text = Event {
        id: "evt_ce_text".into(),
        r#type: "order.note".into(),
        occurred_at_ms: 1_767_225_600_000,
        source: "/notes".into(),
        data_content_type: "text/plain; charset=utf-8".into(),
        data_json: br#""h\u00e9llo \"world\"""#.to_vec().into(),
        ..Default::default()
    };
    produce(&p, &text).await;
    let (status, v) = p.call("POST", "/v1/events", Some(json!({"id": "evt_plain", "type": "order.created", "data": {"n": 1}}))).await;
    assert_eq!(status, 202, "{v}");

    // What the SDK parsed from the binary-mode requests.
    let got = r.delivery("ok", "evt_ce_1").await;
    assert_eq!(got["signature"], "verified", "{got}");
    assert_eq!(got["origin"], ORIGIN, "every delivery names the granted origin: {got}");
    assert_eq!(
        got["event"],
        json!({
            "specversion": "1.0",
            "id": "evt_ce_1",
            "type": "order.paid",
            "source": "https://shop.example/orders",
            "time": "2026-01-01T00:00:00.123000+00:00",
            "subject": "order 42 ✓",
            "datacontenttype": "application/json",
            "dataschema": "https://shop.example/schemas/order.paid.json",
            "data": {"amount": 12, "currency": "EUR"},
            "extensions": {"traceid": "abc def %20", "partitionkey": "k1"},
        }),
        "{got}"
    );
    // On the wire: percent-encoded as the HTTP binding says.
    assert_eq!(got["ce_headers"]["ce-subject"], "order%2042%20%E2%9C%93", "{got}");
    assert_eq!(got["ce_headers"]["ce-traceid"], "abc%20def%20%2520", "{got}");
    let note = r.delivery("ok", "evt_ce_text").await;
    assert_eq!(note["signature"], "verified", "{note}");
    assert_eq!(
        (note["event"]["datacontenttype"].as_str(), note["event"]["data"].as_str()),
        (Some("text/plain; charset=utf-8"), Some("héllo \"world\""))
    );
    let plain = r.delivery("ok", "evt_plain").await;
    assert_eq!(plain["signature"], "verified", "{plain}");
    assert_eq!(plain["event"]["source"], "/hookline", "the default source of an event that was not a CloudEvent: {plain}");
    assert_eq!(plain["ce_headers"].get("ce-time"), None, "no time when the producer gave none: {plain}");
    assert_eq!(plain["event"]["subject"], Value::Null);
    assert_eq!(plain["event"]["data"], json!({"n": 1}));

    // And from the structured-mode ones.
    let s = r.delivery("structured", "evt_ce_1").await;
    assert_eq!(s["signature"], "verified", "{s}");
    assert_eq!(s["event"], got["event"], "the same event in either mode: {s}");
    assert_eq!(s["origin"], Value::Null, "no handshake, no origin");
    let s_plain = r.delivery("structured", "evt_plain").await;
    assert_eq!(s_plain["event"]["source"], "https://hooks.example.com/", "the policy's source, without a tenant: {s_plain}");
    let s_note = r.delivery("structured", "evt_ce_text").await;
    assert_eq!(s_note["event"]["data"], "héllo \"world\"", "{s_note}");

    assert!(
        r.matching(|x| x.get("error").is_some()).is_empty(),
        "the SDK parsed every request: {:?}",
        r.matching(|x| x.get("error").is_some())
    );
    drop(r);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_grants_no_origin_stays_unverified_and_gets_nothing() {
    let Some(python) = python() else { return };
    let p = Pipeline::start(2).await;
    let r = Receiver::start(&python).await;
    let toml = quick_policy(&[0.2], |pol| {
        pol.request.format = RequestFormat::CloudeventsBinary;
        pol.verification = handshake();
    });
    let subscribe = |path: &str| json!({"url": r.url(path), "event_types": ["*"], "policy_toml": toml, "secret": SECRET});

    // Handles OPTIONS (2xx) without granting anything: not consent.
    let (silent, _) = p.subscribe(subscribe("silent")).await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{silent}"), None).await;
    assert_eq!((view["state"].as_str(), view["verification"].as_str()), (Some("pending_verification"), Some("pending")), "{view}");
    let error = view["verification_error"].as_str().unwrap_or_default();
    assert!(error.contains("without a WebHook-Allowed-Origin header") && error.contains(ORIGIN), "{view}");
    assert_eq!(view["verification_allowed_rate_per_min"], Value::Null);

    // Grants another origin.
    let (other, _) = p.subscribe(subscribe("other-origin")).await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{other}"), None).await;
    assert_eq!(view["state"], "pending_verification", "{view}");
    let error = view["verification_error"].as_str().unwrap_or_default();
    assert!(error.contains("WebHook-Allowed-Origin: someone-else.example") && error.contains(ORIGIN), "{view}");

    // Asking again gets the same answer.
    let (status, view) = p.call("POST", &format!("/v1/subscriptions/{silent}/verify"), None).await;
    assert_eq!((status, view["verification"].as_str()), (200, Some("pending")), "{view}");
    assert_eq!(r.matching(|x| x["method"] == "OPTIONS" && x["path"] == "/silent").len(), 2);

    // A verified endpoint on the same partitions gets the event; the unverified ones get nothing (held).
    let (_ok, _) = p.subscribe(subscribe("ok")).await;
    p.publish("evt_held", "thing.happened").await;
    r.delivery("ok", "evt_held").await;
    let posts = r.matching(|x| x["method"] == "POST" && x["path"] != "/ok");
    assert!(posts.is_empty(), "an unverified endpoint got a delivery: {posts:?}");
    drop(r);
    p.stop().await;
}

/// The round trip: a CloudEvent POSTed in binary mode to `POST /v1/events` reaches a binary-mode receiver as the same
/// CloudEvent, as the SDK reads it on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloudevent_published_over_http_reaches_the_receiver_as_the_same_cloudevent() {
    use http_body_util::{BodyExt, Full};
    let Some(python) = python() else { return };
    let p = Pipeline::start(2).await;
    let r = Receiver::start(&python).await;
    let toml = quick_policy(&[0.2], |pol| pol.request.format = RequestFormat::CloudeventsBinary);
    p.subscribe(json!({"url": r.url("ok"), "event_types": ["*"], "policy_toml": toml, "secret": SECRET})).await;

    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let req = http::Request::post(format!("http://{}/v1/events", p.api))
        .header("authorization", format!("Bearer {}", crate::support::TOKEN))
        .header("ce-specversion", "1.0")
        .header("ce-id", "ce-round-1")
        .header("ce-source", "/shop/orders")
        .header("ce-type", "com.example.order.paid")
        .header("ce-subject", "order%2042%20%E2%9C%93")
        .header("ce-time", "2026-01-01T00:00:00.123Z")
        .header("ce-region", "eu")
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from_static(br#"{"total": 12}"#)))
        .unwrap();
    let resp = client.request(req).await.expect("the API answers");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));

    let got = r.delivery("ok", "ce-round-1").await;
    assert_eq!(got["signature"], "verified", "{got}");
    let e = &got["event"];
    assert_eq!(
        (e["source"].as_str(), e["type"].as_str(), e["subject"].as_str(), e["time"].as_str()),
        (Some("/shop/orders"), Some("com.example.order.paid"), Some("order 42 ✓"), Some("2026-01-01T00:00:00.123000+00:00")),
        "{got}"
    );
    assert_eq!(e["data"], json!({"total": 12}), "{got}");
    assert_eq!(e["extensions"]["region"], "eu", "{got}");
    drop(r);
    p.stop().await;
}
