//! The shared consume loop against the embedded broker: what is committed is the contiguous completed watermark
//! (a record never completed is read again by the group's next member), and a loop whose budget is spent keeps
//! polling and takes the rest once work is given back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline_kafka::mock::DevBroker;
use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::settings::KafkaSettings;
use hookline_kafka::topics::Topics;
use hookline_kafka::worker::{Control, Done, Handler, Liveness, Settings, Worker};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::FutureRecord;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(60);

/// Keeps every record's `Done` for the test to complete or drop.
#[derive(Clone, Default)]
struct Keep {
    taken: Arc<Mutex<Vec<Done>>>,
    offsets: Arc<Mutex<Vec<i64>>>,
    changed: Arc<Notify>,
}

impl Handler for Keep {
    type Wake = ();

    fn record(&mut self, _: &BorrowedMessage<'_>, done: Done, _: &Control<'_>) {
        self.offsets.lock().unwrap().push(done.offset());
        self.taken.lock().unwrap().push(done);
        self.changed.notify_waiters();
    }

    fn rebalance(&mut self, _: RebalanceEvent, _: &Control<'_>) {}
}

impl Keep {
    async fn until(&self, what: &str, cond: impl Fn(&[i64]) -> bool) {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if cond(&self.offsets.lock().unwrap()) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("timed out waiting for {what}: {:?}", self.offsets.lock().unwrap());
            }
        }
    }
}

fn settings(topic: &str, max_in_flight: usize) -> Settings {
    Settings {
        name: "worker-test",
        group_id: "worker-test".into(),
        client_id: "worker-test".into(),
        topics: vec![topic.to_owned()],
        max_in_flight: Some(max_in_flight),
        paused_gauge: None,
        drain: Duration::from_secs(5),
        stall: None,
        prefetch_kbytes: None,
    }
}

async fn produce(kafka: &KafkaSettings, topic: &str, n: usize) {
    let producer = hookline_kafka::client::producer(kafka, "worker-test").unwrap();
    for i in 0..n {
        let payload = format!("r{i}");
        producer.send(FutureRecord::to(topic).partition(0).key("k").payload(&payload), Duration::from_secs(10)).await.unwrap();
    }
}

fn start(kafka: &KafkaSettings, s: Settings, handler: Keep) -> (CancellationToken, tokio::task::JoinHandle<()>, Arc<Liveness>) {
    let live = Liveness::new(Duration::from_millis(kafka.max_poll_interval_ms));
    let worker = Worker::subscribe(kafka, s, live.clone(), None).unwrap();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let mut handler = handler;
    (stop, tokio::spawn(async move { worker.run(&mut handler, &token).await }), live)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_contiguous_completed_watermark_is_committed() {
    let topics = Topics::new("wk");
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    let kafka = KafkaSettings { bootstrap_servers: broker.bootstrap_servers(), ..KafkaSettings::default() };
    let topic = topics.deliveries();
    produce(&kafka, topic, 10).await;

    let first = Keep::default();
    let (stop, run, _) = start(&kafka, settings(topic, 100), first.clone());
    first.until("10 records", |o| o.len() == 10).await;
    // Completed out of order, all but offset 3, whose work is given up (dropped): the watermark stops below it.
    let mut taken: Vec<Done> = std::mem::take(&mut *first.taken.lock().unwrap());
    taken.sort_by_key(|d| std::cmp::Reverse(d.offset()));
    for done in taken {
        if done.offset() == 3 {
            drop(done);
        } else {
            done.complete();
        }
    }
    stop.cancel();
    run.await.unwrap();

    // The group's next member starts at the first record not completed, and reads every record after it again.
    let next = Keep::default();
    let (stop, run, _) = start(&kafka, settings(topic, 100), next.clone());
    next.until("the records from offset 3", |o| o.len() == 7).await;
    assert_eq!(*next.offsets.lock().unwrap(), (3..10).collect::<Vec<i64>>());
    next.taken.lock().unwrap().drain(..).for_each(Done::complete);
    stop.cancel();
    run.await.unwrap();
    // Kept alive: a consumer still closing on its own thread must not find the broker gone.
    std::mem::forget(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_with_its_budget_spent_keeps_polling_and_resumes_when_work_is_given_back() {
    let topics = Topics::new("wb");
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    let kafka = KafkaSettings { bootstrap_servers: broker.bootstrap_servers(), max_poll_interval_ms: 10_000, ..KafkaSettings::default() };
    let topic = topics.deliveries();

    let keep = Keep::default();
    let (stop, run, live) = start(&kafka, settings(topic, 2), keep.clone());
    produce(&kafka, topic, 2).await;
    keep.until("the budget's 2 records", |o| o.len() == 2).await;
    produce(&kafka, topic, 8).await;
    // Spent and paused, it goes on polling: over several of its polling beats its liveness stays fresh, so the
    // group keeps it (and the dispatcher's fence stays open).
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(live.is_live(), "silent for {:?} while saturated", live.silent_for());
        assert!(live.silent_for() < Duration::from_millis(2_000), "silent for {:?}", live.silent_for());
    }
    assert_eq!(keep.offsets.lock().unwrap().len(), 2, "paused: nothing past the budget is taken");
    // Work given back: it resumes and takes the rest.
    keep.taken.lock().unwrap().drain(..).for_each(Done::complete);
    let release = {
        let keep = keep.clone();
        tokio::spawn(async move {
            loop {
                let changed = keep.changed.notified();
                tokio::pin!(changed);
                // Registered before the drain, so a record taken in between is not missed.
                changed.as_mut().enable();
                keep.taken.lock().unwrap().drain(..).for_each(Done::complete);
                changed.await;
            }
        })
    };
    keep.until("all 10 records", |o| o.len() == 10).await;
    assert_eq!(*keep.offsets.lock().unwrap(), (0..10).collect::<Vec<i64>>());
    release.abort();
    keep.taken.lock().unwrap().drain(..).for_each(Done::complete);
    stop.cancel();
    run.await.unwrap();
    // Kept alive: a consumer still closing on its own thread must not find the broker gone.
    std::mem::forget(broker);
}
