//! The pipeline end to end: fan-out with filters, signatures, retries that are never early, Retry-After,
//! terminal outcomes to the dead-letter topic, malformed events, and a hanging endpoint that does not stall
//! another on the same partition.

use std::time::Duration;

use hookline_core::policy::{self, Policy};
use hookline_kafka::Topics;
use rdkafka::producer::FutureRecord;
use serde_json::json;

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

/// The standard profile with a scaled-down explicit schedule.
pub(crate) fn quick_policy(waits_s: &[f64], edit: impl FnOnce(&mut Policy)) -> String {
    let mut p = policy::builtin("standard").unwrap();
    p.name = "test-quick".into();
    p.schedule.waits_s = Some(waits_s.to_vec());
    p.schedule.exponential = None;
    p.schedule.max_attempts = Some(waits_s.len() as u32 + 1);
    p.schedule.jitter = None;
    p.schedule.max_window_s = None;
    edit(&mut p);
    let text = toml::to_string(&p).unwrap();
    policy::parse(&text).expect("the test policy is valid");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fans_out_by_filter_and_signs_every_request() {
    let p = Pipeline::start(2).await;
    let stamps = fans_out_by_filter_and_signs_every_request_on(&p).await;
    assert_latency_stamps(&p, &stamps).await;
    p.stop().await;
}

/// The latency split's stamps (`bench latency`), checked on the mock broker only: they do not depend on the broker.
async fn assert_latency_stamps(p: &Pipeline, finals: &[hookline_core::model::AttemptRecord]) {
    // The dispatcher received each task, then the try started (the same instant as `started_at_ms`, to the µs) ...
    for a in finals {
        assert!(a.received_at_us > 0 && a.received_at_us <= a.started_at_us, "{a:?}");
        assert_eq!(a.started_at_us.div_euclid(1000), a.started_at_ms, "{a:?}");
    }
    // ... after the fan-out received the event and produced the task, which its record says.
    let mut tasks = Vec::new();
    let topics = Topics::new(p.config.kafka.topic_prefix.clone());
    hookline_kafka::scan::scan(&p.config.kafka, topics.deliveries(), None, LIMIT, |m| {
        use prost::Message as _;
        use rdkafka::Message as _;
        if let Some(Ok(t)) = m.payload().map(hookline_core::model::DeliveryTask::decode) {
            tasks.push(t);
        }
    })
    .await
    .expect("scan deliveries");
    for a in finals {
        let t = tasks.iter().find(|t| t.delivery_id == a.delivery_id).expect("the attempt's task");
        assert!(t.fanout_received_at_us > 0 && t.fanout_received_at_us <= t.fanout_produced_at_us, "{t:?}");
        assert_eq!(t.received_at_us, 0, "the dispatcher's stamp is not on the wire: {t:?}");
        assert!(t.fanout_produced_at_us <= a.received_at_us, "produced before received: {t:?} {a:?}");
    }
}

/// Also run against tansu (tansu.rs).
/// Returns the final attempt records (stopping the pipeline is the caller's).
pub(crate) async fn fans_out_by_filter_and_signs_every_request_on(p: &Pipeline) -> Vec<hookline_core::model::AttemptRecord> {
    let (orders, secret) = p.subscribe(json!({"url": p.url("orders"), "event_types": ["order.*"]})).await;
    let (_invoices, _) = p.subscribe(json!({"url": p.url("invoices"), "event_types": ["invoice.paid"]})).await;
    let (_all, _) = p.subscribe(json!({"url": p.url("all"), "event_types": ["*"]})).await;
    p.publish("evt_o1", "order.created").await;
    p.publish("evt_i1", "invoice.paid").await;
    p.publish("evt_x1", "customer.updated").await;
    // 1 (orders) + 1 (invoices) + 3 (all)
    p.wait_finals(5, LIMIT).await;

    let orders_got = p.requests_to("orders");
    assert_eq!(orders_got.len(), 1);
    assert_eq!(p.requests_to("invoices").len(), 1);
    assert_eq!(p.requests_to("all").len(), 3);
    let r = &orders_got[0];
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["id"], "evt_o1");
    assert_eq!(body["type"], "order.created");
    assert_eq!(body["data"], json!({"n": 1}));
    // The Standard Webhooks signature verifies with the subscription's secret.
    let headers: Vec<(String, String)> = r.headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned())).collect();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    hookline_core::sign::verify_standard(&[secret.as_str()], headers.as_slice(), &r.body, now_ms, 300).expect("signature verifies");
    assert_eq!(r.headers["webhook-id"], "evt_o1");
    let finals = p.finals();
    assert!(finals.iter().all(|a| a.final_state == "succeeded"), "{finals:?}");
    assert!(finals.iter().any(|a| a.subscription_id == orders));
    finals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_follow_the_schedule_and_are_never_early() {
    retries_follow_the_schedule_and_are_never_early_on(Pipeline::start(2).await).await;
}

/// Also run against tansu (tansu.rs).
pub(crate) async fn retries_follow_the_schedule_and_are_never_early_on(p: Pipeline) {
    let toml = quick_policy(&[1.0, 2.0], |p| p.request.attempt_header = Some("x-attempt".into()));
    p.script("flaky", vec![Some((503, None)), Some((503, None)), Some((200, None))]);
    p.subscribe(json!({"url": p.url("flaky"), "event_types": ["*"], "policy_toml": toml})).await;
    p.publish("evt_r1", "thing.happened").await;
    p.wait_finals(1, LIMIT).await;

    let got = p.requests_to("flaky");
    assert_eq!(got.len(), 3, "two failures then a success");
    let attempts: Vec<&str> = got.iter().map(|r| r.headers["x-attempt"].to_str().unwrap()).collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    let gap1 = got[1].at - got[0].at;
    let gap2 = got[2].at - got[1].at;
    assert!(gap1 >= Duration::from_secs(1), "second attempt early: {gap1:?}");
    assert!(gap2 >= Duration::from_secs(2), "third attempt early: {gap2:?}");
    let finals = p.finals();
    assert_eq!(finals[0].final_state, "succeeded");
    assert_eq!(finals[0].attempt, 3);
    assert!(p.dlq.items.lock().unwrap().is_empty());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_on_429_is_honoured() {
    let p = Pipeline::start(2).await;
    // 429 with Retry-After: 2 against a 1 s schedule: the clamp honours the longer wait.
    let toml = quick_policy(&[1.0], |_| {});
    p.script("limited", vec![Some((429, Some("2"))), Some((204, None))]);
    p.subscribe(json!({"url": p.url("limited"), "event_types": ["*"], "policy_toml": toml})).await;
    p.publish("evt_ra", "thing.happened").await;
    p.wait_finals(1, LIMIT).await;
    let got = p.requests_to("limited");
    assert_eq!(got.len(), 2);
    assert!(got[1].at - got[0].at >= Duration::from_secs(2), "Retry-After not honoured: {:?}", got[1].at - got[0].at);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_and_exhausted_deliveries_reach_the_dead_letter_topic() {
    terminal_and_exhausted_deliveries_reach_the_dead_letter_topic_on(Pipeline::start(2).await).await;
}

/// Also run against tansu (tansu.rs).
pub(crate) async fn terminal_and_exhausted_deliveries_reach_the_dead_letter_topic_on(p: Pipeline) {
    p.script("gone", vec![Some((410, None))]);
    p.script("broken", vec![Some((500, None))]);
    let (gone, _) = p.subscribe(json!({"url": p.url("gone"), "event_types": ["*"], "policy": "fynapse"})).await;
    let toml = quick_policy(&[0.5], |_| {});
    let (broken, _) = p.subscribe(json!({"url": p.url("broken"), "event_types": ["*"], "policy_toml": toml})).await;
    p.publish("evt_d1", "thing.happened").await;
    p.wait_finals(2, LIMIT).await;
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "two dead letters", || dlq.items.lock().unwrap().len() >= 2).await;
    let dl = p.dlq.items.lock().unwrap().clone();
    let g = dl.iter().find(|d| d.subscription_id == gone).expect("410 dead-lettered");
    assert_eq!((g.final_state.as_str(), g.status_word.as_str(), g.attempts), ("dead", "DEAD_LETTER", 1));
    assert_eq!(g.reason, "terminal_outcome");
    assert_eq!(g.event.as_ref().unwrap().id, "evt_d1");
    let b = dl.iter().find(|d| d.subscription_id == broken).expect("exhausted dead-lettered");
    assert_eq!((b.final_state.as_str(), b.attempts, b.reason.as_str()), ("failed", 2, "retries_exhausted"));
    assert_eq!(p.requests_to("gone").len(), 1, "a terminal outcome is not retried");
    assert_eq!(p.requests_to("broken").len(), 2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_events_are_dead_lettered_without_stalling_the_partition() {
    malformed_events_are_dead_lettered_without_stalling_the_partition_on(Pipeline::start(1).await).await;
}

/// Also run against tansu (tansu.rs).
pub(crate) async fn malformed_events_are_dead_lettered_without_stalling_the_partition_on(p: Pipeline) {
    p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    let producer = hookline_kafka::client::producer(&p.config.kafka, "test-upstream").unwrap();
    let events = Topics::new(p.config.kafka.topic_prefix.clone()).events().to_owned();
    for bad in [&b"{not json"[..], b"{\"type\":\"no.id\"}", b"\xff\xfe", b"{\"id\":\"a\",\"type\":7}"] {
        producer.send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(bad), Duration::from_secs(5)).await.unwrap();
    }
    let good = br#"{"id":"evt_after","type":"x.y","data":{}}"#;
    producer.send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(&good[..]), Duration::from_secs(5)).await.unwrap();
    p.wait_finals(1, LIMIT).await;
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "four dead letters", || dlq.items.lock().unwrap().len() >= 4).await;
    let mut reasons: Vec<String> = p.dlq.items.lock().unwrap().iter().map(|d| d.reason.clone()).collect();
    reasons.sort();
    assert_eq!(reasons, ["invalid_json", "invalid_json", "invalid_protobuf", "missing_field"]);
    assert!(p.dlq.items.lock().unwrap().iter().all(|d| !d.raw.is_empty() && !d.detail.is_empty()));
    assert_eq!(p.requests_to("ok").len(), 1, "the valid event after the bad ones is delivered");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_endpoint_does_not_delay_another_on_the_same_partition() {
    // One partition: both subscriptions' tasks interleave on it.
    let p = Pipeline::start(1).await;
    let toml = quick_policy(&[30.0], |p| p.attempt.timeout_ms = 20_000);
    p.script("hang", vec![None]);
    p.subscribe(json!({"url": p.url("hang"), "event_types": ["*"], "policy_toml": toml})).await;
    p.subscribe(json!({"url": p.url("fast"), "event_types": ["*"]})).await;
    for i in 0..40 {
        p.publish(&format!("evt_h{i}"), "thing.happened").await;
    }
    let seen = p.seen.clone();
    // Every fast delivery lands while the hanging ones are still waiting for their 20 s timeout.
    wait_for(&p.seen.changed, Duration::from_secs(15), "40 deliveries to the healthy endpoint", || {
        seen.requests.lock().unwrap().iter().filter(|r| r.path == "fast").count() >= 40
    })
    .await;
    let hanging_finished = p.finals().iter().filter(|a| a.outcome == "timeout").count();
    assert_eq!(hanging_finished, 0, "the healthy endpoint did not wait for the hanging one");
    assert!(!p.requests_to("hang").is_empty(), "the hanging endpoint was being called at the same time");
    p.stop().await;
}
