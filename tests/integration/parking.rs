//! Parking held deliveries: a paused subscription's deliveries wait on `held` without being kept in memory or
//! holding back the partition, so another subscription on the same partition gets its own back as soon as it is
//! resumed, whatever the first one holds; parked positions survive a restart and a partition move to another
//! retry-scheduler; a deleted subscription's parked deliveries end `cancelled`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{wait_for, Pipeline, ReceiverState};

const LIMIT: Duration = Duration::from_secs(60);

/// A subscription to `event_type` under LuciBook (`inactive = "hold"`), paused.
pub(crate) async fn paused(p: &Pipeline, path: &str, event_type: &str) -> String {
    let (id, _) = p.subscribe(json!({"url": p.url(path), "event_types": [event_type], "policy": "lucibook"})).await;
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{id}/pause"), None).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("paused")), "{v}");
    id
}

async fn publish_n(p: &Pipeline, prefix: &str, event_type: &str, n: usize) {
    for i in 0..n {
        p.publish(&format!("{prefix}{i}"), event_type).await;
    }
}

/// Waits until `path` received `n` requests.
async fn wait_requests(p: &Pipeline, path: &str, n: usize, limit: Duration) {
    wait_received(&p.seen, path, n, limit).await;
}

async fn wait_received(seen: &Arc<ReceiverState>, path: &str, n: usize, limit: Duration) {
    let s = seen.clone();
    wait_for(&seen.changed, limit, &format!("{n} requests to {path}"), || {
        s.requests.lock().unwrap().iter().filter(|r| r.path == path).count() >= n
    })
    .await;
}

fn event_ids(seen: &ReceiverState, path: &str) -> Vec<String> {
    let mut ids: Vec<String> = seen
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// The parked positions as the compacted topic says (the last record per subscription; `None` = tombstone).
fn follow_parked(p: &Pipeline, stop: CancellationToken) -> Arc<crate::support::Collected<(String, Option<Vec<u8>>)>> {
    let c = Arc::new(crate::support::Collected::<(String, Option<Vec<u8>>)>::default());
    let c2 = c.clone();
    let config = p.config.clone();
    tokio::spawn(async move {
        hookline_kafka::table::spawn(
            &config.kafka,
            hookline_kafka::Topics::new(config.kafka.topic_prefix.clone()).parked(),
            "parking-test",
            move |_, k, v| {
                c2.items.lock().unwrap().push((String::from_utf8_lossy(k).into_owned(), v.filter(|v| !v.is_empty()).map(<[u8]>::to_vec)));
                c2.changed.notify_waiters();
            },
            stop,
        )
        .await
        .expect("parked topic reader");
    });
    c
}

fn last_parked(c: &Mutex<Vec<(String, Option<Vec<u8>>)>>, id: &str) -> Option<Option<Vec<u8>>> {
    c.lock().unwrap().iter().rev().find(|(k, _)| k == id).map(|(_, v)| v.clone())
}

/// The retry-scheduler group's committed offset and the end of `held` partition 0.
fn held_committed_and_end(p: &Pipeline) -> (i64, i64) {
    let consumer: BaseConsumer = hookline_kafka::client::table_consumer_config(&p.config.kafka, "parking-test-offsets")
        .unwrap()
        .set("group.id", &p.config.retry_scheduler.group_id)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(p.topics().held(), 0);
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    let at = match committed.find_partition(p.topics().held(), 0).map(|e| e.offset()) {
        Some(Offset::Offset(o)) => o,
        _ => 0,
    };
    let (_, end) = consumer.fetch_watermarks(p.topics().held(), 0, Duration::from_secs(10)).unwrap();
    (at, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_paused_subscription_does_not_hold_back_the_resume_of_another_on_its_partition() {
    // One partition: every subscription's held deliveries share it. A quota far below what A holds.
    let p = Pipeline::start_with(1, |c| c.retry_scheduler.max_held_per_partition = 4).await;
    let a = paused(&p, "a", "a.happened").await;
    let b = paused(&p, "b", "b.happened").await;
    // Sees B's events: by then B's held deliveries, behind all of A's, are on `held`.
    p.subscribe(json!({"url": p.url("witness"), "event_types": ["b.happened"]})).await;
    publish_n(&p, "evt_a", "a.happened", 30).await;
    publish_n(&p, "evt_b", "b.happened", 3).await;
    wait_requests(&p, "witness", 3, LIMIT).await;
    assert!(p.requests_to("a").is_empty() && p.requests_to("b").is_empty(), "nothing is delivered while paused");

    let resumed = Instant::now();
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{b}/resume"), None).await;
    assert_eq!(status, 200);
    wait_requests(&p, "b", 3, Duration::from_secs(15)).await;
    let waited = resumed.elapsed();
    assert_eq!(event_ids(&p.seen, "b"), ["evt_b0", "evt_b1", "evt_b2"], "B's held deliveries, each once");
    assert!(p.requests_to("a").is_empty(), "A stays parked");
    eprintln!("B's held deliveries arrived {waited:?} after its resume, with A holding 30 on the partition");

    // Nothing parked holds the group's committed offset back: it reaches the end of `held` while A is paused.
    let deadline = Instant::now() + LIMIT;
    loop {
        let (committed, end) = tokio::task::block_in_place(|| held_committed_and_end(&p));
        if committed == end && end >= 33 {
            break;
        }
        assert!(Instant::now() < deadline, "the committed offset of held/0 stayed at {committed} of {end}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{a}/resume"), None).await;
    assert_eq!(status, 200);
    wait_requests(&p, "a", 30, LIMIT).await;
    let mut want: Vec<String> = (0..30).map(|i| format!("evt_a{i}")).collect();
    want.sort();
    assert_eq!(event_ids(&p.seen, "a"), want, "A's parked deliveries, each once");
    assert_eq!(p.requests_to("b").len(), 3, "B's were not sent again");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_deliveries_survive_a_restart_after_their_offsets_were_committed() {
    let p = Pipeline::start_with(1, |_| {}).await;
    let stop = CancellationToken::new();
    let parked = follow_parked(&p, stop.clone());
    let a = paused(&p, "a", "a.happened").await;
    p.subscribe(json!({"url": p.url("witness"), "event_types": ["a.happened"]})).await;
    publish_n(&p, "evt_r", "a.happened", 5).await;
    wait_requests(&p, "witness", 5, LIMIT).await;
    let items = parked.clone();
    wait_for(&parked.changed, LIMIT, "A's parked position", || matches!(last_parked(&items.items, &a), Some(Some(_)))).await;
    // Every held record is done (committed past) although A is still paused.
    let deadline = Instant::now() + LIMIT;
    loop {
        let (committed, end) = tokio::task::block_in_place(|| held_committed_and_end(&p));
        if committed == end && end >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the committed offset of held/0 stayed at {committed} of {end}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bootstrap = p.config.kafka.bootstrap_servers.clone();
    let successor = p.successor_config();
    // The receiver outlives the services (A's URL names it).
    let receiver = p.seen.clone();
    p.stop().await;

    // New processes on the same broker (and master key): they start after every held record, so only the parked
    // position finds A's.
    let p = Pipeline::start_at(None, &bootstrap, 1, successor, true).await;
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{a}/resume"), None).await;
    assert_eq!(status, 200);
    wait_received(&receiver, "a", 5, Duration::from_secs(20)).await;
    assert_eq!(event_ids(&receiver, "a"), ["evt_r0", "evt_r1", "evt_r2", "evt_r3", "evt_r4"]);
    // Released: the position is removed.
    let items = parked.clone();
    wait_for(&parked.changed, LIMIT, "A's parked position removed", || matches!(last_parked(&items.items, &a), Some(None))).await;
    stop.cancel();
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_subscriptions_parked_deliveries_end_cancelled() {
    let p = Pipeline::start_with(1, |_| {}).await;
    let stop = CancellationToken::new();
    let parked = follow_parked(&p, stop.clone());
    let a = paused(&p, "a", "a.happened").await;
    publish_n(&p, "evt_d", "a.happened", 4).await;
    let items = parked.clone();
    wait_for(&parked.changed, LIMIT, "A's parked position", || matches!(last_parked(&items.items, &a), Some(Some(_)))).await;
    let (status, _) = p.call("DELETE", &format!("/v1/subscriptions/{a}"), None).await;
    assert_eq!(status, 204);
    let attempts = p.wait_final_of(&a, 4, LIMIT).await;
    let finals: Vec<(&str, &str)> =
        attempts.iter().filter(|r| !r.final_state.is_empty()).map(|r| (r.final_state.as_str(), r.outcome.as_str())).collect();
    assert_eq!(finals, [("cancelled", "subscription_deleted"); 4], "{attempts:?}");
    assert!(p.requests_to("a").is_empty(), "a deleted subscription gets nothing");
    let items = parked.clone();
    wait_for(&parked.changed, LIMIT, "A's parked position removed", || matches!(last_parked(&items.items, &a), Some(None))).await;
    stop.cancel();
    p.stop().await;
}

/// A retry-scheduler of the pipeline's group, run by the test.
struct Scheduler {
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
    readiness: hookline_service::Readiness,
}

impl Scheduler {
    fn start(p: &Pipeline, name: &str) -> Scheduler {
        let stop = CancellationToken::new();
        let readiness = hookline_service::Readiness::default();
        let options = hookline_retry_scheduler::Options { instance: Some(name.into()), readiness: readiness.clone(), ..Default::default() };
        let run = hookline_retry_scheduler::run(p.config.clone(), stop.clone(), options);
        Scheduler { stop, run: tokio::spawn(async move { run.await.expect("retry-scheduler runs") }), readiness }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_deliveries_move_with_their_partition_to_another_scheduler() {
    let p = Pipeline::start_without_scheduler(1, |_| {}).await;
    let first = Scheduler::start(&p, "scheduler-1");
    let a = paused(&p, "a", "a.happened").await;
    p.subscribe(json!({"url": p.url("witness"), "event_types": ["a.happened"]})).await;
    publish_n(&p, "evt_m", "a.happened", 6).await;
    wait_requests(&p, "witness", 6, LIMIT).await;
    let deadline = Instant::now() + LIMIT;
    loop {
        let (committed, end) = tokio::task::block_in_place(|| held_committed_and_end(&p));
        if committed == end && end >= 6 {
            break;
        }
        assert!(Instant::now() < deadline, "the committed offset of held/0 stayed at {committed} of {end}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(first.readiness.is_ready());
    // A second member joins; the first leaves, so the partition (with A's position) moves to the second.
    let second = Scheduler::start(&p, "scheduler-2");
    first.stop.cancel();
    first.run.await.unwrap();
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{a}/resume"), None).await;
    assert_eq!(status, 200);
    wait_requests(&p, "a", 6, LIMIT).await;
    let mut want: Vec<String> = (0..6).map(|i| format!("evt_m{i}")).collect();
    want.sort();
    assert_eq!(event_ids(&p.seen, "a"), want, "A's parked deliveries, each once, released by the new owner");
    assert!(second.readiness.is_ready());
    second.stop.cancel();
    second.run.await.unwrap();
    p.stop().await;
}
