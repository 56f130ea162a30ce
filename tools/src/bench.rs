//! `hookrelay bench`: throughput against the ceiling the broker allows, latency, peak memory,
//! promotion precision and isolation, measured in one run on one broker.
//!
//! - The **ceiling** is a minimal lapin loop in a process of its own (`hookrelay bench-ceiling`):
//!   it consumes persistent messages from a queue of the same type with the same prefetch, POSTs
//!   each body to the same sink, and acks. No signing, no lookups.
//! - **hookrelay** is the real worker (`hookrelay worker`, its own process) on the real topology,
//!   with signing, subscription lookup, egress checks, endpoint limits, metrics and the attempt
//!   log on, delivering to the same sink.
//! - The **sink** is a small HTTP server inside the bench process that answers 204.
//!
//! Both consumers start on a backlog of N messages published beforehand, and deliveries per
//! second are counted at the sink from the first delivery to the last.
//!
//! The **failure path** (`--failure-path`) does the same with a sink that answers every request
//! 503 and the breaker out of reach: hookrelay moves each envelope into its retry tier (a
//! confirmed republish, then the ack), against a raw loop that consumes, POSTs, publishes the
//! message to a second queue with a confirm, and acks. The raw loop runs twice: on bare bodies
//! to the next queue, and on hookrelay's own envelopes, publishing each as hookrelay publishes a
//! retry (its headers, `mandatory`, through a fanout exchange like a tier's), which tells what
//! the retry's content costs the broker apart from what the worker costs. Each counts from the
//! first request at the sink until the last message is in the queue it goes to.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::Serialize;

use hookrelay::broker::publish::Publisher;
use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::headers;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;
use hookrelay::units::now_ms;

use crate::kit::{
    Percentiles, file_secret, ladder_toml, subscription_toml, wait_until, worker_command,
};

pub mod amqp;
pub mod beside;
pub mod cpu;
pub mod history;
pub mod noisy;
pub mod pages;
pub mod shards;
pub mod soak;
pub mod spans;
pub mod store;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error(transparent)]
    Publish(#[from] hookrelay::broker::publish::PublishError),
    #[error(transparent)]
    Ladder(#[from] hookrelay::contract::ladder::LadderError),
    #[error("topology: {0}")]
    Topology(#[from] hookrelay::broker::topology::TopologyError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] hookrelay::store::StoreError),
    #[error("cluster: {0}")]
    Node(#[from] crate::node::NodeError),
    #[error("subscription store: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub events: usize,
    pub prefetch: u16,
    pub queue_type: QueueType,
    /// Events published at a steady rate for the latency figures.
    pub latency_events: usize,
    pub latency_rate: u32,
    pub precision_messages: usize,
    /// Publish rate into the tier for the precision run (messages per second).
    pub precision_rate: u32,
    pub isolation_backlog: usize,
    pub isolation_events: usize,
    /// Throughput only: no latency, precision or isolation runs.
    pub throughput_only: bool,
    /// Bind a queue to the attempt log during the runs, as an operator keeping history would.
    pub keep_attempt_log: bool,
    /// Also measure the failure path (every attempt answered 503).
    pub failure_path: bool,
    /// The ladders of the throughput and failure-path runs without their streams (archive
    /// and attempt log), so hookrelay publishes no more per delivery than the raw loops do.
    pub streams_off: bool,
    /// The ladders without the archive alone (`--no-archive`) or the attempt log alone
    /// (`--no-attempt-log`), to tell each stream's share.
    pub archive_off: bool,
    pub attempt_log_off: bool,
    /// `hookrelay history` runs beside the worker in the success path (`--with-history`).
    pub with_history: bool,
    /// The success path's events carry a realistic payload ([`realistic_body`]) whose type the
    /// subscriptions file's catalog lists with [`REALISTIC_SCHEMA`] in this mode: `enforce`
    /// validates every event, `off` is the same run without validation. `None`: the usual
    /// 512-byte body and no catalog.
    pub schema: Option<hookrelay::catalog::ValidationMode>,
}

impl BenchOptions {
    /// `ladder`, without its streams if the options say so.
    fn streams(&self, mut ladder: Ladder) -> Ladder {
        if self.streams_off || self.archive_off {
            ladder.archive = None;
        }
        if self.streams_off || self.attempt_log_off {
            ladder.attempts = None;
        }
        ladder
    }
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            events: 50_000,
            prefetch: 500,
            queue_type: QueueType::Quorum,
            latency_events: 5_000,
            latency_rate: 1_000,
            precision_messages: 10_000,
            precision_rate: 5_000,
            isolation_backlog: 50_000,
            isolation_events: 2_000,
            throughput_only: false,
            keep_attempt_log: false,
            failure_path: false,
            streams_off: false,
            archive_off: false,
            attempt_log_off: false,
            with_history: false,
            schema: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Throughput {
    pub deliveries: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub peak_rss_mib: f64,
    /// Where the run's CPU went, per message.
    pub cpu: Option<cpu::CpuPerMessage>,
    /// Deliveries the worker deferred during the run (`hookrelay_deferrals_total`): each waits
    /// out a tier and comes back at the end of the run, so a few percent of them stretch its
    /// window by a second or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deferred: Option<u64>,
}

impl Throughput {
    fn with_cpu(self, cpu: Option<cpu::CpuPerMessage>) -> Self {
        Self { cpu, ..self }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    pub machine: String,
    pub broker: String,
    pub queue_type: String,
    pub prefetch: u16,
    pub events: usize,
    pub ceiling: Throughput,
    pub hookrelay: Throughput,
    pub ratio: f64,
    /// Publish to delivery, at a steady publish rate below the ceiling.
    pub latency: Percentiles,
    pub latency_rate_per_s: u32,
    /// Promotion time minus due time, 1 s tier.
    pub promotion: Percentiles,
    pub promotion_rate_per_s: u32,
    /// Time to first attempt of fresh events, with and without a backlog of due retries for a
    /// slow, failing endpoint.
    pub first_attempt_baseline: Percentiles,
    pub first_attempt_with_backlog: Percentiles,
    pub isolation_backlog: usize,
    pub isolation_ratio_p99: f64,
    /// Whether a queue kept the attempt log during the runs.
    pub attempt_log_kept: bool,
    /// Whether the ladders had no streams (`--streams-off`).
    pub streams_off: bool,
    /// Whether the ladders had no archive (`--no-archive`) or no attempt log
    /// (`--no-attempt-log`).
    pub archive_off: bool,
    pub attempt_log_off: bool,
    /// Only throughput was measured.
    pub throughput_only: bool,
    /// Every attempt answered 503: messages into their next queue per second, the raw loop's
    /// and hookrelay's (into the retry tier), when measured.
    pub failure_ceiling: Option<Throughput>,
    pub failure_hookrelay: Option<Throughput>,
    pub failure_ratio: f64,
    /// The raw loop again, consuming the envelopes hookrelay consumes and publishing each as
    /// hookrelay publishes a retry (its headers, through a fanout exchange, mandatory): what the
    /// retry's content costs, apart from the worker.
    pub failure_retry_ceiling: Option<Throughput>,
    pub failure_retry_ratio: f64,
    /// The catalog's mode for the success path's realistic payload (`--schema`), if any.
    pub schema: Option<String>,
    /// What the success path's streams gained: messages, bytes, records, per delivery.
    pub streams: Option<beside::StreamCounts>,
    /// `hookrelay history` beside the worker (`--with-history`): rows, and its lag at the end.
    pub history_beside: Option<beside::HistoryBesideReport>,
}

/// The sink: answers 204, counts, and (when asked) records publish-to-arrival latency from the
/// `"t":<microseconds>` field the bench puts in each body.
struct Sink {
    started: Instant,
    count: AtomicU64,
    first_ns: AtomicU64,
    last_ns: AtomicU64,
    record: AtomicBool,
    latencies: std::sync::Mutex<Vec<f64>>,
    /// Answer 503 after this long instead (the slow, failing endpoint).
    slow_fail: Option<Duration>,
    /// Answer 204 after this long (an endpoint that takes time, for the fleet-wide cap).
    slow_ok: Option<Duration>,
    /// Requests being answered now, and the most seen at once since the last reset.
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Sink {
    fn new(slow_fail: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            count: AtomicU64::new(0),
            first_ns: AtomicU64::new(u64::MAX),
            last_ns: AtomicU64::new(0),
            record: AtomicBool::new(false),
            latencies: std::sync::Mutex::new(Vec::new()),
            slow_fail,
            slow_ok: None,
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
        })
    }

    /// A sink that answers 204 after `delay`, so requests overlap and the most at once shows.
    fn slow_ok(delay: Duration) -> Arc<Self> {
        let mut sink = Self::new(None);
        if let Some(s) = Arc::get_mut(&mut sink) {
            s.slow_ok = Some(delay);
        }
        sink
    }

    fn reset(&self) {
        self.count.store(0, Ordering::SeqCst);
        self.first_ns.store(u64::MAX, Ordering::SeqCst);
        self.last_ns.store(0, Ordering::SeqCst);
        self.max_in_flight.store(0, Ordering::SeqCst);
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn window(&self) -> (u64, f64) {
        let n = self.count.load(Ordering::SeqCst);
        let first = self.first_ns.load(Ordering::SeqCst);
        let last = self.last_ns.load(Ordering::SeqCst);
        let secs = if n > 1 && last > first {
            (last - first) as f64 / 1e9
        } else {
            0.0
        };
        (n, secs)
    }

    fn take_latencies(&self) -> Vec<f64> {
        std::mem::take(&mut *self.latencies.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn body_time(body: &[u8]) -> Option<u64> {
    let at = body.windows(4).position(|w| w == b"\"t\":")? + 4;
    let digits: Vec<u8> = body[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

async fn sink_handler(State(sink): State<Arc<Sink>>, body: Bytes) -> StatusCode {
    let now = sink.started.elapsed().as_nanos() as u64;
    sink.first_ns.fetch_min(now, Ordering::SeqCst);
    sink.last_ns.fetch_max(now, Ordering::SeqCst);
    sink.count.fetch_add(1, Ordering::SeqCst);
    if let Some(wait) = sink.slow_ok {
        // Counted at the endpoint: the requests it is answering at this moment.
        let now = sink.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        sink.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(wait).await;
        sink.in_flight.fetch_sub(1, Ordering::SeqCst);
        return StatusCode::NO_CONTENT;
    }
    if let Some(wait) = sink.slow_fail {
        tokio::time::sleep(wait).await;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    if sink.record.load(Ordering::Relaxed)
        && let Some(t) = body_time(&body)
    {
        let ms = now_us().saturating_sub(t) as f64 / 1000.0;
        sink.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ms);
    }
    StatusCode::NO_CONTENT
}

async fn start_sink(sink: Arc<Sink>) -> std::io::Result<std::net::SocketAddr> {
    start_sink_on(std::net::Ipv4Addr::LOCALHOST, sink).await
}

/// The sink on `ip` (any loopback address), on a port of its own.
async fn start_sink_on(
    ip: std::net::Ipv4Addr,
    sink: Arc<Sink>,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .fallback(axum::routing::post(sink_handler))
        .with_state(sink);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

/// A body of about 512 bytes carrying its publish time (microseconds since the epoch).
fn body(n: usize) -> Vec<u8> {
    let mut b = format!(r#"{{"n":{n},"t":{},"pad":""#, now_us()).into_bytes();
    b.resize(500, b'x');
    b.extend_from_slice(b"\"}");
    b
}

/// A schema as producers write them: a dozen fields, a nested object, enums, patterns, an
/// array of objects, no other properties.
pub const REALISTIC_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["id", "type", "t", "created_at", "currency", "amount", "status", "customer", "items"],
  "additionalProperties": false,
  "properties": {
    "id": {"type": "string", "pattern": "^evt_[0-9]+$"},
    "type": {"type": "string", "maxLength": 64},
    "t": {"type": "integer", "minimum": 0},
    "created_at": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T"},
    "currency": {"enum": ["EUR", "USD", "GBP", "JPY", "CHF"]},
    "amount": {"type": "integer", "minimum": 0},
    "status": {"enum": ["pending", "paid", "refunded", "failed"]},
    "livemode": {"type": "boolean"},
    "customer": {
      "type": "object",
      "required": ["id", "email", "country"],
      "additionalProperties": false,
      "properties": {
        "id": {"type": "string", "pattern": "^cus_[A-Za-z0-9]+$"},
        "email": {"type": "string", "maxLength": 254},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"}
      }
    },
    "items": {
      "type": "array",
      "maxItems": 100,
      "items": {
        "type": "object",
        "required": ["sku", "qty", "price"],
        "properties": {
          "sku": {"type": "string", "pattern": "^SKU-[0-9]+$"},
          "qty": {"type": "integer", "minimum": 1},
          "price": {"type": "integer", "minimum": 0}
        }
      }
    },
    "tags": {"type": "array", "items": {"type": "string"}},
    "note": {"type": "string", "maxLength": 1000}
  }
}"#;

/// A payload [`REALISTIC_SCHEMA`] accepts, about as long as [`body`]'s, carrying its publish
/// time in `"t"` as [`body`] does.
fn realistic_body(n: usize) -> Vec<u8> {
    format!(
        r#"{{"id":"evt_{n}","type":"bench.event","t":{t},"created_at":"2026-12-07T05:00:00Z","currency":"EUR","amount":{amount},"status":"paid","livemode":false,"customer":{{"id":"cus_{n}","email":"buyer{n}@example.com","country":"DE"}},"items":[{{"sku":"SKU-1","qty":2,"price":1200}},{{"sku":"SKU-22","qty":1,"price":{amount}}}],"tags":["web","promo"],"note":"{pad}"}}"#,
        t = now_us(),
        amount = 1000 + n % 5000,
        pad = "x".repeat(120),
    )
    .into_bytes()
}

/// The subscriptions file's catalog section listing `bench.event` with [`REALISTIC_SCHEMA`].
fn realistic_catalog(mode: hookrelay::catalog::ValidationMode) -> String {
    let example = String::from_utf8(realistic_body(1)).unwrap_or_default();
    format!(
        "\n[[event_type]]\nname = \"bench.event\"\nmode = \"{mode}\"\n\n[[event_type.version]]\n\
         schema = '''{REALISTIC_SCHEMA}'''\nexample = '''{example}'''\n"
    )
}

/// Peak resident memory of a process, from `/proc` (Linux), in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmHWM:")
}

/// Resident memory of a process now, from `/proc` (Linux), in MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmRSS:")
}

/// A `kB` field of `/proc/PID/status`, in MiB.
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

async fn wait_count(sink: &Sink, n: u64, timeout: Duration) -> Result<(), BenchError> {
    if wait_until(timeout, async || sink.count.load(Ordering::SeqCst) >= n).await {
        return Ok(());
    }
    Err(BenchError::Other(format!(
        "only {} of {n} deliveries arrived within {}s",
        sink.count.load(Ordering::SeqCst),
        timeout.as_secs()
    )))
}

/// The ladder's queues that hold messages ready for consumers (streams left out), as
/// `name=depth`: where deliveries that never arrived are when a run gives up waiting.
async fn ladder_depths(channel: &lapin::Channel, ladder: &Ladder) -> String {
    let mut held = Vec::new();
    for queue in ladder.objects().queues {
        let stream = matches!(
            queue.arguments.get("x-queue-type"),
            Some(hookrelay::broker::topology::Arg::Str(t)) if t == "stream"
        );
        if stream {
            continue;
        }
        match hookrelay::ops::mover::depth(channel, &queue.name).await {
            Ok(0) => {}
            Ok(n) => held.push(format!("{}={n}", queue.name)),
            Err(e) => held.push(format!("{}: {e}", queue.name)),
        }
    }
    if held.is_empty() {
        "none ready (any left are unacked by the worker)".to_owned()
    } else {
        held.join(", ")
    }
}

fn say(line: &str) {
    eprintln!("bench: {line}");
}

/// Publishes `n` messages pipelined, up to 512 confirms outstanding. Every target here has a
/// route (the ingress exchange has its alternate exchange), so any return fails the run.
async fn publish_many(
    publisher: &Arc<Publisher>,
    n: usize,
    make: impl Fn(usize) -> (String, String, Vec<u8>, BasicProperties),
) -> Result<(), BenchError> {
    let mut confirms = futures_util::stream::FuturesUnordered::new();
    for i in 0..n {
        let (exchange, key, body, props) = make(i);
        confirms.push(publisher.send(&exchange, &key, &body, props, true).await?);
        while confirms.len() >= 512 {
            if let Some(r) = confirms.next().await {
                r?;
            }
        }
    }
    while let Some(r) = confirms.next().await {
        r?;
    }
    Ok(())
}

/// Publishes `n` messages at `rate` per second, keeping up to 256 confirms outstanding so the
/// pace does not wait on each one.
async fn publish_paced(
    publisher: &Arc<Publisher>,
    n: usize,
    rate: u32,
    make: impl Fn(usize) -> (String, String, Vec<u8>, BasicProperties),
) -> Result<(), BenchError> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let mut confirms = futures_util::stream::FuturesUnordered::new();
    for i in 0..n {
        tick.tick().await;
        let (exchange, key, body, props) = make(i);
        confirms.push(publisher.send(&exchange, &key, &body, props, true).await?);
        while confirms.len() > 256 {
            if let Some(r) = confirms.next().await {
                r?;
            }
        }
    }
    while let Some(r) = confirms.next().await {
        r?;
    }
    Ok(())
}

fn queue_args(queue_type: QueueType) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.as_str().into()),
    );
    args
}

/// The binaries the bench starts: the ceiling loop's (`hookrelay-dev bench-ceiling`) and the
/// worker's (`hookrelay worker`).
#[derive(Debug, Clone)]
pub struct Binaries {
    pub ceiling: PathBuf,
    pub worker: PathBuf,
}

/// Runs the whole benchmark.
/// What every bench run opens on the broker: its own connection and channel for setup, a
/// confirming publisher for the load, and the broker's version for the report.
struct BenchSession {
    conn: Connection,
    channel: lapin::Channel,
    publisher: Arc<Publisher>,
    broker: String,
}

impl BenchSession {
    async fn open(config: &Config, prefix: &str) -> Result<Self, BenchError> {
        let conn = Connection::connect(
            config.amqp.url.expose(),
            ConnectionProperties::default().with_connection_name(format!("{prefix} bench").into()),
        )
        .await?;
        let channel = conn.create_channel().await?;
        let publisher = Arc::new(
            Publisher::connect(
                &config.amqp.url,
                &format!("{prefix} producer"),
                Duration::from_secs(30),
            )
            .await?,
        );
        let api = hookrelay::broker::management::Management::new(&config.management.url, "/")
            .map_err(|e| BenchError::Other(e.to_string()))?;
        let broker = api.broker_version().await.unwrap_or_default();
        Ok(Self {
            conn,
            channel,
            publisher,
            broker,
        })
    }
}

pub async fn run(
    config: &Config,
    options: &BenchOptions,
    binaries: Binaries,
) -> Result<BenchReport, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-{run_id}");
    let BenchSession {
        conn,
        channel,
        publisher,
        broker,
    } = BenchSession::open(config, &prefix).await?;
    let sink = Sink::new(None);
    let sink_addr = start_sink(Arc::clone(&sink)).await?;
    let mut report = BenchReport {
        machine: machine(),
        broker: format!("RabbitMQ {broker}"),
        queue_type: options.queue_type.as_str().into(),
        prefetch: options.prefetch,
        events: options.events,
        latency_rate_per_s: options.latency_rate,
        promotion_rate_per_s: options.precision_rate,
        isolation_backlog: options.isolation_backlog,
        attempt_log_kept: options.keep_attempt_log,
        streams_off: options.streams_off,
        archive_off: options.archive_off,
        attempt_log_off: options.attempt_log_off,
        schema: options.schema.map(|m| m.as_str().to_owned()),
        throughput_only: options.throughput_only,
        ..BenchReport::default()
    };

    // 1. The ceiling.
    let ceiling_queue = format!("{prefix}.ceiling");
    say(&format!(
        "publishing {} messages for the ceiling loop",
        options.events
    ));
    raw_backlog(&publisher, &channel, &ceiling_queue, options).await?;
    sink.reset();
    let window = cpu::CpuWindow::begin();
    let mut child = start_ceiling(
        &binaries,
        &ceiling_queue,
        options.prefetch,
        &format!("http://{sink_addr}/ceiling"),
        None,
    )?;
    let timeout = Duration::from_secs(600);
    wait_count(&sink, options.events as u64, timeout).await?;
    let (n, secs) = sink.window();
    let cpu = window.end(child.id(), n);
    let rss = child.id().and_then(peak_rss_mib).unwrap_or(0.0);
    let _ = child.kill().await;
    report.ceiling = Throughput {
        deliveries: n,
        seconds: secs,
        per_second: n as f64 / secs.max(1e-9),
        peak_rss_mib: rss,
        cpu,
        deferred: None,
    };
    say(&format!(
        "ceiling: {:.0} deliveries/s",
        report.ceiling.per_second
    ));
    channel
        .queue_delete(ceiling_queue.as_str().into(), QueueDeleteOptions::default())
        .await?;

    // 2. hookrelay on the real topology.
    let ladder = options.streams(Ladder::build(
        &prefix,
        options.queue_type,
        &["1s", "10s"],
        &["1s", "10s"],
    )?);
    let topology = ladder.objects();
    topology.apply(&channel).await?;
    let history = format!("{prefix}.history");
    if options.keep_attempt_log {
        channel
            .queue_declare(
                history.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                queue_args(QueueType::Classic),
            )
            .await?;
        channel
            .queue_bind(
                history.as_str().into(),
                ladder.attempts_exchange().as_str().into(),
                "#".into(),
                Default::default(),
                FieldTable::default(),
            )
            .await?;
    }
    let history_beside = if options.with_history {
        Some(beside::HistoryBeside::start(&binaries.worker, config, &ladder).await?)
    } else {
        None
    };
    let result = run_hookrelay(
        config,
        options,
        &binaries.worker,
        &ladder,
        &publisher,
        &channel,
        &sink,
        sink_addr,
        &mut report,
    )
    .await;
    if result.is_ok() && options.throughput_only {
        // What the streams took, once the last records are in.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let counts = beside::count(&conn, &ladder, report.hookrelay.deliveries).await;
        if let Some(history) = history_beside {
            let end = counts.attempts.map_or(0, |a| a.messages);
            report.history_beside = Some(history.finish(end).await);
        }
        report.streams = Some(counts);
    }
    let _ = topology.delete(&channel).await;
    let result = match result {
        Ok(()) if options.failure_path => {
            failure_path(
                config,
                options,
                &binaries,
                &prefix,
                &publisher,
                &channel,
                &mut report,
            )
            .await
        }
        other => other,
    };
    if options.keep_attempt_log {
        let _ = channel
            .queue_delete(history.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    publisher.close().await;
    let _ = conn.close(200, "bench done".into()).await;
    result?;
    report.ratio = report.hookrelay.per_second / report.ceiling.per_second.max(1e-9);
    if let (Some(raw), Some(ours)) = (&report.failure_ceiling, &report.failure_hookrelay) {
        report.failure_ratio = ours.per_second / raw.per_second.max(1e-9);
    }
    if let (Some(raw), Some(ours)) = (&report.failure_retry_ceiling, &report.failure_hookrelay) {
        report.failure_retry_ratio = ours.per_second / raw.per_second.max(1e-9);
    }
    report.isolation_ratio_p99 =
        report.first_attempt_with_backlog.p99_ms / report.first_attempt_baseline.p99_ms.max(1e-9);
    Ok(report)
}

/// What an attempt log held after a run.
#[derive(Debug, Default)]
struct Kept {
    records: u64,
    /// Distinct envelopes with a `delivered` record.
    delivered: usize,
    /// Envelopes with more than one `delivered` record.
    delivered_twice: usize,
    /// Records by outcome, most first.
    outcomes: Vec<(String, u64)>,
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(outcome, n)| format!("{outcome} {n}"))
            .collect();
        write!(
            f,
            "{} records ({}), {} distinct deliveries, {} delivered more than once",
            self.records,
            outcomes.join(", "),
            self.delivered,
            self.delivered_twice
        )
    }
}

/// What `stream` (an attempt log) holds: its records by outcome, and the envelopes with a
/// `delivered` one.
async fn delivered_records(conn: &Connection, stream: &str) -> Option<Kept> {
    let end = hookrelay::broker::streams::end_of(conn, stream, None)
        .await
        .ok()
        .flatten()?;
    let mut delivered = std::collections::HashMap::<String, u32>::new();
    let mut outcomes = std::collections::HashMap::<String, u64>::new();
    let mut records = 0u64;
    hookrelay::broker::streams::read_window::<hookrelay::broker::streams::StreamReadError>(
        conn,
        stream,
        std::time::UNIX_EPOCH,
        end,
        |_| (),
        async |d| {
            let read = hookrelay::observe::events::AttemptRecord::read_message(&d.data)
                .unwrap_or_default();
            for r in read {
                records += 1;
                if r.outcome == "delivered"
                    && let Some(e) = r.envelope
                {
                    *delivered.entry(e).or_default() += 1;
                }
                // What a record that is not a delivery was for, in a few words.
                let why = match (&r.outcome[..], &r.error) {
                    ("delivered", _) | (_, None) => r.outcome,
                    (_, Some(error)) => format!(
                        "{} ({})",
                        r.outcome,
                        error.chars().take(48).collect::<String>()
                    ),
                };
                *outcomes.entry(why).or_default() += 1;
            }
            Ok(())
        },
    )
    .await
    .ok()?;
    let mut outcomes: Vec<(String, u64)> = outcomes.into_iter().collect();
    outcomes.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    Some(Kept {
        records,
        delivered: delivered.len(),
        delivered_twice: delivered.values().filter(|n| **n > 1).count(),
        outcomes,
    })
}

/// Delivery throughput with the ladder's streams (archive and attempt log) off, then on, in
/// turn, `repeat` times: (off, on) deliveries per second of each pair. Everything else as in
/// the main run's throughput.
pub async fn streams_ratio(
    config: &Config,
    options: &BenchOptions,
    binaries: &Binaries,
    repeat: usize,
) -> Result<Vec<(f64, f64)>, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let BenchSession {
        conn,
        channel,
        publisher,
        ..
    } = BenchSession::open(config, &format!("hookrelay-bench-{run_id}")).await?;
    let sink = Sink::new(None);
    let sink_addr = start_sink(Arc::clone(&sink)).await?;
    let options = BenchOptions {
        throughput_only: true,
        ..options.clone()
    };
    let mut pairs = Vec::with_capacity(repeat);
    for r in 0..repeat {
        let mut pair = (0.0, 0.0);
        for on in [false, true] {
            let prefix = format!(
                "hookrelay-bench-{run_id}-{r}-{}",
                if on { "on" } else { "off" }
            );
            let mut ladder =
                Ladder::build(&prefix, options.queue_type, &["1s", "10s"], &["1s", "10s"])?;
            if !on {
                ladder.archive = None;
                ladder.attempts = None;
            }
            let topology = ladder.objects();
            topology.apply(&channel).await?;
            let mut report = BenchReport::default();
            let result = run_hookrelay(
                config,
                &options,
                &binaries.worker,
                &ladder,
                &publisher,
                &channel,
                &sink,
                sink_addr,
                &mut report,
            )
            .await;
            // What the attempt log's stream kept of the run's records (one per delivery).
            let kept = if on && result.is_ok() {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let stream = ladder.stream(hookrelay::contract::retention::StreamKind::Attempts);
                delivered_records(&conn, &stream).await
            } else {
                None
            };
            let _ = topology.delete(&channel).await;
            result?;
            say(&format!(
                "run {}: streams {}: {:.0} deliveries/s{}",
                r + 1,
                if on { "on" } else { "off" },
                report.hookrelay.per_second,
                kept.map_or(String::new(), |kept| format!(
                    "; the attempt log kept {kept} (of {} events)",
                    options.events
                ))
            ));
            if on {
                pair.1 = report.hookrelay.per_second;
            } else {
                pair.0 = report.hookrelay.per_second;
            }
        }
        pairs.push(pair);
    }
    publisher.close().await;
    let _ = conn.close(200, "bench done".into()).await;
    Ok(pairs)
}

/// A durable queue of the bench's queue type, for the raw loops.
async fn declare_raw_queue(
    channel: &lapin::Channel,
    queue: &str,
    queue_type: QueueType,
) -> Result<(), BenchError> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            queue_args(queue_type),
        )
        .await?;
    Ok(())
}

/// Before a measured run's backlog: the broker's quorum log rolled over and the broker quiet
/// (see [`cpu::roll_broker_log`]).
async fn fresh_broker_log() {
    if let Err(why) = cpu::roll_broker_log().await {
        say(&format!(
            "the broker's quorum log was not rolled over before this run ({why}); if it rolls \
             over during the run, its broker figures include that"
        ));
    }
}

/// `queue`, declared, holding `--events` persistent messages for a raw loop.
async fn raw_backlog(
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    queue: &str,
    options: &BenchOptions,
) -> Result<(), BenchError> {
    raw_backlog_of(publisher, channel, queue, options, |_| {
        BasicProperties::default().with_delivery_mode(2)
    })
    .await
}

/// `queue`, declared, holding `--events` persistent messages with `properties(i)`.
async fn raw_backlog_of(
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    queue: &str,
    options: &BenchOptions,
    properties: impl Fn(usize) -> BasicProperties,
) -> Result<(), BenchError> {
    declare_raw_queue(channel, queue, options.queue_type).await?;
    fresh_broker_log().await;
    publish_many(publisher, options.events, |i| {
        (String::new(), queue.to_owned(), body(i), properties(i))
    })
    .await
}

/// Starts the raw loop on `queue` (`hookrelay-dev bench-ceiling`), forwarding each message to
/// `forward` before its ack when given.
fn start_ceiling(
    binaries: &Binaries,
    queue: &str,
    prefetch: u16,
    url: &str,
    forward: Option<&str>,
) -> std::io::Result<tokio::process::Child> {
    raw_loop_command(binaries, queue, prefetch, Some(url), forward)
        .stdout(Stdio::null())
        .spawn()
}

/// The failure path's raw loop publishing each message as hookrelay publishes a retry, into
/// `exchange` (a fanout bound to the queue the messages go to).
fn start_retry_ceiling(
    binaries: &Binaries,
    queue: &str,
    prefetch: u16,
    url: &str,
    exchange: &str,
) -> std::io::Result<tokio::process::Child> {
    raw_loop_command(binaries, queue, prefetch, Some(url), None)
        .args(["--retry-exchange", exchange])
        .stdout(Stdio::null())
        .spawn()
}

/// `hookrelay-dev bench-ceiling` with its arguments, killed when dropped.
fn raw_loop_command(
    binaries: &Binaries,
    queue: &str,
    prefetch: u16,
    url: Option<&str>,
    forward: Option<&str>,
) -> tokio::process::Command {
    let prefetch = prefetch.to_string();
    let mut args = vec!["bench-ceiling", "--queue", queue, "--prefetch", &prefetch];
    if let Some(url) = url {
        args.extend(["--url", url]);
    }
    if let Some(to) = forward {
        args.extend(["--forward", to]);
    }
    let mut command = tokio::process::Command::new(&binaries.ceiling);
    command.args(args).kill_on_drop(true);
    command
}

struct WorkerProcess {
    child: tokio::process::Child,
    /// Where its `/metrics` answers, on loopback.
    metrics_port: u16,
    _dir: tempfile::TempDir,
}

impl WorkerProcess {
    /// The deliveries it has deferred so far, for any reason; 0 when its metrics do not answer.
    async fn deferrals(&self) -> u64 {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        match reqwest::Client::builder().no_proxy().build() {
            Ok(client) => noisy::deferrals(&client, &url, None).await,
            Err(_) => 0,
        }
    }
}

/// Starts `hookrelay worker` on `ladder` with `subscriptions` (a subscriptions file's text).
/// With `prefetch`, the first-attempt lane gets that prefetch; without, `worker.in_flight` stays
/// as configured.
async fn start_worker(
    exe: &Path,
    config: &Config,
    ladder: &Ladder,
    prefetch: Option<u16>,
    subscriptions: &str,
    env: &[(&str, String)],
) -> Result<WorkerProcess, BenchError> {
    let dir = tempfile::tempdir()?;
    let subs_file = dir.path().join("subscriptions.toml");
    std::fs::write(&subs_file, subscriptions)?;
    spawn_worker(exe, config, ladder, prefetch, &subs_file, env, dir)
}

/// Starts `hookrelay worker` on `ladder` with `subscriptions` as its setting: a file, or a
/// store's `postgres://` URL. Its ladder file goes into `dir`, which lives as long as it.
fn spawn_worker(
    exe: &Path,
    config: &Config,
    ladder: &Ladder,
    prefetch: Option<u16>,
    subscriptions: &Path,
    env: &[(&str, String)],
    dir: tempfile::TempDir,
) -> Result<WorkerProcess, BenchError> {
    let ladder_file = dir.path().join("ladder.toml");
    std::fs::write(&ladder_file, ladder_toml(ladder))?;
    // The first-attempt lane gets `prefetch`; the retry lane its usual share on top.
    let share = config.worker.retry_share;
    let in_flight = prefetch.map_or(config.worker.in_flight, |prefetch| {
        (f64::from(prefetch) / (1.0 - share)).round() as u16
    });
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = worker_command(
        exe,
        &format!("{} worker", ladder.prefix),
        &ladder_file,
        subscriptions,
    )
    .env("HOOKRELAY_WORKER_IN_FLIGHT", in_flight.to_string())
    .env(
        "HOOKRELAY_METRICS_LISTEN",
        format!("127.0.0.1:{metrics_port}"),
    )
    .envs(env.iter().map(|(k, v)| (k, v)))
    .stdout(Stdio::null())
    .spawn()?;
    Ok(WorkerProcess {
        child,
        metrics_port,
        _dir: dir,
    })
}

/// Endpoint caps lifted: the deliveries in flight are bounded by the worker's budget, as a raw
/// loop's by its prefetch, not by the one sink's cap of 64 or its share of a lane.
fn uncapped() -> [(&'static str, String); 3] {
    [
        ("HOOKRELAY_ENDPOINTS_MAX_CONCURRENT", "100000".to_owned()),
        (
            "HOOKRELAY_ENDPOINTS_MAX_CONCURRENT_PER_HOST",
            "100000".to_owned(),
        ),
        ("HOOKRELAY_ENDPOINTS_LANE_SHARE", "1".to_owned()),
    ]
}

fn subscription_entry(id: &str, url: &str, secret_file: &std::path::Path) -> String {
    subscription_toml(id, "bench", url, &file_secret(secret_file), "")
}

#[allow(clippy::too_many_arguments)]
async fn run_hookrelay(
    config: &Config,
    options: &BenchOptions,
    exe: &Path,
    ladder: &Ladder,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    sink: &Arc<Sink>,
    sink_addr: std::net::SocketAddr,
    report: &mut BenchReport,
) -> Result<(), BenchError> {
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let slow = Sink::new(Some(Duration::from_secs(1)));
    let slow_addr = start_sink(Arc::clone(&slow)).await?;
    let subscriptions = subscription_entry(
        "bench_fast",
        &format!("http://{sink_addr}/hook"),
        &secret_file,
    ) + &subscription_entry(
        "bench_slow",
        &format!("http://{slow_addr}/hook"),
        &secret_file,
    );
    let subscriptions = match options.schema {
        Some(mode) => subscriptions + &realistic_catalog(mode),
        None => subscriptions,
    };
    let ingress = ladder.ingress();
    let event = |i: usize, id: String, subscription: &str| NewEvent {
        id,
        tenant: "bench".into(),
        event_type: "bench.event".into(),
        subscription: Some(subscription.into()),
        timestamp: None,
        body: if options.schema.is_some() {
            realistic_body(i)
        } else {
            body(i)
        },
    };

    fresh_broker_log().await;
    say(&format!(
        "publishing {} events through {ingress}",
        options.events
    ));
    publish_many(publisher, options.events, |i| {
        to_ingress(&ingress, event(i, format!("evt_{i}"), "bench_fast"))
    })
    .await?;
    sink.reset();
    // Throughput alone: the deliveries in flight are bounded by the worker's budget, as the raw
    // loop's by its prefetch. With the one sink's cap of 64 (and its share of the lane), a few
    // percent of a backlog are deferred into a tier and delivered a second or more after the
    // rest, and the run measures that wait rather than the dispatcher. The full run keeps the
    // caps: its isolation figures depend on them.
    let env = match options.throughput_only {
        true => uncapped().to_vec(),
        false => Vec::new(),
    };
    let window = cpu::CpuWindow::begin();
    let mut worker = start_worker(
        exe,
        config,
        ladder,
        Some(options.prefetch),
        &subscriptions,
        &env,
    )
    .await?;
    let pid = worker.child.id();
    if let Err(e) = wait_count(sink, options.events as u64, Duration::from_secs(600)).await {
        return Err(BenchError::Other(format!(
            "{e}; what the ladder's queues hold: {}",
            ladder_depths(channel, ladder).await
        )));
    }
    let (n, secs) = sink.window();
    report.hookrelay = Throughput {
        deliveries: n,
        seconds: secs,
        per_second: n as f64 / secs.max(1e-9),
        peak_rss_mib: 0.0,
        cpu: window.end(pid, n),
        deferred: Some(worker.deferrals().await),
    };
    say(&format!(
        "hookrelay: {:.0} deliveries/s ({} deferred)",
        report.hookrelay.per_second,
        report.hookrelay.deferred.unwrap_or_default()
    ));
    if options.throughput_only {
        report.hookrelay.peak_rss_mib = pid.and_then(peak_rss_mib).unwrap_or(0.0);
        let _ = worker.child.kill().await;
        return Ok(());
    }

    // Latency at a steady rate below the ceiling.
    report.latency = timed_deliveries(
        publisher,
        sink,
        options.latency_events,
        options.latency_rate,
        Duration::from_secs(120),
        |i| to_ingress(&ingress, event(i, format!("lat_{i}"), "bench_fast")),
    )
    .await?;

    // Promotion precision, on a ladder of its own, before the isolation run loads the broker.
    let precision = Ladder::build(
        &format!("{}-precision", ladder.prefix),
        ladder.queue_type,
        &["1s"],
        &["1s"],
    )?;
    precision.objects().apply(channel).await?;
    let measured = promotion_precision(options, &precision, publisher, channel).await;
    let _ = precision.objects().delete(channel).await;
    report.promotion = measured?;

    // Isolation: fresh events with and without a backlog of due retries to a slow endpoint.
    report.first_attempt_baseline =
        fresh_first_attempts(options, publisher, sink, &ingress, &event).await?;
    say(&format!(
        "publishing {} due retries for a slow, failing endpoint",
        options.isolation_backlog
    ));
    // As the tiers promote them: through the promote exchange with a tier's key naming the
    // tenant (the worker refuses a tenant header its routing key does not name).
    let promote = ladder.promote_exchange();
    let key = ladder
        .tier_ids()
        .next()
        .map(|tier| ladder.tier_routing_key(tier, "bench"))
        .ok_or_else(|| BenchError::Other("the bench ladder has no tier".into()))?;
    publish_many(publisher, options.isolation_backlog, |i| {
        let e = event(i, format!("backlog_{i}"), "bench_slow");
        let props = headers::retry_properties(
            &e.properties(),
            "bench",
            1,
            now_ms(),
            "HTTP 503",
            None,
            None,
        );
        (promote.clone(), key.clone(), e.body, props)
    })
    .await?;
    report.first_attempt_with_backlog =
        fresh_first_attempts(options, publisher, sink, &ingress, &event).await?;
    report.hookrelay.peak_rss_mib = pid.and_then(peak_rss_mib).unwrap_or(0.0);
    let _ = worker.child.kill().await;
    Ok(())
}

/// The failure path: every attempt answered 503, the breaker out of reach. First the raw loop
/// (consume, POST, confirmed publish to a second queue, ack), on bare bodies and then on
/// envelopes published as retries, then hookrelay moving each envelope into its retry tier;
/// each counted from the first request at the sink until the last message is in the queue it
/// goes to.
#[allow(clippy::too_many_arguments)]
async fn failure_path(
    config: &Config,
    options: &BenchOptions,
    binaries: &Binaries,
    prefix: &str,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    report: &mut BenchReport,
) -> Result<(), BenchError> {
    let n = options.events;
    let sink = Sink::new(Some(Duration::ZERO));
    let sink_addr = start_sink(Arc::clone(&sink)).await?;

    let as_envelope = |i: usize| failing_event(i).properties();
    let runs: [(&str, &str, Option<EnvelopeOf<'_>>); 2] = [
        ("failing", "messages for the raw loop", None),
        (
            "failing-retry",
            "envelopes for the raw loop publishing retries",
            Some(&as_envelope),
        ),
    ];
    for (name, what, envelope) in runs {
        say(&format!("failure path: publishing {n} {what}"));
        let raw = raw_failure(
            options,
            binaries,
            publisher,
            channel,
            &sink,
            sink_addr,
            &format!("{prefix}.{name}"),
            envelope,
        )
        .await?;
        match envelope {
            None => report.failure_ceiling = Some(raw),
            Some(_) => report.failure_retry_ceiling = Some(raw),
        }
    }

    // Tiers long enough that nothing comes back during the run.
    let ladder = options.streams(Ladder::build(
        &format!("{prefix}-failing"),
        options.queue_type,
        &["10m"],
        &["10m", "10m"],
    )?);
    ladder.objects().apply(channel).await?;
    let result = failure_path_hookrelay(
        config, options, binaries, &ladder, publisher, channel, &sink, sink_addr,
    )
    .await;
    let _ = ladder.objects().delete(channel).await;
    report.failure_hookrelay = Some(result?);
    Ok(())
}

/// The properties of a raw loop's i-th envelope.
type EnvelopeOf<'a> = &'a dyn Fn(usize) -> BasicProperties;

/// One raw loop of the failure path, on queues and an exchange named after `name`, deleted
/// afterwards: consume, POST, confirmed publish, ack. With `envelope` (the properties of the
/// i-th message), it consumes those messages and publishes each as hookrelay publishes a retry
/// (through a fanout exchange, like a tier's); without, bare bodies to the next queue.
#[allow(clippy::too_many_arguments)]
async fn raw_failure(
    options: &BenchOptions,
    binaries: &Binaries,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    sink: &Arc<Sink>,
    sink_addr: std::net::SocketAddr,
    name: &str,
    envelope: Option<EnvelopeOf<'_>>,
) -> Result<Throughput, BenchError> {
    let n = options.events;
    let from = name.to_owned();
    let to = format!("{name}-next");
    let exchange = format!("{name}-x");
    declare_raw_queue(channel, &to, options.queue_type).await?;
    let result = async {
        match envelope {
            None => raw_backlog(publisher, channel, &from, options).await?,
            Some(properties) => {
                channel
                    .exchange_declare(
                        exchange.as_str().into(),
                        lapin::ExchangeKind::Fanout,
                        lapin::options::ExchangeDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                channel
                    .queue_bind(
                        to.as_str().into(),
                        exchange.as_str().into(),
                        "".into(),
                        lapin::options::QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                raw_backlog_of(publisher, channel, &from, options, properties).await?;
            }
        }
        let url = format!("http://{sink_addr}/failing");
        sink.reset();
        let window = cpu::CpuWindow::begin();
        let mut child = match envelope {
            None => start_ceiling(binaries, &from, options.prefetch, &url, Some(&to))?,
            Some(_) => start_retry_ceiling(binaries, &from, options.prefetch, &url, &exchange)?,
        };
        let moved = moved(channel, sink, &to, n, Duration::from_secs(600))
            .await
            .map(|t| t.with_cpu(window.end(child.id(), n as u64)));
        let _ = child.kill().await;
        moved
    }
    .await;
    for queue in [&from, &to] {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    if envelope.is_some() {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await;
    }
    result
}

/// The failure path's i-th event, as hookrelay's backlog and the retry-publishing raw loop's
/// have it.
fn failing_event(i: usize) -> NewEvent {
    NewEvent {
        id: format!("fail_{i}"),
        tenant: "bench".into(),
        event_type: "bench.event".into(),
        subscription: Some("bench_failing".into()),
        timestamp: None,
        body: body(i),
    }
}

#[allow(clippy::too_many_arguments)]
async fn failure_path_hookrelay(
    config: &Config,
    options: &BenchOptions,
    binaries: &Binaries,
    ladder: &Ladder,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    sink: &Arc<Sink>,
    sink_addr: std::net::SocketAddr,
) -> Result<Throughput, BenchError> {
    let n = options.events;
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let subscriptions = subscription_entry(
        "bench_failing",
        &format!("http://{sink_addr}/hook"),
        &secret_file,
    );
    let ingress = ladder.ingress();
    say(&format!(
        "failure path: publishing {n} events through {ingress}"
    ));
    fresh_broker_log().await;
    publish_many(publisher, n, |i| to_ingress(&ingress, failing_event(i))).await?;
    let tier = ladder
        .tier_ids()
        .next()
        .map(|tier| ladder.tier_queue(tier))
        .ok_or_else(|| BenchError::Other("the bench ladder has no tier".into()))?;
    sink.reset();
    // Every attempt is made: the breaker never opens, and no envelope waits for a slot (neither
    // the endpoint's cap nor its host's, which would defer a few percent of them, nor its share
    // of the lane).
    let [cap, host_cap, lane_share] = uncapped();
    let env = [
        ("HOOKRELAY_ENDPOINTS_BREAKER_FAILURES", u32::MAX.to_string()),
        cap,
        host_cap,
        lane_share,
    ];
    let window = cpu::CpuWindow::begin();
    let mut worker = start_worker(
        &binaries.worker,
        config,
        ladder,
        Some(options.prefetch),
        &subscriptions,
        &env,
    )
    .await?;
    let mut result = moved(channel, sink, &tier, n, Duration::from_secs(600))
        .await
        .map(|t| t.with_cpu(window.end(worker.child.id(), n as u64)));
    if let Ok(t) = &mut result {
        t.deferred = Some(worker.deferrals().await);
    }
    let _ = worker.child.kill().await;
    result
}

/// Waits until `queue` holds `n` messages and measures from the sink's first request until
/// then.
async fn moved(
    channel: &lapin::Channel,
    sink: &Sink,
    queue: &str,
    n: usize,
    timeout: Duration,
) -> Result<Throughput, BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let depth = hookrelay::ops::mover::depth(channel, queue).await? as usize;
        if depth >= n {
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Other(format!(
                "only {depth} of {n} messages reached {queue} within {}s",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end = sink.started.elapsed().as_nanos() as u64;
    let first = sink.first_ns.load(Ordering::SeqCst);
    let seconds = end.saturating_sub(first) as f64 / 1e9;
    say(&format!(
        "failure path: {n} into {queue} at {:.0}/s",
        n as f64 / seconds.max(1e-9)
    ));
    Ok(Throughput {
        deliveries: n as u64,
        seconds,
        per_second: n as f64 / seconds.max(1e-9),
        peak_rss_mib: 0.0,
        cpu: None,
        deferred: None,
    })
}

async fn fresh_first_attempts(
    options: &BenchOptions,
    publisher: &Arc<Publisher>,
    sink: &Arc<Sink>,
    ingress: &str,
    event: &impl Fn(usize, String, &str) -> NewEvent,
) -> Result<Percentiles, BenchError> {
    let tag = uuid::Uuid::new_v4().simple().to_string();
    timed_deliveries(
        publisher,
        sink,
        options.isolation_events,
        500,
        Duration::from_secs(120),
        |i| {
            to_ingress(
                ingress,
                event(i, format!("fresh_{}_{i}", &tag[..6]), "bench_fast"),
            )
        },
    )
    .await
}

/// An event as `publish_many` and `publish_paced` take it: through the ingress exchange.
fn to_ingress(ingress: &str, e: NewEvent) -> (String, String, Vec<u8>, BasicProperties) {
    let properties = e.properties();
    (ingress.to_owned(), e.tenant, e.body, properties)
}

/// Publishes `n` messages at `rate` per second and measures publish to arrival at `sink`,
/// waiting up to `timeout` for the last.
async fn timed_deliveries(
    publisher: &Arc<Publisher>,
    sink: &Sink,
    n: usize,
    rate: u32,
    timeout: Duration,
    make: impl Fn(usize) -> (String, String, Vec<u8>, BasicProperties),
) -> Result<Percentiles, BenchError> {
    sink.reset();
    sink.record.store(true, Ordering::SeqCst);
    publish_paced(publisher, n, rate, make).await?;
    wait_count(sink, n as u64, timeout).await?;
    sink.record.store(false, Ordering::SeqCst);
    Ok(Percentiles::of(sink.take_latencies()))
}

async fn promotion_precision(
    options: &BenchOptions,
    ladder: &Ladder,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
) -> Result<Percentiles, BenchError> {
    let retry_lane = ladder.retry_lane();
    say(&format!(
        "promotion precision: {} messages through the 1s tier",
        options.precision_messages
    ));
    // The bench's ladder is 1s and 10s; the shortest is the 1s tier.
    let first_tier = ladder
        .tier_ids()
        .next()
        .ok_or_else(|| BenchError::Other("the bench ladder has no tier".into()))?;
    let n = options.precision_messages;
    let consumer_channel = channel.clone();
    // A raw consumer on the retry lane: no worker, so only the broker's promotion is timed.
    consumer_channel
        .basic_qos(1000, BasicQosOptions::default())
        .await?;
    let mut consumer = consumer_channel
        .basic_consume(
            retry_lane.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let collect = tokio::spawn(async move {
        let mut lags = Vec::with_capacity(n);
        while lags.len() < n {
            match tokio::time::timeout(Duration::from_secs(60), consumer.next()).await {
                Ok(Some(Ok(d))) => {
                    if let Some(due) = headers::read_u64_header(&d.properties, headers::DUE_HEADER)
                    {
                        lags.push(now_ms() as f64 - due as f64);
                    }
                    let _ = d.acker.ack(BasicAckOptions::default()).await;
                }
                _ => break,
            }
        }
        lags
    });
    // Paced, so the measure is the tier's timing rather than a burst's queueing.
    publish_paced(publisher, n, options.precision_rate, |i| {
        let e = NewEvent {
            id: format!("prec_{i}"),
            tenant: "bench".into(),
            event_type: "bench.event".into(),
            subscription: Some("bench_fast".into()),
            timestamp: None,
            body: body(i),
        };
        // Due when the tier's TTL runs out: one second after it is stored.
        let props =
            headers::retry_properties(&e.properties(), "bench", 1, now_ms() + 1000, "", None, None);
        (
            ladder.tier_exchange(first_tier),
            ladder.tier_routing_key(first_tier, "bench"),
            e.body,
            props,
        )
    })
    .await?;
    let lags = collect
        .await
        .map_err(|e| BenchError::Other(e.to_string()))?;
    Ok(Percentiles::of(lags))
}

/// Where the failure path's raw loop publishes each message before its ack.
#[derive(Debug, Clone, Copy)]
pub enum Forward<'a> {
    /// The bare body to this queue, through the default exchange.
    Bare(&'a str),
    /// The message as hookrelay publishes a retry: its properties with the retry's headers
    /// (attempts, due time, last error, endpoint, deferrals, a publish id), `mandatory`,
    /// through this exchange.
    AsRetry(&'a str),
}

/// What the raw loop publishing retries keeps for them: the endpoint its retries name, and the
/// next publish id.
struct AsRetry {
    endpoint: String,
    publish_ids: AtomicU64,
}

/// The ceiling loop (`hookrelay bench-ceiling`): consume each of `queues` with `prefetch`, POST each body to
/// `url` (when given), ack. Writes one line, `first`, to stdout when the first delivery arrives,
/// so its starter can time from there. Runs until killed.
pub async fn ceiling_loop(
    config: &Config,
    queues: &[String],
    prefetch: u16,
    url: Option<&str>,
    forward: Option<Forward<'_>>,
) -> Result<(), BenchError> {
    let conn =
        Connection::connect(config.amqp.url.expose(), ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    // The failure path's loop: every message on, confirmed, before the ack; all on one channel
    // with as many confirms in flight as deliveries.
    let forward = match forward {
        Some(to) => {
            let out = conn.create_channel().await?;
            out.confirm_select(ConfirmSelectOptions::default()).await?;
            let (exchange, key, as_retry) = match to {
                Forward::Bare(queue) => (String::new(), queue.to_owned(), None),
                Forward::AsRetry(exchange) => (
                    exchange.to_owned(),
                    "retry.bench".into(),
                    Some(Arc::new(AsRetry {
                        endpoint: url.unwrap_or_default().to_owned(),
                        publish_ids: AtomicU64::new(1),
                    })),
                ),
            };
            Some((
                out,
                ShortString::from(exchange),
                ShortString::from(key),
                as_retry,
            ))
        }
        None => None,
    };
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let url: Option<reqwest::Url> = url
        .map(str::parse)
        .transpose()
        .map_err(|e| BenchError::Other(format!("{e}")))?;
    let mut first = true;
    // One consumer per queue on the one channel; the prefetch is per consumer (basic.qos
    // without global), so each queue has `prefetch` in flight, as a sharded worker's lanes do.
    let mut consumers = Vec::with_capacity(queues.len());
    for queue in queues {
        consumers.push(
            channel
                .basic_consume(
                    queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?,
        );
    }
    let mut consumer = futures_util::stream::select_all(consumers);
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        if first {
            first = false;
            use std::io::Write;
            let mut out = std::io::stdout();
            let _ = writeln!(out, "first");
            let _ = out.flush();
        }
        let client = client.clone();
        let url = url.clone();
        let forward = forward.clone();
        tokio::spawn(async move {
            if let Some(url) = url {
                let _ = client.post(url).body(delivery.data.clone()).send().await;
            }
            if let Some((out, exchange, key, as_retry)) = forward {
                let properties = if let Some(retry) = &as_retry {
                    let now = now_ms();
                    headers::with_publish_id(
                        headers::retry_properties(
                            &delivery.properties,
                            "bench",
                            1,
                            now + 600_000,
                            "HTTP 503",
                            Some(&retry.endpoint),
                            Some(headers::Deferrals {
                                count: 0,
                                first_try_ms: Some(now),
                                busy: 0,
                                waiting_since_ms: Some(now),
                            }),
                        ),
                        retry.publish_ids.fetch_add(1, Ordering::Relaxed),
                    )
                } else {
                    BasicProperties::default().with_delivery_mode(2)
                };
                let options = BasicPublishOptions {
                    mandatory: as_retry.is_some(),
                    ..BasicPublishOptions::default()
                };
                let confirmed = match out
                    .basic_publish(exchange, key, options, &delivery.data, properties)
                    .await
                {
                    Ok(confirm) => confirm.await.is_ok_and(|c| c.is_ack()),
                    Err(_) => false,
                };
                if !confirmed {
                    return;
                }
            }
            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
        });
    }
    Ok(())
}

/// The CPU lines under a pair of throughput rows, when both were measured: microseconds per
/// message of the broker, of the consumer (the loop or the worker) and of the bench's sink.
fn cpu_lines(raw_name: &str, raw: &Throughput, our_name: &str, ours: &Throughput) -> String {
    cpu_rows(&[(raw_name, raw), (our_name, ours)])
}

/// The CPU lines of several throughput rows, when every one was measured.
fn cpu_rows(rows: &[(&str, &Throughput)]) -> String {
    let Some(measured) = rows
        .iter()
        .map(|(name, t)| t.cpu.as_ref().map(|c| (*name, c)))
        .collect::<Option<Vec<_>>>()
    else {
        return String::new();
    };
    let broker = |c: &cpu::CpuPerMessage| {
        c.broker_us
            .map_or_else(|| "-".to_owned(), |us| format!("{us:.0}"))
    };
    let mut lines = "CPU per message, µs            broker   consumer     sink\n".to_owned();
    for (name, c) in measured {
        lines += &format!(
            "  {name:<28} {b:>8} {c:>10.0} {s:>8.0}\n",
            b = broker(c),
            c = c.consumer_us,
            s = c.bench_us
        );
    }
    lines
}

pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or_else(String::new, |kb| {
            format!(", {:.0} GiB", kb / 1024.0 / 1024.0)
        });
    format!("{cpus} CPUs{mem}, broker, sink and worker on the same machine")
}

impl BenchReport {
    pub fn table(&self) -> String {
        let table = format!(
            "hookrelay bench ({machine}; {broker}, {qt} queues, prefetch {pf}, {ev} events{log})\n\
             \n\
             throughput                 deliveries/s   seconds   peak RSS\n\
             ceiling (raw lapin loop)   {c:>12.0}   {cs:>7.2}   {cr:>5.1} MiB\n\
             hookrelay worker           {h:>12.0}   {hs:>7.2}   {hr:>5.1} MiB\n\
             ratio hookrelay/ceiling    {ratio:>12.2}\n\
             {cpu}\
             \n\
             publish -> delivered at {rate}/s       p50 {lp50:.1} ms   p99 {lp99:.1} ms   (n={ln})\n\
             promotion (1s tier) minus due     p50 {pp50:.1} ms   p99 {pp99:.1} ms   (n={pn}, {prate}/s)\n\
             first attempt, no backlog         p50 {bp50:.1} ms   p99 {bp99:.1} ms   (n={bn})\n\
             first attempt, {bl} due retries  p50 {wp50:.1} ms   p99 {wp99:.1} ms   (n={wn})\n\
             isolation p99 ratio (with/without backlog) {iso:.2}\n",
            machine = self.machine,
            broker = self.broker,
            qt = self.queue_type,
            pf = self.prefetch,
            ev = self.events,
            log = if self.attempt_log_kept {
                "; a queue keeps the attempt log".to_owned()
            } else if self.streams_off {
                "; ladders without streams (no archive, no attempt log)".to_owned()
            } else if self.archive_off {
                "; ladders without the archive".to_owned()
            } else if self.attempt_log_off {
                "; ladders without the attempt log".to_owned()
            } else {
                String::new()
            } + &self
                .schema
                .as_ref()
                .map(|m| format!("; realistic payload, schema validation {m}"))
                .unwrap_or_default(),
            c = self.ceiling.per_second,
            cs = self.ceiling.seconds,
            cr = self.ceiling.peak_rss_mib,
            h = self.hookrelay.per_second,
            hs = self.hookrelay.seconds,
            hr = self.hookrelay.peak_rss_mib,
            ratio = self.ratio,
            cpu = cpu_lines(
                "ceiling (raw lapin loop)",
                &self.ceiling,
                "hookrelay worker",
                &self.hookrelay
            ) + &self
                .streams
                .as_ref()
                .map(beside::StreamCounts::line)
                .unwrap_or_default()
                + &self
                    .history_beside
                    .as_ref()
                    .map(beside::HistoryBesideReport::line)
                    .unwrap_or_default(),
            rate = self.latency_rate_per_s,
            lp50 = self.latency.p50_ms,
            lp99 = self.latency.p99_ms,
            ln = self.latency.count,
            pp50 = self.promotion.p50_ms,
            pp99 = self.promotion.p99_ms,
            pn = self.promotion.count,
            prate = self.promotion_rate_per_s,
            bp50 = self.first_attempt_baseline.p50_ms,
            bp99 = self.first_attempt_baseline.p99_ms,
            bn = self.first_attempt_baseline.count,
            bl = self.isolation_backlog,
            wp50 = self.first_attempt_with_backlog.p50_ms,
            wp99 = self.first_attempt_with_backlog.p99_ms,
            wn = self.first_attempt_with_backlog.count,
            iso = self.isolation_ratio_p99,
        );
        let table = if self.throughput_only {
            // The lines after the ratio were not measured.
            table.split("\n\n").take(2).collect::<Vec<_>>().join("\n\n") + "\n"
        } else {
            table
        };
        match (&self.failure_ceiling, &self.failure_hookrelay) {
            (Some(raw), Some(ours)) => {
                let mut rows = vec![("raw loop", raw)];
                let mut lines = format!(
                    "{table}\n\
                     failure path (every attempt 503)      into next queue/s   seconds\n\
                     raw loop (POST, confirmed publish)   {r:>12.0}   {rs:>7.2}\n",
                    r = raw.per_second,
                    rs = raw.seconds,
                );
                if let Some(retry) = &self.failure_retry_ceiling {
                    lines += &format!(
                        "raw loop publishing retries         {r:>12.0}   {rs:>7.2}\n",
                        r = retry.per_second,
                        rs = retry.seconds,
                    );
                    rows.push(("raw loop publishing retries", retry));
                }
                lines += &format!(
                    "hookrelay worker (into retry tier)   {h:>12.0}   {hs:>7.2}\n\
                     ratio hookrelay/raw                  {ratio:>12.2}\n",
                    h = ours.per_second,
                    hs = ours.seconds,
                    ratio = self.failure_ratio,
                );
                if self.failure_retry_ceiling.is_some() {
                    lines += &format!(
                        "ratio hookrelay/raw publishing retries {ratio:>10.2}\n",
                        ratio = self.failure_retry_ratio,
                    );
                }
                rows.push(("hookrelay worker", ours));
                lines + &cpu_rows(&rows)
            }
            _ => table,
        }
    }
}
