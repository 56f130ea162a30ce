//! The W3C trace context an event carries in its AMQP headers (`traceparent`, `tracestate`),
//! as RabbitMQ's and the OpenTelemetry AMQP instrumentations write it. A producer's context is
//! the parent of every span hookrelay makes for the event; an event that came without one gets
//! the context of its first span, so every later attempt joins the same trace. Every copy
//! hookrelay republishes (tier, deferral, parking, dead sink, redrive, replay) keeps the
//! producer's headers, these two among them.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The W3C header naming the trace and the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header with vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// Reads string headers for the propagator; anything not a UTF-8 string is absent.
struct TableReader<'a>(&'a FieldTable);

impl Extractor for TableReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.inner().keys().map(|k| k.as_str()).collect()
    }
}

/// Collects what the propagator writes.
#[derive(Default)]
struct Written(Vec<(String, String)>);

impl Injector for Written {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

/// The remote context a message's headers carry, if they carry a valid `traceparent`.
pub fn parent_of(headers: Option<&FieldTable>) -> Option<opentelemetry::Context> {
    // Against an empty context: `extract` falls back to the current one, which inside a span
    // is that span's, and would pass it off as the message's.
    let cx = TraceContextPropagator::new()
        .extract_with_context(&opentelemetry::Context::new(), &TableReader(headers?));
    cx.span().span_context().is_valid().then_some(cx)
}

/// The context a `traceparent` value names, if it is valid.
pub fn parse_traceparent(value: &str) -> Option<opentelemetry::Context> {
    let mut table = FieldTable::default();
    table.insert(
        TRACEPARENT.into(),
        AMQPValue::LongString(value.trim().into()),
    );
    parent_of(Some(&table))
}

/// Whether the properties carry a valid trace context already.
pub fn carries_context(properties: &BasicProperties) -> bool {
    parent_of(properties.headers().as_ref()).is_some()
}

/// The `traceparent` (and `tracestate`, when not empty) of `cx`; nothing for a context without
/// a valid span.
pub fn headers_of(cx: &opentelemetry::Context) -> Vec<(String, String)> {
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut written = Written::default();
    TraceContextPropagator::new().inject_context(cx, &mut written);
    written.0.retain(|(k, v)| k != TRACESTATE || !v.is_empty());
    written.0
}

/// `properties` with the context of `cx`, unless they carry a valid one already (a producer's
/// context is never replaced: it stays the parent of every attempt) or `cx` has none.
pub fn with_context_if_absent(
    properties: BasicProperties,
    cx: &opentelemetry::Context,
) -> BasicProperties {
    if carries_context(&properties) {
        return properties;
    }
    let written = headers_of(cx);
    if written.is_empty() {
        return properties;
    }
    let mut headers = properties.headers().clone().unwrap_or_default();
    for (k, v) in written {
        headers.insert(k.as_str().into(), AMQPValue::LongString(v.as_str().into()));
    }
    properties.with_headers(headers)
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    #[test]
    fn a_producers_traceparent_is_the_parent() {
        let t = table(&[(TRACEPARENT, long(PARENT)), (TRACESTATE, long("ven=1"))]);
        let cx = parent_of(Some(&t)).expect("a valid context");
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled());
        assert!(sc.is_remote());
        assert_eq!(sc.trace_state().header(), "ven=1");
    }

    #[test]
    fn a_traceparent_given_as_text_is_parsed() {
        assert!(parse_traceparent(PARENT).is_some());
        assert!(parse_traceparent("00-abc").is_none());
    }

    #[test]
    fn a_short_string_traceparent_is_read_too() {
        let t = table(&[(TRACEPARENT, AMQPValue::ShortString(PARENT.into()))]);
        assert!(parent_of(Some(&t)).is_some());
    }

    #[test]
    fn no_malformed_or_mistyped_traceparent_is_a_parent() {
        for value in [
            long("garbage"),
            long("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            long("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            AMQPValue::LongLongInt(7),
        ] {
            let t = table(&[(TRACEPARENT, value.clone())]);
            assert!(parent_of(Some(&t)).is_none(), "{value:?}");
        }
        assert!(parent_of(None).is_none());
    }

    fn context() -> opentelemetry::Context {
        let sc = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            SpanId::from_hex("b7ad6b7169203331").unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        opentelemetry::Context::new().with_remote_span_context(sc)
    }

    #[test]
    fn inside_a_span_a_message_without_context_still_has_none() {
        let _active = context().attach();
        let t = table(&[("x-a", long("b"))]);
        assert!(parent_of(Some(&t)).is_none());
    }

    #[test]
    fn a_context_is_written_as_traceparent_without_an_empty_tracestate() {
        assert_eq!(
            headers_of(&context()),
            vec![(
                TRACEPARENT.to_owned(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()
            )]
        );
        assert!(headers_of(&opentelemetry::Context::new()).is_empty());
    }

    #[test]
    fn a_message_without_context_takes_one_and_a_producers_is_kept() {
        let bare = BasicProperties::default().with_headers(table(&[("x-a", long("b"))]));
        let given = with_context_if_absent(bare, &context());
        let cx = parent_of(given.headers().as_ref()).expect("context added");
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(
            given
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .contains_key("x-a")
        );

        let producers =
            BasicProperties::default().with_headers(table(&[(TRACEPARENT, long(PARENT))]));
        let kept = with_context_if_absent(producers.clone(), &context());
        assert_eq!(kept, producers);

        let none = BasicProperties::default();
        assert_eq!(
            with_context_if_absent(none.clone(), &opentelemetry::Context::new()),
            none
        );
    }
}
