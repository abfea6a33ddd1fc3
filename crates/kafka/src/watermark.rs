//! Per-partition completion tracking: records complete out of order, and the offset that may be committed is the
//! contiguous completed watermark (the lowest offset still in flight, or one past the highest seen).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

#[derive(Debug, Default)]
struct Partition {
    in_flight: BTreeSet<i64>,
    /// One past the highest offset ever started.
    next: Option<i64>,
}

/// Watermarks for every (topic, partition) a consumer reads. By topic, then partition: a lookup (one per record
/// started and completed) allocates nothing.
#[derive(Debug, Default)]
pub struct Watermarks {
    topics: HashMap<String, HashMap<i32, Partition>>,
}

impl Watermarks {
    pub fn new() -> Self {
        Self::default()
    }

    /// A record was taken into work.
    pub fn start(&mut self, topic: &str, partition: i32, offset: i64) {
        let parts = match self.topics.get_mut(topic) {
            Some(parts) => parts,
            None => self.topics.entry(topic.to_owned()).or_default(),
        };
        let p = parts.entry(partition).or_default();
        p.in_flight.insert(offset);
        p.next = Some(p.next.map_or(offset + 1, |n| n.max(offset + 1)));
    }

    /// A record's outcome is durable. Returns the new committable offset (the next offset to consume) when the
    /// watermark moved.
    pub fn complete(&mut self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        let p = self.topics.get_mut(topic)?.get_mut(&partition)?;
        let before = Self::mark(p);
        if !p.in_flight.remove(&offset) {
            return None;
        }
        let after = Self::mark(p);
        (after != before).then_some(after).flatten()
    }

    /// The committable offset for a partition.
    pub fn committable(&self, topic: &str, partition: i32) -> Option<i64> {
        self.get(topic, partition).and_then(Self::mark)
    }

    pub fn in_flight(&self, topic: &str, partition: i32) -> usize {
        self.get(topic, partition).map_or(0, |p| p.in_flight.len())
    }

    pub fn total_in_flight(&self) -> usize {
        self.topics.values().flat_map(HashMap::values).map(|p| p.in_flight.len()).sum()
    }

    /// Forget a partition (revoked): its uncommitted records will be read again by the next owner.
    pub fn forget(&mut self, topic: &str, partition: i32) {
        if let Some(parts) = self.topics.get_mut(topic) {
            parts.remove(&partition);
        }
    }

    fn get(&self, topic: &str, partition: i32) -> Option<&Partition> {
        self.topics.get(topic)?.get(&partition)
    }

    fn mark(p: &Partition) -> Option<i64> {
        p.in_flight.first().copied().or(p.next)
    }
}

/// Stores committable offsets (each the next offset to consume) for the next auto-commit, in one call. Fails
/// harmlessly for a partition revoked meanwhile: its next owner re-reads from the last commit. A list that fails as
/// a whole is stored partition by partition, so one revoked partition does not hold back the others.
pub fn store_all<C: Consumer<X>, X: ConsumerContext, T: AsRef<str>>(consumer: &C, offsets: &[(T, i32, i64)]) {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for (topic, partition, offset) in offsets {
        let _ = tpl.add_partition_offset(topic.as_ref(), *partition, Offset::Offset(*offset));
    }
    if tpl.count() == 0 || consumer.store_offsets(&tpl).is_ok() {
        return;
    }
    for (topic, partition, offset) in offsets {
        let mut one = TopicPartitionList::with_capacity(1);
        if one.add_partition_offset(topic.as_ref(), *partition, Offset::Offset(*offset)).is_ok() {
            if let Err(e) = consumer.store_offsets(&one) {
                tracing::debug!(topic = topic.as_ref(), partition, offset, error = %e, "offset not stored (partition revoked?)");
            }
        }
    }
}

/// Watermarks shared by the tasks that complete records and a rebalance callback that waits for a revoked
/// partition's records in flight before committing it (see `rebalance::RevokeDrain`). Completing wakes waiters,
/// and only when there are some: a `notify_all` is a futex syscall, and nobody waits outside a revoke.
#[derive(Debug, Default)]
pub struct SharedWatermarks {
    marks: Mutex<Watermarks>,
    changed: Condvar,
    /// Threads in [`SharedWatermarks::wait_drained`]; counted under `marks`, so a completion that takes the lock
    /// after a waiter registered sees it, and one before it is seen by the waiter's own check.
    waiters: AtomicUsize,
}

impl SharedWatermarks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watermarks> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn start(&self, topic: &str, partition: i32, offset: i64) {
        self.lock().start(topic, partition, offset);
    }

    /// Returns the new committable offset when the watermark moved.
    pub fn complete(&self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        let (moved, waited) = {
            let mut marks = self.lock();
            (marks.complete(topic, partition, offset), self.waiters.load(Ordering::Relaxed) > 0)
        };
        if waited {
            self.changed.notify_all();
        }
        moved
    }

    pub fn committable(&self, topic: &str, partition: i32) -> Option<i64> {
        self.lock().committable(topic, partition)
    }

    /// The committable offsets of these partitions (those known), under one lock.
    pub fn committable_of<'a>(&self, parts: impl Iterator<Item = (&'a str, i32)>) -> Vec<(&'a str, i32, i64)> {
        let marks = self.lock();
        parts.filter_map(|(t, p)| marks.committable(t, p).map(|w| (t, p, w))).collect()
    }

    pub fn total_in_flight(&self) -> usize {
        self.lock().total_in_flight()
    }

    pub fn forget(&self, topic: &str, partition: i32) {
        self.lock().forget(topic, partition);
        self.changed.notify_all();
    }

    /// Blocks until none of `partitions` has a record in flight, or `limit` passes; returns each partition's
    /// committable offset at that moment (partitions never read are left out).
    pub fn wait_drained(&self, topic: &str, partitions: &[i32], limit: Duration) -> Vec<(i32, i64)> {
        let deadline = Instant::now() + limit;
        let mut marks = self.lock();
        self.waiters.fetch_add(1, Ordering::Relaxed);
        loop {
            let busy = partitions.iter().any(|p| marks.in_flight(topic, *p) > 0);
            let left = deadline.saturating_duration_since(Instant::now());
            if !busy || left.is_zero() {
                self.waiters.fetch_sub(1, Ordering::Relaxed);
                return partitions.iter().filter_map(|p| marks.committable(topic, *p).map(|w| (*p, w))).collect();
            }
            marks = self.changed.wait_timeout(marks, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoke_drain_waits_for_the_partitions_in_flight_and_no_longer_than_its_limit() {
        let marks = std::sync::Arc::new(SharedWatermarks::default());
        for o in 0..3 {
            marks.start("t", 0, o);
        }
        marks.start("t", 1, 40);
        let m = marks.clone();
        let finisher = std::thread::spawn(move || {
            for o in [2, 0, 1] {
                m.complete("t", 0, o);
            }
        });
        assert_eq!(marks.wait_drained("t", &[0], Duration::from_secs(30)), vec![(0, 3)], "every offset of partition 0 done");
        finisher.join().unwrap();
        // Partition 1 never completes: the wait ends at its limit with the watermark below the stuck record.
        assert_eq!(marks.wait_drained("t", &[1, 7], Duration::from_millis(1)), vec![(1, 40)]);
    }

    #[test]
    fn watermark_waits_for_the_lowest_in_flight_offset() {
        let mut w = Watermarks::new();
        for o in 10..15 {
            w.start("t", 0, o);
        }
        assert_eq!(w.committable("t", 0), Some(10));
        assert_eq!(w.complete("t", 0, 12), None, "a gap below keeps the watermark");
        assert_eq!(w.complete("t", 0, 11), None);
        assert_eq!(w.complete("t", 0, 10), Some(13), "moves past every completed offset");
        assert_eq!(w.complete("t", 0, 14), None);
        assert_eq!(w.complete("t", 0, 13), Some(15));
        assert_eq!(w.in_flight("t", 0), 0);
    }

    #[test]
    fn partitions_are_independent_and_unknown_completions_are_ignored() {
        let mut w = Watermarks::new();
        w.start("t", 0, 5);
        w.start("t", 1, 7);
        assert_eq!(w.complete("t", 1, 7), Some(8));
        assert_eq!(w.committable("t", 0), Some(5));
        assert_eq!(w.complete("t", 0, 99), None);
        assert_eq!(w.complete("other", 0, 5), None);
        w.forget("t", 0);
        assert_eq!(w.committable("t", 0), None);
        assert_eq!(w.total_in_flight(), 0);
    }
}
