//! An indexer that fell behind what the broker keeps says so: the records the broker dropped before the indexer
//! read them are counted (`hookline_log_records_lost_total`), and every record produced is either in the log or
//! counted lost. The embedded broker keeps ~5 MiB a partition, so stalling the indexer (another connection holds
//! the SQLite file's write lock) while 8 MiB more arrive moves the partition's start past where it was reading.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_core::model::AttemptRecord;
use hookline_kafka::client::{producer, Producer};
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use hookline_log::LogStore;
use prost::Message as _;
use rdkafka::producer::FutureRecord;
use tokio_util::sync::CancellationToken;

async fn attempt(p: &Producer, topics: &Topics, n: usize, excerpt_bytes: usize) {
    let rec = AttemptRecord {
        delivery_id: format!("dlv_{n:04}"),
        subscription_id: "sub_lost".into(),
        event_id: format!("evt_{n:04}"),
        attempt: 1,
        r#try: 1,
        started_at_ms: hookline_service::now_ms(),
        http_status: 200,
        outcome: "200".into(),
        final_state: "succeeded".into(),
        response_excerpt: noise(n, excerpt_bytes),
        phase: 1,
        ..Default::default()
    };
    let bytes = rec.encode_to_vec();
    let record = FutureRecord::to(topics.attempts()).partition(0).key("sub_lost").payload(&bytes);
    // One produce at a time: each record is a message set of its own, the unit the broker drops.
    p.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).expect("the broker acknowledges");
}

/// Hex of a xorshift stream: what lz4 cannot shrink, so the broker holds every byte.
fn noise(seed: usize, len: usize) -> String {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x & 15) as usize])
        })
        .collect()
}

async fn stored(store: &LogStore, n: usize) -> bool {
    store.delivery(&format!("dlv_{n:04}")).await.unwrap().is_some()
}

fn lost_attempts(metrics: &metrics_exporter_prometheus::PrometheusHandle) -> u64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("hookline_log_records_lost_total{topic=\"attempts\"} "))
        .map_or(0, |v| v.trim().parse().expect("a counter"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_broker_dropped_before_the_indexer_read_them_are_counted_lost() {
    let metrics = hookline_service::telemetry::metrics_handle();
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), 1, "log-lost-test-token");
    config.log.batch_max_wait_ms = 10;
    config.log.batch_max_records = 1;
    // The indexer's consumer fetches one small response ahead and no more, so what it has not read stays on the
    // broker.
    for (k, v) in [("queued.max.messages.kbytes", "1"), ("queued.min.messages", "1"), ("fetch.queue.backoff.ms", "10")] {
        config.kafka.properties.insert(k.into(), v.into());
    }
    let dir = support::TempDir::new("lost");
    config.log.sqlite_path = dir.0.join("log.sqlite3");
    let store = Arc::new(LogStore::open(&hookline_log::Target::Sqlite(config.log.sqlite_path.clone())).await.unwrap());
    let p = producer(&config.kafka, "log-lost-test").unwrap();
    let stop = CancellationToken::new();
    let indexer = tokio::spawn({
        let (c, s, st) = (config.clone(), store.clone(), stop.clone());
        async move { hookline_log::indexer::run_with_store(&c, s, "indexer-lost", st).await.expect("indexer runs") }
    });

    attempt(&p, &topics, 0, 10).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stored(&store, 0).await {
        assert!(Instant::now() < deadline, "the first attempt was never indexed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The indexer stalls on its next write while 8 MiB arrive behind it (128 records of 64 KiB): at most one fetch
    // response (1 MiB) of them is in its consumer, 5 MiB stay on the broker, the rest is dropped.
    let lock = rusqlite::Connection::open(&config.log.sqlite_path).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    const BIG: usize = 128;
    for n in 1..=BIG {
        attempt(&p, &topics, n, 64 * 1024).await;
    }
    const LAST: usize = BIG + 3;
    for n in BIG + 1..=LAST {
        attempt(&p, &topics, n, 10).await;
    }
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);

    let deadline = Instant::now() + Duration::from_secs(60);
    while !stored(&store, LAST).await {
        if Instant::now() > deadline {
            let mut kept = Vec::new();
            for n in 0..=LAST {
                if stored(&store, n).await {
                    kept.push(n);
                }
            }
            panic!("the last attempt was never indexed; kept {kept:?}, lost {}", lost_attempts(&metrics));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    indexer.await.unwrap();

    let mut kept = 0;
    for n in 0..=LAST {
        kept += usize::from(stored(&store, n).await);
    }
    let lost = lost_attempts(&metrics);
    assert!(lost > 0, "the broker dropped records the indexer had not read; kept {kept} of {}", LAST + 1);
    assert_eq!(kept + usize::try_from(lost).unwrap(), LAST + 1, "every record is either in the log or counted lost");
}
