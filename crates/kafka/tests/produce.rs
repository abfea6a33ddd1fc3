//! `send_until_acked`, the one produce loop every at-least-once path uses: a record that librdkafka gave up on (the
//! broker down past `delivery.timeout.ms`) is tried again until it lands, written once; shutting down first
//! answers `ShutDown`, so the caller leaves its input uncommitted.

use std::time::Duration;

use hookline_kafka::client::{producer, Producer};
use hookline_kafka::mock::DevBroker;
use hookline_kafka::produce::{send_until_acked, ShutDown};
use hookline_kafka::scan::scan_partitions;
use hookline_kafka::settings::KafkaSettings;
use hookline_kafka::topics::Topics;
use tokio_util::sync::CancellationToken;

fn settings(broker: &DevBroker) -> KafkaSettings {
    // librdkafka gives up on a record after 1 s, so an outage of a few seconds outlasts several of its tries.
    KafkaSettings { bootstrap_servers: broker.bootstrap_servers(), delivery_timeout_ms: 1_000, ..KafkaSettings::default() }
}

/// A broker, a producer that has written one record (`before`) to `topic`, so the outage hits an established
/// producer, and the broker then taken down.
async fn producer_in_an_outage(prefix: &str) -> (DevBroker, KafkaSettings, Producer, String) {
    let topics = Topics::new(prefix);
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    let settings = settings(&broker);
    let p = producer(&settings, "produce-test").unwrap();
    let topic = topics.attempts().to_owned();
    send_until_acked(&p, &topic, "k0", b"before", None, &CancellationToken::new()).await.unwrap();
    broker.cluster().broker_down(1).unwrap();
    (broker, settings, p, topic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_written_once_after_an_outage_longer_than_the_delivery_timeout() {
    let (broker, settings, p, topic) = producer_in_an_outage("pu").await;
    let stop = CancellationToken::new();
    let send = tokio::spawn({
        let (p, topic, stop) = (p.clone(), topic.clone(), stop.clone());
        async move { send_until_acked(&p, &topic, "k1", b"during", None, &stop).await }
    });
    // Three delivery timeouts: librdkafka has failed it more than once by now, and it is still being tried.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!send.is_finished(), "a record is not given up while the broker is down");
    broker.cluster().broker_up(1).unwrap();
    let at = tokio::time::timeout(Duration::from_secs(30), send).await.expect("written once the broker is back").unwrap();
    assert!(at.is_ok(), "{at:?}");

    let mut values = Vec::new();
    scan_partitions(&settings, &topic, Some(0), None, Duration::from_secs(20), |m| {
        values.push(rdkafka::Message::payload(m).unwrap_or_default().to_vec());
    })
    .await
    .unwrap();
    assert_eq!(values, vec![b"before".to_vec(), b"during".to_vec()], "each record exactly once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_during_an_outage_answers_shut_down_instead_of_waiting() {
    let (_broker, _, p, topic) = producer_in_an_outage("ps").await;
    let stop = CancellationToken::new();
    let send = tokio::spawn({
        let (p, topic, stop) = (p.clone(), topic.clone(), stop.clone());
        async move { send_until_acked(&p, &topic, "k1", b"during", None, &stop).await }
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.cancel();
    let r = tokio::time::timeout(Duration::from_secs(5), send).await.expect("returns soon after shutdown").unwrap();
    assert_eq!(r, Err(ShutDown));
}

/// `send_then`'s callback (what the dispatcher and the fan-out settle their records with) is called once: with the
/// acknowledgement, or with the failure and the record's key and payload to write it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_then_calls_back_once_with_the_acknowledgement() {
    let topics = Topics::new("st");
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    // librdkafka's default delivery timeout: the 1 s of the outage tests can run out on a loaded machine before the
    // idempotent producer has its id, and this test is about the acknowledgement, not about giving up.
    let settings = KafkaSettings { bootstrap_servers: broker.bootstrap_servers(), ..KafkaSettings::default() };
    let p = producer(&settings, "send-then-test").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..3i64 {
        let tx = tx.clone();
        let record = rdkafka::producer::FutureRecord::to(topics.attempts()).key("k").payload("v");
        p.send_then(record, move |r| tx.send((i, r.map(|d| (d.partition, d.offset)).map_err(|f| f.error))).unwrap());
    }
    drop(tx);
    let got: Vec<_> = tokio::task::spawn_blocking(move || rx.iter().collect()).await.unwrap();
    let acknowledged: Vec<_> = got.iter().map(|(i, r)| (*i, r.clone().ok())).collect();
    assert_eq!(acknowledged, vec![(0, Some((0, 0))), (1, Some((0, 1))), (2, Some((0, 2)))], "each called once, in order: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_then_hands_back_a_record_librdkafka_gave_up_on() {
    let (_broker, _, p, topic) = producer_in_an_outage("sg").await;
    let (tx, rx) = std::sync::mpsc::channel();
    let record = rdkafka::producer::FutureRecord::to(&topic).key("k1").payload("during");
    p.send_then(record, move |r| {
        let failed = r.expect_err("the broker is down past delivery.timeout.ms");
        tx.send((failed.key.map(<[u8]>::to_vec), failed.payload.map(<[u8]>::to_vec))).unwrap();
    });
    let (key, payload) = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30))).await.unwrap().expect("called back");
    assert_eq!((key.as_deref(), payload.as_deref()), (Some(&b"k1"[..]), Some(&b"during"[..])));
}

#[test]
fn send_then_calls_back_at_once_when_the_record_cannot_be_enqueued() {
    // No broker and room for one record: the second cannot be enqueued.
    let settings = KafkaSettings {
        bootstrap_servers: "127.0.0.1:1".into(),
        properties: [("queue.buffering.max.messages".to_owned(), "1".to_owned())].into(),
        ..KafkaSettings::default()
    };
    let p = producer(&settings, "send-then-full").unwrap();
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    for i in 0..2 {
        let calls = calls.clone();
        let record = rdkafka::producer::FutureRecord::to("t").key("k").payload("v");
        p.send_then(record, move |r| calls.lock().unwrap().push((i, r.map(|_| ()).map_err(|f| (f.error, f.payload.map(<[u8]>::to_vec))))));
    }
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "only the record that could not be enqueued has been answered: {calls:?}");
    let (i, r) = &calls[0];
    assert_eq!(*i, 1);
    let (error, payload) = r.clone().unwrap_err();
    assert_eq!(error, rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull));
    assert_eq!(payload.as_deref(), Some(&b"v"[..]), "with its payload, to write it again");
    let _ = p.flush(Duration::ZERO);
}
