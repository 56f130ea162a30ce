//! The reads of a worker that holds only the subscriptions it delivers for
//! ([`crate::subscriptions::cache`]): one subscription by id, a tenant's enabled ones (at most
//! the bound plus one, so a tenant above it is told apart without reading it whole), and, for
//! a full read, only what is held.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::postgres::{
    PgStore, RowProblem, SECRET_COLUMNS, SECRETS_WITH_TENANT, SUBSCRIPTION_COLUMNS, StoreError,
    build,
};
use crate::subscriptions::Subscription;
use crate::subscriptions::cache::{Key, Loaded, Loader, SubscriptionCache};

/// Ids or tenants read in one query by a full read.
const CHUNK: usize = 2_000;

/// Loads misses from the store.
#[derive(Debug, Clone)]
pub struct StoreLoader(pub PgStore);

impl StoreLoader {
    /// Reads through a pool of `connections` of their own (`store.lookup_connections`): with
    /// one pool, a burst of misses queued behind the follower's reads, or held them up, and
    /// lookups timed out with 8 connections for everything.
    pub fn own_pool(store: &PgStore, connections: u32) -> Self {
        Self(store.with_own_pool(connections))
    }
}

impl Loader for StoreLoader {
    fn load(&self, key: &Key, limit: usize) -> BoxFuture<'static, Result<Loaded, String>> {
        let store = self.0.clone();
        let key = key.clone();
        async move {
            match key {
                Key::Id(id) => {
                    let ids = [id.to_string()];
                    let (mut found, problems) =
                        store.load_some(&ids).await.map_err(|e| e.to_string())?;
                    // A row that does not validate is not taken for a deleted one: its
                    // deliveries wait until it is corrected.
                    if let Some(p) = problems.first() {
                        return Err(p.to_string());
                    }
                    Ok(Loaded::One(found.pop().and_then(|(_, s)| s).map(Box::new)))
                }
                Key::Tenant(tenant) => {
                    let tenants = [tenant.to_string()];
                    let (mut lists, problems) = load_tenants(&store, &tenants, limit)
                        .await
                        .map_err(|e| e.to_string())?;
                    report(&problems);
                    Ok(Loaded::Tenant(lists.remove(&*tenant).unwrap_or_default()))
                }
            }
        }
        .boxed()
    }
}

fn report(problems: &[RowProblem]) {
    for p in problems {
        tracing::error!(problem = %p, "A stored subscription does not validate; left out");
    }
}

/// The enabled subscriptions of `tenants`, at most `limit + 1` of each (by id).
pub async fn load_tenants(
    store: &PgStore,
    tenants: &[String],
    limit: usize,
) -> Result<(HashMap<String, Vec<Subscription>>, Vec<RowProblem>), StoreError> {
    let limit = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let mut tx = store.snapshot().await?;
    let rows = sqlx::query(&format!(
        "SELECT {SUBSCRIPTION_COLUMNS} FROM (SELECT *, row_number() OVER \
         (PARTITION BY tenant ORDER BY id) AS n FROM subscriptions \
         WHERE tenant = ANY($1) AND enabled) s WHERE n <= $2"
    ))
    .bind(tenants)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<String> = rows
        .iter()
        .filter_map(|r| sqlx::Row::try_get::<String, _>(r, "id").ok())
        .collect();
    let secrets = sqlx::query(&format!(
        "SELECT {SECRET_COLUMNS} FROM {SECRETS_WITH_TENANT} \
         WHERE x.subscription_id = ANY($1) ORDER BY x.subscription_id, x.position DESC"
    ))
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let (list, problems) = build(&rows, &secrets);
    let mut by_tenant: HashMap<String, Vec<Subscription>> = HashMap::new();
    for sub in list {
        by_tenant.entry(sub.tenant.clone()).or_default().push(sub);
    }
    Ok((by_tenant, problems))
}

/// A full read of what `cache` holds: its ids and its tenants read again, in chunks, and put
/// in force. Returns the versions replaced (their secrets go) and the rows left out.
pub async fn refresh(
    store: &PgStore,
    cache: &Arc<SubscriptionCache>,
) -> Result<(Vec<Arc<Subscription>>, Vec<RowProblem>), StoreError> {
    cache.forget_flights();
    let (ids, tenants) = cache.held_keys();
    let mut replaced = Vec::new();
    let mut all_problems = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let (changes, problems) = store.load_some(chunk).await?;
        // A row that does not validate keeps its last good version.
        let changes = changes
            .into_iter()
            .filter(|(id, _)| !problems.iter().any(|p| p.id == *id))
            .filter(|(id, new)| cache.get(id).as_deref() != new.as_ref())
            .collect();
        replaced.extend(cache.apply(changes));
        all_problems.extend(problems);
    }
    let limit = cache.limits().per_tenant;
    for chunk in tenants.chunks(CHUNK / 4) {
        let (mut lists, problems) = load_tenants(store, chunk, limit).await?;
        for tenant in chunk {
            cache.refresh_tenant(tenant, lists.remove(tenant).unwrap_or_default());
        }
        all_problems.extend(problems);
    }
    Ok((replaced, all_problems))
}
