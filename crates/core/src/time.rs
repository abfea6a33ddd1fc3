//! RFC 3339 times in UTC with milliseconds (`2026-01-01T00:00:00.000Z`), as hookline writes them in documents
//! meant for people's tools (the JSON dead letter).

/// `ms` since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`; `None` outside years 0000–9999, which RFC 3339
/// cannot write.
pub fn rfc3339_ms(ms: i64) -> Option<String> {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return None;
    }
    Some(format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, ms.rem_euclid(1000)))
}

/// Reads what `rfc3339_ms` writes, and any RFC 3339 time with `Z` or a numeric offset and up to nanoseconds
/// (truncated to milliseconds).
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        part.iter().all(u8::is_ascii_digit).then(|| part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac_ms = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 9 {
            return None;
        }
        let f = num(start..i)?;
        frac_ms = match digits {
            1 => f * 100,
            2 => f * 10,
            3 => f,
            n => f / 10i64.pow(n as u32 - 3),
        };
    }
    let offset_s = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec.min(59) - offset_s;
    Some(secs * 1000 + frac_ms)
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (the inverse of `days_from_civil`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(0).as_deref(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(rfc3339_ms(951_782_400_000).as_deref(), Some("2000-02-29T00:00:00.000Z"));
        assert_eq!(rfc3339_ms(1_792_567_680_123).as_deref(), Some("2026-10-21T07:28:00.123Z"));
        assert_eq!(rfc3339_ms(-1).as_deref(), Some("1969-12-31T23:59:59.999Z"));
        assert_eq!(rfc3339_ms(i64::MAX), None);
        assert_eq!(rfc3339_ms(i64::MIN), None);
    }

    #[test]
    fn parses_what_it_formats_and_offsets() {
        for ms in [0, -1, 951_782_400_000, 1_792_567_680_123, 253_402_300_799_999] {
            assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms).unwrap()), Some(ms), "{ms}");
        }
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.5Z"), Some(500));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.123456789Z"), Some(123));
        for bad in [
            "",
            "1970-01-01",
            "1970-13-01T00:00:00Z",
            "1970-02-30T00:00:00Z",
            "1970-01-01T00:00:00",
            "1970-01-01T00:00:00.Z",
            "1970-01-01T00:00:00+1:00",
            "1970-01-01T00:00:00Zjunk",
            "+970-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
