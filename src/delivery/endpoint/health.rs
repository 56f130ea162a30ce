//! One endpoint's health: its breaker, its ramp, how fast it answers and when it last made
//! progress.

use std::time::{Duration, Instant};

use super::*;
use crate::delivery::route::{AttemptResult, DeferCause};

/// Whether a result tells a recovering endpoint's ramp to back off: the failures the breaker
/// counts, and 429, which the breaker does not count (the endpoint is up) but which says it has
/// more than it can take.
pub(super) fn is_overload(result: &AttemptResult) -> bool {
    is_endpoint_failure(result) || matches!(result, AttemptResult::Response { status: 429, .. })
}

/// What a result did to an endpoint's ramp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RampChange {
    Unchanged,
    /// The breaker closed: a ramp starts at this limit.
    Started(u32),
    /// The limit reached the cap: the endpoint is back to its cap.
    Finished,
    /// The breaker opened again; the next close starts over.
    Abandoned,
}

/// What admission knows of one endpoint.
#[derive(Debug)]
pub(super) struct Health {
    pub(super) breaker: Breaker,
    /// Set while it recovers from an opening of its breaker.
    pub(super) ramp: Option<Ramp>,
    /// Attempts out now, under whatever cap (a subscription's own or the default).
    pub(super) in_flight: u32,
    /// When it last showed progress: an attempt to it finished, or one started while none was
    /// out. A full cap with no progress for long means attempts that do not answer.
    pub(super) progress: Option<Instant>,
    /// How long its attempts take: a moving average of the last ones (zero before the first).
    pub(super) latency: Duration,
    /// Deliveries waiting for one of its slots now ([`Endpoints::admit_or_wait`]).
    pub(super) waiting: u32,
    /// When its latest failed attempt started (ms since the epoch; a breaker's failure only):
    /// a deferral for its open breaker may end an envelope past its horizon only when this
    /// is after the envelope last went to wait ([`crate::delivery::route::defer`]).
    pub(super) failed_try_ms: Option<u64>,
    /// Its attempts that failed since it last answered (a breaker's failure each; any other
    /// answer ends the run): an expiry needs an outage longer than the schedule rides out.
    pub(super) failed_in_a_row: u32,
    /// The last turn booked for a delivery deferred from its full cap
    /// ([`EndpointsInner::book_turn`]).
    pub(super) turns_until: Option<Instant>,
}

impl Health {
    pub(super) fn new(breaker: Breaker) -> Self {
        Self {
            breaker,
            ramp: None,
            in_flight: 0,
            progress: None,
            latency: Duration::ZERO,
            waiting: 0,
            turns_until: None,
            failed_try_ms: None,
            failed_in_a_row: 0,
        }
    }

    /// One attempt fewer out, which is progress; `took` is how long it took, when it ended
    /// with a result.
    pub(super) fn finished(&mut self, now: Instant, took: Option<Duration>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.progress = Some(now);
        if let Some(took) = took {
            // An exponential moving average over about the last 8 attempts.
            self.latency = if self.latency.is_zero() {
                took
            } else {
                (self.latency * 7 + took) / 8
            };
        }
    }

    /// What a deferral at a limit knows of the endpoint now.
    pub(super) fn busy(&self, now: Instant) -> DeferCause {
        DeferCause::Busy {
            quiet_for: self
                .progress
                .map_or(Duration::ZERO, |p| now.saturating_duration_since(p)),
            latency: self.latency,
            turn_in: Duration::ZERO,
        }
    }

    /// Records an attempt's result into the breaker and the ramp. `cap` is the cap the attempt
    /// was admitted under, `start` the ramp's first limit (0: no ramp); `started` and
    /// `started_ms` when the attempt was admitted. Returns how long a quarantined breaker had
    /// been open when this closes it, and what changed in the ramp.
    pub(super) fn record(
        &mut self,
        result: &AttemptResult,
        cap: u32,
        start: u32,
        (started, started_ms): (Instant, u64),
        now: Instant,
    ) -> (Option<Duration>, RampChange) {
        let was_open = self.breaker.is_open();
        let failed = is_endpoint_failure(result);
        if failed {
            self.failed_try_ms = self.failed_try_ms.max(Some(started_ms));
            self.failed_in_a_row = self.failed_in_a_row.saturating_add(1);
        } else if matches!(result, AttemptResult::Response { .. }) {
            self.failed_in_a_row = 0;
        }
        let recovered = self.breaker.record(failed, started, now);
        let was_ramping = self.ramp.is_some();
        if self.breaker.is_open() {
            self.ramp = None;
        } else if was_open {
            self.ramp = (start > 0 && start < cap).then(|| Ramp::new(start));
        } else if let Some(ramp) = &mut self.ramp {
            if is_overload(result) {
                ramp.on_failure();
            } else if matches!(result, AttemptResult::Response { .. }) {
                ramp.on_success();
            }
            if ramp.limit() >= cap {
                self.ramp = None;
            }
        }
        let change = match (was_ramping, self.ramp) {
            (false, Some(ramp)) => RampChange::Started(ramp.limit()),
            (true, None) if self.breaker.is_open() => RampChange::Abandoned,
            (true, None) => RampChange::Finished,
            _ => RampChange::Unchanged,
        };
        (recovered, change)
    }
}
