//! Where subscriptions are kept: a TOML file (the default, reloaded as it changes; see
//! [`crate::subscriptions::live`]) or PostgreSQL, which the API writes and every
//! worker follows. The setting is the same for both: `subscriptions` (`HOOKRELAY_SUBSCRIPTIONS`)
//! is a path, or a `postgres://` URL.
//!
//! - [`postgres`]: the database store: migrations, loading, the importer's writes, pausing,
//!   resealing.
//! - [`subscriptions`]: the API's reads and writes of subscriptions and their secrets, scoped
//!   to a tenant, with row versions and locks.
//! - [`idempotency`]: the answers remembered for `Idempotency-Key`s.
//! - [`follow`]: how a worker keeps its in-memory snapshot (or what it holds of a large store)
//!   current from PostgreSQL, and keeps delivering on the last one while the database is away.
//! - [`held`]: the reads of a worker that holds only the subscriptions it delivers for.
//! - [`request`]: a subscription's headers and endpoint authentication as the store keeps them.
//! - [`transfer`]: import a file into the store, export the store as a file.
//! - [`portal`]: one-time portal links and the pages' sessions.
//! - [`catalog`]: the catalog of event types: the API's reads and writes, and its revision.

pub mod catalog;
pub mod follow;
pub mod held;
pub mod idempotency;
pub mod portal;
pub mod postgres;
pub mod request;
pub mod subscriptions;
pub mod transfer;

pub use postgres::{PgStore, StoreError};

use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::config::{Env, StoreConfig};
use crate::subscriptions::SecretRef;
use crate::subscriptions::seal::Keyring;

/// Why the store's keys could not be read. Each is a setting to correct (`store.keys`, or
/// what a reference of it names): nothing is sealed or opened without the keys, so the
/// command stops. The message names the reference at fault, never a key; it is whole (no
/// variant has a source), so an error chain does not say a cause twice.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("store.keys: {raw}: {message}")]
    BadReference {
        raw: String,
        message: crate::config::ReferenceError,
    },
    #[error("store.keys: {reference}: environment variable is not set")]
    Unset { reference: String },
    #[error("store.keys: {reference}: cannot read file: {error}")]
    Unreadable {
        reference: String,
        error: std::io::Error,
    },
    #[error("store.keys: {reference}: not a reference")]
    NotAReference { reference: String },
    #[error("store.keys: {reference}: {error}")]
    BadKey {
        reference: String,
        error: crate::subscriptions::seal::SealError,
    },
    #[error("store.keys: {0}")]
    Ring(crate::subscriptions::seal::SealError),
}

/// The store's keys, read from their references (`store.keys`).
pub fn keyring(config: &StoreConfig, env: &dyn Env) -> Result<Keyring, KeyringError> {
    let mut keys = Vec::with_capacity(config.keys.len());
    for raw in &config.keys {
        let reference = SecretRef::parse(raw).map_err(|message| KeyringError::BadReference {
            raw: raw.clone(),
            message,
        })?;
        let shown = || reference.to_string();
        let text = match &reference {
            SecretRef::Env(name) => env
                .var(name)
                .ok_or_else(|| KeyringError::Unset { reference: shown() })?,
            SecretRef::File(path) => {
                std::fs::read_to_string(path).map_err(|error| KeyringError::Unreadable {
                    reference: shown(),
                    error,
                })?
            }
            SecretRef::Sealed(_) => {
                return Err(KeyringError::NotAReference { reference: shown() });
            }
        };
        Keyring::from_base64(&[text.trim()]).map_err(|error| KeyringError::BadKey {
            reference: shown(),
            error,
        })?;
        keys.push(text.trim().to_owned());
    }
    Keyring::from_base64(&keys).map_err(KeyringError::Ring)
}

/// Why a query of [`subscriptions`] or [`idempotency`] failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A row that does not read as the schema says (changed by hand, say).
    #[error("column {name}: {error}")]
    Column {
        name: &'static str,
        error: sqlx::Error,
    },
}

impl QueryError {
    /// True when PostgreSQL did not answer (the pool timed out or closed, the connection
    /// broke): try again later. Anything else is a fault to report, not to retry.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            QueryError::Database(
                sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed
            )
        )
    }
}

/// Column `name` of `row`.
fn column<'r, T>(row: &'r PgRow, name: &'static str) -> Result<T, QueryError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|error| QueryError::Column { name, error })
}
