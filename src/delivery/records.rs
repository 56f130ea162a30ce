//! A settled delivery's attempt-log records: made, and stored before the delivery is acked.

use lapin::BasicProperties;
use tokio::time::Instant;

use crate::broker::publish::PublishError;
use crate::contract::envelope::{self, Envelope};
use crate::contract::headers;
use crate::delivery::dispatch::Attempted;
use crate::delivery::lane::Lane;
use crate::delivery::route::{AttemptResult, Outcome};
use crate::delivery::settle::Settler;
use crate::observe::events::{self, AttemptRecord, OperationalEvent};
use crate::units::now_rfc3339;

impl Settler {
    /// Stores a settled delivery's records (for a fan-out, also those of the subscriptions its
    /// filters left out), waiting for the broker's confirm within the lease: `false` when they
    /// were not stored, and the delivery must not be acked.
    pub(crate) async fn log(
        &self,
        lane: &Lane,
        properties: &BasicProperties,
        envelope: Option<&Envelope>,
        attempted: &Attempted,
        lease_end: Instant,
    ) -> bool {
        let outcome = &attempted.outcome;
        let key = events::routing_key(outcome.kind(), envelope.map(|e| e.tenant.as_str()));
        let mut records = Vec::new();
        if self.notices.attempt_wanted(&key) {
            records.push(self.record(lane, properties, envelope, attempted));
        }
        if let (Outcome::FanOut { filtered, .. }, Some(envelope)) = (outcome, envelope) {
            records.extend(self.filtered_records(lane, envelope, filtered));
        }
        if records.is_empty() {
            return true;
        }
        tokio::select! {
            stored = tokio::time::timeout_at(lease_end, self.notices.log(records)) => {
                stored.unwrap_or(false)
            }
            () = self.abandon.cancelled() => false,
        }
    }

    /// The subscriptions a fan-out left out by their payload filters, in the attempt log as
    /// cancelled deliveries of the event (attempt 0: no request made), beside its fan-out.
    fn filtered_records(
        &self,
        lane: &Lane,
        envelope: &Envelope,
        filtered: &[String],
    ) -> Vec<AttemptRecord> {
        let key = events::routing_key("cancelled", Some(&envelope.tenant));
        if filtered.is_empty() || !self.notices.attempt_wanted(&key) {
            return Vec::new();
        }
        filtered
            .iter()
            .map(|sub| AttemptRecord {
                envelope: Some(envelope::derived_id(envelope.id.as_str(), sub).to_string()),
                event: Some(envelope.id.to_string()),
                tenant: Some(envelope.tenant.clone()),
                subscription: Some(sub.clone()),
                attempt: 0,
                status: None,
                error: Some(format!(
                    "the payload filter of subscription {sub:?} excludes it"
                )),
                latency_ms: None,
                outcome: "cancelled".into(),
                tier: None,
                lane: lane.queue.clone(),
                redrives: 0,
                replay: None,
                at: now_rfc3339(),
            })
            .collect()
    }

    /// The attempt-log record of a settled delivery.
    fn record(
        &self,
        lane: &Lane,
        properties: &BasicProperties,
        envelope: Option<&Envelope>,
        attempted: &Attempted,
    ) -> AttemptRecord {
        let (status, error) = match (&attempted.result, &attempted.outcome) {
            (Some(AttemptResult::Response { status, .. }), o) => (
                Some(*status),
                (!matches!(o, Outcome::Delivered { .. })).then(|| format!("HTTP {status}")),
            ),
            (Some(other), _) => (None, Some(other.describe())),
            (None, Outcome::Dead { error, .. }) => (None, Some(error.clone())),
            (None, Outcome::Cancelled { detail, .. }) => (None, Some(detail.clone())),
            (None, _) => (None, None),
        };
        // A deferral made no request: attempt 0, as for no attempt at all.
        let attempt = match &attempted.result {
            Some(AttemptResult::Deferred { .. }) | None => 0,
            Some(_) => envelope.map_or(0, |e| e.attempts_made + 1),
        };
        AttemptRecord {
            envelope: properties.message_id().as_ref().map(|m| m.to_string()),
            event: envelope.and_then(|e| e.event_id.clone()),
            tenant: envelope.map(|e| e.tenant.clone()),
            subscription: envelope.and_then(|e| e.subscription.clone()),
            attempt,
            status,
            error,
            latency_ms: attempted.latency.map(|l| l.as_millis() as u64),
            outcome: attempted.outcome.kind().to_owned(),
            tier: match &attempted.outcome {
                Outcome::Retry { tier, .. } => Some(self.ladder.tier(*tier).name.clone()),
                _ => None,
            },
            lane: lane.queue.clone(),
            redrives: headers::read_u64_header(properties, headers::REDRIVES_HEADER)
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            replay: crate::contract::headers::replay_of(properties).map(str::to_owned),
            at: now_rfc3339(),
        }
    }

    /// Stores a cancellation's attempt-log record and `delivery.cancelled` event through the
    /// notices path, waiting for both confirms.
    pub(crate) async fn record_cancellation(
        &self,
        lane: &Lane,
        properties: &BasicProperties,
        envelope: Option<&Envelope>,
        attempted: &Attempted,
    ) -> Result<(), PublishError> {
        let Outcome::Cancelled { reason, detail } = &attempted.outcome else {
            return Ok(());
        };
        let record = self.record(lane, properties, envelope, attempted);
        let mut event = OperationalEvent::new("delivery.cancelled", reason.as_str()).detail(detail);
        if let Some(e) = envelope {
            event = event.about(&e.tenant, e.subscription.as_deref(), e.id.as_str());
        }
        self.notices.store(&record, &event).await
    }
}
