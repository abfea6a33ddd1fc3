//! An indexer that fell behind what the broker keeps says so: the records the broker dropped before the indexer
//! read them are counted (`hookline_log_records_lost_total`), and every record produced is either in the log or
//! counted lost. The embedded broker keeps ~5 MiB a partition, so stalling the indexer (another connection holds
//! the SQLite file's write lock) while 8 MiB more arrive moves the partition's start past where it was reading.
//! (Losses across a restart: `lost_across_restart.rs`, a process of its own, since the counters are global.)

mod support;

use support::flood::{lost_attempts, Lossy, LAST};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_broker_dropped_before_the_indexer_read_them_are_counted_lost() {
    let metrics = hookline_service::telemetry::metrics_handle();
    let (log, stop, indexer) = Lossy::started("lost", &metrics).await;

    // The indexer stalls on its next write while 8 MiB arrive behind it (128 records of 64 KiB): at most one fetch
    // response (1 MiB) of them is in its consumer, 5 MiB stay on the broker, the rest is dropped.
    let lock = rusqlite::Connection::open(&log.config.log.sqlite_path).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    log.flood().await;
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);

    log.wait_stored(LAST, &metrics).await;
    stop.cancel();
    indexer.await.unwrap();

    let kept = log.kept().await.len();
    let lost = lost_attempts(&metrics);
    assert!(lost > 0, "the broker dropped records the indexer had not read; kept {kept} of {}", LAST + 1);
    assert_eq!(kept + usize::try_from(lost).unwrap(), LAST + 1, "every record is either in the log or counted lost");
}
