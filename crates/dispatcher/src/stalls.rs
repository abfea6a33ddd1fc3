//! Stalls that are not an endpoint's fault: the broker not acknowledging writes (down, or failing requests), or
//! this process not running (SIGSTOP, a starved host). During one, every lane stops finishing work, so each deep
//! lane's pace says nothing about its endpoint; judging lanes stuck then would park healthy endpoints' work on the
//! retry ladder for up to a minute. Lanes are judged only once `QUIET_AFTER` has passed since the last stall.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// A write outstanding this long without any acknowledgement, or a tick of the freeze detector this late, is a stall.
const STALL: Duration = Duration::from_secs(1);
/// How often the freeze detector ticks.
const TICK: Duration = Duration::from_millis(250);

pub struct Stalls {
    origin: Instant,
    /// Writes awaiting their acknowledgement.
    pending: AtomicUsize,
    /// Last acknowledgement, or when writes became outstanding after none were (ms since `origin`).
    last_progress_ms: AtomicU64,
    /// Last time a stall was seen (ms since `origin`); `u64::MAX` for never.
    last_stall_ms: AtomicU64,
}

impl Stalls {
    pub fn new() -> Arc<Self> {
        Arc::new(Stalls {
            origin: Instant::now(),
            pending: AtomicUsize::new(0),
            last_progress_ms: AtomicU64::new(0),
            last_stall_ms: AtomicU64::new(u64::MAX),
        })
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// A write to the broker starts; the guard is to be dropped when it ends (acknowledged or given up).
    pub fn write(self: &Arc<Self>) -> WriteGuard {
        if self.pending.fetch_add(1, Ordering::AcqRel) == 0 {
            self.last_progress_ms.store(self.ms(Instant::now()), Ordering::Release);
        }
        WriteGuard { stalls: self.clone() }
    }

    /// A write was acknowledged. If nothing was acknowledged for `STALL` before it, that was a stall.
    pub fn acked(&self) {
        let now = self.ms(Instant::now());
        let before = self.last_progress_ms.swap(now, Ordering::AcqRel);
        if now.saturating_sub(before) >= STALL.as_millis() as u64 {
            self.last_stall_ms.store(now, Ordering::Release);
            metrics::counter!("hookline_dispatcher_stalls_total", "cause" => "broker").increment(1);
            tracing::warn!(
                stalled_ms = now.saturating_sub(before),
                "the broker acknowledged no write for a while; lanes are not judged until it settles"
            );
        }
    }

    /// Records a stall seen now (the freeze detector's late tick).
    pub fn stalled(&self) {
        self.last_stall_ms.store(self.ms(Instant::now()), Ordering::Release);
    }

    /// Whether a stall is going on, or ended less than `quiet` ago.
    pub fn within(&self, quiet: Duration) -> bool {
        let now = self.ms(Instant::now());
        let progress = self.last_progress_ms.load(Ordering::Acquire);
        if self.pending.load(Ordering::Acquire) > 0 && now.saturating_sub(progress) >= STALL.as_millis() as u64 {
            self.last_stall_ms.store(now, Ordering::Release);
            return true;
        }
        let last = self.last_stall_ms.load(Ordering::Acquire);
        last != u64::MAX && now.saturating_sub(last) < quiet.as_millis() as u64
    }

    /// Ticks until `stop`; a tick that comes `STALL` late means the process was not running (or starved).
    pub async fn detect_freezes(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = stop.cancelled() => return,
            }
            let now = Instant::now();
            if now - last >= TICK + STALL {
                tracing::warn!(
                    late_ms = (now - last - TICK).as_millis() as u64,
                    "the dispatcher was paused (stopped or starved of CPU); lanes are not judged until it settles"
                );
                metrics::counter!("hookline_dispatcher_stalls_total", "cause" => "paused").increment(1);
                self.stalled();
            }
            last = now;
        }
    }
}

pub struct WriteGuard {
    stalls: Arc<Stalls>,
}

impl WriteGuard {
    /// The write was acknowledged (see [`Stalls::acked`]); it is no longer outstanding.
    pub fn acked(self) {
        self.stalls.acked();
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.stalls.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn quick_writes_are_no_stall_even_after_a_long_idle_time() {
        let s = Stalls::new();
        tokio::time::advance(Duration::from_secs(3600)).await;
        let w = s.write();
        tokio::time::advance(Duration::from_millis(20)).await;
        s.acked();
        drop(w);
        assert!(!s.within(QUIET));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_outstanding_without_acknowledgements_is_a_stall_until_quiet_after_it() {
        let s = Stalls::new();
        let w = s.write();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(!s.within(QUIET), "slow, not yet stalled");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(s.within(QUIET), "no acknowledgement for over a second");
        tokio::time::advance(Duration::from_secs(2)).await;
        s.acked(); // the broker is back
        drop(w);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(s.within(QUIET), "still settling");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!s.within(QUIET), "quiet for long enough");
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_broker_acknowledging_some_writes_is_no_stall() {
        let s = Stalls::new();
        let _slow = s.write();
        for _ in 0..20 {
            let w = s.write();
            tokio::time::advance(Duration::from_millis(300)).await;
            s.acked();
            drop(w);
            assert!(!s.within(QUIET));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_tick_is_a_freeze() {
        let s = Stalls::new();
        let stop = tokio_util::sync::CancellationToken::new();
        let detector = tokio::spawn(s.clone().detect_freezes(stop.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!s.within(QUIET), "on-time ticks");
        // What SIGSTOP looks like from inside: the clock jumps while nothing runs.
        tokio::time::advance(Duration::from_secs(8)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(s.within(QUIET), "the detector saw the gap");
        stop.cancel();
        detector.await.unwrap();
    }
}
