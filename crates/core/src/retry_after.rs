//! `Retry-After` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date, to a wait in milliseconds. Never panics.
//!
//! What is accepted:
//! - delta-seconds: ASCII digits only, surrounding whitespace ignored. A number too large for the arithmetic
//!   saturates (it means "a very long time"; the policy's `max_s` then caps it).
//! - an HTTP-date in any of the three formats RFC 9110 requires recipients to read (IMF-fixdate, RFC 850, asctime),
//!   via `httpdate`, which also rejects a weekday that does not match the date. A date at or before the clock
//!   means "now": 0 ms (a `clamp` policy then waits its scheduled wait).
//!
//! What is not (the header is then ignored and the schedule applies): anything else — fractions (`1.5`), signs
//! (`-5`, `+5`), exponents (`1e15`), `inf`, `NaN`, empty or non-ASCII values. RFC 9110 allows only digits, and
//! guessing at a malformed value could only shorten a wait the policy promises.

use std::time::UNIX_EPOCH;

/// A wait in milliseconds from `value`, read against the wall clock `wall_clock_ms` (Unix ms) for HTTP-dates.
/// `None` when the value is neither delta-seconds nor an HTTP-date.
pub fn parse(value: &str, wall_clock_ms: i64) -> Option<u64> {
    let v = value.trim_matches(|c| c == ' ' || c == '\t');
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        let secs = v.bytes().fold(0u64, |acc, d| acc.saturating_mul(10).saturating_add(u64::from(d - b'0')));
        return Some(secs.saturating_mul(1000));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    // httpdate only yields dates from 1970 to 9999, so this cannot fail; treat failure as unusable all the same.
    let at_ms = i64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    let wait = i128::from(at_ms) - i128::from(wall_clock_ms);
    Some(u64::try_from(wait.max(0)).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2026-01-01T00:00:00Z, the simulated clock's start.
    const WALL: i64 = 1_767_225_600_000;

    #[test]
    fn delta_seconds() {
        let cases: &[(&str, Option<u64>)] = &[
            ("0", Some(0)),
            ("120", Some(120_000)),
            (" 120\t", Some(120_000)),
            ("007", Some(7_000)),
            ("99999999999999999999999", Some(u64::MAX)),
            ("18446744073709552", Some(u64::MAX)),
            ("18446744073709551", Some(18_446_744_073_709_551_000)),
            ("1.5", None),
            ("-5", None),
            ("+5", None),
            ("1e15", None),
            ("inf", None),
            ("NaN", None),
            ("", None),
            ("   ", None),
            ("12 0", None),
            ("١٢", None),
        ];
        for (value, want) in cases {
            assert_eq!(parse(value, WALL), *want, "{value:?}");
        }
    }

    #[test]
    fn http_dates_in_all_three_formats() {
        // One hour after the clock, written three ways.
        for value in ["Thu, 01 Jan 2026 01:00:00 GMT", "Thursday, 01-Jan-26 01:00:00 GMT", "Thu Jan  1 01:00:00 2026"] {
            assert_eq!(parse(value, WALL), Some(3_600_000), "{value}");
        }
        assert_eq!(parse("Wed, 21 Oct 2026 07:28:00 GMT", WALL), Some(25_342_080_000));
    }

    #[test]
    fn a_date_in_the_past_means_now() {
        assert_eq!(parse("Wed, 31 Dec 2025 23:00:00 GMT", WALL), Some(0));
        assert_eq!(parse("Thu, 01 Jan 1970 00:00:00 GMT", WALL), Some(0));
    }

    #[test]
    fn a_date_read_against_a_later_clock_is_shorter() {
        assert_eq!(parse("Thu, 01 Jan 2026 01:00:00 GMT", WALL + 1_500), Some(3_598_500));
    }

    #[test]
    fn malformed_dates_are_ignored() {
        for value in [
            "Fri, 01 Jan 2026 01:00:00 GMT", // wrong weekday
            "Thu, 32 Jan 2026 01:00:00 GMT",
            "Thu, 01 Jan 2026 25:00:00 GMT",
            "2026-01-01T01:00:00Z",
            "tomorrow",
        ] {
            assert_eq!(parse(value, WALL), None, "{value}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(value in ".*", clock in any::<i64>()) {
            let _ = parse(&value, clock);
        }

        #[test]
        fn never_panics_on_date_like_text(
            wd in "(Mon|Tue|Wed|Thu|Fri|Sat|Sun)", d in 0u32..40, m in "(Jan|Feb|Mar|Dec|Foo)",
            y in 0u32..12000, h in 0u32..30, clock in any::<i64>(),
        ) {
            let _ = parse(&format!("{wd}, {d:02} {m} {y:04} {h:02}:00:00 GMT"), clock);
        }

        #[test]
        fn digits_are_seconds(n in 0u64..10_000_000_000) {
            prop_assert_eq!(parse(&n.to_string(), 0), Some(n * 1000));
        }
    }
}
