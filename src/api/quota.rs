//! What one tenant may take of the API: of replays, how many at once, how wide and how fast.
//! The defaults are `[api]`'s (see `crate::config::ApiConfig`); admin tokens are the operator's
//! and are held only to what bounds the process (replays running at once, the `only_undelivered`
//! index).

use std::time::Duration;

use crate::config::ApiConfig;
use crate::units::Rate;

/// The API's limits, from `[api]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub replays_running: usize,
    pub replays_per_tenant: usize,
    pub tenant_replay_window: Duration,
    pub tenant_replay_rate: Rate,
    pub replay_index_max: usize,
}

impl Limits {
    pub fn from_config(api: &ApiConfig) -> Self {
        Self {
            replays_running: api.replays_running,
            replays_per_tenant: api.replays_per_tenant,
            tenant_replay_window: api.tenant_replay_window,
            tenant_replay_rate: api.tenant_replay_rate,
            replay_index_max: api.replay_index_max,
        }
    }
}

/// `[api]`'s defaults.
impl Default for Limits {
    fn default() -> Self {
        Self::from_config(&ApiConfig::default())
    }
}
