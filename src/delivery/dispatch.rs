//! One delivery, from the broker's hands to its settlement: read the envelope, look the
//! subscription up as it is now, sign with its current secrets, send, decide, and carry the
//! decision out. Acks only after what replaces the message (a retry, a dead letter, fan-out
//! deliveries) is confirmed by the broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::{Acker, BasicProperties};
use tracing::{debug, error, info, warn};

use crate::broker::publish::{PublishError, Publisher};
use crate::broker::topology::Ladder;
use crate::config::Config;
use crate::contract::envelope::{self, DeadLetter, Envelope, InvalidEnvelope};
use crate::delivery::endpoint::Endpoints;
use crate::delivery::http::{HttpSender, WebhookRequest};
use crate::delivery::route::{AttemptResult, CancelReason, DeadReason, Outcome, decide};
use crate::delivery::signing::signature_header;
use crate::delivery::subscriptions::{LiveSubscriptions, SecretStore, Subscription};
use crate::observe::events::{AttemptRecord, Notices, OperationalEvent};
use crate::observe::metrics::Metrics;
use crate::units::{now_ms, now_rfc3339};

/// Which kind of lane a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneKind {
    First,
    Retry,
}

/// A lane's metric handles, resolved once rather than by label on every delivery.
#[derive(Debug)]
struct LaneMetrics {
    in_flight: prometheus::IntGauge,
    oldest_ready_age: prometheus::Gauge,
    attempt_seconds: prometheus::Histogram,
    delivered: prometheus::IntCounter,
}

/// One ready queue: what the worker consumes, and what it has seen at its head.
#[derive(Debug)]
pub struct Lane {
    pub kind: LaneKind,
    pub queue: String,
    pub prefetch: u16,
    metrics: LaneMetrics,
    /// How long the most recently delivered message had waited, in ms.
    last_age_ms: AtomicU64,
    /// When that delivery arrived, in ms since `epoch`.
    last_delivery_ms: AtomicU64,
    epoch: Instant,
}

impl Lane {
    pub fn new(kind: LaneKind, queue: String, prefetch: u16, metrics: &Metrics) -> Self {
        let label = [queue.as_str()];
        Self {
            metrics: LaneMetrics {
                in_flight: metrics.in_flight.with_label_values(&label),
                oldest_ready_age: metrics.oldest_ready_age.with_label_values(&label),
                attempt_seconds: metrics.attempt_seconds.with_label_values(&label),
                delivered: metrics
                    .outcomes
                    .with_label_values(&[queue.as_str(), "delivered"]),
            },
            kind,
            queue,
            prefetch,
            last_age_ms: AtomicU64::new(0),
            last_delivery_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// The metrics label: the queue name.
    pub fn label(&self) -> &str {
        &self.queue
    }

    fn saw_head(&self, age_ms: u64) {
        self.last_age_ms.store(age_ms, Ordering::Relaxed);
        self.last_delivery_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// The oldest-ready estimate given the broker's ready count: 0 for an empty lane; the wait of
    /// the last delivered message while deliveries flow; that wait plus the time since while the
    /// lane holds messages and nothing is delivered (an upper bound on the head's wait).
    pub fn oldest_ready_age(&self, ready: i64, quiet_after: Duration) -> Duration {
        if ready <= 0 {
            return Duration::ZERO;
        }
        let last_age = Duration::from_millis(self.last_age_ms.load(Ordering::Relaxed));
        let since = self.epoch.elapsed().saturating_sub(Duration::from_millis(
            self.last_delivery_ms.load(Ordering::Relaxed),
        ));
        if since < quiet_after {
            last_age
        } else {
            last_age + since
        }
    }
}

/// Everything a delivery's task needs, shared by all of them.
pub struct Dispatcher {
    pub(crate) config: Config,
    pub(crate) ladder: Ladder,
    pub(crate) subscriptions: Arc<LiveSubscriptions>,
    pub(crate) secrets: Arc<SecretStore>,
    pub(crate) http: HttpSender,
    pub(crate) endpoints: Endpoints,
    pub(crate) publisher: Arc<Publisher>,
    pub(crate) notices: Notices,
    pub(crate) metrics: Metrics,
    delay_exchange: String,
    dead_queue: String,
    ingress: String,
}

/// The decision, and what the HTTP attempt (if one was made) produced.
struct Attempted {
    outcome: Outcome,
    /// Where the attempt went ([`envelope::endpoint_fingerprint`]).
    endpoint: Option<String>,
    result: Option<AttemptResult>,
    latency: Option<Duration>,
}

impl Attempted {
    fn without_attempt(outcome: Outcome) -> Self {
        Self {
            outcome,
            endpoint: None,
            result: None,
            latency: None,
        }
    }
}

/// Decrements the in-flight gauge however the task ends.
struct InFlight(prometheus::IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Dispatcher {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: Config,
        ladder: Ladder,
        subscriptions: Arc<LiveSubscriptions>,
        secrets: Arc<SecretStore>,
        http: HttpSender,
        publisher: Arc<Publisher>,
        notices: Notices,
        metrics: Metrics,
    ) -> Self {
        Self {
            delay_exchange: ladder.delay_exchange(),
            dead_queue: ladder.dead(),
            ingress: ladder.ingress(),
            endpoints: Endpoints::new(config.endpoints.clone()),
            config,
            ladder,
            subscriptions,
            secrets,
            http,
            publisher,
            notices,
            metrics,
        }
    }

    /// Handles one delivery to the end: an ack, or a nack back to its lane.
    pub async fn handle(self: Arc<Self>, lane: Arc<Lane>, delivery: Delivery) {
        let gauge = lane.metrics.in_flight.clone();
        gauge.inc();
        let _in_flight = InFlight(gauge);
        let Delivery {
            properties,
            routing_key,
            data,
            acker,
            ..
        } = delivery;
        let body = Bytes::from(data);
        let max_body = self.config.limits.max_body_bytes;
        let (envelope, attempted) =
            match Envelope::from_delivery(&properties, routing_key.as_str(), &body, max_body) {
                Ok(envelope) => {
                    self.observe_head(&lane, &properties, &envelope);
                    let attempted = self.attempt(&lane, &envelope, &body).await;
                    (Some(envelope), attempted)
                }
                Err(invalid) => {
                    let attempts = envelope::read_u64_header(&properties, envelope::ATTEMPTS_HEADER)
                        .unwrap_or(0)
                        .min(u64::from(u32::MAX)) as u32;
                    let outcome = Outcome::invalid(invalid.to_string(), attempts);
                    (None, Attempted::without_attempt(outcome))
                }
            };
        self.settle(
            &lane,
            &acker,
            &properties,
            &body,
            envelope.as_ref(),
            attempted,
        )
        .await;
    }

    /// The head-of-lane vital signs: how long this message waited to be eligible and consumed,
    /// and for a retry, which tier promoted it and how late.
    fn observe_head(&self, lane: &Lane, properties: &BasicProperties, envelope: &Envelope) {
        let now = now_ms();
        let waited_since = match lane.kind {
            LaneKind::First => properties.timestamp().map(|s| s.saturating_mul(1000)),
            LaneKind::Retry => envelope.due_ms,
        };
        if let Some(since) = waited_since {
            let age = now.saturating_sub(since);
            lane.saw_head(age);
            lane.metrics.oldest_ready_age.set(age as f64 / 1000.0);
        }
        if lane.kind == LaneKind::Retry
            && let Some(queue) = envelope::promoted_from(properties)
        {
            let tier = queue
                .strip_prefix(&format!("{}.", self.ladder.prefix))
                .unwrap_or(&queue)
                .to_owned();
            self.metrics.promotions.with_label_values(&[&tier]).inc();
            if let Some(due) = envelope.due_ms {
                self.metrics
                    .promotion_lag
                    .with_label_values(&[&tier])
                    .observe(now.saturating_sub(due) as f64 / 1000.0);
            }
        }
    }

    /// Decides what to do with a valid envelope, making the HTTP attempt when there is one to
    /// make.
    async fn attempt(&self, lane: &Lane, envelope: &Envelope, body: &Bytes) -> Attempted {
        let subscriptions = self.subscriptions.current();
        let Some(sub_id) = &envelope.subscription else {
            return Attempted::without_attempt(self.fan_out(lane, envelope, &subscriptions));
        };
        let made = envelope.attempts_made;
        let sub = match subscriptions.get(sub_id) {
            Some(sub) => sub,
            None if envelope.subscription_existed() => {
                return Attempted::without_attempt(Outcome::Cancelled {
                    reason: CancelReason::Deleted,
                    detail: format!("subscription {sub_id:?} was deleted"),
                });
            }
            None => {
                return Attempted::without_attempt(Outcome::invalid(
                    format!("unknown subscription {sub_id:?}"),
                    made,
                ));
            }
        };
        if sub.tenant != envelope.tenant {
            return Attempted::without_attempt(Outcome::invalid(
                format!(
                    "subscription {:?} belongs to tenant {:?}, not {:?}",
                    sub.id, sub.tenant, envelope.tenant
                ),
                made,
            ));
        }
        if !sub.enabled {
            return Attempted::without_attempt(Outcome::Cancelled {
                reason: CancelReason::Disabled,
                detail: format!("subscription {:?} is disabled", sub.id),
            });
        }
        if !sub.accepts(&envelope.event_type) {
            return Attempted::without_attempt(Outcome::Cancelled {
                reason: CancelReason::Filtered,
                detail: format!(
                    "subscription {:?} does not receive event type {:?}",
                    sub.id, envelope.event_type
                ),
            });
        }
        if made >= self.ladder.max_attempts() {
            return Attempted::without_attempt(Outcome::Dead {
                reason: DeadReason::Exhausted,
                status: None,
                error: format!("arrived with {made} attempts made, the whole budget"),
                attempts_made: made,
            });
        }
        let endpoint = envelope::endpoint_fingerprint(&sub.url);
        if let Some(previous) = &envelope.last_endpoint
            && *previous != endpoint
        {
            info!(
                envelope = %envelope.id,
                subscription = %sub.id,
                old_host = previous.split('#').next().unwrap_or_default(),
                new_host = sub.url.host_str().unwrap_or_default(),
                "Subscription repointed; delivering to its new URL"
            );
        }
        let (result, latency) = self.send(lane, envelope, sub, body).await;
        Attempted {
            outcome: decide(&self.ladder, made, &result),
            endpoint: Some(endpoint),
            result: Some(result),
            latency,
        }
    }

    /// Signs with every unexpired secret that resolves now, and sends.
    async fn send(
        &self,
        lane: &Lane,
        envelope: &Envelope,
        sub: &Subscription,
        body: &Bytes,
    ) -> (AttemptResult, Option<Duration>) {
        let (keys, errors) = self.secrets.keys_for(sub);
        for e in &errors {
            warn!(subscription = %sub.id, error = %e, "Secret reference does not resolve");
        }
        if keys.is_empty() {
            let result = AttemptResult::NotSent(format!(
                "no unexpired secret of subscription {} resolves{}",
                sub.id,
                errors.iter().map(|e| format!("; {e}")).collect::<String>()
            ));
            return (result, None);
        }
        let slot = match self.endpoints.admit(&sub.url, sub.max_concurrent).await {
            Ok(slot) => slot,
            Err(deferral) => {
                self.metrics
                    .deferrals
                    .with_label_values(&[deferral.kind()])
                    .inc();
                self.endpoints.pace_deferral().await;
                let result = AttemptResult::Deferred {
                    reason: deferral.to_string(),
                    wait: deferral.wait(),
                };
                return (result, None);
            }
        };
        let timestamp = now_ms() / 1000;
        let signature = signature_header(
            keys.iter().map(AsRef::as_ref),
            &envelope.id,
            timestamp,
            body,
        );
        let report = self
            .http
            .send(WebhookRequest {
                url: &sub.url,
                id: &envelope.id,
                attempt: envelope.attempts_made + 1,
                timestamp,
                signature,
                body: body.clone(),
            })
            .await;
        slot.finish(&report.result);
        lane.metrics
            .attempt_seconds
            .observe(report.latency.as_secs_f64());
        debug!(
            envelope = %envelope.id,
            attempt = envelope.attempts_made + 1,
            result = %report.result.describe(),
            latency_ms = report.latency.as_millis() as u64,
            response = %report.response_excerpt,
            "Attempt made"
        );
        (report.result, Some(report.latency))
    }

    /// An event without a subscription, fresh from the first-attempt lane, becomes one delivery
    /// per matching subscription; anywhere else it is invalid.
    fn fan_out(
        &self,
        lane: &Lane,
        envelope: &Envelope,
        subscriptions: &crate::delivery::subscriptions::Subscriptions,
    ) -> Outcome {
        if lane.kind != LaneKind::First || envelope.attempts_made > 0 || envelope.event_id.is_some()
        {
            return Outcome::invalid(
                InvalidEnvelope::MissingSubscription.to_string(),
                envelope.attempts_made,
            );
        }
        let targets: Vec<String> = subscriptions
            .matching(&envelope.tenant, &envelope.event_type)
            .iter()
            .map(|s| s.id.clone())
            .collect();
        if targets.is_empty() {
            return Outcome::Cancelled {
                reason: CancelReason::Filtered,
                detail: format!(
                    "no enabled subscription of tenant {:?} receives event type {:?}",
                    envelope.tenant, envelope.event_type
                ),
            };
        }
        Outcome::FanOut {
            subscriptions: targets,
        }
    }

    /// Carries the decision out. Acks only after a needed publish was confirmed.
    async fn settle(
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
        let stored: Result<(), (PublishError, &str)> = match outcome {
            Outcome::Delivered { status } => {
                debug!(envelope = %id, status, "Delivered");
                Ok(())
            }
            Outcome::Cancelled { reason, detail } => {
                info!(envelope = %id, reason = reason.as_str(), detail = %detail, "Cancelled");
                // A cancellation is a terminal state only the records hold: they are confirmed
                // before the ack, as a dead letter is.
                self.record_cancellation(lane, properties, envelope, &attempted)
                    .await
                    .map_err(|e| (e, "attempts"))
            }
            Outcome::FanOut { subscriptions } => {
                let Some(envelope) = envelope else {
                    return self.requeue(acker, "fan-out without envelope").await;
                };
                self.publish_fan_out(properties, body, envelope, subscriptions)
                    .await
                    .map_err(|e| (e, "ingress"))
            }
            Outcome::Retry {
                tier,
                attempts_made,
                error,
            } => {
                let Some(envelope) = envelope else {
                    error!(envelope = %id, "A retry without an envelope; keeping the message in its lane");
                    return self.requeue(acker, "retry without envelope").await;
                };
                let tier_spec = &self.ladder.tiers[*tier];
                let props = envelope::retry_properties(
                    properties,
                    &envelope.tenant,
                    *attempts_made,
                    now_ms() + tier_spec.delay.as_millis() as u64,
                    error,
                    attempted.endpoint.as_deref(),
                );
                let result = self
                    .publisher
                    .publish(
                        &self.delay_exchange,
                        &self.ladder.tier_routing_key(*tier, &envelope.tenant),
                        body,
                        props,
                    )
                    .await;
                if result.is_ok() {
                    self.metrics
                        .retries
                        .with_label_values(&[tier_spec.name.as_str()])
                        .inc();
                    info!(envelope = %id, tier = %tier_spec.name, attempts = attempts_made, error = %error, "Scheduled retry");
                }
                result.map_err(|e| (e, tier_spec.name.as_str()))
            }
            Outcome::Dead {
                reason,
                status,
                error,
                attempts_made,
            } => {
                let props = envelope::dead_properties(
                    properties,
                    &DeadLetter {
                        reason: reason.as_str(),
                        error,
                        status: *status,
                        attempts_made: *attempts_made,
                        tenant: envelope.map(|e| e.tenant.as_str()),
                    },
                );
                let result = self
                    .publisher
                    .publish("", &self.dead_queue, body, props)
                    .await;
                if result.is_ok() {
                    if let (DeadReason::Rejected, Some(status)) = (reason, status) {
                        self.metrics
                            .rejections
                            .with_label_values(&[&status.to_string()])
                            .inc();
                    }
                    warn!(envelope = %id, reason = reason.as_str(), attempts = attempts_made, error = %error, "Dead-lettered");
                }
                result.map_err(|e| (e, "dead"))
            }
        };
        match stored {
            Ok(()) => {
                match outcome {
                    Outcome::Delivered { .. } => lane.metrics.delivered.inc(),
                    _ => self
                        .metrics
                        .outcomes
                        .with_label_values(&[lane.label(), outcome.kind()])
                        .inc(),
                }
                if let Err(e) = acker.ack(BasicAckOptions::default()).await {
                    // The channel is gone; the broker redelivers the message (a duplicate,
                    // never a loss).
                    warn!(envelope = %id, error = %e, "Ack failed; the broker will redeliver");
                }
                if matches!(outcome, Outcome::Cancelled { .. }) {
                    return;
                }
                if let Some(envelope) = envelope {
                    self.announce(envelope, outcome);
                }
                let key = crate::observe::events::routing_key(
                    attempted.outcome.kind(),
                    envelope.map(|e| e.tenant.as_str()),
                );
                if self.notices.attempt_wanted(&key) {
                    self.notices
                        .attempt(&self.record(lane, properties, envelope, &attempted));
                }
            }
            Err((e, target)) => {
                self.metrics
                    .republish_failures
                    .with_label_values(&[target])
                    .inc();
                error!(envelope = %id, target, error = %e, "Republish not confirmed; returning the message to its lane");
                self.requeue(acker, target).await;
            }
        }
    }

    /// Publishes one delivery per target with its derived id, all confirmed.
    async fn publish_fan_out(
        &self,
        properties: &BasicProperties,
        body: &[u8],
        envelope: &Envelope,
        subscriptions: &[String],
    ) -> Result<(), PublishError> {
        let sends = subscriptions.iter().map(|sub| {
            let derived = envelope::derived_id(&envelope.id, sub);
            let props = envelope::fanout_properties(properties, &derived, sub, &envelope.id);
            async move {
                self.publisher
                    .publish(&self.ingress, &envelope.tenant, body, props)
                    .await
            }
        });
        futures_util::future::try_join_all(sends).await?;
        info!(event = %envelope.id, deliveries = subscriptions.len(), "Fanned out");
        Ok(())
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
                Outcome::Retry { tier, .. } => Some(self.ladder.tiers[*tier].name.clone()),
                _ => None,
            },
            lane: lane.queue.clone(),
            at: now_rfc3339(),
        }
    }

    /// Publishes a cancellation's attempt-log record and `delivery.cancelled` event and waits for
    /// both confirms. Nobody being bound to either is fine: the broker then drops them.
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
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let record = self.record(lane, properties, envelope, attempted);
        let record_body = serde_json::to_vec(&record).unwrap_or_default();
        let mut event = OperationalEvent::new("delivery.cancelled", reason.as_str()).detail(detail);
        if let Some(e) = envelope {
            event = event.about(&e.tenant, e.subscription.as_deref(), &e.id);
        }
        let event_body = serde_json::to_vec(&event).unwrap_or_default();
        let logged = self
            .publisher
            .send(
                &self.ladder.attempts_exchange(),
                &record.routing_key(),
                &record_body,
                props.clone(),
                false,
            )
            .await?;
        let announced = self
            .publisher
            .send(
                &self.ladder.events_exchange(),
                "delivery.cancelled",
                &event_body,
                props,
                false,
            )
            .await?;
        logged.await?;
        announced.await?;
        self.metrics
            .cancellations
            .with_label_values(&[reason.as_str()])
            .inc();
        Ok(())
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
            &envelope.id,
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
