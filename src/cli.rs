//! The command line: what each subcommand takes, and how it maps onto the library. Errors are
//! `anyhow` here, at the edge; exit codes are documented in `--help`.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use lapin::{Connection, ConnectionProperties};

use crate::config::Config;
use crate::envelope::NewEvent;
use crate::management::Management;
use crate::publish::Publisher;
use crate::subscriptions::{LiveSubscriptions, SecretStore, Subscriptions};
use crate::topology::{Ladder, QueueType};
use crate::worker::{Worker, WorkerSetup, shutdown_signal};

/// Exit code when `topology plan` finds drift.
pub const EXIT_DRIFT: u8 = 3;

const AFTER_HELP: &str = "\
Configuration: a TOML file (--config or HOOKRELAY_CONFIG), then HOOKRELAY_<SECTION>_<KEY>
environment variables. The most used: HOOKRELAY_AMQP_URL, HOOKRELAY_MANAGEMENT_URL,
HOOKRELAY_LADDER, HOOKRELAY_SUBSCRIPTIONS. README.md lists every setting.

Exit codes: 0 success, 1 error, 2 bad command line, 3 drift found by `topology plan`.

First steps:
  hookrelay demo                      the whole path on a local broker, in under a minute
  hookrelay topology apply            declare the retry ladder from topology/ladder.toml
  hookrelay worker                    deliver; SIGTERM drains and exits 0";

#[derive(Debug, Parser)]
#[command(
    name = "hookrelay",
    version,
    about = "Webhook dispatcher on RabbitMQ: signed deliveries, a retry ladder of TTL tiers, nothing lost",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Configuration file (TOML). Defaults apply when absent.
    #[arg(long, global = true, env = "HOOKRELAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Declare, check or export the retry ladder (lanes, tiers, dead sink).
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Publish one event through the ingress exchange, following the envelope contract.
    ///
    /// The body comes from --data, --file or standard input and must be JSON. The event is
    /// validated before anything is sent; it is published persistent, mandatory and confirmed,
    /// and its envelope id (the idempotency key) is printed.
    Publish(PublishArgs),
    /// Consume the ready lanes and deliver signed webhooks until SIGTERM or SIGINT.
    ///
    /// On a signal the worker stops consuming, lets in-flight attempts finish (ack or confirmed
    /// republish) within worker.shutdown_grace, and exits 0.
    Worker(WorkerArgs),
    /// Check subscriptions files offline.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCommand),
    /// Run the whole path end to end on the configured broker and print a summary table.
    ///
    /// Applies a ladder with 1s/2s/4s tiers under its own prefix, starts an endpoint on loopback
    /// that verifies signatures and fails some deliveries on purpose, runs a worker, publishes
    /// the events, shows progress, prints the outcome table, and removes its objects.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct LadderArg {
    /// Ladder file; defaults to the config's `ladder` (topology/ladder.toml).
    #[arg(long, value_name = "FILE")]
    pub ladder: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Declare every exchange, queue and binding of the ladder. Safe to repeat.
    Apply(LadderArg),
    /// Compare the ladder with the broker (via the management API); exit 3 on any difference.
    Plan(LadderArg),
    /// Print the ladder as RabbitMQ definitions JSON (`rabbitmqctl import_definitions`).
    Export {
        #[command(flatten)]
        ladder: LadderArg,
        /// The vhost written into the definitions.
        #[arg(long, default_value = "/")]
        vhost: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum SubscriptionsCommand {
    /// Validate a subscriptions file and explain each problem (line, field, what is expected).
    ///
    /// Exits 0 when the file is valid. Secret references that do not resolve on this machine
    /// are listed as notes: they may well resolve where the worker runs.
    Check {
        /// The file to check.
        file: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    /// Tenant id: the routing key on the ingress exchange.
    #[arg(long)]
    pub tenant: String,
    /// Event type, e.g. order.paid.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: String,
    /// Subscription id to deliver to. Without it the event fans out to every enabled
    /// subscription of the tenant that receives its type.
    #[arg(long)]
    pub subscription: Option<String>,
    /// Envelope id (the idempotency key); a random `evt_...` id when absent. Publishing the same
    /// id twice means the same event.
    #[arg(long)]
    pub id: Option<String>,
    /// Event time in seconds since the epoch; now when absent.
    #[arg(long)]
    pub timestamp: Option<u64>,
    /// The JSON body.
    #[arg(long, conflicts_with = "file")]
    pub data: Option<String>,
    /// Read the JSON body from this file.
    #[arg(long)]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    /// Subscriptions file; defaults to the config's `subscriptions`.
    #[arg(long, value_name = "FILE")]
    pub subscriptions: Option<PathBuf>,
    /// Names this worker's connections in the management UI.
    #[arg(long, default_value = "hookrelay-worker")]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many events to publish.
    #[arg(long, default_value_t = 1000)]
    pub events: usize,
    /// Keep the demo's queues and exchanges afterwards, to look at them in the management UI.
    #[arg(long)]
    pub keep: bool,
}

/// Runs one command with a loaded configuration.
pub async fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        Command::Topology(cmd) => topology(cmd, &config).await,
        Command::Publish(args) => publish(args, &config).await,
        Command::Worker(args) => worker(args, config).await,
        Command::Subscriptions(SubscriptionsCommand::Check { file }) => {
            check_subscriptions(&file, &config)
        }
        Command::Demo(args) => demo(args, &config).await,
    }
}

fn check_subscriptions(file: &std::path::Path, config: &Config) -> anyhow::Result<ExitCode> {
    match Subscriptions::load(file) {
        Ok(subs) => {
            println!("{}: {} subscription(s), valid", file.display(), subs.len());
            let secrets = SecretStore::new(config.secrets.refresh);
            for (sub, e) in secrets.unresolved(&subs) {
                println!(
                    "note: subscription {sub}: {e} (here; it must resolve where the worker runs)"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors.0 {
                println!("{e}");
            }
            println!("{}: {} problem(s)", file.display(), errors.0.len());
            Ok(ExitCode::FAILURE)
        }
    }
}

fn load_ladder(arg: &LadderArg, config: &Config) -> anyhow::Result<Ladder> {
    let path = arg.ladder.clone().unwrap_or_else(|| config.ladder.clone());
    Ok(Ladder::load(&path)?)
}

async fn connect(config: &Config, name: &str) -> anyhow::Result<Connection> {
    Connection::connect(
        config.amqp.url.expose(),
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .with_context(|| format!("cannot connect to the broker at {}", config.amqp.url))
}

fn management(config: &Config) -> anyhow::Result<Management> {
    Ok(Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    )?)
}

async fn topology(cmd: TopologyCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        TopologyCommand::Export { ladder, vhost } => {
            let ladder = load_ladder(&ladder, config)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&ladder.objects().export(&vhost))?
            );
            Ok(ExitCode::SUCCESS)
        }
        TopologyCommand::Apply(arg) => {
            let ladder = load_ladder(&arg, config)?;
            if ladder.queue_type == QueueType::Quorum {
                check_at_least_once(config).await?;
            }
            let conn = connect(config, "hookrelay topology").await?;
            let channel = conn.create_channel().await?;
            let applied = ladder.objects().apply(&channel).await?;
            let _ = conn.close(200, "done".into()).await;
            println!(
                "Applied ladder {:?} ({} queues): {} exchanges, {} queues, {} bindings. Producers publish to {}.",
                ladder.prefix,
                ladder.queue_type.as_str(),
                applied.exchanges,
                applied.queues,
                applied.bindings,
                ladder.ingress()
            );
            Ok(ExitCode::SUCCESS)
        }
        TopologyCommand::Plan(arg) => {
            let ladder = load_ladder(&arg, config)?;
            let api = management(config)?;
            let objects = api.objects().await?;
            let topology = ladder.objects();
            let drift = topology.diff(&objects);
            for extra in topology.extras(&ladder.prefix, &objects) {
                println!(
                    "not in ladder: {extra} (left alone; delete it once empty if it is an old tier)"
                );
            }
            if drift.is_empty() {
                println!(
                    "No drift: the broker has every object of ladder {:?} with the same arguments.",
                    ladder.prefix
                );
                Ok(ExitCode::SUCCESS)
            } else {
                for d in &drift {
                    println!("{d}");
                }
                println!(
                    "{} difference(s). Missing objects are created by `hookrelay topology apply`; \
                     a queue with different arguments must be deleted (after draining) or the \
                     ladder changed, since RabbitMQ cannot change queue arguments in place.",
                    drift.len()
                );
                Ok(ExitCode::from(EXIT_DRIFT))
            }
        }
    }
}

/// Quorum tiers dead-letter at-least-once only with the `stream_queue` feature flag enabled;
/// without it the broker would silently fall back to at-most-once.
async fn check_at_least_once(config: &Config) -> anyhow::Result<()> {
    let api = management(config)?;
    match api.feature_flag("stream_queue").await {
        Ok(Some(state)) if state == "enabled" => Ok(()),
        Ok(Some(state)) => bail!(
            "the broker's stream_queue feature flag is {state}; quorum tiers need it for \
             at-least-once dead-lettering. Enable it with \
             `rabbitmqctl enable_feature_flag stream_queue`, or use queue_type = \"classic\""
        ),
        Ok(None) => bail!(
            "the broker has no stream_queue feature flag (RabbitMQ older than 3.9?); quorum tiers \
             need it for at-least-once dead-lettering. Upgrade, or use queue_type = \"classic\""
        ),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot check the stream_queue feature flag; at-least-once dead-lettering out of the tiers needs it");
            Ok(())
        }
    }
}

async fn publish(args: PublishArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, config)?;
    let body = match (&args.data, &args.file) {
        (Some(data), _) => data.clone().into_bytes(),
        (None, Some(path)) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        }
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the body from standard input")?;
            buf
        }
    };
    let event = NewEvent {
        id: args
            .id
            .unwrap_or_else(|| format!("evt_{}", uuid::Uuid::new_v4().simple())),
        tenant: args.tenant,
        event_type: args.event_type,
        subscription: args.subscription,
        timestamp: args.timestamp,
        body,
    };
    // Refuse bad input before opening a connection: nothing is published.
    event
        .validate(config.limits.max_body_bytes)
        .context("not published")?;
    let publisher = Publisher::connect(
        &config.amqp.url,
        "hookrelay publish",
        config.amqp.confirm_timeout,
    )
    .await?;
    let id = publisher
        .publish_event(&ladder.ingress(), &event, config.limits.max_body_bytes)
        .await;
    publisher.close().await;
    println!("{}", id.context("not published")?);
    Ok(ExitCode::SUCCESS)
}

async fn worker(args: WorkerArgs, config: Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, &config)?;
    let path = args
        .subscriptions
        .clone()
        .unwrap_or_else(|| config.subscriptions.clone());
    let subscriptions = LiveSubscriptions::from_file(&path)?;
    tracing::info!(
        subscriptions = subscriptions.current().len(),
        file = %path.display(),
        ladder = %ladder.prefix,
        lease_window = %crate::config::fmt_duration(config.lease_window()),
        "Starting worker"
    );
    let mut setup = WorkerSetup::new(config, ladder, subscriptions);
    setup.name = args.name;
    let worker = Worker::start(setup).await?;
    worker.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn demo(args: DemoArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let options = crate::demo::DemoOptions {
        events: args.events,
        keep: args.keep,
        deadline: Duration::from_secs(90),
    };
    let report = crate::demo::run(config, &options).await?;
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
