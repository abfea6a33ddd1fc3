//! In-memory views of the two compacted state topics: subscriptions (written by ingest's API) and endpoint
//! state (written by the dispatcher that owns the subscription's partition).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use hookline_core::model::{EndpointState, Subscription};
use hookline_core::payload_filter::Filter as PayloadFilter;
use hookline_core::policy::{self, Policy};
use hookline_core::seal::{Keyring, SealError};
use prost::Message;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::held::HeldSubscription;
use crate::listing::{ById, ByTenant, Probe, TenantOrder};
use crate::settings::KafkaSettings;
use crate::subscription_index::SubscriptionIndex;
use crate::table::{self, TableError, TableHandle};
use crate::topics::Topics;

/// Both state topics read into memory, as every service needs them.
pub struct StateTables {
    pub subs: SubscriptionTable,
    pub subs_reader: TableHandle,
    pub states: EndpointStates,
    pub states_reader: TableHandle,
}

impl StateTables {
    /// Starts following `subscriptions` and `endpoint-state`; `stop` ends both readers. `secrets` says what is
    /// done with the subscriptions' sealed signing secrets.
    pub async fn follow(
        settings: &KafkaSettings,
        topics: &Topics,
        instance: &str,
        secrets: SecretMode,
        stop: CancellationToken,
    ) -> Result<Self, TableError> {
        let subs = SubscriptionTable::with_secrets(secrets);
        let states = EndpointStates::default();
        let (s, forget) = (subs.clone(), states.clone());
        let subs_reader = table::spawn(
            settings,
            topics.subscriptions(),
            &format!("{instance}-subs"),
            move |_, k, v| {
                s.apply(k, v);
                // A deleted subscription's endpoint state goes with it: the map holds live subscriptions only.
                if v.is_none_or(|v| v.is_empty()) {
                    forget.forget(&String::from_utf8_lossy(k));
                }
            },
            stop.clone(),
        )
        .await?;
        let st = states.clone();
        let states_reader =
            table::spawn(settings, topics.endpoint_state(), &format!("{instance}-states"), move |p, k, v| st.apply(p, k, v), stop).await?;
        Ok(Self { subs, subs_reader, states, states_reader })
    }

    /// Resolves once both topics were read to the end they had when reading started.
    pub async fn caught_up(&self) {
        self.subs_reader.wait_caught_up().await;
        self.states_reader.wait_caught_up().await;
    }

    /// After [`Self::caught_up`]: an error if any subscription's secret did not open (a missing or wrong master
    /// key), so a process fails at start instead of running without the secrets it would sign with.
    pub fn check_secrets(&self) -> Result<(), SecretsUnreadable> {
        let failures = self.subs.secret_failures();
        match failures.first() {
            None => Ok(()),
            Some((id, error)) => Err(SecretsUnreadable { count: failures.len(), first_id: id.clone(), first: error.clone() }),
        }
    }
}

/// What the subscription table does with sealed signing secrets.
#[derive(Clone, Debug, Default)]
pub enum SecretMode {
    /// Secrets are kept as the record has them (tests and benchmarks that write them in the clear).
    #[default]
    AsStored,
    /// Sealed secrets are opened with the keyring (ingest, dispatcher).
    Open(Arc<Keyring>),
    /// Secrets are not kept at all (a service that never signs needs no key: the retry-scheduler).
    Drop,
}

/// Subscriptions whose signing secrets did not open.
#[derive(Debug, thiserror::Error)]
#[error("the signing secrets of {count} subscription(s) cannot be read, e.g. {first_id}: {first}; nothing is signed with a secret that did not open, so this process stops (check secrets.keys / secrets.keys_file)")]
pub struct SecretsUnreadable {
    pub count: usize,
    pub first_id: String,
    pub first: SealError,
}

/// A subscription with its policy parsed once.
#[derive(Debug)]
pub struct SubscriptionEntry {
    /// The record in the compact form a process holds it in (`held::HeldSubscription`; the record itself:
    /// [`HeldSubscription::to_subscription`]).
    pub sub: HeldSubscription,
    /// The parsed policy, or why it could not be used (deliveries then dead-letter with `invalid_policy`).
    pub policy: Result<Arc<Policy>, String>,
    /// Identifies the policy's egress rules, so HTTP clients can be shared between subscriptions with equal rules
    /// (one copy shared by them all, as the policy is).
    pub egress_key: Arc<str>,
    /// The subscription's custom headers, checked and converted once here; every attempt appends them.
    pub headers: Box<[(http::HeaderName, http::HeaderValue)]>,
    /// The same headers as each attempt record keeps them (values redacted but those in `shown_headers`), made once here: an attempt
    /// clones shared buffers instead of judging and copying every value again.
    pub logged_headers: Box<[hookline_core::model::Header]>,
    /// The payload filter: `Ok(None)` = none; `Err` = a stored filter that does not parse, which matches nothing
    /// (the API refuses such a filter on save, so only a record written by other means can hold one). Boxed: most
    /// subscriptions have none, and every entry would carry the filter's size.
    pub filter: Result<Option<Box<PayloadFilter>>, String>,
    /// The per-endpoint rate limit in force (the subscription's fields over its policy's defaults).
    pub rate_limit: Option<hookline_core::rate_limit::RateLimit>,
    /// `ordering = "key" | "strict"` (`None`: not ordered, or stored fields that do not describe an ordering, which
    /// the API refuses on save).
    pub ordering: Option<Box<hookline_core::ordering::Ordering>>,
}

/// Ordered subscription entries alive in this process: while there are none, the dispatcher's hot path does not
/// look a delivery's subscription up to learn whether it is ordered.
static ORDERED_ENTRIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether some subscription entry in this process is ordered (see [`SubscriptionEntry::ordering`]).
pub fn any_ordered() -> bool {
    ORDERED_ENTRIES.load(std::sync::atomic::Ordering::Relaxed) > 0
}

impl Drop for SubscriptionEntry {
    fn drop(&mut self) {
        if self.ordering.is_some() {
            ORDERED_ENTRIES.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl SubscriptionEntry {
    pub fn new(sub: Subscription) -> Self {
        let policy = shared_policy(&sub.policy, &sub.policy_toml);
        let egress_key = match &policy {
            Ok(p) => shared_egress_key(format!("{:?}", p.egress)),
            Err(_) => Arc::from(""),
        };
        let headers = match &policy {
            Ok(p) if !sub.headers.is_empty() => prepared_headers(&sub, p).into_boxed_slice(),
            _ => Box::default(),
        };
        // Every custom header's value is recorded redacted unless the subscription marked it as safe to show: a
        // name says nothing reliable about whether its value is a credential.
        let logged_headers = headers
            .iter()
            .map(|(n, v)| {
                let shown = sub.shown_headers.iter().any(|s| s.eq_ignore_ascii_case(n.as_str()));
                let value = if shown {
                    bytes::Bytes::copy_from_slice(v.as_bytes())
                } else {
                    bytes::Bytes::from_static(hookline_core::request::REDACTED.as_bytes())
                };
                hookline_core::model::Header { name: n.as_str().to_owned(), value }
            })
            .collect();
        let filter = if sub.filter_json.is_empty() {
            Ok(None)
        } else {
            PayloadFilter::parse_str(&sub.filter_json).map(|f| Some(Box::new(f))).map_err(|e| {
                tracing::warn!(subscription = %sub.id, error = %e, "stored payload filter does not parse; it matches nothing");
                e.to_string()
            })
        };
        let rate_limit = match &policy {
            Ok(p) => hookline_core::rate_limit::effective(sub.rate_limit_per_s, sub.burst, p),
            Err(_) => None,
        };
        let ordering = hookline_core::ordering::Ordering::from_fields(sub.ordering, &sub.ordering_key).ok().flatten().map(Box::new);
        if ordering.is_some() {
            ORDERED_ENTRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Held for as long as the subscription exists, in every process: the compact form, not the record.
        let sub = HeldSubscription::from_record(sub);
        Self { sub, policy, egress_key, headers, logged_headers, filter, rate_limit, ordering }
    }

    /// Whether the payload filter lets `ev` (whose data was parsed once into `data`) through.
    pub fn filter_matches(&self, fields: &hookline_core::payload_filter::EventFields<'_>) -> bool {
        match &self.filter {
            Ok(None) => true,
            Ok(Some(f)) => f.matches(fields),
            Err(_) => false,
        }
    }

    /// Secrets that sign now: the newest, plus older ones still inside their rotation overlap.
    pub fn signing_secrets(&self, now_ms: i64) -> Vec<String> {
        self.sub
            .secrets
            .iter()
            .enumerate()
            .filter(|(i, s)| *i == 0 || s.expires_at_ms == 0 || s.expires_at_ms > now_ms)
            // A secret that is not open (sealed, without its key) never signs: nothing is signed with garbage.
            .filter(|(_, s)| !s.value.is_empty())
            .map(|(_, s)| s.value.to_string())
            .collect()
    }
}

/// Values that subscriptions with equal ones share (an inline policy by its text, an egress key by itself), kept
/// while some subscription holds them: whenever the map has doubled since the last prune, the values nobody else
/// holds are dropped, so it stays within about twice what live subscriptions use.
struct Shared<V: ?Sized> {
    map: HashMap<Arc<str>, Arc<V>>,
    prune_at: usize,
}

impl<V: ?Sized> Default for Shared<V> {
    fn default() -> Self {
        Self { map: HashMap::new(), prune_at: 64 }
    }
}

impl<V: ?Sized> Shared<V> {
    fn get(&self, key: &str) -> Option<Arc<V>> {
        self.map.get(key).cloned()
    }

    /// The value kept for `key`: the one already there, else `value`.
    fn insert(&mut self, key: &str, value: Arc<V>) -> Arc<V> {
        if let Some(v) = self.map.get(key) {
            return v.clone();
        }
        if self.map.len() >= self.prune_at {
            self.map.retain(|_, v| Arc::strong_count(v) > 1);
            self.prune_at = self.map.len().saturating_mul(2).max(64);
        }
        self.map.insert(Arc::from(key), value.clone());
        value
    }
}

static INLINE_POLICIES: LazyLock<Mutex<Shared<Policy>>> = LazyLock::new(Default::default);
static EGRESS_KEYS: LazyLock<Mutex<Shared<str>>> = LazyLock::new(Default::default);

/// The subscription's parsed policy, shared: a built-in profile's one copy per process, an inline document's one
/// copy per distinct text (subscriptions made from one template hold one). A document that does not parse is not
/// kept; its error is the entry's.
fn shared_policy(name: &str, inline_toml: &str) -> Result<Arc<Policy>, String> {
    if inline_toml.trim().is_empty() {
        return policy::resolve_shared(name, inline_toml).map_err(|e| e.to_string());
    }
    if let Some(p) = INLINE_POLICIES.lock().expect("shared policies lock").get(inline_toml) {
        return Ok(p);
    }
    // Parsed outside the lock; a concurrent parse of the same text keeps whichever was inserted first.
    let parsed = policy::resolve_shared(name, inline_toml).map_err(|e| e.to_string())?;
    Ok(INLINE_POLICIES.lock().expect("shared policies lock").insert(inline_toml, parsed))
}

fn shared_egress_key(key: String) -> Arc<str> {
    let mut keys = EGRESS_KEYS.lock().expect("shared egress keys lock");
    match keys.get(&key) {
        Some(k) => k,
        None => {
            let k: Arc<str> = Arc::from(key.as_str());
            keys.insert(&key, k)
        }
    }
}

/// A header as attempt records keep it: a secret's value replaced by [`hookline_core::request::REDACTED`].
pub fn logged_header(name: &str, value: &[u8]) -> hookline_core::model::Header {
    let value = if hookline_core::request::is_secret_header(name) {
        bytes::Bytes::from_static(hookline_core::request::REDACTED.as_bytes())
    } else {
        bytes::Bytes::copy_from_slice(value)
    };
    hookline_core::model::Header { name: name.to_owned(), value }
}

/// The custom headers as the request carries them; one that no longer passes the rules under the subscription's
/// policy (the policy changed under it) is left out and logged, so the platform's own headers always win.
fn prepared_headers(sub: &Subscription, policy: &Policy) -> Vec<(http::HeaderName, http::HeaderValue)> {
    let (kept, dropped) = hookline_core::custom_headers::prepare(&sub.headers, policy);
    for d in dropped {
        tracing::warn!(subscription = %sub.id, header = %d.name, reason = %d.message, "custom header not sent");
    }
    kept.into_iter()
        .filter_map(|(n, v)| Some((http::HeaderName::from_bytes(n.as_bytes()).ok()?, http::HeaderValue::from_str(&v).ok()?)))
        .collect()
}

/// Subscriptions by id, with the fan-out index and the listing order kept in step. Cloning shares it.
#[derive(Clone, Default)]
pub struct SubscriptionTable {
    inner: Arc<RwLock<Inner>>,
    secrets: SecretMode,
}

#[derive(Default)]
struct Inner {
    /// Keyed by the entry's own id (`HeldSubscription::id`), as `ids`, `by_tenant` and the index hold it.
    by_id: HashSet<ById>,
    index: SubscriptionIndex,
    /// Listing order: by id, and by (tenant, id) for one tenant's page, so a page is a range walk.
    ids: BTreeSet<ById>,
    by_tenant: BTreeSet<ByTenant>,
    /// Subscriptions whose current record has a secret that did not open.
    secret_failures: BTreeMap<String, SealError>,
}

impl Inner {
    fn unlist(&mut self, old: &SubscriptionEntry) {
        self.index.remove(old);
        self.ids.remove(&*old.sub.id);
        self.by_tenant.remove(&Probe(&old.sub.tenant, &old.sub.id) as &dyn TenantOrder);
    }

    /// Lists the entry under the allocations it holds (its id, its tenant's one name per process).
    fn list(&mut self, entry: &Arc<SubscriptionEntry>) {
        self.index.insert(entry);
        self.ids.insert(ById(entry.clone()));
        self.by_tenant.insert(ByTenant(entry.clone()));
    }
}

/// One page of a listing.
pub struct Page {
    pub items: Vec<Arc<SubscriptionEntry>>,
    /// Whether more follow the last item.
    pub more: bool,
}

impl SubscriptionTable {
    pub fn with_secrets(secrets: SecretMode) -> Self {
        Self { inner: Default::default(), secrets }
    }

    /// Applies one record of the subscriptions topic (`None` = tombstone = deleted).
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) {
        let id = String::from_utf8_lossy(key).into_owned();
        // Decoded and opened before the lock is taken.
        let decoded = value.filter(|v| !v.is_empty()).map(Subscription::decode).map(|r| {
            r.map(|mut sub| {
                // The record key is the id the table (and a later tombstone) knows it by.
                sub.id.clone_from(&id);
                let failure = self.open(&mut sub).err();
                (sub, failure)
            })
        });
        let mut guard = self.inner.write().expect("subscription table lock");
        let inner = &mut *guard;
        match decoded {
            None => {
                inner.secret_failures.remove(&id);
                if let Some(old) = inner.by_id.take(id.as_str()) {
                    inner.unlist(&old.0);
                }
            }
            Some(Ok((sub, failure))) => {
                match failure {
                    Some(e) => {
                        tracing::error!(subscription = %id, error = %e, "signing secret cannot be opened; this subscription's deliveries are not signed with it");
                        inner.secret_failures.insert(id.clone(), e);
                    }
                    None => {
                        inner.secret_failures.remove(&id);
                    }
                }
                let entry = Arc::new(SubscriptionEntry::new(sub));
                if let Some(old) = inner.by_id.take(id.as_str()) {
                    inner.unlist(&old.0);
                }
                inner.by_id.insert(ById(entry.clone()));
                inner.list(&entry);
            }
            Some(Err(e)) => tracing::warn!(subscription = %id, error = %e, "undecodable subscription record ignored"),
        }
    }

    /// Opens (or drops) the record's secrets as the table's mode says. On failure no secret is kept.
    fn open(&self, sub: &mut Subscription) -> Result<(), SealError> {
        match &self.secrets {
            SecretMode::AsStored => Ok(()),
            SecretMode::Drop => {
                hookline_core::seal::drop_secrets(sub);
                Ok(())
            }
            SecretMode::Open(keyring) => {
                hookline_core::seal::open_secrets(sub, keyring).inspect_err(|_| hookline_core::seal::drop_secrets(sub))
            }
        }
    }

    /// Subscriptions whose current record has a secret that did not open, with why.
    pub fn secret_failures(&self) -> Vec<(String, SealError)> {
        let inner = self.inner.read().expect("subscription table lock");
        inner.secret_failures.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Up to `limit` subscriptions ordered by id, after the id `after`; of one tenant (`Some("")`: those without
    /// one) or of all. A range walk of an ordered index: the cost does not grow with the table.
    pub fn page(&self, tenant: Option<&str>, after: Option<&str>, limit: usize) -> Page {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let inner = self.inner.read().expect("subscription table lock");
        let mut items = Vec::with_capacity(limit.min(1024));
        let mut more = false;
        let mut take = |e: &Arc<SubscriptionEntry>| {
            if items.len() == limit {
                more = true;
                return false;
            }
            items.push(e.clone());
            true
        };
        match tenant {
            None => {
                let start = after.map_or(Unbounded, Excluded);
                for k in inner.ids.range::<str, _>((start, Unbounded)) {
                    if !take(&k.0) {
                        break;
                    }
                }
            }
            Some(t) => {
                let probe = Probe(t, after.unwrap_or(""));
                let probe: &dyn TenantOrder = &probe;
                let start = if after.is_some() { Excluded(probe) } else { Included(probe) };
                for k in inner.by_tenant.range::<dyn TenantOrder, _>((start, Unbounded)) {
                    if *k.0.sub.tenant != *t || !take(&k.0) {
                        break;
                    }
                }
            }
        }
        Page { items, more }
    }

    /// The ids of every subscription of `tenant` (to delete a tenant with its subscriptions).
    pub fn ids_of_tenant(&self, tenant: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.page(Some(tenant), after.as_deref(), 1000);
            out.extend(page.items.iter().map(|e| e.sub.id.to_string()));
            if !page.more {
                return out;
            }
            after = out.last().cloned();
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<SubscriptionEntry>> {
        self.inner.read().expect("subscription table lock").by_id.get(id).map(|k| k.0.clone())
    }

    pub fn all(&self) -> Vec<Arc<SubscriptionEntry>> {
        let mut v: Vec<_> = self.inner.read().expect("subscription table lock").by_id.iter().map(|k| k.0.clone()).collect();
        v.sort_by(|a, b| a.sub.created_at_ms.cmp(&b.sub.created_at_ms).then_with(|| a.sub.id.cmp(&b.sub.id)));
        v
    }

    /// The subscriptions an event of `tenant` (`""` = none) and `event_type` fans out to, ordered by id: only
    /// the tenant's own whose filter matches (`hookline_core::filter::delivers`), found through the index.
    pub fn matching(&self, tenant: &str, event_type: &str) -> Vec<Arc<SubscriptionEntry>> {
        self.inner.read().expect("subscription table lock").index.matching(tenant, event_type)
    }

    /// The same answer as [`Self::matching`] by testing every subscription: the reference the index is checked
    /// against (tests, `hookline bench fanout`).
    #[doc(hidden)]
    pub fn matching_linear(&self, tenant: &str, event_type: &str) -> Vec<Arc<SubscriptionEntry>> {
        let mut v: Vec<_> = self
            .inner
            .read()
            .expect("subscription table lock")
            .by_id
            .iter()
            .filter(|k| hookline_core::filter::delivers(&k.0.sub.tenant, &k.0.sub.event_types, tenant, event_type))
            .map(|k| k.0.clone())
            .collect();
        v.sort_unstable_by(|a, b| a.sub.id.cmp(&b.sub.id));
        v
    }

    /// Tenants the index holds (deleted subscriptions' tenants are forgotten).
    #[doc(hidden)]
    pub fn indexed_tenants(&self) -> usize {
        self.inner.read().expect("subscription table lock").index.tenant_count()
    }

    pub fn len(&self) -> usize {
        self.inner.read().expect("subscription table lock").by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// Assigned; the reader is still applying what earlier owners wrote.
    Syncing,
    /// Assigned and synced: this process is the only writer; the reader ignores the partition.
    Owned,
}

/// The key of a partition's fence record on `endpoint-state`: no subscription id starts with NUL.
pub const FENCE_KEY: &str = "\u{0}owner-fence";

/// This process's hold on one partition.
struct Owner {
    state: Ownership,
    ready: watch::Sender<bool>,
    /// Which assignment this is: a sync started for an earlier one (revoked since) must not mark this one synced.
    assignment: u64,
    /// Stamped on every state this process writes to the partition (see [`FENCE_KEY`]).
    epoch: u64,
}

/// A partition's assignment, as [`EndpointStates::assign`] handed it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    pub partition: i32,
    id: u64,
}

#[derive(Default)]
struct States {
    by_id: HashMap<String, EndpointState>,
    /// Per partition, the highest fence epoch read so far: records below it come from former owners.
    fences: HashMap<i32, u64>,
    /// Per partition, the subscriptions whose last record there came from a former owner. Compaction keeps only a
    /// key's last record, so the state that record shadows would be lost: the owner writes it again
    /// ([`EndpointStates::take_shadowed`]).
    shadowed: HashMap<i32, HashSet<String>>,
}

impl States {
    fn shadow(&mut self, partition: i32, id: String) {
        self.shadowed.entry(partition).or_default().insert(id);
    }

    fn unshadow(&mut self, partition: i32, id: &str) {
        if let Some(ids) = self.shadowed.get_mut(&partition) {
            ids.remove(id);
            if ids.is_empty() {
                self.shadowed.remove(&partition);
            }
        }
    }
}

/// Endpoint states by subscription id. The dispatcher owning a partition writes its states; everyone else reads.
///
/// Writes are fenced: a new owner, once it has read everything earlier owners wrote to a partition, writes a
/// fence record with the next epoch and stamps that epoch on its own writes. A former owner that still writes
/// (a zombie: frozen past its session, or drained out late) stamps an older epoch, and readers that have read the
/// fence — the API, the retry-scheduler, every later owner — ignore it.
///
/// Compaction would undo the fence where a former owner's record is a key's last: the cleaner keeps it and drops
/// the current state under it. So a key whose last record is fenced is remembered, and its owner writes the current
/// state again (or a tombstone, when there is none): the owning process as soon as it reads such a record, a new
/// owner once it has synced. The same key's next state does it too.
#[derive(Clone, Default)]
pub struct EndpointStates {
    map: Arc<RwLock<States>>,
    owned: Arc<Mutex<HashMap<i32, Owner>>>,
    assignments: Arc<std::sync::atomic::AtomicU64>,
    /// Woken when an owned partition has shadowed states to write again.
    shadowed_on_owned: Arc<tokio::sync::Notify>,
}

impl EndpointStates {
    /// Applies one record of the endpoint-state topic, unless this process owns (writes) that partition.
    pub fn apply(&self, partition: i32, key: &[u8], value: Option<&[u8]>) {
        // This process writes an owned partition, so its own states are applied already; of the rest, only a former
        // owner's late write matters there (see `shadow` below).
        let owned_epoch = match self.owned.lock().expect("ownership lock").get(&partition) {
            Some(Owner { state: Ownership::Owned, epoch, .. }) => Some(*epoch),
            _ => None,
        };
        let is_fence = key == FENCE_KEY.as_bytes();
        if owned_epoch.is_some() && (is_fence || value.is_none_or(<[u8]>::is_empty)) {
            return;
        }
        let decoded = value.filter(|v| !v.is_empty()).map(EndpointState::decode);
        let mut states = self.map.write().expect("endpoint state lock");
        if is_fence {
            if let Some(Ok(fence)) = decoded {
                let f = states.fences.entry(partition).or_default();
                *f = (*f).max(fence.owner_epoch);
            }
            return;
        }
        let id = String::from_utf8_lossy(key).into_owned();
        match decoded {
            None => {
                states.unshadow(partition, &id);
                states.by_id.remove(&id);
            }
            Some(Ok(st)) => {
                let fence = owned_epoch.unwrap_or_else(|| states.fences.get(&partition).copied().unwrap_or(0));
                if st.owner_epoch < fence {
                    metrics::counter!("hookline_endpoint_state_fenced_total").increment(1);
                    tracing::warn!(subscription = %id, partition, epoch = st.owner_epoch, fence, owned = owned_epoch.is_some(), "endpoint state from a former owner ignored");
                    // Not applied, but the key's last record: compaction would keep it over the state under it.
                    states.shadow(partition, id);
                    if owned_epoch.is_some() {
                        self.shadowed_on_owned.notify_one();
                    }
                    return;
                }
                if owned_epoch.is_none() {
                    states.unshadow(partition, &id);
                    states.by_id.insert(id, st);
                }
            }
            Some(Err(e)) if owned_epoch.is_none() => tracing::warn!(subscription = %id, error = %e, "undecodable endpoint state ignored"),
            Some(Err(_)) => {}
        }
    }

    pub fn get(&self, id: &str) -> Option<EndpointState> {
        self.map.read().expect("endpoint state lock").by_id.get(id).cloned()
    }

    /// Read-modify-write of one subscription's state under the table lock, so concurrent deliveries to the same
    /// endpoint never lose an update. `f` should also enqueue the produce of the new state (a synchronous enqueue
    /// keeps the topic's order equal to the order of updates); it gets the state stamped with `partition`'s
    /// epoch.
    pub fn update<R>(&self, id: &str, partition: i32, f: impl FnOnce(&mut EndpointState) -> R) -> R {
        let epoch = self.epoch(partition);
        let mut states = self.map.write().expect("endpoint state lock");
        // This write is the key's last record now: nothing of a former owner's is left to shadow it.
        states.unshadow(partition, id);
        let state =
            states.by_id.entry(id.to_owned()).or_insert_with(|| EndpointState { subscription_id: id.to_owned(), ..Default::default() });
        state.owner_epoch = epoch;
        f(state)
    }

    /// Takes the shadowed states of the partitions this process owns (see [`EndpointStates`]): each is written
    /// again with [`EndpointStates::rewrite`].
    pub fn take_shadowed(&self) -> Vec<(i32, String)> {
        let owned: Vec<i32> =
            self.owned.lock().expect("ownership lock").iter().filter(|(_, o)| o.state == Ownership::Owned).map(|(p, _)| *p).collect();
        let mut states = self.map.write().expect("endpoint state lock");
        owned
            .into_iter()
            .filter_map(|p| Some((p, states.shadowed.remove(&p)?)))
            .flat_map(|(p, ids)| ids.into_iter().map(move |id| (p, id)))
            .collect()
    }

    /// Resolves once an owned partition may have shadowed states to write again (at once if one was found since
    /// the last call).
    pub async fn shadowed_on_owned(&self) {
        self.shadowed_on_owned.notified().await;
    }

    /// Writes one subscription's current state again, under the table lock like [`EndpointStates::update`]: `f`
    /// gets the state stamped with `partition`'s epoch, or `None` when there is none (write a tombstone).
    pub fn rewrite<R>(&self, id: &str, partition: i32, f: impl FnOnce(Option<&EndpointState>) -> R) -> R {
        let epoch = self.epoch(partition);
        let mut states = self.map.write().expect("endpoint state lock");
        match states.by_id.get_mut(id) {
            Some(state) => {
                state.owner_epoch = epoch;
                f(Some(state))
            }
            None => f(None),
        }
    }

    /// Forgets a deleted subscription's state (its record stays on the topic until compaction).
    pub fn forget(&self, id: &str) {
        self.map.write().expect("endpoint state lock").by_id.remove(id);
    }

    /// A partition was assigned: records keep being applied until it is synced with this assignment.
    pub fn assign(&self, partition: i32) -> Assignment {
        let mut owned = self.owned.lock().expect("ownership lock");
        let owner = owned.entry(partition).or_insert_with(|| Owner {
            state: Ownership::Syncing,
            ready: watch::channel(false).0,
            assignment: self.assignments.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            epoch: 0,
        });
        Assignment { partition, id: owner.assignment }
    }

    /// Whether `a` is still this process's current assignment of its partition.
    pub fn is_current(&self, a: Assignment) -> bool {
        self.owned.lock().expect("ownership lock").get(&a.partition).is_some_and(|o| o.assignment == a.id)
    }

    /// The epoch a new owner fences the partition with: one past every fence read so far. Ask once the partition
    /// is read to its end.
    pub fn next_epoch(&self, partition: i32) -> u64 {
        self.map.read().expect("endpoint state lock").fences.get(&partition).copied().unwrap_or(0).saturating_add(1)
    }

    /// The epoch this process stamps on the partition's states (0 while it does not own it).
    pub fn epoch(&self, partition: i32) -> u64 {
        self.owned.lock().expect("ownership lock").get(&partition).map_or(0, |o| o.epoch)
    }

    /// Everything earlier owners wrote to the partition has been applied and the partition is fenced with
    /// `epoch`: from now on this process writes it. Ignored for an assignment revoked since (a stale sync).
    pub fn synced(&self, a: Assignment, epoch: u64) -> bool {
        let mut owned = self.owned.lock().expect("ownership lock");
        match owned.get_mut(&a.partition) {
            Some(o) if o.assignment == a.id => {
                o.state = Ownership::Owned;
                o.epoch = epoch;
                o.ready.send_replace(true);
                // What the sync found shadowed is the new owner's to write again.
                if self.map.read().expect("endpoint state lock").shadowed.contains_key(&a.partition) {
                    self.shadowed_on_owned.notify_one();
                }
                true
            }
            _ => false,
        }
    }

    pub fn revoke(&self, partition: i32) {
        self.owned.lock().expect("ownership lock").remove(&partition);
    }

    /// Waits until the partition is synced. Returns false if it is not assigned to this process (or is revoked
    /// while waiting): the delivery then belongs to the partition's next owner.
    pub async fn ready(&self, partition: i32) -> bool {
        let rx = match self.owned.lock().expect("ownership lock").get(&partition) {
            Some(o) => o.ready.subscribe(),
            None => return false,
        };
        let mut rx = rx;
        let ready = rx.wait_for(|r| *r).await.is_ok();
        ready
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;
    use hookline_core::model::EndpointCondition;

    use super::*;

    fn fence(epoch: u64) -> Vec<u8> {
        EndpointState { owner_epoch: epoch, ..Default::default() }.encode_to_vec()
    }

    fn state(id: &str, condition: EndpointCondition, epoch: u64) -> Vec<u8> {
        EndpointState { subscription_id: id.into(), condition: condition as i32, owner_epoch: epoch, ..Default::default() }.encode_to_vec()
    }

    fn condition(states: &EndpointStates, id: &str) -> Option<i32> {
        states.get(id).map(|s| s.condition)
    }

    #[test]
    fn a_former_owners_late_record_is_ignored_and_the_state_it_shadows_is_the_next_owners_to_write_again() {
        let states = EndpointStates::default();
        states.apply(0, FENCE_KEY.as_bytes(), Some(&fence(1)));
        states.apply(0, b"sub_a", Some(&state("sub_a", EndpointCondition::Disabled, 1)));
        states.apply(0, FENCE_KEY.as_bytes(), Some(&fence(2)));
        // Owner 1, late: ignored, but it is sub_a's last record now, and sub_b's only one.
        states.apply(0, b"sub_a", Some(&state("sub_a", EndpointCondition::Healthy, 1)));
        states.apply(0, b"sub_b", Some(&state("sub_b", EndpointCondition::Paused, 1)));
        assert_eq!(condition(&states, "sub_a"), Some(EndpointCondition::Disabled as i32));
        assert_eq!(condition(&states, "sub_b"), None);
        assert!(states.take_shadowed().is_empty(), "only an owner writes");

        let a = states.assign(0);
        assert!(states.synced(a, 3));
        assert!(states.shadowed_on_owned().now_or_never().is_some(), "the new owner is woken");
        let mut shadowed = states.take_shadowed();
        shadowed.sort();
        assert_eq!(shadowed, [(0, "sub_a".to_owned()), (0, "sub_b".to_owned())]);
        // sub_a's current state, stamped with the owner's epoch; nothing for sub_b (a tombstone).
        let a_again = states.rewrite("sub_a", 0, |st| st.cloned()).unwrap();
        assert_eq!((a_again.condition, a_again.owner_epoch), (EndpointCondition::Disabled as i32, 3));
        assert!(states.rewrite("sub_b", 0, |st| st.is_none()));
        assert!(states.take_shadowed().is_empty(), "each is written once");
    }

    #[test]
    fn a_late_record_read_by_the_owning_process_wakes_it_and_a_newer_record_settles_the_key() {
        let states = EndpointStates::default();
        let a = states.assign(4);
        assert!(states.synced(a, 7));
        assert!(states.shadowed_on_owned().now_or_never().is_none(), "nothing shadowed yet");
        // The owner's own write and the fence are not shadows.
        states.apply(4, FENCE_KEY.as_bytes(), Some(&fence(7)));
        states.apply(4, b"sub_a", Some(&state("sub_a", EndpointCondition::Healthy, 7)));
        assert!(states.shadowed_on_owned().now_or_never().is_none());

        states.apply(4, b"sub_a", Some(&state("sub_a", EndpointCondition::Disabled, 6)));
        assert!(states.shadowed_on_owned().now_or_never().is_some());
        assert_eq!(states.take_shadowed(), [(4, "sub_a".to_owned())]);

        // A reader (not the owner) settles a shadowed key on the key's next valid record, or its tombstone.
        let reader = EndpointStates::default();
        reader.apply(1, FENCE_KEY.as_bytes(), Some(&fence(2)));
        reader.apply(1, b"sub_c", Some(&state("sub_c", EndpointCondition::Paused, 1)));
        reader.apply(1, b"sub_c", Some(&state("sub_c", EndpointCondition::Paused, 2)));
        reader.apply(1, b"sub_d", Some(&state("sub_d", EndpointCondition::Paused, 1)));
        reader.apply(1, b"sub_d", None);
        let a = reader.assign(1);
        assert!(reader.synced(a, 3));
        assert!(reader.take_shadowed().is_empty());
        assert_eq!(condition(&reader, "sub_c"), Some(EndpointCondition::Paused as i32));
    }
}
