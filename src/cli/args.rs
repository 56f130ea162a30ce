//! The clap definitions: every subcommand and its arguments. The doc comments are the `--help`
//! text.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};

use crate::units::parse_when;

/// Exit code when `topology plan` finds drift.
pub const EXIT_DRIFT: u8 = 3;

const AFTER_HELP: &str = "\
Configuration: a TOML file (--config or HOOKRELAY_CONFIG), then HOOKRELAY_<SECTION>_<KEY>
environment variables. The most used: HOOKRELAY_AMQP_URL, HOOKRELAY_MANAGEMENT_URL,
HOOKRELAY_LADDER, HOOKRELAY_SUBSCRIPTIONS. docs/configuration.md lists every setting.

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
    /// Check subscriptions files offline; pause and resume a subscription; import a file into
    /// the PostgreSQL store and export it back.
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
    /// Publish archived events again, by the time the broker accepted them.
    ///
    /// Reads the archive stream (<prefix>.archive) from --from to --to and publishes each
    /// selected event back through the ingress, confirmed, with its original message_id (the
    /// idempotency key: receivers deduplicate) and x-hookrelay-replay naming this replay.
    /// Filters combine. An event published to fan out, replayed for one --subscription, goes to
    /// that subscription alone under the id its fan-out gave it. Times are to the second, at
    /// the granularity of the broker's stream chunks. Example, an outage from 02:10 to 04:40:
    ///
    ///   hookrelay replay --from 2026-12-04T02:10:00Z --to 2026-12-04T04:40:00Z \
    ///     --tenant acme --only-undelivered --rate 200/s --dry-run
    Replay(ReplayArgs),
    /// Follow the attempt log.
    #[command(subcommand)]
    Attempts(AttemptsCommand),
    /// Materialize the archive and the attempt log into PostgreSQL until SIGTERM or SIGINT.
    ///
    /// Reads both streams from where it stopped (the offset is stored with each batch, in the
    /// same transaction) and writes them with COPY into day-partitioned tables, dropping days
    /// past history.retention_days. Needs history.database, or `subscriptions` as a
    /// postgres:// URL, migrated by `hookrelay store migrate`. Serves /metrics on
    /// history.listen (hookrelay_history_lag_seconds: how far behind it is).
    History(HistoryArgs),
    /// Print an event's whole story: accepted, each attempt with its status, latency and tier,
    /// redrives, replays, and the outcome.
    ///
    /// Reads the history database (`hookrelay history` fills it). With --since it reads the
    /// streams themselves over that window instead, without PostgreSQL. Exit code 4 when
    /// nothing is known of the id.
    ///
    ///   hookrelay trace ord_1234_paid
    ///   hookrelay trace ord_1234_paid --since 6h      # no database: scan the last 6 hours
    Trace(TraceArgs),
    /// The PostgreSQL subscription store: apply its schema, see its state, make and rotate the
    /// keys that seal its secrets.
    ///
    /// Used when `subscriptions` (HOOKRELAY_SUBSCRIPTIONS) is a postgres:// URL.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Serve the control plane's HTTP API (/v1) over the PostgreSQL store until SIGTERM or
    /// SIGINT; `api openapi` prints its OpenAPI document.
    ///
    /// Needs `subscriptions` set to a postgres:// URL, at least one token in api.tokens and a
    /// key in store.keys. docs/api.md shows every route with curl.
    Api(ApiArgs),
    /// Signing keys for v1a signatures (Standard Webhooks' asymmetric scheme, ed25519).
    #[command(subcommand)]
    Keys(KeysCommand),
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print a new ed25519 key pair: `secret_key=whsk_...` (keep it where a secret reference
    /// can read it, like a whsec_ secret, and list it in the subscription's secrets: it signs
    /// v1a) and `public_key=whpk_...` (give it to the receiver: it verifies v1a with it).
    ///
    /// A subscription with both a whsec_ secret and a whsk_ key signs v1 and v1a side by side,
    /// for a receiver moving from one to the other; rotation and expiry work as for whsec_.
    Generate,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Apply the schema migrations not applied yet (versioned, in order, each in a transaction).
    /// Safe to repeat; workers refuse to start on a store that lacks one.
    Migrate(StoreArg),
    /// The store's schema version, subscriptions, secrets, and which key seals.
    Status(StoreArg),
    /// Print a new random key for store.keys (32 bytes, base64). Keep it where a reference can
    /// read it: an environment variable or a file only the service can read.
    GenerateKey,
    /// Seal every stored secret again with the first key of store.keys: the step of a key
    /// rotation after which the old keys can be removed from store.keys.
    Reseal(StoreArg),
}

#[derive(Debug, Args)]
pub struct StoreArg {
    /// The store's URL (postgres://user:pass@host/db); defaults to the config's
    /// `subscriptions`.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

#[derive(Debug, Args)]
pub struct ApiArgs {
    #[command(subcommand)]
    pub command: Option<ApiCommand>,
    #[command(flatten)]
    pub ladder: LadderArg,
    /// Address to listen on; defaults to the config's api.listen (127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Subcommand)]
pub enum ApiCommand {
    /// Print the OpenAPI document (what /v1/openapi.json serves; docs/openapi.json holds it).
    Openapi,
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
    /// hookrelay's rejected, exhausted, invalid, gone, egress_denied, horizon_expired,
    /// schema_invalid; or, for
    /// what a lane dead-lettered, the broker's expired, rejected, maxlen, delivery_limit.
    #[arg(long)]
    pub reason: Option<crate::ops::redrive::SinkReason>,
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

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    /// Accepted at or after: an RFC 3339 time, or a duration ago (2h).
    #[arg(long, value_parser = parse_when)]
    pub from: SystemTime,
    /// Accepted before: an RFC 3339 time, or a duration ago; default: up to now.
    #[arg(long, value_parser = parse_when)]
    pub to: Option<SystemTime>,
    #[arg(long, value_parser = parse_key_word)]
    pub tenant: Option<String>,
    /// Only events for this subscription (and events fanned out to it).
    #[arg(long, value_parser = parse_key_word)]
    pub subscription: Option<String>,
    /// Only these event types: an exact type or a wildcard like order.*
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_event_filter)]
    pub event_type: Option<crate::subscriptions::EventFilter>,
    /// Only the event of this id (its producer's message_id); --from/--to still bound the read.
    #[arg(long, value_name = "ID", value_parser = parse_event_id)]
    pub event: Option<String>,
    /// Skip events whose every delivery succeeded, by the attempt log's stream.
    #[arg(long)]
    pub only_undelivered: bool,
    /// Pace. Replayed events go through the ingress into the tenant's first-attempt lane beside
    /// everyone's new events: keep this below what the workers deliver (at 2000/s on a 2-core
    /// machine delivering 5000/s, other tenants saw no delay; unpaced, 130-220 ms at p99).
    #[arg(long, default_value = crate::config::DEFAULT_REPLAY_RATE)]
    pub rate: crate::units::Rate,
    /// Count what would be replayed; publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why an argument was refused: each names the value to correct.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("{0}")]
    EventFilter(crate::subscriptions::FilterError),
    #[error("{0:?}: use 1 to 64 letters, digits, '_' or '-'")]
    KeyWord(String),
    #[error("{0}")]
    EventId(crate::contract::envelope::InvalidEnvelope),
}

fn parse_event_id(s: &str) -> Result<String, ArgError> {
    crate::contract::envelope::check_id(s).map_err(ArgError::EventId)?;
    Ok(s.to_owned())
}

fn parse_event_filter(s: &str) -> Result<crate::subscriptions::EventFilter, ArgError> {
    crate::subscriptions::EventFilter::parse(s).map_err(ArgError::EventFilter)
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    /// The event's id, or one delivery's id (a fan-out's `d_...`).
    pub id: String,
    /// Scan the archive and attempt-log streams from this time (RFC 3339, or a duration ago
    /// such as 6h) instead of reading the history database.
    #[arg(long, value_parser = parse_when)]
    pub since: Option<SystemTime>,
    /// Print the story as JSON.
    #[arg(long)]
    pub json: bool,
    /// Wait up to this long (e.g. 10s) for history to hold the id, for scripts that trace what
    /// they just published.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wait: Option<Duration>,
}

#[derive(Debug, Subcommand)]
pub enum AttemptsCommand {
    /// Print attempt-log records as they are published (through a temporary queue of its own).
    Tail {
        #[command(flatten)]
        ladder: LadderArg,
        /// Only this outcome (delivered, retried, rejected, exhausted, invalid, cancelled, ...).
        #[arg(long, value_parser = parse_key_word)]
        outcome: Option<String>,
        #[arg(long, value_parser = parse_key_word)]
        tenant: Option<String>,
        /// Print the JSON records as they are.
        #[arg(long)]
        json: bool,
        /// Stop after this many records.
        #[arg(long)]
        count: Option<usize>,
    },
}

/// One word of an attempt-log routing key (an outcome or a tenant id): checked here because it
/// becomes part of a routing key, which AMQP caps at 255 bytes.
fn parse_key_word(s: &str) -> Result<String, ArgError> {
    let word = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if word {
        Ok(s.to_owned())
    } else {
        Err(ArgError::KeyWord(s.to_owned()))
    }
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
    /// Pause a subscription: sets `paused = true` in its table of the subscriptions file
    /// (layout and comments kept; write then rename). From their next reload, workers park its
    /// deliveries in <prefix>.paused.<id>: nothing is attempted, cancelled or charged.
    Pause {
        /// The subscription's id.
        subscription: String,
        /// Subscriptions file; defaults to the config's `subscriptions`.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Resume a paused subscription: sets `paused = false` in the file if it still pauses it,
    /// waits two reload intervals for the workers to see it, then returns the parked
    /// deliveries at --rate, each with its id and attempt count, and removes the parking queue
    /// once empty.
    ///
    /// A resume interrupted at any point loses nothing; run it again.
    Resume {
        #[command(flatten)]
        ladder: LadderArg,
        /// The subscription's id.
        subscription: String,
        /// Pace, e.g. 50/s or 600/m; as fast as the broker confirms when absent.
        #[arg(long)]
        rate: Option<crate::ops::mover::Rate>,
        /// Subscriptions file; defaults to the config's `subscriptions`.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Load a subscriptions file into the PostgreSQL store, in one transaction. Idempotent:
    /// subscriptions the store already holds as the file says are not written (workers are
    /// not even notified); subscriptions only in the store are left alone.
    ///
    /// The move from a file to the database without downtime: import, point the workers'
    /// `subscriptions` at the store and restart them one by one (each serves from the file
    /// until it restarts, then from the store, which says the same).
    Import {
        /// The subscriptions file to load (validated first, like `subscriptions check`).
        file: PathBuf,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Write the PostgreSQL store as a subscriptions file (to standard output, or --out).
    ///
    /// Secrets generated by the API are stored sealed, and a file holds references only:
    /// with --secrets-dir each is written to a file there (mode 0600) and referenced as file:.
    Export {
        #[command(flatten)]
        store: StoreArg,
        /// Write here instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Where to write sealed secrets, one file each.
        #[arg(long, value_name = "DIR")]
        secrets_dir: Option<PathBuf>,
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
    /// The W3C traceparent of the producer's span (`00-<trace id>-<span id>-<flags>`): the
    /// event's spans join that trace. Without it, a trace starts here when traces are on.
    #[arg(long, value_name = "TRACEPARENT")]
    pub traceparent: Option<String>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub ladder: LadderArg,
    /// Subscriptions file or postgres:// URL; defaults to the config's `subscriptions`.
    #[arg(long, value_name = "FILE|URL")]
    pub subscriptions: Option<PathBuf>,
    /// Names this worker's connections in the management UI.
    #[arg(long, default_value = "hookrelay-worker")]
    pub name: String,
}
