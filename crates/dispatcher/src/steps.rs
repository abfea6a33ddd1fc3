//! TEMPORARY instrumentation (session 7, #17): sub-steps of the dispatcher's own latency, dumped to
//! `$HOOKLINE_LAT_STEPS` at exit. Removed before the branch is final.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const NAMES: [&str; 8] = [
    "handler",      // receive → the job is submitted (decode, stuck check)
    "handoff_now",  // submitted → the job's first poll, lane had room
    "handoff_queued", // submitted → the job's first poll, lane was full
    "prelude",      // job's first poll → the try starts
    "total",        // receive → the try starts
    "job",          // the job's first poll → its end (the lane slot's hold)
    "probe_spawn",  // a trivial task spawned from a plain thread every ms → its first poll
    "probe_sleep",  // a plain thread's 1 ms sleep: overshoot
];

static ON: AtomicBool = AtomicBool::new(false);
static SAMPLES: OnceLock<Vec<Mutex<Vec<u32>>>> = OnceLock::new();

fn samples() -> &'static Vec<Mutex<Vec<u32>>> {
    SAMPLES.get_or_init(|| NAMES.iter().map(|_| Mutex::new(Vec::with_capacity(100_000))).collect())
}

pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

pub fn record(step: usize, us: i64) {
    if !on() {
        return;
    }
    let mut v = samples()[step].lock().unwrap();
    if v.len() < 1_000_000 {
        v.push(u32::try_from(us.max(0)).unwrap_or(u32::MAX));
    }
}

pub fn start(stop: tokio_util::sync::CancellationToken) {
    if std::env::var_os("HOOKLINE_LAT_STEPS").is_none() {
        return;
    }
    ON.store(true, Ordering::Relaxed);
    let handle = tokio::runtime::Handle::current();
    let s = stop.clone();
    std::thread::spawn(move || {
        while !s.is_cancelled() {
            let t = Instant::now();
            handle.spawn(async move { record(6, t.elapsed().as_micros() as i64) });
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    std::thread::spawn(move || {
        while !stop.is_cancelled() {
            let t = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            record(7, t.elapsed().as_micros() as i64 - 1000);
        }
    });
}

pub fn dump() {
    let Some(path) = std::env::var_os("HOOKLINE_LAT_STEPS") else { return };
    let mut out = String::new();
    for (i, name) in NAMES.iter().enumerate() {
        let mut v = samples()[i].lock().unwrap().clone();
        v.sort_unstable();
        let p = |q: f64| if v.is_empty() { 0 } else { v[((v.len() - 1) as f64 * q / 100.0).round() as usize] };
        out.push_str(&format!(
            "{name:16} n {:>7}  p50 {:>7}  p90 {:>7}  p99 {:>7}  p99.9 {:>7}  max {:>8} µs\n",
            v.len(), p(50.0), p(90.0), p(99.0), p(99.9), v.last().copied().unwrap_or(0)
        ));
    }
    let _ = std::fs::write(path, out);
}

tokio::task_local! {
    pub static JOB_START: i64;
}

/// TEMPORARY A/B switch: `HOOKLINE_LAT_VARIANT` = base | release | inline | both (default both).
fn variant() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| std::env::var("HOOKLINE_LAT_VARIANT").unwrap_or_else(|_| "both".into()))
}

pub fn release_on() -> bool {
    matches!(variant(), "release" | "both")
}

pub fn inline_on() -> bool {
    matches!(variant(), "inline" | "both")
}
