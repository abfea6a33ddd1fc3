//! The fan-out index: subscriptions by tenant, then by what their event-type patterns key on (exact names in a
//! hash set, `prefix.*` by prefix, `*` in a list). A lookup costs one probe per tenant, one for the exact name,
//! one per dot-prefix of the event type and the `*` list: it does not grow with the number of subscriptions.
//! Patterns are keyed by `hookline_core::filter::key`, the same function `matches` is defined by, so a lookup
//! returns exactly what the linear filter (`filter::delivers` over every subscription) would.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hookline_core::filter::{self, Key};

use crate::state::SubscriptionEntry;

/// One bucket: the subscriptions of one key, in a plain list, as a lookup walks it without chasing a map's slots
/// (which costs a cache miss each on a large table). Most keys have one subscription (a type only it names), so
/// that one is held inline with the position of its pattern: a bucket is two words, and it is its own key in the
/// tenant's sets (hashed as its pattern's key, read from its subscription: the index keeps no copy of a name).
/// The list is allocated only for a second subscription; past [`INDEXED`] entries a map of positions keeps
/// removal O(1), so a change to one of many `*` subscriptions of a tenant does not scan them all.
#[derive(Default)]
enum Bucket {
    #[default]
    Empty,
    One {
        entry: Arc<SubscriptionEntry>,
        pattern: u32,
    },
    Many(Box<Many>),
}

struct Many {
    /// The bucket's pattern (one of its subscriptions' allocations of it).
    pattern: Arc<str>,
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

/// What a pattern is looked up by: the name for an exact one, the prefix with its `.` for `prefix.*`.
fn lookup_key(pattern: &str) -> &str {
    match filter::key(pattern) {
        Key::Prefix(p) => p,
        _ => pattern,
    }
}

impl Bucket {
    fn is_empty(&self) -> bool {
        matches!(self, Bucket::Empty)
    }

    fn items(&self) -> &[Arc<SubscriptionEntry>] {
        match self {
            Bucket::Empty => &[],
            Bucket::One { entry, .. } => std::slice::from_ref(entry),
            Bucket::Many(m) => &m.items,
        }
    }

    fn pattern(&self) -> &str {
        match self {
            Bucket::Empty => "",
            Bucket::One { entry, pattern } => entry.sub.event_types.get(*pattern as usize).map_or("", |p| p),
            Bucket::Many(m) => &m.pattern,
        }
    }

    /// `entry`'s `pattern`-th pattern has this bucket's key.
    fn insert(&mut self, pattern: u32, entry: &Arc<SubscriptionEntry>) {
        let id = &*entry.sub.id;
        match self {
            Bucket::Empty => *self = Bucket::One { entry: entry.clone(), pattern },
            // A subscription listing the same pattern twice is in the bucket once.
            Bucket::One { entry: e, .. } if *e.sub.id == *id => *self = Bucket::One { entry: entry.clone(), pattern },
            Bucket::One { entry: e, pattern: p } => {
                let first = e.clone();
                let pattern = first.sub.event_types.get(*p as usize).cloned().unwrap_or_else(|| Arc::from(""));
                *self = Bucket::Many(Box::new(Many { pattern, items: vec![first, entry.clone()], positions: None }));
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
                        p.insert(entry.sub.id.clone(), last);
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
            Bucket::One { entry, .. } => {
                if *entry.sub.id == *id {
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
                // Back to one held inline (and none): the list and its map are freed. The one left has the
                // bucket's pattern (equal key, equal text: `prefix.*` is its prefix and `*`).
                match m.items.len() {
                    0 => *self = Bucket::Empty,
                    1 => {
                        let entry = m.items[0].clone();
                        let pattern = entry.sub.event_types.iter().position(|p| **p == *m.pattern).unwrap_or(0);
                        *self = Bucket::One { entry, pattern: u32::try_from(pattern).unwrap_or(u32::MAX) };
                    }
                    _ => {}
                }
            }
        }
    }
}

// In a tenant's sets a bucket is its own key: hash, equality and the borrowed `str` are its pattern's lookup key,
// as `HashSet` requires of an element looked up by it.
impl Borrow<str> for Bucket {
    fn borrow(&self) -> &str {
        lookup_key(self.pattern())
    }
}

impl Hash for Bucket {
    fn hash<H: Hasher>(&self, state: &mut H) {
        lookup_key(self.pattern()).hash(state);
    }
}

impl PartialEq for Bucket {
    fn eq(&self, other: &Self) -> bool {
        lookup_key(self.pattern()) == lookup_key(other.pattern())
    }
}

impl Eq for Bucket {}

/// Adds `entry` (whose `pattern`-th pattern is looked up by `key`) to the bucket of `key` in `set`.
fn add_to(set: &mut HashSet<Bucket>, key: &str, pattern: u32, entry: &Arc<SubscriptionEntry>) {
    // An element of a set is not changed in place: taken out, changed (its key stays), put back.
    let mut bucket = set.take(key).unwrap_or_default();
    bucket.insert(pattern, entry);
    set.insert(bucket);
}

fn remove_from(set: &mut HashSet<Bucket>, key: &str, id: &str) {
    if let Some(mut bucket) = set.take(key) {
        bucket.remove(id);
        if !bucket.is_empty() {
            set.insert(bucket);
        }
    }
}

#[derive(Default)]
struct TenantIndex {
    exact: HashSet<Bucket>,
    /// Looked up by the prefix including its final `.`.
    prefix: HashSet<Bucket>,
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
        let t = self.tenants.entry(entry.sub.tenant.clone()).or_default();
        for (i, pattern) in entry.sub.event_types.iter().enumerate() {
            // Beyond any real list (the API caps it far lower); a position the bucket could not name is skipped
            // rather than mis-keyed.
            let Ok(i) = u32::try_from(i) else { break };
            match filter::key(pattern) {
                Key::All => t.all.insert(i, entry),
                Key::Exact(name) => add_to(&mut t.exact, name, i, entry),
                Key::Prefix(prefix) => add_to(&mut t.prefix, prefix, i, entry),
                Key::Never => {}
            }
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
                Key::All => t.all.remove(id),
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
        let buckets =
            std::iter::once(&t.all).chain(t.exact.get(event_type)).chain(filter::dot_prefixes(event_type).filter_map(|p| t.prefix.get(p)));
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
