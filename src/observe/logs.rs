//! The process's `tracing` subscriber: log lines to standard error, filtered by `[log]` (or
//! `RUST_LOG`), and beside them the spans exported over OTLP when `[traces]` asks for them.
//! The two filter apart: the log level does not decide which spans are exported.

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{Config, LogFormat};
use crate::observe::traces::{SPAN_TARGET, Traces, TracesError};

/// Leaves the delivery spans out of the log lines.
const HIDE_TRACE_SPANS: &str = "hookrelay::trace=off";
/// Keeps them in whatever the level, so a warning's line has the ids too.
const SHOW_TRACE_SPANS: &str = "hookrelay::trace=info";

/// Installs the subscriber; the traces to shut down at exit, when on.
pub fn install(config: &Config) -> Result<Option<Traces>, TracesError> {
    // lapin logs every message the broker returns, body and all, at WARN: a webhook's payload
    // has no place in a log line. hookrelay counts and reports returns itself.
    const QUIET: &str = "lapin::returned_messages=error";
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(config.log.level.as_str()))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(QUIET.parse().unwrap_or_default());
    let traces = Traces::start(&config.traces)?;
    let json = config.log.format == LogFormat::Json;
    let trace_ids = shows_trace_spans(json, traces.is_some());
    tracing_subscriber::registry()
        .with(lines(json, trace_ids, filter, std::io::stderr))
        .init();
    Ok(traces)
}

/// The log lines' layer: written by `writer`, as JSON or text, filtered by `filter`; with
/// `trace_ids`, JSON lines written inside a delivery carry its `trace_id` and `span_id`.
pub fn lines<S, W>(
    json: bool,
    trace_ids: bool,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let spans = match trace_ids {
        true => SHOW_TRACE_SPANS,
        false => HIDE_TRACE_SPANS,
    };
    let filter = filter.add_directive(spans.parse().unwrap_or_default());
    let lines = tracing_subscriber::fmt::layer().with_writer(writer);
    match (json, trace_ids) {
        (true, true) => lines
            .json()
            .event_format(TopLevelIds(tracing_subscriber::fmt::format().json()))
            .with_filter(filter)
            .and_then(KeepTraceIds)
            .boxed(),
        (true, false) => lines.json().with_filter(filter).boxed(),
        (false, _) => lines.with_filter(filter).boxed(),
    }
}

/// A delivery span's trace ids, kept with the `tracing` span for the lines written inside it.
struct TraceIds {
    trace_id: String,
    span_id: String,
}

impl Visit for TraceIds {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "trace_id" => self.trace_id = format!("{value:?}"),
            "span_id" => self.span_id = format!("{value:?}"),
            _ => {}
        }
    }
}

/// Keeps the ids of each delivery span ([`crate::observe::traces::Traced::log_span`]); such
/// spans exist only while the lines show them.
struct KeepTraceIds;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for KeepTraceIds {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().target() != SPAN_TARGET {
            return;
        }
        let mut ids = TraceIds {
            trace_id: String::new(),
            span_id: String::new(),
        };
        attrs.record(&mut ids);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(ids);
        }
    }
}

/// A JSON line with the trace's `trace_id` and `span_id` at its top level, where log stores
/// look for them to join a line to its trace.
struct TopLevelIds<F>(F);

impl<S, N, F> FormatEvent<S, N> for TopLevelIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let ids = ctx.event_scope().and_then(|scope| {
            scope.into_iter().find_map(|span| {
                let extensions = span.extensions();
                let ids = extensions.get::<TraceIds>()?;
                Some(format!(
                    r#""trace_id":"{}","span_id":"{}","#,
                    ids.trace_id, ids.span_id
                ))
            })
        });
        let Some(ids) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{{ids}{rest}"),
            None => writer.write_str(&line),
        }
    }
}

/// Whether log lines carry the delivery spans' fields: JSON lines do while traces are on, for
/// their `trace_id` and `span_id` (at the top level, and in `.span`). Otherwise the spans would only lengthen
/// each line, and with traces off cost every delivery their fields for nothing.
fn shows_trace_spans(json: bool, traces_on: bool) -> bool {
    json && traces_on
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_lines_with_traces_on_carry_the_delivery_spans() {
        assert!(shows_trace_spans(true, true));
        assert!(!shows_trace_spans(true, false));
        assert!(!shows_trace_spans(false, true));
        assert!(!shows_trace_spans(false, false));
        for directive in [HIDE_TRACE_SPANS, SHOW_TRACE_SPANS] {
            assert_eq!(
                directive.split('=').next(),
                Some(crate::observe::traces::SPAN_TARGET)
            );
            assert!(
                directive
                    .parse::<tracing_subscriber::filter::Directive>()
                    .is_ok()
            );
        }
    }
}
