//! `hookrelay-dev`: the demo and the benchmark. Not part of what ships; README's `make demo`
//! runs the demo.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use hookrelay::config::{Config, ProcessEnv};
use hookrelay::contract::ladder::QueueType;
use hookrelay_tools::{bench, demo};

// The ceiling loop runs in this binary; it gets the allocator the worker has, so the comparison
// measures the code, not the allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "hookrelay-dev",
    version,
    about = "hookrelay's demo and benchmark, on the broker hookrelay's configuration names",
    after_help = "Configuration is hookrelay's: --config or HOOKRELAY_CONFIG, then HOOKRELAY_* variables."
)]
struct Cli {
    /// Configuration file (TOML). Defaults apply when absent.
    #[arg(long, global = true, env = "HOOKRELAY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole path end to end on the configured broker and print a summary table.
    ///
    /// Applies a ladder with 1s/2s/4s tiers under its own prefix, starts an endpoint on loopback
    /// that verifies signatures and fails some deliveries on purpose, runs a worker, publishes
    /// the events, shows progress, prints the outcome table, and removes its objects.
    Demo(DemoArgs),
    /// Measure throughput against a raw lapin loop on the same broker, latency, peak memory,
    /// promotion precision and isolation, in one run. Takes a few minutes.
    ///
    /// Publishes --events persistent messages for each consumer beforehand; counts deliveries
    /// per second at a local sink from the first delivery to the last. The worker runs as its own
    /// process (`hookrelay worker`, found beside this binary unless --worker-bin says otherwise),
    /// with signing, lookups, egress checks and metrics on.
    Bench(Box<BenchArgs>),
    /// Measure what tracing costs one delivery, apart from the rest of the worker.
    ///
    /// Builds a delivery's three spans (process, POST, settle, with a delivery's attributes)
    /// --rate times a second through hookrelay's tracer, queue and export thread, and counts
    /// the CPU of the building thread and the export thread per delivery: traces off, the
    /// collector gone (a closed port), and a collector answering (an OTLP/HTTP sink on loopback
    /// whose own CPU is not counted). Needs no broker.
    SpanCost {
        /// Deliveries per mode.
        #[arg(long, default_value_t = 100_000)]
        deliveries: u64,
        /// Deliveries per second, as a worker under load makes them.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The bench's ceiling loop (started by `hookrelay-dev bench`).
    #[command(hide = true)]
    BenchCeiling {
        /// The queue(s) to consume, comma-separated: one consumer each, `--prefetch` each.
        #[arg(long, value_delimiter = ',', required = true)]
        queue: Vec<String>,
        #[arg(long)]
        prefetch: u16,
        /// POST each body here first; without it, no request (the noisy-neighbour floor).
        #[arg(long)]
        url: Option<String>,
        /// Publish each message to this queue, confirmed, before the ack (the failure path).
        #[arg(long)]
        forward: Option<String>,
        /// Instead, publish each message as hookrelay publishes a retry (its headers,
        /// `mandatory`) into this exchange, confirmed, before the ack.
        #[arg(long, conflicts_with = "forward")]
        retry_exchange: Option<String>,
    },
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// How many events to publish.
    #[arg(long, default_value_t = 1000)]
    events: usize,
    /// Keep the demo's queues and exchanges afterwards, to look at them in the management UI.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Messages per throughput run [default: 50000; 20000 with --store].
    #[arg(long)]
    events: Option<usize>,
    /// Prefetch of the ceiling loop and of the worker's first-attempt lane.
    #[arg(long, default_value_t = 500)]
    prefetch: u16,
    /// Use classic queues instead of quorum queues.
    #[arg(long)]
    classic: bool,
    /// Retries due for the slow endpoint in the isolation run.
    #[arg(long, default_value_t = 50_000)]
    backlog: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Messages per second published into the 1s tier for promotion precision.
    #[arg(long, default_value_t = 5_000)]
    precision_rate: u32,
    /// Bind a queue to the attempt log during the runs (as when an operator keeps history).
    #[arg(long)]
    keep_attempt_log: bool,
    /// Ladders without their streams (archive and attempt log) in the throughput and
    /// failure-path runs: hookrelay then publishes no more per delivery than the raw loops.
    #[arg(long, conflicts_with = "keep_attempt_log")]
    streams_off: bool,
    /// Ladders without the archive alone: with --no-attempt-log, each stream's share.
    #[arg(long)]
    no_archive: bool,
    /// Ladders without the attempt log alone.
    #[arg(long)]
    no_attempt_log: bool,
    /// `hookrelay history` beside the worker in the success path (--throughput-only), into a
    /// database of its own: its cost shows in the ratio, its lag after the last delivery below.
    #[arg(long)]
    with_history: bool,
    /// Measure throughput only (skips latency, promotion precision and isolation). The endpoint
    /// caps are lifted, as in the failure path: with the sink's cap of 64, a few percent of the
    /// backlog would wait out a tier and the run would measure that wait. The report counts the
    /// worker's deferrals.
    #[arg(long)]
    throughput_only: bool,
    /// Also measure the failure path: every attempt answered 503, the breaker out of reach,
    /// envelopes into their retry tier against a raw loop that POSTs and publishes each message
    /// on, confirmed: once bare, once publishing each envelope as hookrelay publishes a retry.
    #[arg(long)]
    failure_path: bool,
    /// The success path with a realistic payload (a dozen fields, a nested object, enums,
    /// patterns) whose type the catalog lists with a schema in this mode: compare `enforce`
    /// (every event validated) with `off`.
    #[arg(long, value_name = "MODE")]
    schema: Option<hookrelay::catalog::ValidationMode>,
    /// Run only these noisy-neighbour scenarios (comma-separated or repeated): tenant A's
    /// endpoint hangs or answers 503 while its backlog goes through the shared lanes, and
    /// tenant B's publish-to-delivery latency is measured against the floor (the time a raw loop
    /// needs to move A's backlog: consume, confirmed publish, ack) or against B alone. The
    /// throughput, latency, precision and isolation runs are skipped.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "SCENARIO")]
    noisy: Vec<bench::noisy::Scenario>,
    /// Shards of the shared lanes in the noisy-neighbour onset scenarios: each runs with B in
    /// another shard than A (target: B's p99 at most 2x its idle p99 + 50 ms) and in A's shard
    /// (target: the floor + 1 s).
    #[arg(long, default_value_t = 1, value_name = "N")]
    noisy_shards: u16,
    /// Tenant A's backlog in the noisy-neighbour scenarios.
    #[arg(long, default_value_t = 20_000)]
    noisy_backlog: usize,
    /// Sharded throughput: for each of these shard counts (comma-separated), and each --workers
    /// count, a raw ceiling over as many queues and hookrelay on a ladder with that many shards.
    /// The main run is skipped.
    #[arg(long, value_delimiter = ',', value_name = "N")]
    shards: Vec<u16>,
    /// Worker processes on the one ladder, for --shards (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "N", default_value = "1")]
    workers: Vec<u16>,
    /// Run --shards (or --fleet-cap) on a three-node RabbitMQ cluster of the bench's own,
    /// started beside the configured broker on free ports and stopped after (about a minute
    /// each way): consumers connect to the nodes in turn, lane leaders are spread `balanced`.
    #[arg(long)]
    cluster: bool,
    /// Tenants the events of --shards and --fleet-cap are spread over.
    #[arg(long, default_value_t = 64)]
    tenants: usize,
    /// The subscription store at scale: for each of these subscription counts (comma-separated;
    /// `--store` alone means 10,100000), in a PostgreSQL database of the bench's own on
    /// HOOKRELAY_TEST_DATABASE_URL (default: the local server), the worker's start-up time
    /// (spawn to /readyz 200) and memory on the store, delivery throughput of --events events
    /// spread over all the subscriptions (against the smallest count: the lookup cost), and the
    /// time from an UPDATE's commit to a follower's snapshot, idle and under load. The main run
    /// is skipped.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "10,100000"
    )]
    store: Option<Vec<usize>>,
    /// A storm of N changes to one subscription in a store of the bench's own (three sealed
    /// header secrets, each change sealing them anew and moving its path, cap and rate) while a
    /// worker follows it: the worker's memory before, after, and after the store's full read.
    /// `--soak` alone means 4000. The main run is skipped.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "4000")]
    soak: Option<usize>,
    /// Size of each header secret of --soak, in KiB.
    #[arg(long, default_value_t = 15, value_name = "KIB")]
    soak_header_kb: usize,
    /// URL changes timed per subscription count for --store, idle and again under load.
    #[arg(long, default_value_t = 200)]
    changes: usize,
    /// Delivery throughput with the ladder's streams off and on in turn, --repeat pairs: the
    /// cost of the archive and the attempt log.
    #[arg(long)]
    streams: bool,
    /// History at scale: materialization rate into PostgreSQL, its lag under a steady load,
    /// and `trace` / `GET /v1/events/{id}` over --history-rows attempt rows. In a database of
    /// its own on HOOKRELAY_TEST_DATABASE_URL (else the local server), dropped after.
    #[arg(long)]
    history: bool,
    /// The portal's and console's pages over a full store: --page-subscriptions subscriptions
    /// and --page-attempts attempt rows, each page fetched --page-requests times. In a database
    /// of its own, dropped after; no broker needed.
    #[arg(long)]
    pages: bool,
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    page_subscriptions: u64,
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    page_attempts: u64,
    #[arg(long, default_value_t = 20, value_name = "N")]
    page_requests: usize,
    /// Attempt records materialized from a full stream for --history.
    #[arg(long, default_value_t = 200_000, value_name = "N")]
    history_records: usize,
    /// Records per second of the steady load for --history's lag.
    #[arg(long, default_value_t = 2_000, value_name = "N")]
    history_rate: u32,
    /// Seconds of that steady load.
    #[arg(long, default_value_t = 20, value_name = "S")]
    history_seconds: u64,
    /// Attempt rows in the database for --history's trace figures.
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    history_rows: u64,
    /// Stories read for those figures.
    #[arg(long, default_value_t = 1_000, value_name = "N")]
    history_lookups: usize,
    /// Replay: N events of one tenant published through the ingress (no worker), then replayed
    /// from the archive, a dry run and a real one, unpaced, each timed.
    #[arg(long, value_name = "N")]
    replay: Option<usize>,
    /// Replay against other tenants: a worker delivers tenant A's --replay events (default
    /// 100000), then tenant B's latency is measured alone, while A's events are replayed at
    /// --replay-rate, and while they are replayed unpaced.
    #[arg(long)]
    replay_isolation: bool,
    /// The paced replay's rate for --replay-isolation, per second.
    #[arg(long, default_value_t = 2_000, value_name = "N")]
    replay_rate: u32,
    /// AMQP destinations: deliveries per second into a partner's RabbitMQ (a node of the
    /// bench's own, started on free ports) against a raw lapin loop publishing the same bodies
    /// with confirms to the same node, --repeat pairs. The main run is skipped.
    #[arg(long)]
    amqp_destination: bool,
    /// Runs of each combination (--shards, --fleet-cap, --store, --streams, --replay,
    /// --amqp-destination).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Fleet-wide cap: two worker processes, one subscription with max_concurrent = --cap,
    /// the most requests at once counted at the endpoint. The main run is skipped.
    #[arg(long)]
    fleet_cap: bool,
    /// The subscription's max_concurrent for --fleet-cap.
    #[arg(long, default_value_t = 10)]
    cap: u32,
    /// Events for --fleet-cap.
    #[arg(long, default_value_t = 2_000)]
    cap_events: usize,
    /// How long the --fleet-cap endpoint takes to answer, in milliseconds.
    #[arg(long, default_value_t = 20)]
    cap_delay_ms: u64,
    /// The hookrelay binary the worker runs from; by default the one beside this binary.
    #[arg(long, value_name = "FILE")]
    worker_bin: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref(), &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The demo and the bench draw progress and tables; the worker's log lines would bury them.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        Command::Demo(args) => {
            let options = demo::DemoOptions {
                events: args.events,
                keep: args.keep,
                deadline: Duration::from_secs(90),
            };
            let report = demo::run(&config, &options).await?;
            println!("\nhookrelay demo: {}\n{}", report.prefix, report.table());
            if report.unfinished > 0 || report.unverified > 0 {
                bail!(
                    "{} events did not finish and {} requests failed verification",
                    report.unfinished,
                    report.unverified
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => {
            let options = bench::BenchOptions {
                events: args.events.unwrap_or(50_000),
                prefetch: args.prefetch,
                queue_type: if args.classic {
                    QueueType::Classic
                } else {
                    QueueType::Quorum
                },
                isolation_backlog: args.backlog,
                throughput_only: args.throughput_only,
                precision_rate: args.precision_rate,
                keep_attempt_log: args.keep_attempt_log,
                streams_off: args.streams_off,
                archive_off: args.no_archive,
                attempt_log_off: args.no_attempt_log,
                with_history: args.with_history,
                failure_path: args.failure_path,
                schema: args.schema,
                ..Default::default()
            };
            // The pages run in this process: no worker binary needed.
            if args.pages {
                let options = bench::pages::PagesOptions {
                    subscriptions: args.page_subscriptions,
                    attempts: args.page_attempts,
                    requests: args.page_requests.max(1),
                };
                let report = bench::pages::run(&options).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            let exe = std::env::current_exe().context("cannot find the hookrelay-dev binary")?;
            let worker = match args.worker_bin {
                Some(path) => path,
                None => exe.with_file_name("hookrelay"),
            };
            if !worker.is_file() {
                bail!(
                    "no hookrelay binary at {}: build it (`cargo build --release --workspace`) or \
                     name it with --worker-bin",
                    worker.display()
                );
            }
            let binaries = bench::Binaries {
                ceiling: exe,
                worker,
            };
            if !args.shards.is_empty() || args.fleet_cap {
                let options = bench::shards::ShardOptions {
                    shards: if args.shards.is_empty() {
                        vec![1]
                    } else {
                        args.shards
                    },
                    workers: args.workers,
                    events: options.events,
                    prefetch: options.prefetch,
                    tenants: args.tenants,
                    repeat: args.repeat.max(1),
                    queue_type: options.queue_type,
                    fleet_cap: args.fleet_cap,
                    cap: args.cap,
                    cap_events: args.cap_events,
                    cap_delay: Duration::from_millis(args.cap_delay_ms),
                    cluster: args.cluster,
                };
                let report = bench::shards::run(&config, &options, &binaries).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            if args.amqp_destination {
                let pairs =
                    bench::amqp::run(&config, &options, &binaries, args.repeat.max(1)).await?;
                if args.json {
                    println!("{}", serde_json::json!({ "pairs": pairs }));
                } else {
                    println!(
                        "AMQP destination against a raw confirmed publish loop ({} events per \
                         run, {} in flight, {})",
                        options.events,
                        bench::amqp::IN_FLIGHT,
                        bench::machine()
                    );
                    for (i, p) in pairs.iter().enumerate() {
                        println!(
                            "run {}: raw {:.0}/s, hookrelay {:.0}/s, ratio {:.2}",
                            i + 1,
                            p.raw,
                            p.hookrelay,
                            p.ratio
                        );
                    }
                    let (min, median, max) =
                        hookrelay_tools::kit::spread(pairs.iter().map(|p| p.ratio).collect());
                    println!("ratio hookrelay/raw: min {min:.2}, median {median:.2}, max {max:.2}");
                }
                return Ok(ExitCode::SUCCESS);
            }
            if args.streams {
                let pairs =
                    bench::streams_ratio(&config, &options, &binaries, args.repeat.max(1)).await?;
                let ratios: Vec<f64> = pairs.iter().map(|(off, on)| on / off.max(1e-9)).collect();
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({ "pairs": pairs, "ratios": ratios })
                    );
                } else {
                    println!(
                        "Streams off against on ({} events per run, {})",
                        options.events,
                        bench::machine()
                    );
                    for (i, ((off, on), ratio)) in pairs.iter().zip(&ratios).enumerate() {
                        println!(
                            "run {}: off {off:.0}/s, on {on:.0}/s, ratio {ratio:.2}",
                            i + 1
                        );
                    }
                    let (min, median, max) = hookrelay_tools::kit::spread(ratios);
                    println!("ratio on/off: min {min:.2}, median {median:.2}, max {max:.2}");
                }
                return Ok(ExitCode::SUCCESS);
            }
            if args.replay_isolation {
                let report = bench::history::replay_isolation(
                    &config,
                    &binaries,
                    args.replay.unwrap_or(100_000),
                    args.replay_rate,
                    options.prefetch,
                    options.queue_type,
                )
                .await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(events) = args.replay {
                let mut runs = Vec::new();
                for _ in 0..args.repeat.max(1) {
                    runs.push(bench::history::replay(&config, events, options.queue_type).await?);
                }
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&runs)?);
                } else {
                    println!("Replay of {events} archived events ({})", bench::machine());
                    for (i, r) in runs.iter().enumerate() {
                        println!(
                            "run {}: dry run {:.1} s ({:.0} events/s read); replay {:.1} s ({:.0} events/s published, {} in all)",
                            i + 1,
                            r.dry_seconds,
                            r.dry_per_second,
                            r.seconds,
                            r.per_second,
                            r.published
                        );
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            if args.history {
                let options = bench::history::HistoryOptions {
                    records: args.history_records,
                    rate: args.history_rate,
                    seconds: args.history_seconds,
                    rows: args.history_rows,
                    lookups: args.history_lookups,
                    queue_type: options.queue_type,
                };
                let report = bench::history::run(&config, &options).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(changes) = args.soak {
                let options = bench::soak::SoakOptions {
                    changes,
                    header_kb: args.soak_header_kb,
                    queue_type: options.queue_type,
                };
                let report = bench::soak::run(&config, &options, &binaries).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(counts) = args.store {
                let options = bench::store::StoreOptions {
                    counts: if counts.is_empty() {
                        vec![10, 100_000]
                    } else {
                        counts
                    },
                    events: args.events.unwrap_or(20_000),
                    changes: args.changes,
                    prefetch: options.prefetch,
                    repeat: args.repeat.max(1),
                    queue_type: options.queue_type,
                };
                let report = bench::store::run(&config, &options, &binaries).await?;
                if args.json {
                    // The table too, for the pages, from the same run.
                    eprintln!("{}", report.table());
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            if !args.noisy.is_empty() {
                let options = bench::noisy::NoisyOptions {
                    scenarios: args.noisy,
                    backlog: args.noisy_backlog,
                    queue_type: options.queue_type,
                    shards: args.noisy_shards,
                    ..Default::default()
                };
                let report = bench::noisy::run(&config, &options, &binaries).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            let report = bench::run(&config, &options, binaries).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", report.table());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::SpanCost {
            deliveries,
            rate,
            json,
        } => {
            let costs = bench::spans::run(deliveries, rate).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&costs)?);
            } else {
                println!("mode       deliveries  CPU µs/delivery  spans exported  dropped");
                for c in &costs {
                    println!(
                        "{:<10} {:>10}  {:>15.2}  {:>14}  {:>7}",
                        c.mode,
                        c.deliveries,
                        c.cpu_us_per_delivery,
                        c.exported_spans,
                        c.dropped_spans
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchCeiling {
            queue,
            prefetch,
            url,
            forward,
            retry_exchange,
        } => {
            let forward = match (&retry_exchange, &forward) {
                (Some(exchange), _) => Some(bench::Forward::AsRetry(exchange)),
                (None, Some(queue)) => Some(bench::Forward::Bare(queue)),
                (None, None) => None,
            };
            bench::ceiling_loop(&config, &queue, prefetch, url.as_deref(), forward).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_counts(args: &[&str]) -> Option<Vec<usize>> {
        let cli = Cli::try_parse_from(args).unwrap();
        match cli.command {
            Command::Bench(bench) => bench.store,
            _ => panic!("not the bench"),
        }
    }

    #[test]
    fn store_alone_means_10_and_100000_subscriptions() {
        let bench = ["hookrelay-dev", "bench"];
        assert_eq!(store_counts(&bench), None);
        assert_eq!(
            store_counts(&[&bench[..], &["--store"]].concat()),
            Some(vec![10, 100_000])
        );
        assert_eq!(
            store_counts(&[&bench[..], &["--store", "5,50"]].concat()),
            Some(vec![5, 50])
        );
    }
}
