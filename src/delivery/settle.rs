//! Carrying a decision out. [`replacement`] builds, without I/O, what must be in the broker
//! before the delivery may be acked (a retry in its tier, a dead letter with its reason, one
//! delivery per fan-out target, or for a cancellation the records that alone hold it);
//! `Dispatcher::settle` publishes that, waits for every confirm, and only then acks. Anything
//! unconfirmed returns the delivery to its lane instead.

use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::{Acker, BasicProperties};
use tracing::{debug, error, info, warn};

use crate::broker::publish::PublishError;
use crate::contract::envelope::{self, Envelope};
use crate::contract::headers::{self, DeadLetter};
use crate::contract::ladder::Ladder;
use crate::delivery::dispatch::{Attempted, Dispatcher};
use crate::delivery::lane::Lane;
use crate::delivery::route::{AttemptResult, DeadReason, Outcome};
use crate::observe::events::{self, AttemptRecord, OperationalEvent};
use crate::units::{now_ms, now_rfc3339};

/// One message to publish, confirmed, before the original is acked. Its body is the
/// original's.
#[derive(Debug, Clone, PartialEq)]
pub struct Republish {
    pub exchange: String,
    pub routing_key: String,
    pub properties: BasicProperties,
}

/// What must be stored before a delivery may be acked.
#[derive(Debug, Clone, PartialEq)]
pub enum Replacement {
    /// Delivered: nothing.
    Nothing,
    /// Cancelled: its attempt-log record and `delivery.cancelled` event, confirmed.
    Records,
    /// A retry, a dead letter, or fan-out deliveries; `target` names where, for logs and the
    /// republish-failure metric (the tier, `dead` or `ingress`).
    Publish {
        target: String,
        messages: Vec<Republish>,
    },
}

/// Why a decision cannot be carried out; the delivery goes back to its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsettleable(pub &'static str);

/// Builds what replaces a delivery in the broker. `envelope` is `None` for a message that is
/// not a valid envelope (only a dead letter can replace it); `endpoint` is where the attempt
/// went; `now_ms` stamps the retry's due time.
pub fn replacement(
    ladder: &Ladder,
    outcome: &Outcome,
    properties: &BasicProperties,
    envelope: Option<&Envelope>,
    endpoint: Option<&str>,
    now_ms: u64,
) -> Result<Replacement, Unsettleable> {
    Ok(match outcome {
        Outcome::Delivered { .. } => Replacement::Nothing,
        Outcome::Cancelled { .. } => Replacement::Records,
        Outcome::Retry {
            tier,
            attempts_made,
            error,
        } => {
            let envelope = envelope.ok_or(Unsettleable("retry without envelope"))?;
            let spec = ladder.tier(*tier);
            Replacement::Publish {
                target: spec.name.clone(),
                messages: vec![Republish {
                    exchange: ladder.delay_exchange(),
                    routing_key: ladder.tier_routing_key(*tier, &envelope.tenant),
                    properties: headers::retry_properties(
                        properties,
                        &envelope.tenant,
                        *attempts_made,
                        now_ms + spec.delay.as_millis() as u64,
                        error,
                        endpoint,
                    ),
                }],
            }
        }
        Outcome::Dead {
            reason,
            status,
            error,
            attempts_made,
        } => Replacement::Publish {
            target: "dead".into(),
            messages: vec![Republish {
                exchange: String::new(),
                routing_key: ladder.dead(),
                properties: headers::dead_properties(
                    properties,
                    &DeadLetter {
                        reason: reason.as_str(),
                        error,
                        status: *status,
                        attempts_made: *attempts_made,
                        tenant: envelope.map(|e| e.tenant.as_str()),
                    },
                ),
            }],
        },
        Outcome::FanOut { subscriptions } => {
            let envelope = envelope.ok_or(Unsettleable("fan-out without envelope"))?;
            Replacement::Publish {
                target: "ingress".into(),
                messages: subscriptions
                    .iter()
                    .map(|sub| Republish {
                        exchange: ladder.ingress(),
                        routing_key: envelope.tenant.clone(),
                        properties: headers::fanout_properties(
                            properties,
                            &envelope::derived_id(envelope.id.as_str(), sub),
                            sub,
                            envelope.id.as_str(),
                        ),
                    })
                    .collect(),
            }
        }
    })
}

impl Dispatcher {
    /// Carries the decision out. Acks only after what replaces the delivery was confirmed.
    pub(crate) async fn settle(
        &self,
        lane: &Lane,
        acker: &Acker,
        properties: &BasicProperties,
        body: &[u8],
        envelope: Option<&Envelope>,
        attempted: Attempted,
    ) {
        let id = properties
            .message_id()
            .as_ref()
            .map_or("(none)", |m| m.as_str());
        let outcome = &attempted.outcome;
        let replacement = match replacement(
            &self.ladder,
            outcome,
            properties,
            envelope,
            attempted.endpoint.as_deref(),
            now_ms(),
        ) {
            Ok(r) => r,
            Err(Unsettleable(why)) => {
                error!(envelope = %id, why, "Cannot settle; keeping the message in its lane");
                return self.requeue(acker, why).await;
            }
        };
        let stored: Result<(), (PublishError, String)> = match replacement {
            Replacement::Nothing => Ok(()),
            // A cancellation is a terminal state only the records hold: they are confirmed
            // before the ack, as a dead letter is.
            Replacement::Records => self
                .record_cancellation(lane, properties, envelope, &attempted)
                .await
                .map_err(|e| (e, "attempts".to_owned())),
            Replacement::Publish { target, messages } => {
                let sends = messages.into_iter().map(|m| async move {
                    self.publisher
                        .publish(&m.exchange, &m.routing_key, body, m.properties)
                        .await
                });
                futures_util::future::try_join_all(sends)
                    .await
                    .map(|_| ())
                    .map_err(|e| (e, target))
            }
        };
        if let Err((e, target)) = stored {
            self.metrics
                .republish_failures
                .with_label_values(&[target.as_str()])
                .inc();
            error!(envelope = %id, target, error = %e, "Republish not confirmed; returning the message to its lane");
            return self.requeue(acker, "republish not confirmed").await;
        }
        self.settled(lane, id, envelope, &attempted);
        if let Err(e) = acker.ack(BasicAckOptions::default()).await {
            // The channel is gone; the broker redelivers the message (a duplicate, never a
            // loss).
            warn!(envelope = %id, error = %e, "Ack failed; the broker will redeliver");
        }
        if matches!(outcome, Outcome::Cancelled { .. }) {
            return;
        }
        if let Some(envelope) = envelope {
            self.announce(envelope, outcome);
        }
        let key = events::routing_key(outcome.kind(), envelope.map(|e| e.tenant.as_str()));
        if self.notices.attempt_wanted(&key) {
            self.notices
                .attempt(&self.record(lane, properties, envelope, &attempted));
        }
    }

    /// Logs and counts a settled delivery, once what replaces it is stored.
    fn settled(&self, lane: &Lane, id: &str, envelope: Option<&Envelope>, attempted: &Attempted) {
        let outcome = &attempted.outcome;
        match outcome {
            Outcome::Delivered { status } => {
                debug!(envelope = %id, status, "Delivered");
                lane.metrics.delivered.inc();
                return;
            }
            Outcome::Cancelled { reason, detail } => {
                info!(envelope = %id, reason = reason.as_str(), detail = %detail, "Cancelled");
                self.metrics
                    .cancellations
                    .with_label_values(&[reason.as_str()])
                    .inc();
            }
            Outcome::FanOut { subscriptions } => {
                let event = envelope.map_or(id, |e| e.id.as_str());
                info!(event = %event, deliveries = subscriptions.len(), "Fanned out");
            }
            Outcome::Retry {
                tier,
                attempts_made,
                error,
            } => {
                let tier = &self.ladder.tier(*tier).name;
                self.metrics
                    .retries
                    .with_label_values(&[tier.as_str()])
                    .inc();
                info!(envelope = %id, tier = %tier, attempts = attempts_made, error = %error, "Scheduled retry");
            }
            Outcome::Dead {
                reason,
                status,
                error,
                attempts_made,
            } => {
                if let (DeadReason::Rejected, Some(status)) = (reason, status) {
                    self.metrics
                        .rejections
                        .with_label_values(&[&status.to_string()])
                        .inc();
                }
                warn!(envelope = %id, reason = reason.as_str(), attempts = attempts_made, error = %error, "Dead-lettered");
            }
        }
        self.metrics
            .outcomes
            .with_label_values(&[lane.label(), outcome.kind()])
            .inc();
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
        let attempt = match &attempted.result {
            Some(_) => envelope.map_or(0, |e| e.attempts_made + 1),
            None => 0,
        };
        AttemptRecord {
            envelope: properties.message_id().as_ref().map(|m| m.to_string()),
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
            at: now_rfc3339(),
        }
    }

    /// Stores a cancellation's attempt-log record and `delivery.cancelled` event through the
    /// notices path, waiting for both confirms.
    async fn record_cancellation(
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

    /// The operational events an outcome calls for.
    fn announce(&self, envelope: &Envelope, outcome: &Outcome) {
        let event = match outcome {
            Outcome::Dead {
                reason: DeadReason::Gone,
                error,
                ..
            } => OperationalEvent::new("subscription.gone", "gone").detail(error),
            Outcome::Dead {
                reason: DeadReason::Exhausted,
                error,
                ..
            } => OperationalEvent::new("delivery.exhausted", "exhausted").detail(error),
            _ => return,
        };
        self.notices.operational(event.about(
            &envelope.tenant,
            envelope.subscription.as_deref(),
            envelope.id.as_str(),
        ));
    }

    /// Returns a delivery to its lane after a pause, so a persistent fault is not a hot loop.
    async fn requeue(&self, acker: &Acker, why: &str) {
        tokio::time::sleep(self.config.worker.requeue_delay).await;
        if let Err(e) = acker
            .nack(BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            })
            .await
        {
            warn!(why, error = %e, "Nack failed; the broker will redeliver when the channel closes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::envelope::NewEvent;
    use crate::contract::headers::{
        ATTEMPTS_HEADER, DUE_HEADER, ENDPOINT_HEADER, EVENT_ID_HEADER, LAST_ERROR_HEADER,
        REASON_HEADER, STATUS_HEADER, SUBSCRIPTION_HEADER, TENANT_HEADER, read_str_header,
        read_u64_header,
    };
    use crate::delivery::route::CancelReason;

    fn ladder() -> Ladder {
        Ladder::parse(include_str!("../../topology/ladder.toml")).unwrap()
    }

    fn delivered() -> (BasicProperties, Envelope) {
        let event = NewEvent {
            id: "evt_1".into(),
            tenant: "acme".into(),
            event_type: "order.paid".into(),
            subscription: None,
            timestamp: Some(1_700_000_000),
            body: b"{}".to_vec(),
        };
        let properties = event.properties();
        let envelope = Envelope::from_delivery(&properties, "acme", b"{}", 1024).unwrap();
        (properties, envelope)
    }

    fn published(r: Replacement) -> (String, Vec<Republish>) {
        match r {
            Replacement::Publish { target, messages } => (target, messages),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_retry_waits_in_its_tier_with_the_accounting_it_needs() {
        let (properties, envelope) = delivered();
        let retry = Outcome::Retry {
            tier: ladder().tier_at(1).unwrap(),
            attempts_made: 2,
            error: "HTTP 503".into(),
        };
        let (target, messages) = published(
            replacement(
                &ladder(),
                &retry,
                &properties,
                Some(&envelope),
                Some("h#01020304"),
                1_000,
            )
            .unwrap(),
        );
        assert_eq!(target, "retry-1m");
        let [m] = messages.as_slice() else {
            panic!("{messages:?}")
        };
        assert_eq!(m.exchange, "hookrelay.delay");
        assert_eq!(m.routing_key, "retry-1m.acme");
        assert_eq!(m.properties.message_id(), properties.message_id());
        let p = &m.properties;
        assert_eq!(read_str_header(p, TENANT_HEADER).as_deref(), Some("acme"));
        assert_eq!(read_u64_header(p, ATTEMPTS_HEADER), Some(2));
        assert_eq!(read_u64_header(p, DUE_HEADER), Some(61_000));
        assert_eq!(
            read_str_header(p, LAST_ERROR_HEADER).as_deref(),
            Some("HTTP 503")
        );
        assert_eq!(
            read_str_header(p, ENDPOINT_HEADER).as_deref(),
            Some("h#01020304")
        );
    }

    #[test]
    fn a_dead_letter_goes_to_the_sink_with_its_reason_even_without_an_envelope() {
        let (properties, envelope) = delivered();
        let dead = Outcome::Dead {
            reason: DeadReason::Rejected,
            status: Some(400),
            error: "HTTP 400".into(),
            attempts_made: 1,
        };
        for known in [Some(&envelope), None] {
            let (target, messages) =
                published(replacement(&ladder(), &dead, &properties, known, None, 5).unwrap());
            assert_eq!(target, "dead");
            let [m] = messages.as_slice() else {
                panic!("{messages:?}")
            };
            assert_eq!(
                (m.exchange.as_str(), m.routing_key.as_str()),
                ("", "hookrelay.dead")
            );
            assert_eq!(
                read_str_header(&m.properties, REASON_HEADER).as_deref(),
                Some("rejected")
            );
            assert_eq!(read_u64_header(&m.properties, STATUS_HEADER), Some(400));
            assert_eq!(
                read_str_header(&m.properties, TENANT_HEADER).as_deref(),
                known.map(|e| e.tenant.as_str())
            );
        }
    }

    #[test]
    fn a_fan_out_publishes_one_delivery_per_target_with_derived_ids() {
        let (properties, envelope) = delivered();
        let fan_out = Outcome::FanOut {
            subscriptions: vec!["sub_a".into(), "sub_b".into()],
        };
        let (target, messages) = published(
            replacement(&ladder(), &fan_out, &properties, Some(&envelope), None, 5).unwrap(),
        );
        assert_eq!(target, "ingress");
        assert_eq!(messages.len(), 2);
        for (m, sub) in messages.iter().zip(["sub_a", "sub_b"]) {
            assert_eq!(
                (m.exchange.as_str(), m.routing_key.as_str()),
                ("hookrelay.ingress", "acme")
            );
            let id = envelope::derived_id("evt_1", sub);
            assert_eq!(
                m.properties.message_id().as_ref().map(|i| i.as_str()),
                Some(id.as_str())
            );
            assert_eq!(
                read_str_header(&m.properties, SUBSCRIPTION_HEADER).as_deref(),
                Some(sub)
            );
            assert_eq!(
                read_str_header(&m.properties, EVENT_ID_HEADER).as_deref(),
                Some("evt_1")
            );
        }
    }

    #[test]
    fn deliveries_and_cancellations_publish_nothing_and_broken_decisions_are_refused() {
        let (properties, envelope) = delivered();
        let l = ladder();
        let build = |o: &Outcome, e| replacement(&l, o, &properties, e, None, 5);
        assert_eq!(
            build(&Outcome::Delivered { status: 204 }, Some(&envelope)),
            Ok(Replacement::Nothing)
        );
        let cancelled = Outcome::Cancelled {
            reason: CancelReason::Deleted,
            detail: "gone".into(),
        };
        assert_eq!(build(&cancelled, Some(&envelope)), Ok(Replacement::Records));
        let retry = Outcome::Retry {
            tier: l.tier_at(0).unwrap(),
            attempts_made: 1,
            error: "timeout".into(),
        };
        assert!(build(&retry, None).is_err());
        let fan_out = Outcome::FanOut {
            subscriptions: vec!["s".into()],
        };
        assert!(build(&fan_out, None).is_err());
    }
}
