//! In-memory views of the two compacted state topics: subscriptions (written by ingest's API) and endpoint
//! state (written by the dispatcher that owns the subscription's partition).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use hookline_core::model::{EndpointState, Subscription};
use hookline_core::seal::{Keyring, SealError};
use hookline_core::policy::{self, Policy};
use prost::Message;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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
        let s = subs.clone();
        let subs_reader =
            table::spawn(settings, topics.subscriptions(), &format!("{instance}-subs"), move |_, k, v| s.apply(k, v), stop.clone())
                .await?;
        let states = EndpointStates::default();
        let st = states.clone();
        let states_reader = table::spawn(
            settings,
            topics.endpoint_state(),
            &format!("{instance}-states"),
            move |p, k, v| st.apply(p, k, v),
            stop,
        )
        .await?;
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
    pub sub: Subscription,
    /// The parsed policy, or why it could not be used (deliveries then dead-letter with `invalid_policy`).
    pub policy: Result<Arc<Policy>, String>,
    /// Identifies the policy's egress rules, so HTTP clients can be shared between subscriptions with equal rules.
    pub egress_key: String,
}

impl SubscriptionEntry {
    pub fn new(sub: Subscription) -> Self {
        let policy = policy::resolve(&sub.policy, &sub.policy_toml).map(Arc::new).map_err(|e| e.to_string());
        let egress_key = match &policy {
            Ok(p) => format!("{:?}", p.egress),
            Err(_) => String::new(),
        };
        Self { sub, policy, egress_key }
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
            .map(|(_, s)| s.value.clone())
            .collect()
    }
}

/// Subscriptions by id, with the fan-out index and the listing order kept in step. Cloning shares it.
#[derive(Clone, Default)]
pub struct SubscriptionTable {
    inner: Arc<RwLock<Inner>>,
    secrets: SecretMode,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Arc<SubscriptionEntry>>,
    index: SubscriptionIndex,
    /// Listing order: by id, and by (tenant, id) for one tenant's page, so a page is a range walk.
    ids: BTreeSet<Arc<str>>,
    by_tenant: BTreeSet<(Arc<str>, Arc<str>)>,
    /// Subscriptions whose current record has a secret that did not open.
    secret_failures: BTreeMap<String, SealError>,
}

impl Inner {
    fn unlist(&mut self, old: &SubscriptionEntry) {
        self.index.remove(old);
        self.ids.remove(old.sub.id.as_str());
        self.by_tenant.remove(&(Arc::from(old.sub.tenant.as_str()), Arc::from(old.sub.id.as_str())));
    }

    fn list(&mut self, entry: &Arc<SubscriptionEntry>) {
        self.index.insert(entry);
        let id: Arc<str> = Arc::from(entry.sub.id.as_str());
        self.ids.insert(id.clone());
        self.by_tenant.insert((Arc::from(entry.sub.tenant.as_str()), id));
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
                if let Some(old) = inner.by_id.remove(&id) {
                    inner.unlist(&old);
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
                if let Some(old) = inner.by_id.insert(id, entry.clone()) {
                    inner.unlist(&old);
                }
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
                sub.secrets.clear();
                Ok(())
            }
            SecretMode::Open(keyring) => hookline_core::seal::open_secrets(sub, keyring).inspect_err(|_| sub.secrets.clear()),
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
        use std::ops::Bound::{Excluded, Unbounded};
        let inner = self.inner.read().expect("subscription table lock");
        let mut items = Vec::with_capacity(limit.min(1024));
        let mut more = false;
        let mut take = |id: &str| {
            if items.len() == limit {
                more = true;
                return false;
            }
            if let Some(e) = inner.by_id.get(id) {
                items.push(e.clone());
            }
            true
        };
        match tenant {
            None => {
                let start = after.map_or(Unbounded, |a| Excluded(Arc::<str>::from(a)));
                for id in inner.ids.range::<Arc<str>, _>((start, Unbounded)) {
                    if !take(id) {
                        break;
                    }
                }
            }
            Some(t) => {
                let t: Arc<str> = Arc::from(t);
                let start = match after {
                    Some(a) => Excluded((t.clone(), Arc::from(a))),
                    None => std::ops::Bound::Included((t.clone(), Arc::from(""))),
                };
                for (tenant, id) in inner.by_tenant.range((start, Unbounded)) {
                    if *tenant != t || !take(id) {
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
            out.extend(page.items.iter().map(|e| e.sub.id.clone()));
            if !page.more {
                return out;
            }
            after = out.last().cloned();
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<SubscriptionEntry>> {
        self.inner.read().expect("subscription table lock").by_id.get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<SubscriptionEntry>> {
        let mut v: Vec<_> = self.inner.read().expect("subscription table lock").by_id.values().cloned().collect();
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
            .values()
            .filter(|e| hookline_core::filter::delivers(&e.sub.tenant, &e.sub.event_types, tenant, event_type))
            .cloned()
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

/// Per partition: whether this process owns it yet, and a signal for tasks waiting until it does.
type Owners = HashMap<i32, (Ownership, watch::Sender<bool>)>;

/// Endpoint states by subscription id. The dispatcher owning a partition writes its states; everyone else reads.
#[derive(Clone, Default)]
pub struct EndpointStates {
    map: Arc<RwLock<HashMap<String, EndpointState>>>,
    owned: Arc<Mutex<Owners>>,
}

impl EndpointStates {
    /// Applies one record of the endpoint-state topic, unless this process owns (writes) that partition.
    pub fn apply(&self, partition: i32, key: &[u8], value: Option<&[u8]>) {
        if matches!(self.owned.lock().expect("ownership lock").get(&partition), Some((Ownership::Owned, _))) {
            return;
        }
        let id = String::from_utf8_lossy(key).into_owned();
        let mut map = self.map.write().expect("endpoint state lock");
        match value.filter(|v| !v.is_empty()).map(EndpointState::decode) {
            None => {
                map.remove(&id);
            }
            Some(Ok(st)) => {
                map.insert(id, st);
            }
            Some(Err(e)) => tracing::warn!(subscription = %id, error = %e, "undecodable endpoint state ignored"),
        }
    }

    pub fn get(&self, id: &str) -> Option<EndpointState> {
        self.map.read().expect("endpoint state lock").get(id).cloned()
    }

    /// Read-modify-write of one subscription's state under the table lock, so concurrent deliveries to the same
    /// endpoint never lose an update. `f` should also enqueue the produce of the new state (a synchronous enqueue
    /// keeps the topic's order equal to the order of updates).
    pub fn update<R>(&self, id: &str, f: impl FnOnce(&mut EndpointState) -> R) -> R {
        let mut map = self.map.write().expect("endpoint state lock");
        let state = map
            .entry(id.to_owned())
            .or_insert_with(|| EndpointState { subscription_id: id.to_owned(), ..Default::default() });
        f(state)
    }

    /// A partition was assigned: records keep being applied until `synced` is called.
    pub fn assign(&self, partition: i32) {
        let mut owned = self.owned.lock().expect("ownership lock");
        owned.entry(partition).or_insert_with(|| (Ownership::Syncing, watch::channel(false).0));
    }

    /// Everything earlier owners wrote to the partition has been applied: from now on this process writes it.
    pub fn synced(&self, partition: i32) {
        let mut owned = self.owned.lock().expect("ownership lock");
        if let Some((o, tx)) = owned.get_mut(&partition) {
            *o = Ownership::Owned;
            tx.send_replace(true);
        }
    }

    pub fn revoke(&self, partition: i32) {
        self.owned.lock().expect("ownership lock").remove(&partition);
    }

    /// Waits until the partition is synced. Returns false if it is not assigned to this process (or is revoked
    /// while waiting): the delivery then belongs to the partition's next owner.
    pub async fn ready(&self, partition: i32) -> bool {
        let rx = match self.owned.lock().expect("ownership lock").get(&partition) {
            Some((_, tx)) => tx.subscribe(),
            None => return false,
        };
        let mut rx = rx;
        let ready = rx.wait_for(|r| *r).await.is_ok();
        ready
    }
}
