//! The command line: what each subcommand takes, and how it maps onto the library. Errors are
//! `anyhow` here, at the edge; exit codes are documented in `--help`.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use lapin::{Connection, ConnectionProperties};

use crate::broker::management::Management;
use crate::broker::publish::Publisher;
use crate::broker::topology::{Ladder, QueueType};
use crate::config::Config;
use crate::contract::envelope::NewEvent;
use crate::delivery::subscriptions::{LiveSubscriptions, SecretStore, Subscriptions};
use crate::delivery::worker::{Worker, WorkerSetup, shutdown_signal};

/// Exit code when `topology plan` finds drift.
pub const EXIT_DRIFT: u8 = 3;

const AFTER_HELP: &str = "\
Configuration: a TOML file (--config or HOOKRELAY_CONFIG), then HOOKRELAY_<SECTION>_<KEY>
environment variables. The most used: HOOKRELAY_AMQP_URL, HOOKRELAY_MANAGEMENT_URL,
HOOKRELAY_LADDER, HOOKRELAY_SUBSCRIPTIONS. README.md lists every setting.

Exit codes: 0 success, 1 error, 2 bad command line, 3 drift found by `topology plan`.

First steps:
  hookrelay-dev demo                  the whole path on a local broker, in under a minute (make demo)
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
    /// The whole ladder at a glance: lanes, tiers, parked and dead messages, rates, targets.
    ///
    /// Read from the management API. --watch refreshes in place (and adds the tiers' out-rates,
    /// derived between samples); --json prints one JSON array per sample for scripts.
    Status(StatusArgs),
    /// Hold a tier (stop promotion out of it, parking what expires), release it, or see which
    /// tiers are held. The incident lever instead of purging.
    #[command(subcommand)]
    Tier(TierCommand),
    /// Move envelopes from the dead sink back to a ready lane, with a fresh attempt budget.
    ///
    /// Filters combine. Each envelope keeps its message_id (the idempotency key) and body and
    /// gains x-hookrelay-redrives. Every move is a confirmed publish before the dead copy is
    /// acked; envelopes that do not match stay in the sink, in order. A pass must finish within
    /// the broker's consumer_timeout; use --limit for very large sinks.
    Redrive(RedriveArgs),
    /// Follow the attempt log.
    #[command(subcommand)]
    Attempts(AttemptsCommand),
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

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    /// Refresh in place until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum TierCommand {
    /// Stop promotion out of TIER; what expires there parks in <prefix>.held.<tier>.
    Hold {
        #[command(flatten)]
        ladder: LadderArg,
        /// The tier: retry-1h, or its delay, 1h.
        tier: String,
    },
    /// Return TIER's parked messages to the retry lanes at --rate, then lift the hold.
    Release {
        #[command(flatten)]
        ladder: LadderArg,
        tier: String,
        /// Pace, e.g. 50/s or 600/m; as fast as the broker confirms when absent.
        #[arg(long)]
        rate: Option<crate::ops::mover::Rate>,
    },
    /// Which tiers are held, and how much waits and is parked.
    Status {
        #[command(flatten)]
        ladder: LadderArg,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    #[arg(long)]
    pub tenant: Option<String>,
    #[arg(long)]
    pub subscription: Option<String>,
    /// rejected, exhausted, invalid, gone, egress_denied, or the broker's expired.
    #[arg(long)]
    pub reason: Option<String>,
    /// Dead-lettered at or after: an RFC 3339 time, or a duration ago (2h).
    #[arg(long, value_parser = parse_when)]
    pub since: Option<SystemTime>,
    /// Dead-lettered before: an RFC 3339 time, or a duration ago.
    #[arg(long, value_parser = parse_when)]
    pub until: Option<SystemTime>,
    /// Count what would move; move nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Move at most this many.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Pace, e.g. 100/s.
    #[arg(long)]
    pub rate: Option<crate::ops::mover::Rate>,
}

#[derive(Debug, Subcommand)]
pub enum AttemptsCommand {
    /// Print attempt-log records as they are published (through a temporary queue of its own).
    Tail {
        #[command(flatten)]
        ladder: LadderArg,
        /// Only this outcome (delivered, retried, rejected, exhausted, invalid, cancelled, ...).
        #[arg(long)]
        outcome: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// Print the JSON records as they are.
        #[arg(long)]
        json: bool,
        /// Stop after this many records.
        #[arg(long)]
        count: Option<usize>,
    },
}

/// An RFC 3339 time, or a duration meaning that long ago.
fn parse_when(s: &str) -> Result<SystemTime, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t);
    }
    let ago = humantime::parse_duration(s).map_err(|_| {
        format!("{s:?} is neither a time like 2026-12-01T10:00:00Z nor a duration like 2h")
    })?;
    Ok(SystemTime::now() - ago)
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

/// Runs one command with a loaded configuration.
pub async fn run(command: Command, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        Command::Topology(cmd) => topology(cmd, &config).await,
        Command::Publish(args) => publish(args, &config).await,
        Command::Worker(args) => worker(args, config).await,
        Command::Subscriptions(SubscriptionsCommand::Check { file }) => {
            check_subscriptions(&file, &config)
        }
        Command::Status(args) => status(args, &config).await,
        Command::Tier(cmd) => tier(cmd, &config).await,
        Command::Redrive(args) => redrive(args, &config).await,
        Command::Attempts(AttemptsCommand::Tail {
            ladder,
            outcome,
            tenant,
            json,
            count,
        }) => {
            let ladder = load_ladder(&ladder, &config)?;
            let conn = connect(&config, "hookrelay attempts tail").await?;
            let channel = conn.create_channel().await?;
            let mut seen = 0usize;
            let exchange = ladder.attempts_exchange();
            let tail = crate::observe::events::tail_attempts(
                &channel,
                &exchange,
                outcome.as_deref(),
                tenant.as_deref(),
                |body| {
                    if json {
                        println!("{}", String::from_utf8_lossy(body));
                    } else {
                        match serde_json::from_slice::<crate::observe::events::AttemptRecord>(body)
                        {
                            Ok(r) => println!("{}", crate::observe::events::format_record(&r)),
                            Err(_) => println!("{}", String::from_utf8_lossy(body)),
                        }
                    }
                    seen += 1;
                    count.is_none_or(|c| seen < c)
                },
            );
            tokio::select! {
                r = tail => r?,
                () = shutdown_signal() => {}
            }
            let _ = conn.close(200, "done".into()).await;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn status(args: StatusArgs, config: &Config) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let ladder = load_ladder(&args.ladder, config)?;
    let api = management(config)?;
    let broker = api.broker_version().await?;
    let mut previous: Option<(std::time::Instant, Vec<crate::ops::status::QueueStatus>)> = None;
    loop {
        let rows = crate::ops::status::collect(&api, &ladder, previous.as_ref()).await?;
        if args.json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            let table = crate::ops::status::render(&ladder, api.vhost(), &broker, &rows);
            if args.watch {
                // Home the cursor and clear, so the table refreshes in place.
                print!("\x1b[H\x1b[2J{table}");
                let _ = std::io::stdout().flush();
            } else {
                print!("{table}");
            }
        }
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        previous = Some((std::time::Instant::now(), rows));
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            () = shutdown_signal() => return Ok(ExitCode::SUCCESS),
        }
    }
}

async fn tier(cmd: TierCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        TierCommand::Hold { ladder, tier } => {
            let ladder = load_ladder(&ladder, config)?;
            let i = crate::ops::tier::find(&ladder, &tier)?;
            let api = management(config)?;
            let conn = connect(config, "hookrelay tier").await?;
            let channel = conn.create_channel().await?;
            crate::ops::tier::hold(&api, &channel, &ladder, i).await?;
            let applied =
                crate::ops::tier::wait_applied(&api, &ladder, i, true, Duration::from_secs(10))
                    .await?;
            let _ = conn.close(200, "done".into()).await;
            if !applied {
                bail!(
                    "the hold policy {} was set but the broker has not applied it to {} yet; \
                     check `hookrelay tier status` (another policy of higher priority may match)",
                    ladder.hold_policy(i),
                    ladder.tier_queue(i)
                );
            }
            println!(
                "Held {}: messages expiring there now park in {} (nothing is promoted or lost). \
                 Resume with `hookrelay tier release {}`.",
                ladder.tier_queue(i),
                ladder.held_queue(i),
                ladder.tiers[i].name
            );
            Ok(ExitCode::SUCCESS)
        }
        TierCommand::Release { ladder, tier, rate } => {
            let ladder = load_ladder(&ladder, config)?;
            let i = crate::ops::tier::find(&ladder, &tier)?;
            let api = management(config)?;
            let conn = connect(config, "hookrelay tier").await?;
            let channel = conn.create_channel().await?;
            let publisher = Publisher::connect(
                &config.amqp.url,
                "hookrelay tier",
                config.amqp.confirm_timeout,
            )
            .await?;
            let options = crate::ops::mover::MoveOptions {
                rate,
                ..Default::default()
            };
            let released =
                crate::ops::tier::release(&api, &channel, &publisher, &ladder, i, &options, true)
                    .await;
            publisher.close().await;
            let _ = conn.close(200, "done".into()).await;
            let released = released?;
            println!(
                "Released {}: {} parked message(s) returned to the retry lanes ({} more expired during the release); promotion resumed.",
                ladder.tier_queue(i),
                released.first_pass.moved,
                released.stragglers.moved
            );
            Ok(ExitCode::SUCCESS)
        }
        TierCommand::Status { ladder, json } => {
            let ladder = load_ladder(&ladder, config)?;
            let api = management(config)?;
            let states = crate::ops::tier::status(&api, &ladder).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&states)?);
            } else {
                println!(
                    "{:<14} {:>8} {:>8}  {:<5} {:>8}",
                    "TIER", "DELAY", "WAITING", "HELD", "PARKED"
                );
                for s in states {
                    let n = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
                    println!(
                        "{:<14} {:>8} {:>8}  {:<5} {:>8}",
                        s.tier,
                        s.delay,
                        n(s.waiting),
                        if s.held { "yes" } else { "no" },
                        n(s.parked)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn redrive(args: RedriveArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, config)?;
    let filter = crate::ops::redrive::Filter {
        tenant: args.tenant,
        subscription: args.subscription,
        reason: args.reason,
        since: args.since,
        until: args.until,
    };
    let conn = connect(config, "hookrelay redrive").await?;
    let channel = conn.create_channel().await?;
    let publisher = Publisher::connect(
        &config.amqp.url,
        "hookrelay redrive",
        config.amqp.confirm_timeout,
    )
    .await?;
    let dead = ladder.dead();
    let total = crate::ops::mover::depth(&channel, &dead).await?;
    let limit = args
        .limit
        .map_or(total as u64, |l| (l as u64).min(total.into()));
    let progress = crate::ops::progress::Progress::new(
        limit,
        if args.dry_run { "would move" } else { "moved" },
    );
    let options = crate::ops::mover::MoveOptions {
        rate: args.rate,
        limit: args.limit,
        dry_run: args.dry_run,
    };
    let report = crate::ops::mover::move_messages(
        &channel,
        &publisher,
        &dead,
        &options,
        Some(&progress),
        |props, _| crate::ops::redrive::plan(&ladder, &filter, props),
    )
    .await;
    publisher.close().await;
    let _ = conn.close(200, "done".into()).await;
    let report = report?;
    let verb = if args.dry_run { "would move" } else { "moved" };
    println!(
        "Examined {} of {} dead message(s): {verb} {} to {}; {} stayed in the sink.",
        report.examined,
        total,
        report.moved,
        ladder.ingress(),
        report.kept_total()
    );
    for (why, n) in &report.kept {
        println!("  stayed: {n} ({why})");
    }
    Ok(ExitCode::SUCCESS)
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
            // Tenants dropped from `dedicated`: their lanes are unbound, not deleted.
            match management(config)?.objects().await {
                Ok(objects) => {
                    let retired = ladder.retired_tenants(objects.queues.keys());
                    crate::broker::topology::Topology::retire(&ladder, &channel, &retired).await?;
                    for tenant in &retired {
                        println!(
                            "Tenant {tenant:?} is no longer dedicated: its lanes are unbound (new events \
                             and retries take the shared lanes) and kept until workers have drained them."
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot list queues: lanes of tenants removed from `dedicated` were not unbound")
                }
            }
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
        lease_window = %crate::units::fmt_duration(config.lease_window()),
        "Starting worker"
    );
    let mut setup = WorkerSetup::new(config, ladder, subscriptions);
    setup.name = args.name;
    let worker = Worker::start(setup).await?;
    worker.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}
