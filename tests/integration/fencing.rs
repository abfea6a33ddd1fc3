//! Endpoint-state writes are fenced: each new owner of a partition writes a fence with the next epoch once it has
//! read what earlier owners wrote, and stamps that epoch on its own states. A former owner that still writes (a
//! zombie: frozen past its session, or finishing late after its partitions moved) stamps an older epoch, and the
//! API and every later owner ignore it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hookline_core::model::{EndpointCondition, EndpointState};
use hookline_kafka::scan::scan;
use hookline_kafka::state::FENCE_KEY;
use hookline_kafka::Topics;
use prost::Message as _;
use rdkafka::Message as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

fn dispatcher(p: &Pipeline, name: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let options = hookline_dispatcher::Options { instance: Some(name.into()), ..Default::default() };
    let run = hookline_dispatcher::run(p.config.clone(), stop.clone(), options);
    (stop, tokio::spawn(async move { run.await.expect("dispatcher runs") }))
}

/// The epochs of every fence record on the endpoint-state topic, in order.
pub(crate) async fn fences(p: &Pipeline) -> Vec<u64> {
    let mut out = Vec::new();
    scan(&p.config.kafka, Topics::new(p.config.kafka.topic_prefix.clone()).endpoint_state(), None, LIMIT, |m| {
        if m.key() == Some(FENCE_KEY.as_bytes()) {
            if let Some(Ok(f)) = m.payload().map(EndpointState::decode) {
                out.push(f.owner_epoch);
            }
        }
    })
    .await
    .expect("scan endpoint-state");
    out
}

fn delivered(p: &Pipeline, event_id: &str) -> bool {
    p.requests_to("ok").iter().any(|r| serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|b| b["id"] == event_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_owners_late_endpoint_state_is_ignored_by_the_api_and_the_next_owner() {
    a_former_owners_late_endpoint_state_is_ignored_by_the_api_and_the_next_owner_on(Pipeline::start_without_dispatcher(1, |_| {}).await)
        .await;
}

/// The body of the test above, on a pipeline of one partition without a dispatcher (also run on Apache Kafka:
/// `apache_kafka.rs`).
pub(crate) async fn a_former_owners_late_endpoint_state_is_ignored_by_the_api_and_the_next_owner_on(p: Pipeline) {
    let (victim, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["order.*"]})).await;
    let (marker, _) = p.subscribe(json!({"url": p.url("marker"), "event_types": ["marker.*"]})).await;

    let (stop, first) = dispatcher(&p, "first-owner");
    p.publish("evt_1", "order.created").await;
    wait_for(&p.seen.changed, LIMIT, "evt_1 delivered", || delivered(&p, "evt_1")).await;
    stop.cancel();
    first.await.unwrap();
    let first_epoch = *fences(&p).await.last().expect("the first owner fenced the partition");

    let (stop, second) = dispatcher(&p, "second-owner");
    p.publish("evt_2", "order.created").await;
    wait_for(&p.seen.changed, LIMIT, "evt_2 delivered", || delivered(&p, "evt_2")).await;
    let second_epoch = *fences(&p).await.last().unwrap();
    assert_eq!(second_epoch, first_epoch + 1, "each new owner fences with the next epoch");

    // The first owner, as a zombie, writes late: it disables the victim, stamped with its own (old) epoch. Then the
    // current owner writes a state for the marker: once the API shows it, the API has read past the zombie's record.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let topics = Topics::new(p.config.kafka.topic_prefix.clone());
    let producer = hookline_kafka::client::producer(&p.config.kafka, "fencing-test").unwrap();
    let zombie = EndpointState {
        subscription_id: victim.clone(),
        consecutive_failures: 99,
        condition: EndpointCondition::Disabled as i32,
        reason: "consecutive_failures".into(),
        condition_since_ms: now,
        owner_epoch: first_epoch,
        ..Default::default()
    };
    hookline_kafka::produce::send(&producer, topics.endpoint_state(), &victim, &zombie.encode_to_vec()).await.unwrap();
    let current = EndpointState {
        subscription_id: marker.clone(),
        condition: EndpointCondition::Paused as i32,
        reason: "consecutive_failures".into(),
        condition_since_ms: now,
        owner_epoch: second_epoch,
        ..Default::default()
    };
    hookline_kafka::produce::send(&producer, topics.endpoint_state(), &marker, &current.encode_to_vec()).await.unwrap();
    p.subscription_when(&marker, |v| v["endpoint_condition"] == "paused").await;
    let (_, v) = p.call("GET", &format!("/v1/subscriptions/{victim}"), None).await;
    assert_eq!(v["endpoint_condition"], "healthy", "the zombie's write is not shown: {v}");
    stop.cancel();
    second.await.unwrap();

    // The next owner reads the partition from the start, the zombie's record included, and keeps delivering.
    let (stop, third) = dispatcher(&p, "third-owner");
    p.publish("evt_3", "order.created").await;
    wait_for(&p.seen.changed, LIMIT, "evt_3 delivered by the next owner", || delivered(&p, "evt_3")).await;
    assert_eq!(*fences(&p).await.last().unwrap(), second_epoch + 1);
    stop.cancel();
    third.await.unwrap();
    p.stop().await;
}
