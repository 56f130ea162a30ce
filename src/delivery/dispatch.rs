//! One delivery, from the broker's hands to its settlement: read the envelope, route it
//! ([`crate::delivery::route`]), sign with the subscription's current secrets, send, decide, and
//! hand the decision to [`crate::delivery::settle`], which acks only after what replaces the
//! message (a retry, a dead letter, fan-out deliveries) is confirmed by the broker.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::message::Delivery;
use tracing::{Instrument, debug, info, warn};

use crate::catalog::{LiveCatalog, ValidationMode, Violation};
use crate::config::Config;
use crate::contract::envelope::{self, Envelope};
use crate::contract::headers;
use crate::contract::ladder::Ladder;
use crate::contract::signing::signature_header;
use crate::delivery::amqp::{AmqpMessage, AmqpSender};
use crate::delivery::endpoint::Endpoints;
use crate::delivery::health::EndpointHealth;
use crate::delivery::http::{AttemptReport, ClientPem, HttpSender, WebhookRequest};
use crate::delivery::lane::{Lane, LaneKind};
use crate::delivery::route::{AttemptResult, Outcome, Route, Screen, decide, defer, route, screen};
use crate::delivery::settle::{Settlement, Settler};
use crate::delivery::spans;
use crate::observe::events::OperationalEvent;
use crate::subscriptions::{HeaderValueSpec, LiveSubscriptions, SecretStore, Subscription};
use crate::units::now_ms;
use opentelemetry::KeyValue;

/// Everything a delivery's task needs, shared by all of them.
pub struct Dispatcher {
    pub(crate) config: Config,
    pub(crate) ladder: Ladder,
    pub(crate) subscriptions: Arc<LiveSubscriptions>,
    /// The catalog of event types, compiled: what each event's payload is validated against.
    pub(crate) catalog: Arc<LiveCatalog>,
    pub(crate) secrets: Arc<SecretStore>,
    pub(crate) http: HttpSender,
    /// Publishes to the subscriptions whose destination is a partner's broker.
    pub(crate) amqp: AmqpSender,
    /// OAuth2 tokens of the subscriptions that authenticate with one.
    pub(crate) tokens: crate::delivery::oauth::Tokens,
    pub(crate) endpoints: Endpoints,
    /// Declares a paused subscription's parking queue before anything is parked in it.
    pub(crate) parking: crate::delivery::parking::Parking,
    /// Carries each decision out: owns the publisher, the notices and the metrics.
    pub(crate) settler: Settler,
    /// Reports what the endpoints' breakers signal.
    pub(crate) health: EndpointHealth,
}

/// The decision, and what the HTTP attempt (if one was made) produced.
pub(crate) struct Attempted {
    pub(crate) outcome: Outcome,
    /// Where the attempt went ([`envelope::endpoint_fingerprint`]).
    pub(crate) endpoint: Option<String>,
    pub(crate) result: Option<AttemptResult>,
    pub(crate) latency: Option<Duration>,
}

impl Attempted {
    pub(super) fn without_attempt(outcome: Outcome) -> Self {
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
    pub(crate) fn new(
        config: Config,
        ladder: Ladder,
        subscriptions: Arc<LiveSubscriptions>,
        secrets: Arc<SecretStore>,
        (http, amqp): (HttpSender, AmqpSender),
        settler: Settler,
        store: Option<crate::store::PgStore>,
    ) -> Self {
        let unlisted = config.catalog.unlisted;
        Self {
            catalog: Arc::new(LiveCatalog::new(crate::catalog::Catalog::empty(unlisted))),
            health: EndpointHealth {
                subscriptions: Arc::clone(&subscriptions),
                store,
                notices: settler.notices.clone(),
                metrics: settler.metrics.clone(),
            },
            endpoints: Endpoints::for_ladder(config.endpoints.clone(), &ladder),
            parking: crate::delivery::parking::Parking::new(
                config.amqp.url.clone(),
                &ladder.prefix,
            ),
            config,
            ladder,
            subscriptions,
            secrets,
            http,
            amqp,
            tokens: crate::delivery::oauth::Tokens::counted(settler.metrics.oauth_tokens.clone()),
            settler,
        }
    }

    /// Handles one delivery to the end: an ack, or a nack back to its lane. `handed_over` is
    /// when the broker handed it over, which starts its lease: every delivery gets its task at
    /// once, but a shard's may then wait for a permit of the worker-wide budget.
    pub async fn handle(
        self: Arc<Self>,
        lane: Arc<Lane>,
        delivery: Delivery,
        handed_over: tokio::time::Instant,
    ) {
        let lease_end = handed_over + self.config.lease();
        let gauge = lane.metrics.in_flight.clone();
        gauge.inc();
        let _in_flight = InFlight(gauge);
        let span = spans::process(&lane, &delivery.properties);
        let logs = span.log_span();
        self.process(lane, delivery, lease_end, &span)
            .instrument(logs)
            .await;
    }

    async fn process(
        &self,
        lane: Arc<Lane>,
        delivery: Delivery,
        lease_end: tokio::time::Instant,
        span: &spans::Traced,
    ) {
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
                    span.set(|| {
                        KeyValue::new("messaging.message.id", envelope.id.as_str().to_owned())
                    });
                    span.set(|| {
                        KeyValue::new("hookrelay.tenant", envelope.tenant.as_str().to_owned())
                    });
                    span.set(|| {
                        KeyValue::new("hookrelay.attempt", i64::from(envelope.attempts_made) + 1)
                    });
                    self.observe_head(&lane, &properties, &envelope);
                    let attempted = self.attempt(&lane, &envelope, &body, span).await;
                    (Some(envelope), attempted)
                }
                Err(invalid) => {
                    let attempts = headers::read_u64_header(&properties, headers::ATTEMPTS_HEADER)
                        .unwrap_or(0)
                        .min(u64::from(u32::MAX)) as u32;
                    let outcome = Outcome::invalid(invalid.to_string(), attempts);
                    (None, Attempted::without_attempt(outcome))
                }
            };
        let tier = match &attempted.outcome {
            Outcome::Retry { tier, .. } => Some(self.ladder.tier(*tier).name.as_str()),
            _ => None,
        };
        span.set(|| KeyValue::new("hookrelay.outcome", attempted.outcome.kind()));
        if let Some(tier) = tier {
            span.set(|| KeyValue::new("hookrelay.tier", tier.to_owned()));
        }
        let settle_span = spans::settle(span, &lane, &attempted.outcome, tier);
        // Every copy of a message that came without a trace context carries this one's; a
        // delivered message is only acked, so it makes no copy.
        let carried = match attempted.outcome {
            Outcome::Delivered { .. } => None,
            _ => spans::carried(&properties, span),
        };
        self.settler
            .settle(Settlement {
                lane: &lane,
                acker: &acker,
                properties: carried.as_ref().unwrap_or(&properties),
                body: &body,
                envelope: envelope.as_ref(),
                attempted,
                lease_end,
            })
            .await;
        drop(settle_span);
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
        // Labelled only with the ladder's own tier names: a retired tier's promotions (and a
        // forged `x-death`) go uncounted rather than adding series without bound.
        if lane.kind == LaneKind::Retry
            && let Some(tier) = headers::promoting_tier(&self.ladder, properties)
        {
            let tier = self.ladder.tier(tier).name.as_str();
            self.settler
                .metrics
                .promotions
                .with_label_values(&[tier])
                .inc();
            if let Some(due) = envelope.due_ms {
                self.settler
                    .metrics
                    .promotion_lag
                    .with_label_values(&[tier])
                    .observe(now.saturating_sub(due) as f64 / 1000.0);
            }
        }
    }

    /// Routes a valid envelope and makes the HTTP attempt when the route calls for one.
    async fn attempt(
        &self,
        lane: &Lane,
        envelope: &Envelope,
        body: &Bytes,
        span: &spans::Traced,
    ) -> Attempted {
        match screen(envelope, body, lane.kind, &self.catalog.current()) {
            Screen::Pass => {}
            Screen::Warn { listed, violation } => {
                self.schema_invalid(envelope, ValidationMode::Warn, listed, &violation);
            }
            Screen::Refuse {
                outcome,
                listed,
                violation,
            } => {
                self.schema_invalid(envelope, ValidationMode::Enforce, listed, &violation);
                return Attempted::without_attempt(outcome);
            }
        }
        let subscriptions = match self.subscriptions_for(lane, envelope).await {
            Ok(subscriptions) => subscriptions,
            Err(unserved) => return unserved,
        };
        let sub = match route(envelope, body, lane.kind, &subscriptions, &self.ladder) {
            Route::Settle(Outcome::Parked { subscription }) => {
                return self.park(&subscriptions, subscription).await;
            }
            Route::Settle(outcome) => return Attempted::without_attempt(outcome),
            Route::Attempt(sub) => sub,
        };
        span.set(|| KeyValue::new("hookrelay.subscription", sub.id.as_str().to_owned()));
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
        let (result, latency) = self.send(lane, envelope, &sub, body, span).await;
        let outcome = match &result {
            AttemptResult::Deferred { reason, cause } => defer(
                &self.ladder,
                envelope,
                reason,
                *cause,
                self.horizon(),
                now_ms(),
            ),
            made => decide(&self.ladder, envelope.attempts_made, made),
        };
        Attempted {
            outcome,
            endpoint: Some(endpoint),
            result: Some(result),
            latency,
        }
    }

    /// Counts a payload its schema refused, and says so on the events exchange
    /// (`delivery.schema_invalid`, reason the mode) for the producer's owners to act on.
    fn schema_invalid(
        &self,
        envelope: &Envelope,
        mode: ValidationMode,
        listed: bool,
        violation: &Violation,
    ) {
        let label = if listed {
            envelope.event_type.as_str()
        } else {
            "unlisted"
        };
        self.settler
            .metrics
            .schema_invalid
            .with_label_values(&[label, mode.as_str()])
            .inc();
        debug!(envelope = %envelope.id, event_type = %envelope.event_type, mode = %mode, violation = %violation, "Payload does not match its schema");
        let detail = format!("event type {:?}: {violation}", envelope.event_type);
        self.settler.notices.operational(
            OperationalEvent::new("delivery.schema_invalid", mode.as_str())
                .detail(&detail)
                .about(
                    &envelope.tenant,
                    envelope.subscription.as_deref(),
                    envelope.id.as_str(),
                ),
        );
    }

    /// A paused subscription's delivery: its parking queue must exist before settle republishes
    /// into it. Should the declare fail, the republish is refused as unroutable and retried as
    /// any unconfirmed republish is; nothing is lost.
    async fn park(
        &self,
        subscriptions: &Arc<crate::subscriptions::Subscriptions>,
        subscription: String,
    ) -> Attempted {
        let declared = match subscriptions.get(&subscription) {
            Some(version) => self.parking.ensure(&self.ladder, version).await,
            None => Ok(()),
        };
        if let Err(e) = declared {
            warn!(subscription = %subscription, error = %e, "Parking queue not declared");
        }
        Attempted::without_attempt(Outcome::Parked { subscription })
    }

    /// The delivery horizon: as configured, or the schedule's span.
    pub(super) fn horizon(&self) -> Duration {
        self.ladder.horizon(self.config.endpoints.horizon)
    }

    /// The subscription's own headers and its basic auth, secrets resolved now; the error names
    /// the header and the reference, never a value.
    fn extra_headers(
        &self,
        sub: &Subscription,
    ) -> Result<Vec<(reqwest::header::HeaderName, reqwest::header::HeaderValue)>, String> {
        use base64::Engine;
        use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
        let mut out = Vec::with_capacity(sub.headers.len() + 1);
        for h in &sub.headers {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("header {:?} is not a header name", h.name))?;
            let (value, sensitive) = match &h.value {
                HeaderValueSpec::Static(v) => (HeaderValue::from_str(v), false),
                HeaderValueSpec::Secret(r) => {
                    let text = self
                        .secrets
                        .resolve_text(r)
                        .map_err(|e| format!("header {}: {e}", h.name))?;
                    (HeaderValue::from_str(&text), true)
                }
            };
            let mut value = value.map_err(|_| {
                format!(
                    "header {}: its value is not a header value (visible ASCII and spaces)",
                    h.name
                )
            })?;
            value.set_sensitive(sensitive);
            out.push((name, value));
        }
        if let Some(basic) = &sub.basic_auth {
            let password = self
                .secrets
                .resolve_text(&basic.password)
                .map_err(|e| format!("basic_auth password: {e}"))?;
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{password}", basic.username));
            let mut value = HeaderValue::from_str(&format!("Basic {token}"))
                .map_err(|_| "basic_auth: not a header value".to_owned())?;
            value.set_sensitive(true);
            out.push((AUTHORIZATION, value));
        }
        Ok(out)
    }

    /// The subscription's client certificate, key and CA as PEM, read now (within the secret
    /// refresh, so a rotated certificate is used without a restart); the error names the
    /// references, never what they hold.
    fn client_pem(&self, sub: &Subscription) -> Result<Option<ClientPem>, String> {
        let Some(tls) = &sub.tls else {
            return Ok(None);
        };
        let read = |what: &str, r| {
            self.secrets
                .resolve_text(r)
                .map_err(|e| format!("tls.{what}: {e}"))
        };
        let cert = read("cert", &tls.cert)?;
        let key = read("key", &tls.key)?;
        let ca = match &tls.ca {
            None => None,
            Some(r) => Some(read("ca", r)?),
        };
        Ok(Some(ClientPem {
            subscription: sub.id.clone(),
            identity: Arc::from(format!("{cert}\n{key}\n")),
            ca,
        }))
    }

    /// The attempt as a message published to the subscription's broker: the same signed
    /// headers, its own headers as AMQP headers, its basic auth as the broker login.
    async fn publish(
        &self,
        sub: &Subscription,
        target: &crate::subscriptions::AmqpTarget,
        event_type: &str,
        request: WebhookRequest<'_>,
    ) -> AttemptReport {
        let login = match &sub.basic_auth {
            None => None,
            Some(basic) => match self.secrets.resolve_text(&basic.password) {
                Ok(password) => Some((basic.username.clone(), password.to_string())),
                Err(e) => {
                    return AttemptReport {
                        result: AttemptResult::NotSent(format!("basic_auth password: {e}")),
                        latency: Duration::ZERO,
                        response_excerpt: String::new(),
                    };
                }
            },
        };
        let extra = request
            .extra
            .iter()
            .filter(|(name, _)| *name != reqwest::header::AUTHORIZATION)
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
            .collect();
        self.amqp
            .send(AmqpMessage {
                subscription: &sub.id,
                url: &sub.url,
                target,
                event_type,
                id: request.id,
                attempt: request.attempt,
                timestamp: request.timestamp,
                signature: request.signature,
                body: request.body,
                extra,
                login,
                client_tls: request.client_tls,
            })
            .await
    }

    /// Signs with every unexpired secret that resolves now, and sends.
    async fn send(
        &self,
        lane: &Lane,
        envelope: &Envelope,
        sub: &Subscription,
        body: &Bytes,
        span: &spans::Traced,
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
        let extra = match self.extra_headers(sub) {
            Ok(extra) => extra,
            Err(reason) => {
                warn!(subscription = %sub.id, error = %reason, "A header of the subscription cannot be made");
                return (AttemptResult::NotSent(reason), None);
            }
        };
        let client_tls = match self.client_pem(sub) {
            Ok(pem) => pem,
            Err(reason) => {
                warn!(subscription = %sub.id, error = %reason, "The client certificate of the subscription cannot be read");
                return (AttemptResult::NotSent(reason), None);
            }
        };
        // A worker whose count of the fleet is young makes no attempt yet: its share of every
        // cap and rate is not known ([`crate::delivery::fleet`]).
        self.endpoints.fleet().settled().await;
        let admitted = self
            .endpoints
            .admit_or_wait(&sub.url, sub.max_concurrent, sub.rate, lane.quota())
            .await;
        self.health
            .report(self.endpoints.recovering(), self.endpoints.take_signals());
        let slot = match admitted {
            Ok(slot) => slot,
            Err(deferral) => {
                self.settler
                    .metrics
                    .deferrals
                    .with_label_values(&[deferral.kind()])
                    .inc();
                let result = AttemptResult::Deferred {
                    reason: deferral.to_string(),
                    cause: deferral.cause(),
                };
                return (result, None);
            }
        };
        // After admission: an endpoint that takes nothing now costs its token endpoint nothing.
        let mut extra = extra;
        let token = match &sub.oauth2 {
            None => None,
            Some(spec) => match self
                .tokens
                .get(&sub.id, spec, &self.secrets, &self.http)
                .await
            {
                Ok(token) => {
                    match reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.value))
                    {
                        Ok(mut value) => {
                            value.set_sensitive(true);
                            extra.push((reqwest::header::AUTHORIZATION, value));
                        }
                        // Checked when the token was parsed; a token that cannot be sent is no token.
                        Err(_) => {
                            let result = AttemptResult::NotSent(
                                "the OAuth2 access token is not a header value".into(),
                            );
                            slot.finish(&result);
                            return (result, None);
                        }
                    }
                    Some(token)
                }
                Err(reason) => {
                    warn!(subscription = %sub.id, error = %reason, "No OAuth2 token for the subscription");
                    let result = AttemptResult::NotSent(reason.to_string());
                    slot.finish(&result);
                    return (result, None);
                }
            },
        };
        let timestamp = now_ms() / 1000;
        let signature = signature_header(
            keys.iter().map(AsRef::as_ref),
            envelope.id.as_str(),
            timestamp,
            body,
        );
        let attempt_span = match &sub.amqp {
            None => spans::attempt(span, &sub.url, envelope.attempts_made + 1),
            Some(target) => spans::publish_attempt(span, &sub.url, target, envelope),
        };
        if sub.trace_context {
            for (name, value) in spans::webhook_headers(&attempt_span) {
                if let (Ok(name), Ok(value)) = (
                    reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                    reqwest::header::HeaderValue::from_str(&value),
                ) {
                    extra.push((name, value));
                }
            }
        }
        let request = WebhookRequest {
            url: &sub.url,
            id: &envelope.id,
            attempt: envelope.attempts_made + 1,
            timestamp,
            signature,
            body: body.clone(),
            extra,
            client_tls,
        };
        let report = match &sub.amqp {
            None => self.http.send(request).await,
            Some(target) => {
                self.publish(sub, target, &envelope.event_type, request)
                    .await
            }
        };
        spans::attempt_result(&attempt_span, &report.result, sub.amqp.is_none());
        drop(attempt_span);
        let mut report = report;
        if let (Some(token), AttemptResult::Response { status: 401, .. }) = (&token, &report.result)
        {
            // The token may have been revoked or rotated early: the next attempt gets a new one.
            self.tokens.refused(&sub.id, token);
            report.result = AttemptResult::TokenRefused(
                "HTTP 401: the endpoint refused the OAuth2 token; the next attempt fetches a new one"
                    .into(),
            );
        }
        slot.finish(&report.result);
        self.health
            .report(self.endpoints.recovering(), self.endpoints.take_signals());
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
}
