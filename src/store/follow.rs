//! How a worker keeps its snapshot of a PostgreSQL store current. The snapshot is what every
//! delivery reads (no query per delivery); this task changes it:
//!
//! - each committed change arrives as a notification naming the subscription (the schema's
//!   triggers), and only the subscriptions named are read again: a change is in force within
//!   the time of one small query;
//! - after any (re)connection of the listening connection, and every `store.resync`, the whole
//!   store is read again: notifications sent while nobody listened are not lost for good;
//! - a worker that holds only what it delivers for ([`crate::subscriptions::cache`]) reads
//!   only the changed subscriptions that concern what it holds, and its full reads read only
//!   what it holds;
//! - while the database does not answer, the worker keeps delivering on the last snapshot, says
//!   so once in the log, in `/readyz`'s detail and in `hookrelay_subscription_store_up`, and
//!   tries again with backoff; the first successful read after that puts every change in force.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::postgres::{CHANNEL, PgStore, RowProblem, StoreError};
use crate::observe::metrics::Metrics;
use crate::subscriptions::cache::SubscriptionCache;
use crate::subscriptions::{LiveSubscriptions, SecretStore, Subscription, Subscriptions};

/// More ids than this in one batch of notifications: read everything instead (a bulk import).
const FULL_READ_ABOVE: usize = 2_000;
const BACKOFF_MIN: Duration = Duration::from_millis(500);
// Short: a store back from an outage is followed again within this, and a try is one cheap
// connection attempt.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What the listening task passes on.
enum Signal {
    /// A subscription changed.
    Changed(String),
    /// The listening connection was lost or re-established: notifications may have been missed.
    Resync,
    /// Listening failed; it is retried.
    Down(String),
}

/// A store opened to be followed: listening already, then read whole, so no change made after
/// the read can go unnoticed and the follower need not read it all again at once.
pub struct Opened {
    pub store: PgStore,
    pub first: crate::subscriptions::Subscriptions,
    pub problems: Vec<RowProblem>,
    listener: PgListener,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("store", &self.store.shown())
            .field("subscriptions", &self.first.len())
            .finish_non_exhaustive()
    }
}

impl Opened {
    /// Starts listening for changes, then reads every subscription.
    pub async fn open(store: PgStore) -> Result<Self, StoreError> {
        let listener = connect(&store).await?;
        let (first, problems) = store.load_all().await?;
        Ok(Self {
            store,
            first,
            problems,
            listener,
        })
    }

    /// Starts listening for changes and reads nothing: for a worker that holds only what it
    /// delivers for ([`crate::subscriptions::cache`]), whose cache starts empty.
    pub async fn listen(store: PgStore) -> Result<Self, StoreError> {
        let listener = connect(&store).await?;
        Ok(Self {
            store,
            first: Subscriptions::default(),
            problems: Vec::new(),
            listener,
        })
    }

    /// What a worker follows once `first` is in its snapshot.
    pub fn following(self) -> Following {
        Following {
            store: self.store,
            listener: Some(self.listener),
        }
    }
}

/// A store to follow, and, when [`Opened`] made it, the connection already listening since
/// the snapshot was read.
pub struct Following {
    pub store: PgStore,
    listener: Option<PgListener>,
}

impl std::fmt::Debug for Following {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Following")
            .field("store", &self.store.shown())
            .field("listening", &self.listener.is_some())
            .finish()
    }
}

impl From<PgStore> for Following {
    /// A store whose snapshot was read without listening first: the follower reads it whole
    /// again once it listens.
    fn from(store: PgStore) -> Self {
        Self {
            store,
            listener: None,
        }
    }
}

/// Follows the store into `live` until `stop`.
pub async fn follow(
    following: Following,
    live: Arc<LiveSubscriptions>,
    secrets: Arc<SecretStore>,
    metrics: Metrics,
    resync_every: Duration,
    stop: CancellationToken,
) {
    let Following { store, listener } = following;
    let (tx, mut rx) = mpsc::channel(4096);
    let listening = tokio::spawn(listen(store.clone(), listener, tx, stop.clone()));
    let mut state = State {
        store,
        live,
        secrets,
        metrics,
        down_since: None,
        reported_problems: BTreeSet::new(),
    };
    let mut resync = tokio::time::interval(resync_every);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.reset();
    let mut retry: Option<Duration> = None;
    loop {
        let wait_retry = async {
            match retry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            signal = rx.recv() => match signal {
                None => break,
                Some(Signal::Changed(id)) => {
                    let mut ids = BTreeSet::from([id]);
                    // Whatever else has arrived meanwhile goes in the same read.
                    while ids.len() <= FULL_READ_ABOVE {
                        match rx.try_recv() {
                            Ok(Signal::Changed(id)) => { ids.insert(id); }
                            Ok(Signal::Resync) => { ids.clear(); break; }
                            Ok(Signal::Down(why)) => { state.down(&why); break; }
                            Err(_) => break,
                        }
                    }
                    let done = if ids.is_empty() || ids.len() > FULL_READ_ABOVE {
                        state.read_all().await
                    } else {
                        state.read_some(ids.into_iter().collect()).await
                    };
                    retry = next_retry(done, retry);
                }
                Some(Signal::Resync) => retry = next_retry(state.read_all().await, retry),
                Some(Signal::Down(why)) => {
                    state.down(&why);
                    retry = retry.or(Some(BACKOFF_MIN));
                }
            },
            _ = resync.tick() => retry = next_retry(state.read_all().await, retry),
            () = wait_retry => retry = next_retry(state.read_all().await, retry),
        }
    }
    listening.abort();
}

/// After a read: no retry when it worked, else the next pause (doubling).
fn next_retry(done: bool, retry: Option<Duration>) -> Option<Duration> {
    if done {
        None
    } else {
        Some(retry.map_or(BACKOFF_MIN, |d| (d * 2).min(BACKOFF_MAX)))
    }
}

/// Listens on its own connection, passing notifications on. Never cancelled mid-read (the
/// follower selects on the channel, not on the socket).
async fn listen(
    store: PgStore,
    mut first: Option<PgListener>,
    tx: mpsc::Sender<Signal>,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        // A listener handed over listened before the snapshot was read: nothing to read again.
        let handed_over = first.is_some();
        let connected = match first.take() {
            Some(l) => Ok(l),
            None => connect(&store).await,
        };
        let mut listener = match connected {
            Ok(l) => l,
            Err(e) => {
                if tx.send(Signal::Down(e.to_string())).await.is_err() {
                    return;
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        // Listening from here on: a full read now sees every change made before.
        if !handed_over && tx.send(Signal::Resync).await.is_err() {
            return;
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    if tx
                        .send(Signal::Changed(n.payload().to_owned()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                // The connection was lost and is back (eager reconnect), listening again.
                Ok(None) => {
                    if tx.send(Signal::Resync).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if tx.send(Signal::Down(e.to_string())).await.is_err() {
                        return;
                    }
                    break;
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
    }
}

async fn connect(store: &PgStore) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(store.pool()).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

struct State {
    store: PgStore,
    live: Arc<LiveSubscriptions>,
    secrets: Arc<SecretStore>,
    metrics: Metrics,
    down_since: Option<SystemTime>,
    /// Problems already logged, so a bad row is reported once, not at every resync.
    reported_problems: BTreeSet<String>,
}

impl State {
    async fn read_all(&mut self) -> bool {
        if let Some(cache) = self.live.cache().cloned() {
            return self.refresh_held(&cache).await;
        }
        match self.store.load_all().await {
            Ok((subscriptions, problems)) => {
                let n = subscriptions.len();
                self.report(&problems, true);
                // Compared and dropped off the runtime's threads: a store may hold 100,000.
                let before = self.live.current();
                let next = Arc::new(subscriptions);
                let after = Arc::clone(&next);
                let secrets = Arc::clone(&self.secrets);
                let changed = tokio::task::spawn_blocking(move || {
                    let changed: Vec<String> = after
                        .iter()
                        .filter(|s| before.get(&s.id) != Some(*s))
                        .map(|s| s.id.clone())
                        .collect();
                    drop(before);
                    // What rows changed or went while notifications were missed named.
                    secrets.retain_live(&after);
                    changed
                })
                .await
                .unwrap_or_default();
                let old = self.live.replace_arc(next);
                tokio::task::spawn_blocking(move || drop(old));
                self.check_secrets(changed);
                self.up(n);
                true
            }
            Err(e) => {
                self.down(&e.to_string());
                false
            }
        }
    }

    /// A full read of a cache: what it holds, read again.
    async fn refresh_held(&mut self, cache: &Arc<SubscriptionCache>) -> bool {
        match super::held::refresh(&self.store, cache).await {
            Ok((replaced, problems)) => {
                self.report(&problems, true);
                self.forget_held(cache, &replaced);
                let n = cache.held().subscriptions;
                self.up(n);
                true
            }
            Err(e) => {
                self.down(&e.to_string());
                false
            }
        }
    }

    /// Changes to a cache: only what it holds (or is loading) is read and changed.
    async fn read_held(&mut self, cache: &Arc<SubscriptionCache>, ids: &[String]) -> bool {
        let ids = cache.concerned(ids);
        if ids.is_empty() {
            let n = cache.held().subscriptions;
            self.up(n);
            return true;
        }
        match self.store.load_some(&ids).await {
            Ok((changes, problems)) => {
                self.report(&problems, false);
                let changes = valid_only(changes, &problems);
                let applied = changes.len();
                let replaced = cache.apply(changes);
                self.forget_held(cache, &replaced);
                self.metrics
                    .subscription_store_changes
                    .inc_by(u64::try_from(applied).unwrap_or(u64::MAX));
                let n = cache.held().subscriptions;
                self.up(n);
                true
            }
            Err(e) => {
                self.down(&e.to_string());
                false
            }
        }
    }

    /// The secrets of versions a cache no longer holds go; those of the versions in force are
    /// checked.
    fn forget_held(&self, cache: &SubscriptionCache, replaced: &[Arc<Subscription>]) {
        for old in replaced {
            let now = cache.get(&old.id);
            self.secrets.forget_replaced(old, now.as_deref());
            if let Some(sub) = now {
                for e in self.secrets.problems_of(&sub) {
                    error!(subscription = %sub.id, problem = %e, "A secret of a stored subscription does not resolve; its deliveries fail and are retried until it does");
                }
            }
        }
    }

    async fn read_some(&mut self, ids: Vec<String>) -> bool {
        if let Some(cache) = self.live.cache().cloned() {
            return self.read_held(&cache, &ids).await;
        }
        match self.store.load_some(&ids).await {
            Ok((changes, problems)) => {
                self.report(&problems, false);
                let changes = valid_only(changes, &problems);
                let applied = changes.len();
                let before = self.live.current();
                self.live.apply(changes);
                self.forget_replaced(&before, &ids);
                self.check_secrets(ids);
                self.metrics
                    .subscription_store_changes
                    .inc_by(u64::try_from(applied).unwrap_or(u64::MAX));
                let n = self.live.current().len();
                self.up(n);
                true
            }
            Err(e) => {
                self.down(&e.to_string());
                false
            }
        }
    }

    /// Drops the secrets of the versions of `ids` that `before` held and are now replaced or
    /// deleted, so a storm of changes leaves only what is in force.
    fn forget_replaced(&self, before: &Subscriptions, ids: &[String]) {
        let current = self.live.current();
        for id in ids {
            if let Some(old) = before.get(id) {
                self.secrets
                    .forget_replaced(old, current.get(id).map(AsRef::as_ref));
            }
        }
    }

    /// Secrets are resolved at attempt time; one that does not resolve now is said at once.
    fn check_secrets(&self, ids: Vec<String>) {
        let current = self.live.current();
        for id in ids {
            if let Some(sub) = current.get(&id) {
                for e in self.secrets.problems_of(sub) {
                    error!(subscription = %id, problem = %e, "A secret of a stored subscription does not resolve; its deliveries fail and are retried until it does");
                }
            }
        }
    }

    fn report(&mut self, problems: &[RowProblem], whole: bool) {
        let shown: BTreeSet<String> = problems.iter().map(ToString::to_string).collect();
        for p in shown.difference(&self.reported_problems) {
            error!(problem = %p, "A stored subscription does not validate; left out (its last good version stays in force until the next full read)");
        }
        if whole {
            self.reported_problems = shown;
        } else {
            self.reported_problems.extend(shown);
        }
    }

    fn up(&mut self, subscriptions: usize) {
        if let Some(since) = self.down_since.take() {
            let away = SystemTime::now().duration_since(since).unwrap_or_default();
            info!(
                subscriptions,
                away = %crate::units::fmt_duration(away),
                "Subscription store reachable again; every change is in force"
            );
        }
        self.metrics.subscription_store_up.set(1);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.metrics.subscription_store_synced.set(now);
    }

    fn down(&mut self, why: &str) {
        if self.down_since.is_none() {
            self.down_since = Some(SystemTime::now());
            warn!(
                store = %self.store.shown(),
                error = %why,
                subscriptions = self.live.current().len(),
                "Subscription store unreachable; delivering on the last snapshot until it answers"
            );
        }
        self.metrics.subscription_store_up.set(0);
    }
}

/// Loads the store at start: it must answer and its schema must be current.
pub async fn open(url: &str, timeout: Duration) -> Result<PgStore, StoreError> {
    let store = PgStore::connect(url, timeout).await?;
    store.check_schema().await?;
    Ok(store)
}
/// The changes read, without the rows that do not validate: such a row keeps its last good
/// version.
fn valid_only(
    changes: Vec<(String, Option<Subscription>)>,
    problems: &[RowProblem],
) -> Vec<(String, Option<Subscription>)> {
    let bad: BTreeSet<&str> = problems.iter().map(|p| p.id.as_str()).collect();
    changes
        .into_iter()
        .filter(|(id, _)| !bad.contains(id.as_str()))
        .collect()
}
