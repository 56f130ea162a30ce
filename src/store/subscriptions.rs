//! The API's reads and writes of subscriptions and their secrets. Every read and write of a
//! caller's subscription is limited to its tenant in the query itself (`tenant = $n` when a
//! tenant is given), so another tenant's subscription is not found rather than forbidden. The
//! triggers of the schema tell the workers of every change when its transaction commits.
//!
//! Nothing here validates: the rows are given and taken as stored, and the API checks them.

use std::collections::HashMap;
use std::time::SystemTime;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};

use super::postgres::epoch_ms;
use super::request::StoredRequest;
use super::{QueryError, column};

const COLUMNS: &str = "id, tenant, url, event_types, enabled, paused, max_concurrent, rate, \
     description, disabled_reason, request, payload_filter, \
     (extract(epoch from created_at) * 1000)::int8 AS created_ms, \
     (extract(epoch from updated_at) * 1000)::int8 AS updated_ms";

/// A subscription's row, as stored.
#[derive(Debug, Clone)]
pub struct SubscriptionRow {
    pub id: String,
    pub tenant: String,
    pub url: String,
    pub event_types: Option<Vec<String>>,
    pub enabled: bool,
    pub paused: bool,
    pub max_concurrent: Option<u32>,
    pub rate: Option<String>,
    pub description: String,
    pub disabled_reason: Option<String>,
    pub request: StoredRequest,
    /// The payload filter as written; `None`: every event.
    pub payload_filter: Option<serde_json::Value>,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
    pub updated_ms: i64,
}

impl SubscriptionRow {
    fn of(row: &PgRow) -> Result<Self, QueryError> {
        let max_concurrent: Option<i32> = column(row, "max_concurrent")?;
        let request: sqlx::types::Json<StoredRequest> = column(row, "request")?;
        let payload_filter: Option<sqlx::types::Json<serde_json::Value>> =
            column(row, "payload_filter")?;
        Ok(Self {
            id: column(row, "id")?,
            tenant: column(row, "tenant")?,
            url: column(row, "url")?,
            event_types: column(row, "event_types")?,
            enabled: column(row, "enabled")?,
            paused: column(row, "paused")?,
            max_concurrent: max_concurrent.and_then(|n| u32::try_from(n).ok()),
            rate: column(row, "rate")?,
            description: column(row, "description")?,
            disabled_reason: column(row, "disabled_reason")?,
            request: request.0,
            payload_filter: payload_filter.map(|f| f.0),
            created_ms: column(row, "created_ms")?,
            updated_ms: column(row, "updated_ms")?,
        })
    }
}

/// The dates of a signing secret, and its public key for a `v1a` key; never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretDates {
    pub created_ms: i64,
    pub expires_ms: Option<i64>,
    pub public_key: Option<String>,
}

/// What a create or a change writes of a subscription.
#[derive(Debug, Clone)]
pub struct SubscriptionWrite<'a> {
    pub id: &'a str,
    pub tenant: &'a str,
    pub url: &'a str,
    pub event_types: Option<Vec<String>>,
    pub enabled: bool,
    pub paused: bool,
    pub max_concurrent: Option<u32>,
    pub rate: Option<String>,
    pub description: &'a str,
    pub request: &'a StoredRequest,
    pub payload_filter: Option<&'a serde_json::Value>,
    /// Purposes whose stored secrets go (`header:` for every header's).
    pub replaced: &'a [String],
}

impl SubscriptionWrite<'_> {
    fn max_concurrent(&self) -> Option<i32> {
        self.max_concurrent.and_then(|n| i32::try_from(n).ok())
    }
}

/// A new signing secret, sealed, and its public key for a `v1a` key.
#[derive(Debug, Clone)]
pub struct NewSigning {
    pub sealed: Vec<u8>,
    pub public_key: Option<String>,
}

/// The version of a subscription's row: it changes with every write of the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowVersion(String);

/// The secrets' dates of `ids`, by subscription, newest first.
pub async fn secret_dates(
    conn: &mut PgConnection,
    ids: &[String],
) -> Result<HashMap<String, Vec<SecretDates>>, QueryError> {
    let rows = sqlx::query(
        "SELECT subscription_id, (extract(epoch from created_at) * 1000)::int8 AS created_ms, \
         (extract(epoch from expires_at) * 1000)::int8 AS expires_ms, public_key \
         FROM subscription_secrets WHERE subscription_id = ANY($1) AND purpose = 'signing' \
         ORDER BY subscription_id, position DESC",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    let mut by_id: HashMap<String, Vec<SecretDates>> = HashMap::new();
    for row in &rows {
        by_id
            .entry(column(row, "subscription_id")?)
            .or_default()
            .push(SecretDates {
                created_ms: column(row, "created_ms")?,
                expires_ms: column(row, "expires_ms")?,
                public_key: column(row, "public_key")?,
            });
    }
    Ok(by_id)
}

/// Subscription `id` and its secrets' dates, if it is of `tenant` (any, for `None`).
pub async fn get(
    conn: &mut PgConnection,
    id: &str,
    tenant: Option<&str>,
) -> Result<Option<(SubscriptionRow, Vec<SecretDates>)>, QueryError> {
    let Some(row) = select(conn, id, tenant, "").await? else {
        return Ok(None);
    };
    let mut secrets = secret_dates(conn, &[id.to_owned()]).await?;
    Ok(Some((row, secrets.remove(id).unwrap_or_default())))
}

/// Subscription `id`, if it is of `tenant` (any, for `None`).
pub async fn find(
    conn: &mut PgConnection,
    id: &str,
    tenant: Option<&str>,
) -> Result<Option<SubscriptionRow>, QueryError> {
    select(conn, id, tenant, "").await
}

/// Subscription `id` and the version of its row, if it is of `tenant` (any, for `None`).
pub async fn find_versioned(
    conn: &mut PgConnection,
    id: &str,
    tenant: Option<&str>,
) -> Result<Option<(SubscriptionRow, RowVersion)>, QueryError> {
    // xmin: the transaction that wrote this version of the row.
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS}, xmin::text AS version FROM subscriptions \
         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"
    ))
    .bind(id)
    .bind(tenant)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| {
        Ok((
            SubscriptionRow::of(&row)?,
            RowVersion(column(&row, "version")?),
        ))
    })
    .transpose()
}

/// Locks subscription `id`'s row until the transaction ends; its version, if it is of
/// `tenant` (any, for `None`).
pub async fn lock_version(
    conn: &mut PgConnection,
    id: &str,
    tenant: Option<&str>,
) -> Result<Option<RowVersion>, QueryError> {
    let version: Option<String> = sqlx::query_scalar(
        "SELECT xmin::text FROM subscriptions WHERE id = $1 \
         AND ($2::text IS NULL OR tenant = $2) FOR UPDATE",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(version.map(RowVersion))
}

/// Subscription `id`, locked until the transaction ends, if it is of `tenant` (any, for
/// `None`).
pub async fn lock(
    conn: &mut PgConnection,
    id: &str,
    tenant: Option<&str>,
) -> Result<Option<SubscriptionRow>, QueryError> {
    select(conn, id, tenant, "FOR UPDATE").await
}

async fn select(
    conn: &mut PgConnection,
    id: &str,
    tenant: Option<&str>,
    locking: &str,
) -> Result<Option<SubscriptionRow>, QueryError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM subscriptions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) \
         {locking}"
    ))
    .bind(id)
    .bind(tenant)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(SubscriptionRow::of).transpose()
}

/// Whether subscription `id` is paused; `None` when there is no such subscription.
pub async fn paused(pool: &PgPool, id: &str) -> Result<Option<bool>, QueryError> {
    Ok(
        sqlx::query_scalar("SELECT paused FROM subscriptions WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// The tenant of subscription `id`; `None` when there is no such subscription.
pub async fn tenant_of(pool: &PgPool, id: &str) -> Result<Option<String>, QueryError> {
    Ok(
        sqlx::query_scalar("SELECT tenant FROM subscriptions WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// Stores `signing`; the positions of their rows, in order.
async fn insert_signing(
    conn: &mut PgConnection,
    id: &str,
    signing: &[NewSigning],
) -> Result<Vec<i64>, QueryError> {
    let mut positions = Vec::with_capacity(signing.len());
    for s in signing {
        let position: i64 = sqlx::query_scalar(
            "INSERT INTO subscription_secrets (subscription_id, sealed, public_key) \
             VALUES ($1, $2, $3) RETURNING position",
        )
        .bind(id)
        .bind(&s.sealed)
        .bind(&s.public_key)
        .fetch_one(&mut *conn)
        .await?;
        positions.push(position);
    }
    Ok(positions)
}

/// The sealed signing secret at `position` of subscription `id`, and the subscription's
/// tenant.
pub async fn signing_secret(
    conn: &mut PgConnection,
    id: &str,
    position: i64,
) -> Result<Option<(Vec<u8>, String)>, QueryError> {
    Ok(sqlx::query_as(
        "SELECT x.sealed, s.tenant FROM subscription_secrets x \
         JOIN subscriptions s ON s.id = x.subscription_id \
         WHERE x.subscription_id = $1 AND x.position = $2 AND x.purpose = 'signing' \
         AND x.sealed IS NOT NULL",
    )
    .bind(id)
    .bind(position)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Replaces the stored secrets of `replaced` purposes (`header:` for all of the headers') and
/// stores `sealed` ones, by purpose.
async fn write_request_secrets(
    conn: &mut PgConnection,
    id: &str,
    replaced: &[String],
    sealed: &[(String, Vec<u8>)],
) -> Result<(), QueryError> {
    for purpose in replaced {
        sqlx::query(
            "DELETE FROM subscription_secrets WHERE subscription_id = $1 AND purpose <> 'signing' \
             AND (purpose = $2 OR ($2 = 'header:' AND purpose LIKE 'header:%'))",
        )
        .bind(id)
        .bind(purpose)
        .execute(&mut *conn)
        .await?;
    }
    for (purpose, bytes) in sealed {
        sqlx::query(
            "INSERT INTO subscription_secrets (subscription_id, purpose, sealed) VALUES ($1, $2, $3)",
        )
        .bind(id)
        .bind(purpose)
        .bind(bytes)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Inserts a new subscription with its signing secrets and the secrets of its headers and
/// authentication, sealed; the positions of the signing secrets' rows, `None` when the id is
/// taken.
pub async fn insert(
    conn: &mut PgConnection,
    sub: &SubscriptionWrite<'_>,
    signing: &[NewSigning],
    sealed: &[(String, Vec<u8>)],
) -> Result<Option<Vec<i64>>, QueryError> {
    let inserted = sqlx::query(
        "INSERT INTO subscriptions (id, tenant, url, event_types, enabled, paused, \
         max_concurrent, rate, description, request, payload_filter) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (id) DO NOTHING",
    )
    .bind(sub.id)
    .bind(sub.tenant)
    .bind(sub.url)
    .bind(&sub.event_types)
    .bind(sub.enabled)
    .bind(sub.paused)
    .bind(sub.max_concurrent())
    .bind(&sub.rate)
    .bind(sub.description)
    .bind(sqlx::types::Json(sub.request))
    .bind(sub.payload_filter.map(sqlx::types::Json))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(None);
    }
    let positions = insert_signing(conn, sub.id, signing).await?;
    write_request_secrets(conn, sub.id, &[], sealed).await?;
    Ok(Some(positions))
}

/// Writes a changed subscription (one [`lock`]ed in this transaction), with the sealed secrets
/// its change gives. Disabling records why, unless a reason is already there; enabling clears
/// it.
pub async fn save(
    conn: &mut PgConnection,
    sub: &SubscriptionWrite<'_>,
    sealed: &[(String, Vec<u8>)],
) -> Result<(), QueryError> {
    write_request_secrets(conn, sub.id, sub.replaced, sealed).await?;
    sqlx::query(
        "UPDATE subscriptions SET url = $2, event_types = $3, enabled = $4, paused = $5, \
         max_concurrent = $6, rate = $7, description = $8, disabled_reason = CASE WHEN $4 \
         THEN NULL ELSE COALESCE(disabled_reason, 'disabled through the API') END, \
         request = $9, payload_filter = $10, updated_at = now() WHERE id = $1",
    )
    .bind(sub.id)
    .bind(sub.url)
    .bind(&sub.event_types)
    .bind(sub.enabled)
    .bind(sub.paused)
    .bind(sub.max_concurrent())
    .bind(&sub.rate)
    .bind(sub.description)
    .bind(sqlx::types::Json(sub.request))
    .bind(sub.payload_filter.map(sqlx::types::Json))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Of subscription `id`'s unexpired signing secrets, whether each has a public key (a `v1a`
/// key; the rest sign `v1`, a reference imported from a file among them).
pub async fn signing_public_keys(
    conn: &mut PgConnection,
    id: &str,
) -> Result<Vec<bool>, QueryError> {
    Ok(sqlx::query_scalar(
        "SELECT public_key IS NOT NULL FROM subscription_secrets WHERE subscription_id = $1 \
         AND purpose = 'signing' AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?)
}

/// Deletes subscription `id` (and, by cascade, its secrets); false when it is not of `tenant`
/// (any, for `None`).
pub async fn delete(pool: &PgPool, id: &str, tenant: Option<&str>) -> Result<bool, QueryError> {
    let deleted = sqlx::query(
        "DELETE FROM subscriptions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
    )
    .bind(id)
    .bind(tenant)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(deleted > 0)
}

/// A rotation: the secrets that still sign stop at `old_until` (sooner if they were to stop
/// sooner), those already expired are dropped, and the new ones, sealed, sign first.
pub async fn rotate(
    conn: &mut PgConnection,
    id: &str,
    signing: &[NewSigning],
    old_until: SystemTime,
) -> Result<(), QueryError> {
    sqlx::query(
        "DELETE FROM subscription_secrets WHERE subscription_id = $1 AND purpose = 'signing' \
         AND expires_at <= now()",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE subscription_secrets SET expires_at = LEAST(COALESCE(expires_at, \
         to_timestamp($2::float8 / 1000)), to_timestamp($2::float8 / 1000)) \
         WHERE subscription_id = $1 AND purpose = 'signing'",
    )
    .bind(id)
    .bind(epoch_ms(old_until))
    .execute(&mut *conn)
    .await?;
    insert_signing(conn, id, signing).await.map(drop)
}

/// Which subscriptions a page holds.
#[derive(Debug, Clone, Default)]
pub struct PageFilter<'a> {
    /// Any, for `None`.
    pub tenant: Option<&'a str>,
    pub enabled: Option<bool>,
    pub paused: Option<bool>,
    /// Those after this id.
    pub after: Option<&'a str>,
    /// Those whose id or URL holds this text, any case (the console's search). Not indexed:
    /// the scan walks the primary key in order and stops at `limit` matches.
    pub contains: Option<&'a str>,
    /// The most rows.
    pub limit: u32,
}

/// Subscriptions by id, as `filter` says.
pub async fn page(
    conn: &mut PgConnection,
    filter: &PageFilter<'_>,
) -> Result<Vec<SubscriptionRow>, QueryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM subscriptions WHERE ($1::text IS NULL OR tenant = $1) \
         AND ($2::bool IS NULL OR enabled = $2) AND ($3::bool IS NULL OR paused = $3) \
         AND ($4::text IS NULL OR id > $4) \
         AND ($6::text IS NULL OR strpos(lower(id), lower($6)) > 0 \
              OR strpos(lower(url), lower($6)) > 0) \
         ORDER BY id LIMIT $5"
    ))
    .bind(filter.tenant)
    .bind(filter.enabled)
    .bind(filter.paused)
    .bind(filter.after)
    .bind(i64::from(filter.limit))
    .bind(filter.contains)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(SubscriptionRow::of).collect()
}

/// Subscriptions hookrelay paused for an endpoint failing too long (or an operator disabled
/// with a reason), the latest changed first: the console's endpoints in trouble.
pub async fn disabled(pool: &PgPool, limit: u32) -> Result<Vec<SubscriptionRow>, QueryError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM subscriptions WHERE disabled_reason IS NOT NULL \
         ORDER BY updated_at DESC LIMIT $1"
    ))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(SubscriptionRow::of).collect()
}

/// How many subscriptions `tenant` has, with a lock on that count held until the transaction
/// ends (an advisory lock per tenant: creates for one tenant count one at a time).
pub async fn count_of_tenant_locked(
    conn: &mut PgConnection,
    tenant: &str,
) -> Result<i64, QueryError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("hookrelay.subscriptions.{tenant}"))
        .execute(&mut *conn)
        .await?;
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM subscriptions WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(&mut *conn)
            .await?,
    )
}
