//! The MSK IAM token: a SigV4 query-presigned `GET https://kafka.REGION.amazonaws.com/?Action=kafka-cluster:Connect`
//! URL, base64url without padding, exactly as Amazon's signer libraries (`aws-msk-iam-auth` for Java,
//! `aws-msk-iam-sasl-signer-*`) make it. `crates/kafka/tests/msk_iam_vectors.json`, written by the Java library
//! (scripts/msk-iam-vectors), holds it to that byte for byte.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::credentials::Credentials;
use crate::settings::Secret;

/// How long a token is valid: the libraries' 15 minutes.
pub const TOKEN_EXPIRY: Duration = Duration::from_secs(900);
const SERVICE: &str = "kafka-cluster";
/// SHA-256 of the empty body: a presigned GET signs no payload.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A signed token.
pub struct MskToken {
    /// The presigned URL, base64url without padding: what goes to the broker.
    pub token: Secret,
    /// Milliseconds since the Unix epoch: the signing time plus [`TOKEN_EXPIRY`].
    pub expires_at_ms: i64,
}

/// The token for `credentials` in `region`, signed at `now` (whole seconds, as X-Amz-Date has them). `user_agent`
/// is appended after signing, as the libraries do: it is not part of the signature.
pub fn msk_iam_token(credentials: &Credentials, region: &str, now: SystemTime, user_agent: &str) -> MskToken {
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let amz_date = amz_date(secs);
    let date = &amz_date[..8];
    let host = format!("kafka.{region}.amazonaws.com");
    let scope = format!("{date}/{region}/{SERVICE}/aws4_request");
    let credential = format!("{}/{scope}", credentials.access_key_id);
    let expires = TOKEN_EXPIRY.as_secs().to_string();

    // The canonical query string sorts the parameters by name; the URL keeps the Java SDK's order (below).
    let mut signed: Vec<(&str, &str)> = vec![
        ("Action", "kafka-cluster:Connect"),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", &credential),
        ("X-Amz-Date", &amz_date),
        ("X-Amz-Expires", &expires),
        ("X-Amz-SignedHeaders", "host"),
    ];
    if let Some(t) = &credentials.session_token {
        signed.push(("X-Amz-Security-Token", t.expose()));
    }
    signed.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let canonical_query = join_query(&signed);
    let canonical_request = format!("GET\n/\n{canonical_query}\nhost:{host}\n\nhost\n{EMPTY_SHA256}");
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request.as_bytes())));
    let mut key = hmac(format!("AWS4{}", credentials.secret_access_key.expose()).as_bytes(), date.as_bytes());
    for part in [region, SERVICE, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));

    let mut url_params: Vec<(&str, &str)> = vec![("Action", "kafka-cluster:Connect")];
    if let Some(t) = &credentials.session_token {
        url_params.push(("X-Amz-Security-Token", t.expose()));
    }
    url_params.extend([
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Date", &amz_date),
        ("X-Amz-SignedHeaders", "host"),
        ("X-Amz-Expires", &expires),
        ("X-Amz-Credential", &credential),
        ("X-Amz-Signature", &signature),
        ("User-Agent", user_agent),
    ]);
    // java.net.URI renders an empty path as nothing: `https://host?query`, which the Java library sends.
    let url = format!("https://{host}?{}", join_query(&url_params));
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url);
    let expires_at = secs.saturating_add(TOKEN_EXPIRY.as_secs());
    MskToken { token: Secret::new(token), expires_at_ms: i64::try_from(expires_at).unwrap_or(i64::MAX).saturating_mul(1000) }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn join_query(params: &[(&str, &str)]) -> String {
    params.iter().map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(v))).collect::<Vec<_>>().join("&")
}

/// SigV4's URI encoding: every byte but the unreserved `A-Z a-z 0-9 - _ . ~` as `%XX`, upper-case hex.
pub(crate) fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch.
pub(crate) fn amz_date(secs: u64) -> String {
    let (y, m, d) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(i64::MAX));
    let rem = secs % 86_400;
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Howard Hinnant's days-to-civil, for the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since the epoch of a civil date (the inverse of [`civil_from_days`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An RFC 3339 UTC time as AWS writes credential expirations (`2026-12-07T17:30:00Z`, fractions allowed, `Z` or
/// `+00:00`), as a `SystemTime`. None for anything else.
pub(crate) fn parse_rfc3339_utc(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let rest = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (date, time) = rest.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-');
    let y: i64 = d.next()?.parse().ok()?;
    let mo: u32 = d.next()?.parse().ok()?;
    let da: u32 = d.next()?.parse().ok()?;
    let time = time.split_once('.').map_or(time, |(t, _)| t);
    let mut t = time.splitn(3, ':');
    let h: u64 = t.next()?.parse().ok()?;
    let mi: u64 = t.next()?.parse().ok()?;
    let se: u64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let days = u64::try_from(days_from_civil(y, mo, da)).ok()?;
    let secs = days.checked_mul(86_400)?.checked_add(h * 3600 + mi * 60 + se)?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_render_and_parse_as_aws_writes_them() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_709_251_199), "20240229T235959Z");
        assert_eq!(amz_date(4_102_444_800), "21000101T000000Z");
        let t = parse_rfc3339_utc("2024-02-29T23:59:59Z").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 1_709_251_199);
        assert_eq!(parse_rfc3339_utc("2024-02-29T23:59:59.123+00:00"), Some(t));
        for bad in ["", "2024-02-29", "2024-13-01T00:00:00Z", "2024-02-29T23:59:59+01:00", "yesterday"] {
            assert_eq!(parse_rfc3339_utc(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn uri_encoding_keeps_only_unreserved_bytes() {
        assert_eq!(uri_encode("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(uri_encode("kafka-cluster:Connect"), "kafka-cluster%3AConnect");
        assert_eq!(uri_encode("a/b+c= d*é"), "a%2Fb%2Bc%3D%20d%2A%C3%A9");
    }
}
