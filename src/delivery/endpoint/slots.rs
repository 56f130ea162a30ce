//! A slot for one attempt, and the limits on slots: an endpoint's share of a lane.

use tokio::sync::OwnedSemaphorePermit;

use super::*;
use crate::delivery::route::AttemptResult;

/// Counts a delivery waiting for an endpoint's slot while it waits, cancelled or not.
pub(super) struct Waiting<'a> {
    pub(super) endpoints: &'a EndpointsInner,
    pub(super) key: &'a EndpointKey,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(health) = self.endpoints.lock_health().get_mut(self.key) {
            health.waiting = health.waiting.saturating_sub(1);
        }
    }
}

/// Whether an attempt's result counts against the endpoint's health. Client errors and 429
/// (the endpoint is well and says so) do not.
pub fn is_endpoint_failure(result: &AttemptResult) -> bool {
    match result {
        AttemptResult::Response { status, .. } => {
            matches!(status, 300..=399 | 408 | 500..=599) || !(100..=599).contains(status)
        }
        AttemptResult::Timeout | AttemptResult::Transport(_) => true,
        AttemptResult::NotSent(_)
        | AttemptResult::TokenRefused(_)
        | AttemptResult::EgressDenied(_)
        | AttemptResult::Deferred { .. } => false,
    }
}

/// A slot for one attempt; report how it went with [`Slot::finish`]. Dropped unfinished (the
/// delivery's task ended), it gives its place back without a result.
pub struct Slot {
    pub(super) key: EndpointKey,
    /// The cap it was admitted under: where a ramp ends.
    pub(super) cap: u32,
    pub(super) _permit: OwnedSemaphorePermit,
    pub(super) _host_permit: OwnedSemaphorePermit,
    /// Its place in the endpoint's share of the lane it came from, if that lane limits it.
    pub(super) _lane_permit: Option<OwnedSemaphorePermit>,
    pub(super) endpoints: Arc<EndpointsInner>,
    pub(super) finished: bool,
    /// When it was admitted: its attempt's latency is measured from here.
    pub(super) started: Instant,
    /// The same moment on the wall clock (ms since the epoch), which envelopes carry.
    pub(super) started_ms: u64,
}

impl Slot {
    pub fn finish(mut self, result: &AttemptResult) {
        self.finished = true;
        let inner = &self.endpoints;
        let (recovered, change) = {
            let mut all = inner.lock_health();
            let Some(health) = all.get_mut(&self.key) else {
                return;
            };
            let now = inner.clock.now();
            health.finished(now, Some(now.saturating_duration_since(self.started)));
            health.record(
                result,
                self.cap,
                inner.config.recovery_start,
                (self.started, self.started_ms),
                now,
            )
        };
        if let Some(open_for) = recovered {
            inner.signal(HealthSignal::Recovered {
                endpoint: self.key.label(),
                open_for,
            });
        }
        match change {
            RampChange::Unchanged => {}
            RampChange::Started(limit) => {
                inner.recovering.fetch_add(1, Ordering::Relaxed);
                info!(endpoint = %self.key.label(), limit, cap = self.cap, "Endpoint recovered; ramping its concurrency up");
            }
            RampChange::Finished | RampChange::Abandoned => {
                inner.recovering.fetch_sub(1, Ordering::Relaxed);
                if change == RampChange::Finished {
                    info!(endpoint = %self.key.label(), cap = self.cap, "Endpoint back to its full concurrency");
                }
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.finished
            && let Some(health) = self.endpoints.lock_health().get_mut(&self.key)
        {
            health.finished(self.endpoints.clock.now(), None);
        }
    }
}

/// A shared lane's limit on the attempts one endpoint may have out from it at once
/// (`endpoints.lane_share` of its prefetch): an attempt holds its lane slot while it is made, so
/// without it an endpoint that hangs could hold as much of a shard as its cap, and the tenants
/// behind it in that shard would be moved out of the way by what is left.
#[derive(Debug, Clone, Copy)]
pub struct LaneQuota<'a> {
    /// The lane's queue.
    pub lane: &'a str,
    /// The most attempts at once from it per endpoint.
    pub most: u32,
}

/// Permits a delivery already holds when it is admitted after a wait.
#[derive(Default)]
pub(super) struct Held {
    /// Of the endpoint's cap.
    pub(super) cap: Option<OwnedSemaphorePermit>,
    /// Of the endpoint's share of the delivery's lane.
    pub(super) lane: Option<OwnedSemaphorePermit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_signs_of_an_unwell_endpoint_count() {
        let status = |s| AttemptResult::Response {
            status: s,
            retry_after: None,
        };
        for failed in [
            status(500),
            status(503),
            status(408),
            status(302),
            AttemptResult::Timeout,
        ] {
            assert!(is_endpoint_failure(&failed), "{failed:?}");
        }
        for fine in [
            status(200),
            status(400),
            status(404),
            status(410),
            status(429),
        ] {
            assert!(!is_endpoint_failure(&fine), "{fine:?}");
        }
    }
}
