//! Records the indexer never read because Kafka no longer had them: its fetch position fell off the start of a
//! partition (retention shorter than the indexer's lag; the embedded broker keeps ~5 MiB a partition) and the
//! consumer's reset to the earliest offset jumped over them. The log's topics are neither compacted nor
//! transactional, so their offsets are contiguous: a jump forward between two records read in a row is a loss.

use std::collections::HashMap;
use std::hash::Hash;

/// The next offset expected per partition, since the last rebalance (bounded by the partitions assigned).
#[derive(Debug)]
pub struct Gaps<K> {
    next: HashMap<K, i64>,
}

impl<K> Default for Gaps<K> {
    fn default() -> Self {
        Self { next: HashMap::new() }
    }
}

impl<K: Hash + Eq> Gaps<K> {
    /// How many records of `partition` were skipped just before this one at `offset`: 0 for the next one in line, a
    /// re-read, or the first record read since the last rebalance (where reading starts is the group's to say).
    pub fn lost_before(&mut self, partition: K, offset: i64) -> u64 {
        let expected = self.next.insert(partition, offset.saturating_add(1));
        expected.map_or(0, |e| u64::try_from(offset.saturating_sub(e)).unwrap_or(0))
    }

    /// After a rebalance a partition may resume where another member left it: start over.
    pub fn forget(&mut self) {
        self.next.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_jump_forward_within_a_partition_counts_as_lost() {
        let mut g = Gaps::default();
        assert_eq!(g.lost_before(0, 100), 0, "the first record read says nothing");
        assert_eq!(g.lost_before(0, 101), 0);
        assert_eq!(g.lost_before(1, 7), 0, "partitions are apart");
        assert_eq!(g.lost_before(0, 150), 48, "102..=149 were never read");
        assert_eq!(g.lost_before(0, 120), 0, "a re-read is not a loss");
        assert_eq!(g.lost_before(0, 121), 0);
        g.forget();
        assert_eq!(g.lost_before(0, 500), 0, "after a rebalance reading starts wherever the group says");
        assert_eq!(g.lost_before(0, i64::MAX), u64::try_from(i64::MAX - 501).unwrap());
        assert_eq!(g.lost_before(0, i64::MIN), 0, "no overflow either way");
    }
}
