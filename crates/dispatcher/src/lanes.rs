//! Per-subscription lanes: each subscription's deliveries run at most `cap` at a time, in the order they were
//! read from the partition; a slow or hanging endpoint fills only its own lane, so other subscriptions on the
//! same partition keep flowing. Waiting work is a queued closure that builds its future only when it runs, so a
//! deep backlog behind a hanging endpoint costs the task's own size, not a delivery's whole state machine.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;

/// Work for a lane: called when a slot is free.
pub type Job = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

struct Lane {
    running: usize,
    queue: VecDeque<Job>,
    /// When a job of this lane last finished (or the lane was created).
    last_done: Instant,
    /// Smoothed time between finished jobs: with the depth, how long the lane needs to drain.
    interval: Option<Duration>,
}

pub struct Lanes {
    cap: usize,
    lanes: Mutex<HashMap<String, Lane>>,
}

impl Lanes {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self { cap: cap.max(1), lanes: Mutex::new(HashMap::new()) })
    }

    /// Runs `job` in `key`'s lane: now if the lane has room, otherwise after the jobs queued before it.
    pub fn submit(self: &Arc<Self>, key: &str, job: Job) {
        {
            let mut lanes = self.lanes.lock().expect("lanes lock");
            let lane = match lanes.get_mut(key) {
                Some(l) => l,
                None => lanes
                    .entry(key.to_owned())
                    .or_insert_with(|| Lane { running: 0, queue: VecDeque::new(), last_done: Instant::now(), interval: None }),
            };
            if lane.running >= self.cap {
                lane.queue.push_back(job);
                return;
            }
            lane.running += 1;
        }
        let lanes = self.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            let mut job = job;
            loop {
                job().await;
                let mut all = lanes.lanes.lock().expect("lanes lock");
                let Some(lane) = all.get_mut(&key) else { return };
                let now = Instant::now();
                let dt = now - lane.last_done;
                lane.interval = Some(lane.interval.map_or(dt, |i| (i * 4 + dt) / 5));
                lane.last_done = now;
                match lane.queue.pop_front() {
                    Some(next) => job = next,
                    None => {
                        lane.running -= 1;
                        if lane.running == 0 {
                            all.remove(&key);
                        }
                        return;
                    }
                }
            }
        });
    }

    /// Whether a lane holds at least `max_depth` jobs and would need longer than `drain` to finish them at the pace
    /// it has been finishing jobs (or has finished none for that long): its endpoint hangs or is far too slow for
    /// its load, so new work for it should wait elsewhere. A deep lane that drains quickly is just busy.
    pub fn is_stuck(&self, key: &str, max_depth: usize, drain: Duration) -> bool {
        let lanes = self.lanes.lock().expect("lanes lock");
        let Some(l) = lanes.get(key) else { return false };
        let depth = l.running + l.queue.len();
        if depth < max_depth {
            return false;
        }
        let since = l.last_done.elapsed();
        let pace = l.interval.map_or(since, |i| i.max(since));
        since >= drain || pace.saturating_mul(u32::try_from(depth).unwrap_or(u32::MAX)) >= drain
    }

    /// Jobs running or waiting in a lane.
    pub fn depth(&self, key: &str) -> usize {
        self.lanes.lock().expect("lanes lock").get(key).map_or(0, |l| l.running + l.queue.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::{mpsc, oneshot};

    #[tokio::test]
    async fn a_full_lane_queues_in_order_and_does_not_block_another() {
        let lanes = Lanes::new(1);
        let (order_tx, mut order_rx) = mpsc::unbounded_channel();
        let (release_tx, release_rx) = oneshot::channel::<()>();
        // "a" is held by a job that waits; two more queue behind it.
        let submit = |key: &str, job: BoxFuture<'static, ()>| lanes.submit(key, Box::new(move || job));
        let tx = order_tx.clone();
        submit("a", Box::pin(async move {
            let _ = release_rx.await;
            tx.send("a1").unwrap();
        }));
        for name in ["a2", "a3"] {
            let tx = order_tx.clone();
            submit("a", Box::pin(async move { tx.send(name).unwrap() }));
        }
        let tx = order_tx.clone();
        submit("b", Box::pin(async move { tx.send("b1").unwrap() }));
        let first = tokio::time::timeout(Duration::from_secs(1), order_rx.recv()).await.unwrap();
        assert_eq!(first, Some("b1"), "another lane runs while `a` is full");
        assert_eq!(lanes.depth("a"), 3);
        release_tx.send(()).unwrap();
        let mut rest = Vec::new();
        for _ in 0..3 {
            rest.push(order_rx.recv().await.unwrap());
        }
        assert_eq!(rest, ["a1", "a2", "a3"], "a lane keeps the order jobs were submitted in");
        tokio::task::yield_now().await;
        assert_eq!(lanes.depth("a"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deep_lane_is_stuck_when_it_cannot_drain_in_time() {
        let lanes = Lanes::new(1);
        let (first_tx, first_rx) = oneshot::channel::<()>();
        lanes.submit("a", Box::new(move || Box::pin(async move {
            let _ = first_rx.await;
        })));
        lanes.submit("a", Box::new(|| Box::pin(std::future::pending())));
        assert!(!lanes.is_stuck("a", 2, Duration::from_secs(1)), "deep, but only just started");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(lanes.is_stuck("a", 2, Duration::from_secs(1)), "deep and nothing finished for 2 s");
        assert!(!lanes.is_stuck("a", 3, Duration::from_secs(1)), "not at the depth");
        // The first job finishes after 2 s: at that pace the one left takes ~2 s more.
        first_tx.send(()).unwrap();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(lanes.depth("a"), 1);
        assert!(lanes.is_stuck("a", 1, Duration::from_secs(1)), "too slow to drain in 1 s");
        assert!(!lanes.is_stuck("a", 1, Duration::from_secs(3)), "drains within 3 s");
    }
}
