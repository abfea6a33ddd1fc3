//! Forgetting deleted subscriptions: the per-endpoint maps (rate buckets, breakers and `Retry-After` holds,
//! adaptive limits and lane caps, send plans) and the per-egress-rules routes are keyed by what was sent to, so without a sweep they would
//! keep every subscription ever deleted. The endpoint-state map forgets on the tombstone itself
//! (`hookline_kafka::state`); leases go with their revoked partition.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Ctx;

/// How often the maps are swept. A deleted subscription's entries are small; a minute bounds them without a
/// per-delete hook on the hot table.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What one sweep dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    pub endpoints: usize,
    pub routes: usize,
}

/// Drops every entry of a subscription `is_live` denies, and every route no live egress key uses.
pub fn sweep(ctx: &Ctx, is_live: impl Fn(&str) -> bool, live_egress_keys: &HashSet<&str>) -> Forgotten {
    let endpoints = ctx.rates.retain(&is_live)
        + ctx.breakers.retain(&is_live)
        + ctx.limits.retain(&is_live)
        + ctx.lanes.retain_caps(&is_live)
        + ctx.sender.retain_plans(&is_live);
    let routes = ctx.sender.retain_routes(|key| live_egress_keys.contains(key));
    Forgotten { endpoints, routes }
}

pub async fn forget_deleted_every(ctx: Arc<Ctx>, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let all = ctx.subs.all();
        let live_keys: HashSet<&str> = all.iter().map(|e| &*e.egress_key).collect();
        let forgotten = sweep(&ctx, |id| ctx.subs.get(id).is_some(), &live_keys);
        if forgotten != Forgotten::default() {
            tracing::debug!(endpoints = forgotten.endpoints, routes = forgotten.routes, "forgot deleted subscriptions");
        }
    }
}
