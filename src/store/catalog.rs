//! The catalog of event types in PostgreSQL: the API's reads and writes, the worker's read of
//! it whole, and the revision that tells a worker it changed. Every tenant reads the same
//! catalog; only an admin writes it (the API checks).
//!
//! A write that changes the schema or the example adds a version; one that changes only the
//! description, mode or deprecated flag keeps the versions as they are.

use std::collections::HashMap;

use sqlx::PgPool;
use sqlx::postgres::PgRow;

use super::{QueryError, column};
use crate::catalog::{EventType, SchemaVersion, ValidationMode};

/// A type as stored, with when it was written.
#[derive(Debug, Clone)]
pub struct EventTypeRow {
    pub event_type: EventType,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// What an admin writes.
#[derive(Debug, Clone)]
pub struct EventTypeWrite<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub mode: ValidationMode,
    pub deprecated: bool,
    pub schema: &'a serde_json::Value,
    pub example: &'a serde_json::Value,
}

/// Why a stored row could not be read back as a type.
fn bad(name: &'static str, e: impl std::fmt::Display) -> QueryError {
    QueryError::Column {
        name,
        error: sqlx::Error::Decode(e.to_string().into()),
    }
}

fn type_of(row: &PgRow) -> Result<EventTypeRow, QueryError> {
    let mode: String = column(row, "mode")?;
    Ok(EventTypeRow {
        event_type: EventType {
            name: column(row, "name")?,
            description: column(row, "description")?,
            mode: mode.parse().map_err(|e| bad("mode", e))?,
            deprecated: column(row, "deprecated")?,
            versions: Vec::new(),
        },
        created_ms: column(row, "created_ms")?,
        updated_ms: column(row, "updated_ms")?,
    })
}

fn version_of(row: &PgRow) -> Result<(String, SchemaVersion), QueryError> {
    let version: i32 = column(row, "version")?;
    let schema: String = column(row, "schema")?;
    let example: String = column(row, "example")?;
    Ok((
        column(row, "name")?,
        SchemaVersion {
            version: u32::try_from(version).map_err(|e| bad("version", e))?,
            schema: serde_json::from_str(&schema).map_err(|e| bad("schema", e))?,
            example: serde_json::from_str(&example).map_err(|e| bad("example", e))?,
        },
    ))
}

const TYPE_COLUMNS: &str = "name, description, mode, deprecated, \
     (extract(epoch from created_at) * 1000)::int8 AS created_ms, \
     (extract(epoch from updated_at) * 1000)::int8 AS updated_ms";

/// Every type (or the one named), by name, with its versions oldest first.
async fn read(pool: &PgPool, only: Option<&str>) -> Result<Vec<EventTypeRow>, QueryError> {
    let types = sqlx::query(&format!(
        "SELECT {TYPE_COLUMNS} FROM event_types WHERE $1::text IS NULL OR name = $1 ORDER BY name"
    ))
    .bind(only)
    .fetch_all(pool)
    .await?;
    let versions = sqlx::query(
        "SELECT name, version, schema, example FROM event_type_versions \
         WHERE $1::text IS NULL OR name = $1 ORDER BY name, version",
    )
    .bind(only)
    .fetch_all(pool)
    .await?;
    let mut by_name: HashMap<String, Vec<SchemaVersion>> = HashMap::new();
    for row in &versions {
        let (name, version) = version_of(row)?;
        by_name.entry(name).or_default().push(version);
    }
    types
        .iter()
        .map(|row| {
            let mut t = type_of(row)?;
            t.event_type.versions = by_name.remove(&t.event_type.name).unwrap_or_default();
            Ok(t)
        })
        .collect()
}

/// The whole catalog.
pub async fn list(pool: &PgPool) -> Result<Vec<EventTypeRow>, QueryError> {
    read(pool, None).await
}

/// One type, if it exists.
pub async fn get(pool: &PgPool, name: &str) -> Result<Option<EventTypeRow>, QueryError> {
    Ok(read(pool, Some(name)).await?.into_iter().next())
}

/// Creates or changes a type; a new schema or example becomes its next version. Returns the
/// type as stored and whether it was created.
pub async fn put(
    pool: &PgPool,
    write: &EventTypeWrite<'_>,
) -> Result<(EventTypeRow, bool), QueryError> {
    let mut tx = pool.begin().await?;
    let created: bool = sqlx::query_scalar(
        "INSERT INTO event_types (name, description, mode, deprecated) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (name) DO UPDATE SET description = $2, mode = $3, deprecated = $4, \
           revision = nextval('event_types_revision'), updated_at = now() \
         RETURNING (xmax = 0)",
    )
    .bind(write.name)
    .bind(write.description)
    .bind(write.mode.as_str())
    .bind(write.deprecated)
    .fetch_one(&mut *tx)
    .await?;
    let newest = sqlx::query(
        "SELECT name, version, schema, example FROM event_type_versions WHERE name = $1 \
         ORDER BY version DESC LIMIT 1 FOR UPDATE",
    )
    .bind(write.name)
    .fetch_optional(&mut *tx)
    .await?;
    let newest = newest.as_ref().map(version_of).transpose()?;
    let same = newest
        .as_ref()
        .is_some_and(|(_, v)| &v.schema == write.schema && &v.example == write.example);
    if !same {
        let next = newest.map_or(1, |(_, v)| i64::from(v.version) + 1);
        sqlx::query(
            "INSERT INTO event_type_versions (name, version, schema, example) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(write.name)
        .bind(i32::try_from(next).unwrap_or(i32::MAX))
        .bind(write.schema.to_string())
        .bind(write.example.to_string())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    let row = get(pool, write.name)
        .await?
        .ok_or_else(|| bad("name", "the type written is gone (deleted meanwhile)"))?;
    Ok((row, created))
}

/// How many versions a type keeps now (0: no such type).
pub async fn versions(pool: &PgPool, name: &str) -> Result<usize, QueryError> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM event_type_versions WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Deletes a type and its versions; false when there was none.
pub async fn remove(pool: &PgPool, name: &str) -> Result<bool, QueryError> {
    let done = sqlx::query("DELETE FROM event_types WHERE name = $1")
        .bind(name)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Changes whenever the catalog does: the newest revision written and how many types there
/// are (a delete lowers the count; every other write raises the revision).
pub async fn revision(pool: &PgPool) -> Result<(i64, i64), QueryError> {
    let row = sqlx::query(
        "SELECT coalesce(max(revision), 0)::int8 AS revision, count(*)::int8 AS types \
         FROM event_types",
    )
    .fetch_one(pool)
    .await?;
    Ok((column(&row, "revision")?, column(&row, "types")?))
}
