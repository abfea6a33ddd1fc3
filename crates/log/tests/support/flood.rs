//! Attempts big enough that the embedded broker, which keeps ~5 MiB a partition, drops the oldest, and the checks
//! of what the indexer kept or counted lost.

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

/// Records of 64 KiB that lz4 cannot shrink: 8 MiB, more than the embedded broker keeps of a partition.
pub const BIG: usize = 128;
/// The last record: three small ones follow the big ones.
pub const LAST: usize = BIG + 3;

/// An embedded broker with one partition per topic, a SQLite log, and an indexer configuration that reads one
/// small fetch ahead and no more, so that what it has not read stays on the broker.
pub struct Lossy {
    pub topics: Topics,
    pub broker: DevBroker,
    pub config: hookline_service::Config,
    pub store: Arc<LogStore>,
    pub producer: Producer,
    _dir: super::TempDir,
}

impl Lossy {
    pub async fn start(tag: &str) -> Self {
        let topics = Topics::new("hookline.");
        let broker = DevBroker::start(&topics, 1, 1).unwrap();
        let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), 1, "log-lost-test-token");
        config.log.batch_max_wait_ms = 10;
        config.log.batch_max_records = 1;
        for (k, v) in [("queued.max.messages.kbytes", "1"), ("queued.min.messages", "1"), ("fetch.queue.backoff.ms", "10")] {
            config.kafka.properties.insert(k.into(), v.into());
        }
        let dir = super::TempDir::new(tag);
        config.log.sqlite_path = dir.0.join("log.sqlite3");
        let store = Arc::new(LogStore::open(&hookline_log::Target::Sqlite(config.log.sqlite_path.clone())).await.unwrap());
        let producer = producer(&config.kafka, tag).unwrap();
        Self { topics, broker, config, store, producer, _dir: dir }
    }

    /// Starts the broker, the store and an indexer, and waits until the indexer has stored attempt 0.
    pub async fn started(
        tag: &str,
        metrics: &metrics_exporter_prometheus::PrometheusHandle,
    ) -> (Self, CancellationToken, tokio::task::JoinHandle<()>) {
        let log = Self::start(tag).await;
        let (stop, indexer) = log.indexer();
        log.attempt(0, 10).await;
        log.wait_stored(0, metrics).await;
        (log, stop, indexer)
    }

    /// Runs an indexer until the returned token is cancelled.
    pub fn indexer(&self) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let stop = CancellationToken::new();
        let (c, s, st) = (self.config.clone(), self.store.clone(), stop.clone());
        let task =
            tokio::spawn(async move { hookline_log::indexer::run_with_store(&c, s, "indexer-lost", st).await.expect("indexer runs") });
        (stop, task)
    }

    /// Produces attempt `n` to partition 0 of `attempts`, with an excerpt of `excerpt_bytes` that lz4 cannot shrink.
    pub async fn attempt(&self, n: usize, excerpt_bytes: usize) {
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
        let record = FutureRecord::to(self.topics.attempts()).partition(0).key("sub_lost").payload(&bytes);
        // One produce at a time: each record is a message set of its own, the unit the broker drops.
        self.producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).expect("the broker acknowledges");
    }

    /// Attempts 1 to `LAST`: the big ones, then three small ones.
    pub async fn flood(&self) {
        for n in 1..=BIG {
            self.attempt(n, 64 * 1024).await;
        }
        for n in BIG + 1..=LAST {
            self.attempt(n, 10).await;
        }
    }

    /// Waits until attempt `n` is in the log; on failure names what the log holds.
    pub async fn wait_stored(&self, n: usize, metrics: &metrics_exporter_prometheus::PrometheusHandle) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !stored(&self.store, n).await {
            if Instant::now() > deadline {
                panic!("attempt {n} was never indexed; kept {:?}, lost {}", self.kept().await, lost_attempts(metrics));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The attempts 0 to `LAST` in the log.
    pub async fn kept(&self) -> Vec<usize> {
        let mut kept = Vec::new();
        for n in 0..=LAST {
            if stored(&self.store, n).await {
                kept.push(n);
            }
        }
        kept
    }
}

/// Hex of a xorshift stream: what lz4 cannot shrink, so the broker holds every byte.
pub fn noise(seed: usize, len: usize) -> String {
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

pub async fn stored(store: &LogStore, n: usize) -> bool {
    store.delivery(&format!("dlv_{n:04}")).await.unwrap().is_some()
}

pub fn lost_attempts(metrics: &metrics_exporter_prometheus::PrometheusHandle) -> u64 {
    counter(metrics, "hookline_log_records_lost_total{topic=\"attempts\"} ")
}

/// A counter's value in the rendered metrics, by its name and labels as rendered; 0 when absent.
pub fn counter(metrics: &metrics_exporter_prometheus::PrometheusHandle, name_and_labels: &str) -> u64 {
    metrics.render().lines().find_map(|l| l.strip_prefix(name_and_labels)).map_or(0, |v| v.trim().parse().expect("a counter"))
}
