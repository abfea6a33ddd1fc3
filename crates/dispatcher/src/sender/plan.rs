//! A subscription's send plan: what every attempt to it needs that changes only when the subscription does,
//! worked out once. Its route (egress guard + connection pool), its URL parsed and judged by that guard and
//! converted to the request's `Uri`, its header names and fixed values ready to insert (with how attempt records
//! keep them), and its secrets keyed for HMAC ([`HeaderPlan`]). An attempt then computes only its ids, clock and
//! signatures; the guard still judges every resolved address on every attempt and every connect.
//!
//! Plans are kept per subscription id and belong to one version of the subscription: a changed subscription (new
//! URL, policy, headers, or a rotated secret: each a new [`SubscriptionEntry`]) gets a new plan at its next
//! attempt, and the sweep of deleted subscriptions (`forget.rs`) drops theirs.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use bytes::Bytes;
use hookline_core::egress::{Refusal, Target};
use hookline_core::model::Header;
use hookline_core::policy::Policy;
use hookline_core::request::{self, AttemptIds, HeaderPlan, HeaderSource};
use hookline_kafka::state::SubscriptionEntry;

use super::Route;

pub struct SendPlan {
    /// The version of the subscription this plan was made from. Weak: a plan does not keep an old version's
    /// contents (secrets included) alive, and its allocation held by the `Weak` cannot be reused by a newer
    /// version, so comparing addresses cannot mistake one for the other.
    source: Weak<SubscriptionEntry>,
    pub(super) destination: Result<Destination, String>,
    headers: HeaderPlan,
    /// One per entry of `headers`, in sending order.
    slots: Box<[Slot]>,
    /// The subscription's custom headers, after the platform's (shared buffers: cheap clones).
    pub(super) custom: Box<[(http::HeaderName, http::HeaderValue)]>,
    pub(super) logged_custom: Box<[Header]>,
}

/// Where a plan's requests go: its route, and its URL as that route's guard judged it (a refusal or an unusable
/// URL is the outcome of every attempt, reported in the order a fresh check would).
pub(super) struct Destination {
    pub route: Arc<Route>,
    pub target: Result<PlannedTarget, Refusal>,
}

pub(super) struct PlannedTarget {
    /// Resolved (a name) and judged again on every attempt.
    pub target: Target,
    /// The parsed, normalised URL that was judged, as the request's `Uri` (parsed once, not per attempt).
    pub uri: Result<http::Uri, String>,
}

struct Slot {
    /// As the attempt record keeps it (the scheme's documented capitalisation).
    logged_name: std::borrow::Cow<'static, str>,
    name: Result<http::HeaderName, String>,
    /// The record keeps `<redacted>` for it.
    secret: bool,
    /// For a [`HeaderSource::Fixed`] value: its bytes (shared by the request and the record) and the parsed value.
    fixed: Option<(Bytes, Result<http::HeaderValue, String>)>,
}

fn http_error(e: impl Into<http::Error>) -> String {
    e.into().to_string()
}

impl SendPlan {
    pub(super) fn build(entry: &Arc<SubscriptionEntry>, policy: &Policy, route: Result<Arc<Route>, String>) -> Self {
        let destination = route.map(|route| {
            let target = route.guard.check_url(&entry.sub.url).map(|target| {
                let uri = http::Uri::try_from(target.url.as_str()).map_err(http_error);
                PlannedTarget { target, uri }
            });
            Destination { route, target }
        });
        let headers = HeaderPlan::with_secrets(policy, &entry.sub.id, entry.sub.secrets.iter().map(|s| (&*s.value, s.expires_at_ms)));
        let slots = headers
            .entries()
            .iter()
            .map(|(name, source)| {
                let fixed = match source {
                    HeaderSource::Fixed(v) => {
                        let bytes = match v {
                            std::borrow::Cow::Borrowed(s) => Bytes::from_static(s.as_bytes()),
                            std::borrow::Cow::Owned(s) => Bytes::copy_from_slice(s.as_bytes()),
                        };
                        let value = http::HeaderValue::from_maybe_shared(bytes.clone()).map_err(http_error);
                        Some((bytes, value))
                    }
                    _ => None,
                };
                Slot {
                    logged_name: name.clone(),
                    name: http::HeaderName::from_bytes(name.as_bytes()).map_err(http_error),
                    secret: request::is_secret_header(name),
                    fixed,
                }
            })
            .collect();
        Self {
            source: Arc::downgrade(entry),
            destination,
            headers,
            slots,
            custom: entry.headers.clone(),
            logged_custom: entry.logged_headers.clone(),
        }
    }

    /// Whether the plan was made from this version of the subscription.
    pub fn is_for(&self, entry: &Arc<SubscriptionEntry>) -> bool {
        std::ptr::eq(self.source.as_ptr(), Arc::as_ptr(entry))
    }

    /// One attempt's request headers and the record's copy of them (each value's buffer shared by both; a
    /// secret's value never kept): the platform's (a binary-mode CloudEvent's `ce-*` last), then `trace` (`traceparent`, `tracestate` when not empty),
    /// then the custom ones. `Err` in the map: the first header that is not valid HTTP, as the request builder
    /// words it. `Err` outside: the request cannot be signed.
    #[allow(clippy::type_complexity)]
    pub(super) fn request_headers(
        &self,
        ids: &AttemptIds<'_>,
        body: &[u8],
        trace: Option<(String, String)>,
    ) -> Result<(Result<http::HeaderMap, String>, Vec<Header>), hookline_core::sign::SignError> {
        let mut values = self.headers.values(ids, body)?.into_iter();
        let event_headers = self.headers.event_headers(ids);
        let n = self.slots.len() + event_headers.len() + 2 + self.custom.len();
        // Two more for what the client adds (`host`, `content-length`), so the map is allocated once.
        let mut map = http::HeaderMap::with_capacity(n + 2);
        let mut logged = Vec::with_capacity(n);
        let mut bad = None;
        let redacted = || Bytes::from_static(request::REDACTED.as_bytes());
        for slot in self.slots.iter() {
            let (bytes, value) = match &slot.fixed {
                Some((bytes, value)) => (bytes.clone(), value.clone()),
                None => {
                    let bytes = Bytes::from(values.next().unwrap_or_default());
                    let value = http::HeaderValue::from_maybe_shared(bytes.clone()).map_err(http_error);
                    (bytes, value)
                }
            };
            match (&slot.name, value) {
                (Ok(name), Ok(value)) => {
                    map.append(name.clone(), value);
                }
                (Err(e), _) => {
                    bad.get_or_insert_with(|| e.clone());
                }
                (_, Err(e)) => {
                    bad.get_or_insert(e);
                }
            }
            logged.push(Header { name: slot.logged_name.as_ref().to_owned(), value: if slot.secret { redacted() } else { bytes } });
        }
        // A binary-mode CloudEvent's attributes: per event (their number varies with its extensions), never secret.
        for (name, value) in event_headers {
            let bytes = Bytes::from(value);
            let header = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(http_error)
                .and_then(|n| Ok((n, http::HeaderValue::from_maybe_shared(bytes.clone()).map_err(http_error)?)));
            match header {
                Ok((n, v)) => {
                    map.append(n, v);
                }
                Err(e) => {
                    bad.get_or_insert(e);
                }
            }
            logged.push(Header { name: name.into_owned(), value: bytes });
        }
        if let Some((traceparent, tracestate)) = trace {
            let trace = [("traceparent", traceparent), ("tracestate", tracestate)];
            for (name, value) in trace.into_iter().filter(|(n, v)| *n == "traceparent" || !v.is_empty()) {
                let bytes = Bytes::from(value);
                match http::HeaderValue::from_maybe_shared(bytes.clone()) {
                    Ok(v) => {
                        map.append(http::HeaderName::from_static(name), v);
                    }
                    Err(e) => {
                        bad.get_or_insert_with(|| http_error(e));
                    }
                }
                logged.push(Header { name: name.to_owned(), value: bytes });
            }
        }
        for (name, value) in self.custom.iter() {
            map.append(name.clone(), value.clone());
        }
        logged.extend(self.logged_custom.iter().cloned());
        Ok((bad.map_or(Ok(map), Err), logged))
    }
}

/// The plans of the subscriptions this process sends to, by subscription id, in shards: every attempt reads one,
/// and one lock for the process would have every worker thread take the same cache line in turn.
#[derive(Default)]
pub(super) struct Plans {
    shards: [RwLock<HashMap<Arc<str>, Arc<SendPlan>>>; SHARDS],
}

/// A power of two.
const SHARDS: usize = 8;

/// A subscription id's shard: FNV-1a over its last bytes (ids end in their random part).
fn shard_of(id: &str) -> usize {
    let tail = &id.as_bytes()[id.len().saturating_sub(8)..];
    let h = tail.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    (h as usize) & (SHARDS - 1)
}

impl Plans {
    fn shard(&self, id: &str) -> &RwLock<HashMap<Arc<str>, Arc<SendPlan>>> {
        &self.shards[shard_of(id)]
    }

    /// The plan for this version of the subscription: the kept one, else one made by `build` and kept.
    pub fn get_or_build(&self, entry: &Arc<SubscriptionEntry>, build: impl FnOnce() -> SendPlan) -> Arc<SendPlan> {
        let shard = self.shard(&entry.sub.id);
        if let Some(plan) = shard.read().expect("plans lock").get(&*entry.sub.id) {
            if plan.is_for(entry) {
                return plan.clone();
            }
        }
        // Built outside the lock: keying HMACs and judging the URL is the work a plan saves, not to be serialised.
        let plan = Arc::new(build());
        let mut plans = shard.write().expect("plans lock");
        match plans.get_mut(&*entry.sub.id) {
            Some(kept) => *kept = plan.clone(),
            None => {
                plans.insert(entry.sub.id.clone(), plan.clone());
            }
        }
        plan
    }

    /// Keeps the plans of subscriptions `live` accepts; returns how many were dropped.
    pub fn retain(&self, live: impl Fn(&str) -> bool) -> usize {
        let mut dropped = 0;
        for shard in &self.shards {
            let mut plans = shard.write().expect("plans lock");
            let before = plans.len();
            plans.retain(|id, _| live(id));
            dropped += before - plans.len();
        }
        dropped
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().expect("plans lock").len()).sum()
    }
}

#[cfg(test)]
mod shard_tests {
    use super::*;

    #[test]
    fn ids_spread_over_every_shard_and_short_ids_work() {
        let mut seen = [0usize; SHARDS];
        for i in 0..800 {
            seen[shard_of(&format!("sub_01hx{i:08x}"))] += 1;
        }
        assert!(seen.iter().all(|n| *n > 40), "{seen:?}");
        assert!(shard_of("") < SHARDS && shard_of("a") < SHARDS);
    }
}
