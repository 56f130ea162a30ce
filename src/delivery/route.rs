//! What happens to a delivery, decided without I/O, in two steps around the HTTP attempt:
//! [`route`] decides whether to make one at all (the subscription as it is now: unknown or
//! deleted, another tenant's, disabled, paused, filtered, the budget already spent, or a
//! fan-out), and
//! [`decide`] what the attempt's result calls for: acknowledge it, move it to a tier, or
//! dead-letter it with a reason. [`crate::delivery::settle`] carries the decision out; tests
//! call both directly.

use std::sync::Arc;
use std::time::Duration;

use crate::catalog::{Catalog, ValidationMode, Verdict, Violation};
use crate::contract::envelope::{self, Envelope, InvalidEnvelope};
use crate::contract::headers::{
    ATTEMPTS_HEADER, BUSY_DEFERRALS_HEADER, DEFERRALS_HEADER, DUE_HEADER, ENDPOINT_HEADER,
    EVENT_ID_HEADER, FIRST_TRY_HEADER, WAITING_SINCE_HEADER,
};
use crate::contract::ladder::{Ladder, TierId};
use crate::delivery::lane::LaneKind;
use crate::subscriptions::{Payload, Subscription, Subscriptions};

/// What one HTTP attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The endpoint answered. `retry_after` is its `Retry-After`, if any.
    Response {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// No complete answer within the request timeout.
    Timeout,
    /// Connection refused, reset, TLS failure, DNS failure...
    Transport(String),
    /// The attempt could not be signed or sent for a reason of ours (no secret resolved); worth
    /// trying again once configuration is fixed.
    NotSent(String),
    /// The egress policy refused the endpoint's address; no connection was made.
    EgressDenied(String),
    /// The endpoint answered 401 to an OAuth2 token: retried with a new token, and not held
    /// against the endpoint's health (it is up and says so).
    TokenRefused(String),
    /// No attempt was made: the endpoint's breaker is open, a concurrency cap or rate was
    /// full, or the endpoint is recovering at its limit. Not an attempt: [`defer`] decides
    /// what follows, by `cause`.
    Deferred { reason: String, cause: DeferCause },
}

/// Why an endpoint took no attempt, as far as where the envelope waits goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferCause {
    /// Its breaker is open and lets a probe through in `probe_in`: an outage, which may be
    /// long. `failed_try_ms`: when its latest failed attempt started (ms since the epoch), if
    /// this worker saw one; `failed_in_a_row`: how many of its attempts this worker saw fail
    /// since its last answer. Both are the evidence an expiry needs ([`defer`]).
    Outage {
        probe_in: Duration,
        failed_try_ms: Option<u64>,
        failed_in_a_row: u32,
    },
    /// It is up but at a limit (its cap, its host's cap, its rate, its recovery ramp).
    /// `quiet_for`: how long since it last showed progress (an attempt to it finished, or one
    /// started while none was out); `latency`: how long its attempts take (a moving average;
    /// zero while none has finished). Both zero where not known (a host or a rate).
    /// `turn_in`: how long until the turn booked for it at its endpoint's pace
    /// ([`crate::delivery::endpoint::Endpoints::admit_or_wait`]); zero where not booked.
    Busy {
        quiet_for: Duration,
        latency: Duration,
        turn_in: Duration,
    },
    /// Its rate limit allowed no request now. Never escalated: the limiter admits no burst, so
    /// deferrals that come back together get about one request each time they come back, and a
    /// longer wait would only slow the backlog below its rate.
    OverRate,
}

impl DeferCause {
    /// A busy endpoint's cause with nothing known against it.
    pub const BUSY: DeferCause = DeferCause::Busy {
        quiet_for: Duration::ZERO,
        latency: Duration::ZERO,
        turn_in: Duration::ZERO,
    };
}

impl AttemptResult {
    /// A short text for logs and the last-error header.
    pub fn describe(&self) -> String {
        match self {
            AttemptResult::Response { status, .. } => format!("HTTP {status}"),
            AttemptResult::Timeout => "timeout".to_owned(),
            AttemptResult::Transport(e) => format!("transport error: {e}"),
            AttemptResult::NotSent(e) => format!("not sent: {e}"),
            AttemptResult::TokenRefused(e) => e.clone(),
            AttemptResult::EgressDenied(e) | AttemptResult::Deferred { reason: e, .. } => e.clone(),
        }
    }
}

/// Why a message ends in the dead sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// A 4xx that retrying cannot fix.
    Rejected,
    /// The retry budget is spent.
    Exhausted,
    /// The message is not a valid envelope, or names nothing we can deliver to.
    Invalid,
    /// The endpoint answered 410 Gone: it asks not to be sent anything more.
    Gone,
    /// The egress policy refuses the endpoint's address.
    EgressDenied,
    /// The delivery horizon passed while the envelope was being deferred. Named
    /// `horizon_expired`: the broker's own `expired` (a message TTL) is another reason.
    Expired,
    /// The payload breaks its event type's schema, whose mode is `enforce`.
    SchemaInvalid,
}

impl DeadReason {
    /// Every reason, for those who parse or list them (`redrive --reason`).
    pub const ALL: [DeadReason; 7] = [
        DeadReason::Rejected,
        DeadReason::Exhausted,
        DeadReason::Invalid,
        DeadReason::Gone,
        DeadReason::EgressDenied,
        DeadReason::Expired,
        DeadReason::SchemaInvalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Rejected => "rejected",
            DeadReason::Exhausted => "exhausted",
            DeadReason::Invalid => "invalid",
            DeadReason::Gone => "gone",
            DeadReason::EgressDenied => "egress_denied",
            DeadReason::Expired => "horizon_expired",
            DeadReason::SchemaInvalid => "schema_invalid",
        }
    }
}

/// Why an envelope completes without delivery and without being an error: the subscription
/// changed while it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// The subscription no longer exists.
    Deleted,
    /// The subscription is disabled.
    Disabled,
    /// The subscription no longer receives this event type (or, for a fan-out, none does).
    Filtered,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::Deleted => "deleted",
            CancelReason::Disabled => "disabled",
            CancelReason::Filtered => "filtered",
        }
    }
}

/// The decision for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: acknowledge.
    Delivered { status: u16 },
    /// Republish into `tier` (a tier or a deferral queue) carrying `attempts_made`, then
    /// acknowledge. `deferred`: no request was made, so the envelope's deferrals, not its
    /// attempts, grow by one. `busy_deferrals`: its busy deferrals in a row after this one
    /// (0 unless this is one).
    Retry {
        tier: TierId,
        attempts_made: u32,
        error: String,
        deferred: bool,
        busy_deferrals: u32,
    },
    /// Acknowledge without delivering; recorded with its reason.
    Cancelled {
        reason: CancelReason,
        detail: String,
    },
    /// An event without a subscription: publish one delivery per subscription (each with its
    /// derived id), then acknowledge.
    FanOut {
        subscriptions: Vec<String>,
        /// Matching subscriptions whose payload filter excludes the event: recorded, not sent.
        filtered: Vec<String>,
    },
    /// The subscription is paused: republish the delivery as it is (same id, same attempt
    /// count) into the subscription's parking queue, then acknowledge.
    Parked { subscription: String },
    /// Publish to the dead sink with the reason, then acknowledge.
    Dead {
        reason: DeadReason,
        status: Option<u16>,
        error: String,
        attempts_made: u32,
    },
}

impl Outcome {
    pub fn invalid(error: impl Into<String>, attempts_made: u32) -> Self {
        Outcome::Dead {
            reason: DeadReason::Invalid,
            status: None,
            error: error.into(),
            attempts_made,
        }
    }

    /// The outcome's kind as metrics and logs name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Delivered { .. } => "delivered",
            Outcome::Retry { .. } => "retried",
            Outcome::Cancelled { .. } => "cancelled",
            Outcome::FanOut { .. } => "fanned_out",
            Outcome::Parked { .. } => "parked",
            Outcome::Dead { reason, .. } => reason.as_str(),
        }
    }
}

/// The first step: attempt delivery to a subscription, or settle without an attempt.
#[derive(Debug, Clone)]
pub enum Route {
    /// Make the HTTP attempt to this subscription, as it is now.
    Attempt(Arc<Subscription>),
    /// No attempt: settle with this outcome.
    Settle(Outcome),
}

/// Decides whether a valid envelope from a lane of kind `lane` gets an HTTP attempt, given the
/// subscriptions as they are now and the ladder's budget.
pub fn route(
    envelope: &Envelope,
    body: &[u8],
    lane: LaneKind,
    subscriptions: &Subscriptions,
    ladder: &Ladder,
) -> Route {
    if let Err(forged) = check_provenance(envelope, lane) {
        return Route::Settle(Outcome::invalid(forged.to_string(), envelope.attempts_made));
    }
    let Some(sub_id) = &envelope.subscription else {
        return Route::Settle(fan_out(envelope, body, lane, subscriptions));
    };
    let made = envelope.attempts_made;
    let sub = match subscriptions.get(sub_id) {
        Some(sub) => sub,
        None if envelope.subscription_existed() => {
            return Route::Settle(Outcome::Cancelled {
                reason: CancelReason::Deleted,
                detail: format!("subscription {sub_id:?} was deleted"),
            });
        }
        None => {
            return Route::Settle(Outcome::invalid(
                format!("unknown subscription {sub_id:?}"),
                made,
            ));
        }
    };
    if sub.tenant != envelope.tenant {
        return Route::Settle(Outcome::invalid(
            format!(
                "subscription {:?} belongs to tenant {:?}, not {:?}",
                sub.id, sub.tenant, envelope.tenant
            ),
            made,
        ));
    }
    if !sub.enabled {
        return Route::Settle(Outcome::Cancelled {
            reason: CancelReason::Disabled,
            detail: format!("subscription {:?} is disabled", sub.id),
        });
    }
    if let Some(parked) = park(sub) {
        return Route::Settle(parked);
    }
    if !sub.accepts(&envelope.event_type) {
        return Route::Settle(Outcome::Cancelled {
            reason: CancelReason::Filtered,
            detail: format!(
                "subscription {:?} does not receive event type {:?}",
                sub.id, envelope.event_type
            ),
        });
    }
    if !Payload::new(body).passes(sub.payload_filter.as_ref()) {
        return Route::Settle(Outcome::Cancelled {
            reason: CancelReason::Filtered,
            detail: format!(
                "the payload filter of subscription {:?} excludes it",
                sub.id
            ),
        });
    }
    if made >= ladder.max_attempts() {
        return Route::Settle(Outcome::Dead {
            reason: DeadReason::Exhausted,
            status: None,
            error: format!("arrived with {made} attempts made, the whole budget"),
            attempts_made: made,
        });
    }
    Route::Attempt(Arc::clone(sub))
}

/// What the catalog makes of an event before it is routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    /// Route it: valid, not validated (its mode is `off`), or not where events are validated.
    Pass,
    /// Route it, though its payload breaks its type's schema: the mode is `warn`. `listed`:
    /// the catalog lists its type.
    Warn { listed: bool, violation: Violation },
    /// Settle it so (dead-letter `schema_invalid`) before any endpoint sees it: the mode is
    /// `enforce`.
    Refuse {
        outcome: Outcome,
        listed: bool,
        violation: Violation,
    },
}

/// Validates an event's payload where it is first routed: a fresh envelope on a first-attempt
/// lane (an event to fan out, or one published to a subscription). A retry, a fan-out's
/// delivery (its event was screened) and an envelope with forged headers (which [`route`]
/// dead-letters `invalid`) pass untouched, so each event is validated once.
pub fn screen(envelope: &Envelope, body: &[u8], lane: LaneKind, catalog: &Catalog) -> Screen {
    if lane != LaneKind::First
        || envelope.event_id.is_some()
        || check_provenance(envelope, lane).is_err()
    {
        return Screen::Pass;
    }
    match catalog.check(&envelope.event_type, body) {
        Verdict::Unchecked | Verdict::Valid => Screen::Pass,
        Verdict::Invalid {
            mode: ValidationMode::Enforce,
            listed,
            violation,
        } => Screen::Refuse {
            outcome: Outcome::Dead {
                reason: DeadReason::SchemaInvalid,
                status: None,
                error: format!(
                    "payload does not match the schema of event type {:?}: {violation}",
                    envelope.event_type
                ),
                attempts_made: envelope.attempts_made,
            },
            listed,
            violation,
        },
        Verdict::Invalid {
            listed, violation, ..
        } => Screen::Warn { listed, violation },
    }
}

/// A paused subscription's deliveries wait, untouched, before anything else about them is
/// decided: the filter, the budget and the attempt itself apply to the subscription as it is
/// when they come back.
fn park(sub: &Subscription) -> Option<Outcome> {
    sub.paused.then(|| Outcome::Parked {
        subscription: sub.id.clone(),
    })
}

/// Headers of hookrelay's own that a publisher set: the envelope is dead-lettered as invalid,
/// never delivered, since believing them would let a publisher skip the retry budget or
/// impersonate a fan-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Forged {
    #[error(
        "headers {ATTEMPTS_HEADER}, {DEFERRALS_HEADER}, {BUSY_DEFERRALS_HEADER}, \
         {FIRST_TRY_HEADER}, {WAITING_SINCE_HEADER}, {DUE_HEADER} and {ENDPOINT_HEADER} are \
         hookrelay's own and never on a first attempt"
    )]
    Accounting,
    #[error(
        "header {EVENT_ID_HEADER} is hookrelay's own, set only on fan-out deliveries, \
         whose message_id derives from it and x-subscription"
    )]
    EventId,
}

/// Headers only hookrelay writes are believed only where hookrelay put them. The accounting
/// headers travel only through the tiers, so a first-attempt lane never sees them from us; the
/// event id goes only on fan-out deliveries, whose id derives from it and the subscription.
/// (The tenant header is checked against the routing key when the envelope is read.)
fn check_provenance(envelope: &Envelope, lane: LaneKind) -> Result<(), Forged> {
    if lane == LaneKind::First
        && (envelope.attempts_made > 0
            || envelope.due_ms.is_some()
            || envelope.last_endpoint.is_some()
            || envelope.deferrals > 0
            || envelope.busy_deferrals > 0
            || envelope.first_try_ms.is_some()
            || envelope.waiting_since_ms.is_some())
    {
        return Err(Forged::Accounting);
    }
    if let Some(event_id) = &envelope.event_id {
        let derived = envelope
            .subscription
            .as_deref()
            .map(|sub| envelope::derived_id(event_id, sub));
        if derived.as_ref() != Some(&envelope.id) {
            return Err(Forged::EventId);
        }
    }
    Ok(())
}

/// Whether `envelope` is an event to fan out where it came from: one without a subscription,
/// never attempted and not itself a fan-out's delivery, fresh on a first-attempt lane or, on a
/// retry lane, back from a deferral (its tenant's subscriptions could not be read in time, so it
/// waited in a tier, which returns to the retry lane). Such an event is fanned out once: its
/// deliveries go to the first-attempt lane, never to a tier.
pub fn fans_out(envelope: &Envelope, lane: LaneKind) -> bool {
    envelope.subscription.is_none()
        && envelope.attempts_made == 0
        && envelope.event_id.is_none()
        && (lane == LaneKind::First || envelope.deferrals > 0)
}

/// An event without a subscription ([`fans_out`]) becomes one delivery per matching
/// subscription; anywhere else it is invalid.
fn fan_out(
    envelope: &Envelope,
    body: &[u8],
    lane: LaneKind,
    subscriptions: &Subscriptions,
) -> Outcome {
    if !fans_out(envelope, lane) {
        return Outcome::invalid(
            InvalidEnvelope::MissingSubscription.to_string(),
            envelope.attempts_made,
        );
    }
    let matching = subscriptions.matching(&envelope.tenant, &envelope.event_type);
    if matching.is_empty() {
        return Outcome::Cancelled {
            reason: CancelReason::Filtered,
            detail: format!(
                "no enabled subscription of tenant {:?} receives event type {:?}",
                envelope.tenant, envelope.event_type
            ),
        };
    }
    // The payload is read only when a matching subscription filters on it.
    let payload = Payload::new(body);
    let (targets, excluded): (Vec<_>, Vec<_>) = matching
        .iter()
        .partition(|s| payload.passes(s.payload_filter.as_ref()));
    Outcome::FanOut {
        subscriptions: targets.into_iter().map(|s| s.id.clone()).collect(),
        filtered: excluded.into_iter().map(|s| s.id.clone()).collect(),
    }
}

/// Whether a status is worth retrying. Redirects are not followed, so they are retried: the
/// endpoint may be mid-migration.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 300..=399 | 408 | 425 | 429 | 500..=599) || !(100..=599).contains(&status)
}

/// Decides what follows an attempt. `attempts_before` counts attempts made before this one.
///
/// A retry waits in the tier the schedule names for the next attempt; a `Retry-After` on 429 or
/// 503 (or, for a deferral, the time until the endpoint's breaker probes again) lengthens that
/// wait to the smallest tier not shorter than it, and never shortens it.
pub fn decide(ladder: &Ladder, attempts_before: u32, result: &AttemptResult) -> Outcome {
    let attempts_made = attempts_before.saturating_add(1);
    let (status, retry_after) = match result {
        AttemptResult::Response {
            status,
            retry_after,
        } => (Some(*status), *retry_after),
        _ => (None, None),
    };
    if let AttemptResult::EgressDenied(error) = result {
        return Outcome::Dead {
            reason: DeadReason::EgressDenied,
            status: None,
            error: error.clone(),
            attempts_made,
        };
    }
    if let Some(status) = status {
        if (200..=299).contains(&status) {
            return Outcome::Delivered { status };
        }
        if status == 410 {
            return Outcome::Dead {
                reason: DeadReason::Gone,
                status: Some(status),
                error: result.describe(),
                attempts_made,
            };
        }
        if !is_retryable_status(status) {
            return Outcome::Dead {
                reason: DeadReason::Rejected,
                status: Some(status),
                error: result.describe(),
                attempts_made,
            };
        }
    }
    let Some(scheduled) = ladder.tier_after(attempts_made) else {
        return Outcome::Dead {
            reason: DeadReason::Exhausted,
            status,
            error: result.describe(),
            attempts_made,
        };
    };
    let at_least = match (result, status, retry_after) {
        (_, Some(429 | 503), Some(wait)) => Some(wait),
        (
            AttemptResult::Deferred {
                cause: DeferCause::Outage { probe_in, .. },
                ..
            },
            _,
            _,
        ) => Some(*probe_in),
        _ => None,
    };
    let tier = match at_least {
        Some(wait) => scheduled.max(ladder.tier_not_shorter_than(wait)),
        None => scheduled,
    };
    Outcome::Retry {
        tier,
        attempts_made,
        error: result.describe(),
        deferred: false,
        busy_deferrals: 0,
    }
}

/// Decides what follows a deferral (no request made, so no attempt counted), by its cause:
///
/// - An outage (the breaker is open): a tier that grows with the envelope's deferrals (the
///   shortest after the first, the next after the second, up to the longest), so a long outage
///   does not cycle it every few seconds; never shorter than the wait until the breaker's next
///   probe.
/// - A busy endpoint (up, at a limit) that is making progress: with a turn booked at its
///   pace, the longest deferral queue that brings it back by then
///   ([`Ladder::deferral_within`]), so a backlog far above the cap returns spread over the
///   time the endpoint needs for it rather than all at once; else the deferral queue its busy
///   deferrals in a row call for ([`Ladder::deferral_after`]). Either way a healthy
///   endpoint's burst costs it a fraction of a second, not the shortest tier's wait.
/// - A rate limit: the shortest deferral queue, however often it was deferred.
/// - A busy endpoint that is stuck ([`is_stuck`]: its slots are held by attempts that do not
///   answer, as when it hangs) or a ladder without deferral queues: the shortest tier, as
///   before deferral queues existed; a stuck endpoint's backlog is not worth cycling through
///   the broker every fraction of a second.
///
/// Deferrals alone would never exhaust the budget, so the delivery horizon ends an outage's:
/// `horizon` after its first try (`now_ms` if this is its first), an envelope deferred for an
/// open breaker is dead-lettered `horizon_expired`, but only on fresh evidence: an attempt to
/// its endpoint that started after the envelope last went to wait, and failed ([`is_fresh`]),
/// and an outage longer than the schedule rides out: the endpoint failed at least as many
/// attempts in a row as the schedule gives an envelope. Without the first the envelope would
/// be declared dead on what its endpoint did before it waited, with fewer attempts than its
/// schedule, and for no reason it could have seen; without the second an event that came
/// during an outage the schedule promises to outlast (k failed requests, k no more than its
/// retries) would be dead-lettered as the outage ends. It waits again instead, for the probe
/// its tier outlasts. A deferral for a busy endpoint or a rate
/// limit is waiting one's turn, as in a lane, not trying: it never expires the envelope (its
/// endpoint is finishing attempts, or is stuck and soon opens its breaker).
pub fn defer(
    ladder: &Ladder,
    envelope: &Envelope,
    reason: &str,
    cause: DeferCause,
    horizon: Duration,
    now_ms: u64,
) -> Outcome {
    let deferrals = envelope.deferrals.saturating_add(1);
    let since = envelope.first_try_ms.unwrap_or(now_ms);
    let age = Duration::from_millis(now_ms.saturating_sub(since));
    if let DeferCause::Outage {
        failed_try_ms,
        failed_in_a_row,
        ..
    } = cause
        && age >= horizon
        && is_fresh(envelope, failed_try_ms)
        && failed_in_a_row >= ladder.max_attempts()
    {
        return Outcome::Dead {
            reason: DeadReason::Expired,
            status: None,
            error: format!(
                "{reason}; the delivery horizon {} passed with {} attempts made and {deferrals} \
                 deferrals, and its endpoint failed again since the envelope last waited \
                 ({failed_in_a_row} attempts in a row)",
                crate::units::fmt_duration(horizon),
                envelope.attempts_made
            ),
            attempts_made: envelope.attempts_made,
        };
    }
    let shortest = ladder.tier_not_shorter_than(Duration::ZERO);
    let (tier, busy_deferrals) = match cause {
        DeferCause::Outage { probe_in, .. } => {
            let escalated = usize::try_from(deferrals - 1)
                .ok()
                .and_then(|i| ladder.tier_at(i))
                .unwrap_or(ladder.tier_not_shorter_than(Duration::MAX));
            (escalated.max(ladder.tier_not_shorter_than(probe_in)), 0)
        }
        DeferCause::OverRate => match ladder.deferral_at(0) {
            Some(queue) => (queue, envelope.busy_deferrals.saturating_add(1)),
            None => (shortest, 0),
        },
        DeferCause::Busy {
            quiet_for,
            latency,
            turn_in,
        } => {
            let queue = if turn_in.is_zero() {
                ladder.deferral_after(envelope.busy_deferrals)
            } else {
                ladder.deferral_within(turn_in)
            };
            match queue {
                Some(queue) if !is_stuck(ladder, quiet_for, latency) => {
                    (queue, envelope.busy_deferrals.saturating_add(1))
                }
                _ => (shortest, 0),
            }
        }
    };
    Outcome::Retry {
        tier,
        attempts_made: envelope.attempts_made,
        error: reason.to_owned(),
        deferred: true,
        busy_deferrals,
    }
}

/// Whether an attempt to the endpoint that started at `failed_try_ms` and failed is fresh
/// evidence against it for `envelope`: it started no earlier than the envelope last went to
/// wait (its last attempt or deferral). An envelope written before that moment was recorded
/// is judged from when it fell due, which is later, so stricter; one that never waited (a
/// first attempt) has no evidence against it.
pub fn is_fresh(envelope: &Envelope, failed_try_ms: Option<u64>) -> bool {
    let Some(since) = envelope
        .waiting_since_ms
        .or(envelope.due_ms)
        .or(envelope.first_try_ms)
    else {
        return false;
    };
    failed_try_ms.is_some_and(|tried| tried >= since)
}

/// Whether a busy endpoint is stuck rather than slow: no progress for twice as long as its
/// attempts take, and for at least the shortest deferral queue's delay (an endpoint none of
/// whose attempts has finished yet is judged by that delay alone). A slow endpoint answering in
/// 2 s at its cap finishes an attempt every 2 s at worst, so it is never stuck; one that hangs
/// is stuck from the shortest deferral's delay after its first attempt, long before the
/// request timeout ends that attempt and its breaker opens.
pub fn is_stuck(ladder: &Ladder, quiet_for: Duration, latency: Duration) -> bool {
    let shortest = ladder
        .deferral_at(0)
        .map_or(Duration::ZERO, |q| ladder.tier(q).delay);
    quiet_for >= shortest.max(latency.saturating_mul(2))
}

/// Parses a `Retry-After` value: delay-seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ladder::Ladder;

    fn ladder() -> Ladder {
        Ladder::parse(include_str!("../../topology/ladder.toml")).unwrap()
    }

    fn status(code: u16) -> AttemptResult {
        AttemptResult::Response {
            status: code,
            retry_after: None,
        }
    }

    #[test]
    fn success_acks() {
        for code in [200, 201, 204, 299] {
            assert_eq!(
                decide(&ladder(), 0, &status(code)),
                Outcome::Delivered { status: code }
            );
        }
    }

    #[test]
    fn retryable_failures_walk_the_schedule() {
        let l = ladder();
        let retryable = [
            status(500),
            status(502),
            status(503),
            status(408),
            status(425),
            status(429),
            status(301),
            status(302),
            AttemptResult::Timeout,
            AttemptResult::Transport("connection refused".into()),
            AttemptResult::NotSent("no secret".into()),
        ];
        for result in &retryable {
            for (before, tier) in [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (8, 4)] {
                match decide(&l, before, result) {
                    Outcome::Retry {
                        tier: t,
                        attempts_made,
                        ..
                    } => {
                        assert_eq!((t.index(), attempts_made), (tier, before + 1), "{result:?}");
                    }
                    other => panic!("{result:?} after {before}: {other:?}"),
                }
            }
            match decide(&l, 9, result) {
                Outcome::Dead {
                    reason: DeadReason::Exhausted,
                    attempts_made: 10,
                    ..
                } => {}
                other => panic!("{result:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn other_client_errors_are_rejected_at_once() {
        for code in [400, 401, 403, 404, 405, 413, 422] {
            assert_eq!(
                decide(&ladder(), 0, &status(code)),
                Outcome::Dead {
                    reason: DeadReason::Rejected,
                    status: Some(code),
                    error: format!("HTTP {code}"),
                    attempts_made: 1,
                }
            );
        }
    }

    #[test]
    fn gone_and_egress_denials_end_at_once() {
        assert!(matches!(
            decide(&ladder(), 3, &status(410)),
            Outcome::Dead {
                reason: DeadReason::Gone,
                status: Some(410),
                attempts_made: 4,
                ..
            }
        ));
        let denied =
            AttemptResult::EgressDenied("egress denied: x resolves to 10.0.0.1 (private)".into());
        assert_eq!(
            decide(&ladder(), 0, &denied),
            Outcome::Dead {
                reason: DeadReason::EgressDenied,
                status: None,
                error: "egress denied: x resolves to 10.0.0.1 (private)".into(),
                attempts_made: 1,
            }
        );
    }

    #[test]
    fn retry_after_lengthens_never_shortens() {
        let l = ladder();
        let throttled = |code, secs| AttemptResult::Response {
            status: code,
            retry_after: Some(Duration::from_secs(secs)),
        };
        // After the first attempt the schedule says 10s; 30s asks for more: the 1m tier.
        assert!(matches!(
            decide(&l, 0, &throttled(429, 30)),
            Outcome::Retry { tier, .. } if tier.index() == 1
        ));
        assert!(matches!(
            decide(&l, 0, &throttled(503, 600)),
            Outcome::Retry { tier, .. } if tier.index() == 2
        ));
        // Longer than every tier: the longest.
        assert!(matches!(
            decide(&l, 0, &throttled(429, 86_400)),
            Outcome::Retry { tier, .. } if tier.index() == 4
        ));
        // Shorter than the schedule's wait: the schedule wins.
        assert!(matches!(
            decide(&l, 3, &throttled(429, 1)),
            Outcome::Retry { tier, .. } if tier.index() == 3
        ));
        // Only 429 and 503 carry a meaningful Retry-After.
        assert!(matches!(
            decide(&l, 0, &throttled(500, 600)),
            Outcome::Retry { tier, .. } if tier.index() == 0
        ));
        // It does not extend the budget.
        assert!(matches!(
            decide(&l, 9, &throttled(429, 5)),
            Outcome::Dead {
                reason: DeadReason::Exhausted,
                ..
            }
        ));
    }

    const OUTAGE: DeferCause = DeferCause::Outage {
        probe_in: Duration::ZERO,
        failed_try_ms: None,
        failed_in_a_row: 0,
    };
    const BUSY: DeferCause = DeferCause::BUSY;

    fn waits_in(outcome: &Outcome) -> (TierId, u32) {
        match outcome {
            Outcome::Retry {
                tier,
                busy_deferrals,
                deferred: true,
                ..
            } => (*tier, *busy_deferrals),
            other => panic!("a deferral: {other:?}"),
        }
    }

    #[test]
    fn a_deferral_is_not_an_attempt_escalates_and_ends_at_the_horizon() {
        let l = ladder();
        let horizon = l.span();
        let mut e = before_the_attempt::envelope(Some("s1"));
        e.attempts_made = 9; // one attempt left of the budget
        let now = 1_000_000_000_000;
        // Not counted: the attempts stay as they were, the deferral is marked.
        let first = defer(&l, &e, "deferred: x", OUTAGE, horizon, now);
        assert!(matches!(
            first,
            Outcome::Retry { tier, attempts_made: 9, deferred: true, .. } if tier.index() == 0
        ));
        // Each deferral waits longer, up to the longest tier.
        e.first_try_ms = Some(now);
        for (deferrals, tier) in [(1, 1), (2, 2), (3, 3), (4, 4), (40, 4)] {
            e.deferrals = deferrals;
            assert_eq!(
                waits_in(&defer(&l, &e, "deferred: x", OUTAGE, horizon, now + 1)),
                (l.tier_at(tier).unwrap(), 0)
            );
        }
        // The breaker probes again in 30 s: at least the 1m tier.
        e.deferrals = 0;
        let probe = DeferCause::Outage {
            probe_in: Duration::from_secs(30),
            failed_try_ms: None,
            failed_in_a_row: 0,
        };
        assert_eq!(
            waits_in(&defer(&l, &e, "deferred: x", probe, horizon, now)).0,
            l.tier_at(1).unwrap()
        );
        // Past the horizon, with no attempt to the endpoint since the envelope last went to
        // wait (none at all, or one before that), it waits again: no evidence, no expiry.
        e.deferrals = 7;
        let late = now + horizon.as_millis() as u64;
        e.waiting_since_ms = Some(late - 5_000);
        let tried = |ms| DeferCause::Outage {
            probe_in: Duration::ZERO,
            failed_try_ms: Some(ms),
            failed_in_a_row: l.max_attempts(),
        };
        for stale in [OUTAGE, tried(late - 5_001)] {
            assert!(
                matches!(
                    defer(&l, &e, "deferred: x", stale, horizon, late),
                    Outcome::Retry {
                        deferred: true,
                        attempts_made: 9,
                        ..
                    }
                ),
                "{stale:?}"
            );
        }
        // Fresh, but the endpoint failed fewer attempts in a row than the schedule rides out:
        // an outage the schedule promises to outlast ends no envelope.
        let short = DeferCause::Outage {
            probe_in: Duration::ZERO,
            failed_try_ms: Some(late - 5_000),
            failed_in_a_row: l.max_attempts() - 1,
        };
        assert!(matches!(
            defer(&l, &e, "deferred: x", short, horizon, late),
            Outcome::Retry { deferred: true, .. }
        ));
        // An attempt to it that started since and failed, in an outage longer than the
        // schedule: the horizon ends it, however few attempts the envelope made.
        match defer(&l, &e, "deferred: x", tried(late - 5_000), horizon, late) {
            Outcome::Dead {
                reason: DeadReason::Expired,
                attempts_made: 9,
                error,
                ..
            } => assert!(
                error.contains("with 9 attempts made and 8 deferrals, and its endpoint failed"),
                "{error}"
            ),
            other => panic!("{other:?}"),
        }
        // Not yet at the horizon, fresh evidence or not: a deferral.
        assert!(matches!(
            defer(&l, &e, "deferred: x", tried(late), horizon, late - 1),
            Outcome::Retry { deferred: true, .. }
        ));
        // An envelope written before the moment was recorded is judged from when it fell due.
        e.waiting_since_ms = None;
        e.due_ms = Some(late - 1_000);
        assert!(!is_fresh(&e, Some(late - 1_001)));
        assert!(is_fresh(&e, Some(late - 1_000)));
        // One that never waited has none against it: not even with a zero horizon.
        let fresh_one = before_the_attempt::envelope(Some("s1"));
        assert!(!is_fresh(&fresh_one, Some(now)));
        assert!(matches!(
            defer(
                &l,
                &fresh_one,
                "deferred: x",
                tried(now),
                Duration::ZERO,
                now
            ),
            Outcome::Retry { deferred: true, .. }
        ));
        // Waiting a busy endpoint's turn, or its rate's, is not trying: past the horizon,
        // such a deferral is still a deferral.
        for cause in [BUSY, DeferCause::OverRate] {
            assert!(
                matches!(
                    defer(&l, &e, "deferred: x", cause, horizon, late),
                    Outcome::Retry { deferred: true, .. }
                ),
                "{cause:?}"
            );
        }
    }

    #[test]
    fn a_busy_endpoint_defers_into_short_queues_that_grow_with_busy_deferrals_in_a_row() {
        let l = ladder();
        let horizon = l.span();
        let now = 1_000_000_000_000;
        let mut e = before_the_attempt::envelope(Some("s1"));
        e.deferrals = 40; // an outage's deferrals before do not lengthen a busy one's wait
        let queue = |i| l.deferral_at(i).unwrap();
        // 250ms, 500ms, 1s, then 5s for good; the count in a row goes with it.
        for (before, expected) in [(0, 0), (1, 1), (2, 2), (3, 3), (4, 3), (100, 3)] {
            e.busy_deferrals = before;
            let (tier, busy) = waits_in(&defer(&l, &e, "deferred: x", BUSY, horizon, now));
            assert_eq!(tier, queue(expected), "after {before} in a row");
            assert!(l.is_deferral(tier));
            assert_eq!(busy, before + 1);
        }
        assert_eq!(l.tier(queue(0)).name, "defer-250ms");
        // Stuck: no progress for as long as the shortest deferral queue waits (its attempts do
        // not answer). The shortest tier, and the count in a row starts over.
        e.busy_deferrals = 2;
        let busy = |quiet_ms, latency_ms| DeferCause::Busy {
            quiet_for: Duration::from_millis(quiet_ms),
            latency: Duration::from_millis(latency_ms),
            turn_in: Duration::ZERO,
        };
        assert_eq!(
            waits_in(&defer(&l, &e, "deferred: x", busy(250, 0), horizon, now)),
            (l.tier_at(0).unwrap(), 0)
        );
        assert_eq!(
            waits_in(&defer(&l, &e, "deferred: x", busy(249, 0), horizon, now)).0,
            queue(2)
        );
        // A slow endpoint is judged by its own latency: quiet for 1.5 s while its attempts take
        // 1 s is slow, not stuck; quiet for 2 s is stuck.
        assert!(!is_stuck(
            &l,
            Duration::from_millis(1500),
            Duration::from_secs(1)
        ));
        assert!(is_stuck(&l, Duration::from_secs(2), Duration::from_secs(1)));
        assert!(!is_stuck(
            &l,
            Duration::from_millis(200),
            Duration::from_millis(2)
        ));
        assert_eq!(
            waits_in(&defer(
                &l,
                &e,
                "deferred: x",
                busy(1500, 1000),
                horizon,
                now
            ))
            .0,
            queue(2)
        );
        // An outage starts the count over too.
        assert_eq!(
            waits_in(&defer(&l, &e, "deferred: x", OUTAGE, horizon, now)).1,
            0
        );
        // A rate deferral is never escalated: the shortest deferral queue.
        e.busy_deferrals = 3;
        assert_eq!(
            waits_in(&defer(
                &l,
                &e,
                "deferred: x",
                DeferCause::OverRate,
                horizon,
                now
            )),
            (queue(0), 4)
        );
        // A ladder without deferral queues: the shortest tier, as before they existed.
        let none = ladder().with_deferrals(&[]).unwrap();
        assert_eq!(none.deferral_after(0), None);
        assert_eq!(
            waits_in(&defer(&none, &e, "deferred: x", BUSY, horizon, now)),
            (none.tier_at(0).unwrap(), 0)
        );
        // An attempt's retry carries no busy count.
        assert!(matches!(
            decide(&l, 0, &status(503)),
            Outcome::Retry {
                busy_deferrals: 0,
                deferred: false,
                ..
            }
        ));
    }

    #[test]
    fn retry_after_parses_seconds_and_dates() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    mod before_the_attempt {
        use super::*;
        use crate::subscriptions::SecretRef;

        #[test]
        fn an_event_is_screened_once_where_it_is_first_routed() {
            let order = crate::catalog::EventType {
                name: "order.paid".into(),
                description: String::new(),
                mode: ValidationMode::Enforce,
                deprecated: false,
                versions: vec![crate::catalog::SchemaVersion {
                    version: 1,
                    schema: serde_json::json!({"required": ["amount"]}),
                    example: serde_json::json!({"amount": 1}),
                }],
            };
            let (catalog, _) = Catalog::compile(std::slice::from_ref(&order), ValidationMode::Off);
            let bad = br#"{"total":1}"#;
            for fresh in [envelope(None), envelope(Some("s1"))] {
                assert_eq!(
                    screen(&fresh, br#"{"amount":1}"#, LaneKind::First, &catalog),
                    Screen::Pass
                );
                match screen(&fresh, bad, LaneKind::First, &catalog) {
                    Screen::Refuse {
                        outcome:
                            Outcome::Dead {
                                reason: DeadReason::SchemaInvalid,
                                error,
                                ..
                            },
                        listed: true,
                        ..
                    } => assert!(error.contains("\"amount\""), "{error}"),
                    other => panic!("{other:?}"),
                }
                // Retries, and anything not fresh on a first-attempt lane, pass untouched.
                assert_eq!(screen(&fresh, bad, LaneKind::Retry, &catalog), Screen::Pass);
            }
            let mut fanned = envelope(Some("s1"));
            fanned.event_id = Some("evt_0".into());
            assert_eq!(
                screen(&fanned, bad, LaneKind::First, &catalog),
                Screen::Pass
            );
            let mut warned = order;
            warned.mode = ValidationMode::Warn;
            let (catalog, _) = Catalog::compile(&[warned], ValidationMode::Off);
            assert!(matches!(
                screen(&envelope(None), bad, LaneKind::First, &catalog),
                Screen::Warn { listed: true, .. }
            ));
        }

        pub(super) fn envelope(subscription: Option<&str>) -> Envelope {
            Envelope {
                id: crate::contract::envelope::EnvelopeId::parse("evt_1").unwrap(),
                tenant: "acme".into(),
                event_type: "order.paid".into(),
                subscription: subscription.map(str::to_owned),
                event_id: None,
                attempts_made: 0,
                due_ms: None,
                last_endpoint: None,
                deferrals: 0,
                first_try_ms: None,
                waiting_since_ms: None,
                busy_deferrals: 0,
            }
        }

        fn sub(id: &str, tenant: &str) -> Subscription {
            Subscription::new(
                id,
                tenant,
                "https://example.com/hook".parse().unwrap(),
                SecretRef::Env("S".into()),
            )
        }

        fn subs(list: Vec<Subscription>) -> Subscriptions {
            Subscriptions::from_list(list)
        }

        fn settled(route: Route) -> Outcome {
            match route {
                Route::Settle(outcome) => outcome,
                Route::Attempt(sub) => panic!("attempt to {}", sub.id),
            }
        }

        #[test]
        fn a_known_subscription_of_the_tenant_is_attempted() {
            let all = subs(vec![sub("s1", "acme")]);
            match route(
                &envelope(Some("s1")),
                b"{}",
                LaneKind::Retry,
                &all,
                &ladder(),
            ) {
                Route::Attempt(s) => assert_eq!(s.id, "s1"),
                other => panic!("{other:?}"),
            }
        }

        #[test]
        fn an_unknown_subscription_is_invalid_unless_it_existed_before() {
            let none = subs(vec![]);
            let first = envelope(Some("gone"));
            assert!(matches!(
                settled(route(&first, b"{}", LaneKind::First, &none, &ladder())),
                Outcome::Dead { reason: DeadReason::Invalid, ref error, attempts_made: 0, .. }
                    if error == "unknown subscription \"gone\""
            ));
            let mut retried = envelope(Some("gone"));
            retried.attempts_made = 2;
            assert!(matches!(
                settled(route(&retried, b"{}", LaneKind::Retry, &none, &ladder())),
                Outcome::Cancelled {
                    reason: CancelReason::Deleted,
                    ..
                }
            ));
            // A delivery fan-out made: its id derives from the event's and the subscription's.
            let mut fanned = envelope(Some("gone"));
            fanned.event_id = Some("evt_0".into());
            fanned.id = crate::contract::envelope::derived_id("evt_0", "gone");
            assert!(matches!(
                settled(route(&fanned, b"{}", LaneKind::First, &none, &ladder())),
                Outcome::Cancelled {
                    reason: CancelReason::Deleted,
                    ..
                }
            ));
        }

        fn is_invalid_with(route: Route, expected: &str) -> bool {
            matches!(
                settled(route),
                Outcome::Dead { reason: DeadReason::Invalid, ref error, .. } if error.contains(expected)
            )
        }

        #[test]
        fn a_forged_event_id_does_not_make_an_unknown_subscription_deleted() {
            let none = subs(vec![]);
            let all = subs(vec![sub("s1", "acme")]);
            // The producer's own id with an event id: not a delivery fan-out made.
            let mut forged = envelope(Some("gone"));
            forged.event_id = Some("evt_0".into());
            for lane in [LaneKind::First, LaneKind::Retry] {
                assert!(is_invalid_with(
                    route(&forged, b"{}", lane, &none, &ladder()),
                    "header x-hookrelay-event-id"
                ));
            }
            // Not even to a subscription that exists.
            let mut to_known = envelope(Some("s1"));
            to_known.event_id = Some("evt_0".into());
            assert!(is_invalid_with(
                route(&to_known, b"{}", LaneKind::First, &all, &ladder()),
                "header x-hookrelay-event-id"
            ));
            // Derived for another subscription.
            let mut other = envelope(Some("gone"));
            other.event_id = Some("evt_0".into());
            other.id = crate::contract::envelope::derived_id("evt_0", "s1");
            assert!(is_invalid_with(
                route(&other, b"{}", LaneKind::First, &none, &ladder()),
                "header x-hookrelay-event-id"
            ));
        }

        #[test]
        fn accounting_headers_are_not_believed_on_a_first_attempt() {
            let none = subs(vec![]);
            let all = subs(vec![sub("s1", "acme")]);
            let forgeries: [fn(&mut Envelope); 5] = [
                |e| e.deferrals = 2,
                |e| e.first_try_ms = Some(1),
                |e| e.attempts_made = 3,
                |e| e.due_ms = Some(1),
                |e| e.last_endpoint = Some("h#00000000".into()),
            ];
            for forge in forgeries {
                for subs in [&none, &all] {
                    let mut e = envelope(Some("s1"));
                    forge(&mut e);
                    // Not "deleted", not an attempt with a forged count: invalid.
                    assert!(is_invalid_with(
                        route(&e, b"{}", LaneKind::First, subs, &ladder()),
                        "never on a first attempt"
                    ));
                }
            }
            // On the retry lane hookrelay wrote them: believed.
            let mut retried = envelope(Some("s1"));
            retried.attempts_made = 3;
            retried.due_ms = Some(1);
            assert!(matches!(
                route(&retried, b"{}", LaneKind::Retry, &all, &ladder()),
                Route::Attempt(_)
            ));
        }

        #[test]
        fn another_tenants_subscription_is_invalid() {
            let all = subs(vec![sub("s1", "other")]);
            assert!(matches!(
                settled(route(&envelope(Some("s1")), b"{}", LaneKind::First, &all, &ladder())),
                Outcome::Dead { reason: DeadReason::Invalid, ref error, .. }
                    if error.contains("belongs to tenant \"other\", not \"acme\"")
            ));
        }

        #[test]
        fn disabled_and_filtered_subscriptions_cancel() {
            let mut disabled = sub("s1", "acme");
            disabled.enabled = false;
            assert!(matches!(
                settled(route(
                    &envelope(Some("s1")),
                    b"{}",
                    LaneKind::First,
                    &subs(vec![disabled]),
                    &ladder()
                )),
                Outcome::Cancelled {
                    reason: CancelReason::Disabled,
                    ..
                }
            ));
            let mut filtered = sub("s1", "acme");
            filtered.event_types = Some(vec![crate::subscriptions::EventFilter::Exact(
                "user.created".into(),
            )]);
            assert!(matches!(
                settled(route(
                    &envelope(Some("s1")),
                    b"{}",
                    LaneKind::First,
                    &subs(vec![filtered]),
                    &ladder()
                )),
                Outcome::Cancelled {
                    reason: CancelReason::Filtered,
                    ..
                }
            ));
        }

        #[test]
        fn a_paused_subscription_parks_whatever_arrives_unless_disabled() {
            let mut paused = sub("s1", "acme");
            paused.paused = true;
            paused.event_types = Some(vec![crate::subscriptions::EventFilter::Exact(
                "user.created".into(),
            )]);
            let all = subs(vec![paused.clone()]);
            let parked = Outcome::Parked {
                subscription: "s1".into(),
            };
            // Fresh, filtered out, retried, or with its budget spent: parked, decided later.
            let mut retried = envelope(Some("s1"));
            retried.attempts_made = ladder().max_attempts();
            assert_eq!(
                settled(route(
                    &envelope(Some("s1")),
                    b"{}",
                    LaneKind::First,
                    &all,
                    &ladder()
                )),
                parked
            );
            assert_eq!(
                settled(route(&retried, b"{}", LaneKind::Retry, &all, &ladder())),
                parked
            );
            // Forgeries are still invalid; disabled still cancels.
            assert!(is_invalid_with(
                route(&retried, b"{}", LaneKind::First, &all, &ladder()),
                "never on a first attempt"
            ));
            paused.enabled = false;
            assert!(matches!(
                settled(route(
                    &envelope(Some("s1")),
                    b"{}",
                    LaneKind::First,
                    &subs(vec![paused]),
                    &ladder()
                )),
                Outcome::Cancelled {
                    reason: CancelReason::Disabled,
                    ..
                }
            ));
        }

        #[test]
        fn an_envelope_arriving_with_its_budget_spent_is_exhausted_without_an_attempt() {
            let all = subs(vec![sub("s1", "acme")]);
            let mut spent = envelope(Some("s1"));
            spent.attempts_made = ladder().max_attempts();
            assert!(matches!(
                settled(route(&spent, b"{}", LaneKind::Retry, &all, &ladder())),
                Outcome::Dead {
                    reason: DeadReason::Exhausted,
                    status: None,
                    attempts_made: 10,
                    ..
                }
            ));
            spent.attempts_made -= 1;
            assert!(matches!(
                route(&spent, b"{}", LaneKind::Retry, &all, &ladder()),
                Route::Attempt(_)
            ));
        }

        #[test]
        fn a_payload_filter_leaves_the_event_out_of_a_fan_out_and_cancels_a_delivery() {
            let mut big = sub("big", "acme");
            big.payload_filter = Some(
                crate::subscriptions::PayloadFilter::compile(
                    &serde_json::json!({"amount": {"$gt": 100}}),
                )
                .unwrap(),
            );
            let all = subs(vec![sub("every", "acme"), big]);
            let fan_out = |body: &[u8]| {
                settled(route(
                    &envelope(None),
                    body,
                    LaneKind::First,
                    &all,
                    &ladder(),
                ))
            };
            assert_eq!(
                fan_out(br#"{"amount": 150}"#),
                Outcome::FanOut {
                    subscriptions: vec!["big".into(), "every".into()],
                    filtered: vec![],
                }
            );
            for small in [&br#"{"amount": 50}"#[..], b"{}", b"not json"] {
                assert_eq!(
                    fan_out(small),
                    Outcome::FanOut {
                        subscriptions: vec!["every".into()],
                        filtered: vec!["big".into()],
                    }
                );
            }
            assert!(matches!(
                route(
                    &envelope(Some("big")),
                    br#"{"amount": 101}"#,
                    LaneKind::First,
                    &all,
                    &ladder()
                ),
                Route::Attempt(_)
            ));
            assert!(matches!(
                settled(route(&envelope(Some("big")), br#"{"amount": 1}"#, LaneKind::Retry, &all, &ladder())),
                Outcome::Cancelled { reason: CancelReason::Filtered, detail } if detail.contains("payload filter")
            ));
        }

        #[test]
        fn an_event_fans_out_only_when_fresh_on_a_first_attempt_lane_or_back_from_a_deferral() {
            let all = subs(vec![
                sub("s2", "acme"),
                sub("s1", "acme"),
                sub("x", "other"),
            ]);
            assert_eq!(
                settled(route(
                    &envelope(None),
                    b"{}",
                    LaneKind::First,
                    &all,
                    &ladder()
                )),
                Outcome::FanOut {
                    subscriptions: vec!["s1".into(), "s2".into()],
                    filtered: vec![],
                }
            );
            let invalid = |e: &Envelope, lane| {
                matches!(
                    settled(route(e, b"{}", lane, &all, &ladder())),
                    Outcome::Dead {
                        reason: DeadReason::Invalid,
                        ..
                    }
                )
            };
            assert!(invalid(&envelope(None), LaneKind::Retry));
            // Back from a deferral (the store could not give its tenant's list in time): it
            // fans out from the retry lane; attempted, or a fan-out's delivery, it never does.
            let mut deferred = envelope(None);
            deferred.deferrals = 1;
            assert!(matches!(
                settled(route(&deferred, b"{}", LaneKind::Retry, &all, &ladder())),
                Outcome::FanOut { .. }
            ));
            deferred.attempts_made = 1;
            assert!(invalid(&deferred, LaneKind::Retry));
            let mut retried = envelope(None);
            retried.attempts_made = 1;
            assert!(invalid(&retried, LaneKind::First));
            let mut child = envelope(None);
            child.event_id = Some("evt_0".into());
            assert!(invalid(&child, LaneKind::First));
            let mut nobody = envelope(None);
            nobody.event_type = "user.created".into();
            nobody.tenant = "lonely".into();
            assert!(matches!(
                settled(route(&nobody, b"{}", LaneKind::First, &all, &ladder())),
                Outcome::Cancelled {
                    reason: CancelReason::Filtered,
                    ..
                }
            ));
        }
    }
}
