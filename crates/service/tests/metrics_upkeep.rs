//! The Prometheus recorder keeps its memory bounded without a scrape: histogram samples queue inside the recorder
//! until they are folded into buckets, and the upkeep thread folds them every `METRICS_UPKEEP_INTERVAL`. Measured
//! with a counting allocator (this test binary's own), so nothing else in the process may allocate much meanwhile:
//! one test in this file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const SAMPLES: u64 = 1_000_000;

#[test]
fn histogram_samples_are_folded_without_a_scrape() {
    let handle = hookline_service::telemetry::metrics_handle();
    let h = metrics::histogram!("hookline_upkeep_test_ms");
    h.record(1.0);
    let _ = handle.render();
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..SAMPLES {
        h.record((i % 100) as f64);
    }
    let grown = LIVE.load(Ordering::Relaxed) - before;
    // The samples really are held until folded (about 8 bytes each).
    assert!(grown > 4 << 20, "recording {SAMPLES} samples grew the heap by only {grown} bytes");

    // No render from here on: only the upkeep thread can release them. The service goes on recording (here into
    // another histogram, a few samples at a time): the recorder's lock-free queues free what was folded only as
    // later recordings come by (epoch-based reclamation).
    let limit = hookline_service::telemetry::METRICS_UPKEEP_INTERVAL * 4;
    let deadline = Instant::now() + limit;
    let trickle = metrics::histogram!("hookline_upkeep_test_trickle_ms");
    loop {
        let held = LIVE.load(Ordering::Relaxed) - before;
        if held < grown / 4 {
            break;
        }
        assert!(Instant::now() < deadline, "still {held} of {grown} bytes held with no scrape after {limit:?}");
        for _ in 0..200 {
            trickle.record(1.0);
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // Folding lost nothing: every sample is in the histogram's count.
    let text = handle.render();
    let count = text.lines().find_map(|l| l.strip_prefix("hookline_upkeep_test_ms_count ")).expect("the histogram is rendered");
    assert_eq!(count.trim().parse::<u64>().unwrap(), SAMPLES + 1, "{text}");
}
