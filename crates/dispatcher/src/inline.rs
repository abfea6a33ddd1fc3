//! Starting a task's work on the caller's thread.
//!
//! A lane's job spawned from the consume loop (which runs on the runtime's `block_on` thread, not a worker) waits
//! in tokio's injection queue until a worker thread wakes and polls it; on two cores shared with the broker, the
//! receiver and the other services, that wake-up waits for a CPU, milliseconds at the tail. [`spawn`] polls the
//! future once where it is spawned, so the delivery runs up to its first real wait (the request handed to its
//! connection) at once, and only the rest goes to a worker.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Polls `fut` once here, then (unless it finished) spawns it. The first poll is given a waker that does nothing:
/// a newly spawned task is always polled, and a future registers the waker of its latest poll with what it waits
/// on (the `Future` contract), so a wake-up missed in between is made good by that poll. A panic in the first poll
/// ends that future only, as it would end a spawned task, not the caller (the consume loop).
pub fn spawn<F: Future<Output = ()> + Send + 'static>(fut: F) {
    let mut fut: Pin<Box<F>> = Box::pin(fut);
    let first = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))));
    match first {
        Ok(Poll::Pending) => drop(tokio::spawn(fut)),
        Ok(Poll::Ready(())) => {}
        Err(_) => tracing::error!("a lane's job panicked when it started; it was dropped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn the_work_before_the_first_wait_runs_at_once_and_the_rest_is_woken_on_its_task() {
        let steps = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        let s = steps.clone();
        spawn(async move {
            s.fetch_add(1, Ordering::SeqCst);
            let _ = rx.await;
            s.fetch_add(1, Ordering::SeqCst);
            let _ = done_tx.send(());
        });
        // No yield to the runtime in between: the first step already ran, on this task's thread.
        assert_eq!(steps.load(Ordering::SeqCst), 1);
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), done).await.expect("woken after the move to its own task").unwrap();
        assert_eq!(steps.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_future_that_finishes_in_its_first_poll_is_not_spawned() {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        spawn(async move {
            m.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&n), 1, "the future was dropped once it finished");
    }

    #[tokio::test]
    async fn a_panic_in_the_first_poll_ends_that_future_not_the_caller() {
        spawn(async { panic!("a bug in a job") });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        spawn(async move {
            let _ = tx.send(());
        });
        rx.await.expect("the next job still runs");
    }

    /// A wake-up that comes between the first poll and the task's first poll (the noop waker's) is not lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wake_up_before_the_task_is_polled_is_not_lost() {
        for _ in 0..200 {
            let notify = Arc::new(tokio::sync::Notify::new());
            let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
            let n = notify.clone();
            spawn(async move {
                n.notified().await;
                let _ = done_tx.send(());
            });
            notify.notify_one();
            tokio::time::timeout(Duration::from_secs(10), done).await.expect("not lost").unwrap();
        }
    }
}
