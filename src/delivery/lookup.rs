//! Which subscriptions a delivery is routed with: the version in force, or, from a large
//! store, what the worker's bounded cache holds or reads for it, without a miss ever holding
//! the lane's slot past `store.cache_load_timeout` ([`crate::subscriptions::cache`]).

use std::sync::Arc;
use std::time::Duration;

use crate::contract::envelope::Envelope;
use crate::delivery::dispatch::{Attempted, Dispatcher};
use crate::delivery::lane::Lane;
use crate::delivery::route::{AttemptResult, DeferCause, Outcome, defer, fans_out};
use crate::subscriptions::Subscriptions;
use crate::subscriptions::cache::{Key, Served};
use crate::units::now_ms;

impl Dispatcher {
    /// The subscriptions to route `envelope` with: the version in force, or, from a large
    /// store, what the cache holds (or reads) for it. A read the store does not answer in
    /// time, or cannot give, defers the envelope, an event to fan out as well as a delivery:
    /// republished into a tier with the reason, not an attempt, its id unchanged, waiting as
    /// for an endpoint's outage (longer with each deferral, never expired by it: the store
    /// being away is no evidence against the endpoint). Its slot is free as soon as the
    /// deferral is confirmed.
    pub(super) async fn subscriptions_for(
        &self,
        lane: &Lane,
        envelope: &Envelope,
    ) -> Result<Arc<Subscriptions>, Attempted> {
        let Some(cache) = self.subscriptions.cache() else {
            return Ok(self.subscriptions.current());
        };
        let key = match &envelope.subscription {
            Some(id) => Key::id(id),
            // Routing refuses any other envelope without a subscription.
            None if fans_out(envelope, lane.kind) => Key::tenant(&envelope.tenant),
            None => return Ok(Arc::new(Subscriptions::default())),
        };
        let metrics = &self.settler.metrics;
        let counted = |result: &str| {
            metrics
                .subscription_lookups
                .with_label_values(&[key.kind(), result])
                .inc();
        };
        let miss = match cache.lookup(&key, &envelope.tenant).await {
            Ok((view, Served::Hit)) => {
                counted("hit");
                return Ok(view);
            }
            Ok((view, Served::Miss(waited))) => {
                counted("miss");
                metrics
                    .subscription_miss_seconds
                    .with_label_values(&[key.kind()])
                    .observe(waited.as_secs_f64());
                return Ok(view);
            }
            Err(miss) => miss,
        };
        let reason = miss.to_string();
        if !miss.retry_helps() {
            counted("refused");
            return Err(Attempted::without_attempt(Outcome::invalid(
                reason,
                envelope.attempts_made,
            )));
        }
        counted("failed");
        let cause = DeferCause::Outage {
            probe_in: Duration::ZERO,
            failed_try_ms: None,
            failed_in_a_row: 0,
        };
        let outcome = defer(
            &self.ladder,
            envelope,
            &reason,
            cause,
            self.horizon(),
            now_ms(),
        );
        Err(Attempted {
            outcome,
            endpoint: None,
            result: Some(AttemptResult::Deferred { reason, cause }),
            latency: None,
        })
    }
}
