//! A stopping service must not wait without limit for its group consumer to leave: librdkafka's close waits for
//! an in-progress rebalance, which another member can hold for the group's rebalance timeout (minutes).

use std::time::{Duration, Instant};

use hookline_kafka::client::{close_consumer, group_consumer_config};
use hookline_kafka::mock::DevBroker;
use hookline_kafka::settings::KafkaSettings;
use hookline_kafka::topics::Topics;
use rdkafka::consumer::{BaseConsumer, Consumer};

fn member(settings: &KafkaSettings, topic: &str, name: &str) -> BaseConsumer {
    let c: BaseConsumer = group_consumer_config(settings, "leave-group-test", name).unwrap().create().unwrap();
    c.subscribe(&[topic]).unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_closes_within_its_limit_while_another_member_holds_the_rebalance() {
    let topics = Topics::new("lg");
    let broker = DevBroker::start(&topics, 2, 2).unwrap();
    let settings = KafkaSettings { bootstrap_servers: broker.bootstrap_servers(), ..KafkaSettings::default() };
    let topic = topics.deliveries().to_owned();

    // Two members share the partitions; then the first stops polling (a busy or frozen process) and a third joins.
    // The second rejoins at once, but the first cannot take part, so the rebalance stays open with the second
    // waiting for its JoinGroup answer: the state a dispatcher is in when SIGTERM arrives during a rolling restart.
    let holder = member(&settings, &topic, "holder");
    let leaver = member(&settings, &topic, "leaver");
    let deadline = Instant::now() + Duration::from_secs(60);
    while holder.assignment().unwrap().count() == 0 || leaver.assignment().unwrap().count() == 0 {
        assert!(Instant::now() < deadline, "both members assigned within 60 s");
        holder.poll(Duration::from_millis(20));
        leaver.poll(Duration::from_millis(20));
    }
    let joiner = member(&settings, &topic, "joiner");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        joiner.poll(Duration::from_millis(20));
        leaver.poll(Duration::from_millis(20));
    }
    assert_eq!(joiner.assignment().unwrap().count(), 0, "the rebalance is still open: the joiner has nothing yet");

    let limit = Duration::from_secs(2);
    let t = Instant::now();
    close_consumer(leaver, limit, "leaver").await;
    let took = t.elapsed();
    assert!(took < limit + Duration::from_secs(2), "close_consumer took {took:?}, its limit is {limit:?}");
    drop((holder, joiner));
}
