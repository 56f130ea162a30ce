//! Why an attempt was not made, and when a delivery may wait for a slot instead.

use std::time::Duration;

use crate::delivery::route::DeferCause;

/// Whether a delivery that found its endpoint's cap full may wait up to `busy_wait` for a slot
/// instead of being deferred: the endpoint answers fast (its attempts' moving average is known
/// and at most `busy_wait`) and made progress within `busy_wait`, so a slot is due to free up
/// within about one of its attempts. A stuck endpoint, a slow one, or one not yet heard from
/// never holds a lane slot this way.
pub fn may_wait(busy_wait: Duration, busy: DeferCause) -> bool {
    match busy {
        DeferCause::Busy {
            quiet_for, latency, ..
        } => {
            !busy_wait.is_zero()
                && !latency.is_zero()
                && latency <= busy_wait
                && quiet_for <= busy_wait
        }
        _ => false,
    }
}

/// Whether one more delivery waiting for an endpoint's slot can expect one within
/// `busy_wait`: with `waiting` ahead of it and `slots` attempts at once, each taking about
/// `latency`, its turn comes after about `(waiting + 1) / slots` attempts. One that would wait
/// longer is deferred at once rather than hold its lane slot for a turn that will not come.
pub fn wait_is_short(busy_wait: Duration, latency: Duration, waiting: u32, slots: u32) -> bool {
    latency.saturating_mul(waiting.saturating_add(1)) / slots.max(1) <= busy_wait
}

/// Why an attempt was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deferral {
    /// `failed_try_ms`: when the endpoint's latest failed attempt started, if one did;
    /// `failed_in_a_row`: its attempts that failed since its last answer.
    BreakerOpen {
        endpoint: String,
        retry_in: Duration,
        failed_try_ms: Option<u64>,
        failed_in_a_row: u32,
    },
    /// The endpoint's own cap was full: `cap` is this worker's share of it. `busy`: what is
    /// known of its progress.
    OverCap {
        endpoint: String,
        cap: u32,
        busy: DeferCause,
    },
    /// The endpoint had its share of the shared lane the delivery came from out (`most`
    /// attempts from `lane`). `busy`: what is known of its progress.
    OverLaneShare {
        endpoint: String,
        lane: String,
        most: u32,
        busy: DeferCause,
    },
    /// The cap of the host the endpoint shares with others was full (this worker's share).
    HostOverCap { host: String, cap: u32 },
    /// The endpoint's rate limit (`rate`, shared by `workers`) allowed no request now.
    OverRate {
        endpoint: String,
        rate: String,
        workers: u32,
    },
    /// The endpoint is recovering from an outage and had its ramp's limit (or more) in flight.
    Recovering {
        endpoint: String,
        limit: u32,
        busy: DeferCause,
    },
}

impl Deferral {
    pub fn kind(&self) -> &'static str {
        match self {
            Deferral::BreakerOpen { .. } => "breaker_open",
            Deferral::OverCap { .. } => "concurrency",
            Deferral::OverLaneShare { .. } => "lane_share",
            Deferral::HostOverCap { .. } => "host_concurrency",
            Deferral::Recovering { .. } => "recovery",
            Deferral::OverRate { .. } => "rate",
        }
    }

    /// Where the envelope should wait, as [`crate::delivery::route::defer`] reads it: an open
    /// breaker is an outage (tiers that grow with its deferrals, at least until the next
    /// probe); at a full cap, or while it recovers, the endpoint is up and busy (deferral
    /// queues of a fraction of a second, unless it has shown no progress for that long). A
    /// host's cap is shared by its endpoints and says nothing of this one: busy. A rate is
    /// ours, not the endpoint's answer: the shortest deferral queue, never escalated.
    pub fn cause(&self) -> DeferCause {
        match self {
            Deferral::BreakerOpen {
                retry_in,
                failed_try_ms,
                failed_in_a_row,
                ..
            } => DeferCause::Outage {
                probe_in: *retry_in,
                failed_try_ms: *failed_try_ms,
                failed_in_a_row: *failed_in_a_row,
            },
            Deferral::OverCap { busy, .. }
            | Deferral::OverLaneShare { busy, .. }
            | Deferral::Recovering { busy, .. } => *busy,
            Deferral::HostOverCap { .. } => DeferCause::BUSY,
            Deferral::OverRate { .. } => DeferCause::OverRate,
        }
    }
}

impl std::fmt::Display for Deferral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Deferral::BreakerOpen {
                endpoint, retry_in, ..
            } => write!(
                f,
                "deferred: the circuit breaker of {endpoint} is open (probe in {})",
                crate::units::fmt_duration(Duration::from_millis(retry_in.as_millis() as u64))
            ),
            Deferral::OverCap { endpoint, cap, .. } => {
                write!(f, "deferred: {endpoint} had {cap} attempts in flight")
            }
            Deferral::OverLaneShare {
                endpoint,
                lane,
                most,
                ..
            } => write!(
                f,
                "deferred: {endpoint} had {most} attempts in flight from {lane}, its share of that lane"
            ),
            Deferral::HostOverCap { host, cap } => {
                write!(f, "deferred: host {host} had {cap} attempts in flight")
            }
            Deferral::Recovering {
                endpoint, limit, ..
            } => write!(
                f,
                "deferred: {endpoint} is allowed at most {limit} attempts at once while it recovers"
            ),
            Deferral::OverRate {
                endpoint,
                rate,
                workers,
            } => write!(
                f,
                "deferred: {endpoint} is over its rate limit of {rate} (shared by {workers} workers)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_waits_only_when_its_turn_should_come_within_the_wait() {
        let wait = Duration::from_millis(20);
        let ms = Duration::from_millis;
        // 64 slots of 2 ms: about 640 may wait.
        assert!(wait_is_short(wait, ms(2), 0, 64));
        assert!(wait_is_short(wait, ms(2), 639, 64));
        assert!(!wait_is_short(wait, ms(2), 640, 64));
        // One slot of 10 ms: the first two.
        assert!(wait_is_short(wait, ms(10), 1, 1));
        assert!(!wait_is_short(wait, ms(10), 2, 1));
        // No slot share is taken as one.
        assert!(wait_is_short(wait, ms(10), 0, 0));
    }

    #[test]
    fn only_an_endpoint_that_answers_fast_and_made_progress_lately_is_waited_for() {
        let wait = Duration::from_millis(20);
        let busy = |quiet_ms: u64, latency_ms: u64| DeferCause::Busy {
            quiet_for: Duration::from_millis(quiet_ms),
            latency: Duration::from_millis(latency_ms),
            turn_in: Duration::ZERO,
        };
        assert!(may_wait(wait, busy(1, 2)));
        assert!(may_wait(wait, busy(20, 20)));
        // Slow: its deliveries belong in the deferral queues.
        assert!(!may_wait(wait, busy(1, 21)));
        // No progress for longer than the wait: stuck, or slower than it looks.
        assert!(!may_wait(wait, busy(21, 2)));
        // Not heard from yet.
        assert!(!may_wait(wait, busy(0, 0)));
        // Turned off.
        assert!(!may_wait(Duration::ZERO, busy(1, 2)));
        assert!(!may_wait(wait, DeferCause::BUSY));
        assert!(!may_wait(
            wait,
            DeferCause::Outage {
                probe_in: Duration::from_secs(1),
                failed_try_ms: None,
                failed_in_a_row: 0,
            }
        ));
    }
}
