//! Leases of attempts in flight, for policies with `in_flight = "count"` (LuciBook's in-flight reaper). Before an
//! attempt, the dispatcher writes a lease to `inflight` (key = delivery id, the delivery's own partition) and waits
//! for the acknowledgement; after the attempt's outcome is written, a tombstone removes it. A dispatcher taking
//! over a partition reads the partition's leases: a redelivered task whose attempt has a lease was in flight when
//! its dispatcher died, so that attempt counts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hookline_core::model::{AttemptPhase, AttemptRecord};
use hookline_kafka::scan::{scan_partitions, ScanError};
use hookline_kafka::KafkaSettings;
use prost::Message as _;
use rdkafka::Message;

/// An attempt found in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The attempt's number counted across redeliveries (`prior_attempts + attempt`).
    pub attempt: u32,
    pub started_at_ms: i64,
}

#[derive(Default)]
pub struct Leases {
    /// By delivery id: the lease and the partition it was read from (forgotten with the partition).
    found: Mutex<HashMap<String, (Lease, i32)>>,
}

impl Leases {
    /// Reads the partition's live leases (what earlier owners left in flight).
    pub async fn load(&self, kafka: &KafkaSettings, topic: &str, partition: i32) -> Result<usize, ScanError> {
        let mut live: HashMap<String, Lease> = HashMap::new();
        scan_partitions(kafka, topic, Some(partition), None, Duration::from_secs(60), |m| {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            match m.payload().filter(|v| !v.is_empty()).map(AttemptRecord::decode) {
                None => {
                    live.remove(&key);
                }
                Some(Ok(r)) if r.phase == AttemptPhase::Started as i32 => {
                    live.insert(key, Lease { attempt: r.attempt, started_at_ms: r.started_at_ms });
                }
                _ => {}
            }
        })
        .await?;
        let n = live.len();
        self.found.lock().expect("leases lock").extend(live.into_iter().map(|(k, l)| (k, (l, partition))));
        Ok(n)
    }

    /// The lease an earlier owner left for this attempt of this delivery, if any (taken: it is acted on once). A
    /// lease for another attempt stays for the task of that attempt.
    pub fn take(&self, delivery_id: &str, attempt: u32) -> Option<Lease> {
        let mut found = self.found.lock().expect("leases lock");
        match found.get(delivery_id) {
            Some((l, _)) if l.attempt == attempt => found.remove(delivery_id).map(|(l, _)| l),
            _ => None,
        }
    }

    /// A partition was revoked: its leases are its next owner's to act on, not this process's to keep.
    pub fn forget_partition(&self, partition: i32) -> usize {
        let mut found = self.found.lock().expect("leases lock");
        let before = found.len();
        found.retain(|_, (_, p)| *p != partition);
        before - found.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_taken_only_by_the_task_of_its_attempt() {
        let leases = Leases::default();
        leases.found.lock().unwrap().insert("dlv_1".into(), (Lease { attempt: 2, started_at_ms: 5 }, 0));
        assert_eq!(leases.take("dlv_1", 1), None, "a redone attempt 1 leaves attempt 2's lease");
        assert_eq!(leases.take("dlv_1", 2), Some(Lease { attempt: 2, started_at_ms: 5 }));
        assert_eq!(leases.take("dlv_1", 2), None, "acted on once");
    }

    #[test]
    fn a_revoked_partitions_leases_are_forgotten_and_only_its() {
        let leases = Leases::default();
        leases.found.lock().unwrap().insert("dlv_a".into(), (Lease { attempt: 1, started_at_ms: 5 }, 3));
        leases.found.lock().unwrap().insert("dlv_b".into(), (Lease { attempt: 1, started_at_ms: 5 }, 4));
        assert_eq!(leases.forget_partition(3), 1);
        assert_eq!(leases.take("dlv_a", 1), None, "partition 3's lease is gone");
        assert!(leases.take("dlv_b", 1).is_some(), "partition 4's lease stays");
    }
}
