//! The answers remembered for `Idempotency-Key`s: a create repeated with its key (within
//! [`TTL`]) gets its first answer again, read back here under the key's lock.

use std::time::Duration;

use sqlx::{PgConnection, Postgres, Transaction};

use super::postgres::{ResealError, StoreError};
use super::request;
use super::{QueryError, column};
use crate::subscriptions::seal::{Binding, Keyring};

/// How long an `Idempotency-Key` is remembered.
pub const TTL: Duration = Duration::from_secs(24 * 3600);

/// The field of a remembered create answer (`idempotency_keys.body`) that refers to its signing
/// secret's row (`subscription_secrets.position`), whose secret a repeated request is shown
/// again; `null` once that row is gone. The answer never holds the secret itself.
pub const REMEMBERED_SECRET_ROW: &str = "secret_position";
/// Where earlier versions kept the secret in a remembered answer, sealed for its subscription
/// id alone; still read, and turned into [`REMEMBERED_SECRET_ROW`] by
/// [`reseal`](super::postgres::reseal).
pub const REMEMBERED_SEALED_SECRET: &str = "sealed_secret";

/// A remembered answer to a create.
#[derive(Debug, Clone)]
pub struct Remembered {
    pub request_hash: Vec<u8>,
    pub status: u16,
    pub body: serde_json::Value,
}

/// Takes the lock of (`scope`, `key`) until the transaction ends, so two requests with one key
/// are answered one after the other; then the answer remembered for it, if any and recent.
pub async fn lookup(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
) -> Result<Option<Remembered>, QueryError> {
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
    .bind(TTL.as_secs_f64())
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
pub async fn remember(
    conn: &mut PgConnection,
    scope: &str,
    key: &str,
    answer: &Remembered,
) -> Result<(), QueryError> {
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
    .bind(TTL.as_secs_f64())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Turns each remembered create answer holding its secret sealed into one referring to the
/// signing row that holds the same secret (`null` when none does any more: rotated away, or
/// the subscription deleted); how many.
pub(super) async fn refer_remembered_secrets(
    tx: &mut Transaction<'_, Postgres>,
    ring: &Keyring,
) -> Result<usize, ResealError> {
    use base64::Engine;
    use subtle::ConstantTimeEq;
    let answers: Vec<(String, String, serde_json::Value)> = sqlx::query_as(&format!(
        "SELECT scope, key, body FROM idempotency_keys \
         WHERE body -> '{REMEMBERED_SEALED_SECRET}' IS NOT NULL FOR UPDATE"
    ))
    .fetch_all(&mut **tx)
    .await
    .map_err(StoreError::from)?;
    let count = answers.len();
    for (scope, key, mut body) in answers {
        let subscription = &body["subscription"];
        let (Some(id), Some(tenant)) = (
            subscription["id"].as_str().map(str::to_owned),
            subscription["tenant"].as_str().map(str::to_owned),
        ) else {
            return Err(ResealError::Answer {
                scope,
                key,
                message: "it names no subscription id and tenant".into(),
            });
        };
        let sealed = body[REMEMBERED_SEALED_SECRET]
            .as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .ok_or_else(|| ResealError::Answer {
                scope: scope.clone(),
                key: key.clone(),
                message: "its sealed secret is not base64".into(),
            })?;
        let secret = ring
            .open(&Binding::new(&tenant, &id, request::SIGNING), &sealed)
            .map_err(|e| ResealError::open(&id, e))?;
        let rows: Vec<(i64, String, Vec<u8>)> = sqlx::query_as(
            "SELECT x.position, s.tenant, x.sealed \
             FROM subscription_secrets x JOIN subscriptions s ON s.id = x.subscription_id \
             WHERE x.subscription_id = $1 AND x.purpose = 'signing' AND x.sealed IS NOT NULL",
        )
        .bind(&id)
        .fetch_all(&mut **tx)
        .await
        .map_err(StoreError::from)?;
        let mut position = None;
        for (at, row_tenant, row_sealed) in rows {
            let opened = ring
                .open(
                    &Binding::new(&row_tenant, &id, request::SIGNING),
                    &row_sealed,
                )
                .map_err(|e| ResealError::open(&id, e))?;
            if row_tenant == tenant && bool::from(opened.ct_eq(&secret)) {
                position = Some(at);
            }
        }
        if let Some(object) = body.as_object_mut() {
            object.remove(REMEMBERED_SEALED_SECRET);
            object.insert(REMEMBERED_SECRET_ROW.into(), position.into());
        }
        sqlx::query("UPDATE idempotency_keys SET body = $3 WHERE scope = $1 AND key = $2")
            .bind(&scope)
            .bind(&key)
            .bind(&body)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::from)?;
    }
    Ok(count)
}
