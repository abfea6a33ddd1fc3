//! `RangeReader`: one partition read from an offset up to (not including) another, each record once, in order;
//! an empty range reads nothing and never waits.

use std::time::Duration;

use hookline_kafka::client::producer;
use hookline_kafka::mock::DevBroker;
use hookline_kafka::produce::send;
use hookline_kafka::scan::RangeReader;
use hookline_kafka::settings::KafkaSettings;
use hookline_kafka::topics::Topics;
use rdkafka::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_is_read_in_order_from_its_start_to_just_before_its_end() {
    let topics = Topics::new("rr.");
    let broker = DevBroker::start(&topics, 2, 1).unwrap();
    let settings = KafkaSettings { bootstrap_servers: broker.bootstrap_servers(), ..KafkaSettings::default() };
    let p = producer(&settings, "range-test").unwrap();
    let topic = topics.held();
    let mut on_zero = Vec::new();
    for i in 0..40 {
        let (partition, offset) = send(&p, topic, &format!("k{i}"), format!("v{i}").as_bytes()).await.unwrap();
        if partition == 0 {
            on_zero.push((offset, format!("v{i}")));
        }
    }
    assert!(on_zero.len() >= 6, "enough records on partition 0: {}", on_zero.len());
    let (from, to) = (on_zero[2].0, on_zero[5].0);
    let mut r = RangeReader::open(&settings, topic, 0, from, to, Duration::from_secs(10)).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = r.next().await {
        let m = m.unwrap();
        assert_eq!(m.partition(), 0);
        got.push((m.offset(), String::from_utf8(m.payload().unwrap().to_vec()).unwrap()));
    }
    assert_eq!(got, on_zero[2..5].to_vec());
    assert_eq!(r.position(), to);
    assert!(r.next().await.is_none(), "past its end it stays ended");

    let mut empty = RangeReader::open(&settings, topic, 0, to, to, Duration::from_secs(10)).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(1), empty.next()).await.expect("no wait").is_none());
}
