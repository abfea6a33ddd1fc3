//! Which attempts already have their outcome written, so a task that comes back for one of them is not sent again.
//!
//! At-least-once redoes work: after a rebalance the next owner starts from the last committed offset, and a
//! restarted ingest or retry-scheduler can produce the same task twice. Without this, each redo of attempt n also
//! schedules attempt n+1 again, and the copies multiply down the retry ladder. An attempt's outcome is written in
//! this order: retry or dead letter, follow-ups and endpoint state first, the attempt record last (marked with
//! `concludes_attempt`). So an attempt record means everything the attempt had to produce is durable, and a task
//! for that attempt can be acknowledged without a request.
//!
//! The ledger learns outcomes two ways: the ones this dispatcher writes, and, when it is assigned a partition, the
//! ones earlier owners wrote to that partition of `attempts` within the window. A key is (delivery, run, attempt);
//! a replay is a new run, so it is never mistaken for a redo. Keys are 128-bit hashes with per-process random keys:
//! a collision (which would skip a delivery) has odds of about entries / 2^128.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use hookline_core::model::AttemptRecord;
use hookline_kafka::scan::{scan_partitions, ScanError};
use hookline_kafka::KafkaSettings;
use prost::Message as _;
use rdkafka::Message as _;
use tokio::sync::Notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u128);

/// What a task finds when it claims its attempt.
pub enum Claim {
    /// The attempt's outcome is already written: acknowledge the task without sending.
    Concluded,
    /// This task runs the attempt; the claim is released when dropped (a copy waiting for it then looks again).
    Run(RunGuard),
}

pub struct OutcomeLedger {
    hashers: (RandomState, RandomState),
    /// Sharded by key: every delivery claims, concludes and releases its attempt here (three locks), and one lock
    /// for the whole process would be taken by every worker thread in turn. A power of two in number.
    shards: Box<[Mutex<Inner>]>,
    window_ms: i64,
    /// The cap of each shard: `dedupe_max_entries` split evenly (keys are uniform, so the shards fill alike).
    max_entries: usize,
}

/// Shards of a ledger with room for at least this many entries each; a smaller ledger has one (its cap exact).
const MIN_PER_SHARD: usize = 4_096;
const MAX_SHARDS: usize = 16;

/// Keys are already uniform random hashes: the maps use their low bits as they are instead of hashing them again.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `Key` (it hashes as one u128); kept correct for any other input.
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type KeyState = BuildHasherDefault<KeyHasher>;

#[derive(Default)]
struct Inner {
    concluded: HashSet<Key, KeyState>,
    /// Insertion order, for expiry and the entry cap.
    order: VecDeque<(i64, Key)>,
    /// Attempts being run now, and how a copy of the same task waits for the run to end (made only when a copy
    /// waits: the common case allocates nothing).
    running: HashMap<Key, Option<Arc<Notify>>, KeyState>,
}

impl OutcomeLedger {
    /// `window_ms` = 0 turns the ledger off: every task runs.
    pub fn new(window_ms: u64, max_entries: usize) -> Arc<Self> {
        let shards = (max_entries / MIN_PER_SHARD).clamp(1, MAX_SHARDS);
        // A power of two, so that a shard is picked by a mask.
        let shards = if shards.is_power_of_two() { shards } else { shards.next_power_of_two() / 2 };
        Arc::new(OutcomeLedger {
            hashers: (RandomState::new(), RandomState::new()),
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            window_ms: i64::try_from(window_ms).unwrap_or(i64::MAX),
            max_entries: max_entries / shards,
        })
    }

    pub fn enabled(&self) -> bool {
        self.window_ms > 0 && self.max_entries > 0
    }

    /// The key's shard, by its high bits (the maps inside use the low ones).
    fn shard(&self, key: Key) -> std::sync::MutexGuard<'_, Inner> {
        let i = ((key.0 >> 64) as usize) & (self.shards.len() - 1);
        self.shards[i].lock().expect("outcome ledger lock")
    }

    pub fn key(&self, delivery_id: &str, run_id: &str, attempt: u32) -> Key {
        let parts = (delivery_id, run_id, attempt);
        Key((u128::from(self.hashers.0.hash_one(parts)) << 64) | u128::from(self.hashers.1.hash_one(parts)))
    }

    /// Claims an attempt for this task. If a copy of the task is running the same attempt now, waits for it to
    /// end first, then looks again.
    pub async fn claim(self: &Arc<Self>, key: Key) -> Claim {
        if !self.enabled() {
            return Claim::Run(RunGuard { ledger: None, key });
        }
        loop {
            let notify = {
                let mut inner = self.shard(key);
                if inner.concluded.contains(&key) {
                    return Claim::Concluded;
                }
                match inner.running.get_mut(&key) {
                    Some(waiters) => waiters.get_or_insert_with(|| Arc::new(Notify::new())).clone(),
                    None => {
                        inner.running.insert(key, None);
                        return Claim::Run(RunGuard { ledger: Some(self.clone()), key });
                    }
                }
            };
            let ended = notify.notified();
            tokio::pin!(ended);
            // Registered before the lock is taken again: a release between the two cannot be missed.
            ended.as_mut().enable();
            let still_running = self.shard(key).running.get(&key).is_some_and(|n| n.as_ref().is_some_and(|n| Arc::ptr_eq(n, &notify)));
            if !still_running {
                continue;
            }
            ended.await;
        }
    }

    /// Records that the attempt's outcome is written (at `now_ms`); forgets entries older than the window.
    pub fn concluded(&self, key: Key, now_ms: i64) {
        if !self.enabled() {
            return;
        }
        self.conclude_in(&mut self.shard(key), key, now_ms);
    }

    fn conclude_in(&self, inner: &mut Inner, key: Key, now_ms: i64) {
        if inner.concluded.insert(key) {
            inner.order.push_back((now_ms, key));
        }
        let oldest_kept = now_ms.saturating_sub(self.window_ms);
        while let Some(&(at, k)) = inner.order.front() {
            if at >= oldest_kept && inner.order.len() <= self.max_entries {
                break;
            }
            inner.order.pop_front();
            inner.concluded.remove(&k);
        }
    }

    /// Learns the outcomes earlier owners wrote to one partition of `attempts` within the window (run when the
    /// partition is assigned, before its deliveries start). Returns how many it found.
    pub async fn learn(&self, kafka: &KafkaSettings, topic: &str, partition: i32, now_ms: i64) -> Result<usize, ScanError> {
        if !self.enabled() {
            return Ok(0);
        }
        let mut found = Vec::new();
        let since = now_ms.saturating_sub(self.window_ms);
        scan_partitions(kafka, topic, Some(partition), Some(since), std::time::Duration::from_secs(60), |m| {
            if let Some(Ok(r)) = m.payload().map(AttemptRecord::decode) {
                if r.concludes_attempt > 0 {
                    found.push(self.key(&r.delivery_id, &r.run_id, r.concludes_attempt));
                }
            }
        })
        .await?;
        for k in &found {
            self.concluded(*k, now_ms);
        }
        Ok(found.len())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("outcome ledger lock").concluded.len()).sum()
    }

    fn release(&self, key: Key) {
        // The guard is dropped before waking: the woken copies take the same shard's lock at once.
        let waiting = self.shard(key).running.remove(&key);
        if let Some(Some(n)) = waiting {
            n.notify_waiters();
        }
    }
}

/// Held while a task runs its attempt.
pub struct RunGuard {
    ledger: Option<Arc<OutcomeLedger>>,
    key: Key,
}

impl RunGuard {
    /// The attempt's outcome is written (at `now_ms`): remembered and the claim released under one lock, so a
    /// copy of the task that waited for this run finds it concluded. The key is the claim's, not hashed again.
    pub fn concluded(mut self, now_ms: i64) {
        let Some(ledger) = self.ledger.take() else { return };
        let waiting = {
            let mut inner = ledger.shard(self.key);
            if ledger.enabled() {
                ledger.conclude_in(&mut inner, self.key, now_ms);
            }
            inner.running.remove(&self.key)
        };
        if let Some(Some(n)) = waiting {
            n.notify_waiters();
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Some(l) = &self.ledger {
            l.release(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: Claim) -> RunGuard {
        match c {
            Claim::Run(g) => g,
            Claim::Concluded => panic!("expected to run"),
        }
    }

    #[tokio::test]
    async fn an_attempt_with_a_written_outcome_is_not_run_again() {
        let l = OutcomeLedger::new(60_000, 100);
        let k = l.key("dlv_1", "", 1);
        let g = run(l.claim(k).await);
        l.concluded(g.key, 1_000);
        drop(g);
        assert!(matches!(l.claim(k).await, Claim::Concluded));
        // The next attempt, another delivery and a replay (another run) are not the same attempt.
        for other in [l.key("dlv_1", "", 2), l.key("dlv_2", "", 1), l.key("dlv_1", "run_a", 1)] {
            assert!(matches!(l.claim(other).await, Claim::Run(_)));
        }
    }

    /// The attempt `k` claimed, and a copy of its task waiting for that run (true once it finds it concluded).
    async fn claimed_with_a_waiting_copy(l: &Arc<OutcomeLedger>, k: Key) -> (RunGuard, tokio::task::JoinHandle<bool>) {
        let first = run(l.claim(k).await);
        let copy = tokio::spawn({
            let l = l.clone();
            async move { matches!(l.claim(k).await, Claim::Concluded) }
        });
        tokio::task::yield_now().await;
        assert!(!copy.is_finished(), "the copy waits while the attempt runs");
        (first, copy)
    }

    #[tokio::test]
    async fn a_run_concluded_through_its_guard_is_not_run_again_and_its_waiting_copy_skips_it() {
        let l = OutcomeLedger::new(60_000, 100);
        let k = l.key("dlv_1", "", 1);
        let (first, copy) = claimed_with_a_waiting_copy(&l, k).await;
        first.concluded(1_000);
        assert!(copy.await.unwrap(), "the copy that waited finds the attempt concluded");
        assert!(matches!(l.claim(k).await, Claim::Concluded));
        assert_eq!(l.len(), 1);
    }

    #[tokio::test]
    async fn an_attempt_that_ended_without_an_outcome_runs_again() {
        let l = OutcomeLedger::new(60_000, 100);
        let k = l.key("dlv_1", "", 1);
        drop(run(l.claim(k).await)); // aborted: nothing written
        run(l.claim(k).await);
    }

    #[tokio::test]
    async fn a_copy_waits_for_the_running_attempt_and_then_skips_it() {
        let l = OutcomeLedger::new(60_000, 100);
        let k = l.key("dlv_1", "", 1);
        let (first, copy) = claimed_with_a_waiting_copy(&l, k).await;
        l.concluded(k, 1_000);
        drop(first);
        assert!(copy.await.unwrap(), "the copy found the outcome");
    }

    #[tokio::test]
    async fn a_copy_runs_the_attempt_when_the_first_run_was_aborted() {
        let l = OutcomeLedger::new(60_000, 100);
        let k = l.key("dlv_1", "", 1);
        let first = run(l.claim(k).await);
        let copy = tokio::spawn({
            let l = l.clone();
            async move { matches!(l.claim(k).await, Claim::Run(_)) }
        });
        tokio::task::yield_now().await;
        drop(first);
        assert!(copy.await.unwrap());
    }

    #[tokio::test]
    async fn entries_expire_after_the_window_and_beyond_the_cap() {
        let l = OutcomeLedger::new(10_000, 3);
        let keys: Vec<Key> = (1..=5).map(|a| l.key("dlv", "", a)).collect();
        l.concluded(keys[0], 0);
        l.concluded(keys[1], 5_000);
        l.concluded(keys[2], 12_000); // keys[0] is now older than the window
        assert!(matches!(l.claim(keys[0]).await, Claim::Run(_)));
        assert!(matches!(l.claim(keys[1]).await, Claim::Concluded));
        l.concluded(keys[3], 12_001);
        l.concluded(keys[4], 12_002); // cap 3: keys[1] goes
        assert_eq!(l.len(), 3);
        assert!(matches!(l.claim(keys[1]).await, Claim::Run(_)));
        assert!(matches!(l.claim(keys[4]).await, Claim::Concluded));
    }

    #[tokio::test]
    async fn a_large_ledger_is_sharded_and_keeps_its_cap_and_its_answers() {
        let l = OutcomeLedger::new(60_000, 64 * 1024);
        assert_eq!(l.shards.len(), 16);
        let keys: Vec<Key> = (0..20_000u32).map(|a| l.key("dlv", "", a)).collect();
        for k in &keys {
            l.concluded(*k, 1_000);
        }
        assert_eq!(l.len(), 20_000, "under the cap: every outcome kept");
        for k in keys.iter().step_by(97) {
            assert!(matches!(l.claim(*k).await, Claim::Concluded));
        }
        assert!(matches!(l.claim(l.key("dlv", "", 20_001)).await, Claim::Run(_)));
        for a in 20_000..200_000u32 {
            l.concluded(l.key("dlv", "", a), 1_000);
        }
        assert!(l.len() <= 64 * 1024, "the cap holds across the shards: {}", l.len());
        assert!(l.len() > 60 * 1024, "and each shard fills to its share: {}", l.len());
        // Not a power of two: rounded down.
        assert_eq!(OutcomeLedger::new(1, 3 * MIN_PER_SHARD).shards.len(), 2);
        assert_eq!(OutcomeLedger::new(1, 100).shards.len(), 1);
    }

    #[tokio::test]
    async fn a_zero_window_turns_it_off() {
        let l = OutcomeLedger::new(0, 100);
        let k = l.key("dlv_1", "", 1);
        l.concluded(k, 1);
        let _a = run(l.claim(k).await);
        let _b = run(l.claim(k).await);
    }
}
