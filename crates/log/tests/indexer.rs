//! The indexer through the embedded broker: records produced to `attempts`, `dlq` and `events` end up in the
//! store; a killed indexer (its task aborted mid-stream, no graceful commit) restarted in the same group loses
//! nothing and duplicates nothing; a second group re-reading everything from the start changes nothing.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_core::model::{AttemptRecord, DeadLetter};
use hookline_kafka::client::{producer, Producer};
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use hookline_log::{DeliveryState, ListQuery, LogStore, Scope};
use prost::Message as _;
use rdkafka::producer::FutureRecord;
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 2;
const SUBS: [&str; 4] = ["sub_0", "sub_1", "sub_2", "sub_3"];

async fn send(p: &Producer, topic: &str, partition: Option<i32>, key: &str, payload: &[u8]) {
    let mut r = FutureRecord::to(topic).key(key).payload(payload);
    if let Some(n) = partition {
        r = r.partition(n);
    }
    p.send(r, Duration::from_secs(10)).await.map_err(|(e, _)| e).expect("the broker acknowledges");
}

fn delivery(n: usize) -> (String, &'static str, String) {
    (format!("dlv_{n:04}"), SUBS[n % SUBS.len()], format!("evt_{n:04}"))
}

/// Event `n` for its subscription: the event (JSON, as producers write it), two attempts, and for every fifth a
/// dead letter (the delivery ends `dead`, otherwise `succeeded`).
async fn produce_delivery(p: &Producer, topics: &Topics, n: usize, now: i64) {
    let (id, sub, event_id) = delivery(n);
    let tenant = if n.is_multiple_of(2) { "acme" } else { "globex" };
    let ev = serde_json::json!({"id": event_id, "type": "order.created", "tenant": tenant, "data": {"n": n}});
    send(p, topics.events(), None, &event_id, ev.to_string().as_bytes()).await;
    let dead = n.is_multiple_of(5);
    for attempt in 1..=2u32 {
        let last = attempt == 2;
        let rec = AttemptRecord {
            delivery_id: id.clone(),
            subscription_id: sub.into(),
            event_id: event_id.clone(),
            event_type: "order.created".into(),
            tenant: tenant.into(),
            attempt,
            r#try: 1,
            started_at_ms: now + i64::from(attempt) * 10,
            http_status: if last && !dead { 200 } else { 503 },
            outcome: if last && !dead { "200" } else { "503" }.into(),
            final_state: match (last, dead) {
                (false, _) => "",
                (true, true) => "dead",
                (true, false) => "succeeded",
            }
            .into(),
            phase: 1,
            ..Default::default()
        };
        send(p, topics.attempts(), None, sub, &rec.encode_to_vec()).await;
    }
    if dead {
        let dl = DeadLetter {
            reason: "retries_exhausted".into(),
            final_state: "dead".into(),
            subscription_id: sub.into(),
            delivery_id: id,
            attempts: 2,
            last_outcome: "503".into(),
            at_ms: now + 30,
            first_attempt_at_ms: now + 10,
            ..Default::default()
        };
        send(p, topics.dlq(), None, sub, &dl.encode_to_vec()).await;
    }
}

/// Waits (re-checking every 50 ms) until `cond` holds; panics with `what` after `limit`.
async fn until<F: std::future::Future<Output = bool>>(limit: Duration, what: &str, mut cond: impl FnMut() -> F) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stored(store: &LogStore) -> usize {
    let mut n = 0;
    for sub in SUBS {
        let mut q = ListQuery::new(Scope::Subscription(sub.into()));
        q.limit = 1_000;
        n += store.list(&q).await.unwrap().items.len();
    }
    n
}

fn start(config: &hookline_service::Config, store: &Arc<LogStore>, name: &str) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let (c, s, st, name) = (config.clone(), store.clone(), stop.clone(), name.to_owned());
    let task = tokio::spawn(async move {
        hookline_log::indexer::run_with_store(&c, s, &name, st).await.expect("indexer runs");
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_every_record_once_across_a_kill_and_a_full_re_read() {
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, PARTITIONS, PARTITIONS).unwrap();
    let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), PARTITIONS, "log-indexer-test-token");
    config.log.batch_max_wait_ms = 20;
    config.log.batch_max_records = 25; // several batches per run, so a kill can fall between two of them
    let dir = support::TempDir::new("indexer");
    config.log.sqlite_path = dir.0.join("log.sqlite3");
    let store = Arc::new(LogStore::open(&hookline_log::Target::Sqlite(config.log.sqlite_path.clone())).await.unwrap());
    let p = producer(&config.kafka, "log-indexer-test").unwrap();
    let now = hookline_service::now_ms();

    for n in 0..40 {
        produce_delivery(&p, &topics, n, now).await;
    }
    let (_stop, task) = start(&config, &store, "indexer-a");
    until(Duration::from_secs(60), "the first 40 deliveries", || async { stored(&store).await == 40 }).await;

    // Killed while a second lot streams in: whatever it had stored but not committed is read again.
    let more = {
        let (p, topics) = (p.clone(), topics.clone());
        tokio::spawn(async move {
            for n in 40..120 {
                produce_delivery(&p, &topics, n, now).await;
            }
        })
    };
    until(Duration::from_secs(60), "some of the second lot", || async { stored(&store).await > 45 }).await;
    task.abort();
    let _ = task.await;
    more.await.unwrap();

    let (stop, task) = start(&config, &store, "indexer-a-restarted");
    until(Duration::from_secs(60), "all 120 deliveries after the restart", || async { stored(&store).await == 120 }).await;
    stop.cancel();
    task.await.unwrap();

    // A new group reads every record again from the start; the marker at the end of each attempts partition says
    // when it has.
    let mut fresh = config.clone();
    fresh.log.group_id = "hookline-log-indexer-reread".into();
    let (stop, task) = start(&fresh, &store, "indexer-b");
    for partition in 0..PARTITIONS {
        let rec = AttemptRecord {
            delivery_id: format!("dlv_marker_{partition}"),
            subscription_id: "sub_marker".into(),
            attempt: 1,
            started_at_ms: now,
            final_state: "succeeded".into(),
            phase: 1,
            ..Default::default()
        };
        send(&p, topics.attempts(), Some(partition), "sub_marker", &rec.encode_to_vec()).await;
    }
    until(Duration::from_secs(60), "the re-read to reach the markers", || async {
        let mut q = ListQuery::new(Scope::Subscription("sub_marker".into()));
        q.limit = 10;
        store.list(&q).await.unwrap().items.len() == PARTITIONS as usize
    })
    .await;
    stop.cancel();
    task.await.unwrap();

    assert_eq!(stored(&store).await, 120);
    for n in 0..120 {
        let (id, sub, event_id) = delivery(n);
        let d = store.delivery(&id).await.unwrap().unwrap_or_else(|| panic!("{id} is missing"));
        assert_eq!(d.attempts.len(), 2, "{id}: each attempt once");
        assert_eq!(d.delivery.subscription_id, sub);
        let want = if n % 5 == 0 { DeliveryState::Dead } else { DeliveryState::Succeeded };
        assert_eq!(d.delivery.state, want, "{id}");
        assert_eq!(d.delivery.tenant, if n % 2 == 0 { "acme" } else { "globex" }, "{id}");
        if n % 5 == 0 {
            assert_eq!(d.delivery.dead_letter_reason, "retries_exhausted", "{id}");
        }
        let ev = d.event.unwrap_or_else(|| panic!("{id}: the event is kept for a resend"));
        assert_eq!(ev.id, event_id);
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&ev.data_json).unwrap()["n"], n);
    }
    drop(p);
    drop(broker);
}
