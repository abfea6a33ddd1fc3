//! The dead-letter topic for analysts: records of both `dlq.format`s, produced by the real pipeline, carry the
//! `hookline-*` headers; the JSON form is the documented `hookline.dead_letter.v1` document, a redrive reads it
//! back and re-delivers, and a real Kafka client (kcat, with jq) reads it without hookline's code.

use std::collections::BTreeMap;
use std::time::Duration;

use hookline_core::dead_letter::DlqFormat;
use rdkafka::message::Headers;
use rdkafka::Message;
use serde_json::{json, Value};

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

/// One record of the dlq topic as a consumer sees it.
struct Record {
    headers: BTreeMap<String, String>,
    value: Vec<u8>,
}

async fn read_dlq(p: &Pipeline) -> Vec<Record> {
    let mut out = Vec::new();
    hookline_kafka::scan::scan(&p.config.kafka, p.topics().dlq(), None, LIMIT, |m| {
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())).collect())
            .unwrap_or_default();
        out.push(Record { headers, value: m.payload().unwrap_or_default().to_vec() });
    })
    .await
    .expect("the dlq topic reads");
    out
}

/// A subscription of tenant `acme` whose endpoint answers 410 once (Fynapse: terminal, dead) and then 200; one
/// event for it, and one event record that is not JSON. Returns the pipeline, once both dead letters are in.
async fn two_dead_letters(format: DlqFormat) -> (Pipeline, String) {
    let p = Pipeline::start_with(2, |c| c.dlq.format = format).await;
    p.script("f", vec![Some((410, None)), Some((200, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("f"), "event_types": ["*"], "policy": "fynapse", "tenant": "acme"})).await;
    let (status, v) = p
        .call(
            "POST",
            "/v1/events",
            Some(json!({"id": "evt_dl1", "type": "order.paid", "tenant": "acme", "data": {"amount": 12, "note": "caf\u{e9}"}})),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let producer = hookline_kafka::client::producer(&p.config.kafka, "dlq-test").expect("producer");
    hookline_kafka::produce::send(&producer, p.topics().events(), "k", b"{not json").await.expect("produced");
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "two dead letters", || dlq.items.lock().unwrap().len() >= 2).await;
    (p, sub)
}

fn by_reason(records: &[Record], reason: &str) -> usize {
    records
        .iter()
        .position(|r| r.headers.get("hookline-reason").map(String::as_str) == Some(reason))
        .unwrap_or_else(|| panic!("no {reason} record: {:?}", records.iter().map(|r| &r.headers).collect::<Vec<_>>()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_dead_letters_are_documents_with_headers_and_redrive_delivers_them_again() {
    let (p, sub) = two_dead_letters(DlqFormat::Json).await;
    let records = read_dlq(&p).await;
    assert_eq!(records.len(), 2);

    let delivery = &records[by_reason(&records, "terminal_outcome")];
    let h = &delivery.headers;
    assert_eq!(h["hookline-subscription"], sub);
    assert_eq!(h["hookline-event-type"], "order.paid");
    assert_eq!(h["hookline-tenant"], "acme");
    assert_eq!(h["hookline-format"], "json");
    let doc: Value = serde_json::from_slice(&delivery.value).expect("the value is a JSON document");
    assert_eq!(doc["schema"], "hookline.dead_letter.v1");
    assert_eq!(doc["reason"], "terminal_outcome");
    assert_eq!(doc["final_state"], "dead");
    assert_eq!(doc["status_word"], "DEAD_LETTER");
    assert_eq!(doc["subscription_id"], sub.as_str());
    assert_eq!(doc["tenant"], "acme");
    assert_eq!(doc["event"]["id"], "evt_dl1");
    assert_eq!(doc["event"]["type"], "order.paid");
    assert_eq!(doc["event"]["payload_encoding"], "json");
    assert_eq!(doc["event"]["payload"], json!({"amount": 12, "note": "caf\u{e9}"}));
    assert_eq!(doc["attempts"], 1);
    assert_eq!(doc["last_attempt"], json!({"outcome": "410", "http_status": 410, "response_excerpt": "scripted"}));
    for t in [&doc["dead_lettered_at"], &doc["first_attempt_at"], &doc["event"]["accepted_at"]] {
        let t = t.as_str().unwrap_or_else(|| panic!("a time: {doc}"));
        assert!(hookline_core::time::parse_rfc3339_ms(t).is_some_and(|ms| ms > 1_700_000_000_000), "{t}");
    }

    let input = &records[by_reason(&records, "invalid_json")];
    assert_eq!((input.headers["hookline-subscription"].as_str(), input.headers["hookline-event-type"].as_str()), ("", ""));
    assert!(!input.headers.contains_key("hookline-tenant"));
    let doc: Value = serde_json::from_slice(&input.value).unwrap();
    assert_eq!((doc["event"].clone(), doc["raw_base64"].clone()), (Value::Null, json!("e25vdCBqc29u")), "{doc}");
    assert_eq!(doc["source"]["topic"], p.topics().events());

    // The redrive reads the JSON record and sends the same event again.
    let (status, v) = p.call("POST", "/v1/dlq/redrive", Some(json!({"subscription_id": sub, "reason": "terminal_outcome"}))).await;
    assert_eq!((status, v["redriven"].as_u64()), (202, Some(1)), "{v}");
    p.wait_finals(2, LIMIT).await;
    let got = p.requests_to("f");
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body, got[0].body, "the redriven body is byte for byte the first one");
    assert!(p.finals().iter().any(|a| a.final_state == "succeeded" && a.subscription_id == sub));

    kcat_and_jq_read_the_reason(&p, &sub).await;
    p.stop().await;
}

/// Debian's kcat (librdkafka's own CLI) reads the topic from the broker, and jq picks the reason.
async fn kcat_and_jq_read_the_reason(p: &Pipeline, sub: &str) {
    let bootstrap = p.config.kafka.bootstrap_servers.clone();
    let dlq = p.topics().dlq().to_owned();
    let sub = sub.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        let script = format!(
            "set -o pipefail; kcat -C -b '{bootstrap}' -t '{dlq}' -o beginning -e -q -f '%h\\t%s\\n' \
             | grep 'hookline-subscription={sub}' | cut -f2- | jq -r '.reason'"
        );
        std::process::Command::new("bash").args(["-c", &script]).output()
    })
    .await
    .unwrap()
    .expect("bash runs");
    assert!(
        out.status.success(),
        "kcat | jq failed (scripts/test installs Debian's kcat and jq): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "terminal_outcome", "stderr: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_dead_letters_carry_the_same_headers() {
    let (p, sub) = two_dead_letters(DlqFormat::Protobuf).await;
    let records = read_dlq(&p).await;
    let delivery = &records[by_reason(&records, "terminal_outcome")];
    let h = &delivery.headers;
    assert_eq!((h["hookline-subscription"].as_str(), h["hookline-event-type"].as_str()), (sub.as_str(), "order.paid"));
    assert_eq!((h["hookline-tenant"].as_str(), h["hookline-format"].as_str()), ("acme", "protobuf"));
    let dl = <hookline_core::model::DeadLetter as prost::Message>::decode(delivery.value.as_slice()).expect("a DeadLetter protobuf");
    assert_eq!((dl.last_http_status, dl.last_response_excerpt.as_str(), dl.attempts), (410, "scripted", 1));
    let input = &records[by_reason(&records, "invalid_json")];
    assert_eq!(input.headers["hookline-format"], "protobuf");
    // A redrive of a protobuf dead letter still works.
    let (status, v) = p.call("POST", "/v1/dlq/redrive", Some(json!({"subscription_id": sub}))).await;
    assert_eq!((status, v["redriven"].as_u64()), (202, Some(1)), "{v}");
    p.wait_finals(2, LIMIT).await;
    assert_eq!(p.requests_to("f").len(), 2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_unreadable_event_still_gets_a_json_dead_letter_that_fits_a_record() {
    let p = Pipeline::start_with(1, |c| c.dlq.format = DlqFormat::Json).await;
    // Not JSON, just under the event limit: its base64 in a JSON document would not fit a Kafka record whole.
    let big = vec![b'{'; 900_000];
    let producer = hookline_kafka::client::producer(&p.config.kafka, "dlq-test").expect("producer");
    hookline_kafka::produce::send(&producer, p.topics().events(), "k", &big).await.expect("produced");
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "the dead letter", || !dlq.items.lock().unwrap().is_empty()).await;
    let records = read_dlq(&p).await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.headers["hookline-format"], "json");
    assert!(r.value.len() <= p.config.kafka.message_max_bytes, "{}", r.value.len());
    let doc: Value = serde_json::from_slice(&r.value).unwrap();
    assert_eq!(doc["reason"], "invalid_json");
    assert!(doc["detail"].as_str().unwrap().contains("of 900000 bytes in the JSON dead letter"), "{}", doc["detail"]);
    assert_eq!(doc["source"]["offset"], 0);
    p.stop().await;
}
