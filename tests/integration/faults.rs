//! Broker faults, injected through librdkafka's mock cluster while a bounded stream flows: 200 events x 2
//! subscriptions. The first half is published, the fault goes in once deliveries are under way, the second half is
//! published during the fault, the fault is lifted after `HOLD`, and then every accepted delivery must reach a
//! final state. Each test prints one JSON line (`--nocapture`) with `accepted`, `final_states`, `missing`,
//! `duplicates` (receiver requests beyond the first per (event id, path)) and `fault`.
//!
//! The fault window is the one timed thing here (a fault schedule is a duration); everything else waits on signals.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use serde_json::{json, Value};

use crate::support::{Pipeline, TOKEN};

const EVENTS: usize = 200;
const PATHS: [&str; 2] = ["fault-a", "fault-b"];
/// How long each fault stays in (unless its test says otherwise).
const HOLD: Duration = Duration::from_secs(2);
/// Deliveries the receiver has seen before the fault goes in.
const INJECT_AFTER: usize = 60;
/// Far more injected request errors than the clients can send in `HOLD`: the fault lasts until it is cleared.
const MANY: usize = 100_000;

/// One fault test at a time: each starts a broker and three services, and on two cores their timings (and the
/// duplicates they report) would otherwise depend on each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Cluster<'a> = MockCluster<'a, DefaultProducerContext>;

/// Publishes events concurrently (8 at a time) with its own client; returns the ids the API accepted (202).
async fn publish(api: std::net::SocketAddr, ids: Vec<String>) -> Vec<String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut set = tokio::task::JoinSet::new();
    for chunk in ids.chunks(ids.len().div_ceil(8)) {
        let (client, chunk) = (client.clone(), chunk.to_vec());
        set.spawn(async move {
            let mut accepted = Vec::new();
            for id in chunk {
                let body = json!({"id": id, "type": "order.created", "data": {"n": 1}}).to_string();
                let req = http::Request::post(format!("http://{api}/v1/events"))
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let resp = client.request(req).await.expect("the API answers");
                let status = resp.status().as_u16();
                let v: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap_or_default();
                match status {
                    202 => accepted.push(id),
                    // Not accepted: the producer gave up. Not counted (and reported).
                    503 => eprintln!("publish {id}: 503 {v}"),
                    other => panic!("publish {id}: {other} {v}"),
                }
            }
            accepted
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("publisher"));
    }
    all
}

struct Tally {
    final_states: usize,
    missing: usize,
    duplicates: usize,
    duplicate_finals: usize,
    not_succeeded: usize,
}

fn tally(p: &Pipeline, expected: &HashSet<(String, String)>, path_of: &HashMap<String, String>) -> Tally {
    let mut finals: HashMap<(String, String), usize> = HashMap::new();
    let mut not_succeeded = 0;
    for a in p.attempts.items.lock().unwrap().iter().filter(|a| !a.final_state.is_empty()) {
        let Some(path) = path_of.get(&a.subscription_id) else { continue };
        let key = (a.event_id.clone(), path.clone());
        if expected.contains(&key) {
            *finals.entry(key).or_insert(0) += 1;
            if a.final_state != "succeeded" {
                not_succeeded += 1;
            }
        }
    }
    let mut received: HashMap<(String, String), usize> = HashMap::new();
    for r in p.seen.requests.lock().unwrap().iter() {
        let id = r.headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        *received.entry((id, r.path.clone())).or_insert(0) += 1;
    }
    Tally {
        final_states: finals.values().sum(),
        missing: expected.iter().filter(|k| !finals.contains_key(*k)).count(),
        duplicates: received.iter().filter(|(k, _)| expected.contains(*k)).map(|(_, n)| n - 1).sum(),
        duplicate_finals: finals.values().map(|n| n - 1).sum(),
        not_succeeded,
    }
}

/// Waits (on the attempts collector) until no accepted delivery lacks a final state, or the deadline.
async fn wait_complete(p: &Pipeline, expected: &HashSet<(String, String)>, path_of: &HashMap<String, String>, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let changed = p.attempts.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if tally(p, expected, path_of).missing == 0 {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
            return;
        }
    }
}

/// Runs the stream with `inject` applied mid-stream and `lift` applied `HOLD` later; prints and checks the tally.
async fn under_fault(fault: &str, inject: impl FnOnce(&Cluster<'_>), lift: impl FnOnce(&Cluster<'_>)) {
    under_fault_with(fault, Shape { edit: |_| {}, hold: HOLD, inject_after: INJECT_AFTER, all_accepted: true }, inject, lift).await
}

/// How a fault test differs from the default.
struct Shape {
    edit: fn(&mut hookline_service::Config),
    /// How long the fault stays in.
    hold: Duration,
    /// Deliveries the receiver has seen before it goes in.
    inject_after: usize,
    /// Whether the API must accept every event (its producer outlasts the fault) or may refuse some with 503.
    all_accepted: bool,
}

/// [`under_fault`] with the pipeline's config edited, and the fault's timing and expectations of `shape`.
async fn under_fault_with(fault: &str, shape: Shape, inject: impl FnOnce(&Cluster<'_>), lift: impl FnOnce(&Cluster<'_>)) {
    let Shape { edit, hold, inject_after, all_accepted } = shape;
    if crate::support::on_the_mock_only() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let p = Pipeline::start_with(4, edit).await;
    let mut path_of = HashMap::new();
    for path in PATHS {
        let (id, _) = p.subscribe(json!({"url": p.url(path), "event_types": ["*"]})).await;
        path_of.insert(id, path.to_owned());
    }
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("evt_{fault}_{i:04}")).collect();
    let (first, second) = ids.split_at(EVENTS / 2);
    let mut accepted = publish(p.api, first.to_vec()).await;

    let seen = p.seen.clone();
    crate::support::wait_for(&p.seen.changed, Duration::from_secs(30), "deliveries under way", || {
        seen.requests.lock().unwrap().len() >= inject_after
    })
    .await;
    let received_at_inject = p.seen.requests.lock().unwrap().len();
    inject(&p.broker().cluster());
    let injected_at = Instant::now();
    // The second half is published while the fault is in (it may block until the fault is lifted).
    let publisher = tokio::spawn(publish(p.api, second.to_vec()));
    tokio::time::sleep(hold).await;
    lift(&p.broker().cluster());
    let lifted_at = Instant::now();
    let received_at_lift = p.seen.requests.lock().unwrap().len();
    accepted.extend(publisher.await.expect("publisher"));

    let expected: HashSet<(String, String)> =
        accepted.iter().flat_map(|e| PATHS.iter().map(move |p| (e.clone(), (*p).to_owned()))).collect();
    wait_complete(&p, &expected, &path_of, Duration::from_secs(90)).await;
    let t = tally(&p, &expected, &path_of);
    let line = json!({
        "test": "broker_fault",
        "fault": fault,
        "accepted": expected.len(),
        "events_accepted": accepted.len(),
        "final_states": t.final_states,
        "missing": t.missing,
        "duplicates": t.duplicates,
        "duplicate_finals": t.duplicate_finals,
        "not_succeeded": t.not_succeeded,
        "received_at_inject": received_at_inject,
        "received_during_fault": received_at_lift - received_at_inject,
        "seconds_fault": ((lifted_at - injected_at).as_secs_f64() * 10.0).round() / 10.0,
        "seconds_lift_to_complete": (lifted_at.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "seconds_total": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    });
    println!("{line}");
    if all_accepted {
        assert_eq!(accepted.len(), EVENTS, "every event was accepted (the producers retry through the fault): {line}");
    }
    assert!(accepted.len() >= EVENTS / 2, "the first half was accepted before the fault: {line}");
    assert_eq!(t.missing, 0, "accepted deliveries without a final state: {line}");
    assert_eq!(t.not_succeeded, 0, "every delivery to a 204 receiver succeeds: {line}");
    // At least once: a redelivery is allowed, a second final state for one delivery is reported, not asserted.
    assert!(t.duplicates <= expected.len(), "{line}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_errors_mid_stream_lose_nothing() {
    under_fault(
        "produce_not_leader",
        |c| c.request_errors(RDKafkaApiKey::Produce, &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; MANY]),
        |c| c.clear_request_errors(RDKafkaApiKey::Produce),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_errors_mid_stream_lose_nothing() {
    under_fault(
        "fetch_not_leader",
        |c| c.request_errors(RDKafkaApiKey::Fetch, &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; MANY]),
        |c| c.clear_request_errors(RDKafkaApiKey::Fetch),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_commit_errors_mid_stream_lose_nothing() {
    under_fault(
        "offset_commit_not_coordinator",
        |c| c.request_errors(RDKafkaApiKey::OffsetCommit, &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR; MANY]),
        |c| c.clear_request_errors(RDKafkaApiKey::OffsetCommit),
    )
    .await;
}

/// The only broker goes down for `HOLD` and comes back. Clients reconnect with librdkafka's exponential backoff
/// (`reconnect.backoff.ms` 100 ms doubling to `reconnect.backoff.max.ms` 10 s, with jitter), so recovery can lag
/// the broker's return by a few seconds; a longer outage lags more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_down_and_up_mid_stream_loses_nothing() {
    under_fault("broker_down_2s", |c| c.broker_down(1).expect("broker down"), |c| c.broker_up(1).expect("broker up")).await;
}

/// The only broker down for several times `kafka.delivery_timeout_ms`: librdkafka gives up on what was in flight,
/// among it the records that conclude the dispatcher's attempts, whose acknowledgements are handled in the
/// producer's callbacks (no task waits for them). Each is written again until acknowledged, and only then is its
/// delivery's offset completed. (The fan-out's tasks take the same path: `fanout::tests`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_down_past_the_delivery_timeout_loses_nothing() {
    if crate::support::on_the_mock_only() {
        return;
    }
    let before = produce_errors("attempts");
    under_fault_with(
        "broker_down_past_delivery_timeout",
        // In as soon as deliveries start, with the first half's attempts in flight. The API's own writes give up
        // after the timeout too, so it refuses (503) some of the second half: not counted.
        Shape { edit: |c| c.kafka.delivery_timeout_ms = 1_000, hold: Duration::from_secs(4), inject_after: 1, all_accepted: false },
        |c| c.broker_down(1).expect("broker down"),
        |c| c.broker_up(1).expect("broker up"),
    )
    .await;
    // The deliveries answered during the outage: their last records were given up on and written again.
    assert!(produce_errors("attempts") > before, "no attempt record was given up on: the fault missed what it tests");
}

/// `hookline_kafka_produce_errors_total{topic}` in this process's metrics (every service of the test pipeline
/// records into the one registry).
fn produce_errors(topic: &str) -> f64 {
    let text = hookline_service::telemetry::metrics_handle().render();
    let series = format!("hookline_kafka_produce_errors_total{{topic=\"{topic}\"}}");
    text.lines().filter_map(|l| l.strip_prefix(series.as_str())).filter_map(|v| v.trim().parse::<f64>().ok()).sum()
}
