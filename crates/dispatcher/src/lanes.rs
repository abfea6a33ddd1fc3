//! Per-subscription concurrency caps: a slow or hanging endpoint holds at most its own lane's permits, so other
//! subscriptions on the same partition keep flowing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Lanes {
    per_subscription: usize,
    lanes: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Lanes {
    pub fn new(per_subscription: usize) -> Self {
        Self { per_subscription, lanes: Mutex::new(HashMap::new()) }
    }

    /// Waits for a free slot in the subscription's lane.
    pub async fn acquire(&self, subscription_id: &str) -> OwnedSemaphorePermit {
        let lane = {
            let mut lanes = self.lanes.lock().expect("lanes lock");
            match lanes.get(subscription_id) {
                Some(l) => l.clone(),
                None => {
                    let l = Arc::new(Semaphore::new(self.per_subscription));
                    lanes.insert(subscription_id.to_owned(), l.clone());
                    l
                }
            }
        };
        lane.acquire_owned().await.expect("lane semaphores are never closed")
    }

    /// Requests currently waiting or running in a subscription's lane beyond its cap.
    pub fn busy(&self, subscription_id: &str) -> usize {
        self.lanes
            .lock()
            .expect("lanes lock")
            .get(subscription_id)
            .map_or(0, |l| self.per_subscription - l.available_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_lane_does_not_block_another() {
        let lanes = Lanes::new(2);
        let _a1 = lanes.acquire("a").await;
        let _a2 = lanes.acquire("a").await;
        assert_eq!(lanes.busy("a"), 2);
        // "a" is full; "b" still gets a slot at once.
        let b = tokio::time::timeout(std::time::Duration::from_secs(1), lanes.acquire("b")).await;
        assert!(b.is_ok());
        let blocked = tokio::time::timeout(std::time::Duration::from_millis(20), lanes.acquire("a")).await;
        assert!(blocked.is_err(), "a third request to a full lane waits");
    }
}
