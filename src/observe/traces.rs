//! OpenTelemetry traces over OTLP (docs/tracing.md): the tracer provider, the `tracing` layer
//! that turns hookrelay's spans into OpenTelemetry spans, and the queue between them and the
//! collector.
//!
//! A finished span is handed to a bounded queue without waiting; one thread of its own sends
//! batches to the collector. A slow or missing collector fills the queue, and what does not fit
//! is dropped and counted (`hookrelay_trace_spans_dropped_total`): a delivery never waits on
//! tracing. The SDK's own batch processor drops the same way but keeps its count to itself,
//! which is why this one exists.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use prometheus::{IntCounter, IntCounterVec, Opts};
use tokio::sync::mpsc;

use crate::config::{OtlpProtocol, TraceSampler, TracesConfig};

/// The `tracing` target of every span exported: the layer sees these and nothing else (none of
/// the dependencies' spans, the exporter's own HTTP client among them).
pub const SPAN_TARGET: &str = "hookrelay::trace";

/// Why traces could not start.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    #[error("the trace export thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
}

/// The counts of the export pipeline, process-wide like the provider; every worker's registry
/// exports them.
#[derive(Clone)]
pub struct TraceMetrics {
    /// Spans lost, by reason: `queue_full` (the collector is slower than the spans come),
    /// `export_failed` (it refused, failed or timed out).
    pub dropped: IntCounterVec,
    /// Spans the collector took.
    pub exported: IntCounter,
}

/// The pipeline's counts.
pub fn metrics() -> &'static TraceMetrics {
    static METRICS: OnceLock<TraceMetrics> = OnceLock::new();
    METRICS.get_or_init(|| TraceMetrics {
        dropped: IntCounterVec::new(
            Opts::new(
                "hookrelay_trace_spans_dropped_total",
                "Finished spans not exported, by reason (queue_full, export_failed).",
            ),
            &["reason"],
        )
        .expect("valid metric"),
        exported: IntCounter::new(
            "hookrelay_trace_spans_exported_total",
            "Finished spans the collector took.",
        )
        .expect("valid metric"),
    })
}

/// Traces, started: keep it for as long as spans should be exported, and shut it down at exit
/// so the last batch is sent.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts the export thread and the provider; `None` when `[traces]` names no endpoint.
    pub fn start(config: &TracesConfig) -> Result<Option<Self>, TracesError> {
        if !config.enabled() {
            return Ok(None);
        }
        let mut resource = Resource::builder_empty().with_service_name(config.service_name.clone());
        let attributes: Vec<KeyValue> = config
            .resource_pairs()?
            .into_iter()
            // `service.name` is the setting's; the attribute list does not override it.
            .filter(|(k, _)| k != "service.name")
            .map(|(k, v)| KeyValue::new(k, v))
            .collect();
        resource = resource.with_attributes(attributes);
        let resource = resource.build();
        let processor = QueueProcessor::start(config.clone(), resource.clone())?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler(config))
            .with_resource(resource)
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer to add to the `tracing` subscriber. It sees hookrelay's spans only.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer())
            .with_threads(false)
            .with_location(false)
            .with_tracked_inactivity(false)
            .with_target(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.is_span() && m.target() == SPAN_TARGET
            }))
    }

    pub fn tracer(&self) -> SdkTracer {
        self.provider.tracer("hookrelay")
    }

    /// Sends what is queued, waiting at most `grace`.
    pub fn shutdown(self, grace: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(grace) {
            tracing::warn!(error = %e, "Traces not all exported at shutdown");
        }
    }
}

fn sampler(config: &TracesConfig) -> Sampler {
    let ratio = config.sampler_arg;
    match config.sampler {
        TraceSampler::AlwaysOn => Sampler::AlwaysOn,
        TraceSampler::AlwaysOff => Sampler::AlwaysOff,
        TraceSampler::TraceIdRatio => Sampler::TraceIdRatioBased(ratio),
        TraceSampler::ParentbasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        TraceSampler::ParentbasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        TraceSampler::ParentbasedTraceIdRatio => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
        }
    }
}

/// What the export thread is asked, besides spans.
enum Control {
    /// Send everything queued, then answer.
    Flush(std::sync::mpsc::SyncSender<()>),
    /// Send everything queued, shut the exporter down, answer, and stop.
    Shutdown(std::sync::mpsc::SyncSender<()>),
}

/// Hands finished spans to the export thread through a bounded queue, never waiting.
#[derive(Debug)]
struct QueueProcessor {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::UnboundedSender<Control>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Flush(_) => "Flush",
            Control::Shutdown(_) => "Shutdown",
        })
    }
}

impl QueueProcessor {
    /// Builds the exporter on a thread of its own (gRPC and HTTP clients need a runtime, and
    /// the worker's is for deliveries) and returns once it is built or has failed.
    fn start(config: TracesConfig, resource: Resource) -> Result<Self, TracesError> {
        let (spans, span_rx) = mpsc::channel(config.queue as usize);
        let (control, control_rx) = mpsc::unbounded_channel();
        let (built_tx, built_rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("hookrelay-traces".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = built_tx.send(Err(TracesError::Thread(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut exporter = match exporter(&config) {
                        Ok(exporter) => exporter,
                        Err(e) => {
                            let _ = built_tx.send(Err(e));
                            return;
                        }
                    };
                    exporter.set_resource(&resource);
                    let _ = built_tx.send(Ok(()));
                    export_loop(exporter, &config, span_rx, control_rx).await;
                });
            })?;
        match built_rx.recv() {
            Ok(Ok(())) => Ok(Self { spans, control }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TracesError::Exporter("the export thread ended".into())),
        }
    }

    fn ask(
        &self,
        make: fn(std::sync::mpsc::SyncSender<()>) -> Control,
        timeout: Duration,
    ) -> OTelSdkResult {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.control
            .send(make(tx))
            .map_err(|_| opentelemetry_sdk::error::OTelSdkError::AlreadyShutdown)?;
        rx.recv_timeout(timeout)
            .map_err(|_| opentelemetry_sdk::error::OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            metrics().dropped.with_label_values(&["queue_full"]).inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(30))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Control::Shutdown, timeout)
    }
}

/// The OTLP exporter the settings describe.
fn exporter(config: &TracesConfig) -> Result<opentelemetry_otlp::SpanExporter, TracesError> {
    let endpoint = config.endpoint.trim().trim_end_matches('/');
    let built = match config.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(config.export_timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            // The general endpoint is a base: the traces path is added, as the specification
            // says for `OTEL_EXPORTER_OTLP_ENDPOINT`.
            .with_endpoint(format!("{endpoint}/v1/traces"))
            .with_timeout(config.export_timeout)
            .build(),
    };
    built.map_err(|e| TracesError::Exporter(e.to_string()))
}

/// Batches what arrives and sends it: when a batch is full, at every interval, and when asked.
async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    config: &TracesConfig,
    mut spans: mpsc::Receiver<SpanData>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let max = config.batch as usize;
    let mut batch = Vec::with_capacity(max);
    let mut tick = tokio::time::interval(config.export_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            asked = control.recv() => {
                while let Ok(span) = spans.try_recv() {
                    batch.push(span);
                    if batch.len() >= max {
                        send(&exporter, &mut batch, config.export_timeout).await;
                    }
                }
                send(&exporter, &mut batch, config.export_timeout).await;
                match asked {
                    Some(Control::Flush(done)) => {
                        let _ = done.send(());
                    }
                    Some(Control::Shutdown(done)) => {
                        let _ = exporter.shutdown();
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                }
            }
            span = spans.recv() => match span {
                Some(span) => {
                    batch.push(span);
                    if batch.len() >= max {
                        send(&exporter, &mut batch, config.export_timeout).await;
                    }
                }
                None => {
                    send(&exporter, &mut batch, config.export_timeout).await;
                    return;
                }
            },
            _ = tick.tick() => send(&exporter, &mut batch, config.export_timeout).await,
        }
    }
}

async fn send(
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: &mut Vec<SpanData>,
    timeout: Duration,
) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let n = spans.len() as u64;
    match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => metrics().exported.inc_by(n),
        failed => {
            metrics()
                .dropped
                .with_label_values(&["export_failed"])
                .inc_by(n);
            let error = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {timeout:?}"),
            };
            tracing::debug!(spans = n, error = %error, "Trace export failed");
        }
    }
}

/// The span of publishing one event (`hookrelay publish`, the API's test event): its context
/// goes with the event when the caller gave none, so the event's trace starts here.
pub fn publish_span(exchange: &str, id: &str) -> tracing::Span {
    tracing::info_span!(
        target: SPAN_TARGET,
        "publish",
        otel.name = %format!("publish {exchange}"),
        otel.kind = "producer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "send",
        messaging.operation.name = "publish",
        messaging.destination.name = exchange,
        messaging.message.id = id,
    )
}

/// `url.full` of an attempt: user information and every query value replaced by `REDACTED`
/// (the semantic conventions' rule; webhook URLs carry tokens there), the fragment left out.
pub fn redacted_url(url: &url::Url) -> String {
    let mut shown = url.clone();
    shown.set_fragment(None);
    if !shown.username().is_empty() || shown.password().is_some() {
        let _ = shown.set_username("REDACTED");
        let _ = shown.set_password(Some("REDACTED"));
    }
    if shown.query().is_some() {
        let keys: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
        shown.set_query(None);
        if !keys.is_empty() {
            let mut pairs = shown.query_pairs_mut();
            for key in keys {
                pairs.append_pair(&key, "REDACTED");
            }
        }
    }
    shown.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_query_values_never_reach_a_span() {
        let url: url::Url = "https://user:s3cret@hooks.example.com:8443/in/abc?token=t0k&x=1#frag"
            .parse()
            .unwrap();
        let shown = redacted_url(&url);
        assert_eq!(
            shown,
            "https://REDACTED:REDACTED@hooks.example.com:8443/in/abc?token=REDACTED&x=REDACTED"
        );
        for secret in ["user", "s3cret", "t0k", "frag"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        let plain: url::Url = "https://hooks.example.com/in".parse().unwrap();
        assert_eq!(redacted_url(&plain), "https://hooks.example.com/in");
    }

    #[test]
    fn traces_without_an_endpoint_start_nothing() {
        assert!(Traces::start(&TracesConfig::default()).unwrap().is_none());
    }

    #[test]
    fn the_samplers_are_the_specifications() {
        let mut c = TracesConfig::default();
        assert!(matches!(sampler(&c), Sampler::ParentBased(_)));
        c.sampler = TraceSampler::TraceIdRatio;
        c.sampler_arg = 0.5;
        assert!(matches!(sampler(&c), Sampler::TraceIdRatioBased(r) if r == 0.5));
    }
}
