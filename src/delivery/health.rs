//! Endpoint health as operators see it: what the breakers signal becomes events, the
//! quarantine and recovery gauges, and, for an endpoint failing too long, its subscriptions
//! disabled in the store.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::delivery::endpoint::{EndpointKey, HealthSignal};
use crate::observe::events::{Notices, OperationalEvent};
use crate::observe::metrics::{MAX_QUARANTINE_SERIES, Metrics};
use crate::subscriptions::LiveSubscriptions;

/// Reports the endpoints' health signals.
pub(crate) struct EndpointHealth {
    pub(crate) subscriptions: Arc<LiveSubscriptions>,
    /// The PostgreSQL store the subscriptions come from, if any: where endpoints failing for
    /// `endpoints.disable_after` get their subscriptions disabled.
    pub(crate) store: Option<crate::store::PgStore>,
    pub(crate) notices: Notices,
    pub(crate) metrics: Metrics,
}

impl EndpointHealth {
    /// Announces what the endpoints' breakers reported on the events exchange, and keeps the
    /// quarantine and recovery gauges.
    pub(crate) fn report(&self, recovering: usize, signals: Vec<HealthSignal>) {
        self.metrics.endpoints_recovering.set(recovering as i64);
        for signal in signals {
            let (event, endpoint, open_for) = match &signal {
                HealthSignal::Quarantined { endpoint, open_for } => {
                    self.metrics.endpoints_quarantined.inc();
                    let labelled =
                        prometheus::core::Collector::collect(&self.metrics.endpoint_quarantined)
                            .first()
                            .map_or(0, |family| family.get_metric().len());
                    if labelled < MAX_QUARANTINE_SERIES {
                        self.metrics
                            .endpoint_quarantined
                            .with_label_values(&[endpoint.as_str()])
                            .set(1);
                    }
                    warn!(endpoint = %endpoint, open_for_ms = open_for.as_millis() as u64, "Endpoint quarantined");
                    ("endpoint.quarantined", endpoint, open_for)
                }
                HealthSignal::Recovered { endpoint, open_for } => {
                    self.metrics.endpoints_quarantined.dec();
                    // Absent when it was over the series bound.
                    let _ = self
                        .metrics
                        .endpoint_quarantined
                        .remove_label_values(&[endpoint.as_str()]);
                    info!(endpoint = %endpoint, open_for_ms = open_for.as_millis() as u64, "Endpoint recovered");
                    ("endpoint.recovered", endpoint, open_for)
                }
                HealthSignal::DisableDue { key, open_for } => {
                    self.disable(key, *open_for);
                    continue;
                }
            };
            let detail = format!(
                "circuit breaker open for {}",
                crate::units::fmt_duration(Duration::from_millis(open_for.as_millis() as u64))
            );
            self.notices.operational(
                OperationalEvent::new(event, "breaker")
                    .endpoint(endpoint)
                    .detail(&detail),
            );
        }
    }

    /// Pauses, in the store, every enabled subscription pointing at an endpoint whose breaker
    /// has been open for `endpoints.disable_after`, with the reason, and announces each as
    /// `subscription.disabled`: what waits for them parks instead of cycling through the tiers
    /// until it expires. In a fleet, only the worker whose update changed a row announces it.
    fn disable(&self, key: &EndpointKey, open_for: Duration) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let ids: Vec<String> = self
            .subscriptions
            .current()
            .iter()
            .filter(|s| s.enabled && !s.paused && EndpointKey::of(&s.url) == *key)
            .map(|s| s.id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        let reason = format!(
            "endpoint {} failing: its circuit breaker has been open for {} \
             (endpoints.disable_after); resume the subscription once it answers",
            key.label(),
            crate::units::fmt_duration(Duration::from_secs(open_for.as_secs()))
        );
        let notices = self.notices.clone();
        let endpoint = key.label();
        tokio::spawn(async move {
            match crate::store::postgres::disable(&store, &ids, &reason).await {
                Ok(disabled) => {
                    for (id, tenant) in disabled {
                        warn!(subscription = %id, endpoint = %endpoint, "Subscription disabled: its endpoint has been failing for endpoints.disable_after; its deliveries park until it is resumed");
                        let mut event =
                            OperationalEvent::new("subscription.disabled", "endpoint_failing")
                                .endpoint(&endpoint)
                                .detail(&reason);
                        event.tenant = Some(tenant);
                        event.subscription = Some(id);
                        notices.operational(event);
                    }
                }
                Err(e) => {
                    warn!(endpoint = %endpoint, error = %e, "Cannot disable the subscriptions of a failing endpoint; they keep being retried");
                }
            }
        });
    }
}
