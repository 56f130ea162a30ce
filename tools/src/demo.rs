//! `hookrelay demo`: the whole path on a real broker in under a minute. A ladder with short
//! tiers under its own prefix, an embedded endpoint that verifies signatures and fails some
//! deliveries on purpose, a worker, about a thousand events, and a table at the end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::BasicGetOptions;
use lapin::{Connection, ConnectionProperties};

use crate::kit::{Counters, Percentiles, wait_until};
use crate::receiver::{Receiver, Reply};
use hookrelay::broker::publish::Publisher;
use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::headers;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;
use hookrelay::delivery::worker::{Worker, WorkerSetup};
use hookrelay::ops::mover::depth;
use hookrelay::ops::progress::Progress;
use hookrelay::subscriptions::{
    EventFilter, LiveSubscriptions, SecretRef, Subscription, Subscriptions,
};
use hookrelay::units::now_ms;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error(transparent)]
    Ladder(#[from] hookrelay::contract::ladder::LadderError),
    #[error("topology: {0}")]
    Topology(#[from] hookrelay::broker::topology::TopologyError),
    #[error(transparent)]
    Publish(#[from] hookrelay::broker::publish::PublishError),
    #[error(transparent)]
    Worker(#[from] hookrelay::delivery::worker::WorkerError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub events: usize,
    /// Leave the demo's queues and exchanges on the broker to look at afterwards.
    pub keep: bool,
    /// Give up waiting for the last deliveries after this long.
    pub deadline: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            events: 1000,
            keep: false,
            deadline: Duration::from_secs(90),
        }
    }
}

/// What the demo saw, for the final table.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    pub prefix: String,
    pub published: usize,
    pub delivered: usize,
    pub retried_by_tier: BTreeMap<String, u64>,
    pub dead_by_reason: BTreeMap<String, usize>,
    pub duplicates: usize,
    pub unverified: usize,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub elapsed: Duration,
    /// Events that reached no end state before the deadline.
    pub unfinished: usize,
}

/// How the demo endpoint treats event `i` (its id ends in `i`) on attempt `attempt`.
fn script(i: usize, attempt: u32) -> Reply {
    match (i % 100, attempt) {
        (0..=2, _) => Reply::Status(400),
        (3..=4, _) => Reply::Status(503),
        (5..=14, 1) => Reply::Status(503),
        (15..=19, 1) => Reply::RetryAfter(429, 2),
        (20..=22, 1) => Reply::Slow(Duration::from_millis(1500), 200),
        _ => Reply::Status(204),
    }
}

fn index_of(id: &str) -> usize {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

pub async fn run(config: &Config, options: &DemoOptions) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-demo-{run_id}");
    let ladder = Ladder::build(
        &prefix,
        QueueType::Quorum,
        &["1s", "2s", "4s"],
        &["1s", "2s", "4s"],
    )?;
    let topology = ladder.objects();

    let conn = Connection::connect(
        config.amqp.url.expose(),
        ConnectionProperties::default().with_connection_name(format!("{prefix} demo").into()),
    )
    .await
    .map_err(|e| DemoError::Other(format!("cannot connect to {}: {e}", config.amqp.url)))?;
    let channel = conn.create_channel().await?;
    topology.apply(&channel).await?;
    println!("Applied ladder {prefix}: tiers 1s, 2s, 4s; 4 attempts per event");
    println!(
        "Watch it in the management UI: {}/#/queues (filter: {prefix}); the tiers fill and drain, \
         the dead sink keeps what failed",
        config
            .management
            .url
            .without_credentials()
            .trim_end_matches('/')
    );

    let outcome = run_inside(config, options, &ladder, &prefix, &channel).await;

    if options.keep {
        println!("Kept the demo's objects (--keep); remove them from the management UI when done");
    } else if let Err(e) = topology.delete(&channel).await {
        eprintln!("Could not remove the demo's objects under {prefix}: {e}");
    }
    let _ = conn.close(200, "demo done".into()).await;
    let mut report = outcome?;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// The demo worker's configuration: `config` with short HTTP timeouts, a breaker its scripted
/// failures do not open, loopback allowed and metrics on a loopback port.
fn worker_config(config: &Config) -> Result<Config, DemoError> {
    let mut worker_config = config.clone();
    worker_config.http.connect_timeout = Duration::from_secs(1);
    worker_config.http.request_timeout = Duration::from_secs(1);
    // Just over one attempt, the least the worker takes: the demo stops it once all is settled.
    worker_config.worker.shutdown_grace = worker_config.attempt_budget() + Duration::from_secs(1);
    // Every scripted failure goes to one endpoint, and they land together: the 30 slow answers
    // time out within a few milliseconds of each other, the 20 that always fail come back from
    // each tier at once. Twenty in a row open the default breaker for 30 s, far past this
    // ladder's 7 s span, and everything it defers then ends `horizon_expired`: the demo would
    // show the breaker's cool-down, not the retry path it is about. The breaker has tests of
    // its own (tests/isolation.rs).
    worker_config.endpoints.breaker_failures = 100;
    // The demo's endpoint is on loopback, which the egress policy blocks unless allowed.
    worker_config.egress.allow.push(
        "127.0.0.0/8"
            .parse()
            .map_err(|e| DemoError::Other(format!("loopback CIDR: {e}")))?,
    );
    worker_config.metrics.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    worker_config.metrics.poll_interval = Duration::from_secs(1);
    Ok(worker_config)
}

async fn run_inside(
    config: &Config,
    options: &DemoOptions,
    ladder: &Ladder,
    prefix: &str,
    channel: &lapin::Channel,
) -> Result<DemoReport, DemoError> {
    let secret = generate_secret();
    let secret_file = SecretFile::create(prefix, &secret)?;
    let receiver = Receiver::start(std::slice::from_ref(&secret), |req| {
        script(index_of(req.id), req.attempt)
    })
    .await?;
    let mut subscription = Subscription::new(
        "demo_orders",
        "demo",
        receiver
            .url("/webhooks")
            .parse()
            .map_err(|e| DemoError::Other(format!("receiver URL: {e}")))?,
        SecretRef::File(secret_file.path.clone()),
    );
    subscription.event_types = Some(vec![EventFilter::Prefix("order.".into())]);
    let worker_config = worker_config(config)?;
    let mut setup = WorkerSetup::new(
        worker_config,
        ladder.clone(),
        LiveSubscriptions::fixed(Subscriptions::from_list([subscription])),
    );
    setup.name = format!("{prefix} worker");
    let worker = Worker::start(setup).await?;
    let metrics = worker.metrics();
    if let Some(addr) = worker.vitals_addr() {
        println!("The demo worker's metrics: http://{addr}/metrics");
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker_task = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    let publisher = Arc::new(
        Publisher::connect(
            &config.amqp.url,
            &format!("{prefix} producer"),
            config.amqp.confirm_timeout,
        )
        .await?,
    );
    let ingress = ladder.ingress();
    let max_body = config.limits.max_body_bytes;
    println!(
        "Publishing {} events to {ingress} (tenant demo); the endpoint fails some on purpose: \
         3% 400, 2% always 503, 10% one 503, 5% one 429 with Retry-After: 2, 3% one slow answer",
        options.events
    );
    let results: Vec<_> = futures_util::stream::iter(0..options.events)
        .map(|i| {
            let publisher = Arc::clone(&publisher);
            let ingress = ingress.clone();
            async move {
                let event = NewEvent {
                    id: format!("evt-{}-{i:05}", &prefix[prefix.len() - 8..]),
                    tenant: "demo".into(),
                    event_type: "order.paid".into(),
                    subscription: Some("demo_orders".into()),
                    timestamp: None,
                    body: format!(r#"{{"order":{i},"sent_at_ms":{}}}"#, now_ms()).into_bytes(),
                };
                publisher.publish_event(&ingress, &event, max_body).await
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let published = results.iter().filter(|r| r.is_ok()).count();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        eprintln!(
            "{} publishes failed; first error: {e}",
            options.events - published
        );
    }
    publisher.close().await;

    let dead_count = || async {
        depth(channel, &ladder.dead())
            .await
            .map_or(0, |n| n as usize)
    };
    let progress = Progress::new(published as u64, "finished");
    wait_until(options.deadline, async || {
        let delivered = receiver.delivered_count();
        let dead = dead_count().await;
        progress.set(
            (delivered + dead) as u64,
            &format!(
                "delivered {delivered} · dead {dead} · retries {}",
                metrics.count("hookrelay_retries_total", &[])
            ),
        );
        delivered + dead >= published
    })
    .await;
    progress.finish();

    let _ = stop.send(());
    match worker_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("The worker stopped with an error: {e}"),
        Err(e) => eprintln!("The worker task failed: {e}"),
    }

    let mut dead_by_reason = BTreeMap::new();
    while let Some(msg) = channel
        .basic_get(
            ladder.dead().as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await?
    {
        let reason = headers::read_str_header(&msg.delivery.properties, headers::REASON_HEADER)
            .unwrap_or_else(|| "(none)".into());
        *dead_by_reason.entry(reason).or_insert(0) += 1;
    }

    let mut latencies: Vec<f64> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut unverified = 0;
    for r in receiver.records() {
        if !r.verified_with.iter().all(|&ok| ok) {
            unverified += 1;
        }
        if (200..300).contains(&r.status) && seen.insert(r.id.clone()) {
            let sent = serde_json::from_slice::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v["sent_at_ms"].as_u64());
            if let Some(sent) = sent {
                latencies.push(r.received_at_ms.saturating_sub(sent) as f64);
            }
        }
    }
    let latency = Percentiles::of(latencies);
    let retried_by_tier = ladder
        .tier_ids()
        .map(|id| {
            let t = ladder.tier(id);
            (
                t.name.clone(),
                metrics.count("hookrelay_retries_total", &[("tier", t.name.as_str())]),
            )
        })
        .collect();
    let delivered = receiver.delivered_count();
    let dead: usize = dead_by_reason.values().sum();
    Ok(DemoReport {
        prefix: prefix.to_owned(),
        published,
        delivered,
        retried_by_tier,
        dead_by_reason,
        duplicates: receiver.duplicates(),
        unverified,
        p50_ms: latency.p50_ms as u64,
        p99_ms: latency.p99_ms as u64,
        elapsed: Duration::ZERO,
        unfinished: published.saturating_sub(delivered + dead),
    })
}

impl DemoReport {
    /// The final table.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![
            ("published".into(), self.published.to_string()),
            (
                "delivered (2xx, verified)".into(),
                self.delivered.to_string(),
            ),
        ];
        for (tier, n) in &self.retried_by_tier {
            rows.push((format!("retried via {tier}"), n.to_string()));
        }
        for (reason, n) in &self.dead_by_reason {
            rows.push((format!("dead-lettered: {reason}"), n.to_string()));
        }
        rows.push((
            "still in flight at the deadline".into(),
            self.unfinished.to_string(),
        ));
        rows.push((
            "duplicates seen by the receiver".into(),
            self.duplicates.to_string(),
        ));
        rows.push((
            "requests failing signature check".into(),
            self.unverified.to_string(),
        ));
        rows.push(("time to delivery p50".into(), format!("{} ms", self.p50_ms)));
        rows.push(("time to delivery p99".into(), format!("{} ms", self.p99_ms)));
        rows.push((
            "demo took".into(),
            format!("{:.1} s", self.elapsed.as_secs_f64()),
        ));
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("  {k:<width$}  {v:>8}\n"));
        }
        out
    }
}

/// The demo subscription's secret, in a file the worker resolves at each attempt.
struct SecretFile {
    path: PathBuf,
}

impl SecretFile {
    fn create(prefix: &str, secret: &str) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("{prefix}.whsec"));
        std::fs::write(&path, secret)?;
        Ok(Self { path })
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_workers_configuration_is_one_the_worker_accepts() {
        let config = worker_config(&Config::default()).unwrap();
        config.validate().unwrap();
    }
}
