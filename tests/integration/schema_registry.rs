//! Events framed by Confluent's own Schema Registry serializers (confluent-kafka's AvroSerializer, JSONSerializer
//! and ProtobufSerializer, run by `schema_registry_serialize.py`), registered in the Confluent-compatible registry of
//! `scripts/schema-registry`, written to the events topic of the embedded broker: the receiver gets the decoded
//! JSON, the event view shows the schema id, dead letters name the id, and a registry that stops answering holds
//! the partition, in order, until it answers again.
//!
//! Needs Python with scripts/python-test-requirements.txt (`HOOKLINE_TEST_PYTHON`, which scripts/test sets);
//! skipped without it, saying so, unless `HOOKLINE_TEST_REQUIRE_PYTHON=1`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hookline_core::model::delivery_id;
use serde_json::{json, Value};

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

fn python() -> Option<String> {
    match std::env::var("HOOKLINE_TEST_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ if std::env::var("HOOKLINE_TEST_REQUIRE_PYTHON").as_deref() == Ok("1") => {
            panic!("HOOKLINE_TEST_REQUIRE_PYTHON=1 but HOOKLINE_TEST_PYTHON is unset (scripts/python-test-deps prints it)")
        }
        _ => {
            eprintln!("skipped: HOOKLINE_TEST_PYTHON is unset (scripts/python-test-deps installs Confluent's serializers)");
            None
        }
    }
}

fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `scripts/schema-registry serve` as a child, killed on drop.
struct Registry {
    child: Child,
    url: String,
}

impl Registry {
    fn start(python: &str) -> Self {
        let mut child = Command::new(repo().join("scripts/schema-registry"))
            .arg("serve")
            .env("PYTHON", python)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("scripts/schema-registry serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("its JSON line");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        Self { url: v["url"].as_str().expect("url").to_owned(), child }
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) the process: stopped, it accepts connections and never answers.
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().expect("kill runs").success();
        assert!(ok, "kill {sig}");
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each `(format, event)` framed by Confluent's serializer of that format, for the events topic.
fn serialize(python: &str, registry: &str, events: &[(&str, Value)]) -> Vec<Vec<u8>> {
    let mut child = Command::new(python)
        .arg(repo().join("tests/integration/interop/schema_registry_serialize.py"))
        .args([registry, "hookline.events"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python runs");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for (format, event) in events {
            writeln!(stdin, "{}", json!({"format": format, "event": event})).expect("written");
        }
    }
    let out = child.wait_with_output().expect("serializer ends");
    assert!(out.status.success(), "the serializer failed");
    out.stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| hex::decode(serde_json::from_slice::<Value>(l).expect("a JSON line")["hex"].as_str().expect("hex")).expect("hex"))
        .collect()
}

fn schema_id(framed: &[u8]) -> u32 {
    assert_eq!(framed[0], 0, "Confluent's magic byte");
    u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]])
}

async fn produce(p: &Pipeline, values: &[&[u8]]) {
    let producer = hookline_kafka::client::producer(&p.config.kafka, "schema-registry-test").expect("producer");
    for v in values {
        // One key: one partition, in this order.
        hookline_kafka::produce::send(&producer, p.topics().events(), "order-1", v).await.expect("produced");
    }
}

fn bodies(p: &Pipeline, path: &str) -> Vec<Value> {
    p.requests_to(path).iter().map(|r| serde_json::from_slice(&r.body).expect("a JSON body")).collect()
}

async fn wait_requests(p: &Pipeline, path: &str, n: usize) {
    let seen = p.seen.clone();
    let path = path.to_owned();
    wait_for(&p.seen.changed, LIMIT, &format!("{n} requests to {path}"), || {
        seen.requests.lock().unwrap().iter().filter(|r| r.path == path).count() >= n
    })
    .await;
}

fn order(id: &str, total: i64) -> Value {
    json!({"id": id, "type": "order.paid", "occurred_at": 1_767_225_600_000i64, "data": {"total": total, "note": format!("n{total}")}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_json_schema_and_protobuf_events_are_delivered_as_json_with_their_schema_id_visible() {
    let Some(py) = python() else { return };
    let registry = Registry::start(&py);
    let values = serialize(
        &py,
        &registry.url,
        &[("avro", order("e_avro", 42)), ("json", order("e_json", 7)), ("protobuf", order("e_proto", 9)), ("avro", order("e_ce_data", 3))],
    );
    let ids: Vec<u32> = values.iter().map(|v| schema_id(v)).collect();
    let url = registry.url.clone();
    let p = Pipeline::start_with(1, |c| c.ingest.schema_registry.url = Some(url)).await;
    let (sub, _) = p.subscribe(json!({"url": p.url("r"), "event_types": ["order.paid"], "ordering": "strict"})).await;
    // An id the registry never gave, with an Avro-looking payload.
    let unknown = [&[0u8, 0, 0, 0x03, 0xe7][..], b"\x02x"].concat();
    produce(&p, &[&values[0], &values[1], &unknown, &values[2]]).await;
    // CloudEvents binary mode: the framed value is the event's data, its context in `ce_*` headers.
    let producer = hookline_kafka::client::producer(&p.config.kafka, "schema-registry-ce").expect("producer");
    let headers = rdkafka::message::OwnedHeaders::new()
        .insert(rdkafka::message::Header { key: "ce_specversion", value: Some("1.0") })
        .insert(rdkafka::message::Header { key: "ce_id", value: Some("e_ce") })
        .insert(rdkafka::message::Header { key: "ce_source", value: Some("/shop") })
        .insert(rdkafka::message::Header { key: "ce_type", value: Some("order.paid") })
        .insert(rdkafka::message::Header { key: "content-type", value: Some("application/avro") });
    hookline_kafka::produce::send_with_headers(&producer, p.topics().events(), "order-1", &values[3], Some(headers))
        .await
        .expect("produced");
    wait_requests(&p, "r", 4).await;
    let got = bodies(&p, "r");
    assert_eq!(got.iter().map(|b| b["id"].as_str().unwrap()).collect::<Vec<_>>(), ["e_avro", "e_json", "e_proto", "e_ce"], "in order");
    assert_eq!(got[3]["data"], order("e_ce_data", 3), "the decoded Avro is the CloudEvent's data: {}", got[3]);
    assert_eq!(got[0]["data"], json!({"total": 42, "note": "n42"}), "Avro decoded to JSON: {}", got[0]);
    assert_eq!(got[1]["data"], json!({"total": 7, "note": "n7"}), "JSON Schema delivered as it was: {}", got[1]);
    assert_eq!(got[2]["data"], json!({"total": 9, "note": "n9"}), "Protobuf decoded to JSON: {}", got[2]);
    assert_eq!(got[0]["type"], "order.paid");

    // The event view of the delivery log names the schema each event was framed with.
    for (event, id) in [("e_avro", ids[0]), ("e_json", ids[1]), ("e_proto", ids[2])] {
        let d = p.get_when(&format!("/v1/deliveries/{}", delivery_id(event, &sub)), |v| v["event"].is_object()).await;
        assert_eq!(d["event"]["registry_schema_id"], json!(id), "{event}: {d}");
    }

    // The id the registry does not have: a dead letter that names it.
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "the unknown id's dead letter", || !dlq.items.lock().unwrap().is_empty()).await;
    let dl = p.dlq.items.lock().unwrap()[0].clone();
    assert_eq!(dl.reason, "schema_not_found");
    assert!(dl.detail.contains("schema id 999") && dl.detail.contains(&registry.url), "{}", dl.detail);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_registry_avro_and_protobuf_are_dead_lettered_naming_the_schema_id_and_json_schema_is_delivered() {
    let Some(py) = python() else { return };
    let registry = Registry::start(&py);
    let values =
        serialize(&py, &registry.url, &[("avro", order("e_avro", 1)), ("json", order("e_json", 2)), ("protobuf", order("e_proto", 3))]);
    let p = Pipeline::start(1).await;
    p.subscribe(json!({"url": p.url("r"), "event_types": ["order.paid"]})).await;
    produce(&p, &[&values[0], &values[1], &values[2]]).await;
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "two dead letters", || dlq.items.lock().unwrap().len() >= 2).await;
    let dead = p.dlq.items.lock().unwrap().clone();
    for value in [&values[0], &values[2]] {
        // Dead letters are written concurrently: found by their record.
        let dl = dead.iter().find(|d| d.raw[..] == value[..]).expect("a dead letter of the record, kept whole");
        assert_eq!(dl.reason, "schema_registry_required");
        let id = schema_id(value);
        assert!(dl.detail.starts_with(&format!("schema id {id}: ")), "{}", dl.detail);
        assert!(dl.detail.contains("ingest.schema_registry.url"), "{}", dl.detail);
    }
    wait_requests(&p, "r", 1).await;
    assert_eq!(bodies(&p, "r")[0]["data"], json!({"total": 2, "note": "n2"}));
    p.stop().await;
}

/// `hookline_schema_registry_requests_total{outcome="error"}` as rendered now.
fn registry_errors() -> f64 {
    hookline_service::telemetry::metrics_handle()
        .render()
        .lines()
        .filter(|l| l.starts_with("hookline_schema_registry_requests_total") && l.contains("outcome=\"error\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_stops_answering_holds_the_partition_in_order_and_it_resumes_when_it_answers() {
    let Some(py) = python() else { return };
    let registry = Registry::start(&py);
    let values = serialize(&py, &registry.url, &[("avro", order("e_avro", 5))]);
    let url = registry.url.clone();
    let p = Pipeline::start_with(1, |c| {
        c.ingest.schema_registry.url = Some(url);
        c.ingest.schema_registry.request_timeout_ms = 200;
        c.ingest.schema_registry.retry_max_ms = 400;
    })
    .await;
    p.subscribe(json!({"url": p.url("r"), "event_types": ["order.paid"], "ordering": "strict"})).await;
    let plain = |id: &str| json!({"id": id, "type": "order.paid", "entity_id": "order-1", "data": {"n": id}}).to_string().into_bytes();
    produce(&p, &[&plain("before")]).await;
    wait_requests(&p, "r", 1).await;

    registry.signal("-STOP");
    let errors_before = registry_errors();
    produce(&p, &[&values[0], &plain("after")]).await;
    // The fetch of the Avro event's schema times out, twice: meanwhile nothing behind it is sent.
    let deadline = Instant::now() + LIMIT;
    while registry_errors() < errors_before + 2.0 {
        assert!(Instant::now() < deadline, "no failed registry request counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held: Vec<Value> = bodies(&p, "r");
    assert_eq!(held.len(), 1, "the event behind the held one waits too: {held:?}");
    assert!(p.dlq.items.lock().unwrap().is_empty(), "an outage is no verdict: nothing dead-lettered");

    registry.signal("-CONT");
    wait_requests(&p, "r", 3).await;
    let got = bodies(&p, "r");
    assert_eq!(got.iter().map(|b| b["id"].as_str().unwrap()).collect::<Vec<_>>(), ["before", "e_avro", "after"], "in order");
    assert_eq!(got[1]["data"], json!({"total": 5, "note": "n5"}));
    p.stop().await;
}
