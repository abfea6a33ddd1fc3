//! Tenant credentials, as pure functions: API keys (`hlk_…`, kept only as a SHA-256 digest) and portal links
//! (`hlp_…`: a tenant, an expiry and a read-only flag, signed with HMAC-SHA256). The prefixes let secret
//! scanners and people recognise a hookline credential in a log or a repository.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub const API_KEY_PREFIX: &str = "hlk_";
pub const PORTAL_TOKEN_PREFIX: &str = "hlp_";
/// Characters of a key kept (and shown) to tell keys apart: the prefix and 8 of its 43 random characters.
pub const SHOWN_PREFIX_LEN: usize = API_KEY_PREFIX.len() + 8;
/// Longest portal token accepted (a tenant id is at most 128 bytes): bounds the work of a forged one.
pub const MAX_PORTAL_TOKEN_LEN: usize = 1024;

/// A new API key: `hlk_` and 32 random bytes in URL-safe base64 (256 bits: a plain digest is a safe store).
pub fn generate_api_key(rng: &mut dyn rand::RngCore) -> String {
    let mut bytes = [0u8; 32];
    rng.fill_bytes(&mut bytes);
    format!("{API_KEY_PREFIX}{}", B64URL.encode(bytes))
}

/// What is stored of a key: its SHA-256, hex.
pub fn api_key_digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// What a portal link grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortalGrant {
    #[serde(rename = "t")]
    pub tenant: String,
    #[serde(rename = "exp")]
    pub expires_at_ms: i64,
    #[serde(rename = "ro", default)]
    pub read_only: bool,
    /// Random, so two links made in the same millisecond differ.
    #[serde(rename = "n")]
    pub nonce: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PortalTokenError {
    #[error("the portal link is malformed")]
    Malformed,
    #[error("the portal link's signature does not match (altered, or signed with another key)")]
    BadSignature,
    #[error("the portal link has expired")]
    Expired,
}

const DOMAIN: &[u8] = b"hookline.portal.v1\0";

fn mac(key: &[u8], payload_b64: &str) -> [u8; 32] {
    // HMAC accepts keys of any length, so `new_from_slice` cannot fail; the fallback keeps this total.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else { return [0; 32] };
    m.update(DOMAIN);
    m.update(payload_b64.as_bytes());
    m.finalize().into_bytes().into()
}

/// `hlp_<base64url(JSON grant)>.<base64url(HMAC)>`.
pub fn sign_portal_token(grant: &PortalGrant, key: &[u8]) -> String {
    let payload = B64URL.encode(serde_json::to_vec(grant).unwrap_or_default());
    let sig = B64URL.encode(mac(key, &payload));
    format!("{PORTAL_TOKEN_PREFIX}{payload}.{sig}")
}

/// The grant of a portal token that `key` signed and that has not expired at `now_ms`.
pub fn verify_portal_token(token: &str, key: &[u8], now_ms: i64) -> Result<PortalGrant, PortalTokenError> {
    if token.len() > MAX_PORTAL_TOKEN_LEN {
        return Err(PortalTokenError::Malformed);
    }
    let rest = token.strip_prefix(PORTAL_TOKEN_PREFIX).ok_or(PortalTokenError::Malformed)?;
    let (payload, sig) = rest.split_once('.').ok_or(PortalTokenError::Malformed)?;
    let sig = B64URL.decode(sig).map_err(|_| PortalTokenError::Malformed)?;
    // Checked before the payload is even decoded: nothing of an unsigned token is trusted.
    if !bool::from(mac(key, payload).as_slice().ct_eq(&sig)) {
        return Err(PortalTokenError::BadSignature);
    }
    let json = B64URL.decode(payload).map_err(|_| PortalTokenError::Malformed)?;
    let grant: PortalGrant = serde_json::from_slice(&json).map_err(|_| PortalTokenError::Malformed)?;
    if grant.expires_at_ms <= now_ms {
        return Err(PortalTokenError::Expired);
    }
    Ok(grant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn grant(exp: i64) -> PortalGrant {
        PortalGrant { tenant: "acme".into(), expires_at_ms: exp, read_only: true, nonce: "n1".into() }
    }

    #[test]
    fn api_keys_are_prefixed_random_and_stored_as_a_digest() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let (a, b) = (generate_api_key(&mut rng), generate_api_key(&mut rng));
        assert!(a.starts_with("hlk_") && a.len() == 4 + 43, "{a}");
        assert_ne!(a, b);
        assert_eq!(api_key_digest(&a), api_key_digest(&a));
        assert_ne!(api_key_digest(&a), api_key_digest(&b));
        assert!(!api_key_digest(&a).contains(&a[4..]));
    }

    #[test]
    fn a_portal_token_verifies_until_it_expires() {
        let t = sign_portal_token(&grant(2_000), b"k");
        assert!(t.starts_with("hlp_"));
        assert_eq!(verify_portal_token(&t, b"k", 1_999), Ok(grant(2_000)));
        assert_eq!(verify_portal_token(&t, b"k", 2_000), Err(PortalTokenError::Expired));
    }

    #[test]
    fn a_tampered_or_foreign_token_is_refused() {
        let t = sign_portal_token(&grant(2_000), b"k");
        assert_eq!(verify_portal_token(&t, b"other", 0), Err(PortalTokenError::BadSignature));
        // Another tenant (or a later expiry) in the payload, with the original signature.
        let (payload, sig) = t[4..].split_once('.').unwrap();
        let mut g: PortalGrant = serde_json::from_slice(&B64URL.decode(payload).unwrap()).unwrap();
        g.tenant = "globex".into();
        let forged = format!("hlp_{}.{sig}", B64URL.encode(serde_json::to_vec(&g).unwrap()));
        assert_eq!(verify_portal_token(&forged, b"k", 0), Err(PortalTokenError::BadSignature));
        for bad in ["", "hlp_", "hlp_abc", "hlk_x.y", "hlp_a.!!", &"hlp_a.".repeat(300)] {
            assert!(verify_portal_token(bad, b"k", 0).is_err(), "{bad}");
        }
    }
}
