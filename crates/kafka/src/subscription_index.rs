//! The fan-out index: subscriptions by tenant, then by what their event-type patterns key on (exact names in a
//! hash map, `prefix.*` by prefix, `*` in a list). A lookup costs one probe per tenant, one for the exact name,
//! one per dot-prefix of the event type and the `*` list: it does not grow with the number of subscriptions.
//! Patterns are keyed by `hookline_core::filter::key`, the same function `matches` is defined by, so a lookup
//! returns exactly what the linear filter (`filter::delivers` over every subscription) would.

use std::collections::HashMap;
use std::sync::Arc;

use hookline_core::filter::{self, Key};

use crate::state::SubscriptionEntry;

/// One bucket: subscriptions by id (a map, so removing one is O(1) however full the bucket is).
type Bucket = HashMap<Arc<str>, Arc<SubscriptionEntry>>;

#[derive(Default)]
struct TenantIndex {
    exact: HashMap<Box<str>, Bucket>,
    /// Keyed by the prefix including its final `.`.
    prefix: HashMap<Box<str>, Bucket>,
    all: Bucket,
}

impl TenantIndex {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefix.is_empty() && self.all.is_empty()
    }
}

/// The index; the caller keeps it in step with the table (`insert` each new version, `remove` the old one).
#[derive(Default)]
pub struct SubscriptionIndex {
    /// Keyed by tenant; `""` holds the subscriptions without one.
    tenants: HashMap<Box<str>, TenantIndex>,
}

impl SubscriptionIndex {
    pub fn insert(&mut self, entry: &Arc<SubscriptionEntry>) {
        let id: Arc<str> = Arc::from(entry.sub.id.as_str());
        let t = self.tenants.entry(entry.sub.tenant.as_str().into()).or_default();
        for pattern in &entry.sub.event_types {
            let bucket = match filter::key(pattern) {
                Key::All => &mut t.all,
                Key::Exact(name) => t.exact.entry(name.into()).or_default(),
                Key::Prefix(prefix) => t.prefix.entry(prefix.into()).or_default(),
                Key::Never => continue,
            };
            bucket.insert(id.clone(), entry.clone());
        }
        if t.is_empty() {
            self.tenants.remove(entry.sub.tenant.as_str());
        }
    }

    /// Removes `entry` (the version that was inserted), dropping buckets and tenants that become empty.
    pub fn remove(&mut self, entry: &SubscriptionEntry) {
        let id = entry.sub.id.as_str();
        let Some(t) = self.tenants.get_mut(entry.sub.tenant.as_str()) else { return };
        for pattern in &entry.sub.event_types {
            match filter::key(pattern) {
                Key::All => {
                    t.all.remove(id);
                }
                Key::Exact(name) => remove_from(&mut t.exact, name, id),
                Key::Prefix(prefix) => remove_from(&mut t.prefix, prefix, id),
                Key::Never => {}
            }
        }
        if t.is_empty() {
            self.tenants.remove(entry.sub.tenant.as_str());
        }
    }

    /// The subscriptions of `tenant` whose filter matches `event_type`, each once, ordered by id.
    pub fn matching(&self, tenant: &str, event_type: &str) -> Vec<Arc<SubscriptionEntry>> {
        let Some(t) = self.tenants.get(tenant) else { return Vec::new() };
        let buckets = std::iter::once(&t.all)
            .chain(t.exact.get(event_type))
            .chain(filter::dot_prefixes(event_type).filter_map(|p| t.prefix.get(p)));
        let mut out = Vec::new();
        let mut sources = 0usize;
        for b in buckets.filter(|b| !b.is_empty()) {
            sources = sources.saturating_add(1);
            out.extend(b.values().cloned());
        }
        out.sort_unstable_by(|a, b| a.sub.id.cmp(&b.sub.id));
        // A subscription with several patterns that match sits in several buckets.
        if sources > 1 {
            out.dedup_by(|a, b| a.sub.id == b.sub.id);
        }
        out
    }

    /// Tenants with at least one keyed pattern (for tests: deleted ones are forgotten).
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }
}

fn remove_from(map: &mut HashMap<Box<str>, Bucket>, key: &str, id: &str) {
    if let Some(b) = map.get_mut(key) {
        b.remove(id);
        if b.is_empty() {
            map.remove(key);
        }
    }
}
