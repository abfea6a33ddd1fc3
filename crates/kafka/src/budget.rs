//! How much work a consumer loop has taken and not finished, and when to pause its partitions. A loop never
//! waits for room before polling (a consumer that stops polling holds up every rebalance of its group and can be
//! evicted while it still sends): it takes every record it is given, pauses its partitions when the budget is
//! spent and resumes them when enough is finished. So the cap can be passed by what was already fetched.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use tokio::sync::Notify;

/// Pauses or resumes fetching from every partition assigned to `consumer` (which is polled all the same).
/// Partitions assigned later start unpaused: pause again after an assignment.
pub fn set_paused<C: ConsumerContext, K: Consumer<C>>(consumer: &K, pause: bool) -> KafkaResult<()> {
    let assigned = consumer.assignment()?;
    if pause {
        consumer.pause(&assigned)
    } else {
        consumer.resume(&assigned)
    }
}

pub struct Budget {
    cap: usize,
    used: AtomicUsize,
    freed: Notify,
}

/// Units of a [`Budget`] held by one piece of work; given back when dropped.
pub struct Charge {
    budget: Arc<Budget>,
    units: usize,
}

impl Budget {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self { cap: cap.max(1), used: AtomicUsize::new(0), freed: Notify::new() })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Takes `units` (at least 1) whatever is left: the work is already in hand.
    pub fn take(self: &Arc<Self>, units: usize) -> Charge {
        let units = units.max(1);
        self.used.fetch_add(units, Ordering::AcqRel);
        Charge { budget: self.clone(), units }
    }

    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Whether the loop should pause its partitions.
    pub fn is_spent(&self) -> bool {
        self.in_use() >= self.cap
    }

    /// The level at which a paused loop resumes: a quarter of the cap free (always below the cap), so that it does
    /// not pause and resume, dropping what was prefetched, at every completion.
    pub fn resume_level(&self) -> usize {
        self.cap - self.cap.div_ceil(4)
    }

    /// Waits until at most `level` units are in use.
    pub async fn at_most(&self, level: usize) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a release between the check and the wait is not missed.
            freed.as_mut().enable();
            if self.in_use() <= level {
                return;
            }
            freed.await;
        }
    }
}

impl Charge {
    /// Takes `units` more for the same work (known only once the record is read, e.g. its fan-out).
    pub fn add(&mut self, units: usize) {
        self.budget.used.fetch_add(units, Ordering::AcqRel);
        self.units = self.units.saturating_add(units);
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.units, Ordering::AcqRel);
        self.budget.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_in_hand_is_always_taken_and_spends_the_budget() {
        let b = Budget::new(3);
        let charges: Vec<Charge> = (0..4).map(|_| b.take(1)).collect();
        assert_eq!(b.in_use(), 4, "past the cap: records already fetched are taken");
        assert!(b.is_spent());
        drop(charges);
        assert_eq!(b.in_use(), 0);
        assert!(!b.is_spent());
        let big = b.take(0);
        assert_eq!(b.in_use(), 1, "a unit at least");
        drop(big);
    }

    #[test]
    fn a_paused_loop_resumes_with_a_quarter_free() {
        assert_eq!(Budget::new(1000).resume_level(), 750);
        assert_eq!(Budget::new(4).resume_level(), 3);
        assert_eq!(Budget::new(2).resume_level(), 1);
        assert_eq!(Budget::new(1).resume_level(), 0, "below the cap, or it would resume as soon as it paused");
    }

    #[tokio::test]
    async fn at_most_wakes_when_enough_is_given_back() {
        let b = Budget::new(4);
        let mut held: Vec<Charge> = (0..4).map(|_| b.take(1)).collect();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.at_most(2).await }
        });
        tokio::task::yield_now().await;
        held.pop();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "3 in use is not at most 2");
        held.pop();
        waiter.await.unwrap();
        b.at_most(2).await;
    }
}
