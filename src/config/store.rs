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
    /// Connections to the store a worker opens, at most, for those reads alone: a pool of
    /// their own, so they never wait behind the change follower (whose listener keeps one of
    /// the other pool's 8), a full read or the endpoints' health writes, nor hold those up.
    pub lookup_connections: u32,
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
            lookup_connections: 16,
        }
    }
}

/// A delivery waiting for a read holds its lane's slot: past this, the wait belongs in a tier.
pub const MAX_CACHE_LOAD_TIMEOUT: Duration = Duration::from_secs(5);
/// More lookup connections than this per worker would take a fleet past a server's
/// connection limit (PostgreSQL's default is 100) long before it speeds reads up.
pub const MAX_LOOKUP_CONNECTIONS: u32 = 256;
/// The least byte bound that holds a few subscriptions.
pub const MIN_CACHE_BYTES: usize = 64 * 1024;

impl StoreConfig {
    /// The rules of the cache's settings; `store.cache_entries = 0` (hold everything) leaves
    /// the others unused, and unchecked.
    pub fn validate_cache(&self) -> Result<(), super::ConfigError> {
        use super::ConfigError;
        if self.cache_entries == 0 {
            return Ok(());
        }
        if self.cache_per_tenant == 0 || self.cache_per_tenant > self.cache_entries {
            return Err(ConfigError::invalid(
                "store.cache_per_tenant",
                format!(
                    "must be at least 1 and at most store.cache_entries ({}); found {}",
                    self.cache_entries, self.cache_per_tenant
                ),
            ));
        }
        if self.cache_bytes < MIN_CACHE_BYTES {
            return Err(ConfigError::invalid(
                "store.cache_bytes",
                format!(
                    "must be at least {MIN_CACHE_BYTES} (64 KiB); found {}",
                    self.cache_bytes
                ),
            ));
        }
        if self.cache_load_timeout.is_zero() || self.cache_load_timeout > MAX_CACHE_LOAD_TIMEOUT {
            return Err(ConfigError::invalid(
                "store.cache_load_timeout",
                format!(
                    "must be longer than zero and at most {}: a delivery waiting for a read \
                     holds its lane's slot, and one the store does not answer in time waits in a \
                     tier instead; found {}",
                    crate::units::fmt_duration(MAX_CACHE_LOAD_TIMEOUT),
                    crate::units::fmt_duration(self.cache_load_timeout)
                ),
            ));
        }
        if !(1..=MAX_LOOKUP_CONNECTIONS).contains(&self.lookup_connections) {
            return Err(ConfigError::invalid(
                "store.lookup_connections",
                format!(
                    "must be at least 1 and at most {MAX_LOOKUP_CONNECTIONS} (per worker); found {}",
                    self.lookup_connections
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached() -> StoreConfig {
        StoreConfig::default()
    }

    fn refused(config: &StoreConfig) -> (&'static str, String) {
        match config.validate_cache() {
            Err(super::super::ConfigError::Invalid { field, message }) => (field, message),
            other => panic!("{config:?}: {other:?}"),
        }
    }

    #[test]
    fn the_defaults_and_holding_everything_are_valid() {
        assert!(cached().validate_cache().is_ok());
        // Holding everything: the cache's settings are not used, whatever they say.
        let everything = StoreConfig {
            cache_entries: 0,
            cache_per_tenant: 0,
            cache_bytes: 0,
            lookup_connections: 0,
            ..cached()
        };
        assert!(everything.validate_cache().is_ok());
    }

    #[test]
    fn zero_and_absurd_bounds_are_refused_with_the_field_and_the_rule() {
        let cases: [(StoreConfig, &str, &str); 8] = [
            (
                StoreConfig {
                    cache_per_tenant: 0,
                    ..cached()
                },
                "store.cache_per_tenant",
                "at least 1 and at most store.cache_entries (50000); found 0",
            ),
            (
                StoreConfig {
                    cache_entries: 100,
                    cache_per_tenant: 101,
                    ..cached()
                },
                "store.cache_per_tenant",
                "at most store.cache_entries (100); found 101",
            ),
            (
                StoreConfig {
                    cache_bytes: 0,
                    ..cached()
                },
                "store.cache_bytes",
                "at least 65536 (64 KiB); found 0",
            ),
            (
                StoreConfig {
                    cache_bytes: MIN_CACHE_BYTES - 1,
                    ..cached()
                },
                "store.cache_bytes",
                "found 65535",
            ),
            (
                StoreConfig {
                    cache_load_timeout: Duration::ZERO,
                    ..cached()
                },
                "store.cache_load_timeout",
                "longer than zero",
            ),
            (
                StoreConfig {
                    cache_load_timeout: Duration::from_secs(60),
                    ..cached()
                },
                "store.cache_load_timeout",
                "at most 5s",
            ),
            (
                StoreConfig {
                    lookup_connections: 0,
                    ..cached()
                },
                "store.lookup_connections",
                "at least 1 and at most 256 (per worker); found 0",
            ),
            (
                StoreConfig {
                    lookup_connections: 10_000,
                    ..cached()
                },
                "store.lookup_connections",
                "found 10000",
            ),
        ];
        for (config, field, says) in cases {
            let (f, reason) = refused(&config);
            assert_eq!(f, field, "{config:?}");
            assert!(reason.contains(says), "{field}: {reason}");
        }
        // At the bounds: valid.
        let edges = StoreConfig {
            cache_entries: 1,
            cache_per_tenant: 1,
            cache_bytes: MIN_CACHE_BYTES,
            cache_load_timeout: MAX_CACHE_LOAD_TIMEOUT,
            lookup_connections: MAX_LOOKUP_CONNECTIONS,
            ..cached()
        };
        assert!(
            edges.validate_cache().is_ok(),
            "{:?}",
            edges.validate_cache()
        );
    }
}
