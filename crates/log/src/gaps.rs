//! Records the indexer never read because Kafka no longer had them: its fetch position fell off the start of a
//! partition (retention shorter than the indexer's lag; the embedded broker keeps ~5 MiB a partition) and the
//! consumer's reset to the earliest offset jumped over them. The log's topics are neither compacted nor
//! transactional, so their offsets are contiguous: a jump forward between two records read in a row is a loss.
//!
//! After a restart or a rebalance there is no record read before: there the consumer's offset reset says where it
//! wanted to read (the group's committed offset), and the first record read after it how far it jumped.

use std::collections::HashMap;
use std::hash::Hash;

/// Resets reported before a rebalance the owner has not applied yet, at most: more are dropped (never counted).
const MAX_EARLY_RESETS: usize = 1024;

/// The next offset expected per partition, since the last rebalance (bounded by the partitions assigned).
#[derive(Debug)]
pub struct Gaps<K> {
    next: HashMap<K, i64>,
    /// Rebalances applied (`forget`), to order resets among them.
    rebalances: u64,
    /// Resets reported after rebalances not applied yet: they belong after those.
    early: Vec<(K, i64, u64)>,
}

impl<K> Default for Gaps<K> {
    fn default() -> Self {
        Self { next: HashMap::new(), rebalances: 0, early: Vec::new() }
    }
}

impl<K: Hash + Eq> Gaps<K> {
    /// How many records of `partition` were skipped just before this one at `offset`: 0 for the next one in line, a
    /// re-read, or the first record read since the last rebalance (where reading starts is the group's to say).
    pub fn lost_before(&mut self, partition: K, offset: i64) -> u64 {
        let expected = self.next.insert(partition, offset.saturating_add(1));
        expected.map_or(0, |e| u64::try_from(offset.saturating_sub(e)).unwrap_or(0))
    }

    /// After a rebalance a partition may resume where another member left it: start over. Resets reported after
    /// this rebalance (and before the next) now apply.
    pub fn forget(&mut self) {
        self.next.clear();
        self.rebalances = self.rebalances.saturating_add(1);
        let seen = self.rebalances;
        for (partition, from, after) in std::mem::take(&mut self.early) {
            if after == seen {
                self.next.entry(partition).or_insert(from);
            } else if after > seen {
                self.early.push((partition, from, after));
            }
        }
    }

    /// The consumer could not read `partition` at `from` and moved on to the earliest record the broker has, after
    /// the consumer had reported `after_rebalances` rebalances. Where records were read in a row, their offsets
    /// already say what was skipped (the consumer may have fetched further ahead than it handed over), so the reset
    /// only says where reading should have gone on when nothing was read since the last rebalance. A reset from
    /// before a rebalance already applied is stale (the partition may have been read elsewhere meanwhile): dropped.
    pub fn offset_reset(&mut self, partition: K, from: i64, after_rebalances: u64) {
        if after_rebalances == self.rebalances {
            self.next.entry(partition).or_insert(from);
        } else if after_rebalances > self.rebalances && self.early.len() < MAX_EARLY_RESETS {
            self.early.push((partition, from, after_rebalances));
        }
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

    #[test]
    fn a_reset_after_a_rebalance_counts_from_the_offset_the_broker_no_longer_had() {
        let mut g = Gaps::default();
        g.offset_reset(0, 40, 0);
        assert_eq!(g.lost_before(0, 100), 60, "restarted at the committed 40, read on from 100");
        assert_eq!(g.lost_before(0, 101), 0);
        g.offset_reset(0, 500, 0);
        assert_eq!(g.lost_before(0, 510), 408, "while reading, the records read say it (102..=509), not the fetch position");
        g.offset_reset(1, 7, 0);
        assert_eq!(g.lost_before(1, 7), 0, "a reset that found the same offset skipped nothing");
        g.offset_reset(2, 90, 0);
        assert_eq!(g.lost_before(2, 10), 0, "reset backwards (the topic began again): nothing skipped");
    }

    #[test]
    fn a_reset_counts_only_between_the_rebalances_it_came_between() {
        let mut g = Gaps::default();
        g.offset_reset(0, 10, 1);
        assert_eq!(g.lost_before(0, 50), 0, "a reset after a rebalance not applied yet waits for it");
        g.forget();
        assert_eq!(g.lost_before(0, 50), 40, "applied with the rebalance it followed");
        g.offset_reset(1, 10, 0);
        assert_eq!(g.lost_before(1, 50), 0, "a reset from before the last rebalance is stale");
        g.offset_reset(2, 10, 3);
        g.forget();
        assert_eq!(g.lost_before(2, 50), 0, "two rebalances later, not one");
        g.forget();
        assert_eq!(g.lost_before(2, 50), 40);
        for n in 0..2 * MAX_EARLY_RESETS {
            g.offset_reset(i32::try_from(n).unwrap() + 100, 0, 99);
        }
        assert_eq!(g.early.len(), MAX_EARLY_RESETS, "bounded");
    }
}
