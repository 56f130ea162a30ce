//! The pages' sign-ins: one-time portal links and the sessions they open (and the operator
//! console's). Tokens are random, handed out once, and kept only as SHA-256 hashes.

use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use sqlx::PgPool;

use super::QueryError;

/// A fresh random token (244 bits from the system's generator), in hex.
pub fn new_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Who a session or link is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `None`: an operator (the console).
    pub tenant: Option<String>,
    pub read_only: bool,
}

/// A session that is neither expired nor revoked.
#[derive(Debug, Clone)]
pub struct Session {
    pub holder: Holder,
    pub csrf: String,
    pub expires_at: SystemTime,
}

/// Keeps a link for `tenant` that opens one session until `ttl` from now; its token.
pub async fn create_link(
    pool: &PgPool,
    tenant: &str,
    read_only: bool,
    ttl: Duration,
) -> Result<(String, SystemTime), QueryError> {
    let token = new_token();
    let expires_at = SystemTime::now() + ttl;
    sqlx::query(
        "INSERT INTO portal_links (token_hash, tenant, read_only, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(hash(&token))
    .bind(tenant)
    .bind(read_only)
    .bind(ttl.as_secs_f64())
    .execute(pool)
    .await?;
    Ok((token, expires_at))
}

/// Uses a link: who it is for, once; `None` when unknown, used already or expired.
pub async fn redeem_link(pool: &PgPool, token: &str) -> Result<Option<Holder>, QueryError> {
    let row = sqlx::query(
        "UPDATE portal_links SET used_at = now() \
         WHERE token_hash = $1 AND used_at IS NULL AND expires_at > now() \
         RETURNING tenant, read_only",
    )
    .bind(hash(token))
    .fetch_optional(pool)
    .await?;
    row.map(|row| {
        Ok(Holder {
            tenant: Some(super::column(&row, "tenant")?),
            read_only: super::column(&row, "read_only")?,
        })
    })
    .transpose()
}

/// Opens a session for `holder` lasting `ttl`: its token and CSRF token.
pub async fn create_session(
    pool: &PgPool,
    holder: &Holder,
    ttl: Duration,
) -> Result<(String, Session), QueryError> {
    let token = new_token();
    let csrf = new_token();
    sqlx::query(
        "INSERT INTO web_sessions (token_hash, tenant, read_only, csrf, expires_at) \
         VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
    )
    .bind(hash(&token))
    .bind(&holder.tenant)
    .bind(holder.read_only)
    .bind(&csrf)
    .bind(ttl.as_secs_f64())
    .execute(pool)
    .await?;
    // Removing what ended long ago keeps the table to the sessions that matter.
    sqlx::query("DELETE FROM web_sessions WHERE expires_at < now() - interval '1 day'")
        .execute(pool)
        .await?;
    sqlx::query("DELETE FROM portal_links WHERE expires_at < now() - interval '1 day'")
        .execute(pool)
        .await?;
    Ok((
        token,
        Session {
            holder: holder.clone(),
            csrf,
            expires_at: SystemTime::now() + ttl,
        },
    ))
}

/// The live session of `token`, if any.
pub async fn find_session(pool: &PgPool, token: &str) -> Result<Option<Session>, QueryError> {
    let row = sqlx::query(
        "SELECT tenant, read_only, csrf, \
                EXTRACT(EPOCH FROM expires_at - now())::float8 AS left_s \
         FROM web_sessions \
         WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > now()",
    )
    .bind(hash(token))
    .fetch_optional(pool)
    .await?;
    row.map(|row| {
        let left: f64 = super::column(&row, "left_s")?;
        Ok(Session {
            holder: Holder {
                tenant: super::column(&row, "tenant")?,
                read_only: super::column(&row, "read_only")?,
            },
            csrf: super::column(&row, "csrf")?,
            expires_at: SystemTime::now() + Duration::from_secs_f64(left.max(0.0)),
        })
    })
    .transpose()
}

/// Ends the session of `token` (signing out).
pub async fn revoke_session(pool: &PgPool, token: &str) -> Result<(), QueryError> {
    sqlx::query("UPDATE web_sessions SET revoked_at = now() WHERE token_hash = $1")
        .bind(hash(token))
        .execute(pool)
        .await?;
    Ok(())
}

/// Ends every session of `tenant` and voids its unused links; how many of each.
pub async fn revoke_tenant(pool: &PgPool, tenant: &str) -> Result<(u64, u64), QueryError> {
    let sessions = sqlx::query(
        "UPDATE web_sessions SET revoked_at = now() \
         WHERE tenant = $1 AND revoked_at IS NULL AND expires_at > now()",
    )
    .bind(tenant)
    .execute(pool)
    .await?
    .rows_affected();
    let links = sqlx::query(
        "UPDATE portal_links SET used_at = now() \
         WHERE tenant = $1 AND used_at IS NULL AND expires_at > now()",
    )
    .bind(tenant)
    .execute(pool)
    .await?
    .rows_affected();
    Ok((sessions, links))
}
