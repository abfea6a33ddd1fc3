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

    #[test]
    fn the_latency_stamps_round_trip_and_are_zero_on_records_written_without_them() {
        use prost::Message;
        let task = DeliveryTask {
            delivery_id: "dlv_1".into(),
            fanout_received_at_us: 1_796_060_753_680_123,
            fanout_produced_at_us: 1_796_060_753_680_456,
            received_at_us: 1_796_060_753_690_000,
            ..Default::default()
        };
        assert_eq!(DeliveryTask::decode(task.encode_to_vec().as_slice()).unwrap(), task);
        let rec =
            AttemptRecord { delivery_id: "dlv_1".into(), received_at_us: 10, started_at_us: 25, started_at_ms: 0, ..Default::default() };
        assert_eq!(AttemptRecord::decode(rec.encode_to_vec().as_slice()).unwrap(), rec);
        // A record from before the fields (or from a writer that does not stamp) reads as "not stamped".
        let old = DeliveryTask { delivery_id: "dlv_1".into(), attempts_made: 2, ..Default::default() }.encode_to_vec();
        let t = DeliveryTask::decode(old.as_slice()).unwrap();
        assert_eq!((t.fanout_received_at_us, t.fanout_produced_at_us, t.received_at_us), (0, 0, 0));
        // Unset stamps cost nothing on the wire (proto3 defaults are not written).
        assert_eq!(DeliveryTask { delivery_id: "dlv_1".into(), attempts_made: 2, ..Default::default() }.encoded_len(), old.len());
        // A reader built before the fields skips them: the fields before and after are read unchanged.
        #[derive(Clone, PartialEq, prost::Message)]
        struct OldAttempt {
            #[prost(string, tag = "1")]
            delivery_id: String,
            #[prost(string, tag = "27")]
            rule_when: String,
        }
        let rec = AttemptRecord {
            delivery_id: "dlv_2".into(),
            rule_when: "2xx".into(),
            received_at_us: 1,
            started_at_us: 2,
            ..Default::default()
        };
        let old = OldAttempt::decode(rec.encode_to_vec().as_slice()).unwrap();
        assert_eq!((old.delivery_id.as_str(), old.rule_when.as_str()), ("dlv_2", "2xx"));
    }
}
