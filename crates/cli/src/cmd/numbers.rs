//! Value parsers for numeric flags: out-of-range input is a usage error that names the flag (clap prefixes the
//! flag to these messages), never a panic or an overflow further on.

use std::time::Duration;

/// A number of seconds, more than 0 and at most `max_s`, as a `Duration` (`1e300`, `-1`, `NaN` and `inf` are refused).
pub fn seconds_up_to(max_s: f64) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let s: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
        if !(s.is_finite() && s > 0.0 && s <= max_s) {
            return Err(format!("must be more than 0 and at most {max_s} seconds"));
        }
        Duration::try_from_secs_f64(s).map_err(|e| format!("{text:?}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_bounded() {
        let p = seconds_up_to(60.0);
        assert_eq!(p("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(p("60"), Ok(Duration::from_secs(60)));
        for bad in ["0", "-1", "1e300", "inf", "NaN", "60.001", "x", ""] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
