//! The subscriptions a worker holds when they come from a store too large to hold whole: a
//! bounded cache of what it is delivering for, by subscription id (an envelope that names
//! its subscription) and by tenant (a fan-out needs the tenant's whole list of enabled
//! subscriptions). A miss is loaded from the store once however many deliveries ask for it at
//! the same time (single-flight), and a delivery waits for it at most `load_timeout`.
//!
//! Bounds: the subscriptions held (an id's entry counts one, a tenant's list its length), the
//! bytes they take (estimated), and the subscriptions of one tenant, so one tenant touching
//! many subscriptions evicts its own least recently used entries, not everyone's. A tenant
//! with more enabled subscriptions than that is not loaded for a fan-out at all.
//!
//! What is held is kept current by the store's change feed ([`SubscriptionCache::apply`]);
//! what is not held needs nothing. Where the rows come from is the caller's ([`Loader`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;

use super::{Subscription, Subscriptions};

/// The cache's bounds (`store.cache_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Subscriptions held at most.
    pub entries: usize,
    /// Estimated bytes of the subscriptions held, at most.
    pub bytes: usize,
    /// Subscriptions of one tenant held at most; also the largest tenant a fan-out loads.
    pub per_tenant: usize,
    /// The longest a delivery waits for a miss.
    pub load_timeout: Duration,
}

impl CacheLimits {
    /// The bounds `store.cache_*` set; `None` when a worker holds every subscription
    /// (`store.cache_entries = 0`).
    pub fn of(config: &crate::config::StoreConfig) -> Option<Self> {
        (config.cache_entries > 0).then_some(Self {
            entries: config.cache_entries,
            bytes: config.cache_bytes,
            per_tenant: config.cache_per_tenant,
            load_timeout: config.cache_load_timeout,
        })
    }
}

/// What is looked up: one subscription, or the enabled ones of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Id(Arc<str>),
    Tenant(Arc<str>),
}

impl Key {
    pub fn id(id: &str) -> Self {
        Key::Id(Arc::from(id))
    }

    pub fn tenant(tenant: &str) -> Self {
        Key::Tenant(Arc::from(tenant))
    }

    /// `id` or `tenant`, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            Key::Id(_) => "id",
            Key::Tenant(_) => "tenant",
        }
    }
}

/// What a load from the store found.
#[derive(Debug)]
pub enum Loaded {
    /// The subscription, `None` when there is none by that id.
    One(Option<Box<Subscription>>),
    /// A tenant's enabled subscriptions; at most the limit asked for plus one.
    Tenant(Vec<Subscription>),
}

/// Where misses are loaded from. `limit` bounds a tenant's load: a loader reads at most
/// `limit + 1` subscriptions, so the cache can tell a tenant above it.
pub trait Loader: Send + Sync {
    fn load(&self, key: &Key, limit: usize) -> BoxFuture<'static, Result<Loaded, String>>;
}

/// Why a lookup found nothing to route with. The store at fault is worth another try later;
/// a tenant above the bound is not, until the bound or the tenant changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MissError {
    #[error("the subscription store did not answer within {} (store.cache_load_timeout)", crate::units::fmt_duration(*.0))]
    Slow(Duration),
    #[error("the subscription store cannot be read: {0}")]
    Store(String),
    #[error(
        "tenant {tenant:?} has more than {limit} enabled subscriptions, the most a fan-out \
         loads (store.cache_per_tenant)"
    )]
    TooMany { tenant: String, limit: usize },
}

impl MissError {
    pub fn retry_helps(&self) -> bool {
        !matches!(self, MissError::TooMany { .. })
    }
}

/// How a lookup was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Hit,
    /// Loaded (by this lookup or one it joined) after waiting this long.
    Miss(Duration),
}

/// What the cache holds now, for the worker's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub keys: usize,
    pub subscriptions: usize,
    pub bytes: usize,
}

#[derive(Debug, Clone)]
enum Value {
    /// The subscriptions to route with: none or one for an id, the enabled ones of a tenant.
    View(Arc<Subscriptions>),
    /// A tenant with more enabled subscriptions than a fan-out loads.
    TooMany,
}

#[derive(Debug)]
struct Entry {
    value: Value,
    tenant: Arc<str>,
    weight: usize,
    bytes: usize,
    used: u64,
}

type Outcome = Option<Result<(Value, Duration), MissError>>;

struct Flight {
    rx: watch::Receiver<Outcome>,
    /// A change arrived while loading: the result serves who waits, but is not kept.
    stale: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// Least recently used first.
    order: BTreeMap<u64, Key>,
    /// Per tenant: the weight it holds and its keys, least recently used first.
    tenants: HashMap<Arc<str>, (usize, BTreeMap<u64, Key>)>,
    /// Subscription id -> the tenant whose held list has it.
    listed: HashMap<Arc<str>, Arc<str>>,
    weight: usize,
    bytes: usize,
    tick: u64,
    flights: HashMap<Key, Flight>,
    /// Changes with every insertion, eviction and change applied.
    version: u64,
    snapshot: Option<(u64, Arc<Subscriptions>)>,
}

/// The bounded cache. Shared (`Arc`): a miss's load runs in a task of its own, so a delivery
/// that stops waiting does not cancel it for the others.
pub struct SubscriptionCache {
    limits: CacheLimits,
    loader: Arc<dyn Loader>,
    state: Mutex<State>,
}

impl std::fmt::Debug for SubscriptionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionCache")
            .field("limits", &self.limits)
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

/// A load's own deadline, however long its waiters wait: a hung store is not waited for
/// forever, and its key can be tried again.
fn load_deadline(limits: &CacheLimits) -> Duration {
    (limits.load_timeout * 10).max(Duration::from_secs(5))
}

impl SubscriptionCache {
    pub fn new(limits: CacheLimits, loader: Arc<dyn Loader>) -> Self {
        Self {
            limits,
            loader,
            state: Mutex::new(State::default()),
        }
    }

    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The subscriptions to route with for `key`; `tenant` is the envelope's, charged for an
    /// id that turns out not to exist. Held: at once. Else loaded once for every concurrent
    /// asker, each waiting at most `load_timeout`.
    pub async fn lookup(
        self: &Arc<Self>,
        key: &Key,
        tenant: &str,
    ) -> Result<(Arc<Subscriptions>, Served), MissError> {
        let started = tokio::time::Instant::now();
        let mut rx = {
            let mut state = self.lock();
            if let Some(value) = state.touch(key) {
                return view(value, key, &self.limits).map(|v| (v, Served::Hit));
            }
            match state.flights.get(key) {
                Some(flight) => flight.rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    state.flights.insert(
                        key.clone(),
                        Flight {
                            rx: rx.clone(),
                            stale: false,
                        },
                    );
                    drop(state);
                    self.spawn_load(key.clone(), Arc::from(tenant), tx);
                    rx
                }
            }
        };
        let waited = tokio::time::timeout(self.limits.load_timeout, rx.wait_for(Option::is_some));
        let outcome = match waited.await {
            Err(_) => return Err(MissError::Slow(self.limits.load_timeout)),
            Ok(Err(_)) => return Err(MissError::Store("the load was dropped".into())),
            Ok(Ok(outcome)) => outcome.clone(),
        };
        match outcome {
            Some(Ok((value, _))) => {
                view(value, key, &self.limits).map(|v| (v, Served::Miss(started.elapsed())))
            }
            Some(Err(e)) => Err(e),
            None => Err(MissError::Store("the load ended without a result".into())),
        }
    }

    fn spawn_load(self: &Arc<Self>, key: Key, tenant: Arc<str>, tx: watch::Sender<Outcome>) {
        let cache = Arc::clone(self);
        let load = self.loader.load(&key, self.limits.per_tenant);
        let deadline = load_deadline(&self.limits);
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let result = match tokio::time::timeout(deadline, load).await {
                Err(_) => Err(MissError::Slow(deadline)),
                Ok(Err(e)) => Err(MissError::Store(e)),
                Ok(Ok(loaded)) => Ok(cache.finish(&key, &tenant, loaded)),
            };
            let outcome = result.map(|value| (value, started.elapsed()));
            cache.lock().flights.remove(&key);
            let _ = tx.send(Some(outcome));
        });
    }

    /// Keeps what a load found, unless a change arrived meanwhile; returns it either way.
    fn finish(&self, key: &Key, tenant: &Arc<str>, loaded: Loaded) -> Value {
        let limits = self.limits;
        let (value, owner) = match (key, loaded) {
            (_, Loaded::One(sub)) => {
                let owner = sub
                    .as_ref()
                    .map_or_else(|| Arc::clone(tenant), |s| Arc::from(s.tenant.as_str()));
                (
                    Value::View(Arc::new(Subscriptions::from_list(sub.map(|s| *s)))),
                    owner,
                )
            }
            (Key::Tenant(t), Loaded::Tenant(list)) if list.len() > limits.per_tenant => {
                (Value::TooMany, Arc::clone(t))
            }
            (_, Loaded::Tenant(list)) => {
                let list = list.into_iter().filter(|s| s.enabled);
                (
                    Value::View(Arc::new(Subscriptions::from_list(list))),
                    Arc::clone(tenant),
                )
            }
        };
        let mut state = self.lock();
        if !state.flights.get(key).is_some_and(|f| f.stale) {
            state.insert(key.clone(), value.clone(), owner, &limits);
        }
        value
    }

    /// The ids among `ids` whose change concerns what is held or being loaded: all of them
    /// when any tenant is (a new subscription's tenant is known only once read).
    pub fn concerned(&self, ids: &[String]) -> Vec<String> {
        let state = self.lock();
        let tenants_held = state
            .entries
            .keys()
            .chain(state.flights.keys())
            .any(|k| matches!(k, Key::Tenant(_)));
        if tenants_held {
            return ids.to_vec();
        }
        ids.iter()
            .filter(|id| {
                let key = Key::id(id);
                state.entries.contains_key(&key) || state.flights.contains_key(&key)
            })
            .cloned()
            .collect()
    }

    /// Puts changes read from the store in force, by id (`None`: deleted). Held entries take
    /// the new version; loads under way are not kept. Returns the versions replaced.
    pub fn apply(&self, changes: Vec<(String, Option<Subscription>)>) -> Vec<Arc<Subscription>> {
        let limits = self.limits;
        let mut state = self.lock();
        let mut replaced = Vec::new();
        for (id, new) in changes {
            let new = new.map(Arc::new);
            replaced.extend(state.change(&id, new.as_ref(), &limits));
        }
        replaced
    }

    /// The keys held: ids, and tenants (a full read of the store reads only these again).
    pub fn held_keys(&self) -> (Vec<String>, Vec<String>) {
        let state = self.lock();
        let mut ids = Vec::new();
        let mut tenants = Vec::new();
        for key in state.entries.keys() {
            match key {
                Key::Id(id) => ids.push(id.to_string()),
                Key::Tenant(t) => tenants.push(t.to_string()),
            }
        }
        (ids, tenants)
    }

    /// Every load under way is not kept: a full read follows, and what they read may be
    /// older than a change whose notice was missed.
    pub fn forget_flights(&self) {
        for flight in self.lock().flights.values_mut() {
            flight.stale = true;
        }
    }

    /// Puts a tenant's list read again in force (a full read); dropped when no longer held.
    pub fn refresh_tenant(&self, tenant: &str, list: Vec<Subscription>) {
        let limits = self.limits;
        let key = Key::tenant(tenant);
        let mut state = self.lock();
        if !state.entries.contains_key(&key) {
            return;
        }
        let value = if list.len() > limits.per_tenant {
            Value::TooMany
        } else {
            let list = list.into_iter().filter(|s| s.enabled);
            Value::View(Arc::new(Subscriptions::from_list(list)))
        };
        state.insert(key, value, Arc::from(tenant), &limits);
    }

    /// Every subscription held, as one version (memoised until what is held changes): what
    /// the sweep keeps secrets, tokens and endpoints for.
    pub fn snapshot(&self) -> Arc<Subscriptions> {
        let mut state = self.lock();
        if let Some((version, snapshot)) = &state.snapshot
            && *version == state.version
        {
            return Arc::clone(snapshot);
        }
        let mut all: HashMap<String, Arc<Subscription>> = HashMap::new();
        for entry in state.entries.values() {
            if let Value::View(view) = &entry.value {
                for sub in view.iter() {
                    all.insert(sub.id.clone(), Arc::clone(sub));
                }
            }
        }
        let snapshot = Arc::new(Subscriptions::from_map(all));
        state.snapshot = Some((state.version, Arc::clone(&snapshot)));
        snapshot
    }

    /// The subscription held by `id`, if any (as an id's entry or in a tenant's list).
    pub fn get(&self, id: &str) -> Option<Arc<Subscription>> {
        let state = self.lock();
        state.held(id)
    }

    pub fn held(&self) -> Held {
        let state = self.lock();
        Held {
            keys: state.entries.len(),
            subscriptions: state.weight,
            bytes: state.bytes,
        }
    }
}

/// The subscriptions to route with, from what is held for `key`.
fn view(value: Value, key: &Key, limits: &CacheLimits) -> Result<Arc<Subscriptions>, MissError> {
    match (value, key) {
        (Value::View(v), _) => Ok(v),
        (Value::TooMany, Key::Tenant(t)) => Err(MissError::TooMany {
            tenant: t.to_string(),
            limit: limits.per_tenant,
        }),
        (Value::TooMany, Key::Id(_)) => Ok(Arc::new(Subscriptions::default())),
    }
}

/// A subscription's memory, estimated: its strings, lists and compiled parts.
pub fn weigh(sub: &Subscription) -> usize {
    let strings = sub.id.len() * 3 + sub.tenant.len() * 2 + sub.url.as_str().len();
    let types = sub
        .event_types
        .as_ref()
        .map_or(0, |t| t.iter().map(|f| f.to_string().len() + 32).sum());
    let secrets = sub.secrets.len() * 160;
    let headers = sub.headers.len() * 128;
    let filter = sub
        .payload_filter
        .as_ref()
        .map_or(0, |f| f.as_json().to_string().len() * 4);
    // The struct, its Arc, and its slots in the maps that index it.
    std::mem::size_of::<Subscription>() + 160 + strings + types + secrets + headers + filter
}

impl State {
    fn touch(&mut self, key: &Key) -> Option<Value> {
        let tick = self.next_tick();
        let entry = self.entries.get_mut(key)?;
        let old = std::mem::replace(&mut entry.used, tick);
        let value = entry.value.clone();
        let tenant = Arc::clone(&entry.tenant);
        self.order.remove(&old);
        self.order.insert(tick, key.clone());
        if let Some((_, order)) = self.tenants.get_mut(&tenant) {
            order.remove(&old);
            order.insert(tick, key.clone());
        }
        Some(value)
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn held(&self, id: &str) -> Option<Arc<Subscription>> {
        let view_of = |key: &Key| match self.entries.get(key).map(|e| &e.value) {
            Some(Value::View(v)) => v.get(id).cloned(),
            _ => None,
        };
        view_of(&Key::id(id)).or_else(|| {
            self.listed
                .get(id)
                .and_then(|t| view_of(&Key::Tenant(Arc::clone(t))))
        })
    }

    /// Holds `value` for `key`, charged to `tenant`, evicting the tenant's least recently
    /// used first when it is at its bound, then anyone's.
    fn insert(&mut self, key: Key, value: Value, tenant: Arc<str>, limits: &CacheLimits) {
        self.remove(&key);
        let (weight, bytes) = match &value {
            Value::View(v) => (v.len().max(1), v.iter().map(|s| weigh(s)).sum::<usize>()),
            Value::TooMany => (1, 64),
        };
        let bytes = bytes + 64 + key_len(&key);
        if weight > limits.per_tenant.max(1) || weight > limits.entries || bytes > limits.bytes {
            return;
        }
        while self.tenant_weight(&tenant) + weight > limits.per_tenant {
            let Some(oldest) = self
                .tenants
                .get(&tenant)
                .and_then(|(_, o)| o.values().next().cloned())
            else {
                break;
            };
            self.remove(&oldest);
        }
        while self.weight + weight > limits.entries || self.bytes + bytes > limits.bytes {
            let Some(oldest) = self.order.values().next().cloned() else {
                break;
            };
            self.remove(&oldest);
        }
        let used = self.next_tick();
        if let (Key::Tenant(t), Value::View(v)) = (&key, &value) {
            for sub in v.iter() {
                self.listed
                    .insert(Arc::from(sub.id.as_str()), Arc::clone(t));
            }
        }
        self.order.insert(used, key.clone());
        let slot = self.tenants.entry(Arc::clone(&tenant)).or_default();
        slot.0 += weight;
        slot.1.insert(used, key.clone());
        self.weight += weight;
        self.bytes += bytes;
        self.version += 1;
        self.entries.insert(
            key,
            Entry {
                value,
                tenant,
                weight,
                bytes,
                used,
            },
        );
    }

    fn tenant_weight(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |(w, _)| *w)
    }

    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.used);
        if let Some(slot) = self.tenants.get_mut(&entry.tenant) {
            slot.0 = slot.0.saturating_sub(entry.weight);
            slot.1.remove(&entry.used);
            if slot.1.is_empty() {
                self.tenants.remove(&entry.tenant);
            }
        }
        if let (Key::Tenant(t), Value::View(v)) = (key, &entry.value) {
            for sub in v.iter() {
                if self.listed.get(sub.id.as_str()) == Some(t) {
                    self.listed.remove(sub.id.as_str());
                }
            }
        }
        self.weight = self.weight.saturating_sub(entry.weight);
        self.bytes = self.bytes.saturating_sub(entry.bytes);
        self.version += 1;
        Some(entry)
    }

    /// Subscription `id` is now `new`: its entry, the lists it leaves or joins, and the loads
    /// it makes stale. Returns the versions held before that it replaces.
    fn change(
        &mut self,
        id: &str,
        new: Option<&Arc<Subscription>>,
        limits: &CacheLimits,
    ) -> Vec<Arc<Subscription>> {
        let mut replaced = Vec::new();
        let id_key = Key::id(id);
        if let Some(flight) = self.flights.get_mut(&id_key) {
            flight.stale = true;
        }
        let old_tenant = self.listed.get(id).cloned();
        let new_tenant: Option<Arc<str>> = new.map(|s| Arc::from(s.tenant.as_str()));
        // A deletion of a subscription whose tenant is not known here: any tenant's load
        // under way may have read it.
        let unknown = new.is_none() && old_tenant.is_none();
        for (key, flight) in &mut self.flights {
            if let Key::Tenant(t) = key
                && (unknown || Some(t) == old_tenant.as_ref() || Some(t) == new_tenant.as_ref())
            {
                flight.stale = true;
            }
        }
        if let Some(entry) = self.entries.get(&id_key) {
            let tenant = Arc::clone(&entry.tenant);
            if let Value::View(v) = &entry.value {
                replaced.extend(v.get(id).cloned());
            }
            let value = Value::View(Arc::new(Subscriptions::from_list(
                new.map(|s| Subscription::clone(s)),
            )));
            let owner = new_tenant.clone().unwrap_or(tenant);
            self.insert(id_key, value, owner, limits);
        }
        let mut tenants: Vec<Arc<str>> = old_tenant.into_iter().collect();
        if let Some(t) = &new_tenant
            && !tenants.contains(t)
        {
            tenants.push(Arc::clone(t));
        }
        for tenant in tenants {
            let key = Key::Tenant(Arc::clone(&tenant));
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            let joins = new.filter(|s| s.enabled && s.tenant == *tenant);
            let value = match &entry.value {
                Value::View(v) => {
                    replaced.extend(v.get(id).cloned());
                    let next =
                        v.with_changes([(id.to_owned(), joins.map(|s| Subscription::clone(s)))]);
                    if next.len() > limits.per_tenant {
                        Value::TooMany
                    } else {
                        Value::View(Arc::new(next))
                    }
                }
                // Perhaps no longer above the bound: read again at the next fan-out.
                Value::TooMany => {
                    self.remove(&key);
                    continue;
                }
            };
            self.insert(key, value, tenant, limits);
        }
        replaced.dedup_by(|a, b| Arc::ptr_eq(a, b));
        replaced
    }
}

fn key_len(key: &Key) -> usize {
    match key {
        Key::Id(s) | Key::Tenant(s) => s.len() * 2,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::FutureExt;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::subscriptions::SecretRef;

    fn sub(id: &str, tenant: &str) -> Subscription {
        Subscription::new(
            id,
            tenant,
            "https://example.com/hook".parse().unwrap(),
            SecretRef::parse("env:X").unwrap(),
        )
    }

    /// Subscriptions `<tenant>_<n>` for n below `per_tenant`, each load counted, each held
    /// back until the gate lets it through.
    struct Counted {
        loads: AtomicUsize,
        gate: Arc<Semaphore>,
        per_tenant: usize,
        fail: bool,
    }

    const GATE: u32 = 1_000;

    impl Counted {
        fn new(per_tenant: usize, fail: bool) -> Arc<Self> {
            Arc::new(Self {
                loads: AtomicUsize::new(0),
                gate: Arc::new(Semaphore::new(GATE as usize)),
                per_tenant,
                fail,
            })
        }

        fn open(per_tenant: usize) -> Arc<Self> {
            Self::new(per_tenant, false)
        }

        /// Holds every load back until the permit is dropped.
        async fn close(&self) -> tokio::sync::OwnedSemaphorePermit {
            Arc::clone(&self.gate)
                .acquire_many_owned(GATE)
                .await
                .unwrap()
        }
    }

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    impl Loader for Counted {
        fn load(&self, key: &Key, limit: usize) -> BoxFuture<'static, Result<Loaded, String>> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            let (gate, key, n, fail) = (
                Arc::clone(&self.gate),
                key.clone(),
                self.per_tenant,
                self.fail,
            );
            async move {
                let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
                if fail {
                    return Err("connection refused".into());
                }
                Ok(match key {
                    Key::Id(id) => {
                        let tenant = id.split('_').next().unwrap_or_default().to_owned();
                        Loaded::One((!id.ends_with("_gone")).then(|| Box::new(sub(&id, &tenant))))
                    }
                    Key::Tenant(t) => Loaded::Tenant(
                        (0..n.min(limit + 1))
                            .map(|i| sub(&format!("{t}_{i}"), &t))
                            .collect(),
                    ),
                })
            }
            .boxed()
        }
    }

    fn limits(entries: usize, per_tenant: usize) -> CacheLimits {
        CacheLimits {
            entries,
            bytes: usize::MAX,
            per_tenant,
            load_timeout: Duration::from_millis(100),
        }
    }

    #[tokio::test]
    async fn concurrent_misses_of_one_key_load_once_and_then_hit() {
        let loader = Counted::open(3);
        let held = loader.close().await;
        let cache = Arc::new(SubscriptionCache::new(
            CacheLimits {
                load_timeout: Duration::from_secs(60),
                ..limits(100, 10)
            },
            loader.clone(),
        ));
        let key = Key::id("a_1");
        let asks: Vec<_> = (0..20)
            .map(|_| {
                let (cache, key) = (Arc::clone(&cache), key.clone());
                tokio::spawn(async move { cache.lookup(&key, "a").await })
            })
            .collect();
        settle().await;
        drop(held);
        for ask in asks {
            let (view, served) = ask.await.unwrap().unwrap();
            assert!(view.get("a_1").is_some());
            assert!(matches!(served, Served::Miss(_)));
        }
        assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
        let (_, served) = cache.lookup(&key, "a").await.unwrap();
        assert_eq!(served, Served::Hit);
        assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_slow_store_is_waited_for_briefly_and_its_load_kept_for_later() {
        let loader = Counted::open(3);
        let held = loader.close().await;
        let cache = Arc::new(SubscriptionCache::new(limits(100, 10), loader.clone()));
        let key = Key::id("a_1");
        let slow = cache.lookup(&key, "a").await.unwrap_err();
        assert_eq!(slow, MissError::Slow(Duration::from_millis(100)));
        assert!(slow.retry_helps());
        // Asked again while the first load is still under way: it joins it.
        let again = cache.lookup(&key, "a").await.unwrap_err();
        assert!(matches!(again, MissError::Slow(_)));
        assert_eq!(loader.loads.load(Ordering::SeqCst), 1);
        drop(held);
        // The load ends (its deadline is far off) and is held.
        settle().await;
        let (view, served) = cache.lookup(&key, "a").await.unwrap();
        assert_eq!(served, Served::Hit);
        assert!(view.get("a_1").is_some());
    }

    #[tokio::test]
    async fn a_store_that_fails_is_said_and_nothing_is_held() {
        let loader = Counted::new(1, true);
        let cache = Arc::new(SubscriptionCache::new(limits(100, 10), loader.clone()));
        let e = cache.lookup(&Key::tenant("a"), "a").await.unwrap_err();
        assert!(
            matches!(e, MissError::Store(ref m) if m.contains("refused")),
            "{e}"
        );
        assert_eq!(cache.held(), Held::default());
        let _ = cache.lookup(&Key::tenant("a"), "a").await.unwrap_err();
        assert_eq!(loader.loads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn one_tenant_evicts_its_own_entries_and_the_cache_stays_in_its_bounds() {
        let cache = Arc::new(SubscriptionCache::new(limits(10, 4), Counted::open(3)));
        // Tenant b holds a list of three and one id.
        cache.lookup(&Key::tenant("b"), "b").await.unwrap();
        cache.lookup(&Key::id("b_9"), "b").await.unwrap();
        // Tenant a asks for twenty ids: it keeps its last four, and b keeps all it held.
        for i in 0..20 {
            cache
                .lookup(&Key::id(&format!("a_{i}")), "a")
                .await
                .unwrap();
        }
        let held = cache.held();
        assert_eq!(held.subscriptions, 8, "{held:?}");
        let (ids, tenants) = cache.held_keys();
        assert_eq!(tenants, vec!["b".to_owned()]);
        assert!(ids.contains(&"b_9".to_owned()));
        assert_eq!(ids.iter().filter(|i| i.starts_with("a_")).count(), 4);
        // Everyone's bound: the least recently used go first.
        for t in ["c", "d", "e"] {
            cache.lookup(&Key::id(&format!("{t}_1")), t).await.unwrap();
        }
        assert!(cache.held().subscriptions <= 10);
        assert!(
            cache.get("b_0").is_none(),
            "b's list was the least recently used"
        );
        assert!(cache.get("e_1").is_some());
    }

    #[tokio::test]
    async fn a_tenant_above_its_bound_is_refused_for_a_fan_out() {
        let cache = Arc::new(SubscriptionCache::new(limits(100, 5), Counted::open(9)));
        let e = cache.lookup(&Key::tenant("big"), "big").await.unwrap_err();
        assert!(!e.retry_helps());
        assert!(e.to_string().contains("store.cache_per_tenant"), "{e}");
        // Remembered: not read again at each event.
        let loads = cache.held().keys;
        assert_eq!(loads, 1);
    }

    #[tokio::test]
    async fn changes_reach_what_is_held_and_a_load_under_way_is_not_kept() {
        let loader = Counted::open(2);
        let cache = Arc::new(SubscriptionCache::new(limits(100, 10), loader.clone()));
        let (view, _) = cache.lookup(&Key::tenant("t"), "t").await.unwrap();
        assert_eq!(view.matching("t", "x").len(), 2);
        cache.lookup(&Key::id("t_0"), "t").await.unwrap();

        // Changed: the id's entry and the tenant's list both take it.
        let mut changed = sub("t_0", "t");
        changed.url = "https://changed.example/".parse().unwrap();
        let replaced = cache.apply(vec![("t_0".into(), Some(changed))]);
        // The id's version and the list's, each read on its own.
        assert_eq!(replaced.len(), 2);
        let (by_id, _) = cache.lookup(&Key::id("t_0"), "t").await.unwrap();
        assert_eq!(
            by_id.get("t_0").unwrap().url.as_str(),
            "https://changed.example/"
        );
        let (list, _) = cache.lookup(&Key::tenant("t"), "t").await.unwrap();
        assert_eq!(
            list.get("t_0").unwrap().url.as_str(),
            "https://changed.example/"
        );

        // Disabled: out of the fan-out list, still known by id. A new one joins the list.
        let mut disabled = sub("t_1", "t");
        disabled.enabled = false;
        cache.apply(vec![
            ("t_1".into(), Some(disabled)),
            ("t_7".into(), Some(sub("t_7", "t"))),
        ]);
        let (list, _) = cache.lookup(&Key::tenant("t"), "t").await.unwrap();
        let ids: Vec<_> = list
            .matching("t", "x")
            .iter()
            .map(|s| s.id.clone())
            .collect();
        assert_eq!(ids, vec!["t_0", "t_7"]);

        // Deleted: gone from both.
        cache.apply(vec![("t_0".into(), None)]);
        let (by_id, served) = cache.lookup(&Key::id("t_0"), "t").await.unwrap();
        assert_eq!((by_id.len(), served), (0, Served::Hit));
        assert!(cache.get("t_0").is_none());

        // Not held: nothing to do, nothing held.
        let before = cache.held();
        cache.apply(vec![("u_1".into(), Some(sub("u_1", "u")))]);
        assert_eq!(cache.held(), before);
        assert!(cache.concerned(&["u_1".into()]).contains(&"u_1".to_owned()));

        // A change while a load is under way: the load serves its waiters, but is not kept.
        let gate = loader.close().await;
        let asking = {
            let cache = Arc::clone(&cache);
            tokio::spawn(async move { cache.lookup(&Key::id("v_1"), "v").await })
        };
        settle().await;
        cache.apply(vec![("v_1".into(), Some(sub("v_1", "v")))]);
        drop(gate);
        let _ = asking.await.unwrap();
        settle().await;
        assert!(
            cache.get("v_1").is_none(),
            "a load older than a change is not kept"
        );
    }

    #[test]
    fn the_snapshot_has_every_subscription_held_once() {
        let cache = SubscriptionCache::new(limits(100, 10), Counted::open(0));
        let mut state = cache.lock();
        let l = limits(100, 10);
        state.insert(
            Key::tenant("t"),
            Value::View(Arc::new(Subscriptions::from_list([
                sub("t_0", "t"),
                sub("t_1", "t"),
            ]))),
            Arc::from("t"),
            &l,
        );
        state.insert(
            Key::id("t_0"),
            Value::View(Arc::new(Subscriptions::from_list([sub("t_0", "t")]))),
            Arc::from("t"),
            &l,
        );
        drop(state);
        let snapshot = cache.snapshot();
        assert_eq!(snapshot.len(), 2);
        assert!(Arc::ptr_eq(&snapshot, &cache.snapshot()));
    }
}
