//! The worker: consumes the ready lanes, makes one attempt per delivery, and settles it: ack on
//! 2xx; otherwise republish to a tier or the dead sink, wait for the broker's confirm, then ack.
//! A republish that is not confirmed sends the original back to its lane instead; nothing is
//! acknowledged before what replaces it is safely stored.
//!
//! Every delivery gets its own task the moment the broker hands it over, so the channel's
//! prefetch is the concurrency bound and the broker's `consumer_timeout` measures real work.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use lapin::{Acker, BasicProperties, Channel, Connection, ConnectionProperties};
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::envelope::{self, DeadLetter, Envelope, now_ms};
use crate::http::{HttpSender, WebhookRequest};
use crate::metrics::Metrics;
use crate::outcome::{AttemptResult, DeadReason, Outcome, decide};
use crate::publish::{PublishError, Publisher};
use crate::signing::signature_header;
use crate::subscriptions::{SecretStore, Subscriptions};
use crate::topology::Ladder;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start: {0}")]
    Publisher(#[from] PublishError),
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error(
        "secret references do not resolve, so deliveries could not be signed:\n{0}\n\
         Set the variables or create the files, or fix the subscriptions file"
    )]
    Secrets(String),
    #[error("cannot consume from the broker: {0}")]
    Consume(String),
}

/// One ready queue the worker consumes, with its own channel and prefetch.
#[derive(Debug, Clone)]
struct Lane {
    /// `first` or `retry`: the metrics label.
    label: &'static str,
    queue: String,
    prefetch: u16,
}

/// Everything one delivery's task needs, shared by all tasks.
struct Shared {
    config: Config,
    ladder: Ladder,
    subscriptions: Arc<Subscriptions>,
    secrets: SecretStore,
    http: HttpSender,
    publisher: Publisher,
    metrics: Metrics,
    delay_exchange: String,
    dead_queue: String,
}

/// A configured worker, connected for publishing and ready to [`Worker::run`].
pub struct Worker {
    shared: Arc<Shared>,
    name: String,
    lanes: Vec<Lane>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How a broker session ended.
enum SessionEnd {
    /// Shutdown was asked for and the drain finished (or hit its deadline).
    Shutdown,
    /// The connection or a consumer failed; `connected` says whether it got as far as consuming.
    Failed { error: String, connected: bool },
}

impl Worker {
    /// Checks that every secret resolves and connects the publishing side. `name` labels the
    /// worker's connections in the management UI (`<name> consume`, `<name> publish`).
    pub async fn start(
        config: Config,
        ladder: Ladder,
        subscriptions: Subscriptions,
        secrets: SecretStore,
        name: &str,
    ) -> Result<Self, WorkerError> {
        let unresolved = secrets.unresolved(&subscriptions);
        if !unresolved.is_empty() {
            return Err(WorkerError::Secrets(
                unresolved
                    .iter()
                    .map(|(sub, e)| format!("  subscription {sub}: {e}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
        }
        let http = HttpSender::new(&config.http)?;
        let publisher = Publisher::connect(
            &config.amqp.url,
            &format!("{name} publish"),
            config.amqp.confirm_timeout,
        )
        .await?;
        let lanes = vec![
            Lane {
                label: "first",
                queue: ladder.first_lane(),
                prefetch: config.worker.prefetch_first,
            },
            Lane {
                label: "retry",
                queue: ladder.retry_lane(),
                prefetch: config.worker.prefetch_retry,
            },
        ];
        Ok(Self {
            shared: Arc::new(Shared {
                delay_exchange: ladder.delay_exchange(),
                dead_queue: ladder.dead(),
                config,
                ladder,
                subscriptions: Arc::new(subscriptions),
                secrets,
                http,
                publisher,
                metrics: Metrics::new(),
            }),
            name: name.to_owned(),
            lanes,
        })
    }

    pub fn metrics(&self) -> Metrics {
        self.shared.metrics.clone()
    }

    /// Consumes until `shutdown` resolves, then stops consuming, lets in-flight deliveries
    /// finish within `worker.shutdown_grace`, and returns. Reconnects with backoff when the
    /// broker connection drops; fails only if the very first session cannot consume.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
        let tracker = TaskTracker::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let amqp = &self.shared.config.amqp;
        let mut backoff = amqp.reconnect_min;
        let mut ever_connected = false;
        loop {
            match self.session(&mut shutdown, &tracker).await {
                SessionEnd::Shutdown => break,
                SessionEnd::Failed { error, connected } => {
                    if !ever_connected && !connected {
                        self.shared.publisher.close().await;
                        return Err(WorkerError::Consume(error));
                    }
                    ever_connected = true;
                    if connected {
                        backoff = amqp.reconnect_min;
                    }
                    warn!(error = %error, retry_in = ?backoff, "Broker session ended; reconnecting");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut shutdown => break,
                    }
                    backoff = (backoff * 2).min(amqp.reconnect_max);
                    self.shared.metrics.reconnects.inc();
                }
            }
        }
        // Tasks of sessions that failed may still be finishing their republishes.
        drain(&tracker, self.shared.config.worker.shutdown_grace).await;
        self.shared.publisher.close().await;
        info!("Worker stopped");
        Ok(())
    }

    async fn session(
        &self,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
        tracker: &TaskTracker,
    ) -> SessionEnd {
        let failed = |error: String, connected| SessionEnd::Failed { error, connected };
        let props = ConnectionProperties::default()
            .with_connection_name(format!("{} consume", self.name).into());
        let conn = match Connection::connect(self.shared.config.amqp.url.expose(), props).await {
            Ok(c) => c,
            Err(e) => {
                return failed(
                    format!("connecting to {}: {e}", self.shared.config.amqp.url),
                    false,
                );
            }
        };
        let mut channels: Vec<(Channel, String)> = Vec::new();
        let mut streams: Vec<BoxStream<'static, (usize, Option<lapin::Result<Delivery>>)>> =
            Vec::new();
        for (i, lane) in self.lanes.iter().enumerate() {
            let consumer = async {
                let ch = conn.create_channel().await?;
                ch.basic_qos(lane.prefetch, BasicQosOptions::default())
                    .await?;
                let consumer = ch
                    .basic_consume(
                        lane.queue.as_str().into(),
                        "".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                Ok::<_, lapin::Error>((ch, consumer))
            }
            .await;
            match consumer {
                Ok((ch, consumer)) => {
                    channels.push((ch, consumer.tag().to_string()));
                    // A marker after the last item tells which consumer ended.
                    streams.push(
                        consumer
                            .map(Some)
                            .chain(stream::once(async { None }))
                            .map(move |d| (i, d))
                            .boxed(),
                    );
                }
                Err(e) => {
                    let _ = conn.close(200, "cannot consume".into()).await;
                    let hint = if e.to_string().contains("NOT_FOUND") {
                        "; the topology is missing: run `hookrelay topology apply`"
                    } else {
                        ""
                    };
                    return failed(format!("consuming {}: {e}{hint}", lane.queue), false);
                }
            }
        }
        info!(
            lanes = ?self.lanes.iter().map(|l| l.queue.as_str()).collect::<Vec<_>>(),
            "Consuming"
        );
        let mut deliveries = stream::select_all(streams);
        loop {
            tokio::select! {
                () = &mut *shutdown => break,
                next = deliveries.next() => match next {
                    Some((i, Some(Ok(delivery)))) => {
                        let lane = self.lanes[i].clone();
                        tracker.spawn(Arc::clone(&self.shared).handle(lane, delivery));
                    }
                    Some((i, Some(Err(e)))) => {
                        return failed(format!("consumer of {}: {e}", self.lanes[i].queue), true);
                    }
                    Some((i, None)) => {
                        return failed(format!("the broker cancelled the consumer of {}", self.lanes[i].queue), true);
                    }
                    None => return failed("no consumer left".into(), true),
                }
            }
        }
        // Drain: stop taking deliveries, let the in-flight ones ack on this connection, close.
        info!(
            in_flight = tracker.len(),
            "Shutting down: cancelling consumers and draining"
        );
        for (ch, tag) in &channels {
            if let Err(e) = ch
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await
            {
                warn!(error = %e, "Cancelling a consumer failed");
            }
        }
        drain(tracker, self.shared.config.worker.shutdown_grace).await;
        let _ = conn.close(200, "shutdown".into()).await;
        SessionEnd::Shutdown
    }
}

/// Waits for in-flight deliveries, at most `grace`. What is still unfinished then was never
/// acked, so the broker returns it to its lane when the connection closes.
async fn drain(tracker: &TaskTracker, grace: Duration) {
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!(
            in_flight = tracker.len(),
            "Drain deadline passed; unfinished deliveries return to their lanes"
        );
    }
}

/// Decrements the in-flight gauge however the task ends.
struct InFlight(prometheus::IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Shared {
    async fn handle(self: Arc<Self>, lane: Lane, delivery: Delivery) {
        let gauge = self.metrics.in_flight.with_label_values(&[lane.label]);
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
        match Envelope::from_delivery(&properties, routing_key.as_str(), &body, max_body) {
            Ok(envelope) => {
                let outcome = self.attempt(&lane, &envelope, &body).await;
                self.settle(&lane, &acker, &properties, &body, Some(&envelope), outcome)
                    .await;
            }
            Err(invalid) => {
                let attempts =
                    envelope::read_u64_header(&properties, envelope::ATTEMPTS_HEADER).unwrap_or(0);
                let outcome =
                    Outcome::invalid(invalid.to_string(), attempts.min(u32::MAX.into()) as u32);
                self.settle(&lane, &acker, &properties, &body, None, outcome)
                    .await;
            }
        }
    }

    /// Resolves the subscription as it is now, signs with its current secrets, sends, decides.
    async fn attempt(&self, lane: &Lane, envelope: &Envelope, body: &Bytes) -> Outcome {
        let Some(sub) = self.subscriptions.get(&envelope.subscription) else {
            return Outcome::invalid(
                format!("unknown subscription {:?}", envelope.subscription),
                envelope.attempts_made,
            );
        };
        if sub.tenant != envelope.tenant {
            return Outcome::invalid(
                format!(
                    "subscription {:?} belongs to tenant {:?}, not {:?}",
                    sub.id, sub.tenant, envelope.tenant
                ),
                envelope.attempts_made,
            );
        }
        if !sub.accepts(&envelope.event_type) {
            return Outcome::invalid(
                format!(
                    "subscription {:?} does not receive event type {:?}",
                    sub.id, envelope.event_type
                ),
                envelope.attempts_made,
            );
        }
        if envelope.attempts_made >= self.ladder.max_attempts() {
            return Outcome::Dead {
                reason: DeadReason::Exhausted,
                status: None,
                error: format!(
                    "arrived with {} attempts made, the whole budget",
                    envelope.attempts_made
                ),
                attempts_made: envelope.attempts_made,
            };
        }
        let (keys, errors) = self.secrets.keys_for(sub);
        for e in &errors {
            warn!(subscription = %sub.id, error = %e, "Secret reference does not resolve");
        }
        let result = if keys.is_empty() {
            AttemptResult::NotSent(format!(
                "no secret of subscription {} resolves: {}",
                sub.id,
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        } else {
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
            self.metrics
                .attempt_seconds
                .with_label_values(&[lane.label])
                .observe(report.latency.as_secs_f64());
            debug!(
                envelope = %envelope.id,
                attempt = envelope.attempts_made + 1,
                result = %report.result.describe(),
                latency_ms = report.latency.as_millis() as u64,
                response = %report.response_excerpt,
                "Attempt made"
            );
            report.result
        };
        decide(&self.ladder, envelope.attempts_made, &result)
    }

    /// Carries out the decision. Acks only after a needed republish was confirmed.
    async fn settle(
        &self,
        lane: &Lane,
        acker: &Acker,
        properties: &BasicProperties,
        body: &[u8],
        envelope: Option<&Envelope>,
        outcome: Outcome,
    ) {
        let id = properties
            .message_id()
            .as_ref()
            .map_or("(none)", |m| m.as_str());
        let kind = outcome.kind();
        let republished = match &outcome {
            Outcome::Delivered { status } => {
                debug!(envelope = %id, status, "Delivered");
                Ok(())
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
                let tier_delay = self.ladder.tiers[*tier].delay;
                let props = envelope::retry_properties(
                    properties,
                    &envelope.tenant,
                    *attempts_made,
                    now_ms() + tier_delay.as_millis() as u64,
                    error,
                );
                let tier_name = &self.ladder.tiers[*tier].name;
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
                    self.metrics.retries.with_label_values(&[tier_name]).inc();
                    info!(envelope = %id, tier = %tier_name, attempts = attempts_made, error = %error, "Scheduled retry");
                }
                result.map_err(|e| (e, tier_name.as_str()))
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
        match republished {
            Ok(()) => {
                self.metrics
                    .outcomes
                    .with_label_values(&[lane.label, kind])
                    .inc();
                if let Err(e) = acker.ack(BasicAckOptions::default()).await {
                    // The channel is gone; the broker redelivers the message (a duplicate,
                    // never a loss).
                    warn!(envelope = %id, error = %e, "Ack failed; the broker will redeliver");
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

/// Resolves when the process receives SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    info!("Shutdown signal received");
}
