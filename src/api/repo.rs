//! The API's SQL over the store's pool. Every read and write of a caller's subscription is
//! limited to its scope in the query itself (`tenant = $n` for a tenant token), so another
//! tenant's subscription is not found rather than forbidden. The triggers of the schema tell
//! the workers of every change when its transaction commits.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use crate::subscriptions::parse::{parse_event_types, parse_url};
use crate::units::Rate;

use super::auth::Scope;
use super::model::{ListQuery, SecretInfo, SignatureScheme, SubscriptionPage, SubscriptionView};
use super::problem::{ApiError, FieldError};
use super::validate::Checked;
use crate::store::request::StoredRequest;

const COLUMNS: &str = "id, tenant, url, event_types, enabled, paused, max_concurrent, rate, \
     description, disabled_reason, request, \
     (extract(epoch from created_at) * 1000)::int8 AS created_ms, \
     (extract(epoch from updated_at) * 1000)::int8 AS updated_ms";

pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 500;
/// How long an `Idempotency-Key` is remembered.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms.max(0).unsigned_abs());
    humantime::format_rfc3339_millis(at).to_string()
}

pub fn epoch_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn column<'r, T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>>(
    row: &'r PgRow,
    name: &str,
) -> Result<T, ApiError> {
    row.try_get(name)
        .map_err(|e| ApiError::internal(format!("column {name}: {e}")))
}

fn request(row: &PgRow) -> Result<StoredRequest, ApiError> {
    let request: sqlx::types::Json<StoredRequest> = column(row, "request")?;
    Ok(request.0)
}

/// A row as the API shows it, with its secrets' dates (newest first).
fn view(row: &PgRow, secrets: Vec<SecretInfo>) -> Result<SubscriptionView, ApiError> {
    let max_concurrent: Option<i32> = column(row, "max_concurrent")?;
    Ok(SubscriptionView {
        request: request(row)?,
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
        secrets,
        created_at: rfc3339(column(row, "created_ms")?),
        updated_at: rfc3339(column(row, "updated_ms")?),
    })
}

/// A stored row read back into checked settings, for a change to apply to. A row that does not
/// validate (written by hand) is an internal error: the API does not build on it.
fn checked(row: &PgRow) -> Result<Checked, ApiError> {
    let id: String = column(row, "id")?;
    let bad =
        |what: String| ApiError::internal(format!("subscription {id:?} in the store: {what}"));
    let url: String = column(row, "url")?;
    let url = parse_url(&url).map_err(|e| bad(format!("url: {e}")))?;
    let event_types: Option<Vec<String>> = column(row, "event_types")?;
    let event_types = event_types
        .map(|t| parse_event_types(&t))
        .transpose()
        .map_err(|e| bad(format!("event_types: {}", e.join("; "))))?;
    let rate: Option<String> = column(row, "rate")?;
    let rate = rate
        .map(|r| r.parse::<Rate>())
        .transpose()
        .map_err(|e| bad(format!("rate: {e}")))?;
    let max_concurrent: Option<i32> = column(row, "max_concurrent")?;
    Ok(Checked {
        tenant: column(row, "tenant")?,
        url,
        event_types,
        enabled: column(row, "enabled")?,
        paused: column(row, "paused")?,
        max_concurrent: max_concurrent.and_then(|n| u32::try_from(n).ok()),
        rate,
        description: column(row, "description")?,
        request: request(row)?,
        new_secrets: Vec::new(),
        replaced: Vec::new(),
        id,
    })
}

/// The secrets' dates of `ids`, by subscription, newest first.
async fn secret_infos(
    conn: &mut PgConnection,
    ids: &[String],
) -> Result<std::collections::HashMap<String, Vec<SecretInfo>>, ApiError> {
    let rows = sqlx::query(
        "SELECT subscription_id, (extract(epoch from created_at) * 1000)::int8 AS created_ms, \
         (extract(epoch from expires_at) * 1000)::int8 AS expires_ms, public_key \
         FROM subscription_secrets WHERE subscription_id = ANY($1) AND purpose = 'signing' \
         ORDER BY subscription_id, position DESC",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    let mut by_id: std::collections::HashMap<String, Vec<SecretInfo>> = Default::default();
    for row in &rows {
        let expires: Option<i64> = column(row, "expires_ms")?;
        by_id
            .entry(column(row, "subscription_id")?)
            .or_default()
            .push(SecretInfo {
                created_at: rfc3339(column(row, "created_ms")?),
                expires_at: expires.map(rfc3339),
                public_key: column(row, "public_key")?,
            });
    }
    Ok(by_id)
}

/// Subscription `id` as the API shows it, if `scope` sees it.
pub async fn get(
    conn: &mut PgConnection,
    id: &str,
    scope: &Scope,
) -> Result<Option<SubscriptionView>, ApiError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM subscriptions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"
    ))
    .bind(id)
    .bind(scope.tenant())
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let mut secrets = secret_infos(conn, &[id.to_owned()]).await?;
    view(&row, secrets.remove(id).unwrap_or_default()).map(Some)
}

/// Subscription `id`'s settings, if `scope` sees it.
pub async fn find(
    conn: &mut PgConnection,
    id: &str,
    scope: &Scope,
) -> Result<Option<Checked>, ApiError> {
    select_checked(conn, id, scope, "").await
}

/// The version of a subscription's row: it changes with every write of the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowVersion(String);

/// Subscription `id`'s settings and the version of its row, if `scope` sees it.
pub async fn find_versioned(
    conn: &mut PgConnection,
    id: &str,
    scope: &Scope,
) -> Result<Option<(Checked, RowVersion)>, ApiError> {
    // xmin: the transaction that wrote this version of the row.
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS}, xmin::text AS version FROM subscriptions \
         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"
    ))
    .bind(id)
    .bind(scope.tenant())
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| Ok((checked(&row)?, RowVersion(column(&row, "version")?))))
        .transpose()
}

/// Locks subscription `id`'s row until the transaction ends; its version, if `scope` sees it.
pub async fn lock_version(
    conn: &mut PgConnection,
    id: &str,
    scope: &Scope,
) -> Result<Option<RowVersion>, ApiError> {
    let version: Option<String> = sqlx::query_scalar(
        "SELECT xmin::text FROM subscriptions WHERE id = $1 \
         AND ($2::text IS NULL OR tenant = $2) FOR UPDATE",
    )
    .bind(id)
    .bind(scope.tenant())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(version.map(RowVersion))
}

/// Subscription `id`'s settings, locked until the transaction ends, if `scope` sees it.
pub async fn lock(
    conn: &mut PgConnection,
    id: &str,
    scope: &Scope,
) -> Result<Option<Checked>, ApiError> {
    select_checked(conn, id, scope, "FOR UPDATE").await
}

async fn select_checked(
    conn: &mut PgConnection,
    id: &str,
    scope: &Scope,
    locking: &str,
) -> Result<Option<Checked>, ApiError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM subscriptions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) \
         {locking}"
    ))
    .bind(id)
    .bind(scope.tenant())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(checked).transpose()
}

/// A new signing secret, sealed, and its public key for a `v1a` key.
pub struct NewSigning {
    pub sealed: Vec<u8>,
    pub public_key: Option<String>,
}

/// Stores `signing`; the positions of their rows, in order.
async fn insert_signing(
    conn: &mut PgConnection,
    id: &str,
    signing: &[NewSigning],
) -> Result<Vec<i64>, ApiError> {
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
) -> Result<Option<(Vec<u8>, String)>, ApiError> {
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
) -> Result<(), ApiError> {
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

fn request_json(sub: &Checked) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(&sub.request).map_err(ApiError::internal)
}

/// Inserts a new subscription with its signing secrets and the secrets of its headers and
/// authentication, sealed; the positions of the signing secrets' rows, `None` when the id is
/// taken.
pub async fn insert(
    conn: &mut PgConnection,
    sub: &Checked,
    signing: &[NewSigning],
    sealed: &[(String, Vec<u8>)],
) -> Result<Option<Vec<i64>>, ApiError> {
    let inserted = sqlx::query(
        "INSERT INTO subscriptions (id, tenant, url, event_types, enabled, paused, \
         max_concurrent, rate, description, request) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&sub.id)
    .bind(&sub.tenant)
    .bind(sub.url.as_str())
    .bind(sub.event_types_text())
    .bind(sub.enabled)
    .bind(sub.paused)
    .bind(sub.max_concurrent.and_then(|n| i32::try_from(n).ok()))
    .bind(sub.rate.map(|r| r.to_string()))
    .bind(&sub.description)
    .bind(request_json(sub)?)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(None);
    }
    let positions = insert_signing(conn, &sub.id, signing).await?;
    write_request_secrets(conn, &sub.id, &[], sealed).await?;
    Ok(Some(positions))
}

/// Writes a changed subscription (one [`lock`]ed in this transaction), with the sealed secrets
/// its change gives. Disabling records why, unless a reason is already there; enabling clears
/// it.
pub async fn save(
    conn: &mut PgConnection,
    sub: &Checked,
    sealed: &[(String, Vec<u8>)],
) -> Result<(), ApiError> {
    write_request_secrets(conn, &sub.id, &sub.replaced, sealed).await?;
    sqlx::query(
        "UPDATE subscriptions SET url = $2, event_types = $3, enabled = $4, paused = $5, \
         max_concurrent = $6, rate = $7, description = $8, disabled_reason = CASE WHEN $4 \
         THEN NULL ELSE COALESCE(disabled_reason, 'disabled through the API') END, \
         request = $9, updated_at = now() WHERE id = $1",
    )
    .bind(&sub.id)
    .bind(sub.url.as_str())
    .bind(sub.event_types_text())
    .bind(sub.enabled)
    .bind(sub.paused)
    .bind(sub.max_concurrent.and_then(|n| i32::try_from(n).ok()))
    .bind(sub.rate.map(|r| r.to_string()))
    .bind(&sub.description)
    .bind(request_json(sub)?)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The schemes subscription `id`'s unexpired signing secrets sign with: `v1a` for a key with a
/// public key, `v1` for the rest (a reference imported from a file counts as `v1`).
pub async fn signing_schemes(
    conn: &mut PgConnection,
    id: &str,
) -> Result<Vec<SignatureScheme>, ApiError> {
    let keys: Vec<bool> = sqlx::query_scalar(
        "SELECT public_key IS NOT NULL FROM subscription_secrets WHERE subscription_id = $1 \
         AND purpose = 'signing' AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let mut schemes: Vec<SignatureScheme> = keys
        .into_iter()
        .map(|v1a| {
            if v1a {
                SignatureScheme::V1a
            } else {
                SignatureScheme::V1
            }
        })
        .collect();
    schemes.sort();
    schemes.dedup();
    if schemes.is_empty() {
        schemes.push(SignatureScheme::V1);
    }
    Ok(schemes)
}

/// Deletes subscription `id` (and, by cascade, its secrets); false when `scope` does not see it.
pub async fn delete(pool: &PgPool, id: &str, scope: &Scope) -> Result<bool, ApiError> {
    let deleted = sqlx::query(
        "DELETE FROM subscriptions WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
    )
    .bind(id)
    .bind(scope.tenant())
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
) -> Result<(), ApiError> {
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

/// The cursor of a page that ends at `id`: opaque to callers.
fn cursor_after(id: &str) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn id_of_cursor(cursor: &str) -> Result<String, ApiError> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|id| crate::contract::envelope::check_id(id).is_ok())
        .ok_or_else(|| {
            ApiError::Invalid(vec![FieldError::new(
                "cursor",
                "not a cursor this API gave; pass next_cursor as it came",
            )])
        })
}

/// A page of the subscriptions `scope` sees, ordered by id.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    query: &ListQuery,
) -> Result<SubscriptionPage, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::field(
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    let after = query
        .cursor
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(id_of_cursor)
        .transpose()?;
    if let Some(tenant) = &query.tenant {
        crate::contract::envelope::check_tenant(tenant)
            .map_err(|e| ApiError::field("tenant", e.to_string()))?;
    }
    let tenant = match (scope.tenant(), query.tenant.as_deref()) {
        (Some(own), Some(asked)) if own != asked => {
            return Ok(SubscriptionPage {
                data: Vec::new(),
                next_cursor: None,
            });
        }
        (Some(own), _) => Some(own),
        (None, asked) => asked,
    };
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM subscriptions WHERE ($1::text IS NULL OR tenant = $1) \
         AND ($2::bool IS NULL OR enabled = $2) AND ($3::bool IS NULL OR paused = $3) \
         AND ($4::text IS NULL OR id > $4) ORDER BY id LIMIT $5"
    ))
    .bind(tenant)
    .bind(query.enabled)
    .bind(query.paused)
    .bind(after)
    .bind(i64::from(limit) + 1)
    .fetch_all(&mut *conn)
    .await?;
    let more = rows.len() > limit as usize;
    let rows = &rows[..rows.len().min(limit as usize)];
    let ids = rows
        .iter()
        .map(|r| column::<String>(r, "id"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut secrets = secret_infos(conn, &ids).await?;
    let data = rows
        .iter()
        .zip(&ids)
        .map(|(row, id)| view(row, secrets.remove(id).unwrap_or_default()))
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = more
        .then(|| ids.last().map(|id| cursor_after(id)))
        .flatten();
    Ok(SubscriptionPage { data, next_cursor })
}

/// A remembered answer to a create.
pub struct Remembered {
    pub request_hash: Vec<u8>,
    pub status: u16,
    pub body: serde_json::Value,
}

/// Takes the lock of (`scope`, `key`) until the transaction ends, so two requests with one key
/// are answered one after the other; then the answer remembered for it, if any and recent.
pub async fn idempotency_lookup(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
) -> Result<Option<Remembered>, ApiError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("{scope}\n{key}"))
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 \
         AND created_at < now() - make_interval(secs => $3)",
    )
    .bind(scope)
    .bind(key)
    .bind(IDEMPOTENCY_TTL.as_secs_f64())
    .execute(&mut *conn)
    .await?;
    let row = sqlx::query(
        "SELECT request_hash, status, body FROM idempotency_keys WHERE scope = $1 AND key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| {
        let status: i32 = column(&row, "status")?;
        Ok(Remembered {
            request_hash: column(&row, "request_hash")?,
            status: u16::try_from(status).unwrap_or(500),
            body: column(&row, "body")?,
        })
    })
    .transpose()
}

/// Remembers the answer to a create under (`scope`, `key`).
pub async fn idempotency_remember(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    answer: &Remembered,
) -> Result<(), ApiError> {
    sqlx::query(
        "INSERT INTO idempotency_keys (scope, key, request_hash, status, body) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(scope)
    .bind(key)
    .bind(&answer.request_hash)
    .bind(i32::from(answer.status))
    .bind(&answer.body)
    .execute(&mut *conn)
    .await?;
    // Keys of other requests that are past their time go too, a few at a time.
    sqlx::query(
        "DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid FROM idempotency_keys \
         WHERE created_at < now() - make_interval(secs => $1) LIMIT 100)",
    )
    .bind(IDEMPOTENCY_TTL.as_secs_f64())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// How many subscriptions `tenant` has, with a lock on that count held until the transaction
/// ends (an advisory lock per tenant: creates for one tenant count one at a time).
pub async fn tenant_subscriptions_locked(
    conn: &mut PgConnection,
    tenant: &str,
) -> Result<i64, ApiError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_opaque_and_round_trips() {
        let c = cursor_after("sub_42");
        assert!(!c.contains("sub_42"));
        assert_eq!(id_of_cursor(&c).unwrap(), "sub_42");
        assert!(id_of_cursor("!!").is_err());
    }
}
