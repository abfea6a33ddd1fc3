//! The fan-out index: subscriptions by tenant, then by what their event-type patterns key on (exact names in a
//! hash map, `prefix.*` by prefix, `*` in a list). A lookup costs one probe per tenant, one for the exact name,
//! one per dot-prefix of the event type and the `*` list: it does not grow with the number of subscriptions.
//! Patterns are keyed by `hookline_core::filter::key`, the same function `matches` is defined by, so a lookup
//! returns exactly what the linear filter (`filter::delivers` over every subscription) would.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hookline_core::filter::{self, Key};

use crate::state::SubscriptionEntry;

/// One bucket: the subscriptions of one key, in a plain list, as a lookup walks it without chasing a map's slots
/// (which costs a cache miss each on a large table). Most keys have one subscription (a type only it names), so
/// that one is held inline: a bucket is two words, the list and its map are allocated only for a second one. Past
/// [`INDEXED`] entries a map of positions keeps removal O(1), so a change to one of many `*` subscriptions of a
/// tenant does not scan them all.
#[derive(Default)]
enum Bucket {
    #[default]
    Empty,
    One(Arc<SubscriptionEntry>),
    Many(Box<Many>),
}

struct Many {
    items: Vec<Arc<SubscriptionEntry>>,
    /// Keyed by the entries' own ids.
    positions: Option<HashMap<Arc<str>, usize>>,
}

/// Entries from which a bucket keeps a map of positions.
const INDEXED: usize = 16;

impl Many {
    fn position(&self, id: &str) -> Option<usize> {
        match &self.positions {
            Some(p) => p.get(id).copied(),
            None => self.items.iter().position(|e| *e.sub.id == *id),
        }
    }
}

impl Bucket {
    fn is_empty(&self) -> bool {
        matches!(self, Bucket::Empty)
    }

    fn items(&self) -> &[Arc<SubscriptionEntry>] {
        match self {
            Bucket::Empty => &[],
            Bucket::One(e) => std::slice::from_ref(e),
            Bucket::Many(m) => &m.items,
        }
    }

    fn insert(&mut self, id: &Arc<str>, entry: &Arc<SubscriptionEntry>) {
        match self {
            Bucket::Empty => *self = Bucket::One(entry.clone()),
            // A subscription listing the same pattern twice is in the bucket once.
            Bucket::One(e) if *e.sub.id == **id => *e = entry.clone(),
            Bucket::One(e) => {
                let first = e.clone();
                *self = Bucket::Many(Box::new(Many { items: vec![first, entry.clone()], positions: None }));
            }
            Bucket::Many(m) => {
                if let Some(i) = m.position(id) {
                    m.items[i] = entry.clone();
                    return;
                }
                m.items.push(entry.clone());
                let last = m.items.len() - 1;
                match &mut m.positions {
                    Some(p) => {
                        p.insert(id.clone(), last);
                    }
                    None if m.items.len() > INDEXED => {
                        let p = m.items.iter().enumerate().map(|(i, e)| (e.sub.id.clone(), i)).collect();
                        m.positions = Some(p);
                    }
                    None => {}
                }
            }
        }
    }

    fn remove(&mut self, id: &str) {
        match self {
            Bucket::Empty => {}
            Bucket::One(e) => {
                if *e.sub.id == *id {
                    *self = Bucket::Empty;
                }
            }
            Bucket::Many(m) => {
                let Some(i) = m.position(id) else { return };
                m.items.swap_remove(i);
                if let Some(p) = &mut m.positions {
                    p.remove(id);
                    if let Some(moved) = m.items.get(i) {
                        if let Some(slot) = p.get_mut(&*moved.sub.id) {
                            *slot = i;
                        }
                    }
                }
                // Back to one held inline (and none): the list and its map are freed.
                match m.items.len() {
                    0 => *self = Bucket::Empty,
                    1 => *self = Bucket::One(m.items[0].clone()),
                    _ => {}
                }
            }
        }
    }
}

/// A `prefix.*` pattern as a key: the entry's own allocation of the pattern, hashed and compared as the prefix
/// without its `*` (what a lookup probes with), so the index keeps no copy of the name.
struct PrefixKey(Arc<str>);

impl PrefixKey {
    fn prefix(&self) -> &str {
        self.0.strip_suffix('*').unwrap_or(&self.0)
    }
}

impl Borrow<str> for PrefixKey {
    fn borrow(&self) -> &str {
        self.prefix()
    }
}

// Hash and equality are the borrowed form's, as `HashMap` requires of a key looked up by it.
impl Hash for PrefixKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.prefix().hash(state);
    }
}

impl PartialEq for PrefixKey {
    fn eq(&self, other: &Self) -> bool {
        self.prefix() == other.prefix()
    }
}

impl Eq for PrefixKey {}

#[derive(Default)]
struct TenantIndex {
    /// Keyed by the entries' own pattern allocations (an exact pattern is the name); the first entry's stays the
    /// key while the bucket lives (equal text: a later lookup finds the same bucket).
    exact: HashMap<Arc<str>, Bucket>,
    /// Keyed by the pattern, looked up by the prefix including its final `.`.
    prefix: HashMap<PrefixKey, Bucket>,
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
    /// Keyed by tenant (the entries' one name per tenant); `""` holds the subscriptions without one.
    tenants: HashMap<Arc<str>, TenantIndex>,
}

impl SubscriptionIndex {
    pub fn insert(&mut self, entry: &Arc<SubscriptionEntry>) {
        let id = &entry.sub.id;
        let t = self.tenants.entry(entry.sub.tenant.clone()).or_default();
        for pattern in &entry.sub.event_types {
            let bucket = match filter::key(pattern) {
                Key::All => &mut t.all,
                Key::Exact(_) => t.exact.entry(pattern.clone()).or_default(),
                Key::Prefix(_) => t.prefix.entry(PrefixKey(pattern.clone())).or_default(),
                Key::Never => continue,
            };
            bucket.insert(id, entry);
        }
        if t.is_empty() {
            self.tenants.remove(&*entry.sub.tenant);
        }
    }

    /// Removes `entry` (the version that was inserted), dropping buckets and tenants that become empty.
    pub fn remove(&mut self, entry: &SubscriptionEntry) {
        let id = &*entry.sub.id;
        let Some(t) = self.tenants.get_mut(&*entry.sub.tenant) else { return };
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
            self.tenants.remove(&*entry.sub.tenant);
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
            out.extend(b.items().iter().cloned());
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

fn remove_from<K: Borrow<str> + Hash + Eq>(map: &mut HashMap<K, Bucket>, key: &str, id: &str) {
    if let Some(b) = map.get_mut(key) {
        b.remove(id);
        if b.is_empty() {
            map.remove(key);
        }
    }
}
