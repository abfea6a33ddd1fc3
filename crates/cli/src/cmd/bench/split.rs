//! Where a delivery's latency goes, hop by hop, for `latency`, from the services' own receive stamps (µs of the
//! wall clock; every process runs on this machine, so one clock): the bench reads `deliveries` and `attempts`
//! (assign-only consumers with the services' fetch settings, from the end of each partition) and matches every
//! measured event with its task and its first try's record.
//!
//! Per event, five stamps: publish (the driver, just before its produce call, where librdkafka takes the record's
//! timestamp) → the fan-out received the event's record (`DeliveryTask.fanout_received_at_us`) → it handed the
//! task to its producer (`fanout_produced_at_us`) → the dispatcher received the task's record
//! (`AttemptRecord.received_at_us`) → the try started (`started_at_us`); and the receiver's arrival. So the hops:
//! the broker's (record timestamp → receive: the producer's linger, the broker, the fetch wait and the consumer's
//! hand-off to the handler) on `events` and on `deliveries`, hookline's own (ingest: receive → produce;
//! dispatcher: receive → try start, the lane's queue included), and the HTTP hop (try start → arrival). Exact per
//! event: no estimate from a separate consumer's fetches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hookline_core::model::{AttemptPhase, AttemptRecord, DeliveryTask, TaskOrigin};
use prost::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::receiver::Arrival;
use super::round;
use super::stats::{pct, sorted};

/// The services' stamps of one event (µs since the epoch; 0 = not stamped or not seen yet).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamps {
    pub fanout_received_us: i64,
    pub fanout_produced_us: i64,
    pub dispatcher_received_us: i64,
    pub started_us: i64,
}

impl Stamps {
    fn complete(&self) -> bool {
        self.fanout_received_us > 0 && self.fanout_produced_us > 0 && self.dispatcher_received_us > 0 && self.started_us > 0
    }
}

/// The hops, in the order of [`HOPS`].
pub const HOPS: [&str; 7] =
    ["events_broker_ms", "ingest_hookline_ms", "deliveries_broker_ms", "dispatcher_hookline_ms", "http_ms", "broker_ms", "hookline_ms"];

/// One event's hops (µs), in the order of [`HOPS`]: the two broker waits, ingest's and the dispatcher's own time,
/// the HTTP hop, then the broker's and hookline's sums. `None` when a stamp is missing (a service that does not
/// stamp, e.g. an older build in an A/B run, or a record the reader did not see): such an event is counted as
/// missing, never as a hop of 0. A stamp earlier than the one before it (the wall clock stepped back) gives 0.
pub fn hops(published_us: i64, s: &Stamps, arrival_us: i64) -> Option<[i64; 7]> {
    if published_us <= 0 || arrival_us <= 0 || !s.complete() {
        return None;
    }
    let d = |from: i64, to: i64| to.saturating_sub(from).max(0);
    let events_broker = d(published_us, s.fanout_received_us);
    let ingest = d(s.fanout_received_us, s.fanout_produced_us);
    let deliveries_broker = d(s.fanout_produced_us, s.dispatcher_received_us);
    let dispatcher = d(s.dispatcher_received_us, s.started_us);
    let http = d(s.started_us, arrival_us);
    Some([
        events_broker,
        ingest,
        deliveries_broker,
        dispatcher,
        http,
        events_broker.saturating_add(deliveries_broker),
        ingest.saturating_add(dispatcher),
    ])
}

/// The split's JSON: per hop p50/p99/max/mean (ms), how many events matched and how many lacked a stamp.
pub fn summarize(per_event: &[Option<[i64; 7]>]) -> Map<String, Value> {
    let mut cols: [Vec<f64>; 7] = Default::default();
    let mut missing = 0u64;
    for h in per_event {
        match h {
            Some(h) => {
                for (c, us) in cols.iter_mut().zip(h) {
                    c.push(*us as f64 / 1000.0);
                }
            }
            None => missing += 1,
        }
    }
    let mut out = Map::new();
    out.insert("matched".into(), json!(cols[0].len()));
    out.insert("missing_stamps".into(), json!(missing));
    for (name, v) in HOPS.iter().zip(cols) {
        let mean = if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
        let v = sorted(v);
        let max = v.last().copied().unwrap_or(f64::NAN);
        let figure = json!({"p50": round(pct(&v, 50.0), 3), "p99": round(pct(&v, 99.0), 3), "max": round(max, 3), "mean": round(mean, 3)});
        out.insert((*name).into(), figure);
    }
    out
}

#[derive(Clone, Copy)]
enum Kind {
    Deliveries,
    Attempts,
}

/// Reads the services' stamps off `deliveries` and `attempts` while `latency` runs.
pub struct Reader {
    seen: Arc<Mutex<HashMap<String, Stamps>>>,
    stop: CancellationToken,
}

fn unix_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Reader {
    /// Starts reading both topics from their ends; only events whose id starts with `prefix` are kept.
    pub async fn start(cluster: &Cluster, prefix: &'static str) -> anyhow::Result<Reader> {
        let seen: Arc<Mutex<HashMap<String, Stamps>>> = Default::default();
        let stop = CancellationToken::new();
        let topics = cluster.topics();
        let k = &cluster.config.kafka;
        for (kind, topic) in [(Kind::Deliveries, topics.deliveries().to_owned()), (Kind::Attempts, topics.attempts().to_owned())] {
            let mut config = hookline_kafka::client::table_consumer_config(k, &format!("hookline-bench-split-{topic}"))?;
            config.set("enable.partition.eof", "false");
            let consumer: StreamConsumer = config.create()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..k.partitions.max(1) {
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
                    let payload = rdkafka::Message::payload(&m).unwrap_or_default();
                    match kind {
                        Kind::Deliveries => {
                            let Ok(task) = DeliveryTask::decode(payload) else { continue };
                            let Some(id) = task.event.as_ref().map(|e| e.id.as_str()).filter(|id| id.starts_with(prefix)) else { continue };
                            if task.origin != TaskOrigin::Fanout as i32 {
                                continue;
                            }
                            let mut seen = seen.lock().expect("split lock");
                            let s = seen.entry(id.to_owned()).or_default();
                            (s.fanout_received_us, s.fanout_produced_us) = (task.fanout_received_at_us, task.fanout_produced_at_us);
                        }
                        Kind::Attempts => {
                            let Ok(rec) = AttemptRecord::decode(payload) else { continue };
                            if rec.attempt != 1
                                || rec.r#try != 1
                                || rec.phase != AttemptPhase::Finished as i32
                                || !rec.event_id.starts_with(prefix)
                            {
                                continue;
                            }
                            let mut seen = seen.lock().expect("split lock");
                            let s = seen.entry(rec.event_id).or_default();
                            (s.dispatcher_received_us, s.started_us) = (rec.received_at_us, rec.started_at_us);
                        }
                    }
                }
            });
        }
        Ok(Reader { seen, stop })
    }

    /// The hops of every arrived event whose id is `prefix{i}`, published at `published_unix_us[i]`; waits up to
    /// 5 s for the reader to have read the last records.
    pub async fn report(self, prefix: &str, published_unix_us: &[i64], arrivals: &[Arrival]) -> Map<String, Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let done = {
                let seen = self.seen.lock().expect("split lock");
                arrivals.iter().filter(|a| seen.get(&a.id).is_some_and(|s| s.fanout_produced_us != 0 || s.started_us != 0)).count()
            };
            if done >= arrivals.len() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop.cancel();
        let seen = self.seen.lock().expect("split lock");
        let mut firsts = std::collections::HashSet::new();
        let per_event: Vec<_> = arrivals
            .iter()
            .filter_map(|a| {
                let i = a.id.strip_prefix(prefix).and_then(|s| s.parse::<usize>().ok())?;
                let published = *published_unix_us.get(i)?;
                firsts.insert(i).then(|| hops(published, &seen.get(&a.id).copied().unwrap_or_default(), a.unix_us))
            })
            .collect();
        summarize(&per_event)
    }
}

/// µs since the epoch now, as the split's publish times are taken.
pub fn now_unix_us() -> i64 {
    unix_us()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAMPS: Stamps =
        Stamps { fanout_received_us: 1_500, fanout_produced_us: 1_620, dispatcher_received_us: 4_000, started_us: 4_250 };

    #[test]
    fn each_hop_is_the_difference_of_its_stamps() {
        let h = hops(1_000, &STAMPS, 5_000).expect("complete");
        // events broker 500, ingest 120, deliveries broker 2380, dispatcher 250, HTTP 750; sums 2880 and 370.
        assert_eq!(h, [500, 120, 2_380, 250, 750, 2_880, 370]);
        assert_eq!(h.iter().take(5).sum::<i64>(), 5_000 - 1_000, "the five hops add up to publish → arrival");
    }

    #[test]
    fn a_missing_stamp_makes_the_event_missing_not_zero() {
        for s in [
            Stamps { fanout_received_us: 0, ..STAMPS },
            Stamps { fanout_produced_us: 0, ..STAMPS },
            Stamps { dispatcher_received_us: 0, ..STAMPS },
            Stamps { started_us: 0, ..STAMPS },
        ] {
            assert_eq!(hops(1_000, &s, 5_000), None, "{s:?}");
        }
        assert_eq!(hops(0, &STAMPS, 5_000), None);
        assert_eq!(hops(1_000, &STAMPS, 0), None);
        let m = summarize(&[hops(1_000, &STAMPS, 5_000), hops(1_000, &Stamps::default(), 5_000)]);
        assert_eq!(m["matched"], json!(1));
        assert_eq!(m["missing_stamps"], json!(1));
        assert_eq!(m["ingest_hookline_ms"]["p99"], json!(0.12));
        assert_eq!(m["ingest_hookline_ms"]["max"], json!(0.12));
    }

    #[test]
    fn stamps_out_of_order_or_extreme_saturate_at_zero_and_never_wrap() {
        let back = Stamps { dispatcher_received_us: 1_000, ..STAMPS };
        assert_eq!(hops(1_000, &back, 5_000).expect("complete")[2], 0, "the clock stepped back: 0, not negative");
        let far = Stamps { started_us: i64::MAX, ..STAMPS };
        let h = hops(1, &far, 2).expect("complete");
        assert_eq!(h[3], i64::MAX - 4_000);
        assert_eq!(h[4], 0);
        let huge =
            Stamps { fanout_received_us: i64::MAX, fanout_produced_us: i64::MAX, dispatcher_received_us: i64::MAX, started_us: i64::MAX };
        let h = hops(1, &huge, i64::MAX).expect("complete");
        assert_eq!(h[5], i64::MAX - 1, "the broker's sum stays in range");
    }

    #[test]
    fn percentiles_are_per_hop_over_the_matched_events() {
        let events: Vec<_> = (1..=100).map(|k| hops(1_000, &Stamps { fanout_produced_us: 1_500 + k * 10, ..STAMPS }, 5_000)).collect();
        let m = summarize(&events);
        assert_eq!(m["matched"], json!(100));
        assert_eq!(m["missing_stamps"], json!(0));
        assert_eq!(m["ingest_hookline_ms"]["p50"], json!(0.5));
        assert_eq!(m["ingest_hookline_ms"]["p99"], json!(0.99));
        assert_eq!(m["ingest_hookline_ms"]["max"], json!(1.0));
        let none = summarize(&[None]);
        assert!(none["http_ms"]["p99"].is_null(), "no matched event: no figure (NaN → null), not 0");
    }
}
