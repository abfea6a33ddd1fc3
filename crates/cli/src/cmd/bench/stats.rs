//! Percentiles and progress lines.

use std::time::Instant;

/// Nearest-rank percentile of a sorted slice (`q` in 0..=100).
pub fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// A progress line at most once a second.
pub struct Progress {
    started: Instant,
    last: Instant,
}

impl Progress {
    pub fn new() -> Self {
        let now = Instant::now();
        Self { started: now, last: now }
    }

    pub fn tick(&mut self, line: impl FnOnce(f64) -> String) {
        if self.last.elapsed().as_secs_f64() >= 1.0 {
            self.last = Instant::now();
            let t = self.started.elapsed().as_secs_f64();
            eprintln!("  [{t:>6.1}s] {}", line(t));
        }
    }
}
