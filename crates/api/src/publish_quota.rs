//! Publish quotas: how many events a tenant (and, within it, one API key) may publish through `POST /v1/events`
//! per second, with a burst. One token bucket per tenant and per key that has a quota, in this process: with
//! several ingest replicas behind a load balancer, each enforces the quota on what it receives.
//!
//! A refused publish costs nothing (its bucket is unchanged), so a client that waits the `Retry-After` it was
//! given gets in. Buckets that are full again remember nothing and are dropped when the map grows, so the map holds
//! about the publishers active within their burst window.

use std::collections::HashMap;
use std::sync::Mutex;

use hookline_core::rate_limit::{Gcra, RateLimit};

/// Buckets kept before the full ones are dropped.
const PRUNE_AT: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaScope {
    Tenant,
    Key,
}

impl QuotaScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Key => "key",
        }
    }
}

/// A publish over a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub scope: QuotaScope,
    pub limit: RateLimit,
    /// How long until the publish would be accepted.
    pub wait_us: u64,
}

impl Throttled {
    /// `Retry-After` in whole seconds, at least 1.
    pub fn retry_after_s(&self) -> u64 {
        self.wait_us.div_ceil(1_000_000).max(1)
    }
}

/// The quota a tenant or key has, from its own fields (0 = not set) over a default; `None`: no quota.
pub fn limit_of(per_s: u32, burst: u32, default: Option<RateLimit>) -> Option<RateLimit> {
    if per_s == 0 {
        return default;
    }
    Some(RateLimit { per_s, burst: if burst == 0 { per_s } else { burst } })
}

#[derive(Default)]
pub struct PublishQuotas {
    buckets: Mutex<HashMap<(QuotaScope, String), Gcra>>,
}

impl PublishQuotas {
    /// Takes one turn of the tenant's quota and of the key's (when each has one), or neither: `Err` names the
    /// first quota that is used up.
    pub fn admit(&self, tenant: (&str, Option<RateLimit>), key: Option<(&str, RateLimit)>, now_us: u64) -> Result<(), Throttled> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= PRUNE_AT {
            buckets.retain(|_, b| !b.is_full(now_us));
        }
        let wanted = [tenant.1.map(|l| (QuotaScope::Tenant, tenant.0, l)), key.map(|(id, l)| (QuotaScope::Key, id, l))];
        for (scope, id, limit) in wanted.iter().flatten() {
            let wait = buckets.get(&(*scope, (*id).to_owned())).map_or(0, |b| b.wait(*limit, now_us));
            if wait > 0 {
                return Err(Throttled { scope: *scope, limit: *limit, wait_us: wait });
            }
        }
        for (scope, id, limit) in wanted.into_iter().flatten() {
            let _ = buckets.entry((scope, id.to_owned())).or_default().try_take(limit, now_us);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE: RateLimit = RateLimit { per_s: 5, burst: 2 };

    #[test]
    fn a_tenant_gets_its_burst_then_its_rate_and_others_are_untouched() {
        let q = PublishQuotas::default();
        let t0 = 10_000_000;
        assert!(q.admit(("a", Some(FIVE)), None, t0).is_ok());
        assert!(q.admit(("a", Some(FIVE)), None, t0).is_ok());
        let e = q.admit(("a", Some(FIVE)), None, t0).unwrap_err();
        assert_eq!((e.scope, e.wait_us, e.retry_after_s()), (QuotaScope::Tenant, 200_000, 1));
        assert!(q.admit(("b", Some(FIVE)), None, t0).is_ok(), "another tenant has its own bucket");
        assert!(q.admit(("c", None), None, t0).is_ok(), "no quota");
        assert!(q.admit(("a", Some(FIVE)), None, t0 + 200_000).is_ok(), "after the wait it was told");
    }

    #[test]
    fn a_key_quota_refuses_without_spending_the_tenants() {
        let q = PublishQuotas::default();
        let t0 = 10_000_000;
        let key = RateLimit { per_s: 1, burst: 1 };
        assert!(q.admit(("a", Some(FIVE)), Some(("k1", key)), t0).is_ok());
        let e = q.admit(("a", Some(FIVE)), Some(("k1", key)), t0).unwrap_err();
        assert_eq!(e.scope, QuotaScope::Key);
        // The tenant's second turn is still there for another key.
        assert!(q.admit(("a", Some(FIVE)), Some(("k2", key)), t0).is_ok());
        assert_eq!(q.admit(("a", Some(FIVE)), Some(("k3", key)), t0).unwrap_err().scope, QuotaScope::Tenant);
    }

    #[test]
    fn limits_resolve_own_fields_over_the_default() {
        let d = Some(RateLimit { per_s: 100, burst: 200 });
        assert_eq!(limit_of(0, 0, d), d);
        assert_eq!(limit_of(10, 0, d), Some(RateLimit { per_s: 10, burst: 10 }));
        assert_eq!(limit_of(10, 30, None), Some(RateLimit { per_s: 10, burst: 30 }));
        assert_eq!(limit_of(0, 0, None), None);
    }

    #[test]
    fn full_buckets_are_forgotten_as_the_map_grows() {
        let q = PublishQuotas::default();
        let l = Some(RateLimit { per_s: 1_000, burst: 1 });
        for i in 0..PRUNE_AT {
            q.admit((&format!("t{i}"), l), None, 1_000_000).unwrap();
        }
        q.admit(("late", l), None, 5_000_000).unwrap();
        assert_eq!(q.buckets.lock().unwrap().len(), 1, "every earlier bucket was full again");
    }
}
