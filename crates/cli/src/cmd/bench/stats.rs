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

/// The smallest, the median (the lower middle one for an even count) and the largest of `v`; NaNs left out.
/// `None` when nothing is left.
pub fn spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    let s = sorted(v.iter().copied().filter(|x| !x.is_nan()).collect());
    let (first, last) = (*s.first()?, *s.last()?);
    Some((first, s[(s.len() - 1) / 2], last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_min_lower_median_max_without_nans() {
        assert_eq!(spread(&[0.95, 0.88, 1.02, 0.91, 0.97]), Some((0.88, 0.95, 1.02)));
        assert_eq!(spread(&[0.9, 0.8]), Some((0.8, 0.8, 0.9)), "the lower middle one");
        assert_eq!(spread(&[0.93]), Some((0.93, 0.93, 0.93)));
        assert_eq!(spread(&[f64::NAN, 2.0, 1.0]), Some((1.0, 1.0, 2.0)));
        assert_eq!(spread(&[f64::NAN]), None);
        assert_eq!(spread(&[]), None);
    }
}
