//! Redone work is not sent again: a task whose attempt already has its outcome written (produced twice by a
//! restarted ingest or retry-scheduler, or redone by a partition's next owner from the last committed offset) is
//! acknowledged without a request, and does not schedule its retry a second time.
//!
//! Each subscription's lane runs one request at a time here, so tasks of a subscription are handled in partition
//! order: a later event's request is the signal that every task before it was handled.

use std::time::Duration;

use hookline_core::model::{DeliveryTask, RetryEnvelope, TaskOrigin};
use hookline_kafka::scan::scan;
use hookline_kafka::topics::tier_for;
use prost::Message as _;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::Message as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::pipeline::quick_policy;
use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

async fn records_of<T: prost::Message + Default>(p: &Pipeline, topic: &str) -> Vec<T> {
    let mut out = Vec::new();
    scan(&p.config.kafka, topic, None, LIMIT, |m| {
        if let Some(Ok(t)) = m.payload().map(T::decode) {
            out.push(t);
        }
    })
    .await
    .expect("scan");
    out
}

async fn start() -> Pipeline {
    Pipeline::start_with(1, |c| c.dispatcher.per_subscription_concurrency = 1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_produced_twice_is_sent_once_and_schedules_its_retry_once() {
    let p = start().await;
    let topics = p.topics();
    let policy = quick_policy(&[1.0], |_| {});
    let (status, v) =
        p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("flaky"), "event_types": ["*"], "policy_toml": policy}))).await;
    assert_eq!(status, 201, "{v}");
    let sub = v["id"].as_str().unwrap().to_owned();
    // Without the check, the copy would be sent (503) and schedule attempt 2 a second time.
    p.script("flaky", vec![Some((503, None)), Some((503, None)), Some((200, None))]);
    p.publish("evt_twice", "order.created").await;
    let attempts = p.attempts.clone();
    wait_for(&p.attempts.changed, LIMIT, "attempt 1 concluded", || {
        attempts.items.lock().unwrap().iter().any(|a| a.subscription_id == sub && a.concludes_attempt == 1)
    })
    .await;

    // What a restarted ingest does: the same fan-out task, produced again.
    let fanout = records_of::<DeliveryTask>(&p, topics.deliveries())
        .await
        .into_iter()
        .find(|t| t.origin == TaskOrigin::Fanout as i32 && t.subscription_id == sub)
        .expect("the fan-out task");
    let producer = hookline_kafka::client::producer(&p.config.kafka, "redo-test").unwrap();
    hookline_kafka::produce::send(&producer, topics.deliveries(), &sub, &fanout.encode_to_vec()).await.unwrap();

    p.wait_final_of(&sub, 1, LIMIT).await;
    p.publish("evt_after", "order.created").await;
    wait_for(&p.seen.changed, LIMIT, "the later event's request", || p.requests_for("flaky", "evt_after") == 1).await;

    assert_eq!(p.requests_for("flaky", "evt_twice"), 2, "attempt 1 (503) and attempt 2 (200), the copy not sent");
    let retries: Vec<RetryEnvelope> = records_of(&p, topics.retry(tier_for(1_000))).await;
    let of_it = retries.iter().filter(|r| r.task.as_ref().is_some_and(|t| t.delivery_id == fanout.delivery_id)).count();
    assert_eq!(of_it, 1, "attempt 2 was scheduled once");
    let concluded: Vec<u32> =
        p.attempts_of(&sub).iter().filter(|a| a.delivery_id == fanout.delivery_id).map(|a| a.concludes_attempt).collect();
    assert_eq!(concluded, vec![1, 2], "one record concludes each attempt");
    p.stop().await;
}

/// A dispatcher of the pipeline's group, run by the test.
fn dispatcher(p: &Pipeline, dedupe_window_ms: u64) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let mut config = p.config.clone();
    config.dispatcher.dedupe_window_ms = dedupe_window_ms;
    let stop = CancellationToken::new();
    let run = hookline_dispatcher::run(config, stop.clone(), Default::default());
    (stop, tokio::spawn(async move { run.await.expect("dispatcher runs") }))
}

/// One delivery concluded by a dispatcher whose offset commits all failed, then the partition's next owner starts
/// from offset 0 (what a crash between the outcome and the commit leaves). Returns the requests the concluded
/// delivery got in all.
async fn redo_by_the_next_owner(dedupe_window_ms: u64) -> usize {
    let p = Pipeline::start_without_dispatcher(1, |c| c.dispatcher.per_subscription_concurrency = 1).await;
    let (sub, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    let cluster = p.broker().cluster();
    cluster.request_errors(RDKafkaApiKey::OffsetCommit, &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR; 100_000]);
    let (stop, first) = dispatcher(&p, dedupe_window_ms);
    p.publish("evt_done", "order.created").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    stop.cancel();
    first.await.unwrap();
    cluster.clear_request_errors(RDKafkaApiKey::OffsetCommit);

    // The next owner knows only what `attempts` tells it at assignment.
    let (stop, next) = dispatcher(&p, dedupe_window_ms);
    p.publish("evt_fence", "order.created").await;
    wait_for(&p.seen.changed, LIMIT, "the fence's request", || p.requests_for("ok", "evt_fence") == 1).await;
    let n = p.requests_for("ok", "evt_done");
    stop.cancel();
    next.await.unwrap();
    drop(cluster);
    p.stop().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitions_next_owner_does_not_resend_what_the_last_owner_concluded() {
    if crate::support::on_the_mock_only() {
        return;
    }
    assert_eq!(redo_by_the_next_owner(120_000).await, 1, "the redo was acknowledged without a request");
}

/// The control for the test above: the redo does happen, and the check is what keeps it from the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_check_off_the_next_owner_resends_it() {
    if crate::support::on_the_mock_only() {
        return;
    }
    assert_eq!(redo_by_the_next_owner(0).await, 2);
}
