//! What the worker forgets. Secrets are resolved, endpoints judged and tokens fetched as
//! attempts need them, and each is kept for the next attempt; what no live subscription uses
//! any more goes, so a worker's memory follows the subscriptions and endpoints in force, not
//! every version of every one it has seen (a storm of changes reseals secrets each time).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::delivery::dispatch::Dispatcher;
use crate::delivery::endpoint::EndpointKey;
use crate::subscriptions::Subscriptions;

/// How often idle state is looked at. A changed subscription's own secrets go at once
/// ([`crate::store::follow`]); this catches the rest: endpoints no longer pointed at, caps and
/// rates gone idle, a file's reload.
pub const SWEEP: Duration = Duration::from_secs(5);

/// Sweeps every [`SWEEP`] until `stop`.
pub async fn sweep_loop(dispatcher: Arc<Dispatcher>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<(Arc<Subscriptions>, Arc<HashSet<EndpointKey>>)> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let current = dispatcher.subscriptions.current();
        let keys = match &seen {
            Some((subs, keys)) if Arc::ptr_eq(subs, &current) => Arc::clone(keys),
            _ => {
                // A large store takes a while to walk: off the runtime's threads.
                let (subs, d) = (Arc::clone(&current), Arc::clone(&dispatcher));
                let Ok(keys) = tokio::task::spawn_blocking(move || {
                    d.secrets.retain_live(&subs);
                    Arc::new(endpoint_keys(&subs))
                })
                .await
                else {
                    continue;
                };
                keys
            }
        };
        sweep(&dispatcher, &current, &keys);
        seen = Some((current, keys));
    }
}

/// The endpoints `subscriptions` point at, paused and disabled ones included: their envelopes
/// may still come back to be parked or cancelled.
pub fn endpoint_keys(subscriptions: &Subscriptions) -> HashSet<EndpointKey> {
    subscriptions
        .iter()
        .map(|sub| EndpointKey::of(&sub.url))
        .collect()
}

/// Forgets what `live` and `keys` do not use, and shows what is left in
/// `hookrelay_worker_cache_entries` (and the open breakers among it in
/// `hookrelay_endpoints_open`).
pub fn sweep(dispatcher: &Dispatcher, live: &Subscriptions, keys: &HashSet<EndpointKey>) {
    dispatcher.endpoints.retain_live(keys);
    let is_live = |id: &str| live.get(id).is_some();
    let tokens = dispatcher.tokens.retain(is_live);
    let tls_clients = dispatcher.http.retain_tls_clients(is_live);
    let amqp_connections = dispatcher.amqp.retain_live(is_live);
    let (secrets, secret_texts) = dispatcher.secrets.entries();
    let e = dispatcher.endpoints.entries();
    let gauge = &dispatcher.settler.metrics.cache_entries;
    for (cache, n) in [
        ("secrets", secrets),
        ("secret_texts", secret_texts),
        ("endpoint_health", e.health),
        ("endpoint_limits", e.limits),
        ("host_limits", e.host_limits),
        ("lane_limits", e.lane_limits),
        ("endpoint_rates", e.rates),
        ("oauth_tokens", tokens),
        ("tls_clients", tls_clients),
        ("amqp_connections", amqp_connections),
    ] {
        gauge
            .with_label_values(&[cache])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    if let Some(cache) = dispatcher.subscriptions.cache() {
        let held = cache.held();
        gauge
            .with_label_values(&["subscriptions"])
            .set(i64::try_from(held.subscriptions).unwrap_or(i64::MAX));
        gauge
            .with_label_values(&["subscription_bytes"])
            .set(i64::try_from(held.bytes).unwrap_or(i64::MAX));
    }
    let open = &dispatcher.settler.metrics.endpoints_open;
    open.set(i64::try_from(e.open).unwrap_or(i64::MAX));
}
