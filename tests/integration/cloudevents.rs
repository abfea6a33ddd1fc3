//! CloudEvents in, with the official CloudEvents SDK (Python) on the producing side: binary and structured mode
//! on the events topic (through Confluent's Kafka client) and on `POST /v1/events` (the HTTP binding). What a
//! receiver gets, what a filter and the delivery log see, what is ignored and what is dead-lettered.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{python, run_python, wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

/// The subscription every case uses: acme's order events from region `eu` (a CloudEvents extension).
async fn subscribe(p: &Pipeline) -> String {
    p.tenant("acme").await;
    let (id, _) = p
        .subscribe(json!({
            "url": p.url("ce"),
            "tenant": "acme",
            "event_types": ["com.example.order.*"],
            "filter": {"all": [{"path": "extensions.region", "eq": "eu"}, {"path": "source", "prefix": "/shop/"}]}
        }))
        .await;
    id
}

/// The bodies the receiver got, by event id.
fn delivered(p: &Pipeline) -> Vec<Value> {
    p.requests_to("ce").iter().map(|r| serde_json::from_slice(&r.body).expect("a JSON body")).collect()
}

fn assert_delivered_as_the_sdk_sent_them(p: &Pipeline) {
    // Deliveries of an unordered subscription may arrive in any order.
    let mut got = delivered(p);
    got.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    let ids: Vec<&str> = got.iter().filter_map(|b| b["id"].as_str()).collect();
    // ce-3 is another region, ce-4 has no data, ce-5 is CloudEvents 0.3.
    assert_eq!(ids, ["ce-1", "ce-2", "ce-6", "ce-9"], "{got:?}");
    let first = &got[0];
    assert_eq!(first["type"], "com.example.order.created");
    assert_eq!(first["data"], json!({"total": 12, "currency": "EUR"}));
    assert_eq!(first["occurred_at"], "2026-01-02T03:04:05.678Z");
    assert_eq!(first["tenant"], "acme");
    // The partition key is the entity.
    assert_eq!(first["entity_id"], "cust-7");
    assert_eq!(got[1]["data"], json!({"total": 5}), "structured mode");
    assert_eq!(got[2]["data"], json!("plain words"), "text data is a JSON string");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_from_the_sdk_on_kafka_are_delivered_filtered_ignored_or_dead_lettered() {
    let Some(py) = python() else { return };
    let p = Pipeline::start(2).await;
    let sub = subscribe(&p).await;
    let ignored_before = p.counter("hookline_events_ignored_total{reason=\"cloudevent_without_data\"}").await;
    let bootstrap = p.config.kafka.bootstrap_servers.clone();
    let topic = hookline_kafka::Topics::new(p.config.kafka.topic_prefix.clone()).events().to_owned();
    let out = run_python(&py, "cloudevents_producer.py", &["kafka", &bootstrap, &topic]).await;
    assert_eq!(out.lines().count(), 7, "{out}");

    // ce-9 was produced last, to the same partition: once it is delivered, every earlier record was read.
    p.wait_final_of(&sub, 4, LIMIT).await;
    assert_delivered_as_the_sdk_sent_them(&p);
    assert!(
        p.counter("hookline_events_ignored_total{reason=\"cloudevent_without_data\"}").await > ignored_before,
        "the CloudEvent without data is counted"
    );
    // The 0.3 event is dead-lettered with a reason naming the attribute, and its headers kept.
    let dlq = p.dlq.clone();
    wait_for(&dlq.changed, LIMIT, "the 0.3 event's dead letter", || !dlq.items.lock().unwrap().is_empty()).await;
    let dl = dlq.items.lock().unwrap()[0].clone();
    assert_eq!(dl.reason, "invalid_field");
    assert!(dl.detail.contains("specversion") && dl.detail.contains("0.3"), "{}", dl.detail);
    let headers: Vec<(&str, &[u8])> = dl.raw_headers.iter().map(|h| (h.key.as_str(), &h.value[..])).collect();
    assert!(headers.contains(&("ce_specversion", b"0.3".as_slice())) && headers.contains(&("ce_id", b"ce-5".as_slice())), "{headers:?}");

    // The delivery log keeps the CloudEvents context.
    let found = p.get_when("/v1/deliveries?event_id=ce-1", |v| v["items"].as_array().is_some_and(|i| i.len() == 1)).await;
    let delivery = found["items"][0]["delivery_id"].as_str().expect("the delivery's id").to_owned();
    let v = p.get_when(&format!("/v1/deliveries/{delivery}"), |v| !v["event"].is_null()).await;
    let event = &v["event"];
    assert_eq!(event["source"], "/shop/orders", "{v}");
    assert_eq!(event["subject"], "order/ce-1", "{v}");
    assert_eq!(event["extensions"], json!({"region": "eu", "partitionkey": "cust-7"}), "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_from_the_sdk_over_http_are_accepted_in_both_modes() {
    let Some(py) = python() else { return };
    let p = Pipeline::start(2).await;
    let sub = subscribe(&p).await;
    let out = run_python(&py, "cloudevents_producer.py", &["http", &format!("http://{}/v1/events", p.api), crate::support::TOKEN]).await;
    let answers: Vec<(&str, u16, Value)> = out
        .lines()
        .map(|l| {
            let mut parts = l.splitn(5, ' ');
            let (_, id, _, status, body) =
                (parts.next(), parts.next().unwrap(), parts.next(), parts.next().unwrap(), parts.next().unwrap_or(""));
            (id, status.parse().unwrap(), serde_json::from_str(body).unwrap_or(Value::Null))
        })
        .collect();
    for (id, status, body) in &answers {
        match *id {
            // No data: nothing to deliver, and the caller is told.
            "ce-4" => assert_eq!((*status, body["error"]["code"].as_str()), (422, Some("empty")), "{body}"),
            "ce-5" => {
                assert_eq!((*status, body["error"]["field"].as_str()), (422, Some("specversion")), "{body}");
            }
            _ => assert_eq!((*status, body["id"].as_str()), (202, Some(*id)), "{body}"),
        }
    }
    p.wait_final_of(&sub, 4, LIMIT).await;
    assert_delivered_as_the_sdk_sent_them(&p);
    p.stop().await;
}
