//! OpenTelemetry traces end to end: a worker on the real broker exports over OTLP/HTTP to a
//! collector of the test's own, which decodes the protocol's protobuf; one event's attempts
//! through the ladder land in the producer's trace; a collector that does not answer costs
//! deliveries nothing; a receiver that asked for it sees the attempt's `traceparent`.
//!
//! The tracer is the process's, started by `Traces::start`: each test is a process of its own
//! under nextest, so tests do not share spans. The JSON log lines are this thread's only
//! (`set_default`, with the single-threaded test runtime every task of the worker runs on).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::{Counters, RunningWorker, TestLadder, event, secret, subscription};
use hookrelay::config::{Config, OtlpProtocol};
use hookrelay::contract::envelope::NewEvent;
use hookrelay::observe::traces::Traces;
use hookrelay_tools::receiver::{Receiver, Reply};
use lapin::types::AMQPValue;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tracing_subscriber::layer::SubscriberExt as _;

const WAIT: Duration = Duration::from_secs(20);
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP collector on `127.0.0.1:0` keeping every span it is sent.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Collector {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = Arc::clone(&spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    let mut kept = kept.lock().unwrap();
                    for resource in request.resource_spans {
                        for scope in resource.scope_spans {
                            kept.extend(scope.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            spans,
            _stop: stop,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// Traces to `endpoint` over OTLP/HTTP, sent every 50 ms.
fn traced(config: &Config, endpoint: &str) -> Traces {
    let mut c = config.traces.clone();
    c.endpoint = endpoint.to_owned();
    c.protocol = OtlpProtocol::HttpProtobuf;
    c.export_interval = Duration::from_millis(50);
    Traces::start(&c).unwrap().expect("traces are on")
}

/// Log lines written into memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn parsed(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// The worker's JSON log lines (debug and up, the delivery's trace ids among their spans)
/// written to `lines`, for this thread.
fn install_json_logs(lines: &Lines) -> tracing::subscriber::DefaultGuard {
    let writer = lines.clone();
    let json = hookrelay::observe::logs::lines(
        true,
        true,
        tracing_subscriber::EnvFilter::new("hookrelay=debug"),
        move || writer.clone(),
    );
    let subscriber = tracing_subscriber::registry().with(json);
    tracing::subscriber::set_default(subscriber)
}

/// Sends what is queued. Off the runtime's thread: the collector answers on it.
async fn shut(traces: Traces) {
    tokio::task::spawn_blocking(move || traces.shutdown(Duration::from_secs(5)))
        .await
        .unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attrs(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// Publishes `e` with `properties`, waits until `receiver` has taken it, and stops `worker`, so
/// every span of the delivery has ended.
async fn deliver(
    t: &TestLadder,
    e: &NewEvent,
    properties: lapin::BasicProperties,
    receiver: &Receiver,
    worker: RunningWorker,
) {
    t.publisher()
        .await
        .publish(&t.ladder.ingress(), &e.tenant, &e.body, properties)
        .await
        .unwrap();
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    worker.stop().await;
}

fn with_traceparent(e: &NewEvent) -> lapin::BasicProperties {
    let props = e.properties();
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01").into()),
    );
    props.with_headers(headers)
}

#[tokio::test]
async fn an_event_retried_twice_is_one_trace_under_the_producers_span() {
    let collector = Collector::start().await;
    let t = TestLadder::apply("traces", &["300ms", "600ms"], &["300ms", "600ms", "600ms"]).await;
    let traces = traced(&t.config, &format!("http://{}", collector.addr));
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| match req.attempt {
        1 | 2 => Reply::Status(503),
        _ => Reply::Status(200),
    })
    .await
    .unwrap();
    let mut sub = subscription("sub_a", "acme", &receiver.url("/hook?token=sekrit"), &s);
    sub.trace_context = true;
    let worker = RunningWorker::start(&t, vec![sub]).await;
    let e = event("evt_traced", "acme", "sub_a");
    deliver(&t, &e, with_traceparent(&e), &receiver, worker).await;
    let dropped = hookrelay::observe::traces::metrics().dropped.clone();
    shut(traces).await;

    let spans = collector.spans();
    let named = |prefix: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .collect()
    };
    let process = named("process ");
    let attempts = named("POST");
    let settles = named("settle ");
    assert_eq!(
        process.len(),
        3,
        "{:#?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert_eq!(attempts.len(), 3);
    assert_eq!(settles.len(), 3);
    // One trace, the producer's; each attempt's processing is a child of the producer's span.
    for span in &spans {
        assert_eq!(hex(&span.trace_id), PRODUCER_TRACE, "{}", span.name);
    }
    for p in &process {
        assert_eq!(hex(&p.parent_span_id), PRODUCER_SPAN);
        let a = attrs(p);
        assert_eq!(a["messaging.system"], "rabbitmq");
        assert_eq!(a["messaging.operation.type"], "process");
        assert_eq!(a["messaging.message.id"], "evt_traced");
        assert_eq!(a["hookrelay.subscription"], "sub_a");
    }
    let process_ids: Vec<Vec<u8>> = process.iter().map(|p| p.span_id.clone()).collect();
    let mut statuses = Vec::new();
    for attempt in &attempts {
        assert!(process_ids.contains(&attempt.parent_span_id));
        let a = attrs(attempt);
        assert_eq!(a["http.request.method"], "POST");
        assert_eq!(a["server.address"], "127.0.0.1");
        assert!(
            a["url.full"].ends_with("/hook?token=REDACTED"),
            "{}",
            a["url.full"]
        );
        statuses.push((
            attempt.start_time_unix_nano,
            a["http.response.status_code"].clone(),
        ));
    }
    statuses.sort();
    let statuses: Vec<&str> = statuses.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(statuses, ["503", "503", "200"]);
    let mut settled: Vec<(u64, String, Option<String>)> = settles
        .iter()
        .map(|s| {
            let a = attrs(s);
            (
                s.start_time_unix_nano,
                a["hookrelay.outcome"].clone(),
                a.get("hookrelay.tier").cloned(),
            )
        })
        .collect();
    settled.sort();
    let settled: Vec<(&str, Option<&str>)> = settled
        .iter()
        .map(|(_, o, t)| (o.as_str(), t.as_deref()))
        .collect();
    assert_eq!(
        settled,
        [
            ("retried", Some("retry-300ms")),
            ("retried", Some("retry-600ms")),
            ("delivered", None)
        ]
    );
    // No secret, credential, header value or body in any span.
    for span in &spans {
        for (k, v) in attrs(span) {
            for secret in [s.whsec.as_str(), "sekrit", "amount", "42}"] {
                assert!(!v.contains(secret), "{} {k}={v}", span.name);
            }
        }
    }
    // The receiver opted in: each request carried the attempt span's context.
    let attempt_ids: Vec<String> = attempts.iter().map(|a| hex(&a.span_id)).collect();
    for record in receiver.records_for("evt_traced") {
        let tp = record.headers["traceparent"].to_str().unwrap().to_owned();
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4, "{tp}");
        assert_eq!(parts[1], PRODUCER_TRACE);
        assert!(attempt_ids.contains(&parts[2].to_owned()), "{tp}");
    }
    assert_eq!(dropped.with_label_values(&["queue_full"]).get(), 0);
}

#[tokio::test]
async fn an_event_without_context_starts_one_trace_for_all_its_attempts() {
    let collector = Collector::start().await;
    let t = TestLadder::apply("traces-root", &["300ms"], &["300ms", "300ms"]).await;
    let traces = traced(&t.config, &format!("http://{}", collector.addr));
    let lines = Lines::default();
    let _guard = install_json_logs(&lines);
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| match req.attempt {
        1 => Reply::Status(500),
        _ => Reply::Status(204),
    })
    .await
    .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    // Published without a span: the event comes with no context at all.
    let e = event("evt_rootless", "acme", "sub_a");
    deliver(&t, &e, e.properties(), &receiver, worker).await;
    shut(traces).await;
    let spans = collector.spans();
    let mut process: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("process "))
        .collect();
    process.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(process.len(), 2);
    assert_eq!(process[0].trace_id, process[1].trace_id);
    assert!(
        process[0].parent_span_id.is_empty(),
        "the first attempt is the root"
    );
    assert_eq!(process[1].parent_span_id, process[0].span_id);
    // The JSON log line of each attempt carries the ids of the span it was written in, at the
    // top level and in its span.
    let attempt_lines: Vec<serde_json::Value> = lines
        .parsed()
        .into_iter()
        .filter(|l| l["fields"]["message"] == "Attempt made")
        .collect();
    assert_eq!(attempt_lines.len(), 2, "{:?}", lines.parsed());
    for (line, span) in attempt_lines.iter().zip(&process) {
        assert_eq!(line["trace_id"], hex(&span.trace_id), "{line}");
        assert_eq!(line["span_id"], hex(&span.span_id), "{line}");
        assert_eq!(line["span"]["trace_id"], hex(&span.trace_id), "{line}");
    }
    // Not opted in: no trace context reached the receiver.
    assert!(
        receiver
            .records()
            .iter()
            .all(|r| !r.headers.contains_key("traceparent"))
    );
}

#[tokio::test]
async fn a_collector_that_never_answers_costs_deliveries_nothing() {
    // Accepts connections and never answers: every export waits out its timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let holding = Arc::clone(&held);
    tokio::spawn(async move {
        while let Ok((conn, _)) = silent.accept().await {
            holding.lock().unwrap().push(conn);
        }
    });
    let t = TestLadder::apply("traces-dead", &["300ms"], &["300ms"]).await;
    let mut config = t.config.traces.clone();
    config.endpoint = format!("http://{silent_addr}");
    config.protocol = OtlpProtocol::HttpProtobuf;
    config.queue = 16;
    config.batch = 8;
    config.export_interval = Duration::from_millis(50);
    config.export_timeout = Duration::from_secs(10);
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(200))
        .await
        .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    const N: usize = 300;
    let run = |from: usize| {
        let t = &t;
        let receiver = &receiver;
        async move {
            let started = Instant::now();
            t.publish_all((from..from + N).map(|i| event(&format!("evt_d{i}"), "acme", "sub_a")))
                .await;
            assert!(
                receiver
                    .wait_until(WAIT * 3, |r| r.delivered_count() == from + N)
                    .await
            );
            started.elapsed()
        }
    };
    let untraced = run(0).await;
    // Traces start now: the process's tracer is on from here.
    let traces = Traces::start(&config).unwrap().unwrap();
    let traced = run(N).await;
    let dropped = worker.metrics.count(
        "hookrelay_trace_spans_dropped_total",
        &[("reason", "queue_full")],
    );
    worker.stop().await;
    eprintln!(
        "{N} deliveries: {untraced:?} without traces, {traced:?} with a collector that never answers; {dropped} spans dropped"
    );
    // Spans beyond the queue were dropped and counted rather than waited for.
    assert!(dropped > 0);
    // Lenient on a shared machine: the point is no export timeout (10 s) in any delivery.
    assert!(
        traced < untraced * 3 + Duration::from_secs(2),
        "{traced:?} against {untraced:?}"
    );
    // Dropping the provider shuts it down, which waits on the thread: not on the runtime's.
    tokio::task::spawn_blocking(move || drop(traces))
        .await
        .unwrap();
}

/// An OTLP/gRPC collector keeping every span it is sent.
#[derive(Clone, Default)]
struct GrpcCollector {
    spans: Arc<Mutex<Vec<Span>>>,
    /// Each batch's resource attributes.
    resources: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for GrpcCollector
{
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            if let Some(r) = &resource.resource {
                let as_span = Span {
                    attributes: r.attributes.clone(),
                    ..Default::default()
                };
                self.resources.lock().unwrap().push(attrs(&as_span));
            }
            for scope in resource.scope_spans {
                kept.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::test]
async fn spans_travel_over_grpc_too_with_the_configured_resource() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    let collector = GrpcCollector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    let t = TestLadder::apply("traces-grpc", &["300ms"], &["300ms"]).await;
    let mut c = t.config.traces.clone();
    c.endpoint = format!("http://{addr}");
    c.protocol = OtlpProtocol::Grpc;
    c.export_interval = Duration::from_millis(50);
    c.service_name = "relay-eu".into();
    c.resource_attributes = "deployment.environment=test,team=a%20b".into();
    let traces = Traces::start(&c).unwrap().unwrap();
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    let e = event("evt_grpc", "acme", "sub_a");
    deliver(&t, &e, with_traceparent(&e), &receiver, worker).await;
    shut(traces).await;
    let spans = collector.spans.lock().unwrap().clone();
    let resources = collector.resources.lock().unwrap().clone();
    assert!(!resources.is_empty());
    for r in &resources {
        assert_eq!(r["service.name"], "relay-eu");
        assert_eq!(r["deployment.environment"], "test");
        assert_eq!(r["team"], "a b");
    }
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.contains(&"POST"), "{names:?}");
    assert!(spans.iter().all(|s| hex(&s.trace_id) == PRODUCER_TRACE));
}

/// An attempt into a partner's RabbitMQ (here the test's own broker) is a messaging
/// `publish <exchange>` span, not an HTTP one: a confirm is a success without a status, a
/// missing exchange is `error.type=exchange_not_found`.
#[tokio::test]
async fn an_amqp_destination_attempt_is_a_publish_span() {
    use hookrelay::subscriptions::{AmqpTarget, BasicAuth, SecretRef, Subscription};
    let collector = Collector::start().await;
    let t = TestLadder::apply("traces-amqp", &["300ms"], &["300ms"]).await;
    let traces = traced(&t.config, &format!("http://{}", collector.addr));
    let inbox = format!("{}.partner-inbox", t.ladder.prefix);
    t.channel
        .queue_declare(
            inbox.as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    t.owns_queue(&inbox);
    let s = secret();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("pw");
    std::fs::write(&password, "guest").unwrap();
    let partner = |id: &str, exchange: &str, routing_key: Option<&str>| {
        // The test's broker, wherever it runs, with the credentials in `basic_auth`.
        let mut url = t.config.amqp.url.expose_url().clone();
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let mut sub = Subscription::new(id, id, url, s.reference.clone());
        sub.amqp = Some(AmqpTarget {
            exchange: exchange.into(),
            routing_key: routing_key.map(Into::into),
        });
        sub.basic_auth = Some(BasicAuth {
            username: "guest".into(),
            password: SecretRef::File(password.clone()),
        });
        sub
    };
    let missing = format!("{}.removed", t.ladder.prefix);
    let subs = vec![
        partner("sub_inbox", "", Some(&inbox)),
        partner("sub_removed", &missing, None),
    ];
    let worker = RunningWorker::start(&t, subs).await;
    t.publish(&event("evt_to_inbox", "sub_inbox", "sub_inbox"))
        .await;
    t.publish(&event("evt_to_removed", "sub_removed", "sub_removed"))
        .await;
    assert!(
        t.wait_dead(1, WAIT).await,
        "the missing exchange's event is gone"
    );
    assert!(
        common::wait_until(WAIT, async || t.depth(&inbox).await == 1).await,
        "the other reached the partner's queue"
    );
    worker.stop().await;
    shut(traces).await;
    let spans = collector.spans();
    assert!(
        spans.iter().all(|s| s.name != "POST"),
        "no HTTP span for a publish"
    );
    let publish = |exchange: &str| -> Span {
        let name = format!("publish {exchange}");
        let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(
            found.len(),
            1,
            "{name}: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        found[0].clone()
    };
    let delivered = publish("amq.default");
    let a = attrs(&delivered);
    assert_eq!(delivered.kind, 4, "producer");
    assert_eq!(a["messaging.system"], "rabbitmq");
    assert_eq!(a["messaging.rabbitmq.destination.routing_key"], inbox);
    assert_eq!(a["messaging.message.id"], "evt_to_inbox");
    assert_eq!(a["server.address"], "127.0.0.1");
    assert!(!a.contains_key("http.response.status_code"), "{a:?}");
    assert!(!a.contains_key("error.type"), "{a:?}");
    let refused = publish(&missing);
    let a = attrs(&refused);
    assert_eq!(a["error.type"], "exchange_not_found");
    assert_eq!(
        a["messaging.rabbitmq.destination.routing_key"],
        "order.paid"
    );
    assert_eq!(refused.status.as_ref().map(|s| s.code), Some(2), "ERROR");
    // The parent of each is the delivery's process span.
    for span in [&delivered, &refused] {
        assert!(
            spans
                .iter()
                .any(|p| p.name.starts_with("process ") && p.span_id == span.parent_span_id)
        );
    }
}
