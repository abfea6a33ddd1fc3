//! Protobuf messages of the internal topics (generated from `proto/`), and identifiers.

#[allow(clippy::all, missing_docs)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/hookline.v1.rs"));
}

pub use generated::*;

use sha2::{Digest, Sha256};

/// The id of a subscription created with an `Idempotency-Key`: the same key always names the same subscription, on
/// every ingest replica, so a retried create cannot make a second one.
pub fn keyed_subscription_id(idempotency_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"hookline.subscription\0");
    h.update(idempotency_key.as_bytes());
    format!("sub_{}", hex::encode(&h.finalize()[..12]))
}

/// A hex SHA-256 digest (fingerprints of requests).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The delivery id for (event, subscription): deterministic, so a re-fan-out after a crash yields the same id and
/// receivers can deduplicate. `dlv_` + 32 hex digits of SHA-256(event id, NUL, subscription id).
pub fn delivery_id(event_id: &str, subscription_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(event_id.as_bytes());
    h.update([0u8]);
    h.update(subscription_id.as_bytes());
    let digest = h.finalize();
    let mut id = String::with_capacity(36);
    id.push_str("dlv_");
    id.push_str(&hex::encode(&digest[..16]));
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_id_is_deterministic_and_distinguishes_inputs() {
        let a = delivery_id("evt_1", "sub_1");
        assert_eq!(a, delivery_id("evt_1", "sub_1"));
        assert!(a.starts_with("dlv_") && a.len() == 36);
        assert_ne!(a, delivery_id("evt_1", "sub_2"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(delivery_id("ab", "c"), delivery_id("a", "bc"));
    }
}
