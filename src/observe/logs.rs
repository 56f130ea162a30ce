//! The process's `tracing` subscriber: log lines to standard error, filtered by `[log]` (or
//! `RUST_LOG`), and beside them the spans exported over OTLP when `[traces]` asks for them.
//! The two filter apart: the log level does not decide which spans are exported.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::config::{Config, LogFormat};
use crate::observe::traces::{Traces, TracesError};

/// Leaves the delivery spans out of the log lines.
const HIDE_TRACE_SPANS: &str = "hookrelay::trace=off";
/// Keeps them in whatever the level, so a warning's line has the ids too.
const SHOW_TRACE_SPANS: &str = "hookrelay::trace=info";

/// Installs the subscriber; the traces to shut down at exit, when on.
pub fn install(config: &Config) -> Result<Option<Traces>, TracesError> {
    // lapin logs every message the broker returns, body and all, at WARN: a webhook's payload
    // has no place in a log line. hookrelay counts and reports returns itself.
    const QUIET: &str = "lapin::returned_messages=error";
    let mut filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(config.log.level.as_str()))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(QUIET.parse().unwrap_or_default());
    let traces = Traces::start(&config.traces)?;
    let json = config.log.format == LogFormat::Json;
    let spans = match shows_trace_spans(json, traces.is_some()) {
        true => SHOW_TRACE_SPANS,
        false => HIDE_TRACE_SPANS,
    };
    filter = filter.add_directive(spans.parse().unwrap_or_default());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = if json {
        lines.json().with_filter(filter).boxed()
    } else {
        lines.with_filter(filter).boxed()
    };
    tracing_subscriber::registry().with(lines).init();
    Ok(traces)
}

/// Whether log lines carry the delivery spans' fields: JSON lines do while traces are on, for
/// their `trace_id` and `span_id` (`.span.trace_id`). Otherwise the spans would only lengthen
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
