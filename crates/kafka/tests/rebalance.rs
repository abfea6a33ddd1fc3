//! Incremental rebalancing on the embedded broker, with hookline's group consumer settings and `RebalanceContext`:
//! a partition that leaves a member and comes back starts unpaused (librdkafka would keep the pause its old owner
//! set, and the loops that pause for backpressure forget a revoked partition's state), while a partition the member
//! kept all along keeps its pause.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookline_kafka::mock::DevBroker;
use hookline_kafka::rebalance::{RebalanceContext, RebalanceEvent};
use hookline_kafka::{KafkaSettings, Topics};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Message, TopicPartitionList};
use tokio::sync::mpsc;

const LIMIT: Duration = Duration::from_secs(30);

struct Member {
    consumer: Arc<StreamConsumer<RebalanceContext>>,
    events: mpsc::UnboundedReceiver<RebalanceEvent>,
    records: Arc<Mutex<Vec<(i32, Vec<u8>)>>>,
    poll: tokio::task::JoinHandle<()>,
}

impl Member {
    fn join(settings: &KafkaSettings, topic: &str, name: &'static str) -> Member {
        let (context, events) = RebalanceContext::new(name);
        let consumer: StreamConsumer<RebalanceContext> =
            hookline_kafka::client::group_consumer_config(settings, "rebalance-test", name).unwrap().create_with_context(context).unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let consumer = Arc::new(consumer);
        let records = Arc::new(Mutex::new(Vec::new()));
        let (c, r) = (consumer.clone(), records.clone());
        // Polling drives the rebalance callbacks as well as the records.
        let poll = tokio::spawn(async move {
            loop {
                if let Ok(m) = c.recv().await {
                    r.lock().unwrap().push((m.partition(), m.payload().unwrap_or_default().to_vec()));
                }
            }
        });
        Member { consumer, events, records, poll }
    }

    /// Waits for the next rebalance event that names a partition of `topic`.
    async fn next(&mut self, topic: &str) -> RebalanceEvent {
        loop {
            let ev = tokio::time::timeout(LIMIT, self.events.recv()).await.expect("a rebalance in time").expect("open");
            let named = match &ev {
                RebalanceEvent::Assigned(ps) | RebalanceEvent::Revoked(ps) => ps.iter().any(|(t, _)| t == topic),
            };
            if named {
                return ev;
            }
        }
    }

    fn got(&self, payload: &[u8]) -> bool {
        self.records.lock().unwrap().iter().any(|(_, p)| p == payload)
    }

    /// Closes the consumer: it leaves the group (serving its last revoke itself).
    async fn leave(self) {
        self.poll.abort();
        let _ = self.poll.await;
        let consumer = Arc::try_unwrap(self.consumer).ok().expect("the poll task let go of the consumer");
        tokio::task::spawn_blocking(move || drop(consumer)).await.unwrap();
    }
}

fn parts(ev: &RebalanceEvent) -> Vec<i32> {
    match ev {
        RebalanceEvent::Assigned(ps) | RebalanceEvent::Revoked(ps) => ps.iter().map(|(_, p)| *p).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_back_starts_unpaused_and_a_kept_one_stays_paused() {
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, 2, 2).unwrap();
    let topic = topics.deliveries().to_owned();
    let settings = KafkaSettings {
        bootstrap_servers: broker.bootstrap_servers(),
        fetch_wait_max_ms: 10,
        // The mock broker holds each join round open for the session timeout less 1 s (and with 2 s, a first join
        // never completed there).
        session_timeout_ms: 3_000,
        ..Default::default()
    };

    let mut a = Member::join(&settings, &topic, "member-a");
    let first = a.next(&topic).await;
    assert!(matches!(first, RebalanceEvent::Assigned(_)) && parts(&first).len() == 2, "{first:?}");
    // Backpressure: a pauses both of its partitions.
    let mut both = TopicPartitionList::new();
    both.add_partition(&topic, 0);
    both.add_partition(&topic, 1);
    a.consumer.pause(&both).unwrap();

    // b joins: incrementally, a gives up one partition and keeps the other.
    let b = Member::join(&settings, &topic, "member-b");
    let revoked = a.next(&topic).await;
    assert!(matches!(revoked, RebalanceEvent::Revoked(_)) && parts(&revoked).len() == 1, "a revoked only one: {revoked:?}");
    let moved = parts(&revoked)[0];
    let kept = 1 - moved;

    // b leaves: the moved partition comes back to a.
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.leave().await;
    let back = a.next(&topic).await;
    assert_eq!(back, RebalanceEvent::Assigned(vec![(topic.clone(), moved)]));

    let producer = hookline_kafka::client::producer(&settings, "rebalance-test-producer").unwrap();
    for (p, payload) in [(moved, &b"to the returned partition"[..]), (kept, b"to the kept, paused partition")] {
        let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(&topic).partition(p).key("k").payload(payload);
        producer.send(record, Duration::from_secs(10)).await.unwrap();
    }

    let deadline = Instant::now() + LIMIT;
    while !a.got(b"to the returned partition") {
        assert!(Instant::now() < deadline, "the partition assigned back stayed paused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The kept partition is still paused, as its owner left it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!a.got(b"to the kept, paused partition"), "the kept partition's pause was lost");
    a.consumer.resume(&both).unwrap();
    while !a.got(b"to the kept, paused partition") {
        assert!(Instant::now() < deadline, "the kept partition did not resume");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Left to the process's exit: a last member closing on the mock broker can wait out its session.
    a.poll.abort();
    std::mem::forget(a.consumer);
    std::mem::forget(broker);
}
