//! The process's `tracing` subscriber: log lines to standard error, filtered by `[log]` (or
//! `RUST_LOG`), and beside them the spans exported over OTLP when `[traces]` asks for them.
//! The two filter apart: the log level does not decide which spans are exported.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::config::{Config, LogFormat};
use crate::observe::traces::{Traces, TracesError};

/// Installs the subscriber; the traces to shut down at exit, when on.
pub fn install(config: &Config) -> Result<Option<Traces>, TracesError> {
    // lapin logs every message the broker returns, body and all, at WARN: a webhook's payload
    // has no place in a log line. hookrelay counts and reports returns itself.
    const QUIET: &str = "lapin::returned_messages=error";
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(config.log.level.as_str()))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(QUIET.parse().unwrap_or_default());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // JSON lines carry the fields of the span they were written in: inside a delivery's span,
    // its `trace_id` and `span_id`.
    let lines = match config.log.format {
        LogFormat::Json => lines.json().with_filter(filter).boxed(),
        LogFormat::Text => lines.with_filter(filter).boxed(),
    };
    let traces = Traces::start(&config.traces)?;
    let spans = traces.as_ref().map(|t| t.layer());
    tracing_subscriber::registry()
        .with(lines)
        .with(spans)
        .init();
    Ok(traces)
}
