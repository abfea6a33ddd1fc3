//! Records the broker dropped while the indexer was not running are counted lost when it starts again: its group's
//! committed offset is gone, the consumer resets to the earliest record, and that reset (read from librdkafka's
//! warning) says where reading should have gone on. Also counted for any group: `hookline_consumer_offset_resets_total`.

mod support;

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use support::flood::{counter, lost_attempts, Lossy, LAST};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_dropped_while_the_indexer_was_stopped_are_counted_lost_when_it_starts_again() {
    let metrics = hookline_service::telemetry::metrics_handle();
    let (log, stop, indexer) = Lossy::started("restart", &metrics).await;

    // Stopped only once its group has committed past attempt 0, so that it starts again from offset 1.
    let group = log.store.indexer_group(&log.config.log.group_id).await.unwrap();
    let probe: BaseConsumer = hookline_kafka::client::group_consumer_config(&log.config.kafka, &group, "probe").unwrap().create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(log.topics.attempts(), 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = probe.committed_offsets(tpl.clone(), Duration::from_secs(5)).unwrap();
        if committed.find_partition(log.topics.attempts(), 0).map(|e| e.offset()) == Some(Offset::Offset(1)) {
            break;
        }
        assert!(Instant::now() < deadline, "the indexer never committed attempt 0: {committed:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    indexer.await.unwrap();
    assert_eq!(lost_attempts(&metrics), 0, "nothing lost while it ran");

    // 8 MiB arrive while no indexer runs: the broker drops the oldest, offset 1 among them.
    log.flood().await;
    let (stop, indexer) = log.indexer();
    log.wait_stored(LAST, &metrics).await;
    stop.cancel();
    indexer.await.unwrap();

    let kept = log.kept().await;
    let lost = lost_attempts(&metrics);
    assert!(lost > 0, "the broker dropped records the indexer never read; kept {kept:?}");
    assert_eq!(kept.len() + usize::try_from(lost).unwrap(), LAST + 1, "every record is either in the log or counted lost: kept {kept:?}");
    let first_after = kept.get(1).copied().expect("records after the gap were read");
    assert_eq!(u64::try_from(first_after - 1).unwrap(), lost, "the gap is 1..{first_after}, as the consumer's reset said");
    let resets = counter(&metrics, "hookline_consumer_offset_resets_total{group=\"log-indexer\",topic=\"attempts\"} ");
    assert_eq!(resets, 1, "one reset, of the attempts partition");
}
