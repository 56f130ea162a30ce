//! Carrying a decision out. [`replacement`] builds, without I/O, what must be in the broker
//! before the delivery may be acked (a retry in its tier, a dead letter with its reason, one
//! delivery per fan-out target, or for a cancellation the records that alone hold it);
//! [`Settler::settle`] publishes that, waits for every confirm, and only then acks. What the
//! broker does not confirm is published again, with backoff, while the delivery's lease allows
//! ([`next_try`]); only then does the delivery return to its lane, unacked.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::{Acker, BasicProperties};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::broker::publish::{PublishError, Publisher};
use crate::config::Config;
use crate::contract::envelope::{self, Envelope};
use crate::contract::headers::{self, DeadLetter};
use crate::contract::ladder::Ladder;
use crate::delivery::dispatch::Attempted;
use crate::delivery::lane::Lane;
use crate::delivery::route::{CancelReason, DeadReason, Outcome};
use crate::observe::events::{Notices, OperationalEvent};
use crate::observe::metrics::Metrics;
use crate::units::now_ms;

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

impl Replacement {
    /// Marks the copies bound for a tier or a parking queue with the shard of the lane the
    /// delivery came from (`None`: not a shard), so a sharded ladder promotes them back to the
    /// retry shard of the same index.
    pub fn from_shard(mut self, ladder: &Ladder, shard: Option<u16>) -> Self {
        if let Replacement::Publish { messages, .. } = &mut self {
            // The delay exchange (parking) and every tier's own (`<delay>.<tier>`).
            let delay = ladder.delay_exchange();
            for m in messages
                .iter_mut()
                .filter(|m| m.exchange.starts_with(&delay))
            {
                m.properties = headers::with_shard(std::mem::take(&mut m.properties), shard);
            }
        }
        self
    }
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
            deferred,
            busy_deferrals,
        } => {
            let envelope = envelope.ok_or(Unsettleable("retry without envelope"))?;
            let spec = ladder.tier(*tier);
            let deferrals = headers::Deferrals {
                count: envelope.deferrals + u32::from(*deferred),
                // Waiting a busy endpoint's turn does not start the horizon.
                first_try_ms: if *deferred && *busy_deferrals > 0 {
                    envelope.first_try_ms
                } else {
                    Some(envelope.first_try_ms.unwrap_or(now_ms))
                },
                busy: *busy_deferrals,
                waiting_since_ms: Some(now_ms),
            };
            Replacement::Publish {
                target: spec.name.clone(),
                messages: vec![Republish {
                    exchange: ladder.tier_exchange(*tier),
                    routing_key: ladder.tier_routing_key(*tier, &envelope.tenant),
                    properties: headers::retry_properties(
                        properties,
                        &envelope.tenant,
                        *attempts_made,
                        now_ms + spec.delay.as_millis() as u64,
                        error,
                        endpoint,
                        Some(deferrals),
                    ),
                }],
            }
        }
        Outcome::Dead {
            reason,
            status,
            error,
            attempts_made,
        } => {
            let mut properties = headers::dead_properties(
                properties,
                &DeadLetter {
                    reason: reason.as_str(),
                    error,
                    status: *status,
                    attempts_made: *attempts_made,
                    tenant: envelope.map(|e| e.tenant.as_str()),
                },
            );
            if let Some(e) = envelope {
                // An expiry is decided at a deferral, which it counts.
                properties = headers::with_deferrals(
                    properties,
                    headers::Deferrals {
                        count: e.deferrals + u32::from(*reason == DeadReason::Expired),
                        first_try_ms: Some(e.first_try_ms.unwrap_or(now_ms)),
                        busy: 0,
                        // Kept as it was: when it last went to wait, which the expiry's
                        // evidence is newer than.
                        waiting_since_ms: None,
                    },
                );
            }
            Replacement::Publish {
                target: "dead".into(),
                messages: vec![Republish {
                    exchange: String::new(),
                    routing_key: ladder.dead(),
                    properties,
                }],
            }
        }
        // Exactly as it came: its id, body and attempt count are what resume returns.
        Outcome::Parked { subscription } => {
            let envelope = envelope.ok_or(Unsettleable("parking without envelope"))?;
            Replacement::Publish {
                target: "paused".into(),
                messages: vec![Republish {
                    exchange: ladder.delay_exchange(),
                    routing_key: ladder.paused_routing_key(subscription),
                    properties: headers::parked_properties(properties, &envelope.tenant, now_ms),
                }],
            }
        }
        Outcome::FanOut { subscriptions, .. } => {
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

/// Carries decisions out: publishes what replaces a delivery, waits for the broker's confirms,
/// stores its attempt records, acks, and records the outcome (logs, metrics, operational
/// events).
pub struct Settler {
    pub(crate) ladder: Ladder,
    pub(crate) publisher: Arc<Publisher>,
    pub(crate) notices: Notices,
    pub(crate) metrics: Metrics,
    /// Cancelled when the drain deadline has passed: deliveries still trying to store their
    /// outcome give up (unacked, they return to their lanes).
    pub(crate) abandon: CancellationToken,
    /// One confirmed publish's deadline ([`Config::publish_budget`]).
    publish_budget: Duration,
    /// The first pause before a delivery is returned or a republish tried again.
    requeue_delay: Duration,
    /// The longest pause between tries of a republish.
    reconnect_max: Duration,
}

/// One delivery as it is settled: where it came from, what it was, and what was decided.
pub(crate) struct Settlement<'a> {
    pub(crate) lane: &'a Lane,
    pub(crate) acker: &'a Acker,
    pub(crate) properties: &'a BasicProperties,
    pub(crate) body: &'a [u8],
    pub(crate) envelope: Option<&'a Envelope>,
    pub(crate) attempted: Attempted,
    /// When the broker's lease on the delivery is nearly spent (see [`Config::lease`]).
    pub(crate) lease_end: Instant,
}

impl Settler {
    pub(crate) fn new(
        config: &Config,
        ladder: Ladder,
        publisher: Arc<Publisher>,
        notices: Notices,
        metrics: Metrics,
    ) -> Self {
        Self {
            ladder,
            publisher,
            notices,
            metrics,
            abandon: CancellationToken::new(),
            publish_budget: config.publish_budget(),
            requeue_delay: config.worker.requeue_delay,
            reconnect_max: config.amqp.reconnect_max,
        }
    }

    /// Carries the decision out. Acks only after what replaces the delivery and its attempt
    /// records were confirmed.
    pub(crate) async fn settle(&self, settlement: Settlement<'_>) {
        let Settlement {
            lane,
            acker,
            properties,
            body,
            envelope,
            attempted,
            lease_end,
        } = settlement;
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
            Ok(r) => r.from_shard(&self.ladder, lane.shard),
            Err(Unsettleable(why)) => {
                error!(envelope = %id, why, "Cannot settle; keeping the message in its lane");
                return self.requeue(acker, why, self.requeue_delay).await;
            }
        };
        // The replacement and the records are stored side by side, and the ack waits for both:
        // after the replacement's confirm, the records' linger and confirm would add to every
        // retry's time in flight. (A record whose replacement was not stored stays: the attempt
        // it tells of was made, and the delivery's next attempt gets a record of its own.)
        let cancelled = matches!(outcome, Outcome::Cancelled { .. });
        let store = async {
            match replacement {
                Replacement::Nothing => Ok(()),
                // A cancellation is a terminal state only the records hold: they are confirmed
                // before the ack, as a dead letter is.
                Replacement::Records => {
                    self.store(id, acker, "attempts", vec![()], lease_end, |()| {
                        self.record_cancellation(lane, properties, envelope, &attempted)
                    })
                    .await
                }
                Replacement::Publish { target, messages } => {
                    self.store(id, acker, &target, messages, lease_end, |m| async move {
                        self.publisher
                            .publish(&m.exchange, &m.routing_key, body, m.properties)
                            .await
                    })
                    .await
                }
            }
        };
        // Its records before its ack (a cancellation's are stored with its replacement): acked
        // first, a delivery would be left without a record should the worker die before the
        // broker took them. (Counted already: one not stored is counted again when delivered
        // again, as one whose ack is lost is.)
        let records = async {
            cancelled
                || self
                    .log(lane, properties, envelope, &attempted, lease_end)
                    .await
        };
        let (stored, logged) = tokio::join!(store, records);
        if let Err(why) = stored {
            error!(envelope = %id, error = %why, retry_helps = why.retry_helps(), "Outcome not stored (lease nearly spent, or the drain is over); returning the message to its lane");
            // No pause once the drain is over: the worker is about to close the connection.
            let left = if self.abandon.is_cancelled() {
                Duration::ZERO
            } else {
                lease_end.saturating_duration_since(Instant::now())
            };
            return self
                .requeue(
                    acker,
                    "republish not confirmed",
                    left.min(self.requeue_delay),
                )
                .await;
        }
        self.settled(lane, id, envelope, &attempted);
        if !logged {
            warn!(envelope = %id, "Attempt record not stored (lease nearly spent, or the worker is stopping); returning the message to its lane");
            let pause = if self.abandon.is_cancelled() {
                Duration::ZERO
            } else {
                self.requeue_delay
            };
            return self
                .requeue(acker, "attempt record not stored", pause)
                .await;
        }
        if let Err(e) = acker.ack(BasicAckOptions::default()).await {
            // The channel is gone; the broker redelivers the message (a duplicate, never a
            // loss).
            warn!(envelope = %id, error = %e, "Ack failed; the broker will redeliver");
        }
        if let (false, Some(envelope)) = (cancelled, envelope) {
            self.announce(envelope, outcome);
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
            Outcome::Parked { subscription } => {
                debug!(envelope = %id, subscription = %subscription, "Parked: the subscription is paused");
            }
            Outcome::FanOut {
                subscriptions,
                filtered,
            } => {
                let event = envelope.map_or(id, |e| e.id.as_str());
                info!(event = %event, deliveries = subscriptions.len(), filtered = filtered.len(), "Fanned out");
                self.metrics
                    .cancellations
                    .with_label_values(&[CancelReason::Filtered.as_str()])
                    .inc_by(filtered.len() as u64);
            }
            Outcome::Retry {
                tier,
                attempts_made,
                error,
                ..
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

    /// Stores every item of `pending` through `put`, trying again what the broker did not
    /// confirm, with backoff, for as long as another try fits before `lease_end`. The decided
    /// outcome is what is retried, never the attempt: an envelope whose retry cannot be stored
    /// (a resource alarm, a tier not yet applied) holds its lease instead of being POSTed again
    /// on every redelivery. While the broker blocks the publishing connection nothing is sent
    /// (a publish there would only time out, and might still be stored after the alarm, as a
    /// duplicate). Gives up, with the last error, only when the lease is nearly spent or the
    /// delivery's channel has closed (`held`).
    async fn store<T, F, Fut>(
        &self,
        id: &str,
        held: &Acker,
        target: &str,
        mut pending: Vec<T>,
        lease_end: Instant,
        put: F,
    ) -> Result<(), NotStored>
    where
        T: Clone,
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<(), PublishError>>,
    {
        let one_try = self.publish_budget;
        let mut pause = self.requeue_delay;
        let mut tries = 0u32;
        let mut last = LastTry::Blocked;
        loop {
            // Once the delivery's channel has closed, the broker hands the original out again:
            // a copy stored now could never be followed by its ack, and would be a second copy
            // of the envelope on its way (a duplicate beyond the deliveries in flight).
            if held.poisoned() {
                return Err(if tries == 0 {
                    NotStored::ChannelClosed
                } else {
                    NotStored::ChannelClosedAfter(last)
                });
            }
            if !self.publisher.is_blocked() {
                tries += 1;
                let results = futures_util::future::join_all(pending.iter().cloned().map(|item| {
                    let put = &put;
                    async move {
                        // Each try is bounded, whatever `put` waits on, so the lease
                        // arithmetic holds.
                        match tokio::time::timeout(one_try, put(item)).await {
                            Ok(result) => result,
                            Err(_) => Err(PublishError::NoAnswer {
                                what: "a republish",
                                after: one_try,
                            }),
                        }
                    }
                }))
                .await;
                let mut failed = Vec::new();
                let mut permanent = false;
                let mut confirmed = 0;
                for (item, result) in pending.into_iter().zip(results) {
                    match result {
                        Ok(()) => confirmed += 1,
                        Err(e) => {
                            permanent |= !e.is_transient();
                            last = LastTry::Failed(e);
                            failed.push(item);
                        }
                    }
                }
                self.metrics
                    .republishes
                    .with_label_values(&[target])
                    .inc_by(confirmed);
                pending = failed;
                if pending.is_empty() {
                    return Ok(());
                }
                if permanent {
                    self.count_republish_failure(target);
                    return Err(NotStored::Refused(last));
                }
            }
            // A round skipped while the broker blocks publishing counts as a failed one: the
            // outcome is not stored, and the alert on this counter should say so.
            self.count_republish_failure(target);
            let Some(wait) = next_try(Instant::now(), lease_end, pause, one_try) else {
                return Err(NotStored::LeaseSpent(last));
            };
            if tries == 1 {
                warn!(envelope = %id, target, error = %last, retry_in = ?wait, "Republish not confirmed; trying again within the lease");
            } else {
                debug!(envelope = %id, target, tries, error = %last, retry_in = ?wait, "Republish still not confirmed");
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.abandon.cancelled() => {
                    return Err(NotStored::Drained(last));
                }
            }
            pause = (pause * 2).min(self.reconnect_max.max(pause));
        }
    }

    fn count_republish_failure(&self, target: &str) {
        self.metrics
            .republish_failures
            .with_label_values(&[target])
            .inc();
    }

    /// Returns a delivery to its lane after `pause`, so a persistent fault is not a hot loop.
    async fn requeue(&self, acker: &Acker, why: &str, pause: Duration) {
        tokio::time::sleep(pause).await;
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

/// Why what replaces a delivery was not stored. The delivery is not acked: it goes back to its
/// lane, and [`NotStored::retry_helps`] says whether its next delivery may store it.
#[derive(Debug, thiserror::Error)]
pub enum NotStored {
    /// The broker refused a copy for good (see [`PublishError::is_transient`]).
    #[error("{0}")]
    Refused(LastTry),
    /// Another try would not end within the lease.
    #[error("{0}")]
    LeaseSpent(LastTry),
    /// The worker is stopping.
    #[error("{0}; the drain deadline passed")]
    Drained(LastTry),
    /// The broker hands the original out again already, before any try.
    #[error("the delivery's channel closed, so the broker delivers it again")]
    ChannelClosed,
    /// As [`NotStored::ChannelClosed`], after tries that failed.
    #[error("{0}; the delivery's channel closed, so the broker delivers it again")]
    ChannelClosedAfter(LastTry),
}

/// What the last try of a republish met.
#[derive(Debug, thiserror::Error)]
pub enum LastTry {
    #[error("the broker blocks publishing (resource alarm)")]
    Blocked,
    #[error("{0}")]
    Failed(PublishError),
}

impl NotStored {
    /// Whether the delivery's next turn may store it: not when the broker refused a copy for
    /// good, as it will the same copy again (an operator must look at the message).
    pub fn retry_helps(&self) -> bool {
        !matches!(self, NotStored::Refused(_))
    }
}

/// The pause before the next try of a republish, or `None` when a try after `pause` (which
/// takes up to `one_try`) would not end before `lease_end`: then the original goes back to its
/// lane while the broker still holds it for this worker.
pub fn next_try(
    now: Instant,
    lease_end: Instant,
    pause: Duration,
    one_try: Duration,
) -> Option<Duration> {
    (now + pause + one_try <= lease_end).then_some(pause)
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
            deferred: false,
            busy_deferrals: 0,
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
        assert_eq!(m.exchange, "hookrelay.delay.retry-1m");
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
            filtered: vec!["sub_c".into()],
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
            deferred: false,
            busy_deferrals: 0,
        };
        assert!(build(&retry, None).is_err());
        let fan_out = Outcome::FanOut {
            subscriptions: vec!["s".into()],
            filtered: vec![],
        };
        assert!(build(&fan_out, None).is_err());
    }

    #[test]
    fn a_failed_republish_is_tried_again_only_while_a_whole_try_fits_in_the_lease() {
        let now = Instant::now();
        let end = now + Duration::from_secs(60);
        let (pause, one_try) = (Duration::from_secs(1), Duration::from_secs(15));
        assert_eq!(next_try(now, end, pause, one_try), Some(pause));
        // 44 s + 1 s + 15 s ends exactly at the lease's end: still fits.
        let late = now + Duration::from_secs(44);
        assert_eq!(next_try(late, end, pause, one_try), Some(pause));
        let too_late = late + Duration::from_millis(1);
        assert_eq!(next_try(too_late, end, pause, one_try), None);
        assert_eq!(next_try(end + pause, end, pause, one_try), None);
    }

    #[test]
    fn an_outcome_refused_for_good_is_not_stored_by_trying_again() {
        let too_long = || {
            LastTry::Failed(PublishError::TooLong {
                what: "the routing key",
                len: 300,
            })
        };
        let refused = NotStored::Refused(too_long());
        assert!(!refused.retry_helps(), "{refused}");
        assert_eq!(
            refused.to_string(),
            "the routing key is 300 bytes, over AMQP's 255-byte limit for it"
        );
        let spent = NotStored::LeaseSpent(LastTry::Failed(PublishError::Nacked));
        assert!(spent.retry_helps(), "{spent}");
        let drained = NotStored::Drained(LastTry::Blocked);
        assert!(drained.retry_helps());
        assert_eq!(
            drained.to_string(),
            "the broker blocks publishing (resource alarm); the drain deadline passed"
        );
        assert_eq!(
            NotStored::ChannelClosed.to_string(),
            "the delivery's channel closed, so the broker delivers it again"
        );
        assert_eq!(
            NotStored::ChannelClosedAfter(too_long()).to_string(),
            "the routing key is 300 bytes, over AMQP's 255-byte limit for it; the delivery's \
             channel closed, so the broker delivers it again"
        );
    }
}
