//! Where a delivery's latency goes, hop by hop, for `latency`: the bench reads `events`, `deliveries` and
//! `attempts` itself (assign-only consumers with the services' fetch settings, from the end of each partition) and
//! matches every measured event with its records.
//!
//! Per event: publish (the driver, wall clock) → fan-out's produce of the task (the `deliveries` record's
//! timestamp) → the try's start (`started_at_ms` of the attempt record) → the receiver's arrival. The broker's
//! share of a hop is what a consumer like the service's waits between a record's timestamp and receiving it: the
//! probe's own receive time minus the timestamp, on that hop's topic. The rest of the hop is hookline's (the
//! service's consumer hand-off, work and produce). The probe's fetches are not the service's (the mock broker
//! answers a fetch at the end of its wait, so each consumer's wait for a record depends on its own fetch cycle),
//! so per event the two waits differ by up to the fetch wait either way: hookline's share is estimated from the
//! means (mean hop − mean broker wait), which that noise does not bias; percentiles of a difference would only
//! show the noise. Kafka timestamps are milliseconds, so each figure is ±1 ms.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hookline_core::model::{AttemptRecord, DeliveryTask};
use prost::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::receiver::Arrival;
use super::round;
use super::stats::{pct, sorted};

/// What the probe saw of one event (µs since the epoch; 0 until seen).
#[derive(Default, Clone, Copy)]
struct Seen {
    event_ts_us: i64,
    event_seen_us: i64,
    task_ts_us: i64,
    task_seen_us: i64,
    started_us: i64,
}

#[derive(Clone, Copy)]
enum Kind {
    Events,
    Deliveries,
    Attempts,
}

/// What one record tells about its event.
enum Update {
    Event { ts_us: i64, now: i64 },
    Task { ts_us: i64, now: i64 },
    Started(i64),
}

pub struct Probe {
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    stop: CancellationToken,
}

fn unix_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Probe {
    /// Starts reading the three topics from their ends; only events whose id starts with `prefix` are kept.
    pub async fn start(cluster: &Cluster, prefix: &'static str) -> anyhow::Result<Probe> {
        let seen: Arc<Mutex<HashMap<String, Seen>>> = Default::default();
        let stop = CancellationToken::new();
        let topics = cluster.topics();
        let k = &cluster.config.kafka;
        for (kind, topic, partitions) in [
            (Kind::Events, topics.events().to_owned(), k.event_partitions),
            (Kind::Deliveries, topics.deliveries().to_owned(), k.partitions),
            (Kind::Attempts, topics.attempts().to_owned(), k.partitions),
        ] {
            let mut config = hookline_kafka::client::table_consumer_config(k, &format!("hookline-bench-split-{topic}"))?;
            config.set("enable.partition.eof", "false");
            let consumer: StreamConsumer = config.create()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..partitions.max(1) {
                tpl.add_partition_offset(&topic, p, Offset::End)?;
            }
            consumer.assign(&tpl)?;
            let (seen, stop) = (seen.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    let m = tokio::select! {
                        _ = stop.cancelled() => break,
                        m = consumer.recv() => m,
                    };
                    let Ok(m) = m else { continue };
                    let now = unix_us();
                    let ts_us = rdkafka::Message::timestamp(&m).to_millis().unwrap_or(0).saturating_mul(1000);
                    let payload = rdkafka::Message::payload(&m).unwrap_or_default();
                    let (id, update) = match kind {
                        Kind::Events => {
                            let id = String::from_utf8_lossy(rdkafka::Message::key(&m).unwrap_or_default()).into_owned();
                            (id, Update::Event { ts_us, now })
                        }
                        Kind::Deliveries => {
                            let Ok(task) = DeliveryTask::decode(payload) else { continue };
                            (task.event.map(|e| e.id).unwrap_or_default(), Update::Task { ts_us, now })
                        }
                        Kind::Attempts => {
                            let Ok(rec) = AttemptRecord::decode(payload) else { continue };
                            if rec.attempt != 1 || rec.r#try != 1 || rec.started_at_ms <= 0 {
                                continue;
                            }
                            (rec.event_id, Update::Started(rec.started_at_ms.saturating_mul(1000)))
                        }
                    };
                    if id.starts_with(prefix) {
                        let mut seen = seen.lock().expect("probe lock");
                        let s = seen.entry(id).or_default();
                        match update {
                            Update::Event { ts_us, now } => (s.event_ts_us, s.event_seen_us) = (ts_us, now),
                            Update::Task { ts_us, now } => (s.task_ts_us, s.task_seen_us) = (ts_us, now),
                            Update::Started(us) => s.started_us = us,
                        }
                    }
                }
            });
        }
        Ok(Probe { seen, stop })
    }

    /// The hops of every arrived event whose id is `prefix{i}`, published at `published_unix_us[i]`, as p50/p99
    /// figures (ms); waits up to 5 s for the probe to have read the last records.
    pub async fn report(self, prefix: &str, published_unix_us: &[i64], arrivals: &[Arrival]) -> Map<String, Value> {
        let complete = |s: &Seen| s.event_seen_us > 0 && s.task_seen_us > 0 && s.started_us > 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let done = {
                let seen = self.seen.lock().expect("probe lock");
                arrivals.iter().filter(|a| seen.get(&a.id).is_some_and(complete)).count()
            };
            if done >= arrivals.len() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop.cancel();
        let seen = self.seen.lock().expect("probe lock");
        let ms = |us: i64| us as f64 / 1000.0;
        let mut hops: [Vec<f64>; 7] = Default::default();
        for a in arrivals {
            let Some(i) = a.id.strip_prefix(prefix).and_then(|s| s.parse::<usize>().ok()) else { continue };
            let (Some(s), Some(&published)) = (seen.get(&a.id).filter(|s| complete(s)), published_unix_us.get(i)) else { continue };
            let events_broker = s.event_seen_us.saturating_sub(s.event_ts_us);
            let to_fanout = s.task_ts_us.saturating_sub(published);
            let deliveries_broker = s.task_seen_us.saturating_sub(s.task_ts_us);
            let to_try = s.started_us.saturating_sub(s.task_ts_us);
            let to_arrival = a.unix_us.saturating_sub(s.started_us);
            for (v, x) in hops.iter_mut().zip([
                events_broker,
                to_fanout,
                to_fanout.saturating_sub(events_broker),
                deliveries_broker,
                to_try,
                to_try.saturating_sub(deliveries_broker),
                to_arrival,
            ]) {
                v.push(ms(x));
            }
        }
        let matched = hops[0].len();
        let names = [
            "events_broker_ms",
            "publish_to_fanout_produce_ms",
            "ingest_hookline_ms",
            "deliveries_broker_ms",
            "fanout_produce_to_try_ms",
            "dispatcher_hookline_ms",
            "try_to_arrival_ms",
        ];
        let mut out = Map::new();
        out.insert("matched".into(), json!(matched));
        for (i, (name, v)) in names.iter().zip(hops).enumerate() {
            let mean = if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
            // The hookline shares (a difference of two consumers' waits) are reported by their mean only.
            let figure = if matches!(i, 2 | 5) {
                json!({"mean": round(mean, 2)})
            } else {
                let v = sorted(v);
                json!({"p50": round(pct(&v, 50.0), 2), "p99": round(pct(&v, 99.0), 2), "mean": round(mean, 2)})
            };
            out.insert((*name).into(), figure);
        }
        out
    }
}

/// µs since the epoch now, as the split's publish times are taken.
pub fn now_unix_us() -> i64 {
    unix_us()
}
