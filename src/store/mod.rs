//! Where subscriptions are kept: a TOML file (the default, reloaded as it changes; see
//! [`crate::subscriptions::live`]) or PostgreSQL, which the API writes and every
//! worker follows. The setting is the same for both: `subscriptions` (`HOOKRELAY_SUBSCRIPTIONS`)
//! is a path, or a `postgres://` URL.
//!
//! - [`postgres`]: the database store: migrations, loading, writing.
//! - [`follow`]: how a worker keeps its in-memory snapshot current from PostgreSQL, and keeps
//!   delivering on the last one while the database is away.
//! - [`request`]: a subscription's headers and endpoint authentication as the store keeps them.
//! - [`transfer`]: import a file into the store, export the store as a file.

pub mod follow;
pub mod postgres;
pub mod request;
pub mod transfer;

pub use postgres::{PgStore, StoreError};

use crate::config::{Env, StoreConfig};
use crate::subscriptions::SecretRef;
use crate::subscriptions::seal::Keyring;

/// The store's keys, read from their references (`store.keys`). The message names the
/// reference at fault, never a key.
pub fn keyring(config: &StoreConfig, env: &dyn Env) -> Result<Keyring, String> {
    let mut keys = Vec::with_capacity(config.keys.len());
    for raw in &config.keys {
        let reference = SecretRef::parse(raw).map_err(|e| format!("store.keys: {raw}: {e}"))?;
        let text = match &reference {
            SecretRef::Env(name) => env.var(name).ok_or_else(|| {
                format!("store.keys: {reference}: environment variable is not set")
            })?,
            SecretRef::File(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("store.keys: {reference}: cannot read file: {e}"))?,
            SecretRef::Sealed(_) => {
                return Err(format!("store.keys: {reference}: not a reference"));
            }
        };
        Keyring::from_base64(&[text.trim()])
            .map_err(|e| format!("store.keys: {reference}: {e}"))?;
        keys.push(text.trim().to_owned());
    }
    Keyring::from_base64(&keys).map_err(|e| format!("store.keys: {e}"))
}
