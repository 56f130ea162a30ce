//! Which subscriptions a delivery is routed with: the version in force, or, from a large
//! store, what the worker's bounded cache holds or reads for it, without a miss ever holding
//! the lane ([`crate::subscriptions::cache`]).

use std::sync::Arc;
use std::time::Duration;

use crate::contract::envelope::Envelope;
use crate::delivery::dispatch::{Attempted, Dispatcher};
use crate::delivery::lane::{Lane, LaneKind};
use crate::delivery::route::{AttemptResult, DeferCause, Outcome, defer};
use crate::subscriptions::Subscriptions;
use crate::subscriptions::cache::{Key, Served};
use crate::units::now_ms;

impl Dispatcher {
    /// The subscriptions to route `envelope` with: the version in force, or, from a large
    /// store, what the cache holds (or reads) for it. A read the store does not answer in
    /// time defers an envelope of a subscription (waiting as for an endpoint's outage, which
    /// never expires it) and returns a fan-out to its lane.
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
            // Only a fresh event of a first-attempt lane fans out; routing refuses any other.
            None if lane.kind == LaneKind::First
                && envelope.attempts_made == 0
                && envelope.event_id.is_none() =>
            {
                Key::tenant(&envelope.tenant)
            }
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
        if let Key::Tenant(_) = key {
            return Err(Attempted::without_attempt(Outcome::Returned { reason }));
        }
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
