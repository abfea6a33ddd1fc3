//! Tenants and their API keys, read from the compacted `tenants` and `api-keys` topics into memory (ingest is
//! their only writer and reader). Keys are found by the SHA-256 of the presented key; the key itself is never
//! stored. A key's last use is its own record (`<key id>/used`), written at most once per
//! [`LAST_USED_WRITE_INTERVAL_MS`] per key by each replica, so authentication never waits on Kafka and a late
//! usage write cannot bring back a revoked key.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use hookline_core::model::{ApiKey, ApiKeyUsage, Tenant};
use prost::Message as _;

/// How often one replica records that a key was used (the shown time is at most this stale).
pub const LAST_USED_WRITE_INTERVAL_MS: i64 = 60_000;
/// The suffix of a key's usage record.
pub const USAGE_SUFFIX: &str = "/used";

/// Tenants by id, in id order (the listing walks a range). Cloning shares it.
#[derive(Clone, Default)]
pub struct TenantTable {
    inner: Arc<RwLock<BTreeMap<String, Arc<Tenant>>>>,
}

impl TenantTable {
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) {
        let id = String::from_utf8_lossy(key).into_owned();
        let mut map = self.inner.write().expect("tenant table lock");
        match value.filter(|v| !v.is_empty()).map(Tenant::decode) {
            None => {
                map.remove(&id);
            }
            Some(Ok(mut t)) => {
                t.id.clone_from(&id);
                map.insert(id, Arc::new(t));
            }
            Some(Err(e)) => tracing::warn!(tenant = %id, error = %e, "undecodable tenant record ignored"),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Tenant>> {
        self.inner.read().expect("tenant table lock").get(id).cloned()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.inner.read().expect("tenant table lock").contains_key(id)
    }

    /// Up to `limit` tenants after the id `after`, and whether more follow.
    pub fn page(&self, after: Option<&str>, limit: usize) -> (Vec<Arc<Tenant>>, bool) {
        use std::ops::Bound::{Excluded, Unbounded};
        let map = self.inner.read().expect("tenant table lock");
        let start = after.map_or(Unbounded, |a| Excluded(a.to_owned()));
        let mut it = map.range::<String, _>((start, Unbounded)).map(|(_, t)| t.clone());
        let items: Vec<_> = it.by_ref().take(limit).collect();
        let more = it.next().is_some();
        (items, more)
    }
}

#[derive(Default)]
struct Keys {
    by_id: HashMap<String, Arc<ApiKey>>,
    /// Digest → key id.
    by_digest: HashMap<String, String>,
    /// Last use per key id, as recorded on the topic or seen here, whichever is later.
    last_used: HashMap<String, i64>,
    /// When this replica last wrote a key's usage record.
    written: HashMap<String, i64>,
}

/// API keys. Cloning shares it.
#[derive(Clone, Default)]
pub struct KeyTable {
    inner: Arc<RwLock<Keys>>,
}

impl KeyTable {
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) {
        let key = String::from_utf8_lossy(key).into_owned();
        let mut k = self.inner.write().expect("key table lock");
        if let Some(id) = key.strip_suffix(USAGE_SUFFIX) {
            match value.filter(|v| !v.is_empty()).map(ApiKeyUsage::decode) {
                None => {
                    k.last_used.remove(id);
                }
                Some(Ok(u)) => {
                    let at = k.last_used.entry(id.to_owned()).or_insert(0);
                    *at = (*at).max(u.last_used_at_ms);
                }
                Some(Err(e)) => tracing::warn!(key_id = %id, error = %e, "undecodable API key usage record ignored"),
            }
            return;
        }
        match value.filter(|v| !v.is_empty()).map(ApiKey::decode) {
            None => {
                if let Some(old) = k.by_id.remove(&key) {
                    k.by_digest.remove(&old.sha256);
                }
                k.last_used.remove(&key);
                k.written.remove(&key);
            }
            Some(Ok(mut a)) => {
                a.id.clone_from(&key);
                if let Some(old) = k.by_id.insert(key.clone(), Arc::new(a.clone())) {
                    k.by_digest.remove(&old.sha256);
                }
                k.by_digest.insert(a.sha256, key);
            }
            Some(Err(e)) => tracing::warn!(key_id = %key, error = %e, "undecodable API key record ignored"),
        }
    }

    /// The key whose digest is `digest`.
    pub fn find(&self, digest: &str) -> Option<Arc<ApiKey>> {
        let k = self.inner.read().expect("key table lock");
        k.by_digest.get(digest).and_then(|id| k.by_id.get(id)).cloned()
    }

    pub fn get(&self, id: &str) -> Option<Arc<ApiKey>> {
        self.inner.read().expect("key table lock").by_id.get(id).cloned()
    }

    /// The keys of `tenant`, oldest first.
    pub fn of_tenant(&self, tenant: &str) -> Vec<(Arc<ApiKey>, Option<i64>)> {
        let k = self.inner.read().expect("key table lock");
        let mut v: Vec<_> = k.by_id.values().filter(|a| a.tenant == tenant).map(|a| (a.clone(), k.last_used.get(&a.id).copied())).collect();
        v.sort_by(|(a, _), (b, _)| a.created_at_ms.cmp(&b.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        v
    }

    /// Notes a use of key `id` at `now_ms`; true when this replica should record it on the topic now (its last
    /// record of it is older than [`LAST_USED_WRITE_INTERVAL_MS`]).
    pub fn touch(&self, id: &str, now_ms: i64) -> bool {
        let mut k = self.inner.write().expect("key table lock");
        if !k.by_id.contains_key(id) {
            return false;
        }
        let at = k.last_used.entry(id.to_owned()).or_insert(0);
        *at = (*at).max(now_ms);
        let written = k.written.entry(id.to_owned()).or_insert(i64::MIN);
        if now_ms.saturating_sub(*written) < LAST_USED_WRITE_INTERVAL_MS {
            return false;
        }
        *written = now_ms;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, tenant: &str, digest: &str) -> Vec<u8> {
        ApiKey { id: id.into(), tenant: tenant.into(), sha256: digest.into(), created_at_ms: 1, ..Default::default() }.encode_to_vec()
    }

    #[test]
    fn a_revoked_key_is_not_found_and_a_late_usage_record_does_not_revive_it() {
        let t = KeyTable::default();
        t.apply(b"key_1", Some(&key("key_1", "acme", "d1")));
        assert_eq!(t.find("d1").unwrap().tenant, "acme");
        t.apply(b"key_1", None);
        assert!(t.find("d1").is_none());
        t.apply(b"key_1/used", Some(&ApiKeyUsage { key_id: "key_1".into(), last_used_at_ms: 9 }.encode_to_vec()));
        assert!(t.find("d1").is_none() && t.get("key_1").is_none());
        assert!(!t.touch("key_1", 10), "no usage is written for a key that is gone");
    }

    #[test]
    fn usage_is_written_at_most_once_per_interval_and_shown_at_once() {
        let t = KeyTable::default();
        t.apply(b"key_1", Some(&key("key_1", "acme", "d1")));
        assert!(t.touch("key_1", 1_000));
        assert!(!t.touch("key_1", 2_000));
        assert_eq!(t.of_tenant("acme")[0].1, Some(2_000), "the latest use is shown even when not yet written");
        assert!(!t.touch("key_1", 1_000 + LAST_USED_WRITE_INTERVAL_MS - 1));
        assert!(t.touch("key_1", 1_000 + LAST_USED_WRITE_INTERVAL_MS));
        // A record from another replica never moves the time back.
        t.apply(b"key_1/used", Some(&ApiKeyUsage { key_id: "key_1".into(), last_used_at_ms: 5 }.encode_to_vec()));
        assert_eq!(t.of_tenant("acme")[0].1, Some(1_000 + LAST_USED_WRITE_INTERVAL_MS));
        assert!(t.of_tenant("other").is_empty());
    }

    #[test]
    fn tenants_page_in_id_order() {
        let t = TenantTable::default();
        for id in ["c", "a", "b"] {
            t.apply(id.as_bytes(), Some(&Tenant { id: id.into(), ..Default::default() }.encode_to_vec()));
        }
        let (page, more) = t.page(None, 2);
        assert_eq!(page.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(more);
        let (page, more) = t.page(Some("b"), 2);
        assert_eq!(page.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["c"]);
        assert!(!more);
        t.apply(b"a", None);
        assert!(!t.contains("a"));
    }
}
