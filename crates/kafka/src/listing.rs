//! The subscription table's keys: each holds the entry itself (one pointer) and orders or hashes it by the
//! entry's own id or (tenant, id), so the table's three orders keep no copy of an id or a tenant's name.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::state::SubscriptionEntry;

/// An entry keyed by its id: looked up (`HashSet`) and ordered (`BTreeSet`) as the `str` of the id.
#[derive(Clone)]
pub(crate) struct ById(pub(crate) Arc<SubscriptionEntry>);

impl Borrow<str> for ById {
    fn borrow(&self) -> &str {
        &self.0.sub.id
    }
}

// Hash, equality and order are the borrowed `str`'s, as the collections require of a key looked up by it.
impl Hash for ById {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (*self.0.sub.id).hash(state);
    }
}

impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.sub.id == other.0.sub.id
    }
}

impl Eq for ById {}

impl PartialOrd for ById {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ById {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.sub.id.cmp(&other.0.sub.id)
    }
}

/// What orders a tenant's listing: (tenant, id). A stored key and a probe made of two `&str` compare alike.
pub(crate) trait TenantOrder {
    fn tenant_and_id(&self) -> (&str, &str);
}

/// An entry in (tenant, id) order.
#[derive(Clone)]
pub(crate) struct ByTenant(pub(crate) Arc<SubscriptionEntry>);

/// A position in (tenant, id) order to look up or start a range from.
pub(crate) struct Probe<'a>(pub(crate) &'a str, pub(crate) &'a str);

impl TenantOrder for ByTenant {
    fn tenant_and_id(&self) -> (&str, &str) {
        (&self.0.sub.tenant, &self.0.sub.id)
    }
}

impl TenantOrder for Probe<'_> {
    fn tenant_and_id(&self) -> (&str, &str) {
        (self.0, self.1)
    }
}

impl<'a> Borrow<dyn TenantOrder + 'a> for ByTenant {
    fn borrow(&self) -> &(dyn TenantOrder + 'a) {
        self
    }
}

impl PartialEq for dyn TenantOrder + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.tenant_and_id() == other.tenant_and_id()
    }
}

impl Eq for dyn TenantOrder + '_ {}

impl PartialOrd for dyn TenantOrder + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn TenantOrder + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tenant_and_id().cmp(&other.tenant_and_id())
    }
}

impl PartialEq for ByTenant {
    fn eq(&self, other: &Self) -> bool {
        self.tenant_and_id() == other.tenant_and_id()
    }
}

impl Eq for ByTenant {}

impl PartialOrd for ByTenant {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByTenant {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tenant_and_id().cmp(&other.tenant_and_id())
    }
}
