//! The noisy-neighbour scenarios (`hookrelay-dev bench --noisy ...`): does one tenant's backlog
//! for a broken endpoint sit in front of another tenant's webhooks?
//!
//! Tenant A's endpoint (on 127.0.0.1) hangs (accepts, reads the request, never answers; the
//! worker's `http.request_timeout` ends each attempt) or answers 503 at once. Tenant B's
//! endpoint is another host (127.0.0.2, its own port), healthy, answering 204, so neither the
//! per-endpoint nor the per-host caps and breakers couple the two. Each scenario runs on a
//! ladder of its own (the tiers, schedule and deferral queues of `topology/ladder.toml` under a
//! unique prefix, deleted afterwards) with a worker process of its own, on the worker's
//! configuration as loaded (defaults unless the bench's config says otherwise), except:
//! loopback endpoints allowed (`egress.allow = 127.0.0.0/8`), metrics on a loopback port (the
//! bench reads the deferral counter there), errors-only logging.
//!
//! - **Onset**: A's `--noisy-backlog` events are published at once into the shared lanes; right
//!   after, B publishes [`NoisyOptions::onset_b_events`] at [`NoisyOptions::onset_b_rate`] per
//!   second. B's events sit behind A's in the first-attempt lane's FIFO until A's are out of it,
//!   so the floor is what the broker needs to move A's backlog: a raw loop (its own process)
//!   consuming the same number of persistent messages from a queue of the same type with the
//!   first-attempt lane's prefetch, publishing each to a second queue with a confirm, and
//!   acking, timed from its first delivery until the last message is in the second queue;
//!   measured in the same scenario, just before. Target: B's p99 at most the floor + 1 s.
//! - **Steady state**: B alone first (its idle latency); then A's breaker is opened (A's events
//!   until the worker defers one because the breaker is open); then A's backlog is published at
//!   once; when it has left the first-attempt lane (deferred into the tiers), B publishes
//!   [`NoisyOptions::steady_b_events`] at [`NoisyOptions::steady_b_rate`] per second, a window
//!   long enough to include A's backlog coming back from its tier through the retry lane and
//!   being deferred again (the deferrals counted in B's window are reported). Target: B's p99 at
//!   most 2x its idle p99 + 50 ms.
//! - **With shards** (`--noisy-shards N`, onset scenarios only): the ladder's shared lanes are N
//!   shards keyed by tenant. Each onset scenario runs twice: with B in another shard than A (B
//!   alone first for its idle latency, then A's onset; target: B's p99 at most 2x idle + 50 ms,
//!   as no FIFO of B's holds A's backlog), and with B in A's shard (target as unsharded: the
//!   floor + 1 s). Tenant names are picked by probing: one event per candidate published into
//!   the ladder before the worker starts, read back from the shard it landed in.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::QueueDeleteOptions;
use serde::Serialize;
use tokio::io::AsyncBufReadExt;

use hookrelay::broker::publish::Publisher;
use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;

use super::{
    BenchError, BenchSession, Binaries, Sink, body, declare_raw_queue, machine, publish_many,
    raw_loop_command, say, start_sink_on, start_worker, subscription_entry, timed_deliveries,
    to_ingress,
};
use crate::kit::{Percentiles, wait_until};

/// A noisy-neighbour scenario: onset or steady state, with A's endpoint hanging or answering 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Scenario {
    #[value(name = "onset-hang")]
    OnsetHang,
    #[value(name = "onset-503")]
    Onset503,
    #[value(name = "steady-hang")]
    SteadyHang,
    #[value(name = "steady-503")]
    Steady503,
}

impl Scenario {
    fn steady(self) -> bool {
        matches!(self, Scenario::SteadyHang | Scenario::Steady503)
    }

    fn hangs(self) -> bool {
        matches!(self, Scenario::OnsetHang | Scenario::SteadyHang)
    }

    fn name(self) -> &'static str {
        if self.steady() { "steady" } else { "onset" }
    }

    fn mode(self) -> &'static str {
        if self.hangs() { "hang" } else { "503" }
    }
}

#[derive(Debug, Clone)]
pub struct NoisyOptions {
    pub scenarios: Vec<Scenario>,
    /// Tenant A's events, published at once.
    pub backlog: usize,
    pub queue_type: QueueType,
    /// B's events and their pace at the onset: right after A's backlog.
    pub onset_b_events: usize,
    pub onset_b_rate: u32,
    /// B's events and their pace in the steady state, and for B's idle latency; the window
    /// (events / rate) must outlast the tier A's deferred backlog waits in (1 min with the
    /// default ladder and breaker), so A's return is inside it.
    pub steady_b_events: usize,
    pub steady_b_rate: u32,
    /// Shards of the shared lanes (1: unsharded).
    pub shards: u16,
}

impl Default for NoisyOptions {
    fn default() -> Self {
        Self {
            scenarios: Vec::new(),
            backlog: 20_000,
            queue_type: QueueType::Quorum,
            onset_b_events: 300,
            onset_b_rate: 100,
            steady_b_events: 300,
            steady_b_rate: 4,
            shards: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct NoisyRow {
    pub scenario: String,
    /// With shards: whether B is in A's shard (`same`) or another (`other`); `-` unsharded.
    pub b_shard: String,
    pub a_mode: String,
    pub a_backlog: usize,
    /// The raw loop's time to move A's backlog (onset only).
    pub floor_seconds: Option<f64>,
    pub b: Percentiles,
    /// B alone, before A (steady state only).
    pub b_idle: Option<Percentiles>,
    /// The most B's p99 may be, in milliseconds.
    pub target_ms: f64,
    pub met: bool,
    /// The worker's deferrals counted while B was measured (A's envelopes coming back and being
    /// deferred again, in the steady state).
    pub deferrals_in_b_window: u64,
    /// B's deliveries made from the retry lane: B's envelopes that went through a tier (deferred
    /// or retried) before they were delivered.
    pub b_via_retry_lane: u64,
    /// A's requests the endpoint saw during the scenario.
    pub a_requests: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct NoisyReport {
    pub machine: String,
    pub broker: String,
    pub queue_type: String,
    pub settings: String,
    pub rows: Vec<NoisyRow>,
}

impl NoisyReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "hookrelay bench, noisy neighbour ({}; {}, {} queues)\nworker: {}\n\n",
            self.machine, self.broker, self.queue_type, self.settings
        );
        out.push_str(
            "scenario  B shard  A mode  A backlog  floor s  B p50 ms  B p99 ms  B idle p99 ms  target ms  met  \
             (B n, B via retry lane, deferrals in B's window, A requests)\n",
        );
        for r in &self.rows {
            out.push_str(&format!(
                "{:<8}  {:<7}  {:<6}  {:>9}  {:>7}  {:>8.1}  {:>8.1}  {:>13}  {:>9.1}  {:<3}  ({}, {}, {}, {})\n",
                r.scenario,
                r.b_shard,
                r.a_mode,
                r.a_backlog,
                r.floor_seconds
                    .map_or_else(|| "-".to_owned(), |s| format!("{s:.2}")),
                r.b.p50_ms,
                r.b.p99_ms,
                r.b_idle
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |p| format!("{:.1}", p.p99_ms)),
                r.target_ms,
                if r.met { "yes" } else { "no" },
                r.b.count,
                r.b_via_retry_lane,
                r.deferrals_in_b_window,
                r.a_requests,
            ));
        }
        out
    }
}

/// How long B's last event may take to arrive: behind A's backlog of up to 200,000.
const B_TIMEOUT: Duration = Duration::from_secs(900);

/// Runs each scenario asked for, one after the other, each on its own ladder and worker.
pub async fn run(
    config: &Config,
    options: &NoisyOptions,
    binaries: &Binaries,
) -> Result<NoisyReport, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-noisy-{run_id}");
    let BenchSession {
        conn,
        channel,
        publisher,
        broker,
    } = BenchSession::open(config, &prefix).await?;
    let (first_prefetch, retry_prefetch) = config.worker.split(config.worker.in_flight);
    let mut report = NoisyReport {
        machine: machine(),
        broker: format!("RabbitMQ {broker}"),
        queue_type: options.queue_type.as_str().into(),
        settings: format!(
            "configuration as loaded: worker.in_flight {} (first-attempt lane prefetch {first_prefetch}, \
             retry lane {retry_prefetch}), endpoints.max_concurrent {}, \
             endpoints.max_concurrent_per_host {}, endpoints.lane_share {} (an endpoint's \
             attempts hold at most {} of a shard's or lane's first-attempt prefetch), \
             endpoints.breaker_failures {} over endpoints.breaker_window {}, \
             endpoints.breaker_cooldown {}, http.request_timeout {}; set for the bench: \
             egress.allow 127.0.0.0/8, metrics.listen on loopback, log.level error; ladder: the \
             tiers, schedule and deferral queues of topology/ladder.toml under {prefix}-<n>; the \
             floor's raw loop at prefetch {first_prefetch}",
            config.worker.in_flight,
            config.endpoints.max_concurrent,
            config.endpoints.max_concurrent_per_host,
            config.endpoints.lane_share,
            hookrelay::delivery::worker::endpoint_most(
                if options.shards > 1 {
                    hookrelay::delivery::worker::shard_prefetch(first_prefetch, options.shards)
                } else {
                    first_prefetch
                },
                config.endpoints.lane_share
            ),
            config.endpoints.breaker_failures,
            hookrelay::units::fmt_duration(config.endpoints.breaker_window),
            hookrelay::units::fmt_duration(config.endpoints.breaker_cooldown),
            hookrelay::units::fmt_duration(config.http.request_timeout),
        ),
        rows: Vec::new(),
    };
    if options.shards > 1 && options.scenarios.iter().any(|s| s.steady()) {
        return Err(BenchError::Other(
            "--noisy-shards runs the onset scenarios only".into(),
        ));
    }
    let placements: &[Placement] = if options.shards > 1 {
        &[Placement::OtherShard, Placement::SameShard]
    } else {
        &[Placement::Unsharded]
    };
    let runs: Vec<(Scenario, Placement)> = options
        .scenarios
        .iter()
        .flat_map(|&s| placements.iter().map(move |&p| (s, p)))
        .collect();
    let mut result = Ok(());
    for (i, &(scenario, placement)) in runs.iter().enumerate() {
        let ladder = match default_ladder(&format!("{prefix}-{i}"), options.queue_type)
            .and_then(|l| l.with_shards(options.shards).map_err(BenchError::from))
        {
            Ok(l) => l,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        if let Err(e) = ladder.objects().apply(&channel).await {
            result = Err(e.into());
            break;
        }
        say(&format!(
            "noisy neighbour {} (A {}): {} of A's events, ladder {}",
            scenario.name(),
            scenario.mode(),
            options.backlog,
            ladder.prefix
        ));
        let outcome = run_scenario(
            config,
            options,
            binaries,
            scenario,
            placement,
            &ladder,
            &publisher,
            &channel,
            first_prefetch,
        )
        .await;
        let _ = ladder.objects().delete(&channel).await;
        for queue in floor_queues(&ladder.prefix) {
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        match outcome {
            Ok(row) => {
                say(&format!(
                    "{} {} (B's shard: {}): B p50 {:.1} ms, p99 {:.1} ms, target {:.1} ms: {}",
                    row.scenario,
                    row.a_mode,
                    row.b_shard,
                    row.b.p50_ms,
                    row.b.p99_ms,
                    row.target_ms,
                    if row.met { "met" } else { "not met" }
                ));
                report.rows.push(row);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    publisher.close().await;
    let _ = conn.close(200, "bench done".into()).await;
    result?;
    Ok(report)
}

/// `topology/ladder.toml` (tiers, schedule, deferral queues) under `prefix`.
fn default_ladder(prefix: &str, queue_type: QueueType) -> Result<Ladder, BenchError> {
    let shipped = Ladder::parse(include_str!("../../../topology/ladder.toml"))?;
    Ok(Ladder {
        prefix: prefix.to_owned(),
        queue_type,
        ..shipped
    })
}

/// Where tenant B's events go relative to A's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    Unsharded,
    /// Another shard than A's: nothing of A's sits in B's FIFO.
    OtherShard,
    /// A's shard: B waits behind A's backlog, as unsharded.
    SameShard,
}

impl Placement {
    fn label(self) -> &'static str {
        match self {
            Placement::Unsharded => "-",
            Placement::OtherShard => "other",
            Placement::SameShard => "same",
        }
    }
}

/// Tenant B's name for `placement`: the first candidate whose events the consistent hash puts
/// in (or out of) tenant A's shard, found by publishing a probe per candidate into the ladder
/// (nothing consumes it yet) and reading each shard's first lane back empty.
async fn b_tenant(
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    ladder: &Ladder,
    placement: Placement,
) -> Result<String, BenchError> {
    if placement == Placement::Unsharded {
        return Ok("tenant_b".into());
    }
    let candidates: Vec<String> = std::iter::once("tenant_a".to_owned())
        .chain((0..64).map(|i| format!("tenant_b{i}")))
        .collect();
    let ingress = ladder.ingress();
    publish_many(publisher, candidates.len(), |i| {
        to_ingress(
            &ingress,
            NewEvent {
                id: format!("probe_{i}"),
                tenant: candidates[i].clone(),
                event_type: "bench.probe".into(),
                subscription: Some("probe".into()),
                timestamp: None,
                body: body(i),
            },
        )
    })
    .await?;
    let mut shard_of = std::collections::HashMap::new();
    for shard in 0..ladder.shards {
        let lane = ladder.first_shard(shard);
        while let Some(m) = channel
            .basic_get(
                lane.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await?
        {
            shard_of.insert(m.delivery.routing_key.to_string(), shard);
        }
    }
    let a = shard_of
        .get("tenant_a")
        .copied()
        .ok_or_else(|| BenchError::Other("tenant A's probe landed in no shard".into()))?;
    candidates[1..]
        .iter()
        .find(|c| {
            shard_of
                .get(c.as_str())
                .is_some_and(|&s| (s == a) == (placement == Placement::SameShard))
        })
        .cloned()
        .ok_or_else(|| {
            BenchError::Other(format!(
                "no candidate tenant in the {} shard",
                placement.label()
            ))
        })
}

fn floor_queues(prefix: &str) -> [String; 2] {
    [format!("{prefix}.floor"), format!("{prefix}.floor-out")]
}

#[allow(clippy::too_many_arguments)]
async fn run_scenario(
    config: &Config,
    options: &NoisyOptions,
    binaries: &Binaries,
    scenario: Scenario,
    placement: Placement,
    ladder: &Ladder,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    first_prefetch: u16,
) -> Result<NoisyRow, BenchError> {
    let n = options.backlog;
    let b_tenant = b_tenant(publisher, channel, ladder, placement).await?;
    // B in another shard is measured against itself, as in the steady state: its idle latency.
    let against_idle = scenario.steady() || placement == Placement::OtherShard;
    let floor_seconds = if against_idle {
        None
    } else {
        Some(
            floor(
                binaries,
                publisher,
                channel,
                &ladder.prefix,
                n,
                first_prefetch,
                options.queue_type,
            )
            .await?,
        )
    };

    // A on 127.0.0.1, B on 127.0.0.2: two hosts as the worker's caps and breakers see them.
    let a_sink = Sink::new(Some(if scenario.hangs() {
        Duration::from_secs(24 * 3600)
    } else {
        Duration::ZERO
    }));
    let a_addr = start_sink_on(Ipv4Addr::LOCALHOST, Arc::clone(&a_sink)).await?;
    let b_sink = Sink::new(None);
    let b_addr = start_sink_on(Ipv4Addr::new(127, 0, 0, 2), Arc::clone(&b_sink)).await?;
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let subscriptions = subscription_toml("noisy_a", "tenant_a", a_addr, &secret_file)
        + &subscription_toml("noisy_b", &b_tenant, b_addr, &secret_file);
    let ingress = ladder.ingress();
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let event = |tenant: &str, subscription: &str, id: String, i: usize| {
        to_ingress(
            &ingress,
            NewEvent {
                id,
                tenant: tenant.into(),
                event_type: "bench.event".into(),
                subscription: Some(subscription.into()),
                timestamp: None,
                body: body(i),
            },
        )
    };
    let a_event =
        |kind: &str, i: usize| event("tenant_a", "noisy_a", format!("a_{kind}_{tag}_{i}"), i);
    let b_event =
        |kind: &str, i: usize| event(&b_tenant, "noisy_b", format!("b_{kind}_{tag}_{i}"), i);

    let mut worker =
        start_worker(&binaries.worker, config, ladder, None, &subscriptions, &[]).await?;
    let metrics = format!("http://127.0.0.1:{}/metrics", worker.metrics_port);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let outcome = async {
        // The worker is up and B's path warm before anything is measured.
        b_sink.reset();
        publish_many(publisher, 20, |i| b_event("warm", i)).await?;
        super::wait_count(&b_sink, 20, Duration::from_secs(60)).await?;

        let mut b_idle = None;
        if against_idle {
            say("B alone");
            b_idle = Some(
                timed_deliveries(
                    publisher,
                    &b_sink,
                    options.steady_b_events,
                    options.steady_b_rate,
                    B_TIMEOUT,
                    |i| b_event("idle", i),
                )
                .await?,
            );
        }
        if scenario.steady() {
            say("steady: opening A's breaker");
            let failures = config.endpoints.breaker_failures as usize;
            publish_many(publisher, failures, |i| a_event("warm", i)).await?;
            let mut polls = 0;
            let opened = wait_until(Duration::from_secs(120), async || {
                if deferrals(&client, &metrics, Some("breaker_open")).await > 0 {
                    return true;
                }
                // One more every half second once the first ones arrived, to find the breaker
                // open.
                polls += 1;
                if a_sink.count.load(Ordering::SeqCst) >= failures as u64 && polls % 10 == 0 {
                    let _ = publish_many(publisher, 1, |_| a_event("probe", polls)).await;
                }
                false
            })
            .await;
            if !opened {
                return Err(BenchError::Other(
                    "A's breaker did not open within 120s".into(),
                ));
            }
        }

        say(&format!("publishing {n} of A's events at once"));
        publish_many(publisher, n, |i| a_event("backlog", i)).await?;
        let (b_events, b_rate) = if scenario.steady() {
            // Until A's backlog has left the first-attempt lane: the steady state begins.
            let lane = ladder.first_lane();
            let deadline = Instant::now() + Duration::from_secs(600);
            while hookrelay::ops::mover::depth(channel, &lane).await? > 0 {
                if Instant::now() > deadline {
                    return Err(BenchError::Other(format!(
                        "A's backlog did not leave {lane} within 600s"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            say("steady: A's backlog is out of the first-attempt lane; B at its pace");
            (options.steady_b_events, options.steady_b_rate)
        } else {
            (options.onset_b_events, options.onset_b_rate)
        };
        let before = deferrals(&client, &metrics, None).await;
        let b = timed_deliveries(publisher, &b_sink, b_events, b_rate, B_TIMEOUT, |i| {
            b_event("measured", i)
        })
        .await?;
        let deferrals_in_b_window = deferrals(&client, &metrics, None)
            .await
            .saturating_sub(before);
        // Only B's deliveries succeed: any from a retry lane went through a tier first.
        let retry_lanes: Vec<String> = if ladder.shards > 1 {
            (0..ladder.shards).map(|i| ladder.retry_shard(i)).collect()
        } else {
            vec![ladder.retry_lane()]
        };
        let mut b_via_retry_lane = 0;
        for lane in retry_lanes {
            b_via_retry_lane += counter(
                &client,
                &metrics,
                "hookrelay_outcomes_total",
                &[
                    format!("lane=\"{lane}\""),
                    "outcome=\"delivered\"".to_owned(),
                ],
            )
            .await;
        }
        Ok((b, b_idle, deferrals_in_b_window, b_via_retry_lane))
    }
    .await;
    let _ = worker.child.kill().await;
    let (b, b_idle, deferrals_in_b_window, b_via_retry_lane) = outcome?;
    let target_ms = match (&floor_seconds, &b_idle) {
        (Some(floor), _) => floor * 1000.0 + 1000.0,
        (None, Some(idle)) => 2.0 * idle.p99_ms + 50.0,
        (None, None) => 0.0,
    };
    Ok(NoisyRow {
        scenario: scenario.name().into(),
        b_shard: placement.label().into(),
        a_mode: scenario.mode().into(),
        a_backlog: n,
        floor_seconds,
        met: b.p99_ms <= target_ms,
        b,
        b_idle,
        target_ms,
        deferrals_in_b_window,
        b_via_retry_lane,
        a_requests: a_sink.count.load(Ordering::SeqCst),
    })
}

fn subscription_toml(
    id: &str,
    tenant: &str,
    addr: std::net::SocketAddr,
    secret: &std::path::Path,
) -> String {
    // `subscription_entry` is tenant "bench"'s; these name their own tenants.
    subscription_entry(id, &format!("http://{addr}/hook"), secret).replacen(
        "tenant = \"bench\"",
        &format!("tenant = \"{tenant}\""),
        1,
    )
}

/// The floor: a raw loop (its own process) moving `n` persistent messages from one queue to
/// another (consume with `prefetch`, publish with a confirm, ack), from its first delivery until
/// the last message is in the second queue.
async fn floor(
    binaries: &Binaries,
    publisher: &Arc<Publisher>,
    channel: &lapin::Channel,
    prefix: &str,
    n: usize,
    prefetch: u16,
    queue_type: QueueType,
) -> Result<f64, BenchError> {
    let [from, to] = floor_queues(prefix);
    declare_raw_queue(channel, &from, queue_type).await?;
    declare_raw_queue(channel, &to, queue_type).await?;
    say(&format!("floor: publishing {n} messages for the raw loop"));
    publish_many(publisher, n, |i| {
        (
            String::new(),
            from.clone(),
            body(i),
            BasicProperties::default().with_delivery_mode(2),
        )
    })
    .await?;
    let mut child = raw_loop_command(binaries, &from, prefetch, None, Some(&to))
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Other("the raw loop has no stdout".into()))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    let start = Instant::now();
    if !matches!(first, Ok(Ok(Some(_)))) {
        let _ = child.kill().await;
        return Err(BenchError::Other(
            "the raw loop saw no delivery within 60s".into(),
        ));
    }
    let deadline = start + Duration::from_secs(600);
    let result = loop {
        match hookrelay::ops::mover::depth(channel, &to).await {
            Ok(depth) if depth as usize >= n => break Ok(start.elapsed().as_secs_f64()),
            Ok(depth) if Instant::now() > deadline => {
                break Err(BenchError::Other(format!(
                    "the raw loop moved only {depth} of {n} within 600s"
                )));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => break Err(e.into()),
        }
    };
    let _ = child.kill().await;
    if let Ok(seconds) = &result {
        say(&format!(
            "floor: {n} moved in {seconds:.2}s ({:.0}/s)",
            n as f64 / seconds.max(1e-9)
        ));
    }
    result
}

/// The worker's `hookrelay_deferrals_total`, for one reason or all; 0 when unreadable.
pub(super) async fn deferrals(client: &reqwest::Client, url: &str, reason: Option<&str>) -> u64 {
    let label = reason.map(|r| format!("reason=\"{r}\""));
    counter(client, url, "hookrelay_deferrals_total", label.as_slice()).await
}

/// The sum of a counter of the worker's over the series whose labels include each of
/// `labels` (`name="value"`); 0 when unreadable.
async fn counter(client: &reqwest::Client, url: &str, name: &str, labels: &[String]) -> u64 {
    let Ok(response) = client.get(url).send().await else {
        return 0;
    };
    let Ok(text) = response.text().await else {
        return 0;
    };
    let series = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&series))
        .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
