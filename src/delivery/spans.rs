//! The spans of one delivery (docs/tracing.md), after the OpenTelemetry semantic conventions:
//! `process <lane>` (messaging, consumer) whose parent is the trace context the message
//! carries, with the HTTP attempt (`POST`, client) and the settlement (`settle <lane>`) as its
//! children. No secret, header value or body is ever recorded: the URL is redacted, and the
//! attributes are names, numbers and outcomes.
//!
//! The spans are made with the OpenTelemetry API directly, not through `tracing`: a delivery
//! takes a few dozen microseconds, and a `tracing` layer translating every span, field and
//! poll into OpenTelemetry's doubled its CPU (docs/bench/results/2026-12-07-traces.json). With
//! traces off, or a span not sampled, none of this records anything.
//!
//! The log lines written inside a delivery carry its trace's ids through a `tracing` span of
//! their own ([`Traced::log_span`]), enabled only when JSON lines are written with traces on.

use lapin::BasicProperties;
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanBuilder, SpanKind, Status, TraceContextExt as _, Tracer as _};

use crate::contract::envelope::Envelope;
use crate::contract::trace_context;
use crate::delivery::lane::{Lane, LaneKind};
use crate::delivery::route::{AttemptResult, Outcome};
pub(crate) use crate::observe::traces::Traced;
use crate::observe::traces::{publish_builder, redacted_url};
use crate::subscriptions::AmqpTarget;

/// The span of one delivery's processing, child of the context its headers carry.
pub(crate) fn process(lane: &Lane, properties: &BasicProperties) -> Traced {
    if crate::observe::traces::tracer().is_none() {
        return Traced::default();
    }
    let parent = trace_context::parent_of(properties.headers().as_ref()).unwrap_or_default();
    Traced::start(|tracer| process_span(tracer, lane), &parent)
}

fn process_span(tracer: &impl opentelemetry::trace::Tracer, lane: &Lane) -> SpanBuilder {
    tracer
        .span_builder(format!("process {}", lane.queue))
        .with_kind(SpanKind::Consumer)
        .with_attributes([
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "deliver"),
            KeyValue::new("messaging.destination.name", lane.queue.clone()),
            KeyValue::new(
                "hookrelay.lane",
                match lane.kind {
                    LaneKind::First => "first",
                    LaneKind::Retry => "retry",
                },
            ),
        ])
}

/// The span of the HTTP attempt, a child of `parent` (the process span).
pub(crate) fn attempt(parent: &Traced, url: &url::Url, attempt: u32) -> Traced {
    parent.child(|tracer| {
        tracer
            .span_builder("POST")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new(
                    "server.address",
                    url.host_str().unwrap_or_default().to_owned(),
                ),
                KeyValue::new(
                    "server.port",
                    i64::from(url.port_or_known_default().unwrap_or_default()),
                ),
                KeyValue::new("url.full", redacted_url(url)),
                KeyValue::new("hookrelay.attempt", i64::from(attempt)),
            ])
    })
}

/// The span of an attempt into a partner's RabbitMQ (an AMQP destination), a child of
/// `parent`: a messaging `publish <exchange>` producer span.
pub(crate) fn publish_attempt(
    parent: &Traced,
    url: &url::Url,
    target: &AmqpTarget,
    envelope: &Envelope,
) -> Traced {
    parent.child(|tracer| {
        let exchange = match target.exchange.as_str() {
            "" => "amq.default",
            named => named,
        };
        publish_builder(
            tracer,
            exchange,
            envelope.id.as_str(),
            [
                KeyValue::new(
                    "messaging.rabbitmq.destination.routing_key",
                    target.routing_key_for(&envelope.event_type).to_owned(),
                ),
                KeyValue::new(
                    "server.address",
                    url.host_str().unwrap_or_default().to_owned(),
                ),
                KeyValue::new(
                    "server.port",
                    i64::from(url.port_or_known_default().unwrap_or(5672)),
                ),
                KeyValue::new("hookrelay.attempt", i64::from(envelope.attempts_made + 1)),
            ],
        )
    })
}

/// Records what the attempt came to: the status, or the kind of failure (never its text,
/// which may quote the response). A publish has no HTTP status: a confirm records nothing,
/// and an exchange the partner does not have is `error.type=exchange_not_found`.
pub(crate) fn attempt_result(span: &Traced, result: &AttemptResult, http: bool) {
    let Some(cx) = span.context() else {
        return;
    };
    let span = cx.span();
    if !span.is_recording() {
        return;
    }
    match result {
        AttemptResult::Response { status, .. } if !http => {
            if *status >= 400 {
                span.set_attribute(KeyValue::new("error.type", "exchange_not_found"));
                span.set_status(Status::error(""));
            }
        }
        AttemptResult::Response { status, .. } => {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(*status),
            ));
            if *status >= 400 {
                span.set_attribute(KeyValue::new("error.type", status.to_string()));
                span.set_status(Status::error(""));
            }
        }
        other => {
            span.set_attribute(KeyValue::new("error.type", error_type(other)));
            span.set_status(Status::error(""));
        }
    }
}

/// The kind of failure of an attempt without a response.
fn error_type(result: &AttemptResult) -> &'static str {
    match result {
        AttemptResult::Response { .. } => "response",
        AttemptResult::Timeout => "timeout",
        AttemptResult::Transport(_) => "transport",
        AttemptResult::NotSent(_) => "not_sent",
        AttemptResult::EgressDenied(_) => "egress_denied",
        AttemptResult::TokenRefused(_) => "token_refused",
        AttemptResult::Deferred { .. } => "deferred",
    }
}

/// The span of the settlement (ack, republish to a tier, dead letter), a child of `parent`
/// (the process span).
pub(crate) fn settle(
    parent: &Traced,
    lane: &Lane,
    outcome: &Outcome,
    tier: Option<&str>,
) -> Traced {
    if !parent.is_recording() {
        return Traced::default();
    }
    let mut attributes = vec![
        KeyValue::new("messaging.system", "rabbitmq"),
        KeyValue::new("messaging.operation.type", "settle"),
        KeyValue::new("messaging.destination.name", lane.queue.clone()),
        KeyValue::new("hookrelay.outcome", outcome.kind()),
    ];
    if let Some(tier) = tier {
        attributes.push(KeyValue::new("hookrelay.tier", tier.to_owned()));
    }
    parent.child(|tracer| {
        tracer
            .span_builder(format!("settle {}", lane.queue))
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
    })
}

/// The message's properties with the process span's context when it came with none: every
/// copy settle makes of it (tier, deferral, parking, dead sink, fan-out) then carries it, and
/// every later attempt joins this trace.
pub(crate) fn carried(properties: &BasicProperties, span: &Traced) -> Option<BasicProperties> {
    let cx = span.context()?;
    if trace_context::carries_context(properties) {
        return None;
    }
    let given = trace_context::with_context_if_absent(properties.clone(), cx);
    (given != *properties).then_some(given)
}

/// The `traceparent` (and `tracestate`) to send to a receiver that asked for them: the context
/// of the attempt span, so its spans are children of the attempt.
pub(crate) fn webhook_headers(span: &Traced) -> Vec<(String, String)> {
    span.context()
        .map(trace_context::headers_of)
        .unwrap_or_default()
}
