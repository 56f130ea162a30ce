//! OpenTelemetry traces over OTLP (docs/tracing.md): the tracer provider, the process's tracer
//! that hookrelay's spans are started with ([`tracer`], [`Traced`]), and the queue between them
//! and the collector.
//!
//! A finished span is handed to a bounded queue without waiting; one thread of its own sends
//! batches to the collector. A slow or missing collector fills the queue, and what does not fit
//! is dropped and counted (`hookrelay_trace_spans_dropped_total`): a delivery never waits on
//! tracing. The SDK's own batch processor drops the same way but keeps its count to itself,
//! which is why this one exists.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{SpanKind, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use prometheus::{IntCounter, IntCounterVec, Opts};
use tokio::sync::{Notify, mpsc};

use crate::config::{OtlpProtocol, TraceSampler, TracesConfig};

/// The `tracing` target of the spans that carry a trace's ids into log lines
/// ([`Traced::log_span`]); the log filter shows them only as JSON with traces on.
pub const SPAN_TARGET: &str = "hookrelay::trace";

/// The tracer of the traces started last, while they run: process-wide, as the provider is.
static TRACER: RwLock<Option<SdkTracer>> = RwLock::new(None);

/// The tracer spans are started with; `None` while traces are off.
pub fn tracer() -> Option<SdkTracer> {
    TRACER.read().ok()?.clone()
}

/// One span, started: its context (the span and its parents), or nothing when traces are off.
/// Ended when dropped.
#[derive(Debug, Default)]
pub struct Traced {
    cx: Option<Context>,
}

impl Traced {
    /// The span `builder` describes, started under `parent`; nothing when traces are off.
    pub fn start(
        builder: impl FnOnce(&SdkTracer) -> opentelemetry::trace::SpanBuilder,
        parent: &Context,
    ) -> Self {
        let Some(tracer) = tracer() else {
            return Self::default();
        };
        let span = builder(&tracer).start_with_context(&tracer, parent);
        Self {
            cx: Some(parent.with_span(span)),
        }
    }

    /// The span `builder` describes, as a child of this one; nothing when traces are off.
    pub fn child(
        &self,
        builder: impl FnOnce(&SdkTracer) -> opentelemetry::trace::SpanBuilder,
    ) -> Self {
        match &self.cx {
            Some(parent) => Self::start(builder, parent),
            None => Self::default(),
        }
    }

    /// The context to parent other spans on, and to send on; `None` when traces are off.
    pub fn context(&self) -> Option<&Context> {
        self.cx.as_ref()
    }

    /// Whether the span records: traces are on and it was sampled.
    pub fn is_recording(&self) -> bool {
        self.cx.as_ref().is_some_and(|cx| cx.span().is_recording())
    }

    /// Sets an attribute, when the span records; `attribute` is not called otherwise.
    pub fn set(&self, attribute: impl FnOnce() -> KeyValue) {
        if let Some(cx) = &self.cx {
            let span = cx.span();
            if span.is_recording() {
                span.set_attribute(attribute());
            }
        }
    }

    /// A `tracing` span holding the trace's `trace_id` and `span_id`, so the log lines written
    /// inside it carry them (`.span.trace_id`). Disabled, and free, unless the log lines are
    /// JSON with traces on ([`crate::observe::logs`]).
    pub fn log_span(&self) -> tracing::Span {
        let Some(cx) = &self.cx else {
            return tracing::Span::none();
        };
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return tracing::Span::none();
        }
        tracing::info_span!(
            target: SPAN_TARGET,
            "delivery",
            trace_id = %sc.trace_id(),
            span_id = %sc.span_id(),
        )
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }
}

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
        if let Ok(mut tracer) = TRACER.write() {
            *tracer = Some(provider.tracer("hookrelay"));
        }
        Ok(Some(Self { provider }))
    }

    /// Sends what is queued, waiting at most `grace`; spans started after are not recorded.
    pub fn shutdown(self, grace: Duration) {
        if let Ok(mut tracer) = TRACER.write() {
            *tracer = None;
        }
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

/// Finished spans waiting for the export thread, at most `capacity`. The thread is woken when
/// a batch is full (or at its interval), never for each span: a wake per span cost the worker a
/// context switch per span, more than the span itself.
#[derive(Debug)]
struct Queue<T = SpanData> {
    spans: Mutex<Vec<T>>,
    capacity: usize,
    batch: usize,
    full: Notify,
}

impl<T> Queue<T> {
    fn new(config: &TracesConfig) -> Self {
        Self {
            spans: Mutex::new(Vec::new()),
            capacity: config.queue as usize,
            batch: config.batch as usize,
            full: Notify::new(),
        }
    }

    /// Adds `span`, or gives it back when the queue is full.
    fn push(&self, span: T) -> Result<(), T> {
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if spans.len() >= self.capacity {
            return Err(span);
        }
        spans.push(span);
        let wake = spans.len() == self.batch;
        drop(spans);
        if wake {
            self.full.notify_one();
        }
        Ok(())
    }

    /// Everything queued, in the order it came.
    fn take(&self) -> Vec<T> {
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        // An idle tick takes nothing and leaves the room it has.
        if spans.is_empty() {
            return Vec::new();
        }
        std::mem::replace(&mut *spans, Vec::with_capacity(self.batch))
    }
}

/// Hands finished spans to the export thread through a bounded queue, never waiting.
#[derive(Debug)]
struct QueueProcessor {
    queue: Arc<Queue>,
    control: mpsc::UnboundedSender<Control>,
    /// `hookrelay_trace_spans_dropped_total`'s two series, looked up once.
    queue_full: IntCounter,
    export_failed: IntCounter,
    /// Until when (ms since the epoch) the collector is taken to be down: spans finished
    /// before then are dropped at once, rather than queued and encoded for a collector that
    /// refused the last batch ([`Backoff`]).
    down_until: Arc<AtomicU64>,
}

/// How long the export thread leaves a collector alone after a failed export: the export
/// interval, doubling with each failure in a row up to [`Backoff::MAX`], and nothing once one
/// succeeds. A collector that is gone then costs the worker the spans' bookkeeping only, not
/// their encoding and a connection attempt for every batch.
#[derive(Debug)]
struct Backoff {
    base: Duration,
    next: Duration,
}

impl Backoff {
    const MAX: Duration = Duration::from_secs(30);

    fn new(base: Duration) -> Self {
        Self { base, next: base }
    }

    /// The pause after one more failure in a row.
    fn failed(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(Self::MAX.max(self.base));
        pause
    }

    fn succeeded(&mut self) {
        self.next = self.base;
    }
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
        let queue = Arc::new(Queue::new(&config));
        let queued = Arc::clone(&queue);
        let down_until = Arc::new(AtomicU64::new(0));
        let down = Arc::clone(&down_until);
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
                    export_loop(exporter, &config, &queued, control_rx, &down).await;
                });
            })?;
        match built_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                queue,
                control,
                queue_full: metrics().dropped.with_label_values(&["queue_full"]),
                export_failed: metrics().dropped.with_label_values(&["export_failed"]),
                down_until,
            }),
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
        if crate::units::now_ms() < self.down_until.load(Ordering::Relaxed) {
            self.export_failed.inc();
            return;
        }
        if self.queue.push(span).is_err() {
            self.queue_full.inc();
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
    let Some(url) = config.export_url() else {
        return Err(TracesError::Exporter("no endpoint".into()));
    };
    let built = match config.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(url)
            .with_timeout(config.export_timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(config.export_timeout)
            .build(),
    };
    built.map_err(|e| TracesError::Exporter(e.to_string()))
}

/// Sends what is queued: when a batch is full, at every interval, and when asked.
async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    config: &TracesConfig,
    queue: &Queue,
    mut control: mpsc::UnboundedReceiver<Control>,
    down_until: &AtomicU64,
) {
    let mut out = Sender {
        exporter: &exporter,
        timeout: config.export_timeout,
        batch: config.batch as usize,
        backoff: Backoff::new(config.export_interval),
        down_until,
    };
    let mut tick = tokio::time::interval(config.export_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            asked = control.recv() => {
                out.send_all(queue.take()).await;
                match asked {
                    Some(Control::Flush(done)) => {
                        let _ = done.send(());
                    }
                    Some(Control::Shutdown(done)) => {
                        let _ = exporter.shutdown();
                        let _ = done.send(());
                        return;
                    }
                    // The processor is gone: nothing more can come.
                    None => return,
                }
            }
            () = queue.full.notified() => out.send_all(queue.take()).await,
            _ = tick.tick() => out.send_all(queue.take()).await,
        }
    }
}

/// Sends batches to the collector, and leaves it alone for a while after a failure.
struct Sender<'a> {
    exporter: &'a opentelemetry_otlp::SpanExporter,
    timeout: Duration,
    /// Spans in one request at most.
    batch: usize,
    backoff: Backoff,
    down_until: &'a AtomicU64,
}

impl Sender<'_> {
    /// Sends `spans` in requests of a batch at most.
    async fn send_all(&mut self, mut spans: Vec<SpanData>) {
        while !spans.is_empty() {
            let rest = spans.split_off(spans.len().min(self.batch));
            self.send(spans).await;
            spans = rest;
        }
    }

    async fn send(&mut self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        if crate::units::now_ms() < self.down_until.load(Ordering::Relaxed) {
            // Queued before the collector failed: not worth encoding for it now.
            metrics()
                .dropped
                .with_label_values(&["export_failed"])
                .inc_by(n);
            return;
        }
        match tokio::time::timeout(self.timeout, self.exporter.export(spans)).await {
            Ok(Ok(())) => {
                metrics().exported.inc_by(n);
                self.backoff.succeeded();
            }
            failed => {
                metrics()
                    .dropped
                    .with_label_values(&["export_failed"])
                    .inc_by(n);
                let pause = self.backoff.failed();
                self.down_until.store(
                    crate::units::now_ms().saturating_add(pause.as_millis() as u64),
                    Ordering::Relaxed,
                );
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", self.timeout),
                };
                tracing::debug!(
                    spans = n,
                    error = %error,
                    pause = ?pause,
                    "Trace export failed; spans are dropped until the pause ends"
                );
            }
        }
    }
}

/// The span of publishing one event (`hookrelay publish`, the API's test event), a child of
/// `parent` (a producer's `traceparent`) when given: its context goes with the event, so the
/// event's trace starts here.
pub fn publish_span(exchange: &str, id: &str, parent: Option<&Context>) -> Traced {
    let root = Context::new();
    Traced::start(
        |tracer| publish_builder(tracer, exchange, id, []),
        parent.unwrap_or(&root),
    )
}

/// A messaging `publish <exchange>` producer span, with `more` attributes beside the
/// conventions' own: hookrelay's publish of an event, and an attempt into a partner's broker.
pub fn publish_builder(
    tracer: &SdkTracer,
    exchange: &str,
    id: &str,
    more: impl IntoIterator<Item = KeyValue>,
) -> opentelemetry::trace::SpanBuilder {
    let mut attributes = vec![
        KeyValue::new("messaging.system", "rabbitmq"),
        KeyValue::new("messaging.operation.type", "send"),
        KeyValue::new("messaging.operation.name", "publish"),
        KeyValue::new("messaging.destination.name", exchange.to_owned()),
        KeyValue::new("messaging.message.id", id.to_owned()),
    ];
    attributes.extend(more);
    tracer
        .span_builder(format!("publish {exchange}"))
        .with_kind(SpanKind::Producer)
        .with_attributes(attributes)
}

/// `url.full` of an attempt: user information and every query value replaced by `REDACTED`
/// (the semantic conventions' rule; webhook URLs carry tokens there), the fragment left out.
pub fn redacted_url(url: &url::Url) -> String {
    // Nothing to hide, the usual case: no copy to edit.
    if url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none()
    {
        return url.as_str().to_owned();
    }
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
    fn a_failing_collector_is_left_alone_longer_each_time_and_not_after_a_success() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let pauses: Vec<u64> = (0..7).map(|_| b.failed().as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30]);
        b.succeeded();
        assert_eq!(b.failed(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn the_queue_is_bounded_and_wakes_its_thread_once_a_batch_is_full() {
        let config = TracesConfig {
            queue: 5,
            batch: 2,
            ..TracesConfig::default()
        };
        let queue = Queue::<u32>::new(&config);
        let woken = || {
            let notified = queue.full.notified();
            tokio::pin!(notified);
            notified.as_mut().enable()
        };
        assert_eq!(queue.push(1), Ok(()));
        assert!(!woken(), "one span is not a batch");
        assert_eq!(queue.push(2), Ok(()));
        assert!(woken(), "a full batch wakes the thread");
        for n in 3..=5 {
            assert_eq!(queue.push(n), Ok(()));
        }
        assert_eq!(queue.push(6), Err(6), "beyond the queue's size, given back");
        assert_eq!(queue.take(), vec![1, 2, 3, 4, 5]);
        assert_eq!(queue.push(7), Ok(()));
        assert_eq!(queue.take(), vec![7]);
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
