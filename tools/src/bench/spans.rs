//! `hookrelay-dev span-cost`: what tracing costs one delivery, apart from everything else the
//! worker does, so the figure does not drown in a shared machine's noise. It builds a
//! delivery's three spans (`process`, `POST`, `settle`, with the attributes a delivery sets)
//! at a steady rate, through hookrelay's own tracer, queue and export thread, and counts the
//! CPU of the thread building them and of the export thread: traces off, a collector gone, a
//! collector answering (an OTLP/HTTP sink on loopback whose own CPU is not counted).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hookrelay::config::{OtlpProtocol, TracesConfig};
use hookrelay::observe::traces::{Traced, Traces, metrics};
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanKind, Tracer as _};
use serde::Serialize;

/// One mode's figures.
#[derive(Debug, Serialize)]
pub struct SpanCost {
    pub mode: &'static str,
    pub deliveries: u64,
    /// CPU of the building thread and the export thread, per delivery.
    pub cpu_us_per_delivery: f64,
    pub exported_spans: u64,
    pub dropped_spans: u64,
}

/// The three modes, `deliveries` each at `rate` per second.
pub async fn run(deliveries: u64, rate: u64) -> anyhow::Result<Vec<SpanCost>> {
    let sink = sink().await?;
    let gone = {
        // A port nothing listens on: bound, then released.
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };
    let mut out = Vec::new();
    for (mode, endpoint) in [
        ("off", None),
        ("gone", Some(gone)),
        ("answering", Some(sink)),
    ] {
        let modes = tokio::task::spawn_blocking(move || measure(mode, endpoint, deliveries, rate));
        out.push(modes.await??);
    }
    Ok(out)
}

fn measure(
    mode: &'static str,
    endpoint: Option<std::net::SocketAddr>,
    deliveries: u64,
    rate: u64,
) -> anyhow::Result<SpanCost> {
    let traces = match endpoint {
        None => None,
        Some(addr) => {
            let config = TracesConfig {
                endpoint: format!("http://{addr}"),
                protocol: OtlpProtocol::HttpProtobuf,
                ..TracesConfig::default()
            };
            Traces::start(&config).context("starting traces")?
        }
    };
    let m = metrics();
    let before = (m.exported.get(), dropped());
    let cpu = || thread_cpu("self") + thread_cpu("hookrelay-traces");
    let started = Instant::now();
    let cpu_before = cpu();
    let per_ms = rate.div_ceil(1000).max(1);
    let mut made = 0u64;
    let mut tick = 0u64;
    while made < deliveries {
        for _ in 0..per_ms.min(deliveries - made) {
            one_delivery(made);
            made += 1;
        }
        tick += 1;
        let due = started + Duration::from_millis(tick * per_ms * 1000 / rate.max(1));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    if let Some(t) = traces {
        t.shutdown(Duration::from_secs(5));
    }
    let cpu_used = cpu() - cpu_before;
    Ok(SpanCost {
        mode,
        deliveries,
        cpu_us_per_delivery: cpu_used * 1e6 / deliveries as f64,
        exported_spans: m.exported.get() - before.0,
        dropped_spans: dropped() - before.1,
    })
}

fn dropped() -> u64 {
    let d = &metrics().dropped;
    d.with_label_values(&["queue_full"]).get() + d.with_label_values(&["export_failed"]).get()
}

/// A delivery's spans as the worker makes them (src/delivery/spans.rs), answered 200.
fn one_delivery(n: u64) {
    const LANE: &str = "hookrelay.lane.first";
    let process = Traced::start(
        |t| {
            t.span_builder(format!("process {LANE}"))
                .with_kind(SpanKind::Consumer)
                .with_attributes([
                    KeyValue::new("messaging.system", "rabbitmq"),
                    KeyValue::new("messaging.operation.type", "process"),
                    KeyValue::new("messaging.operation.name", "deliver"),
                    KeyValue::new("messaging.destination.name", LANE.to_owned()),
                    KeyValue::new("hookrelay.lane", "first"),
                ])
        },
        &opentelemetry::Context::new(),
    );
    process.set(|| KeyValue::new("messaging.message.id", format!("evt_{n}")));
    process.set(|| KeyValue::new("hookrelay.tenant", "acme".to_owned()));
    process.set(|| KeyValue::new("hookrelay.attempt", 1i64));
    let attempt = process.child(|t| {
        t.span_builder("POST")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("server.address", "127.0.0.1".to_owned()),
                KeyValue::new("server.port", 8080i64),
                KeyValue::new("url.full", "http://127.0.0.1:8080/hooks".to_owned()),
                KeyValue::new("hookrelay.attempt", 1i64),
            ])
    });
    attempt.set(|| KeyValue::new("http.response.status_code", 200i64));
    drop(attempt);
    process.set(|| KeyValue::new("hookrelay.outcome", "delivered"));
    let settle = process.child(|t| {
        t.span_builder(format!("settle {LANE}"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("messaging.system", "rabbitmq"),
                KeyValue::new("messaging.operation.type", "settle"),
                KeyValue::new("messaging.destination.name", LANE.to_owned()),
                KeyValue::new("hookrelay.outcome", "delivered"),
            ])
    });
    drop(settle);
}

/// CPU seconds of this thread (`self`) or of the process's thread named `name`.
fn thread_cpu(name: &str) -> f64 {
    let stat = |path: &std::path::Path| -> Option<f64> {
        let text = std::fs::read_to_string(path).ok()?;
        let fields: Vec<&str> = text.rsplit(')').next()?.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / 100.0)
    };
    if name == "self" {
        return stat(std::path::Path::new("/proc/thread-self/stat")).unwrap_or(0.0);
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| stat(&t.path().join("stat")))
        .sum()
}

/// An OTLP/HTTP sink on loopback that takes every export and answers 200.
async fn sink() -> anyhow::Result<std::net::SocketAddr> {
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|_body: axum::body::Bytes| async {
            (
                [("content-type", "application/x-protobuf")],
                Vec::<u8>::new(),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}
