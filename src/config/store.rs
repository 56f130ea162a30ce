//! The PostgreSQL subscription store's settings (`[store]`): its keys, how workers follow it,
//! and the bounds of what a worker holds of it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The PostgreSQL subscription store (used when `subscriptions` is a `postgres://` URL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// References (`env:NAME`, `file:PATH`) to the keys that seal stored secrets, newest first:
    /// the first seals, all open. Each key is 32 bytes in base64 (`hookrelay store
    /// generate-key`). Needed by the API, and by workers once the store holds sealed secrets.
    pub keys: Vec<String>,
    /// How often a worker reads the whole store again, besides the changes it is notified of.
    #[serde(with = "humantime_serde")]
    pub resync: Duration,
    /// The longest a connection to the store may take to open.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Subscriptions a worker holds at most, of those it delivers for (by id, and each
    /// fan-out tenant's whole list); the rest stay in the store until needed. 0: hold every
    /// subscription, read whole at start (the store's size bounds the worker's memory).
    pub cache_entries: usize,
    /// The estimated bytes of the subscriptions held, at most.
    pub cache_bytes: usize,
    /// Subscriptions of one tenant held at most, so one tenant cannot evict the others'; a
    /// tenant with more enabled subscriptions is not fanned out to (dead-lettered `invalid`).
    pub cache_per_tenant: usize,
    /// The longest a delivery waits for a subscription not held to be read; then it is
    /// deferred into a tier with the reason, an event to fan out as well.
    #[serde(with = "humantime_serde")]
    pub cache_load_timeout: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            resync: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            cache_entries: 50_000,
            cache_bytes: 64 * 1024 * 1024,
            cache_per_tenant: 10_000,
            cache_load_timeout: Duration::from_millis(500),
        }
    }
}
