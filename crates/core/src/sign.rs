//! Request signing and verification: Standard Webhooks v1 and Gauge.
//!
//! **Standard Webhooks v1.** `webhook-signature: v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`, with
//! `webhook-id` and `webhook-timestamp` (Unix seconds) alongside; several space-separated signatures while secrets
//! rotate.
//!
//! **Gauge.** `Gauge-Signature: t=<epoch ms>,v1=<hex(HMAC-SHA256(key, "{t}.{body}"))>` (one `v1=` per secret in
//! force), plus the legacy `x-pulse-signature` (the newest secret's hex), `x-pulse-timestamp` (t) and
//! `x-pulse-event`.
//!
//! **The key of a secret** (one rule, so a `whsec_` secret works with either scheme):
//! - `whsec_<base64>`: the base64-decoded bytes after the prefix, for both schemes;
//! - otherwise, Standard Webhooks: the whole string base64-decoded (what the reference libraries do with an
//!   unprefixed secret); Gauge: the string's UTF-8 bytes as given.
//!
//! Base64 is the standard alphabet; padding may be present or not. Secrets never appear in error messages.

use std::borrow::Cow;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::policy::SignatureScheme;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of a serialized signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Length of an HMAC-SHA256 tag.
const MAC_LEN: usize = 32;

/// Header names, in the capitalisation each scheme documents (HTTP compares them case-insensitively).
pub mod names {
    pub const WEBHOOK_ID: &str = "webhook-id";
    pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
    pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
    pub const GAUGE_SIGNATURE: &str = "Gauge-Signature";
    pub const PULSE_SIGNATURE: &str = "x-pulse-signature";
    pub const PULSE_TIMESTAMP: &str = "x-pulse-timestamp";
    pub const PULSE_EVENT: &str = "x-pulse-event";
}

/// Standard alphabet, padding optional on input, always written on output.
const B64: GeneralPurpose =
    GeneralPurpose::new(&alphabet::STANDARD, GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent));

// ---------------------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------------------

/// What is wrong with a secret. Never contains the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretProblem {
    #[error("the secret is empty")]
    Empty,
    #[error("nothing follows `whsec_`")]
    EmptyAfterPrefix,
    #[error("the part after `whsec_` is not valid base64")]
    NotBase64AfterPrefix,
    #[error("the secret does not start with `whsec_` and is not base64 either (Standard Webhooks secrets look like whsec_<base64>)")]
    NotBase64,
}

/// Why a request could not be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("no signing secret in force")]
    NoSecret,
    /// `position` is 1-based among the secrets given (1 = newest).
    #[error("signing secret #{position} is unusable: {problem}")]
    BadSecret { position: usize, problem: SecretProblem },
}

/// Why a request's signature does not verify. Each variant says exactly what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("no secret to verify with")]
    NoSecrets,
    /// `position` is 1-based among the secrets given.
    #[error("secret #{position} is unusable: {problem}")]
    BadSecret { position: usize, problem: SecretProblem },
    #[error("missing `{name}` header")]
    MissingHeader { name: &'static str },
    #[error("malformed `{name}` header: {problem}")]
    MalformedHeader { name: &'static str, problem: String },
    /// `age_ms`: how old the timestamp is.
    #[error("timestamp too old: {} old, tolerance {tolerance_s} s", human_duration_ms(*age_ms))]
    TooOld { age_ms: u64, tolerance_s: u64, timestamp_ms: i64 },
    /// `ahead_ms`: how far in the future the timestamp is.
    #[error("timestamp too new: {} in the future, tolerance {tolerance_s} s", human_duration_ms(*ahead_ms))]
    TooNew { ahead_ms: u64, tolerance_s: u64, timestamp_ms: i64 },
    /// `tried`: signatures of a supported version (v1) in the header; `unreadable`: how many of those were not
    /// even a well-formed HMAC-SHA256 (wrong length or encoding); `ignored_versions`: other versions present.
    #[error("{}", no_match_message(*tried, *unreadable, *secrets, ignored_versions))]
    NoMatch { tried: usize, unreadable: usize, secrets: usize, ignored_versions: Vec<String> },
}

fn no_match_message(tried: usize, unreadable: usize, secrets: usize, ignored: &[String]) -> String {
    let mut m = if tried == 0 {
        "no signature matched: the header has no v1 signature".to_owned()
    } else {
        format!("no signature matched: {tried} v1 signature{} tried with {secrets} secret{}", plural(tried), plural(secrets))
    };
    if unreadable > 0 {
        m.push_str(&format!(" ({unreadable} not a well-formed HMAC-SHA256)"));
    }
    if !ignored.is_empty() {
        m.push_str("; ignored unsupported versions: ");
        m.push_str(&ignored.join(", "));
    }
    m
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `12 s`, `1.5 s`, `5m 1s`, `1h 3m`, `2d 4h`; under a second, `450 ms`; zero, `0 s`. Under a minute a fraction
/// is kept to a tenth (truncated, so a 1,999 ms timeout never reads as 2 s).
pub fn human_duration_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 if ms == 0 => "0 s".to_owned(),
        0 => format!("{ms} ms"),
        1..=59 if ms % 1000 >= 100 => format!("{s}.{} s", (ms % 1000) / 100),
        1..=59 => format!("{s} s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Keys and secrets
// ---------------------------------------------------------------------------------------------------------------

/// The HMAC key of `secret` under `scheme`'s rule (see the module docs). `SignatureScheme::None` never signs; it
/// gets Gauge's rule so the function is total.
pub fn signing_key(scheme: SignatureScheme, secret: &str) -> Result<Cow<'_, [u8]>, SecretProblem> {
    if secret.is_empty() {
        return Err(SecretProblem::Empty);
    }
    if let Some(rest) = secret.strip_prefix(SECRET_PREFIX) {
        if rest.is_empty() {
            return Err(SecretProblem::EmptyAfterPrefix);
        }
        let key = B64.decode(rest).map_err(|_| SecretProblem::NotBase64AfterPrefix)?;
        if key.is_empty() {
            return Err(SecretProblem::EmptyAfterPrefix);
        }
        return Ok(Cow::Owned(key));
    }
    match scheme {
        SignatureScheme::StandardWebhooks => {
            let key = B64.decode(secret).map_err(|_| SecretProblem::NotBase64)?;
            if key.is_empty() {
                return Err(SecretProblem::Empty);
            }
            Ok(Cow::Owned(key))
        }
        SignatureScheme::Gauge | SignatureScheme::None => Ok(Cow::Borrowed(secret.as_bytes())),
    }
}

/// A new signing secret: `whsec_` + base64 of 32 random bytes.
pub fn generate_secret(rng: &mut dyn rand::RngCore) -> String {
    let mut key = [0u8; 32];
    rng.fill_bytes(&mut key);
    let mut out = String::with_capacity(SECRET_PREFIX.len() + 44);
    out.push_str(SECRET_PREFIX);
    B64.encode_string(key, &mut out);
    out
}

fn mac_of(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    // HMAC takes keys of any length (long ones are hashed), so construction cannot fail; the fallback keeps this
    // total without a panic path.
    match HmacSha256::new_from_slice(key) {
        Ok(m) => finish_mac(m, parts),
        Err(_) => [0u8; MAC_LEN],
    }
}

fn finish_mac(mut mac: HmacSha256, parts: &[&[u8]]) -> [u8; MAC_LEN] {
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// A secret's HMAC-SHA256, keyed once (the secret decoded under its scheme's rule, the key's pads hashed): each
/// signature clones the keyed state instead of decoding and keying again. Never shows the key.
#[derive(Clone)]
pub struct SigningKey(HmacSha256);

impl SigningKey {
    /// The key of `secret` under `scheme`'s rule (see [`signing_key`]).
    pub fn new(scheme: SignatureScheme, secret: &str) -> Result<Self, SecretProblem> {
        let key = signing_key(scheme, secret)?;
        // Any length is a valid HMAC key (see `mac_of`); an empty one was refused above.
        HmacSha256::new_from_slice(&key).map(Self).map_err(|_| SecretProblem::Empty)
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; MAC_LEN] {
        finish_mac(self.0.clone(), parts)
    }

    /// Appends `v1,<base64>`: one entry of `webhook-signature`. `timestamp_s` is the decimal Unix seconds the
    /// `webhook-timestamp` header carries.
    pub fn push_standard(&self, out: &mut String, msg_id: &str, timestamp_s: &str, body: &[u8]) {
        out.push_str("v1,");
        B64.encode_string(self.mac(&[msg_id.as_bytes(), b".", timestamp_s.as_bytes(), b".", body]), out);
    }

    /// The hex HMAC of `"{t_ms}.{body}"` (Gauge); `t_ms` is the decimal epoch milliseconds.
    pub fn gauge_hex(&self, t_ms: &str, body: &[u8]) -> String {
        hex::encode(self.mac(&[t_ms.as_bytes(), b".", body]))
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

fn standard_mac(key: &[u8], msg_id: &str, timestamp_s: i64, body: &[u8]) -> [u8; MAC_LEN] {
    let ts = timestamp_s.to_string();
    mac_of(key, &[msg_id.as_bytes(), b".", ts.as_bytes(), b".", body])
}

fn gauge_mac(key: &[u8], t_ms: i64, body: &[u8]) -> [u8; MAC_LEN] {
    let t = t_ms.to_string();
    mac_of(key, &[t.as_bytes(), b".", body])
}

/// Compares two MACs without leaking, through timing, how many leading bytes agree.
fn macs_equal(computed: &[u8; MAC_LEN], candidate: &[u8]) -> bool {
    candidate.len() == MAC_LEN && bool::from(computed.as_slice().ct_eq(candidate))
}

// ---------------------------------------------------------------------------------------------------------------
// Signing
// ---------------------------------------------------------------------------------------------------------------

/// `v1,<base64>` for one secret: the value (or one entry of the value) of `webhook-signature`.
pub fn standard_signature(secret: &str, msg_id: &str, timestamp_s: i64, body: &[u8]) -> Result<String, SignError> {
    let key =
        SigningKey::new(SignatureScheme::StandardWebhooks, secret).map_err(|problem| SignError::BadSecret { position: 1, problem })?;
    let mut out = String::with_capacity(3 + 44);
    key.push_standard(&mut out, msg_id, &timestamp_s.to_string(), body);
    Ok(out)
}

/// The hex HMAC of `"{t_ms}.{body}"`: what follows `v1=` in `Gauge-Signature` and the `x-pulse-signature` value.
pub fn gauge_signature_hex(secret: &str, t_ms: i64, body: &[u8]) -> Result<String, SignError> {
    let key = signing_key(SignatureScheme::Gauge, secret).map_err(|problem| SignError::BadSecret { position: 1, problem })?;
    Ok(hex::encode(gauge_mac(&key, t_ms, body)))
}

// ---------------------------------------------------------------------------------------------------------------
// Verification
// ---------------------------------------------------------------------------------------------------------------

/// Read access to a request's headers. Names compare ASCII-case-insensitively; a repeated header yields its
/// first value.
pub trait HeaderLookup {
    fn header(&self, name: &str) -> Option<String>;
}

impl<F: Fn(&str) -> Option<String>> HeaderLookup for F {
    fn header(&self, name: &str) -> Option<String> {
        self(name)
    }
}

impl<N: AsRef<str>, V: AsRef<str>> HeaderLookup for [(N, V)] {
    fn header(&self, name: &str) -> Option<String> {
        self.iter().find(|(n, _)| n.as_ref().eq_ignore_ascii_case(name)).map(|(_, v)| v.as_ref().to_owned())
    }
}

/// A verified request: which signature matched, with which secret, and how old it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub scheme: SignatureScheme,
    /// The header that carried the matching signature.
    pub header: &'static str,
    /// 1-based position of the matching signature among the header's entries.
    pub signature_position: usize,
    /// 1-based position of the secret that produced it.
    pub secret_position: usize,
    pub timestamp_ms: i64,
    /// Now minus the timestamp; negative when the timestamp is ahead of the clock.
    pub age_ms: i64,
}

/// Which scheme a request's headers use: `webhook-signature` → Standard Webhooks; `Gauge-Signature` or
/// `x-pulse-signature` → Gauge.
pub fn detect_scheme<H: HeaderLookup + ?Sized>(headers: &H) -> Option<SignatureScheme> {
    if headers.header(names::WEBHOOK_SIGNATURE).is_some() {
        Some(SignatureScheme::StandardWebhooks)
    } else if headers.header(names::GAUGE_SIGNATURE).is_some() || headers.header(names::PULSE_SIGNATURE).is_some() {
        Some(SignatureScheme::Gauge)
    } else {
        None
    }
}

/// Verifies a Standard Webhooks v1 request against any of `secrets` (rotation), with `tolerance_s` either side of
/// `now_ms`.
pub fn verify_standard<H, S>(secrets: &[S], headers: &H, body: &[u8], now_ms: i64, tolerance_s: u64) -> Result<Verified, VerifyError>
where
    H: HeaderLookup + ?Sized,
    S: AsRef<str>,
{
    let keys = keys_for(SignatureScheme::StandardWebhooks, secrets)?;
    let id = required(headers, names::WEBHOOK_ID)?;
    let ts_raw = required(headers, names::WEBHOOK_TIMESTAMP)?;
    let sig_raw = required(headers, names::WEBHOOK_SIGNATURE)?;

    let ts_s = parse_digits(&ts_raw).ok_or_else(|| VerifyError::MalformedHeader {
        name: names::WEBHOOK_TIMESTAMP,
        problem: format!("expected Unix seconds (digits only), got {}", quoted(&ts_raw)),
    })?;
    if ts_raw.len() >= 13 {
        // 13 digits is a millisecond clock; checking it as seconds would report "too new by 50 000 years".
        return Err(VerifyError::MalformedHeader {
            name: names::WEBHOOK_TIMESTAMP,
            problem: format!("{} looks like milliseconds; Standard Webhooks uses Unix seconds", quoted(&ts_raw)),
        });
    }
    // Standard Webhooks compares whole seconds.
    let age_ms = (i128::from(now_ms.div_euclid(1000)) - i128::from(ts_s)) * 1000;
    let timestamp_ms = ts_s.saturating_mul(1000);
    check_tolerance(age_ms, tolerance_s, timestamp_ms)?;

    let sigs = parse_standard_signatures(&sig_raw)?;
    let macs: Vec<[u8; MAC_LEN]> = keys.iter().map(|k| standard_mac(k, &id, ts_s, body)).collect();
    find_match(&macs, &sigs)
        .map(|(signature_position, secret_position)| Verified {
            scheme: SignatureScheme::StandardWebhooks,
            header: names::WEBHOOK_SIGNATURE,
            signature_position,
            secret_position,
            timestamp_ms,
            age_ms: clamp_i64(age_ms),
        })
        .ok_or_else(|| sigs.no_match(keys.len()))
}

/// Verifies a Gauge request against any of `secrets`, with `tolerance_s` either side of `now_ms`. Reads
/// `Gauge-Signature`; without it, the legacy `x-pulse-signature` + `x-pulse-timestamp` pair.
pub fn verify_gauge<H, S>(secrets: &[S], headers: &H, body: &[u8], now_ms: i64, tolerance_s: u64) -> Result<Verified, VerifyError>
where
    H: HeaderLookup + ?Sized,
    S: AsRef<str>,
{
    let keys = keys_for(SignatureScheme::Gauge, secrets)?;
    let (header, t_ms, sigs) = match present(headers, names::GAUGE_SIGNATURE) {
        Some(raw) => {
            let (t, sigs) = parse_gauge_signature(&raw)?;
            (names::GAUGE_SIGNATURE, t, sigs)
        }
        None => {
            let Some(sig) = present(headers, names::PULSE_SIGNATURE) else {
                return Err(VerifyError::MissingHeader { name: names::GAUGE_SIGNATURE });
            };
            let t_raw = required(headers, names::PULSE_TIMESTAMP)?;
            let t = parse_digits(&t_raw).ok_or_else(|| VerifyError::MalformedHeader {
                name: names::PULSE_TIMESTAMP,
                problem: format!("expected epoch milliseconds (digits only), got {}", quoted(&t_raw)),
            })?;
            let mut sigs = Candidates::default();
            sigs.push_hex(1, &sig);
            (names::PULSE_SIGNATURE, t, sigs)
        }
    };
    let age_ms = i128::from(now_ms) - i128::from(t_ms);
    check_tolerance(age_ms, tolerance_s, t_ms)?;

    let macs: Vec<[u8; MAC_LEN]> = keys.iter().map(|k| gauge_mac(k, t_ms, body)).collect();
    find_match(&macs, &sigs)
        .map(|(signature_position, secret_position)| Verified {
            scheme: SignatureScheme::Gauge,
            header,
            signature_position,
            secret_position,
            timestamp_ms: t_ms,
            age_ms: clamp_i64(age_ms),
        })
        .ok_or_else(|| sigs.no_match(keys.len()))
}

fn keys_for<S: AsRef<str>>(scheme: SignatureScheme, secrets: &[S]) -> Result<Vec<Cow<'_, [u8]>>, VerifyError> {
    if secrets.is_empty() {
        return Err(VerifyError::NoSecrets);
    }
    secrets
        .iter()
        .enumerate()
        .map(|(i, s)| signing_key(scheme, s.as_ref()).map_err(|problem| VerifyError::BadSecret { position: i + 1, problem }))
        .collect()
}

/// The header's trimmed value, or `None` when absent.
fn present<H: HeaderLookup + ?Sized>(headers: &H, name: &'static str) -> Option<String> {
    headers.header(name).map(|v| v.trim().to_owned())
}

fn required<H: HeaderLookup + ?Sized>(headers: &H, name: &'static str) -> Result<String, VerifyError> {
    let v = present(headers, name).ok_or(VerifyError::MissingHeader { name })?;
    if v.is_empty() {
        return Err(VerifyError::MalformedHeader { name, problem: "it is empty".into() });
    }
    Ok(v)
}

/// 1 to 18 ASCII digits (18 cannot overflow an i64).
fn parse_digits(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn check_tolerance(age_ms: i128, tolerance_s: u64, timestamp_ms: i64) -> Result<(), VerifyError> {
    let tol_ms = i128::from(tolerance_s) * 1000;
    if age_ms > tol_ms {
        Err(VerifyError::TooOld { age_ms: clamp_u64(age_ms), tolerance_s, timestamp_ms })
    } else if -age_ms > tol_ms {
        Err(VerifyError::TooNew { ahead_ms: clamp_u64(-age_ms), tolerance_s, timestamp_ms })
    } else {
        Ok(())
    }
}

fn clamp_u64(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// A header value for an error message: quoted, and cut so a hostile header cannot flood the output.
fn quoted(s: &str) -> String {
    const MAX: usize = 40;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{:?}…", &s[..i]),
        None => format!("{s:?}"),
    }
}

/// Signatures found in a header: the supported (v1) ones decoded, plus what was set aside.
#[derive(Default)]
struct Candidates {
    /// (1-based position in the header, decoded MAC or `None` when unreadable).
    v1: Vec<(usize, Option<Vec<u8>>)>,
    ignored_versions: Vec<String>,
}

impl Candidates {
    fn push_b64(&mut self, position: usize, s: &str) {
        self.v1.push((position, B64.decode(s).ok().filter(|m| m.len() == MAC_LEN)));
    }

    fn push_hex(&mut self, position: usize, s: &str) {
        self.v1.push((position, hex::decode(s).ok().filter(|m| m.len() == MAC_LEN)));
    }

    fn ignore(&mut self, version: &str) {
        // Bounded, so arbitrary input cannot make the error message huge.
        let v: String = version.chars().take(16).collect();
        if self.ignored_versions.len() < 8 && !self.ignored_versions.contains(&v) {
            self.ignored_versions.push(v);
        }
    }

    fn no_match(&self, secrets: usize) -> VerifyError {
        VerifyError::NoMatch {
            tried: self.v1.len(),
            unreadable: self.v1.iter().filter(|(_, m)| m.is_none()).count(),
            secrets,
            ignored_versions: self.ignored_versions.clone(),
        }
    }
}

/// (signature position, secret position) of the first match. Every comparison is constant-time.
fn find_match(macs: &[[u8; MAC_LEN]], sigs: &Candidates) -> Option<(usize, usize)> {
    for (pos, candidate) in &sigs.v1 {
        let Some(candidate) = candidate else { continue };
        for (k, mac) in macs.iter().enumerate() {
            if macs_equal(mac, candidate) {
                return Some((*pos, k + 1));
            }
        }
    }
    None
}

/// `v1,<b64> v1a,<b64> ...`. Entries without a comma are skipped, as the reference libraries do, so a request they
/// accept is accepted here too; a header with nothing usable at all is malformed.
fn parse_standard_signatures(raw: &str) -> Result<Candidates, VerifyError> {
    let mut c = Candidates::default();
    let mut shapeless = 0usize;
    for (i, entry) in raw.split_ascii_whitespace().enumerate() {
        match entry.split_once(',') {
            Some(("v1", sig)) => c.push_b64(i + 1, sig),
            Some((version, _)) => c.ignore(version),
            None => shapeless += 1,
        }
    }
    if c.v1.is_empty() && c.ignored_versions.is_empty() {
        return Err(VerifyError::MalformedHeader {
            name: names::WEBHOOK_SIGNATURE,
            problem: format!(
                "{shapeless} entr{} and none has the form v1,<base64>: got {}",
                if shapeless == 1 { "y" } else { "ies" },
                quoted(raw)
            ),
        });
    }
    Ok(c)
}

/// `t=<ms>,v1=<hex>[,v1=<hex>...]`; other `key=value` items are ignored (newer versions), items without `=` are
/// malformed.
fn parse_gauge_signature(raw: &str) -> Result<(i64, Candidates), VerifyError> {
    let malformed = |problem: String| VerifyError::MalformedHeader { name: names::GAUGE_SIGNATURE, problem };
    let mut c = Candidates::default();
    let mut t: Option<i64> = None;
    let mut position = 0usize;
    for item in raw.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(malformed(format!("item {} is not key=value", quoted(item))));
        };
        match key.trim() {
            "t" => {
                let v = parse_digits(value.trim())
                    .ok_or_else(|| malformed(format!("t must be epoch milliseconds (digits only), got {}", quoted(value))))?;
                if t.is_some_and(|prev| prev != v) {
                    return Err(malformed("two different t= values".into()));
                }
                t = Some(v);
            }
            "v1" => {
                position += 1;
                c.push_hex(position, value.trim());
            }
            other => {
                position += 1;
                c.ignore(other);
            }
        }
    }
    let t = t.ok_or_else(|| malformed(format!("no t=<epoch ms> in {}", quoted(raw))))?;
    if c.v1.is_empty() && c.ignored_versions.is_empty() {
        return Err(malformed("no v1=<hex> signature".into()));
    }
    Ok((t, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TS: i64 = 1_614_265_330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn spec_headers(id: &str, ts: &str, sig: &str) -> Vec<(String, String)> {
        vec![("webhook-id".into(), id.into()), ("webhook-timestamp".into(), ts.into()), ("webhook-signature".into(), sig.into())]
    }

    fn at(ts_s: i64) -> i64 {
        ts_s * 1000
    }

    #[test]
    fn spec_example_vector_signs_and_verifies() {
        assert_eq!(standard_signature(SPEC_SECRET, SPEC_ID, SPEC_TS, SPEC_BODY).unwrap(), SPEC_SIG);
        let h = spec_headers(SPEC_ID, "1614265330", SPEC_SIG);
        let ok = verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, at(SPEC_TS + 12), 300).unwrap();
        assert_eq!(ok.signature_position, 1);
        assert_eq!(ok.secret_position, 1);
        assert_eq!(ok.age_ms, 12_000);
        // The reference libraries accept the secret without its prefix too.
        let bare = SPEC_SECRET.strip_prefix("whsec_").unwrap();
        verify_standard(&[bare], h.as_slice(), SPEC_BODY, at(SPEC_TS), 300).unwrap();
    }

    #[test]
    fn one_changed_byte_fails_with_no_match() {
        let now = at(SPEC_TS);
        type Case = (&'static str, Vec<(String, String)>, &'static [u8]);
        let cases: [Case; 3] = [
            ("body", spec_headers(SPEC_ID, "1614265330", SPEC_SIG), br#"{"test": 2432232315}"#),
            ("id", spec_headers("msg_p5jXN8AQM9LWM0D4loKWxJeK", "1614265330", SPEC_SIG), SPEC_BODY),
            ("timestamp", spec_headers(SPEC_ID, "1614265331", SPEC_SIG), SPEC_BODY),
        ];
        for (what, h, body) in cases {
            let err = verify_standard(&[SPEC_SECRET], h.as_slice(), body, now, 300).unwrap_err();
            assert_eq!(err, VerifyError::NoMatch { tried: 1, unreadable: 0, secrets: 1, ignored_versions: vec![] }, "{what}");
            assert_eq!(err.to_string(), "no signature matched: 1 v1 signature tried with 1 secret", "{what}");
        }
    }

    #[test]
    fn tolerance_applies_in_both_directions() {
        let h = spec_headers(SPEC_ID, "1614265330", SPEC_SIG);
        let verify = |now_s: i64| verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, at(now_s), 300);
        verify(SPEC_TS + 300).unwrap();
        verify(SPEC_TS - 300).unwrap();
        // Sub-second parts of the clock do not matter: Standard Webhooks compares whole seconds.
        verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, at(SPEC_TS + 300) + 999, 300).unwrap();
        let old = verify(SPEC_TS + 3780).unwrap_err();
        assert_eq!(old, VerifyError::TooOld { age_ms: 3_780_000, tolerance_s: 300, timestamp_ms: SPEC_TS * 1000 });
        assert_eq!(old.to_string(), "timestamp too old: 1h 3m old, tolerance 300 s");
        let new = verify(SPEC_TS - 301).unwrap_err();
        assert_eq!(new, VerifyError::TooNew { ahead_ms: 301_000, tolerance_s: 300, timestamp_ms: SPEC_TS * 1000 });
        assert_eq!(new.to_string(), "timestamp too new: 5m 1s in the future, tolerance 300 s");
    }

    #[test]
    fn rotation_either_secret_verifies() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let old = generate_secret(&mut rng);
        let new = generate_secret(&mut rng);
        let sig_old = standard_signature(&old, SPEC_ID, SPEC_TS, SPEC_BODY).unwrap();
        let sig_new = standard_signature(&new, SPEC_ID, SPEC_TS, SPEC_BODY).unwrap();
        let h = spec_headers(SPEC_ID, "1614265330", &format!("{sig_new} {sig_old}"));
        let now = at(SPEC_TS);
        // A receiver that still has the old secret, one that has the new one, and one that has both.
        let r = verify_standard(&[old.as_str()], h.as_slice(), SPEC_BODY, now, 300).unwrap();
        assert_eq!((r.signature_position, r.secret_position), (2, 1));
        let r = verify_standard(&[new.as_str()], h.as_slice(), SPEC_BODY, now, 300).unwrap();
        assert_eq!((r.signature_position, r.secret_position), (1, 1));
        let r = verify_standard(&[&old, &new], h.as_slice(), SPEC_BODY, now, 300).unwrap();
        assert_eq!((r.signature_position, r.secret_position), (1, 2));
        let third = generate_secret(&mut rng);
        assert_eq!(
            verify_standard(&[third], h.as_slice(), SPEC_BODY, now, 300).unwrap_err(),
            VerifyError::NoMatch { tried: 2, unreadable: 0, secrets: 1, ignored_versions: vec![] }
        );
    }

    #[test]
    fn unknown_versions_are_ignored_and_reported() {
        let h = spec_headers(SPEC_ID, "1614265330", &format!("v1a,abcd v2,xyz {SPEC_SIG}"));
        let ok = verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, at(SPEC_TS), 300).unwrap();
        assert_eq!(ok.signature_position, 3);
        let h = spec_headers(SPEC_ID, "1614265330", "v1a,abcd v1,Zm9v");
        let err = verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, at(SPEC_TS), 300).unwrap_err();
        assert_eq!(err, VerifyError::NoMatch { tried: 1, unreadable: 1, secrets: 1, ignored_versions: vec!["v1a".into()] });
        assert_eq!(
            err.to_string(),
            "no signature matched: 1 v1 signature tried with 1 secret (1 not a well-formed HMAC-SHA256); \
             ignored unsupported versions: v1a"
        );
    }

    #[test]
    fn header_problems_are_named_precisely() {
        let now = at(SPEC_TS);
        let full = spec_headers(SPEC_ID, "1614265330", SPEC_SIG);
        let without = |name: &str| full.iter().filter(|(n, _)| n != name).cloned().collect::<Vec<_>>();
        let table: Vec<(Vec<(String, String)>, VerifyError)> = vec![
            (without("webhook-id"), VerifyError::MissingHeader { name: "webhook-id" }),
            (without("webhook-timestamp"), VerifyError::MissingHeader { name: "webhook-timestamp" }),
            (without("webhook-signature"), VerifyError::MissingHeader { name: "webhook-signature" }),
            (
                spec_headers(SPEC_ID, "  ", SPEC_SIG),
                VerifyError::MalformedHeader { name: "webhook-timestamp", problem: "it is empty".into() },
            ),
            (
                spec_headers(SPEC_ID, "16142x", SPEC_SIG),
                VerifyError::MalformedHeader {
                    name: "webhook-timestamp",
                    problem: "expected Unix seconds (digits only), got \"16142x\"".into(),
                },
            ),
            (
                spec_headers(SPEC_ID, "1614265330000", SPEC_SIG),
                VerifyError::MalformedHeader {
                    name: "webhook-timestamp",
                    problem: "\"1614265330000\" looks like milliseconds; Standard Webhooks uses Unix seconds".into(),
                },
            ),
            (
                spec_headers(SPEC_ID, "1614265330", "g0hM9SsE+OTPJTGt"),
                VerifyError::MalformedHeader {
                    name: "webhook-signature",
                    problem: "1 entry and none has the form v1,<base64>: got \"g0hM9SsE+OTPJTGt\"".into(),
                },
            ),
        ];
        for (h, want) in table {
            assert_eq!(verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, now, 300).unwrap_err(), want);
        }
    }

    #[test]
    fn header_names_are_case_insensitive() {
        let h = vec![("Webhook-Id", SPEC_ID), ("WEBHOOK-TIMESTAMP", "1614265330"), ("Webhook-Signature", SPEC_SIG)];
        verify_standard(&[SPEC_SECRET], h.as_slice(), SPEC_BODY, at(SPEC_TS), 300).unwrap();
        // And a closure works as a header source.
        let lookup = |n: &str| h.as_slice().header(n);
        verify_standard(&[SPEC_SECRET], &lookup, SPEC_BODY, at(SPEC_TS), 300).unwrap();
    }

    #[test]
    fn secret_rules() {
        use SignatureScheme::*;
        type Case = (SignatureScheme, &'static str, Result<&'static [u8], SecretProblem>);
        let cases: &[Case] = &[
            (StandardWebhooks, "whsec_aGVsbG8=", Ok(b"hello")),
            (StandardWebhooks, "whsec_aGVsbG8", Ok(b"hello")), // padding optional
            (StandardWebhooks, "aGVsbG8=", Ok(b"hello")),
            (Gauge, "whsec_aGVsbG8=", Ok(b"hello")), // one secret format works for both schemes
            (Gauge, "aGVsbG8=", Ok(b"aGVsbG8=")),    // any other Gauge secret: its bytes as given
            (Gauge, "s3cr3t pass", Ok(b"s3cr3t pass")),
            (StandardWebhooks, "", Err(SecretProblem::Empty)),
            (Gauge, "", Err(SecretProblem::Empty)),
            (StandardWebhooks, "whsec_", Err(SecretProblem::EmptyAfterPrefix)),
            (Gauge, "whsec_!!", Err(SecretProblem::NotBase64AfterPrefix)),
            (StandardWebhooks, "not base64!", Err(SecretProblem::NotBase64)),
        ];
        for (scheme, secret, want) in cases {
            let got = signing_key(*scheme, secret);
            assert_eq!(got.as_deref().map_err(Clone::clone), want.clone(), "{scheme:?} {secret:?}");
        }
        // Error messages never contain the secret.
        let err = verify_standard(&["not base64!"], spec_headers("a", "1", SPEC_SIG).as_slice(), b"", 1000, 300).unwrap_err();
        assert_eq!(err, VerifyError::BadSecret { position: 1, problem: SecretProblem::NotBase64 });
        assert!(!err.to_string().contains("not base64!"));
    }

    #[test]
    fn generated_secrets_are_whsec_32_bytes_and_distinct() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let a = generate_secret(&mut rng);
        let b = generate_secret(&mut rng);
        assert!(a.starts_with("whsec_") && a.len() == 6 + 44, "{a}");
        assert_ne!(a, b);
        assert_eq!(signing_key(SignatureScheme::StandardWebhooks, &a).unwrap().len(), 32);
    }

    #[test]
    fn macs_are_compared_in_constant_time_helper() {
        // All comparisons go through `macs_equal` (subtle's ct_eq); check its contract, including length mismatch.
        let m = [7u8; MAC_LEN];
        assert!(macs_equal(&m, &[7u8; MAC_LEN]));
        let mut other = m;
        other[31] ^= 1;
        assert!(!macs_equal(&m, &other));
        assert!(!macs_equal(&m, &m[..31]));
        assert!(!macs_equal(&m, &[]));
    }

    fn gauge_headers(value: &str) -> Vec<(String, String)> {
        vec![("Gauge-Signature".into(), value.into())]
    }

    #[test]
    fn gauge_signs_and_verifies_with_rotation_and_legacy_headers() {
        let t = 1_767_225_600_123i64;
        let body = br#"{"id":"evt_1"}"#;
        let a = gauge_signature_hex("whsec_aGVsbG8=", t, body).unwrap();
        let b = gauge_signature_hex("plain-secret", t, body).unwrap();
        assert_eq!(a.len(), 64);
        // Deterministic and scheme-defined: HMAC-SHA256("hello", "{t}.{body}").
        assert_eq!(a, hex::encode(mac_of(b"hello", &[t.to_string().as_bytes(), b".", body])));
        let h = gauge_headers(&format!("t={t},v1={a},v1={b}"));
        let r = verify_gauge(&["plain-secret"], h.as_slice(), body, t + 1500, 300).unwrap();
        assert_eq!((r.header, r.signature_position, r.secret_position, r.age_ms), ("Gauge-Signature", 2, 1, 1500));
        verify_gauge(&["whsec_aGVsbG8="], h.as_slice(), body, t, 300).unwrap();
        // Upper-case hex is accepted.
        let h = gauge_headers(&format!("t={t}, v1={}", a.to_uppercase()));
        verify_gauge(&["whsec_aGVsbG8="], h.as_slice(), body, t, 300).unwrap();

        let legacy = vec![("x-pulse-signature", a.clone()), ("x-pulse-timestamp", t.to_string())];
        let r = verify_gauge(&["whsec_aGVsbG8="], legacy.as_slice(), body, t, 300).unwrap();
        assert_eq!(r.header, "x-pulse-signature");
        let err = verify_gauge(&["whsec_aGVsbG8="], legacy.as_slice(), b"{}", t, 300).unwrap_err();
        assert!(matches!(err, VerifyError::NoMatch { tried: 1, .. }), "{err:?}");
    }

    #[test]
    fn gauge_errors_are_precise() {
        let t = 1_767_225_600_000i64;
        let sig = gauge_signature_hex("k", t, b"x").unwrap();
        let none: Vec<(String, String)> = vec![];
        let m = |p: &str| VerifyError::MalformedHeader { name: "Gauge-Signature", problem: p.into() };
        let table: Vec<(Vec<(String, String)>, VerifyError)> = vec![
            (none, VerifyError::MissingHeader { name: "Gauge-Signature" }),
            (vec![("x-pulse-signature".into(), sig.clone())], VerifyError::MissingHeader { name: "x-pulse-timestamp" }),
            (gauge_headers(&format!("v1={sig}")), m(&format!("no t=<epoch ms> in \"v1={}\"…", &sig[..37]))),
            (gauge_headers(&format!("t=abc,v1={sig}")), m("t must be epoch milliseconds (digits only), got \"abc\"")),
            (gauge_headers(&format!("t={t}")), m("no v1=<hex> signature")),
            (gauge_headers(&format!("t={t},{sig}")), m(&format!("item \"{}\"… is not key=value", &sig[..40]))),
            (gauge_headers(&format!("t={t},t=1,v1={sig}")), m("two different t= values")),
            (
                gauge_headers(&format!("t={t},v0=abc")),
                VerifyError::NoMatch { tried: 0, unreadable: 0, secrets: 1, ignored_versions: vec!["v0".into()] },
            ),
            (
                gauge_headers(&format!("t={},v1={sig}", t - 301_000)),
                VerifyError::TooOld { age_ms: 301_000, tolerance_s: 300, timestamp_ms: t - 301_000 },
            ),
            (
                gauge_headers(&format!("t={},v1={sig}", t + 300_001)),
                VerifyError::TooNew { ahead_ms: 300_001, tolerance_s: 300, timestamp_ms: t + 300_001 },
            ),
        ];
        for (h, want) in table {
            assert_eq!(verify_gauge(&["k"], h.as_slice(), b"x", t, 300).unwrap_err(), want);
        }
        assert_eq!(
            VerifyError::NoMatch { tried: 0, unreadable: 0, secrets: 1, ignored_versions: vec!["v0".into()] }.to_string(),
            "no signature matched: the header has no v1 signature; ignored unsupported versions: v0"
        );
    }

    #[test]
    fn detects_the_scheme_from_headers() {
        assert_eq!(detect_scheme(spec_headers("a", "1", "v1,x").as_slice()), Some(SignatureScheme::StandardWebhooks));
        assert_eq!(detect_scheme(gauge_headers("t=1").as_slice()), Some(SignatureScheme::Gauge));
        assert_eq!(detect_scheme(vec![("X-Pulse-Signature", "ab")].as_slice()), Some(SignatureScheme::Gauge));
        assert_eq!(detect_scheme(vec![("content-type", "application/json")].as_slice()), None);
    }

    #[test]
    fn durations_read_naturally() {
        let table = [
            (0, "0 s"),
            (450, "450 ms"),
            (12_000, "12 s"),
            (1_500, "1.5 s"),
            (1_050, "1 s"),
            (59_999, "59.9 s"),
            (301_000, "5m 1s"),
            (3_780_000, "1h 3m"),
            (187_200_000, "2d 4h"),
        ];
        for (ms, want) in table {
            assert_eq!(human_duration_ms(ms), want);
        }
    }

    proptest! {
        #[test]
        fn verification_never_panics(
            id in ".{0,40}",
            ts in ".{0,24}",
            sig in ".{0,120}",
            gauge in ".{0,120}",
            pulse_sig in ".{0,80}",
            pulse_ts in "[0-9a-z]{0,20}",
            secret in ".{0,40}",
            body in proptest::collection::vec(any::<u8>(), 0..256),
            now in any::<i64>(),
            tol in any::<u64>(),
        ) {
            let h = vec![
                ("webhook-id".to_owned(), id),
                ("webhook-timestamp".to_owned(), ts),
                ("webhook-signature".to_owned(), sig),
                ("x-pulse-signature".to_owned(), pulse_sig),
                ("x-pulse-timestamp".to_owned(), pulse_ts),
            ];
            let _ = verify_standard(&[secret.as_str(), SPEC_SECRET], h.as_slice(), &body, now, tol);
            let _ = verify_gauge(&[secret.as_str()], h.as_slice(), &body, now, tol);
            let mut g = h.clone();
            g.push(("Gauge-Signature".to_owned(), gauge));
            let _ = verify_gauge(&[secret.as_str()], g.as_slice(), &body, now, tol);
        }

        #[test]
        fn what_is_signed_verifies(
            id in "[a-zA-Z0-9_]{1,30}",
            ts in 0i64..4_000_000_000,
            body in proptest::collection::vec(any::<u8>(), 0..256),
            seed in any::<u64>(),
        ) {
            let secret = generate_secret(&mut rand::rngs::StdRng::seed_from_u64(seed));
            let sig = standard_signature(&secret, &id, ts, &body).unwrap();
            let h = spec_headers(&id, &ts.to_string(), &sig);
            prop_assert!(verify_standard(&[&secret], h.as_slice(), &body, ts * 1000, 0).is_ok());
            let hex = gauge_signature_hex(&secret, ts, &body).unwrap();
            let g = gauge_headers(&format!("t={ts},v1={hex}"));
            prop_assert!(verify_gauge(&[&secret], g.as_slice(), &body, ts, 0).is_ok());
        }
    }
}
