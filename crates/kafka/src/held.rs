//! The compact form in which a process holds a subscription (every service keeps one per subscription, so its
//! size is most of a process's memory per subscription held; docs/benchmarks.md, "Subscriptions held").
//!
//! The decoded record (`model::Subscription`, prost) is ~430 bytes of struct before its strings, most of them
//! empty for a typical subscription. Held instead: the fields a delivery, the fan-out or a listing reads, each in
//! its tightest owned form (boxed strings, no spare capacity), with what many subscriptions share held once per
//! process (a tenant's name, a policy's name, a master key's id), and the id and event-type patterns as the
//! `Arc<str>` the table's listing and the fan-out index key on (one allocation, not one per table). Everything
//! else (description, metadata, owner e-mail, inline policy text, custom headers, filter text, verification error,
//! and any field added to the record later) stays in the rest of the record, kept only when one of it is set: the
//! conversion back ([`HeldSubscription::to_subscription`]) gives exactly the record that was decoded.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use hookline_core::model::{EndpointState, Secret, Subscription};
use hookline_core::seal::Keyring;
use hookline_core::subscription::{Activity, Switches};

/// One signing secret as held: the secret in the clear once opened (a sealed one keeps its sealed form only
/// where it was not opened: `SecretMode::AsStored`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSecret {
    pub value: Box<str>,
    /// 0 = does not expire.
    pub expires_at_ms: i64,
    /// Which master key sealed it (one copy per process per key).
    pub key_id: Arc<str>,
    /// Empty once opened.
    pub sealed: Box<[u8]>,
}

/// A subscription as a process holds it. Read-only: a change is a new record, hence a new entry.
#[derive(Debug)]
pub struct HeldSubscription {
    /// The same allocation the table's listing and the fan-out index key on.
    pub id: Arc<str>,
    /// One copy per tenant per process.
    pub tenant: Arc<str>,
    pub url: Box<str>,
    /// The event-type patterns; the fan-out index keys on these allocations.
    pub event_types: Box<[Arc<str>]>,
    /// A built-in profile's name (one copy per name per process).
    pub policy: Arc<str>,
    /// Newest first (the order the record has).
    pub secrets: Box<[HeldSecret]>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub resume_generation: u64,
    pub verified_at_ms: i64,
    /// A `VerificationState`.
    pub verification: i32,
    pub rate_limit_per_s: u32,
    pub burst: u32,
    pub enabled: bool,
    pub paused: bool,
    /// The record's other fields, `None` when all of them are empty (the held fields above are left at their
    /// defaults in it).
    rest: Option<Box<Subscription>>,
}

/// Names that many subscriptions share, held once per process: whenever the map has doubled since the last
/// prune, the names nobody else holds are dropped, so it stays within about twice the live set.
pub(crate) struct Interned {
    map: HashMap<Arc<str>, ()>,
    prune_at: usize,
}

impl Default for Interned {
    fn default() -> Self {
        Self { map: HashMap::new(), prune_at: 64 }
    }
}

impl Interned {
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some((k, _)) = self.map.get_key_value(name) {
            return k.clone();
        }
        if self.map.len() >= self.prune_at {
            self.map.retain(|k, _| Arc::strong_count(k) > 1);
            self.prune_at = self.map.len().saturating_mul(2).max(64);
        }
        let k: Arc<str> = Arc::from(name);
        self.map.insert(k.clone(), ());
        k
    }
}

static TENANTS: LazyLock<Mutex<Interned>> = LazyLock::new(Default::default);
/// Policy names and master-key ids: a handful per process.
static NAMES: LazyLock<Mutex<Interned>> = LazyLock::new(Default::default);

fn tenant_name(name: &str) -> Arc<str> {
    TENANTS.lock().expect("interned tenants lock").get(name)
}

fn short_name(name: &str) -> Arc<str> {
    NAMES.lock().expect("interned names lock").get(name)
}

impl HeldSubscription {
    /// Takes the decoded record apart (its strings move, none is copied but into its tight form).
    pub fn from_record(mut sub: Subscription) -> Self {
        let secrets = std::mem::take(&mut sub.secrets)
            .into_iter()
            .map(|s| HeldSecret {
                value: s.value.into_boxed_str(),
                expires_at_ms: s.expires_at_ms,
                key_id: short_name(&s.key_id),
                sealed: s.sealed.to_vec().into_boxed_slice(),
            })
            .collect();
        let event_types = std::mem::take(&mut sub.event_types).into_iter().map(Arc::from).collect();
        let held = Self {
            id: Arc::from(std::mem::take(&mut sub.id)),
            tenant: tenant_name(&sub.tenant),
            url: std::mem::take(&mut sub.url).into_boxed_str(),
            event_types,
            policy: short_name(&sub.policy),
            secrets,
            created_at_ms: sub.created_at_ms,
            updated_at_ms: sub.updated_at_ms,
            resume_generation: sub.resume_generation,
            verified_at_ms: sub.verified_at_ms,
            verification: sub.verification,
            rate_limit_per_s: sub.rate_limit_per_s,
            burst: sub.burst,
            enabled: sub.enabled,
            paused: sub.paused,
            rest: None,
        };
        // What is left once the held fields are cleared: kept only if anything is.
        sub.tenant.clear();
        sub.policy.clear();
        sub.created_at_ms = 0;
        sub.updated_at_ms = 0;
        sub.resume_generation = 0;
        sub.verified_at_ms = 0;
        sub.verification = 0;
        sub.rate_limit_per_s = 0;
        sub.burst = 0;
        sub.enabled = false;
        sub.paused = false;
        let rest = (sub != Subscription::default()).then(|| {
            sub.metadata.shrink_to_fit();
            sub.headers.shrink_to_fit();
            Box::new(sub)
        });
        Self { rest, ..held }
    }

    /// The record this was made from, field for field.
    pub fn to_subscription(&self) -> Subscription {
        let mut sub = self.rest.as_deref().cloned().unwrap_or_default();
        sub.id = self.id.to_string();
        sub.tenant = self.tenant.to_string();
        sub.url = self.url.to_string();
        sub.event_types = self.event_types.iter().map(|t| t.to_string()).collect();
        sub.policy = self.policy.to_string();
        sub.secrets = self
            .secrets
            .iter()
            .map(|s| Secret {
                value: s.value.to_string(),
                expires_at_ms: s.expires_at_ms,
                key_id: s.key_id.to_string(),
                sealed: bytes::Bytes::copy_from_slice(&s.sealed),
            })
            .collect();
        sub.created_at_ms = self.created_at_ms;
        sub.updated_at_ms = self.updated_at_ms;
        sub.resume_generation = self.resume_generation;
        sub.verified_at_ms = self.verified_at_ms;
        sub.verification = self.verification;
        sub.rate_limit_per_s = self.rate_limit_per_s;
        sub.burst = self.burst;
        sub.enabled = self.enabled;
        sub.paused = self.paused;
        sub
    }

    /// Whether anything beyond the held fields was kept (for tests and the memory figures).
    pub fn keeps_rest(&self) -> bool {
        self.rest.is_some()
    }

    fn rest_str(&self, f: impl FnOnce(&Subscription) -> &str) -> &str {
        self.rest.as_deref().map_or("", f)
    }

    pub fn policy_toml(&self) -> &str {
        self.rest_str(|s| &s.policy_toml)
    }

    pub fn description(&self) -> &str {
        self.rest_str(|s| &s.description)
    }

    pub fn owner_email(&self) -> &str {
        self.rest_str(|s| &s.owner_email)
    }

    pub fn create_fingerprint(&self) -> &str {
        self.rest_str(|s| &s.create_fingerprint)
    }

    pub fn filter_json(&self) -> &str {
        self.rest_str(|s| &s.filter_json)
    }

    pub fn ordering_key(&self) -> &str {
        self.rest_str(|s| &s.ordering_key)
    }

    /// `OrderingMode` as stored (0 = none).
    pub fn ordering(&self) -> i32 {
        self.rest.as_deref().map_or(0, |s| s.ordering)
    }

    pub fn verification_error(&self) -> &str {
        self.rest_str(|s| &s.verification_error)
    }

    /// The custom headers as the record has them (name → value).
    pub fn headers(&self) -> Option<&HashMap<String, String>> {
        self.rest.as_deref().map(|s| &s.headers).filter(|h| !h.is_empty())
    }

    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.rest.as_deref().map(|s| &s.metadata).filter(|m| !m.is_empty())
    }

    /// What the subscription's own switches and its endpoint state say about delivering to it
    /// (`hookline_core::subscription::activity`).
    pub fn activity(&self, state: Option<&EndpointState>) -> Activity {
        hookline_core::subscription::activity_of(
            Switches {
                enabled: self.enabled,
                paused: self.paused,
                verification: self.verification,
                resume_generation: self.resume_generation,
            },
            state,
        )
    }

    /// Whether a secret is stored in the clear or under a master key other than the one that seals now
    /// (`hookline_core::seal::needs_reseal`).
    pub fn needs_reseal(&self, keyring: &Keyring) -> bool {
        self.secrets.iter().any(|s| hookline_core::seal::key_needs_reseal(&s.key_id, keyring))
            || self.rest.as_deref().is_some_and(|r| hookline_core::seal::headers_need_reseal(r, keyring))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_core::model::VerificationState;

    fn typical() -> Subscription {
        Subscription {
            id: "sub_1".into(),
            url: "https://example.com/hook".into(),
            tenant: "acme".into(),
            event_types: vec!["invoice.paid".into(), "order.*".into()],
            policy: "standard".into(),
            secrets: vec![Secret { value: "whsec_a".into(), expires_at_ms: 0, ..Default::default() }],
            enabled: true,
            created_at_ms: 5,
            updated_at_ms: 6,
            ..Default::default()
        }
    }

    #[test]
    fn a_typical_subscription_keeps_nothing_beyond_its_held_fields_and_converts_back_exactly() {
        let held = HeldSubscription::from_record(typical());
        assert!(!held.keeps_rest());
        assert_eq!(held.to_subscription(), typical());
        assert_eq!(held.owner_email(), "");
        assert!(held.headers().is_none());
    }

    #[test]
    fn every_other_field_survives_the_round_trip() {
        let mut full = typical();
        full.description = "d".into();
        full.metadata.insert("k".into(), "v".into());
        full.owner_email = "o@example.com".into();
        full.policy_toml = "[schedule]".into();
        full.create_fingerprint = "fp".into();
        full.headers.insert("X-A".into(), "1".into());
        full.filter_json = "{}".into();
        full.verification = VerificationState::Verified as i32;
        full.verification_error = "e".into();
        full.verified_at_ms = 9;
        full.paused = true;
        full.resume_generation = 3;
        full.rate_limit_per_s = 10;
        full.burst = 20;
        full.secrets.push(Secret {
            value: String::new(),
            expires_at_ms: 77,
            key_id: "k1".into(),
            sealed: bytes::Bytes::from_static(b"sealed"),
        });
        let held = HeldSubscription::from_record(full.clone());
        assert!(held.keeps_rest());
        assert_eq!(held.to_subscription(), full);
        assert_eq!(held.owner_email(), "o@example.com");
        assert_eq!(held.policy_toml(), "[schedule]");
        assert_eq!(held.headers().map(|h| h.len()), Some(1));
    }

    #[test]
    fn tenants_and_policy_names_are_one_copy_per_process() {
        let a = HeldSubscription::from_record(typical());
        let b = HeldSubscription::from_record(Subscription { id: "sub_2".into(), ..typical() });
        assert!(Arc::ptr_eq(&a.tenant, &b.tenant));
        assert!(Arc::ptr_eq(&a.policy, &b.policy));
    }

    #[test]
    fn activity_reads_the_held_switches() {
        let held = HeldSubscription::from_record(Subscription { paused: true, ..typical() });
        assert_eq!(held.activity(None), Activity::Paused);
        let held = HeldSubscription::from_record(Subscription { enabled: false, ..typical() });
        assert_eq!(held.activity(None), Activity::Disabled);
        assert!(HeldSubscription::from_record(typical()).activity(None).is_active());
    }
}
