//! Sharded lanes and a fleet of workers (`hookrelay-dev bench --shards 1,2,4 --workers 1,2`,
//! `--fleet-cap`).
//!
//! - **Shards throughput**: for each (shards S, worker processes W), a raw ceiling and then
//!   hookrelay, each on a backlog of `--events` messages published beforehand, counted at the
//!   sink (204 at once) from the first delivery to the last. The ceiling is W raw loop
//!   processes, each consuming the same S quorum queues (events spread evenly over them) with
//!   prefetch `--prefetch / S` per queue, so a raw process has as many deliveries in flight as a
//!   worker's budget and the broker runs as many queues (Raft groups) as the sharded ladder: the
//!   comparison isolates what hookrelay adds, not what sharding adds. hookrelay is W `hookrelay
//!   worker` processes on a ladder with `shards = S`, events spread over `--tenants` tenants
//!   (one subscription each, all to the same sink) so the consistent hash spreads them. CPU of
//!   Endpoint caps are lifted (as in the failure path) so the budget, not the sink's cap of
//!   64, bounds what is in flight. CPU of the broker (beam.smp), the consumers (raw loops or workers) and the bench process (sink and
//!   publisher) is read from `/proc/<pid>/stat` over each measured window, in % of one core.
//! - **On a cluster** (`--cluster`): the same matrix on three RabbitMQ nodes of the bench's own,
//!   started beside the machine's broker on free ports and stopped after. The i-th raw loop and
//!   the i-th worker connect to node i mod 3; the sharded ladder's policy places lane leaders
//!   `balanced`, and the ceiling's queues are declared with `x-queue-leader-locator = balanced`
//!   so both spread alike; broker CPU is the three nodes' together. The run reports on how many
//!   nodes the first-attempt lanes' leaders landed.
//! - **Fleet-wide cap**: two worker processes on one ladder, one subscription with
//!   `max_concurrent = 10` to an endpoint that answers 204 after `--cap-delay-ms`; the endpoint
//!   counts the requests it is answering at once. The workers start first and the run waits
//!   until both consume and each worker's `hookrelay_fleet_workers` (from its management poll,
//!   every 1 s here) says 2; then the events are published at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::AMQPValue;
use serde::Serialize;

use hookrelay::broker::management::Management;
use hookrelay::config::{Config, SecretUrl};
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;

use super::{
    BenchError, BenchSession, Binaries, Sink, WorkerProcess, body, machine, publish_many,
    queue_args, raw_loop_command, say, start_sink, start_worker, to_ingress, uncapped, wait_count,
};
use crate::kit::{file_secret, spread, subscription_toml, wait_until};
use crate::node::{self, Node};

#[derive(Debug, Clone)]
pub struct ShardOptions {
    pub shards: Vec<u16>,
    pub workers: Vec<u16>,
    pub events: usize,
    pub prefetch: u16,
    pub tenants: usize,
    pub repeat: usize,
    pub queue_type: QueueType,
    /// Run the fleet-wide cap scenario instead of the throughput matrix.
    pub fleet_cap: bool,
    pub cap: u32,
    pub cap_events: usize,
    pub cap_delay: Duration,
    /// Run on a three-node cluster of the bench's own instead of the configured broker.
    pub cluster: bool,
}

/// Where the runs happen: the configured broker, or a three-node cluster of the bench's own.
struct Place {
    /// The broker processes whose CPU is counted.
    broker_pids: Vec<u32>,
    /// The cluster's nodes (none: the configured broker); the i-th consumer process connects
    /// to node i mod their number. Stopped when the place is closed.
    cluster: Vec<Node>,
}

impl Place {
    fn local() -> Self {
        Self {
            broker_pids: beam_pid().into_iter().collect(),
            cluster: Vec::new(),
        }
    }

    /// Three nodes joined in a cluster, and `config` pointed at the first.
    async fn cluster(config: &Config) -> Result<(Self, Config), BenchError> {
        say("starting a three-node RabbitMQ cluster on free ports (about a minute)");
        let nodes = tokio::task::spawn_blocking(|| node::cluster("bench"))
            .await
            .map_err(|e| BenchError::Other(e.to_string()))??;
        let mut config = config.clone();
        let url = |s: String| SecretUrl::parse(&s).map_err(|e| BenchError::Other(e.to_string()));
        config.amqp.url = url(nodes[0].amqp_url())?;
        config.management.url = url(nodes[0].mgmt_url())?;
        say(&format!(
            "cluster up: {}",
            nodes
                .iter()
                .map(|n| format!("{} (AMQP {})", n.name, n.amqp_port))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let place = Self {
            broker_pids: nodes.iter().filter_map(Node::pid).collect(),
            cluster: nodes,
        };
        Ok((place, config))
    }

    /// The node the i-th consumer process connects to, as an environment override.
    fn env(&self, i: usize) -> Option<(&'static str, String)> {
        (!self.cluster.is_empty()).then(|| {
            (
                "HOOKRELAY_AMQP_URL",
                self.cluster[i % self.cluster.len()].amqp_url(),
            )
        })
    }

    async fn close(self) {
        if !self.cluster.is_empty() {
            say("stopping the cluster");
            let nodes = self.cluster;
            let _ = tokio::task::spawn_blocking(move || drop(nodes)).await;
        }
    }
}

/// CPU time used over a window, in % of one core.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cpu {
    pub broker: f64,
    pub consumers: f64,
    pub bench: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ShardRun {
    pub shards: u16,
    pub workers: u16,
    pub run: usize,
    pub ceiling_per_s: f64,
    pub hookrelay_per_s: f64,
    pub ratio: f64,
    pub ceiling_cpu: Cpu,
    pub hookrelay_cpu: Cpu,
    /// Nodes leading the ladder's first-attempt lanes.
    pub leader_nodes: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CapRun {
    pub run: usize,
    pub cap: u32,
    pub workers: u16,
    pub deliveries: u64,
    pub per_second: f64,
    pub max_in_flight_at_endpoint: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ShardReport {
    pub machine: String,
    pub broker: String,
    pub events: usize,
    pub prefetch: u16,
    pub tenants: usize,
    pub runs: Vec<ShardRun>,
    pub cap_runs: Vec<CapRun>,
    pub cap_delay_ms: u64,
    /// Nodes the runs were made on (1: the configured broker).
    pub nodes: usize,
}

/// utime + stime of a process, in clock ticks (100 per second on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rfind(')').map(|at| &stat[at + 2..]) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// The broker's process on this machine, if it runs here.
fn beam_pid() -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "beam.smp")
        })
}

struct CpuWindow {
    broker: Vec<u32>,
    consumers: Vec<u32>,
    start: (u64, u64, u64),
    at: Instant,
}

impl CpuWindow {
    fn ticks(broker: &[u32], consumers: &[u32]) -> (u64, u64, u64) {
        (
            broker.iter().map(|&p| cpu_ticks(p)).sum(),
            consumers.iter().map(|&p| cpu_ticks(p)).sum(),
            cpu_ticks(std::process::id()),
        )
    }

    fn start(broker: &[u32], consumers: Vec<u32>) -> Self {
        let broker = broker.to_vec();
        Self {
            start: Self::ticks(&broker, &consumers),
            broker,
            consumers,
            at: Instant::now(),
        }
    }

    fn end(&self) -> Cpu {
        let (b, c, s) = Self::ticks(&self.broker, &self.consumers);
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        let pct = |now: u64, then: u64| now.saturating_sub(then) as f64 / 100.0 / secs * 100.0;
        Cpu {
            broker: pct(b, self.start.0),
            consumers: pct(c, self.start.1),
            bench: pct(s, self.start.2),
        }
    }
}

fn tenant(i: usize, tenants: usize) -> String {
    format!("t{}", i % tenants.max(1))
}

pub async fn run(
    config: &Config,
    options: &ShardOptions,
    binaries: &Binaries,
) -> Result<ShardReport, BenchError> {
    let (place, config) = if options.cluster {
        Place::cluster(config).await?
    } else {
        (Place::local(), config.clone())
    };
    // Interrupted, the nodes of a cluster are stopped all the same (the workers and loops,
    // killed on drop, go with the run).
    let result = tokio::select! {
        result = run_at(&config, options, binaries, &place) => result,
        _ = tokio::signal::ctrl_c(), if !place.cluster.is_empty() => {
            Err(BenchError::Other("interrupted".into()))
        }
    };
    place.close().await;
    result
}

async fn run_at(
    config: &Config,
    options: &ShardOptions,
    binaries: &Binaries,
    place: &Place,
) -> Result<ShardReport, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-{run_id}");
    let session = BenchSession::open(config, &prefix).await?;
    let mut report = ShardReport {
        machine: machine(),
        broker: format!("RabbitMQ {}", session.broker),
        events: options.events,
        prefetch: options.prefetch,
        tenants: options.tenants,
        cap_delay_ms: options.cap_delay.as_millis() as u64,
        nodes: place.cluster.len().max(1),
        ..ShardReport::default()
    };
    let result = if options.fleet_cap {
        fleet_cap(
            config,
            options,
            binaries,
            place,
            &session,
            &prefix,
            &mut report,
        )
        .await
    } else {
        matrix(
            config,
            options,
            binaries,
            place,
            &session,
            &prefix,
            &mut report,
        )
        .await
    };
    session.publisher.close().await;
    let _ = session.conn.close(200, "bench done".into()).await;
    result?;
    Ok(report)
}

async fn matrix(
    config: &Config,
    options: &ShardOptions,
    binaries: &Binaries,
    place: &Place,
    session: &BenchSession,
    prefix: &str,
    report: &mut ShardReport,
) -> Result<(), BenchError> {
    let sink = Sink::new(None);
    let sink_addr = start_sink(Arc::clone(&sink)).await?;
    for run in 1..=options.repeat {
        for &shards in &options.shards {
            for &workers in &options.workers {
                let tag = format!("{prefix}-s{shards}w{workers}r{run}");
                let (ceiling_per_s, ceiling_cpu) = ceiling(
                    options, binaries, place, session, &sink, sink_addr, &tag, shards, workers,
                )
                .await?;
                let ladder =
                    Ladder::build(&tag, options.queue_type, &["1s", "10s"], &["1s", "10s"])?
                        .with_shards(shards)?;
                // Policies first, as `topology apply` sets them: a sharded ladder's places its
                // lanes' leaders, which the broker reads when it creates them.
                let api = management(config)?;
                let objects = ladder.objects();
                objects
                    .apply_policies(&api)
                    .await
                    .map_err(|e| BenchError::Other(e.to_string()))?;
                objects.apply(&session.channel).await?;
                let leader_nodes = leader_nodes(&api, &ladder).await;
                let ours = hookrelay(
                    config, options, binaries, place, session, &ladder, &sink, sink_addr, workers,
                )
                .await;
                let _ = objects.delete(&session.channel).await;
                let _ = objects.delete_policies(&api).await;
                let (hookrelay_per_s, hookrelay_cpu) = ours?;
                let row = ShardRun {
                    shards,
                    workers,
                    run,
                    ceiling_per_s,
                    hookrelay_per_s,
                    ratio: hookrelay_per_s / ceiling_per_s.max(1e-9),
                    ceiling_cpu,
                    hookrelay_cpu,
                    leader_nodes,
                };
                say(&format!(
                    "shards {shards} workers {workers} run {run}: ceiling {:.0}/s, hookrelay \
                     {:.0}/s, ratio {:.2}",
                    row.ceiling_per_s, row.hookrelay_per_s, row.ratio
                ));
                report.runs.push(row);
            }
        }
    }
    Ok(())
}

/// W raw loops over S queues holding the events between them.
#[allow(clippy::too_many_arguments)]
async fn ceiling(
    options: &ShardOptions,
    binaries: &Binaries,
    place: &Place,
    session: &BenchSession,
    sink: &Arc<Sink>,
    sink_addr: std::net::SocketAddr,
    tag: &str,
    shards: u16,
    workers: u16,
) -> Result<(f64, Cpu), BenchError> {
    let queues: Vec<String> = (0..shards).map(|i| format!("{tag}.ceiling-{i}")).collect();
    let mut args = queue_args(options.queue_type);
    if !place.cluster.is_empty() {
        // Spread as the sharded ladder's policy spreads its lanes.
        args.insert(
            "x-queue-leader-locator".into(),
            AMQPValue::LongString("balanced".into()),
        );
    }
    for queue in &queues {
        session
            .channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args.clone(),
            )
            .await?;
    }
    say(&format!(
        "{tag}: {} messages over {shards} raw queue(s)",
        options.events
    ));
    publish_many(&session.publisher, options.events, |i| {
        (
            String::new(),
            queues[i % queues.len()].clone(),
            body(i),
            BasicProperties::default().with_delivery_mode(2),
        )
    })
    .await?;
    sink.reset();
    let per_queue = (options.prefetch / shards).max(1);
    let url = format!("http://{sink_addr}/ceiling");
    let mut children = Vec::new();
    for i in 0..usize::from(workers) {
        let mut command =
            raw_loop_command(binaries, &queues.join(","), per_queue, Some(&url), None);
        command.envs(place.env(i));
        children.push(command.stdout(std::process::Stdio::null()).spawn()?);
    }
    let window = CpuWindow::start(
        &place.broker_pids,
        children.iter().filter_map(|c| c.id()).collect(),
    );
    let waited = wait_count(sink, options.events as u64, Duration::from_secs(600)).await;
    let cpu = window.end();
    for child in &mut children {
        let _ = child.kill().await;
    }
    for queue in &queues {
        let _ = session
            .channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    waited?;
    let (n, secs) = sink.window();
    Ok((n as f64 / secs.max(1e-9), cpu))
}

/// Subscriptions `bench_t<i>` for tenants `t<i>`, all to `url`.
fn subscriptions(tenants: usize, url: &str, secret: &std::path::Path, extra: &str) -> String {
    (0..tenants.max(1))
        .map(|i| {
            subscription_toml(
                &format!("bench_t{i}"),
                &format!("t{i}"),
                url,
                &file_secret(secret),
                extra,
            )
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn start_workers(
    config: &Config,
    binaries: &Binaries,
    place: &Place,
    ladder: &Ladder,
    prefetch: Option<u16>,
    subscriptions: &str,
    env: &[(&str, String)],
    workers: u16,
) -> Result<Vec<WorkerProcess>, BenchError> {
    let mut started = Vec::new();
    for i in 0..usize::from(workers) {
        let mut env = env.to_vec();
        env.extend(place.env(i));
        started.push(
            start_worker(
                &binaries.worker,
                config,
                ladder,
                prefetch,
                subscriptions,
                &env,
            )
            .await?,
        );
    }
    Ok(started)
}

#[allow(clippy::too_many_arguments)]
async fn hookrelay(
    config: &Config,
    options: &ShardOptions,
    binaries: &Binaries,
    place: &Place,
    session: &BenchSession,
    ladder: &Ladder,
    sink: &Arc<Sink>,
    sink_addr: std::net::SocketAddr,
    workers: u16,
) -> Result<(f64, Cpu), BenchError> {
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let subs = subscriptions(
        options.tenants,
        &format!("http://{sink_addr}/hook"),
        &secret_file,
        "",
    );
    let ingress = ladder.ingress();
    say(&format!(
        "{}: {} events over {} tenants through {ingress}",
        ladder.prefix, options.events, options.tenants
    ));
    let tenants = options.tenants;
    publish_many(&session.publisher, options.events, |i| {
        let t = tenant(i, tenants);
        to_ingress(
            &ingress,
            NewEvent {
                id: format!("evt_{i}"),
                subscription: Some(format!("bench_{t}")),
                tenant: t,
                event_type: "bench.event".into(),
                timestamp: None,
                body: body(i),
            },
        )
    })
    .await?;
    sink.reset();
    // No cap in the way (the fleet would otherwise share the one sink's cap of 64).
    let env = uncapped();
    let mut started = start_workers(
        config,
        binaries,
        place,
        ladder,
        Some(options.prefetch),
        &subs,
        &env,
        workers,
    )
    .await?;
    let window = CpuWindow::start(
        &place.broker_pids,
        started.iter().filter_map(|w| w.child.id()).collect(),
    );
    let waited = wait_count(sink, options.events as u64, Duration::from_secs(600)).await;
    let cpu = window.end();
    for worker in &mut started {
        let _ = worker.child.kill().await;
    }
    waited?;
    let (n, secs) = sink.window();
    Ok((n as f64 / secs.max(1e-9), cpu))
}

/// On how many nodes the ladder's first-attempt lanes have their leaders (0: unknown). Each
/// lane is read on its own: a listing of every queue leaves out a new queue's leader until its
/// first statistics.
fn management(config: &Config) -> Result<Management, BenchError> {
    Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    )
    .map_err(|e| BenchError::Other(e.to_string()))
}

async fn leader_nodes(api: &Management, ladder: &Ladder) -> usize {
    let lanes: Vec<String> = if ladder.shards > 1 {
        (0..ladder.shards).map(|i| ladder.first_shard(i)).collect()
    } else {
        vec![ladder.first_lane()]
    };
    let mut leaders = Vec::new();
    for lane in lanes {
        if let Ok(Some(q)) = api.queue(&lane).await {
            leaders.extend(q.leader);
        }
    }
    leaders.sort_unstable();
    leaders.dedup();
    leaders.len()
}

async fn consumers(channel: &lapin::Channel, queue: &str) -> u32 {
    hookrelay::ops::mover::inspect(channel, queue)
        .await
        .map_or(0, |q| q.consumer_count())
}

async fn fleet_cap(
    config: &Config,
    options: &ShardOptions,
    binaries: &Binaries,
    place: &Place,
    session: &BenchSession,
    prefix: &str,
    report: &mut ShardReport,
) -> Result<(), BenchError> {
    let workers = 2;
    let sink = Sink::slow_ok(options.cap_delay);
    let sink_addr = start_sink(Arc::clone(&sink)).await?;
    for run in 1..=options.repeat {
        let ladder = Ladder::build(
            &format!("{prefix}-cap{run}"),
            options.queue_type,
            &["1s", "10s"],
            &["1s", "10s"],
        )?;
        ladder.objects().apply(&session.channel).await?;
        let result = cap_run(
            config, options, binaries, place, session, &ladder, &sink, sink_addr, workers,
        )
        .await;
        let _ = ladder.objects().delete(&session.channel).await;
        let (deliveries, per_second, max) = result?;
        say(&format!(
            "fleet cap run {run}: {deliveries} deliveries at {per_second:.0}/s, at most {max} \
             at once at the endpoint (cap {})",
            options.cap
        ));
        report.cap_runs.push(CapRun {
            run,
            cap: options.cap,
            workers,
            deliveries,
            per_second,
            max_in_flight_at_endpoint: max,
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn cap_run(
    config: &Config,
    options: &ShardOptions,
    binaries: &Binaries,
    place: &Place,
    session: &BenchSession,
    ladder: &Ladder,
    sink: &Arc<Sink>,
    sink_addr: std::net::SocketAddr,
    workers: u16,
) -> Result<(u64, f64, u64), BenchError> {
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let subs = subscriptions(
        1,
        &format!("http://{sink_addr}/hook"),
        &secret_file,
        &format!("max_concurrent = {}", options.cap),
    );
    // The management poll tells each worker how many there are; once a second here. Deferred
    // envelopes (the cap full) come back through the 1 s tier as often as they must: the
    // horizon is pushed past the run so none is dead-lettered for it.
    let env = [
        ("HOOKRELAY_METRICS_POLL_INTERVAL", "1s".to_owned()),
        ("HOOKRELAY_ENDPOINTS_HORIZON", "1h".to_owned()),
    ];
    let mut started = start_workers(
        config,
        binaries,
        place,
        ladder,
        Some(options.prefetch),
        &subs,
        &env,
        workers,
    )
    .await?;
    let lane = ladder.first_lane();
    let both = wait_until(Duration::from_secs(30), async || {
        consumers(&session.channel, &lane).await >= u32::from(workers)
    })
    .await;
    if !both {
        return Err(BenchError::Other(format!(
            "{workers} workers did not all consume {lane} within 30s"
        )));
    }
    // Until each worker's management poll has counted the fleet (`hookrelay_fleet_workers`).
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| BenchError::Other(e.to_string()))?;
    for worker in &started {
        let url = format!("http://127.0.0.1:{}/metrics", worker.metrics_port);
        let mut seen = String::new();
        let counted = wait_until(Duration::from_secs(60), async || {
            let text = match client.get(&url).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => return false,
            };
            seen = text
                .lines()
                .find(|l| l.starts_with("hookrelay_fleet_workers"))
                .unwrap_or("hookrelay_fleet_workers: not exported")
                .to_owned();
            seen.split_whitespace()
                .last()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v >= f64::from(workers))
        })
        .await;
        if !counted {
            return Err(BenchError::Other(format!(
                "a worker did not count {workers} workers within 60s ({seen})"
            )));
        }
    }
    sink.reset();
    let ingress = ladder.ingress();
    publish_many(&session.publisher, options.cap_events, |i| {
        to_ingress(
            &ingress,
            NewEvent {
                id: format!("cap_{i}"),
                subscription: Some("bench_t0".into()),
                tenant: "t0".into(),
                event_type: "bench.event".into(),
                timestamp: None,
                body: body(i),
            },
        )
    })
    .await?;
    let waited = wait_count(sink, options.cap_events as u64, Duration::from_secs(600)).await;
    // The last requests are still being answered when the count is reached.
    tokio::time::sleep(options.cap_delay * 2).await;
    for worker in &mut started {
        let _ = worker.child.kill().await;
    }
    waited?;
    let (n, secs) = sink.window();
    Ok((
        n,
        n as f64 / secs.max(1e-9),
        sink.max_in_flight.load(Ordering::SeqCst),
    ))
}

impl ShardReport {
    pub fn table(&self) -> String {
        let mut out = if self.runs.is_empty() {
            format!(
                "hookrelay bench, fleet ({}; {})\n",
                self.machine, self.broker
            )
        } else {
            format!(
                "hookrelay bench, shards ({}; {}{}, {} events, prefetch {}, {} tenants)\n",
                self.machine,
                self.broker,
                if self.nodes > 1 {
                    format!(", a cluster of {} nodes on this machine", self.nodes)
                } else {
                    String::new()
                },
                self.events,
                self.prefetch,
                self.tenants
            )
        };
        if !self.runs.is_empty() {
            out += "\nshards workers run   ceiling/s  hookrelay/s  ratio  leaders   CPU% ceiling: broker loops bench   CPU% hookrelay: broker workers bench\n";
            for r in &self.runs {
                out += &format!(
                    "{:>6} {:>7} {:>3} {:>11.0} {:>12.0} {:>6.2} {:>8}   {:>20.0} {:>5.0} {:>5.0}   {:>22.0} {:>7.0} {:>5.0}\n",
                    r.shards,
                    r.workers,
                    r.run,
                    r.ceiling_per_s,
                    r.hookrelay_per_s,
                    r.ratio,
                    r.leader_nodes,
                    r.ceiling_cpu.broker,
                    r.ceiling_cpu.consumers,
                    r.ceiling_cpu.bench,
                    r.hookrelay_cpu.broker,
                    r.hookrelay_cpu.consumers,
                    r.hookrelay_cpu.bench,
                );
            }
            out += "\nsummary (min / median / max over runs)\n";
            let mut keys: Vec<(u16, u16)> =
                self.runs.iter().map(|r| (r.shards, r.workers)).collect();
            keys.sort_unstable();
            keys.dedup();
            for (s, w) in keys {
                let pick = |f: &dyn Fn(&ShardRun) -> f64| {
                    spread(
                        self.runs
                            .iter()
                            .filter(|r| r.shards == s && r.workers == w)
                            .map(f)
                            .collect(),
                    )
                };
                let c = pick(&|r| r.ceiling_per_s);
                let h = pick(&|r| r.hookrelay_per_s);
                let q = pick(&|r| r.ratio);
                out += &format!(
                    "shards {s} workers {w}: ceiling {:.0}/{:.0}/{:.0}  hookrelay {:.0}/{:.0}/{:.0}  ratio {:.2}/{:.2}/{:.2}\n",
                    c.0, c.1, c.2, h.0, h.1, h.2, q.0, q.1, q.2
                );
            }
        }
        if !self.cap_runs.is_empty() {
            out += &format!(
                "\nfleet-wide cap (endpoint answers after {} ms)\nrun workers cap  deliveries  deliveries/s  max at once at endpoint\n",
                self.cap_delay_ms
            );
            for r in &self.cap_runs {
                out += &format!(
                    "{:>3} {:>7} {:>3} {:>11} {:>13.0} {:>24}\n",
                    r.run,
                    r.workers,
                    r.cap,
                    r.deliveries,
                    r.per_second,
                    r.max_in_flight_at_endpoint
                );
            }
        }
        out
    }
}
