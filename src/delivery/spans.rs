//! The spans of one delivery (docs/tracing.md), after the OpenTelemetry semantic conventions:
//! `process <lane>` (messaging, consumer) whose parent is the trace context the message
//! carries, with the HTTP attempt (`POST`, client) and the settlement (`settle <lane>`) as its
//! children. No secret, header value or body is ever recorded: the URL is redacted, and the
//! attributes are names, numbers and outcomes.
//!
//! Each span also records its `trace_id` and `span_id` as fields, so the JSON log lines written
//! inside it carry them (`.span.trace_id`).

use lapin::BasicProperties;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::contract::trace_context;
use crate::delivery::lane::{Lane, LaneKind};
use crate::delivery::route::{AttemptResult, Outcome};
use crate::observe::traces::{SPAN_TARGET, redacted_url};

/// The span of one delivery's processing, child of the context its headers carry.
pub(crate) fn process(lane: &Lane, properties: &BasicProperties) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "process",
        otel.name = %format!("process {}", lane.queue),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.operation.name = "deliver",
        messaging.destination.name = %lane.queue,
        messaging.message.id = Empty,
        hookrelay.lane = match lane.kind {
            LaneKind::First => "first",
            LaneKind::Retry => "retry",
        },
        hookrelay.tenant = Empty,
        hookrelay.subscription = Empty,
        hookrelay.attempt = Empty,
        hookrelay.outcome = Empty,
        hookrelay.tier = Empty,
        trace_id = Empty,
        span_id = Empty,
    );
    if let Some(parent) = trace_context::parent_of(properties.headers().as_ref()) {
        // Fails only without the OpenTelemetry layer, when there is nothing to parent.
        let _ = span.set_parent(parent);
    }
    record_ids(&span);
    span
}

/// The span of the HTTP attempt, a child of the current (process) span.
pub(crate) fn attempt(url: &url::Url, attempt: u32) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "attempt",
        otel.name = "POST",
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = "POST",
        http.response.status_code = Empty,
        server.address = url.host_str().unwrap_or_default(),
        server.port = url.port_or_known_default().unwrap_or_default(),
        url.full = %redacted_url(url),
        error.type = Empty,
        hookrelay.attempt = attempt,
        trace_id = Empty,
        span_id = Empty,
    );
    record_ids(&span);
    span
}

/// Records what the attempt came to: the status, or the kind of failure (never its text,
/// which may quote the response).
pub(crate) fn attempt_result(span: &Span, result: &AttemptResult) {
    match result {
        AttemptResult::Response { status, .. } => {
            span.record("http.response.status_code", *status);
            if *status >= 400 {
                span.record("error.type", status.to_string());
                span.record("otel.status_code", "ERROR");
            }
        }
        other => {
            span.record("error.type", error_type(other));
            span.record("otel.status_code", "ERROR");
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

/// The span of the settlement (ack, republish to a tier, dead letter), a child of the process
/// span.
pub(crate) fn settle(lane: &Lane, outcome: &Outcome, tier: Option<&str>) -> Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "settle",
        otel.name = %format!("settle {}", lane.queue),
        otel.kind = "client",
        messaging.system = "rabbitmq",
        messaging.operation.type = "settle",
        messaging.destination.name = %lane.queue,
        hookrelay.outcome = outcome.kind(),
        hookrelay.tier = tier,
        trace_id = Empty,
        span_id = Empty,
    );
    record_ids(&span);
    span
}

/// `trace_id` and `span_id` of an OpenTelemetry span, for the log lines written inside it;
/// nothing when traces are off.
fn record_ids(span: &Span) {
    let cx = span.context();
    let otel = opentelemetry::trace::TraceContextExt::span(&cx);
    let sc = otel.span_context();
    if sc.is_valid() {
        span.record("trace_id", sc.trace_id().to_string());
        span.record("span_id", sc.span_id().to_string());
    }
}

/// The message's properties with the process span's context when it came with none: every
/// copy settle makes of it (tier, deferral, parking, dead sink, fan-out) then carries it, and
/// every later attempt joins this trace.
pub(crate) fn carried(properties: &BasicProperties, span: &Span) -> Option<BasicProperties> {
    if span.is_disabled() || trace_context::carries_context(properties) {
        return None;
    }
    let cx = span.context();
    let given = trace_context::with_context_if_absent(properties.clone(), &cx);
    (given != *properties).then_some(given)
}

/// The `traceparent` (and `tracestate`) to send to a receiver that asked for them: the context
/// of the attempt span, so its spans are children of the attempt.
pub(crate) fn webhook_headers(span: &Span) -> Vec<(String, String)> {
    trace_context::headers_of(&span.context())
}
